"""``python -m app tools``: list the built-in tools, or run one.

``tools`` prints each tool with its parameters (``--json``: the OpenAI-style schemas the model
sees). ``tools run NAME --args JSON`` runs one tool through :func:`run_tool` and prints
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": ...}``; the exit code is 0 either
way, and 2 (message on stderr) for an unknown tool name or ``--args`` that is not a JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from app.chat.tools import BUILTIN_TOOLS, find_tool, run_tool, tool_schemas
from app.commands.generation import utf8_text

MAX_TIMEOUT_S = 86400.0
"""The largest ``--timeout`` (a day): far larger ones overflow the thread library's wait
("timestamp out of range for platform time_t")."""


def positive_seconds(text: str) -> float:
    """An argparse ``type`` for a timeout: a finite number of seconds above 0, at most
    :data:`MAX_TIMEOUT_S`."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text}")
    if value > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0 and at most "
                                         f"{MAX_TIMEOUT_S:g} (a day), got {text}")
    return value


def register(subparsers) -> None:
    """Add the ``tools`` subcommand (and ``tools run``) to ``subparsers``."""
    p = subparsers.add_parser(
        "tools",
        help="list the built-in tools, or run one",
        description="List the built-in tools with their schemas, or run one with "
        "'tools run NAME --args JSON'.",
    )
    p.add_argument("--json", action="store_true", help="print the tool schemas as JSON")
    p.set_defaults(func=_list)
    sub = p.add_subparsers(dest="tools_command", metavar="run")
    r = sub.add_parser("run", help="run one tool and print its JSON result")
    r.add_argument("name", help="tool name, e.g. calculator")
    r.add_argument(
        "--args",
        default="{}",
        dest="tool_args",
        type=utf8_text,
        metavar="JSON",
        help='arguments as a JSON object, e.g. \'{"expression": "17*23"}\'',
    )
    r.add_argument(
        "--timeout", type=positive_seconds, default=10.0,
        help=f"seconds the tool may run, above 0, at most {MAX_TIMEOUT_S:g} (default 10)"
    )
    r.set_defaults(func=_run)


def _signature(schema: dict) -> str:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    parts = []
    for name, spec in props.items():
        kind = spec.get("type", "any") if isinstance(spec, dict) else "any"
        parts.append(f"{name}: {kind}" + ("" if name in required else " (optional)"))
    return ", ".join(parts)


def _list(args) -> int:
    if args.json:
        print(json.dumps(tool_schemas(BUILTIN_TOOLS), indent=2, ensure_ascii=False))
        return 0
    for tool in BUILTIN_TOOLS:
        print(f"{tool.name}({_signature(tool.parameters)})")
        print(f"    {tool.description}")
    return 0


def _run(args) -> int:
    if find_tool(args.name, BUILTIN_TOOLS) is None:
        known = ", ".join(t.name for t in BUILTIN_TOOLS)
        print(f"error: unknown tool '{args.name}' (available: {known})", file=sys.stderr)
        return 2
    try:
        arguments = json.loads(args.tool_args)
    except json.JSONDecodeError as exc:
        print(f"error: --args is not valid JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(arguments, dict):
        print(
            'error: --args must be a JSON object, e.g. \'{"expression": "1+1"}\'', file=sys.stderr
        )
        return 2
    result = run_tool(args.name, arguments, BUILTIN_TOOLS, timeout_s=args.timeout)
    print(json.dumps(result.to_payload(), ensure_ascii=False))
    return 0


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - convenience
    """Run ``tools`` on its own: ``python -m app.commands.tools run calculator --args ...``."""
    parser = argparse.ArgumentParser(prog="tools")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["tools", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)

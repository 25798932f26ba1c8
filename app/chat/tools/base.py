"""Tool definitions, argument checking and the sandboxed runner shared by every tool.

A :class:`Tool` is an OpenAI-style function definition (name, description, JSON-schema
``parameters``) plus an optional Python implementation. :func:`run_tool` is the one entry
point that executes a call the model made: it never raises, and every failure (unknown tool,
arguments that do not fit the schema, a tool that raises, a tool that runs too long) comes back
as a :class:`ToolResult` with ``ok=False`` and a message that can be shown to the user and
sent back to the model as is.

The argument check covers the subset of JSON Schema that tool definitions use in practice
(flat ``object`` schemas: ``properties`` with ``type``/``enum``, ``required``,
``additionalProperties``); see :func:`check_arguments`.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ToolError(Exception):
    """Raised inside a tool for input it cannot handle (e.g. a zone name that does not exist).

    :func:`run_tool` turns it into ``ToolResult(ok=False, error=str(exc))``, so the message
    should be a complete sentence fragment that makes sense to the model and the user.
    """


class ToolFileError(ValueError):
    """A tool-definition file (see :func:`load_tool_file`) is missing, is not valid JSON, or
    holds an entry that is not a usable function definition. The message names the file and
    the entry."""


@dataclass(frozen=True)
class Tool:
    """One callable tool.

    ``name``: the function name the model uses (``[A-Za-z_][A-Za-z0-9_-]*``, at most 64 chars).
    ``description``: one or two sentences for the model.
    ``parameters``: a JSON schema of type ``object`` describing the keyword arguments.
    ``func``: the implementation, called with the checked keyword arguments; ``None`` for a
    tool that is only declared (e.g. loaded from a file) and cannot run in this app.
    ``builtin``: True for the tools that ship with the app (they run without asking the user).
    """

    name: str
    description: str
    parameters: dict
    func: Callable[..., Any] | None = field(default=None, compare=False, repr=False)
    builtin: bool = True

    def schema(self) -> dict:
        """The OpenAI-style definition ``{"type": "function", "function": {...}}``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass
class ToolResult:
    """The outcome of one tool call.

    ``ok``: whether the tool produced a result. ``result``: a JSON-serialisable value when ok.
    ``error``: a one-line message when not ok. ``duration_s``: wall time of the call in
    seconds (argument check plus execution).
    """

    ok: bool
    result: Any = None
    error: str | None = None
    duration_s: float = 0.0

    def to_payload(self) -> dict:
        """``{"ok": True, "result": ...}`` or ``{"ok": False, "error": ...}``."""
        if self.ok:
            return {"ok": True, "result": self.result}
        return {"ok": False, "error": self.error}

    def content(self) -> str:
        """:meth:`to_payload` as compact JSON text (non-ASCII kept), e.g. for a tool message."""
        return json.dumps(self.to_payload(), ensure_ascii=False)


BUILTIN: list[Tool] = []
"""The default tool list; :mod:`app.chat.tools` (always imported before this module, as its
package) fills it with ``BUILTIN_TOOLS``, so this module needs no import of its package."""


def tool_schemas(tools: Iterable[Tool] | None = None) -> list[dict]:
    """OpenAI-style definitions of ``tools`` (default: the built-in tools), in order."""
    if tools is None:
        tools = BUILTIN
    return [t.schema() for t in tools]


# ---------------------------------------------------------------------------------------------
# Argument checking

_JSON_TYPES = {
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
    "null": "null",
}


def _coerce(name: str, value: Any, spec: dict) -> Any:
    """Check one argument against its property schema; returns the (possibly coerced) value.

    Numbers sent as strings (``"3.5"``) are accepted for ``number``/``integer`` parameters,
    since models often quote them (the Qwen XML call format carries every value as text).
    Raises :class:`ToolError` when the value does not fit.
    """
    kind = spec.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind else []
    if not kinds:
        checked = value
    else:
        checked = _NO_MATCH
        for k in kinds:
            checked = _coerce_one(value, k)
            if checked is not _NO_MATCH:
                break
        if checked is _NO_MATCH:
            wanted = " or ".join(_JSON_TYPES.get(k, str(k)) for k in kinds)
            raise ToolError(
                f"argument '{name}' must be {wanted}, got {type(value).__name__} {value!r:.60}"
            )
    enum = spec.get("enum")
    if enum is not None and checked not in enum:
        raise ToolError(f"argument '{name}' must be one of {enum!r:.200}, got {checked!r:.60}")
    return checked


_NO_MATCH = object()
_NUMBER_TEXT = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def _coerce_one(value: Any, kind: str) -> Any:
    if kind == "string":
        return value if isinstance(value, str) else _NO_MATCH
    if kind == "boolean":
        return value if isinstance(value, bool) else _NO_MATCH
    if kind == "null":
        return value if value is None else _NO_MATCH
    if kind == "array":
        return value if isinstance(value, list) else _NO_MATCH
    if kind == "object":
        return value if isinstance(value, dict) else _NO_MATCH
    if kind in ("number", "integer"):
        if isinstance(value, str):
            text = value.strip().replace("_", "")
            if not _NUMBER_TEXT.match(text):
                return _NO_MATCH
            value = float(text) if any(c in text for c in ".eE") else int(text)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return _NO_MATCH
        if isinstance(value, float) and not math.isfinite(value):
            return _NO_MATCH
        if kind == "integer":
            if isinstance(value, float):
                if not value.is_integer():
                    return _NO_MATCH
                value = int(value)
        return value
    return value  # unknown type keyword: accept as is


def check_arguments(arguments: Any, schema: dict) -> dict:
    """Check ``arguments`` against an ``object`` schema; returns the coerced keyword dict.

    Supported: ``properties`` (each with ``type`` — one name or a list — and ``enum``),
    ``required``, ``additionalProperties`` (extra arguments are refused unless it is true).
    A JSON object given as text is parsed first. Raises :class:`ToolError` naming the first
    problem (not an object, missing, unexpected, or wrong type).
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ToolError(f"arguments are not a JSON object: {exc.msg}") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ToolError(f"arguments must be an object, got {type(arguments).__name__}")
    props: dict = schema.get("properties") or {}
    required = list(schema.get("required") or [])
    missing = [r for r in required if r not in arguments]
    if missing:
        raise ToolError(f"missing required argument '{missing[0]}'")
    extra = [k for k in arguments if k not in props]
    if extra and schema.get("additionalProperties") is not True:
        expected = ", ".join(props) or "none"
        raise ToolError(f"unexpected argument '{extra[0]!s:.40}' (expected: {expected})")
    out = {}
    for key, value in arguments.items():
        spec = props.get(key)
        out[key] = _coerce(key, value, spec) if isinstance(spec, dict) else value
    return out


# ---------------------------------------------------------------------------------------------
# Running


def find_tool(name: str, tools: Iterable[Tool]) -> Tool | None:
    """The tool called ``name`` in ``tools`` (exact match), or None."""
    for t in tools:
        if t.name == name:
            return t
    return None


def run_tool(
    name: str,
    arguments: Any,
    tools: Iterable[Tool] | None = None,
    timeout_s: float = 10.0,
) -> ToolResult:
    """Run one tool call; never raises.

    ``name``: the function name the model used. ``arguments``: a dict (or JSON object text).
    ``tools``: the tools that may run (default: the built-in tools). ``timeout_s``: seconds
    the tool may run before the call is given up.

    Errors come back as ``ok=False``: unknown tool; a declared tool without implementation
    (``"tool X has no implementation in this app"``); arguments that do not fit the schema;
    a :class:`ToolError` or any other exception from the tool; running past ``timeout_s``.
    The tool runs in a daemon thread so a timeout returns at once; Python cannot stop that
    thread, so every built-in tool also bounds its own work (the calculator's limits).
    """
    start = time.perf_counter()

    def done(ok: bool, result: Any = None, error: str | None = None) -> ToolResult:
        return ToolResult(ok=ok, result=result, error=error, duration_s=time.perf_counter() - start)

    try:
        if tools is None:
            tools = BUILTIN
        tools = list(tools)
        if not isinstance(name, str):
            return done(False, error=f"tool name must be a string, got {type(name).__name__}")
        tool = find_tool(name, tools)
        if tool is None:
            known = ", ".join(t.name for t in tools) or "none"
            return done(False, error=f"unknown tool '{name:.60}' (available: {known})")
        if tool.func is None:
            return done(False, error=f"tool {tool.name} has no implementation in this app")
        try:
            kwargs = check_arguments(arguments, tool.parameters or {})
        except ToolError as exc:
            return done(False, error=f"{tool.name}: {exc}")
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = tool.func(**kwargs)
            except ToolError as exc:
                box["error"] = f"{tool.name}: {exc}"
            except BaseException as exc:  # noqa: BLE001 - reported, never raised
                box["error"] = f"{tool.name} failed: {type(exc).__name__}: {exc}"

        worker = threading.Thread(target=target, name=f"tool-{tool.name}", daemon=True)
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            return done(False, error=f"{tool.name} timed out after {timeout_s:g} s")
        if "error" in box:
            return done(False, error=box["error"])
        result = box.get("result")
        try:
            json.dumps(result)
        except (TypeError, ValueError):
            return done(
                False,
                error=f"{tool.name} returned a value that is not JSON: {type(result).__name__}",
            )
        return done(True, result=result)
    except Exception as exc:  # noqa: BLE001 - the contract is: never raise
        return done(False, error=f"tool call failed: {type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------------------------------
# Tool files

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


def load_tool_file(path: str | Path) -> list[Tool]:
    """Read extra tool definitions from a JSON file: a list of OpenAI-style definitions
    (``{"type": "function", "function": {"name", "description", "parameters"}}``, or the inner
    ``{"name", ...}`` object alone).

    Returns tools with ``func=None`` and ``builtin=False`` (the app can show and offer them,
    not run them). A missing ``parameters`` becomes an empty object schema; a missing
    ``description`` becomes "". Raises :class:`ToolFileError` for a missing/unreadable file,
    invalid JSON, a non-list, a bad entry, a bad or duplicate name.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ToolFileError(f"tool file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolFileError(f"cannot read tool file {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolFileError(
            f"tool file {path} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(data, list):
        raise ToolFileError(f"tool file {path} must hold a JSON list of tool definitions")
    tools: list[Tool] = []
    seen: set[str] = set()
    for i, entry in enumerate(data):
        where = f"tool file {path}, entry {i}"
        if isinstance(entry, dict) and entry.get("type") == "function" and "function" in entry:
            entry = entry["function"]
        if not isinstance(entry, dict):
            raise ToolFileError(f"{where}: expected an object with a 'name'")
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolFileError(
                f"{where}: name must be letters, digits, '_' or '-' (at most 64), got {name!r:.60}"
            )
        if name in seen:
            raise ToolFileError(f"{where}: duplicate tool name '{name}'")
        seen.add(name)
        description = entry.get("description", "")
        if not isinstance(description, str):
            raise ToolFileError(f"{where} ({name}): description must be a string")
        params = entry.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise ToolFileError(
                f"{where} ({name}): parameters must be a JSON schema of type object"
            )
        props = params.get("properties", {})
        if not isinstance(props, dict) or not all(isinstance(v, dict) for v in props.values()):
            raise ToolFileError(
                f"{where} ({name}): parameters.properties must map names to schemas"
            )
        required = params.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ToolFileError(f"{where} ({name}): parameters.required must be a list of names")
        params = {"type": "object", **params}
        tools.append(Tool(name=name, description=description, parameters=params, builtin=False))
    return tools

"""Export a conversation as Markdown (to read) or JSON (to keep), and import the JSON back.

The JSON form holds everything stored: every message of every version and branch, with its
generation record (mode, block size, rollback, summary figures, token ids and which came from
the drafter) and which versions are active. Message ids in it are local (1, 2, ... in creation
order), so ``export_json(store, import_json(store, export_json(store, c)).id)`` equals
``export_json(store, c)``.

JSON layout (``format_version`` 1)::

    {"format": "dflash-chat.conversation", "format_version": 1,
     "conversation": {"title", "title_auto", "created_at", "updated_at", "target_path",
                      "drafter_path", "settings", "active_root"},
     "messages": [{"id", "parent", "active_child", "role", "content", "reasoning",
                   "tool_calls", "tool_call_id", "name", "mode", "block_size", "rollback",
                   "generation", "summary", "token_ids", "from_draft", "finish_reason",
                   "status", "error", "compare_group", "created_at", "updated_at",
                   "rounds"}, ...]}

``rounds`` (a list of chat-template messages, empty for a reply without tool rounds) is
optional on import: files written before it was added import with ``[]``.

Import checks every record the app reads back against the types it reads them as (a record
of a wrong type would break rendering the chat): ``summary`` (and its
``round_summaries``) against ``app.engine.events.Summary``; ``generation``'s reply settings
against ``app.chat.settings.Sampling``/``ReplySettings`` and its ``speedup`` (``SpeedUp``),
``top2_gap``, ``resume`` and ``continued`` records; ``tool_calls`` (``app.chat.events.ToolCall``
plus result, error and seconds); ``rounds`` (chat-template messages). Keys it does not know are
kept as they are. The conversation's ``settings`` are checked with
``app.chat.settings.coerce`` (type, range, choices) and kept in the setting's type; keys that
are no setting are kept as they are (the window ignores them).

Times are POSIX seconds (float). ``from_draft`` is a string of ``0``/``1``, one per token.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from app.chat.baseline import PlainSample
from app.chat.conversation import (
    CONTINUED_KEY,
    ROLES,
    Conversation,
    Message,
    continued_text,
    finish_text,
)
from app.chat.events import ToolCall
from app.chat.settings import SPECS, ReplySettings, Sampling, SettingError, coerce
from app.chat.storage import Store
from app.engine.events import Summary
from app.engine.modes import DRAFTING_MODES, Mode, label

FORMAT = "dflash-chat.conversation"
FORMAT_VERSION = 1


class ImportFormatError(ValueError):
    """The file is not a conversation exported by this app (or is damaged); the message says
    what is wrong. Nothing is stored when it is raised."""


# --- JSON ---------------------------------------------------------------------------------


def export_json(store: Store, conversation_id: int) -> dict:
    """The conversation as a JSON-ready dict (layout in the module doc)."""
    conv = store.get_conversation(conversation_id)
    msgs = store.messages(conversation_id)
    local = {m.id: i for i, m in enumerate(msgs, start=1)}
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "conversation": {
            "title": conv.title,
            "title_auto": conv.title_auto,
            "created_at": conv.created_at,
            "updated_at": conv.updated_at,
            "target_path": conv.target_path,
            "drafter_path": conv.drafter_path,
            "settings": conv.settings,
            "active_root": local.get(conv.active_root_id),
        },
        "messages": [
            {
                "id": local[m.id],
                "parent": local.get(m.parent_id),
                "active_child": local.get(m.active_child_id),
                "role": m.role,
                "content": m.content,
                "reasoning": m.reasoning,
                "tool_calls": m.tool_calls,
                "tool_call_id": m.tool_call_id,
                "name": m.name,
                "mode": m.mode,
                "block_size": m.block_size,
                "rollback": m.rollback,
                "generation": m.generation,
                "summary": m.summary,
                "token_ids": m.token_ids,
                "from_draft": "".join("1" if f else "0" for f in m.from_draft),
                "finish_reason": m.finish_reason,
                "status": m.status,
                "error": m.error,
                "compare_group": m.compare_group,
                "created_at": m.created_at,
                "updated_at": m.updated_at,
                "rounds": m.rounds,
            }
            for m in msgs
        ],
    }


def export_json_text(store: Store, conversation_id: int) -> str:
    """:func:`export_json` as indented UTF-8 JSON text."""
    return json.dumps(export_json(store, conversation_id), ensure_ascii=False, indent=1) + "\n"


def _field(obj: dict, key: str, types, where: str, default=None, required: bool = False):
    if key not in obj or obj[key] is None:
        if required:
            raise ImportFormatError(f"{where}: '{key}' is missing")
        return default
    value = obj[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ImportFormatError(f"{where}: '{key}' should be {_names(types)}, not a boolean")
    if not isinstance(value, types):
        raise ImportFormatError(
            f"{where}: '{key}' should be {_names(types)}, not {type(value).__name__}"
        )
    return value


def _time(obj: dict, key: str, where: str, default: float | None = None,
          required: bool = False) -> float:
    """A timestamp field (POSIX seconds): a finite number (JSON's NaN and Infinity are
    refused, naming the field)."""
    value = float(_field(obj, key, (int, float), where, default, required))
    if not math.isfinite(value):
        shown = "NaN" if math.isnan(value) else f"{value}"
        raise ImportFormatError(f"{where}: '{key}' should be a time in seconds, not {shown}")
    return value


def _names(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)


# --- the types of the stored records (what the app reads them back as) --------------------

_SUMMARY = get_type_hints(Summary)
"""``Message.summary``: ``Summary.to_dict()``, plus ``round_summaries`` (one per round)."""

_SAMPLING = get_type_hints(Sampling)
_REPLY = get_type_hints(ReplySettings)
_GENERATION: dict[str, Any] = {
    # the reply settings each row keeps (app.chat.stored_turn.GENERATION_KEYS; None: unset)
    "max_tokens": _REPLY["max_tokens"] | None,
    "enable_thinking": _REPLY["enable_thinking"],
    **{k: _SAMPLING[k] | None for k in ("temperature", "top_p", "top_k", "min_p", "seed")},
    # the records added later (app.chat.turns: SPEEDUP_KEY, TOP2_GAP_KEY, RESUME_KEY;
    # app.chat.conversation.CONTINUED_KEY), checked field by field below
    "speedup": dict | None,
    "top2_gap": float | None,
    "resume": dict | None,
    CONTINUED_KEY: list[dict] | None,
}
_SPEEDUP = {"ratio": float, "baseline": dict}  # app.chat.baseline.SpeedUp.to_dict()
_BASELINE = get_type_hints(PlainSample)
_RESUME = {"prompt_ids": list[int], "starts_in_reasoning": bool, "target": str,
           "drafter": str | None}  # app.chat.stored_turn's resume record
_CONTINUED = {"after_tokens": int, "tokens": int, "max_tokens": int}

_CALL = get_type_hints(ToolCall)
_TOOL_CALL = {  # Message.tool_calls: a ToolCall's fields (arguments as parsed or as written)
    "id": _CALL["id"] | None,
    "name": _CALL["name"],
    "arguments": _CALL["arguments"] | str | None,
    "error": str | None,  # and the run's outcome ("result" is any JSON value)
    "duration_s": float | None,
}
_ROUND = {  # Message.rounds: chat-template messages (Message.to_prompt_dict's keys)
    "role": Literal[ROLES],
    "content": str | None,
    "reasoning_content": str | None,
    "tool_calls": list[dict] | None,
    "tool_call_id": str | None,
    "name": str | None,
}
_ROUND_CALL = {"id": str | None, "type": str | None, "function": dict}
_ROUND_FUNCTION = {"name": str, "arguments": dict | str | None}

_PLURALS = {int: "whole numbers", float: "numbers", str: "strings", dict: "objects",
            bool: "true or false values"}


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value has the type ``hint`` (a bool is no number; an int is a float)."""
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = get_origin(hint)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in get_args(hint))
    if origin in (Union, UnionType):
        return any(_fits(value, h) for h in get_args(hint))
    if origin is list or hint is list:
        args = get_args(hint)
        return isinstance(value, list) and (not args or all(_fits(v, args[0]) for v in value))
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if hint is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if hint is float:
        return isinstance(value, int | float)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    """``hint`` in words: "a number or null", "a list of whole numbers", ..."""
    if hint is None or hint is type(None):
        return "null"
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(hint))
    if origin in (Union, UnionType):
        # "a number or null" (null last)
        parts = sorted(get_args(hint), key=lambda h: h is type(None))
        return " or ".join(_describe(h) for h in parts)
    if origin is list or hint is list:
        args = get_args(hint)
        return f"a list of {_PLURALS.get(args[0], 'values')}" if args else "a list"
    return {bool: "true or false", int: "a whole number", float: "a number",
            str: "a string", dict: "an object"}.get(origin or hint, getattr(hint, "__name__",
                                                                            str(hint)))


def _shown(value: Any) -> str:
    """A value as the file has it, cut short."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _check(value: Any, hint: Any, where: str, path: str) -> None:
    """Raise :class:`ImportFormatError` naming ``where`` and ``path`` unless ``value`` fits."""
    if not _fits(value, hint):
        raise ImportFormatError(
            f"{where}: '{path}' should be {_describe(hint)}, not {_shown(value)}")


def _check_record(record: Any, fields: dict[str, Any], where: str, path: str) -> None:
    """Check the keys of ``record`` named in ``fields`` (name -> type); others are kept."""
    _check(record, dict, where, path)
    for key, hint in fields.items():
        if key in record:
            _check(record[key], hint, where, f"{path}.{key}")


def _check_summary(summary: dict, where: str, path: str = "summary") -> None:
    """A stored summary: ``Summary``'s fields, and each of its ``round_summaries``."""
    _check_record(summary, _SUMMARY, where, path)
    rounds = summary.get("round_summaries")
    if path == "summary" and rounds is not None:
        _check(rounds, list, where, f"{path}.round_summaries")
        for i, r in enumerate(rounds):
            if r is not None:  # a missing round is skipped when read
                _check_summary(r, where, f"{path}.round_summaries[{i}]")


def _check_generation(generation: dict, where: str) -> None:
    """A reply's generation record: its settings and its speed-up, resume and continuations."""
    _check_record(generation, _GENERATION, where, "generation")
    speedup = generation.get("speedup")
    if speedup is not None:
        _check_record(speedup, _SPEEDUP, where, "generation.speedup")
        if "baseline" in speedup:
            _check_record(speedup["baseline"], _BASELINE, where, "generation.speedup.baseline")
    if generation.get("resume") is not None:
        _check_record(generation["resume"], _RESUME, where, "generation.resume")
    for i, c in enumerate(generation.get(CONTINUED_KEY) or []):
        _check_record(c, _CONTINUED, where, f"generation.{CONTINUED_KEY}[{i}]")


def _check_tool_calls(calls: list, where: str) -> None:
    """A reply's tool calls (with their results)."""
    for i, call in enumerate(calls):
        _check_record(call, _TOOL_CALL, where, f"tool_calls[{i}]")


def _check_rounds(rounds: list, where: str) -> None:
    """A tool reply's chat-template messages and the calls in them."""
    for i, m in enumerate(rounds):
        _check_record(m, _ROUND, where, f"rounds[{i}]")
        for j, call in enumerate(m.get("tool_calls") or []):
            path = f"rounds[{i}].tool_calls[{j}]"
            _check_record(call, _ROUND_CALL, where, path)
            if "function" in call:
                _check_record(call["function"], _ROUND_FUNCTION, where, f"{path}.function")


_SETTING_TYPES = {bool: bool, int: int, float: float, str: str, list: list[str]}


def _check_settings(settings: dict) -> dict:
    """The conversation's settings with every known setting checked by
    ``app.chat.settings.coerce`` (its type, range and choices) and kept in its type (a whole
    temperature becomes a float); keys that are no setting are kept as they are. Every
    problem is named in one :class:`ImportFormatError`."""
    out = dict(settings)
    problems = []
    for key, value in settings.items():
        spec = SPECS.get(key)
        if spec is None:
            continue
        hint = _SETTING_TYPES[type(spec.default)]
        if not _fits(value, hint):
            problems.append(f"'{key}' should be {_describe(hint)}, not {_shown(value)}")
            continue
        try:
            out[key] = coerce(key, value)
        except SettingError as exc:
            problems.append(str(exc))
    if problems:
        raise ImportFormatError("conversation settings: " + "; ".join(problems))
    return out


def parse_json(data: dict | str | bytes) -> tuple[Conversation, list[Message]]:
    """Check an export and turn it into dataclasses with local ids (nothing is stored).

    The structured records (summary, generation record, tool calls, rounds) are checked
    against the types the app reads them as, and the conversation's settings against their
    types and ranges (see the module doc).

    Raises:
        ImportFormatError: not JSON, another format, a newer format version, a field of the
            wrong type (the message names the message number and field, e.g. ``message 3:
            'summary.tok_per_s' should be a number, not "fast"``), or settings the app cannot
            run with (each named, e.g. ``max_tokens -5 is out of range``).
    """
    if isinstance(data, bytes | str):
        try:
            data = json.loads(data)
        except ValueError as exc:
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
            if text.lstrip().startswith("#"):  # a Markdown export starts with its title
                raise ImportFormatError(
                    "this looks like a Markdown export, which is for reading only: import a "
                    "JSON export (Export chat, format JSON)") from exc
            raise ImportFormatError(f"not a JSON file: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ImportFormatError("not a DFlash Chat conversation export (no 'format' marker)")
    version = data.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ImportFormatError("the export has no format version")
    if version > FORMAT_VERSION:
        raise ImportFormatError(
            f"the export was made by a newer DFlash Chat (format {version}; this version reads "
            f"up to {FORMAT_VERSION})"
        )
    c = data.get("conversation")
    if not isinstance(c, dict):
        raise ImportFormatError("the export has no 'conversation' object")
    conv = Conversation(
        title=_field(c, "title", str, "conversation", ""),
        title_auto=_field(c, "title_auto", bool, "conversation", False),
        created_at=_time(c, "created_at", "conversation", required=True),
        updated_at=_time(c, "updated_at", "conversation", required=True),
        target_path=_field(c, "target_path", str, "conversation"),
        drafter_path=_field(c, "drafter_path", str, "conversation"),
        settings=_check_settings(_field(c, "settings", dict, "conversation", {})),
        active_root_id=_field(c, "active_root", int, "conversation"),
    )
    raw = data.get("messages")
    if not isinstance(raw, list):
        raise ImportFormatError("the export has no 'messages' list")
    msgs = []
    for i, m in enumerate(raw, start=1):
        where = f"message {i}"
        if not isinstance(m, dict):
            raise ImportFormatError(f"{where} is not an object")
        flags = _field(m, "from_draft", str, where, "")
        if set(flags) - {"0", "1"}:
            raise ImportFormatError(f"{where}: 'from_draft' must be a string of 0 and 1")
        token_ids = _field(m, "token_ids", list, where, [])
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in token_ids):
            raise ImportFormatError(f"{where}: 'token_ids' must be a list of integers")
        tool_calls = _field(m, "tool_calls", list, where, [])
        if not all(isinstance(t, dict) for t in tool_calls):
            raise ImportFormatError(f"{where}: 'tool_calls' must be a list of objects")
        rounds = _field(m, "rounds", list, where, [])
        if not all(isinstance(t, dict) for t in rounds):
            raise ImportFormatError(f"{where}: 'rounds' must be a list of objects")
        _check_tool_calls(tool_calls, where)
        _check_rounds(rounds, where)
        generation = _field(m, "generation", dict, where, {})
        _check_generation(generation, where)
        summary = _field(m, "summary", dict, where)
        if summary is not None:
            _check_summary(summary, where)
        msgs.append(
            Message(
                id=_field(m, "id", int, where, required=True),
                parent_id=_field(m, "parent", int, where),
                active_child_id=_field(m, "active_child", int, where),
                role=_field(m, "role", str, where, required=True),
                content=_field(m, "content", str, where, ""),
                reasoning=_field(m, "reasoning", str, where, ""),
                tool_calls=tool_calls,
                tool_call_id=_field(m, "tool_call_id", str, where),
                name=_field(m, "name", str, where),
                mode=_field(m, "mode", str, where),
                block_size=_field(m, "block_size", int, where),
                rollback=_field(m, "rollback", str, where),
                generation=generation,
                summary=summary,
                token_ids=token_ids,
                from_draft=[f == "1" for f in flags],
                finish_reason=_field(m, "finish_reason", str, where),
                status=_field(m, "status", str, where, "complete"),
                error=_field(m, "error", str, where),
                compare_group=_field(m, "compare_group", str, where),
                rounds=rounds,
                created_at=_time(m, "created_at", where, conv.created_at),
                updated_at=_time(m, "updated_at", where, conv.updated_at),
            )
        )
    return conv, msgs


def import_json(store: Store, data: dict | str | bytes | Path) -> Conversation:
    """Store an exported conversation as a new conversation (ids are new; all else is kept).

    ``data`` is the dict, its JSON text, or a path to a ``.json`` file.

    Raises:
        ImportFormatError: the data is not a valid export (see :func:`parse_json`); nothing
            is stored.
        OSError: the file cannot be read.
    """
    if isinstance(data, Path):
        data = data.read_bytes()
    conv, msgs = parse_json(data)
    try:
        return store.import_conversation(conv, msgs)
    except ValueError as exc:
        raise ImportFormatError(f"the export is inconsistent: {exc}") from exc


# --- Markdown -----------------------------------------------------------------------------


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def _fence(text: str, lang: str = "") -> str:
    """A fenced code block longer than any backtick run inside ``text``."""
    longest = 0
    run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


def _reply_heading(m: Message, store: Store) -> str:
    parts = ["Assistant"]
    if m.mode in DRAFTING_MODES:
        name = label(m.mode)
        detail = ", ".join(
            x
            for x in (
                f"block {m.block_size}" if m.block_size else "",
                f"{m.rollback} rollback" if m.rollback else "",
            )
            if x
        )
        parts.append(f"{name} ({detail})" if detail else name)
    elif m.mode == Mode.PLAIN:
        parts.append("plain decoding")
    versions = store.versions(m.id)
    if len(versions) > 1:
        index = next(i for i, v in enumerate(versions, start=1) if v.id == m.id)
        parts.append(f"version {index} of {len(versions)}")
    return " \u00b7 ".join(parts)


def _figures(m: Message) -> str:
    s = m.summary or {}
    bits = []
    n = s.get("generated_tokens", len(m.token_ids))
    if n:
        bits.append(f"{n} token" if n == 1 else f"{n} tokens")
    if s.get("tok_per_s"):
        bits.append(f"{s['tok_per_s']:.1f} tok/s")
    if s.get("acceptance_rate") is not None:
        bits.append(f"acceptance {100 * s['acceptance_rate']:.0f}%")
    if s.get("tau") is not None:
        bits.append(f"{s['tau']:.2f} tokens per cycle")
    continued = continued_text((m.generation or {}).get(CONTINUED_KEY) or [])
    if continued:
        bits.append(continued)
    if m.token_ids and any(m.from_draft):
        # a tool reply stores the last round's tokens only, under figures over every round
        where = "last round: " if m.rounds and len(m.token_ids) != n else ""
        source = "prompt lookup" if m.mode == Mode.LOOKUP else "the drafter"
        bits.append(f"{where}{sum(m.from_draft)} of {len(m.token_ids)} tokens from {source}")
    if m.status != "complete":
        bits.append(m.status + (f": {m.error}" if m.error else ""))
    elif ended := finish_text(m.finish_reason, s.get("stop_cause")):
        bits.append(ended)
    return " \u00b7 ".join(bits)


def _reasoning_md(text: str, title: str = "Reasoning") -> list[str]:
    """A collapsed reasoning block ([] for no reasoning)."""
    if not text.strip():
        return []
    return [f"<details><summary>{title}</summary>", "", text.strip(), "", "</details>", ""]


def _call_md(call: dict, result: str | None = None) -> list[str]:
    """A tool call (``Message.tool_calls`` entry) with its error or result; ``result``: the
    tool message's text, shown when the call has neither."""
    args = call.get("arguments")
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, indent=2)
    out = [f"**Tool call** `{call.get('name') or ''}`", "", _fence(text, "json"), ""]
    if call.get("error"):
        out += [f"**Error**: {call['error']}", ""]
    elif call.get("result") is not None:
        shown = json.dumps(call["result"], ensure_ascii=False, indent=2)
        out += ["**Result**", "", _fence(shown, "json"), ""]
    elif result is not None:
        out += ["**Result**", "", _fence(result), ""]
    return out


def _rounds_md(m: Message) -> list[str]:
    """A tool reply's rounds in the order they happened: each round's reasoning, text and
    tool calls with their results, the last round's reasoning and text being the reply's own
    (``m.reasoning``, ``m.content``). The results are the stored calls' (``m.tool_calls``,
    matched by id), else the tool messages'; stored calls no round names come last."""
    stored = {c.get("id"): c for c in m.tool_calls if c.get("id")}
    tool_text = {r.get("tool_call_id"): str(r.get("content") or "") for r in m.rounds
                 if r.get("role") == "tool"}
    assistants = [i for i, r in enumerate(m.rounds) if r.get("role") == "assistant"]
    last = assistants[-1]  # the caller sends only rounds with an assistant message
    shown: set = set()
    out: list[str] = []
    for n, i in enumerate(assistants, start=1):
        r = m.rounds[i]
        reasoning = str(r.get("reasoning_content") or "")
        content = str(r.get("content") or "")
        if i == last:
            reasoning = m.reasoning or reasoning
            content = m.content
        title = f"Reasoning (round {n})" if len(assistants) > 1 else "Reasoning"
        out += _reasoning_md(reasoning, title)
        if content.strip():
            out += [content.strip(), ""]
        for call in r.get("tool_calls") or []:
            call_id = call.get("id")
            f = call.get("function") or {}
            if call_id in stored and call_id not in shown:
                out += _call_md(stored[call_id], tool_text.get(call_id))
            else:
                out += _call_md({"name": f.get("name"), "arguments": f.get("arguments")},
                                tool_text.get(call_id))
            shown.add(call_id)
    for call in m.tool_calls:
        if call.get("id") not in shown:
            out += _call_md(call)
    return out


def _message_md(m: Message, store: Store, heading: str | None = None) -> list[str]:
    out: list[str] = []
    if m.role == "assistant":
        out.append(f"## {heading or _reply_heading(m, store)}")
    elif m.role == "tool":
        out.append("## Tool result" + (f" \u00b7 {m.name}" if m.name else ""))
    else:
        out.append(f"## {m.role.capitalize()}")
    out.append("")
    if any(r.get("role") == "assistant" for r in m.rounds):
        out += _rounds_md(m)
    else:
        # one round: reasoning, then the text, then the calls it ended with
        out += _reasoning_md(m.reasoning)
        if m.role == "tool":
            out += [_fence(m.content), ""]
        elif m.content:
            out += [m.content.strip(), ""]
        for call in m.tool_calls:
            out += _call_md(call)
    if m.role == "assistant":
        figures = _figures(m)
        if figures:
            out += [f"*{figures}*", ""]
    return out


def export_markdown(store: Store, conversation_id: int) -> str:
    """The conversation as shown (its active path) in Markdown: a heading per message,
    reasoning in a collapsed ``<details>`` block, tool calls and their results or errors in
    code blocks, and a line of figures under each reply (over every round; the drafter's
    share of a tool reply's tokens is its last round's, and says so). A reply that ran tools
    follows the order things happened: each round's reasoning (one block per round), text
    and calls with their results, then the last round's reasoning and the answer. The other
    reply of a Compare turn follows the one the conversation continues from."""
    conv = store.get_conversation(conversation_id)
    lines = [f"# {conv.title or 'Untitled conversation'}", ""]
    meta = [f"Created {_when(conv.created_at)}", f"updated {_when(conv.updated_at)}"]
    if conv.target_path:
        meta.append(f"target `{conv.target_path}`")
    if conv.drafter_path:
        meta.append(f"drafter `{conv.drafter_path}`")
    lines += ["*" + " \u00b7 ".join(meta) + "*", ""]
    for m in store.active_path(conversation_id):
        others = store.compare_siblings(m.id) if m.compare_group else []
        if others:
            dot = " \u00b7 "
            lines += _message_md(m, store, _reply_heading(m, store) + dot + "continued")
            for other in others:
                lines += _message_md(other, store, _reply_heading(other, store) + dot +
                                     "compared")
        else:
            lines += _message_md(m, store)
    return "\n".join(lines).rstrip() + "\n"


def write_export(store: Store, conversation_id: int, path: Path) -> Path:
    """Write the conversation to ``path``: JSON for a ``.json`` suffix, else Markdown.

    The file is written beside its target and renamed into place, so a failed write never
    leaves half a file. Returns ``path``.
    """
    path = Path(path)
    if path.suffix.lower() == ".json":
        text = export_json_text(store, conversation_id)
    else:
        text = export_markdown(store, conversation_id)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path

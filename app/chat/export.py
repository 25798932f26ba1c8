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

Times are POSIX seconds (float). ``from_draft`` is a string of ``0``/``1``, one per token.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from app.chat.conversation import (
    CONTINUED_KEY,
    Conversation,
    Message,
    all_reasoning,
    continued_text,
)
from app.chat.storage import Store

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


def _names(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)


def parse_json(data: dict | str | bytes) -> tuple[Conversation, list[Message]]:
    """Check an export and turn it into dataclasses with local ids (nothing is stored).

    Raises:
        ImportFormatError: not JSON, another format, a newer format version, or a field of the
            wrong type (the message names the message number and field).
    """
    if isinstance(data, bytes | str):
        try:
            data = json.loads(data)
        except ValueError as exc:
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
    num = (int, float)
    conv = Conversation(
        title=_field(c, "title", str, "conversation", ""),
        title_auto=_field(c, "title_auto", bool, "conversation", False),
        created_at=float(_field(c, "created_at", num, "conversation", required=True)),
        updated_at=float(_field(c, "updated_at", num, "conversation", required=True)),
        target_path=_field(c, "target_path", str, "conversation"),
        drafter_path=_field(c, "drafter_path", str, "conversation"),
        settings=_field(c, "settings", dict, "conversation", {}),
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
                generation=_field(m, "generation", dict, where, {}),
                summary=_field(m, "summary", dict, where),
                token_ids=token_ids,
                from_draft=[f == "1" for f in flags],
                finish_reason=_field(m, "finish_reason", str, where),
                status=_field(m, "status", str, where, "complete"),
                error=_field(m, "error", str, where),
                compare_group=_field(m, "compare_group", str, where),
                rounds=rounds,
                created_at=float(_field(m, "created_at", num, where, conv.created_at)),
                updated_at=float(_field(m, "updated_at", num, where, conv.updated_at)),
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
    if m.mode in ("dflash", "dflash2"):
        name = "DFlash2" if m.mode == "dflash2" else "DFlash"
        detail = ", ".join(
            x
            for x in (
                f"block {m.block_size}" if m.block_size else "",
                f"{m.rollback} rollback" if m.rollback else "",
            )
            if x
        )
        parts.append(f"{name} ({detail})" if detail else name)
    elif m.mode == "plain":
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
        bits.append(f"{where}{sum(m.from_draft)} of {len(m.token_ids)} tokens from the drafter")
    if m.status != "complete":
        bits.append(m.status + (f": {m.error}" if m.error else ""))
    return " \u00b7 ".join(bits)


def _message_md(m: Message, store: Store, heading: str | None = None) -> list[str]:
    out: list[str] = []
    if m.role == "assistant":
        out.append(f"## {heading or _reply_heading(m, store)}")
    elif m.role == "tool":
        out.append("## Tool result" + (f" \u00b7 {m.name}" if m.name else ""))
    else:
        out.append(f"## {m.role.capitalize()}")
    out.append("")
    # every round's reasoning, as the window shows it
    reasoning = all_reasoning(m.rounds, m.reasoning)
    if reasoning.strip():
        out += ["<details><summary>Reasoning</summary>", "", reasoning.strip(), "", "</details>"]
        out.append("")
    if m.role == "tool":
        out += [_fence(m.content), ""]
    elif m.content:
        out += [m.content.strip(), ""]
    for call in m.tool_calls:
        args = call.get("arguments")
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, indent=2)
        out += [f"**Tool call** `{call.get('name', '')}`", "", _fence(text, "json"), ""]
        if call.get("error"):
            out += [f"**Error**: {call['error']}", ""]
        elif call.get("result") is not None:
            result = json.dumps(call["result"], ensure_ascii=False, indent=2)
            out += ["**Result**", "", _fence(result, "json"), ""]
    if m.role == "assistant":
        figures = _figures(m)
        if figures:
            out += [f"*{figures}*", ""]
    return out


def export_markdown(store: Store, conversation_id: int) -> str:
    """The conversation as shown (its active path) in Markdown: a heading per message,
    reasoning in a collapsed ``<details>`` block (every round's, for a reply that ran tools),
    tool calls and their results or errors in code blocks, and a line of figures under each
    reply (over every round; the drafter's share of a tool reply's tokens is its last
    round's, and says so). The other reply of a Compare turn follows the one the
    conversation continues from."""
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

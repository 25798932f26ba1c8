"""Plain dataclasses for stored conversations (no sqlite, no Qt, no MLX).

A conversation is a tree of messages. Siblings (messages with the same parent) are versions of
one turn: a regenerated reply, the two replies of a Compare turn, or an edited user message.
Each message remembers which of its children is active; following the active children from
the conversation's active root gives the *active path*, the messages a prompt is built from.
Nothing is ever dropped from the tree when the user regenerates or edits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")

ReplyStatus = Literal["complete", "generating", "stopped", "interrupted", "error"]
STATUSES: tuple[str, ...] = ("complete", "generating", "stopped", "interrupted", "error")
"""``complete``: ended by an end token, stop string or the token limit; ``generating``: being
written now; ``stopped``: the user stopped it; ``interrupted``: the process died while it was
``generating`` (set on the next open); ``error``: generation failed (``Message.error`` says why)."""



@dataclass
class Conversation:
    """One conversation's own fields.

    Attributes:
        id: database row id (int); 0 for a conversation not stored yet.
        title: shown in the list; set from the first user prompt while ``title_auto`` is True.
        title_auto: False once the user renamed it (the auto-title then stays away).
        created_at, updated_at: POSIX seconds (float, UTC).
        target_path, drafter_path: the model pair last used (path or HF repo id; None if unset).
        settings: per-conversation settings (JSON-ready dict: system prompt, sampling, ...).
        active_root_id: id of the first message on the active path (None when empty).
    """

    id: int = 0
    title: str = ""
    title_auto: bool = True
    created_at: float = 0.0
    updated_at: float = 0.0
    target_path: str | None = None
    drafter_path: str | None = None
    settings: dict = field(default_factory=dict)
    active_root_id: int | None = None


@dataclass
class Message:
    """One message (any role); replies carry their generation record too.

    Attributes:
        id, conversation_id: database row ids (int).
        parent_id: the message this one follows (None for a first message).
        active_child_id: which child the active path continues with (None: the newest child).
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        content: visible text (str). reasoning: the ``<think>`` text (str, may be empty).
        tool_calls: assistant tool calls, a list of ``{"id": str, "name": str,
            "arguments": dict | str}``.
        tool_call_id, name: for ``tool`` messages, the call answered and the tool's name.
        mode: ``plain`` or ``dflash`` for replies (None otherwise); block_size (int tokens) and
            rollback (``tape``/``replay``) for DFlash replies.
        generation: the generation settings used (JSON-ready dict: temperature, max_tokens, ...);
            a drafting reply's also holds ``speedup`` once the window measured it against plain
            (``app.chat.baseline.SpeedUp.to_dict()``, None when no comparable plain speed was
            known), so a reloaded reply says what it said live; a reply Max tokens ended also
            holds what Continue resumes it from (``resume``: ``app.chat.turns.RESUME_KEY``),
            and a continued one its continuations (``continued``: :data:`CONTINUED_KEY`).
        summary: ``app.engine.events.Summary.to_dict()`` of the finished run (None until then).
        token_ids: generated token ids (list[int]); from_draft: one bool per token, True when the
            drafter proposed it (``TokenEvent.from_draft``), so highlighting survives a reload.
        finish_reason: e.g. ``stop``, ``length``, ``tool_calls``, ``cancelled`` (free text).
        status: one of :data:`STATUSES` (``complete`` for non-replies).
        error: the error message when ``status == "error"``.
        compare_group: shared by the two replies of one Compare turn (None otherwise).
        rounds: for a reply that ran tools, every chat-template message the reply added, in
            order (assistant turns with their ``tool_calls``, ``tool`` results, the final
            assistant turn), exactly as they were rendered while generating; empty for a
            one-round reply (its own fields are the message then).
        created_at, updated_at: POSIX seconds (float).
    """

    id: int = 0
    conversation_id: int = 0
    parent_id: int | None = None
    active_child_id: int | None = None
    role: str = "user"
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    mode: str | None = None
    block_size: int | None = None
    rollback: str | None = None
    generation: dict = field(default_factory=dict)
    summary: dict | None = None
    token_ids: list[int] = field(default_factory=list)
    from_draft: list[bool] = field(default_factory=list)
    finish_reason: str | None = None
    status: str = "complete"
    error: str | None = None
    compare_group: str | None = None
    rounds: list[dict] = field(default_factory=list)
    created_at: float = 0.0
    updated_at: float = 0.0

    def to_prompt_dicts(self) -> list[dict]:
        """This message as the chat-template messages it stands for: the stored ``rounds``
        of a reply that ran tools (copies, so a turn renders as it was generated: tool calls,
        tool results and reasoning included), otherwise ``[self.to_prompt_dict()]``."""
        if self.rounds:
            return [dict(m) for m in self.rounds]
        return [self.to_prompt_dict()]

    def to_prompt_dict(self) -> dict:
        """This message as a chat-template message (Hugging Face form).

        Keys: ``role``, ``content``; ``reasoning_content`` when there is reasoning;
        ``tool_calls`` as ``[{"id", "type": "function", "function": {"name", "arguments"}}]``
        with ``arguments`` a dict (a JSON string is parsed; unparsable text is kept as
        ``{"input": text}``); ``tool_call_id`` and ``name`` for tool results.
        """
        out: dict = {"role": self.role, "content": self.content}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.get("id") or f"call_{i}",
                    "type": "function",
                    "function": {
                        "name": call.get("name", ""),
                        "arguments": _arguments_dict(call.get("arguments")),
                    },
                }
                for i, call in enumerate(self.tool_calls)
            ]
        if self.role == "tool":
            if self.tool_call_id:
                out["tool_call_id"] = self.tool_call_id
            if self.name:
                out["name"] = self.name
        return out


def all_reasoning(rounds: list[dict], last: str) -> str:
    """The reasoning of every round of a reply, in order, one blank line between rounds (a
    tool reply thinks before its call and again before its answer). ``rounds``: the reply's
    chat-template messages (``Message.rounds``; [] for a reply of one round); ``last``: the
    reply's own reasoning (its last round's), added when the rounds do not end with it."""
    parts = [str(m.get("reasoning_content") or "").strip() for m in rounds
             if m.get("role") == "assistant"]
    parts = [p for p in parts if p]
    if last.strip() and (not parts or parts[-1] != last.strip()):
        parts.append(last.strip())
    return "\n\n".join(parts) if parts else last


CONTINUED_KEY = "continued"
"""Where a reply row's generation record (``Message.generation``) lists its continuations
(Continue after Max tokens), oldest first: ``[{"after_tokens": int, "tokens": int,
"max_tokens": int}]``, the reply's generated tokens before each, the tokens each added and
its Max tokens."""


def continued_text(continued: list[dict]) -> str:
    """A reply's continuations (:data:`CONTINUED_KEY`, ``ReplyResult.continued``) in words:
    ``"continued after 12 tokens"``, ``"continued after 12 and 24 tokens"`` (each the reply's
    generated tokens when it was continued); "" for none."""
    counts = [f"{int(c.get('after_tokens') or 0):,}" for c in continued
              if isinstance(c, dict)]
    if not counts:
        return ""
    joined = counts[0] if len(counts) == 1 else ", ".join(counts[:-1]) + " and " + counts[-1]
    return f"continued after {joined} tokens"


def finish_text(finish_reason: str | None, stop_cause: str | None = None) -> str:
    """How a reply that was not stopped ended, in the words its footer and the export use:
    ``"cut at max tokens"`` when Max tokens ended it (finish reason ``length``), ``"ended at
    a stop string"`` when one of the stop strings did (``stop_cause``, its engine summary's,
    is ``"stop_string"``; the string itself is not stored); "" when it ended by itself."""
    if finish_reason == "length":
        return "cut at max tokens"
    if finish_reason == "stop" and stop_cause == "stop_string":
        return "ended at a stop string"
    return ""


def _arguments_dict(arguments) -> dict:
    """Tool-call arguments as a dict, as chat templates expect them."""
    import json

    if arguments is None:
        return {}
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return {"input": arguments}
        return parsed if isinstance(parsed, dict) else {"input": parsed}
    return {"input": arguments}


@dataclass(frozen=True)
class SearchHit:
    """One search result: the conversation, and the matching message if the match is in one.

    ``snippet`` is up to ~120 characters around the first match (the title when the title
    matched).
    """

    conversation_id: int
    title: str
    message_id: int | None
    role: str | None
    snippet: str

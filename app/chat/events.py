"""Every event of a reply and of a stored turn, in one namespace importable without MLX (the
window, the server and the CLIs import their event types from here, and match them with
``isinstance``, never by class name).

* Engine events, re-exported from :mod:`app.engine.events`: :class:`TokenEvent`,
  :class:`CycleEvent` and :class:`Done` with its :class:`Summary`.
* Text events: the pipeline (:mod:`app.chat.pipeline`) emits :class:`ContentDelta`,
  :class:`ReasoningDelta`, :class:`ToolCallDelta`, :class:`PipelineWarning` and
  :class:`StopStringHit`.
* Reply events: the reply runner (:mod:`app.chat.reply`) adds :class:`RoundStarted`,
  :class:`RoundResumed` (when it continues a round Max tokens cut, :class:`ResumeRound`),
  :class:`ToolResultEvent`, :class:`RoundFinished` and ends with :class:`ReplyDone` carrying
  the :class:`Reply` (its rounds, :class:`ReplyRound`, with their tool runs,
  :class:`ToolRun`).
  ``app.chat.session.ChatSession.reply`` puts a :class:`Notice` first when the prompt was
  fitted to the context (turns left out, tool results shortened).
* Stored-turn events: ``app.chat.stored_turn.run_turn`` wraps each reply event in a
  :class:`TaggedEvent` (with its Compare side) and adds the turn's own: :class:`TurnBegun`,
  :class:`TurnNotStarted` (:class:`TurnNotStored`, :class:`TurnRefused`),
  :class:`SaveFailed`, :class:`ReplyFailed`, :class:`ReplyFinished` and, last,
  :class:`TurnStored`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from app.engine.events import CycleEvent, Done, Summary, TokenEvent

__all__ = [
    "ContentDelta", "CycleEvent", "Delta", "Done", "Notice", "PipelineWarning",
    "ReasoningDelta", "Reply", "ReplyDone", "ReplyEvent", "ReplyFailed", "ReplyFinished",
    "ReplyRound", "ResumeRound", "RoundFinished", "RoundResumed", "RoundStarted",
    "SaveFailed", "StopStringHit", "Summary", "TaggedEvent", "TokenEvent", "ToolCall",
    "ToolCallDelta", "ToolResultEvent", "ToolRun", "TurnBegun", "TurnEvent", "TurnNotStarted",
    "TurnNotStored", "TurnRefused", "TurnStored", "tool_call_dict",
]


@dataclass(frozen=True)
class Notice:
    """A sentence for the user about this reply's prompt: what was left out or shortened to
    fit the context (``app.chat.history.FittedHistory.notice``). Stored with the reply
    (``app.chat.turns.CONTEXT_KEY``, :meth:`to_dict`), so a reopened chat shows it too.

    Attributes:
        message: the sentence.
        left_out_turns: earlier turns left out of the prompt (0 when none).
        shortened_turns: earlier turns whose tool results were shortened.
        prompt_tokens: tokens of the prompt as sent (its first round).
        budget: tokens the prompt could take (context minus the reply's room, or the trained
            chat length when smaller).
    """

    message: str
    left_out_turns: int = 0
    shortened_turns: int = 0
    prompt_tokens: int = 0
    budget: int = 0

    def label(self) -> str:
        """The footer's short text, e.g. "3 earlier turns left out"."""
        n, k = self.left_out_turns, self.shortened_turns
        if n:
            return "1 earlier turn left out" if n == 1 else f"{n} earlier turns left out"
        if k:
            return "earlier tool results shortened"
        return "prompt fitted to the context"

    def to_dict(self) -> dict:
        """JSON-ready fields (stored with the reply, read back by :meth:`from_dict`)."""
        return {"message": self.message, "left_out_turns": self.left_out_turns,
                "shortened_turns": self.shortened_turns,
                "prompt_tokens": self.prompt_tokens, "budget": self.budget}

    @classmethod
    def from_dict(cls, d: Any) -> Notice | None:
        """The notice stored by :meth:`to_dict` (None for None or a record it cannot read)."""
        if not isinstance(d, dict) or not isinstance(d.get("message"), str):
            return None
        try:
            return cls(d["message"], *(int(d.get(k) or 0) for k in (
                "left_out_turns", "shortened_turns", "prompt_tokens", "budget")))
        except (TypeError, ValueError):
            return None

    @classmethod
    def of_fit(cls, fitted: Any) -> Notice | None:
        """The notice of an ``app.chat.history.FittedHistory``, None when nothing was left
        out or shortened."""
        message = fitted.notice()
        if not message:
            return None
        return cls(message, fitted.left_out_turns, fitted.shortened_turns,
                   fitted.prompt_tokens, fitted.budget)


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call.

    Attributes:
        id: deterministic per reply: ``call_0``, ``call_1``, ... in the order the calls appear.
        name: the function name the model wrote (not checked against the tool list).
        arguments: the parsed arguments (dict; values typed by the tool schema when given).
    """

    id: str
    name: str
    arguments: dict

    def to_dict(self) -> dict:
        """``{"id", "name", "arguments"}`` (the ``tool_calls`` entries of ``chat --json``)."""
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    def to_message(self) -> dict:
        """The OpenAI-style entry for an assistant message's ``tool_calls`` (what the chat
        template reads back): ``{"id", "type": "function", "function": {"name", "arguments"}}``
        with ``arguments`` as a dict."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ContentDelta:
    """New answer text. ``malformed`` is True for the text of a tool call that could not be
    parsed and is kept as content (a :class:`PipelineWarning` comes with it)."""

    text: str
    malformed: bool = False


@dataclass(frozen=True)
class ReasoningDelta:
    """New reasoning text (inside the thinking block)."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A tool call was parsed (emitted once, when its closing marker arrives)."""

    call: ToolCall


@dataclass(frozen=True)
class PipelineWarning:
    """Something in the text was not what it claimed to be.

    ``code``: ``"malformed_tool_call"`` (with ``text`` the raw call text, kept as content),
    ``"unclosed_tool_call"`` (a complete body without its end marker, read as a call) or
    ``"stopped_in_tool_call"`` (the user stopped the reply inside a call: dropped, not run)
    or ``"cut_in_tool_call"`` (the token limit ended the reply inside a call: dropped, not run)
    or ``"tool_not_offered"`` (a call to a tool the request did not offer, kept as content;
    only with ``ReplySettings.offered_tools_only``, which the server sets).
    ``message``: one line for the user.
    """

    code: str
    message: str
    text: str = ""

    def to_dict(self) -> dict:
        """``{"code", "message", "text"}`` for JSON output."""
        return {"code": self.code, "message": self.message, "text": self.text}


@dataclass(frozen=True)
class StopStringHit:
    """A stop string was found; the caller should cancel the engine.

    ``stop``: the stop string. ``kept_tokens``: how many generated tokens the reply keeps (the
    token that completed the stop string is the last one kept).
    """

    stop: str
    kept_tokens: int


Delta = ContentDelta | ReasoningDelta | ToolCallDelta | PipelineWarning | StopStringHit


@dataclass
class ToolRun:
    """One executed tool call: the call and its ``app.chat.tools`` ``ToolResult``."""

    call: ToolCall
    result: Any

    def to_dict(self) -> dict:
        """``{"id", "name", "ok", "result", "error", "duration_s"}``."""
        r = self.result
        return {
            "id": self.call.id,
            "name": self.call.name,
            "ok": bool(r.ok),
            "result": r.result if r.ok else None,
            "error": None if r.ok else r.error,
            "duration_s": round(float(r.duration_s), 6),
        }


@dataclass
class ReplyRound:
    """One generation inside a reply (a reply has several only when tools run).

    ``tokens``/``from_draft``: kept generated ids and, per id, whether the drafter proposed it.
    ``text``: raw decoded text of the kept tokens. ``summary``: the engine's figures with
    ``generated_tokens`` cut to the kept tokens. ``tool_runs``: calls executed after this
    round (empty when tools did not run). ``prompt_ids``: the rendered prompt of this round.
    ``starts_in_reasoning``: that prompt pre-opened the thinking block
    (``RenderedPrompt.starts_in_reasoning``). ``reasoning_tokens``: how many of ``tokens``
    were generated inside the thinking block (``TextPipeline.reasoning_tokens``). A round that
    continued one Max tokens cut (:class:`ResumeRound`) holds the whole round: ``tokens``,
    ``from_draft``, ``text`` and the texts include the cut part, ``prompt_ids`` is the cut
    round's prompt, while ``summary`` counts only what the continuation generated.
    """

    index: int
    mode: str
    content: str
    reasoning: str
    tool_calls: list[ToolCall]
    finish_reason: str
    tokens: list[int]
    from_draft: list[bool]
    text: str
    summary: Summary
    prompt_ids: list[int]
    warnings: list[PipelineWarning] = field(default_factory=list)
    tool_runs: list[ToolRun] = field(default_factory=list)
    starts_in_reasoning: bool = False
    reasoning_tokens: int = 0

    def to_dict(self) -> dict:
        """JSON-ready: ``index, content, reasoning, tool_calls, results, finish_reason,
        generated_tokens, summary``."""
        return {
            "index": self.index,
            "content": self.content,
            "reasoning": self.reasoning,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "results": [t.to_dict() for t in self.tool_runs],
            "finish_reason": self.finish_reason,
            "generated_tokens": len(self.tokens),
            "summary": self.summary.to_dict(),
        }


@dataclass
class Reply:
    """A finished reply.

    ``content``/``reasoning``/``tool_calls``/``finish_reason``/``tokens``/``from_draft``/
    ``text``/``summary`` are those of the last round (the final answer when tools ran);
    ``rounds`` holds every round, :attr:`reply_summary` the figures over all of them.
    ``mode`` is the decoding mode actually used (plain when a DFlash request fell back, see
    ``warnings``). ``messages`` are the messages this reply adds to the conversation
    (assistant turns with their tool calls, tool results, the final assistant turn), ready
    for the chat template. ``warnings``: pipeline warnings of every
    round plus reply-level ones (``{"code", "message"}`` dicts).
    """

    mode: str
    rounds: list[ReplyRound]
    messages: list[dict]
    warnings: list[dict]

    @property
    def content(self) -> str:
        return self.rounds[-1].content

    @property
    def reasoning(self) -> str:
        return self.rounds[-1].reasoning

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self.rounds[-1].tool_calls

    @property
    def finish_reason(self) -> str:
        return self.rounds[-1].finish_reason

    @property
    def tokens(self) -> list[int]:
        return self.rounds[-1].tokens

    @property
    def reasoning_tokens(self) -> int:
        """Of :attr:`tokens` (the last round's), those generated inside the thinking block."""
        return self.rounds[-1].reasoning_tokens

    @property
    def from_draft(self) -> list[bool]:
        return self.rounds[-1].from_draft

    @property
    def text(self) -> str:
        return self.rounds[-1].text

    @property
    def summary(self) -> Summary:
        return self.rounds[-1].summary

    @property
    def all_tokens(self) -> list[int]:
        """Generated ids of every round, concatenated."""
        return [t for r in self.rounds for t in r.tokens]

    @property
    def reply_summary(self) -> Summary:
        """The figures of the whole reply, every round included (``Summary.reply_total``:
        tokens summed, tok/s over the rounds' generation time, the first round's time to
        first token); :attr:`summary` is the last round's."""
        return Summary.reply_total([r.summary for r in self.rounds])


@dataclass(frozen=True)
class RoundStarted:
    """A generation round begins (``index`` 0-based, ``prompt_tokens`` its prompt length)."""

    index: int
    prompt_tokens: int
    mode: str


@dataclass(frozen=True)
class ResumeRound:
    """A generation round that Max tokens cut, to be continued where it stopped
    (``app.chat.reply.run_reply``'s ``resume``): the continuation's prompt is ``prompt_ids``
    followed by ``tokens``, token ids as the first run built and generated them (no text is
    tokenized again), so with greedy decoding the continued round is exactly the round one
    run with the two runs' Max tokens summed would have given.

    Attributes:
        prompt_ids: the cut round's prompt (list[int], as rendered when it was generated).
        tokens: the ids the round generated (list[int]; no end token: Max tokens ended it).
        from_draft: one bool per token, True where the drafter proposed it.
        starts_in_reasoning: the prompt pre-opened the thinking block.
        index: the round's index in its reply (0 for a reply without tool rounds).
        first_call_index: number of the round's first tool-call id (``call_<n>``): the calls
            of the reply's earlier rounds.
    """

    prompt_ids: list[int]
    tokens: list[int]
    from_draft: list[bool] = field(default_factory=list)
    starts_in_reasoning: bool = False
    index: int = 0
    first_call_index: int = 0


@dataclass(frozen=True)
class RoundResumed:
    """The round being continued (:class:`ResumeRound`) as its text pipeline holds it after
    reading the cut round's tokens again, sent right after its :class:`RoundStarted` and
    before any new token: ``content`` and ``reasoning`` are the round's texts so far (the
    deltas that follow extend exactly these), ``tokens``/``from_draft`` its ids and flags so
    far. Text the pipeline still holds back (a possible marker or trailing whitespace) is not
    in them; it comes with the next deltas."""

    index: int
    content: str
    reasoning: str
    tokens: list[int]
    from_draft: list[bool]


@dataclass(frozen=True)
class ToolResultEvent:
    """A tool call ran (``round``: the round whose call it was)."""

    round: int
    run: ToolRun


@dataclass(frozen=True)
class RoundFinished:
    """A generation round ended (its tools, if any, have not run yet)."""

    round: ReplyRound


@dataclass(frozen=True)
class ReplyDone:
    """The last event of :func:`run_reply`."""

    reply: Reply


ReplyEvent = (
    TokenEvent
    | CycleEvent
    | ContentDelta
    | ReasoningDelta
    | ToolCallDelta
    | PipelineWarning
    | StopStringHit
    | RoundStarted
    | RoundResumed
    | ToolResultEvent
    | RoundFinished
    | ReplyDone
)


# A stored turn's events (``app.chat.stored_turn.run_turn``): each reply event comes wrapped
# in a TaggedEvent, and the turn's own events come between and after them.


@dataclass(frozen=True)
class TaggedEvent:
    """One event of a turn and the ``tag`` of the Compare side it belongs to ("plain" /
    "dflash" / "dflash2"; "" for one reply or the turn as a whole). ``at``: when the backend
    produced it (seconds, ``time.monotonic``, the worker's clock, which the GUI thread shares),
    so the window times first tokens by when they were made, not when it drew them."""

    event: Any
    tag: str = ""
    at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class TurnBegun:
    """The turn's rows are stored (status ``generating``); generation starts.

    ``user_id`` is the user message's row (None for a regenerated reply); ``reply_ids`` maps
    each version key to its reply row."""

    conversation_id: int
    user_id: int | None
    reply_ids: dict[str, int]


@dataclass(frozen=True)
class TurnNotStarted:
    """The turn's rows could not be stored, so nothing was stored and no reply ran;
    ``message`` says why."""

    message: str


@dataclass(frozen=True)
class TurnNotStored(TurnNotStarted):
    """The turn's rows could not be written (``app.chat.storage.StoreWriteError``: a full
    disk, an I/O error, the database locked beyond its timeout), so nothing was stored and
    no reply ran; ``message`` names the cause and the folder."""


@dataclass(frozen=True)
class SaveFailed:
    """A write of the running reply failed (``app.chat.storage.StoreWriteError``; its
    growth, sent at the first failure of a turn): the reply goes on and keeps its text in
    memory, and its final state is written at the end if the store can take it then
    (else :class:`TurnStored` says so too). ``message`` names the cause and the folder."""

    message: str


@dataclass(frozen=True)
class TurnRefused(TurnNotStarted):
    """The turn's prompt does not fit the model's context (``PromptTooLongError``), so its
    rows were rolled back and no reply ran, or a reply cannot be continued
    (``app.chat.stored_turn.CannotContinueError``; nothing was changed); ``message`` says why and what to
    change."""


@dataclass(frozen=True)
class ReplyFinished:
    """The last event of one reply (or one side of a Compare turn): its
    ``app.chat.turns.ReplyResult`` (typed ``Any`` here: that module builds on this one)."""

    result: Any


@dataclass(frozen=True)
class ReplyFailed:
    """Generation failed; ``message`` is for the user (the reply keeps what it had)."""

    message: str


@dataclass(frozen=True)
class TurnStored:
    """The last event of a turn: every reply row holds its final state.

    ``reply_ids`` maps each version key to its row; ``chosen`` is the key the conversation
    continues from (made active; for a Compare, DFlash's side when it finished, else the first
    side that finished, else the first that ran); ``error`` says why the final write failed ("" when it did
    not; the rows then keep their last saved growth and become ``interrupted`` on the next
    start)."""

    conversation_id: int
    reply_ids: dict[str, int]
    chosen: str
    error: str = ""
    pending: Any = None
    """When the final write failed because the store could not write
    (``app.chat.storage.StoreWriteError``: a full disk, ...): that write, to be tried again
    (``app.chat.stored_turn.PendingWrite``, kept in its ``PendingWrites``); None otherwise."""


TurnEvent = (TurnBegun | TurnNotStarted | SaveFailed | ReplyFailed | ReplyFinished
             | TurnStored)
"""A stored turn's own events (each reply event comes as a :class:`TaggedEvent`'s
``event``; so do these, with the tag of their side or "")."""


def tool_call_dict(obj: Any) -> dict:
    """A tool call (``ToolCall``, ``ToolRun`` or a dict) as the dict the tool pane shows:
    ``id``, ``name``, ``arguments``, ``result``, ``error``, ``duration_s`` (None when not
    known)."""
    d = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
    return {
        "id": str(d.get("id") or ""),
        "name": str(d.get("name") or "?"),
        "arguments": d.get("arguments"),
        "result": d.get("result"),
        "error": d.get("error"),
        "duration_s": d.get("duration_s"),
    }

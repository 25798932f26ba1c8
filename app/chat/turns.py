"""The stored conversation as the window shows it: turns, each reply with its versions.

This is a view over :mod:`app.chat.storage` (the one conversation model), not a second model:
every value comes from a stored ``app.chat.conversation.Message`` row and every change is
written to the :class:`~app.chat.storage.Store` (choices through :class:`ViewStore`, replies
by ``app.chat.stored_turn``). In the view

* a user message is one :class:`Turn` (``ids[""]`` is its row);
* an assistant turn is one :class:`Turn` whose :attr:`Turn.versions` are sibling reply rows:
  a regenerated reply (keys ``"plain"``, ``"dflash"``, then ``"<mode>#<n>"``, see
  :func:`version_key`), or the sides of a Compare turn (``"plain"``/``"dflash"``, and
  ``"dflash2"`` with a DFlash2 drafter, sharing a ``compare_group``); ``chosen`` is the
  version on the active path.

The prompt for a reply is never built from this view: ``app.chat.stored_turn.prompt_for`` reads
the stored rows (tool calls, tool results and reasoning as generated). Titles come from the
storage's one rule (``app.chat.storage.auto_title``). Qt-free; the window calls it from the GUI
thread (sqlite only, no MLX) to read conversations and to write titles, settings, version
choices and a finished reply's speed-up against plain (measured by the window); a reply is written by ``app.chat.stored_turn.run_turn`` on the worker thread, and the
view catches up with :meth:`ViewStore.reload_turn`. An in-memory store is
``ViewStore(":memory:")``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from app.chat.baseline import SpeedUp
from app.chat.conversation import CONTINUED_KEY, all_reasoning
from app.chat.conversation import Message as StoredMessage
from app.chat.events import (
    ContentDelta,
    Notice,
    ReasoningDelta,
    Reply,
    RoundResumed,
    RoundStarted,
    ToolCallDelta,
    ToolResultEvent,
    tool_call_dict,
)
from app.chat.settings import ReplySettings
from app.chat.storage import (
    DB_FILENAME,
    ConversationNotFoundError,
    StorageError,
    Store,
    StoreReadError,
    readable_copy,
)
from app.engine.events import Done, Summary, TokenEvent

log = logging.getLogger(__name__)

_SUMMARY_FIELDS = {f.name for f in fields(Summary)}
SPEEDUP_KEY = "speedup"
"""Where a reply row's generation record keeps its measured speed-up against plain."""
TOP2_GAP_KEY = "top2_gap"
"""Where a Compare turn's drafting row keeps its top-two logit gap at the first divergence
from plain (None: the sides agree, or no gap was computed); rows stored before it have none."""
CONTEXT_KEY = "context"
"""Where a reply row's generation record keeps the :class:`app.chat.events.Notice` of its
prompt (``Notice.to_dict``): earlier turns left out or tool results shortened to fit the
context. Absent when the whole chat was sent."""
RESUME_KEY = "resume"
"""Where a reply row that Max tokens ended keeps what Continue needs to resume it:
``{"prompt_ids": [int], "starts_in_reasoning": bool, "target": str, "drafter": str | None}``,
the cut round's prompt as its first run built it and the models that made it
(``ChatSession.made_by``); None once the reply ended otherwise. Rows stored before it, Compare
sides and replies of a backend without models have none: they cannot be continued."""


def version_key(mode: str, taken) -> str:
    """The key of a new reply version in ``mode``: ``mode`` itself, else ``"<mode>#<n>"``
    with the smallest ``n >= 2`` not in ``taken`` (any container of keys)."""
    key, n = mode, 1
    while key in taken:
        n += 1
        key = f"{mode}#{n}"
    return key


def finish_fields(reply: Any) -> dict:
    """The stored fields of a finished ``app.chat.events.Reply`` (as ``Store.finish_reply``
    names them): ``content``, ``reasoning`` (of the last round), ``tool_calls`` (every round's calls with
    their ``result``/``error``/``duration_s``), ``token_ids``/``from_draft`` (last round),
    ``summary`` (dict), ``finish_reason`` and ``rounds`` (the chat-template messages when the
    reply ran more than one round, else ``[]``)."""
    calls: list[dict] = []
    for rnd in reply.rounds:
        runs = {r.call.id: r.to_dict() for r in rnd.tool_runs}
        for call in rnd.tool_calls:
            d = {"id": call.id, "name": call.name, "arguments": call.arguments,
                 "result": None, "error": None, "duration_s": None}
            if call.id in runs:
                d.update({k: runs[call.id][k] for k in ("result", "error", "duration_s")})
            calls.append(d)
    return {
        "content": reply.content,
        "reasoning": reply.reasoning,
        "tool_calls": calls,
        "token_ids": list(reply.tokens),
        "from_draft": list(reply.from_draft),
        "summary": reply.summary.to_dict() if reply.summary is not None else None,
        "finish_reason": reply.finish_reason,
        "rounds": [dict(m) for m in reply.messages] if len(reply.rounds) > 1 else [],
    }


def _warning_texts(warnings: list) -> list[str]:
    """A reply's warnings (``Reply.warnings``: ``{"code", "message"}`` dicts) as the parts
    of its note, in order; a context overflow only once (replies stored before
    ``app.chat.reply`` gave it once a reply hold one for each tool round)."""
    out: list[str] = []
    overflow = False
    for w in warnings:
        text = str(w.get("message", w)) if isinstance(w, dict) else str(w)
        if isinstance(w, dict) and w.get("code") == "context_overflow":
            if overflow:
                continue
            overflow = True
        out.append(text)
    return out


def _number(value: Any) -> float | None:
    """A stored figure as a float (None for anything else)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _temperature(values: dict | None) -> float:
    """The ``temperature`` of a settings or stored generation dict (0.0 when absent or not a
    number)."""
    return _number((values or {}).get("temperature")) or 0.0


def summary_from_dict(d: dict | None) -> Summary | None:
    """A :class:`Summary` from its stored dict (keys of newer versions ignored; None stays
    None)."""
    if not d:
        return None
    return Summary(**{k: v for k, v in d.items() if k in _SUMMARY_FIELDS})


@dataclass
class ReplyResult:
    """A finished (or stopped) reply in plain Python types (safe to hand to the GUI).

    Attributes:
        content, reasoning: final text (str).
        tool_calls: list of dicts (id, name, arguments, result, error, duration_s).
        finish_reason: "stop", "length", "tool_calls", "cancelled" or "error".
        tokens: generated token ids (list[int]); from_draft: one bool per token.
        pieces: the text of each token from mlx-lm's streaming detokenizer (list[str], same
            length as ``tokens``; "" for a token that only completes a later character).
        summary: the engine :class:`Summary` of the whole reply (``Summary.reply_total`` over
            its rounds; None when no round ran).
        round_summaries: each round's :class:`Summary` when it ran more than one round
            (stored in the row's ``summary`` as ``round_summaries``; rows stored before that
            have only the total).
        rounds: generation rounds (tool calls make more than one).
        mode, block_size, rollback: how the reply was generated.
        temperature: the sampling temperature it was generated at (0.0: greedy); a Compare
            at a temperature above 0 samples each side, so its sides are not expected to match.
        messages: the chat-template messages of every round when tools ran (stored as the
            row's ``rounds``, so the next prompt shows the calls and results); [] otherwise.
        top2_gap: in a Compare, on the DFlash side of two replies that differ: the target's
            top-two logit gap at the first divergence (None otherwise); stored with the row
            (:data:`TOP2_GAP_KEY`), so a reopened Compare has it too.
        gap_checked: True when the gap was looked for (live, or stored as
            :data:`TOP2_GAP_KEY`); False for a row stored without it.
    """

    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    finish_reason: str = "stop"
    tokens: list[int] = field(default_factory=list)
    from_draft: list[bool] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    summary: Summary | None = None
    rounds: int = 1
    mode: str = "plain"
    block_size: int | None = None
    rollback: str = "tape"
    temperature: float = 0.0
    error: str | None = None
    note: str = ""
    messages: list[dict] = field(default_factory=list)
    top2_gap: float | None = None
    gap_checked: bool = True
    round_summaries: list = field(default_factory=list)
    speedup: Any = None
    """An :class:`app.chat.baseline.SpeedUp` against a comparable plain speed (a drafting
    reply; None without a baseline). Measured by the window when the reply finished and
    stored with it (:meth:`ViewStore.set_speedup`), so a reloaded reply has it too."""
    speed_checked: bool = False
    """True once a baseline was looked for (the footer then says what it found)."""
    resumable: bool = False
    """Max tokens ended it and its row keeps how it was made (:data:`RESUME_KEY`), so
    Continue can resume it where it stopped."""
    continued: list[dict] = field(default_factory=list)
    """Its continuations, oldest first (``app.chat.conversation.CONTINUED_KEY``); [] for a
    reply of one run."""
    context_note: Notice | None = None
    """What was left out of its prompt to fit the context (None: the whole chat was sent);
    stored with the row (:data:`CONTEXT_KEY`), so the footer of a reopened chat says it."""
    status: str = "complete"
    """Its row's status (``app.chat.conversation.STATUSES``: ``complete``, ``generating``,
    ``stopped``, ``interrupted`` or ``error``), as read back by :meth:`from_row`; a result
    made while the reply ran says ``complete`` until its row is written (its
    :attr:`finish_reason` tells a stopped one)."""

    def all_reasoning(self) -> str:
        """The reasoning of every round, in order (:func:`app.chat.conversation.all_reasoning`)."""
        return all_reasoning(self.messages, self.reasoning)

    @classmethod
    def from_reply(cls, reply: Reply, settings: ReplySettings,
                   pieces_fn: Callable[[list[int]], list[str]]) -> ReplyResult:
        """The result of a finished ``app.chat.events.Reply``: the last round's text and
        tokens, the figures over every round (``Summary.reply_total``), every round's tool calls with their results (``finish_fields``), the warnings
        joined as the note, the token texts from ``pieces_fn``; ``settings`` the reply's
        :class:`~app.chat.settings.ReplySettings` (its mode, block size, rollback and
        temperature)."""
        fields = finish_fields(reply)
        tokens = fields["token_ids"]
        round_summaries = [r.summary for r in reply.rounds if r.summary is not None]
        flags = fields["from_draft"]
        note = "; ".join(_warning_texts(reply.warnings))
        return cls(
            content=fields["content"],
            reasoning=fields["reasoning"],
            tool_calls=fields["tool_calls"],
            finish_reason=fields["finish_reason"] or "stop",
            tokens=tokens,
            from_draft=flags + [False] * (len(tokens) - len(flags)),
            pieces=pieces_fn(tokens),
            summary=(Summary.reply_total(round_summaries) if round_summaries
                     else reply.summary),
            round_summaries=round_summaries,
            rounds=max(1, len(reply.rounds)),
            mode=reply.mode or settings.mode,
            block_size=settings.block_size,
            rollback=settings.rollback,
            temperature=settings.sampling.temperature,
            note=note,
            messages=[dict(m) for m in reply.messages],
        )

    @classmethod
    def from_row(cls, m: StoredMessage) -> ReplyResult:
        """The result of a stored reply row."""
        return cls(
            content=m.content,
            reasoning=m.reasoning,
            tool_calls=[dict(c) for c in (m.tool_calls or [])],
            finish_reason=m.finish_reason or ("cancelled" if m.status in ("stopped",
                                                                          "interrupted")
                                              else "stop"),
            tokens=list(m.token_ids or []),
            from_draft=list(m.from_draft or []),
            summary=summary_from_dict(m.summary),
            round_summaries=[summary_from_dict(d) for d in
                             (m.summary or {}).get("round_summaries") or [] if d],
            rounds=max(1, sum(1 for r in m.rounds if r.get("role") == "assistant")),
            mode=m.mode or "plain",
            block_size=m.block_size,
            rollback=m.rollback or "tape",
            temperature=_temperature(m.generation),
            error=m.error,
            messages=[dict(r) for r in m.rounds],
            speedup=SpeedUp.from_dict((m.generation or {}).get(SPEEDUP_KEY)),
            speed_checked=SPEEDUP_KEY in (m.generation or {}),
            top2_gap=_number((m.generation or {}).get(TOP2_GAP_KEY)),
            gap_checked=TOP2_GAP_KEY in (m.generation or {}),
            resumable=(m.finish_reason == "length" and m.status == "complete"
                       and bool((m.generation or {}).get(RESUME_KEY))),
            continued=[dict(c) for c in (m.generation or {}).get(CONTINUED_KEY) or []
                       if isinstance(c, dict)],
            context_note=Notice.from_dict((m.generation or {}).get(CONTEXT_KEY)),
            status=m.status,
        )

    @property
    def cut_round_summary(self) -> Summary | None:
        """The figures of its last round alone (the one Max tokens cut, for a reply that
        ended so): ``summary`` for a reply of one round, else the last of
        ``round_summaries`` (None when those were not stored)."""
        if self.rounds <= 1:
            return self.summary
        if len(self.round_summaries) == self.rounds:
            return self.round_summaries[-1]
        return None

    def continued_by(self, after: ReplyResult, max_tokens: int) -> ReplyResult:
        """This reply, which Max tokens cut, with its continuation ``after`` (the result of
        the continuing run: its first round is the whole cut round, cut part included, as
        ``app.chat.reply.run_reply`` gives it for a ``ResumeRound``; its figures count only
        what it generated) made one reply: the earlier rounds' messages and tool calls
        kept, ``after``'s texts, tokens and finish reason, the cut round's figures and the
        continuation's joined (:meth:`Summary.continued`), the reply total over every round,
        and one more entry in :attr:`continued`. ``max_tokens``: the continuation's Max
        tokens. The speed-up against plain is measured again (None here)."""
        earlier = max(0, self.rounds - 1)
        earlier_messages = [dict(m) for m in self.messages[:-1]] if earlier else []
        earlier_summaries = list(self.round_summaries[:earlier]) \
            if len(self.round_summaries) == self.rounds else []
        after_rounds = list(after.round_summaries) or \
            ([after.summary] if after.summary is not None else [])
        cut = self.cut_round_summary
        if cut is not None and after_rounds:
            after_rounds[0] = Summary.continued(cut, after_rounds[0])
        elif cut is not None:
            after_rounds = [cut]
        round_summaries = earlier_summaries + after_rounds
        before_tokens = (self.summary.generated_tokens if self.summary is not None
                         else len(self.tokens))
        added = (after.round_summaries[0].generated_tokens if after.round_summaries
                 else after.summary.generated_tokens if after.summary is not None
                 else max(0, len(after.tokens) - len(self.tokens)))
        return dataclasses.replace(
            after,
            tool_calls=[dict(c) for c in self.tool_calls] + [dict(c) for c in after.tool_calls],
            summary=(Summary.reply_total(round_summaries) if round_summaries
                     else self.summary),
            round_summaries=round_summaries,
            rounds=earlier + max(1, after.rounds),
            mode=self.mode,
            block_size=self.block_size if self.block_size is not None else after.block_size,
            rollback=self.rollback,
            messages=earlier_messages + [dict(m) for m in after.messages],
            error=None,
            speedup=None,
            speed_checked=False,
            resumable=False,
            context_note=self.context_note,
            continued=[*self.continued, {"after_tokens": int(before_tokens),
                                         "tokens": int(added),
                                         "max_tokens": int(max_tokens)}],
        )


class PartialReply:
    """What a reply produced so far, from its events (:meth:`add`), for a
    :class:`ReplyResult` when it ends without ``ReplyDone`` (an error, or a scripted
    session): :meth:`result`."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.flags: list[bool] = []
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[str, dict] = {}
        self.summaries: list[Summary] = []

    @property
    def summary(self) -> Summary | None:
        """The figures over every round seen (None before the first ``Done``)."""
        return Summary.reply_total(self.summaries) if self.summaries else None

    def add(self, ev: Any) -> None:
        """Take one event (others than round starts, a continued round's ``RoundResumed``,
        tokens, text, tool calls and ``Done`` are ignored)."""
        if isinstance(ev, RoundStarted):
            if ev.index > 0 and self.reasoning:
                self.reasoning.append("\n\n")  # each round's reasoning its own paragraph
        elif isinstance(ev, RoundResumed):  # the cut round's part, before the new tokens
            self.tokens.extend(ev.tokens)
            self.flags.extend(ev.from_draft)
            self.content.append(ev.content)
            self.reasoning.append(ev.reasoning)
        elif isinstance(ev, TokenEvent):
            self.tokens.append(ev.token_id)
            self.flags.append(ev.from_draft)
        elif isinstance(ev, ContentDelta):
            self.content.append(ev.text)
        elif isinstance(ev, ReasoningDelta):
            self.reasoning.append(ev.text)
        elif isinstance(ev, (ToolCallDelta, ToolResultEvent)):
            d = tool_call_dict(ev.call if isinstance(ev, ToolCallDelta) else ev.run)
            merged = self.calls.setdefault(d["id"] or f"{d['name']}#{len(self.calls)}", {})
            merged.update({k: v for k, v in d.items() if v is not None})
        elif isinstance(ev, Done):
            self.summaries.append(ev.summary)

    def result(self, settings: ReplySettings, pieces_fn: Callable[[list[int]], list[str]], *,
               failed: bool = False, cancelled: bool = False) -> ReplyResult:
        """The :class:`ReplyResult` so far: finish reason from the engine's stop cause
        (``error`` when ``failed``, ``cancelled`` when stopped without a summary)."""
        finish = "stop"
        if self.summary is not None:
            finish = {"end_token": "stop", "length": "length", "cancelled": "cancelled",
                      "error": "error"}.get(self.summary.stop_cause, "stop")
        elif cancelled:
            finish = "cancelled"
        if failed:
            finish = "error"
        return ReplyResult(
            content="".join(self.content),
            reasoning="".join(self.reasoning),
            tool_calls=list(self.calls.values()),
            finish_reason=finish,
            tokens=self.tokens,
            from_draft=self.flags,
            pieces=pieces_fn(self.tokens),
            summary=self.summary,
            round_summaries=list(self.summaries),
            rounds=max(1, len(self.summaries)),
            mode=settings.mode,
            block_size=settings.block_size,
            rollback=settings.rollback,
            temperature=settings.sampling.temperature,
        )


@dataclass
class Version:
    """One generated version of an assistant turn, as the window shows it: a thin view of its
    :class:`ReplyResult` (read back from its row), whose :attr:`ReplyResult.status` gives the
    flags below."""

    result: ReplyResult

    @property
    def stopped(self) -> bool:
        """True when the reply is partial: Stop, or interrupted (the app ended while it was
        written)."""
        return self.result.status in ("stopped", "interrupted")

    @property
    def interrupted(self) -> bool:
        """True when the app ended while the reply was written."""
        return self.result.status == "interrupted"

    @property
    def error(self) -> str | None:
        """The generation error message of a reply that failed (None otherwise)."""
        return self.result.error if self.result.status == "error" else None

    @property
    def never_ran(self) -> bool:
        """True for a Compare side that was stopped before it ran (stored as an empty row):
        nothing to show and nothing to continue from."""
        return self.empty and self.result.summary is None

    @property
    def empty(self) -> bool:
        """True for a reply stopped (or interrupted) before it wrote anything: no token,
        text or call, whether or not it began (:attr:`never_ran`): nothing to continue
        from."""
        r = self.result
        return (self.stopped and not r.tokens and not r.content and not r.reasoning
                and not r.tool_calls)


@dataclass
class Turn:
    """A shown message. ``role`` is "user" or "assistant".

    Assistant turns keep every version (see the module doc); ``chosen`` is the key of the
    version the conversation continues from; ``ids`` maps "" (a user message) or each version
    key to its storage row id. A user message that was edited lists in ``edits`` the storage
    ids of its versions, oldest (as first written) first, the shown one among them; empty
    when it was never edited (:meth:`ViewStore.show_prompt_version` switches).
    """

    role: str
    content: str = ""
    versions: dict[str, Version] = field(default_factory=dict)
    chosen: str = ""
    created: float = field(default_factory=time.time)
    compare: bool = False
    ids: dict[str, int] = field(default_factory=dict)
    edits: tuple[int, ...] = ()

    @property
    def version(self) -> Version | None:
        """The chosen version (None for user messages or a turn still being generated)."""
        return self.versions.get(self.chosen)

    @property
    def is_compare(self) -> bool:
        """True for a Compare turn (plain and DFlash, maybe DFlash2, versions of one prompt)."""
        return self.compare

    def text(self) -> str:
        """The text shown for the turn (the chosen version's answer for a reply)."""
        v = self.version
        return v.result.content if v is not None else self.content


@dataclass
class ConversationView:
    """A conversation's id, title, per-conversation settings overrides and shown turns."""

    id: int
    title: str
    messages: list[Turn] = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    updated: float = field(default_factory=time.time)
    earlier: int = 0
    """Turns of the conversation before :attr:`messages` that were not loaded (a very long
    chat loads its latest :data:`LOAD_TURNS`; ``ViewStore.get`` with a larger ``last``
    loads more)."""


LOAD_TURNS = 400
"""How many of a conversation's latest turns :meth:`ViewStore.get` loads by default: a chat
of 200,000 messages opens as fast as a short one, and the window loads earlier turns when
asked (its "Show earlier messages" link)."""


class ViewStore:
    """The window's conversations as :class:`ConversationView` objects, read from and saved
    to one :class:`~app.chat.storage.Store` (the worker writes the replies themselves).

    Args:
        path: the database file, or ``":memory:"`` for chats kept in memory only.
        db: an open store to use instead (``path`` is then not opened).

    Raises:
        StorageError: from the constructor when the database cannot be used (the caller
            falls back to memory and says so, see :func:`open_store`).
    """

    problem: str = ""
    """Why chats are kept in memory only ("" when they are stored as asked)."""

    def __init__(self, path: Path | str = ":memory:", *, db: Store | None = None) -> None:
        self.db = db if db is not None else Store(path)
        self.on_read_error: Callable[[str], None] | None = None
        """Called with the message the first time a read meets a damaged database
        (:meth:`list`, :meth:`get` and :meth:`search` then answer as if nothing were
        stored); the window shows it in its storage banner."""
        self.read_failed = False
        """Whether a read has met a damaged database since the store opened."""

    def _read_failed(self, exc: StoreReadError) -> None:
        if self.read_failed:  # said once: every refresh of the list would repeat it
            return
        self.read_failed = True
        log.error("reading the conversation database: %s", exc)
        if self.on_read_error is not None:
            self.on_read_error(str(exc))

    # ---- conversations
    def list(self) -> list[ConversationView]:
        """Every conversation (titles only; turns load with :meth:`get`), newest first;
        empty when the database cannot be read (:attr:`on_read_error` is told)."""
        try:
            rows = self.db.list_conversations()
        except StoreReadError as exc:
            self._read_failed(exc)
            return []
        return [ConversationView(id=c.id, title=c.title or "New chat",
                                 settings=dict(c.settings), updated=c.updated_at)
                for c in rows]

    def new(self) -> ConversationView:
        """A new, empty conversation (titled by its first prompt, ``auto_title``)."""
        c = self.db.new_conversation()
        return ConversationView(id=c.id, title="New chat", updated=c.updated_at)

    def get(self, conv_id: int, last: int | None = LOAD_TURNS) -> ConversationView | None:
        """The conversation's active path as turns (None when it does not exist): its latest
        ``last`` turns (user messages and replies; None: all of them), the number before them
        in :attr:`ConversationView.earlier`. Only the rows of those turns are read (with
        :meth:`Store.path_outline` for the path), so the time it takes does not grow with
        the conversation's length beyond reading its ids. None too when the database cannot
        be read (:attr:`on_read_error` is told)."""
        try:
            return self._get(conv_id, last)
        except StoreReadError as exc:
            self._read_failed(exc)
            return None

    def _get(self, conv_id: int, last: int | None) -> ConversationView | None:
        try:
            c = self.db.get_conversation(conv_id)
            path, children = self.db.path_outline(conv_id)
        except StoreReadError:
            raise
        except StorageError:
            return None
        conv = ConversationView(id=c.id, title=c.title or "New chat",
                                settings=dict(c.settings), updated=c.updated_at)
        shown = [(mid, role) for mid, role in path if role in ("user", "assistant")]
        parent_of = {k: parent for parent, kids in children.items() for k, _ in kids}
        cut = 0 if last is None else max(0, len(shown) - max(1, int(last)))
        conv.earlier = cut
        for m in self.db.messages_by_id([mid for mid, _ in shown[cut:]]):
            if m.role == "user":
                edits = [k for k, role in children.get(parent_of.get(m.id), [])
                         if role == "user"]
                conv.messages.append(Turn("user", m.content, ids={"": m.id},
                                          edits=tuple(edits) if len(edits) > 1 else ()))
            else:
                conv.messages.append(self._reply_turn(m))
        return conv

    def _reply_turn(self, m: StoredMessage) -> Turn:
        turn = Turn("assistant")
        siblings = self.db.compare_siblings(m.id) if m.compare_group else []
        if siblings:
            turn.compare = True
            rows = [(r.mode or "plain", r) for r in (m, *siblings)]
        else:
            rows: list = []
            for row in self.db.versions(m.id):
                if row.role != "assistant" or row.compare_group:
                    continue
                rows.append((version_key(row.mode or "plain", dict(rows)), row))
        for key, row in rows:
            turn.versions[key] = Version(ReplyResult.from_row(row))
            turn.ids[key] = row.id
            if row.id == m.id:
                turn.chosen = key
        return turn

    def show_prompt_version(self, conv_id: int, message_id: int) -> ConversationView | None:
        """Show another version of an edited user message (one of its :attr:`Turn.edits`):
        the conversation continues from it, with the replies stored under it, and the
        conversation as it now reads is returned (None when it does not exist).

        Raises:
            MessageNotFoundError: no message ``message_id``.
        """
        self.db.set_active(message_id)
        return self.get(conv_id)

    def save(self, conv: ConversationView) -> None:
        """Write the choices the window makes: the per-conversation settings and the version
        each turn continues from (replies themselves are stored by
        ``app.chat.stored_turn.run_turn`` on the worker); the stored title comes back."""
        self.db.update_conversation(conv.id, settings=dict(conv.settings))
        for msg in conv.messages:
            if msg.role == "assistant" and len(msg.ids) > 1 and msg.chosen in msg.ids:
                self.db.set_active(msg.ids[msg.chosen])
        stored = self.db.get_conversation(conv.id)
        if stored.title:
            conv.title = stored.title

    def reload_turn(self, conv: ConversationView, reply: Turn,
                    live: dict[str, ReplyResult]) -> None:
        """After a stored turn (``app.chat.events.TurnStored``): bring the view's last
        two turns (the user message and ``reply``, which must be the last) up to date with the
        store, in place: row ids, versions and their status (stopped, interrupted, error), the
        chosen version, the user message's versions (:attr:`Turn.edits`), the title. ``live``
        maps version keys to the results streamed in this run of the app, which the view keeps
        (they hold what the store has, plus what only the live run knows: token texts,
        per-round figures, the top-two gap)."""
        fresh = self.get(conv.id, last=max(1, len(conv.messages)))  # as many as the view has
        if fresh is None:
            return
        conv.title, conv.updated = fresh.title, fresh.updated
        if len(fresh.messages) != len(conv.messages) or not fresh.messages or \
                conv.messages[-1] is not reply or fresh.messages[-1].role != "assistant":
            conv.messages = fresh.messages  # the view went out of step: take the store's
            conv.earlier = fresh.earlier
            return
        conv.earlier = fresh.earlier
        stored = fresh.messages[-1]
        for key, v in stored.versions.items():
            if key in live:  # the live record, with its row's status and error
                live[key].status, live[key].error = v.result.status, v.result.error
                v.result = live[key]
        reply.versions, reply.ids = stored.versions, stored.ids
        reply.chosen, reply.compare = stored.chosen, stored.compare
        if len(conv.messages) > 1 and conv.messages[-2].role == "user":
            conv.messages[-2].ids = dict(fresh.messages[-2].ids)
            conv.messages[-2].edits = fresh.messages[-2].edits  # an edit adds a version

    def set_speedup(self, reply_id: int, speedup: SpeedUp | None) -> None:
        """Store a finished drafting reply's speed-up against plain (None: no comparable
        plain speed was known), as the reply's footer shows it; a reloaded reply reads it
        back (:meth:`ReplyResult.from_row`)."""
        self.db.update_generation(reply_id, {
            SPEEDUP_KEY: speedup.to_dict() if speedup is not None else None})

    def rename(self, conv_id: int, title: str) -> None:
        """Set a conversation's title (raises ValueError when empty)."""
        self.db.rename(conv_id, title)

    def export(self, conv_id: int, path: Path, pending=None) -> Path:
        """Write the conversation to ``path`` (``.json``: JSON, else Markdown).

        ``pending``: an ``app.chat.stored_turn.PendingWrites`` whose writes the database
        could not take yet (a full disk); when it holds some of this conversation, they are
        made in an in-memory copy of the database (``Store.memory_copy``) and the export is
        written from it, so it holds what the window shows. The file is not changed.

        Raises:
            app.chat.storage.StorageError, OSError: nothing was exported.
        """
        from app.chat.export import write_export

        if pending is None or conv_id not in pending.conversations():
            return write_export(self.db, conv_id, Path(path))
        copy = self.db.memory_copy()
        try:
            pending.apply_to(copy, conv_id)
            return write_export(copy, conv_id, Path(path))
        finally:
            copy.close()

    def import_file(self, path: Path) -> ConversationView | None:
        """Import a JSON export as a new conversation and return it (None when it cannot be
        read back: a damaged database, :attr:`on_read_error` told).

        Raises ``app.chat.export.ImportFormatError`` or OSError."""
        from app.chat.export import import_json

        c = import_json(self.db, Path(path))
        return self.get(c.id)

    def search(self, text: str) -> list[int]:
        """Ids of conversations whose messages or title contain ``text`` (first hit first);
        empty when the database cannot be read (:attr:`on_read_error` is told)."""
        ids: list[int] = []
        try:
            hits = self.db.search(text)
        except StoreReadError as exc:
            self._read_failed(exc)
            return []
        for hit in hits:
            if hit.conversation_id not in ids:
                ids.append(hit.conversation_id)
        return ids

    def delete(self, conv_id: int) -> None:
        """Delete a conversation and its messages (no error when it is gone already)."""
        try:
            self.db.delete_conversation(conv_id)
        except ConversationNotFoundError:
            pass

    def close(self) -> None:
        """Flush held-back writes and close the database."""
        self.db.close()


def open_store(data_dir: Path) -> ViewStore:
    """The store in ``data_dir`` (``conversations.db``); when the file cannot be used
    (damaged, read-only, locked, newer, not ours) an in-memory one whose
    :attr:`ViewStore.problem` says why (logged too; the window shows it). The file is left as
    it is; when every row in it can still be read (a read-only file, a damaged index) the
    in-memory store starts as a copy of it (:func:`~app.chat.storage.readable_copy`), so the
    saved chats are shown, and the problem says so."""
    path = Path(data_dir) / DB_FILENAME
    try:
        return ViewStore(path)
    except StorageError as exc:
        log.error("conversation database unusable, keeping chats in memory: %s", exc)
        problem = str(exc)
    copy = None
    if path.exists():
        try:
            copy = readable_copy(path)
        except StorageError as exc:
            log.info("its chats cannot be shown either: %s", exc)
    store = ViewStore(db=copy) if copy is not None else ViewStore(":memory:")
    count = len(store.db.list_conversations()) if copy is not None else 0
    if count:
        problem += (f". The {count} saved chat{'s' if count != 1 else ''} it holds "
                    f"{'are' if count != 1 else 'is'} shown from a copy in memory; what you add "
                    "or change is not saved")
    store.problem = problem
    return store

"""One turn stored as it is generated: the rows, the prompt read back from them, the reply (or
the sides of a Compare turn), its growth and its final state.

:func:`run_turn` is the one place a reply is written to the
:class:`~app.chat.storage.Store`. It runs on the thread that owns MLX (the window's worker,
``app.ui.worker``, or the caller of :meth:`app.chat.session.ChatSession.send`), so the GUI
thread never writes a reply; the window only reads the store back when :class:`TurnStored`
arrives. Qt-free. Its events are defined in :mod:`app.chat.events`, the one event namespace
(and re-exported here).

A turn, asked for by a :class:`TurnRequest`:

1. in one transaction: the user message (new, or an edited sibling of a stored one) and the
   reply rows (``generating``: one reply, a sibling version of a stored reply, or the rows
   of a Compare turn: plain, DFlash and, when asked, DFlash2); :class:`TurnBegun` gives
   their ids. When this fails nothing is stored and nothing runs (:class:`TurnNotStarted`):
   the conversation stays as it was (:class:`TurnNotStored` when the store could not write:
   a full disk, an I/O error, the database locked). So too when the prompt read back
   (step 2) does not fit the model's context (``backend.check_prompt``,
   :class:`TurnRefused`): the rows are rolled back, and a refused message never becomes an
   earlier turn of the next prompt;
2. the prompt from the stored rows (:func:`prompt_for`: earlier turns' tool calls, tool
   results and reasoning as they were generated);
3. each side's reply (``backend.reply``), its events passed on as :class:`TaggedEvent`, its
   growth saved through the store's throttle (``Store.update_partial``; the first write that
   fails is said at once, :class:`SaveFailed`, and the reply goes on); a failure (raised,
   or an engine run that ended in an error, e.g. a drafter that raised mid-reply) becomes
   :class:`ReplyFailed` and the side keeps what it had, in the mode it ran in, stored
   ``error``; each side ends with
   :class:`ReplyFinished`;
4. every row's final state, in one transaction (``complete``, ``stopped``, ``interrupted`` or ``error``, tool
   rounds included; a Compare's drafting side keeps its top-two gap at the first divergence,
   ``app.chat.turns.TOP2_GAP_KEY``; a reply Max tokens ended keeps what Continue needs,
   ``app.chat.turns.RESUME_KEY``; a reply whose prompt left earlier turns out or shortened
   their tool results keeps the ``Notice`` that said so, ``app.chat.turns.CONTEXT_KEY``),
   the version the conversation continues from, then
   :class:`TurnStored`. When the store cannot write it (a full disk, ...), the write is
   kept in :class:`TurnStored` as a :class:`PendingWrite`, which the window tries again
   (:class:`PendingWrites`) until the store takes it.

A request to continue a stored reply that Max tokens ended (``TurnRequest.continue_of``,
the window's Continue) stores no new row: it checks that the reply can be resumed (not a
Compare side, made by the loaded models: :class:`CannotContinueError`, sent as
:class:`TurnRefused`), runs the backend's reply with an ``app.chat.events.ResumeRound`` (the
cut round's prompt ids and tokens), and writes the whole reply into the same row when it ends
(its figures over both runs, ``app.chat.conversation.CONTINUED_KEY`` naming the continuation). Its
growth is not saved as it streams, and a continuation that fails leaves the row as it was.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.chat.conversation import CONTINUED_KEY
from app.chat.events import (  # noqa: F401 (re-exported: a stored turn's events)
    Notice,
    ReplyDone,
    ReplyFailed,
    ReplyFinished,
    ResumeRound,
    SaveFailed,
    TaggedEvent,
    TurnBegun,
    TurnNotStarted,
    TurnNotStored,
    TurnRefused,
    TurnStored,
)
from app.chat.settings import ReplySettings, as_reply_settings
from app.chat.storage import Store, StoreWriteError
from app.chat.turns import (
    CONTEXT_KEY,
    RESUME_KEY,
    TOP2_GAP_KEY,
    PartialReply,
    ReplyResult,
)
from app.engine import modes
from app.engine.errors import EngineError, PromptTooLongError
from app.engine.lookup import DEFAULT_BLOCK
from app.engine.modes import DRAFTER_MODES, DRAFTING_MODES, Mode

log = logging.getLogger(__name__)

GENERATION_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
                   "enable_thinking")
"""Reply settings stored with each reply row (``Message.generation``)."""


def generation_record(settings: ReplySettings) -> dict:
    """The :data:`GENERATION_KEYS` record a reply row keeps of ``settings``: ``max_tokens``
    (int), the sampling's ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed`` (None:
    not seeded) and ``enable_thinking`` (None: the template's default)."""
    sampling = settings.sampling
    return {"max_tokens": settings.max_tokens, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "top_k": sampling.top_k, "min_p": sampling.min_p,
            "seed": sampling.seed, "enable_thinking": settings.enable_thinking}


@dataclass(frozen=True)
class TurnRequest:
    """What one send, Compare, regenerate or edit asks for.

    Attributes:
        conversation_id: the stored conversation.
        text: the user message (new, or the edited text with ``edit_of``); ignored with
            ``regenerate_of``.
        settings: the reply's :class:`~app.chat.settings.ReplySettings` (a values dict
            is accepted and converted with ``app.chat.settings.reply_settings``; the typed
            record is the way). A Compare side runs ``dataclasses.replace(settings,
            mode=tag)``; the record itself is never changed.
        tags: ``("",)`` for one reply; for a Compare turn the modes of its sides, plain and
            DFlash, and DFlash2 too with a DFlash2 drafter (plain and DFlash2 when that is
            the pair's one drafter; ``app.engine.modes.MODES``).
        key: the version key of one reply ("" -> its mode; ``app.chat.turns.version_key``).
        system_prompt: put first in the prompt when the conversation has none of its own.
        regenerate_of: a stored reply row: the new reply is a sibling version of it.
        edit_of: a stored user row: ``text`` is stored as its edited sibling first.
        continue_of: a stored reply row that Max tokens ended: it is continued where it
            stopped, in the mode it was made in (``settings`` give the rest: Max tokens is
            how many tokens more), and the same row grows; ``text`` and ``tags`` are ignored.
    """

    conversation_id: int
    text: str = ""
    settings: ReplySettings = field(default_factory=ReplySettings)
    tags: tuple[str, ...] = ("",)
    key: str = ""
    system_prompt: str = ""
    regenerate_of: int | None = None
    edit_of: int | None = None
    continue_of: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", as_reply_settings(self.settings))

    @property
    def compare(self) -> bool:
        """True for a Compare turn."""
        return tuple(self.tags) != ("",) and self.continue_of is None

    @property
    def keys(self) -> list[str]:
        """The version key of each side, in ``tags`` order."""
        return [t or self.key or self.settings.mode for t in self.tags]


class CannotContinueError(Exception):
    """A stored reply cannot be continued where Max tokens cut it; the message says why and
    what to do instead (a Compare side, a reply that did not end by Max tokens, one stored
    without what Continue needs, or one made by models that are not loaded now)."""


@dataclass(frozen=True)
class PendingWrite:
    """A write of a turn's final state that the store could not take, kept to be tried
    again when it can (the disk has room again, the lock is free).

    ``write(store)`` redoes it whole, in one transaction: every reply row's final state (text,
    tokens, figures, status) and the version the conversation continues from. Writing it
    twice stores the same thing, so a retry never damages what is stored. ``what`` names it
    for the user; ``conversation_id`` is the conversation it belongs to."""

    conversation_id: int
    what: str
    write: Callable[[Store], None]


class PendingWrites:
    """The writes the store could not take (:class:`PendingWrite`), in the order they failed,
    tried again in that order (:meth:`retry`). Thread-safe."""

    def __init__(self) -> None:
        self._items: list[PendingWrite] = []
        self._lock = threading.Lock()

    def add(self, write: PendingWrite) -> None:
        """Keep ``write`` to be tried again (after those kept before it)."""
        with self._lock:
            self._items.append(write)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def conversations(self) -> set[int]:
        """The conversations with a write still to be made."""
        with self._lock:
            return {w.conversation_id for w in self._items}

    def retry(self, store: Store) -> StoreWriteError | None:
        """Try the kept writes again, oldest first, each in its own transaction; a write that
        succeeds is dropped. Stops at the first that still fails (it and the later ones are
        kept, in order) and returns its error; None when none is left. A write that fails
        otherwise (its conversation was deleted meanwhile, a bug) is dropped and logged: trying
        it again would not help."""
        while True:
            with self._lock:
                if not self._items:
                    return None
                w = self._items[0]
            try:
                with store.transaction():
                    w.write(store)
            except StoreWriteError as exc:
                log.info("retrying %s: %s", w.what, exc)
                return exc
            except Exception:
                log.exception("retrying %s; dropped", w.what)
            with self._lock:
                if self._items and self._items[0] is w:
                    self._items.pop(0)

    def apply_to(self, store: Store, conversation_id: int) -> None:
        """Make the kept writes of ``conversation_id`` in ``store`` (an in-memory copy of the
        database, to export what is shown), keeping them for the real one.

        Raises:
            app.chat.storage.StorageError: a write failed there too.
        """
        with self._lock:
            items = [w for w in self._items if w.conversation_id == conversation_id]
        for w in items:
            with store.transaction():
                w.write(store)


def prompt_for(store: Store, reply_id: int, system_prompt: str = "") -> list[dict]:
    """The chat-template messages the stored reply ``reply_id`` answers.

    ``Store.prompt_for_reply`` (every earlier turn with its tool calls, tool results and
    reasoning, see ``Message.to_prompt_dicts``), with ``system_prompt`` first when it is not
    blank and the conversation holds no system message of its own.

    Raises:
        app.chat.storage.MessageNotFoundError: no such reply.
    """
    messages = store.prompt_for_reply(reply_id)
    if system_prompt.strip() and not (messages and messages[0].get("role") == "system"):
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


def prompt_for_next(store: Store, conversation_id: int, system_prompt: str = "") -> list[dict]:
    """The chat-template messages the next turn of ``conversation_id`` continues: the
    messages the conversation shows now (``Store.active_path``, as ``prompt_for`` reads a
    reply's), with ``system_prompt`` first as :func:`prompt_for` puts it.

    Raises:
        app.chat.storage.ConversationNotFoundError: no such conversation.
    """
    path, _ = store.path_outline(conversation_id)  # links first, rows in one read
    messages = store.prompt_for_path(store.messages_by_id([mid for mid, _ in path]))
    if system_prompt.strip() and not (messages and messages[0].get("role") == "system"):
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


def begin_turn(store: Store, request: TurnRequest,
               drafter_blocks: dict[str, int] | None = None) -> TurnBegun:
    """Store the user message and the reply rows of ``request`` in one transaction (all or
    nothing; see the module doc). ``drafter_blocks``: the loaded drafters' block sizes by mode
    (``"dflash"``, ``"dflash2"``), stored as a drafting row's block size when the settings
    leave it to the drafter, so a reloaded reply still says which block it ran.

    Raises:
        app.chat.storage.StorageError, ValueError: nothing was stored.
    """
    s = request.settings
    mode = s.mode
    block, rollback = s.block_size, s.rollback
    blocks = drafter_blocks or {}
    generation = generation_record(s)
    keys = request.keys
    with store.transaction():
        user_id = None
        if request.edit_of is not None:
            user_id = store.edit_user_message(request.edit_of, request.text).id
        elif request.regenerate_of is None:
            user_id = store.add_message(request.conversation_id, "user", request.text).id
        if request.compare:
            side = request.tags[1]  # "dflash", or "dflash2" for a pair with only that drafter
            plain, drafting = store.begin_compare(request.conversation_id, mode=side,
                                                  block_size=block or blocks.get(side),
                                                  rollback=rollback, generation=generation,
                                                  continue_with=side)
            ids = {"plain": plain.id, side: drafting.id}
            if "dflash2" in request.tags[2:]:  # a three-sided Compare: the DFlash2 sibling
                third = store.begin_reply(
                    request.conversation_id, mode="dflash2", parent_id=plain.parent_id,
                    block_size=block or blocks.get("dflash2"), rollback=rollback,
                    generation=generation,
                    compare_group=plain.compare_group, activate=False)
                ids["dflash2"] = third.id
        else:
            kwargs = {"block_size": (block or blocks.get(mode)) if mode in DRAFTING_MODES
                      else None,
                      "rollback": rollback if mode in DRAFTING_MODES else None,
                      "generation": generation}
            if request.regenerate_of is not None:
                row = store.regenerate(request.regenerate_of, mode=mode, **kwargs)
            else:
                row = store.begin_reply(request.conversation_id, mode=mode, **kwargs)
            ids = {keys[0]: row.id}
    return TurnBegun(request.conversation_id, user_id, ids)


def finish_row(store: Store, row_id: int, result: ReplyResult, status: str,
               error: str | None = None) -> None:
    """Write a reply row's final state from its :class:`ReplyResult`: text, every round's
    tool calls with their results, tokens, the reply's figures, and its chat-template
    ``messages`` as the row's ``rounds`` when it ran more than one round."""
    r = result
    store.finish_reply(
        row_id, status=status, content=r.content, reasoning=r.reasoning,
        tool_calls=[{k: c.get(k) for k in ("id", "name", "arguments", "result", "error",
                                            "duration_s")} for c in r.tool_calls],
        token_ids=list(r.tokens), from_draft=list(r.from_draft),
        summary=_summary_dict(r),
        finish_reason=r.finish_reason, error=error,
        rounds=r.messages if r.rounds > 1 else None)


def _summary_dict(r: ReplyResult) -> dict | None:
    """The stored ``summary`` of a reply: the reply total's fields, plus ``round_summaries``
    (each round's, same fields) when it ran more than one round, so that a reopened tool reply
    keeps the window's round picker."""
    if r.summary is None:
        return None
    d = r.summary.to_dict()
    if len(r.round_summaries) > 1:
        d["round_summaries"] = [s.to_dict() for s in r.round_summaries]
    return d


def run_turn(store: Store, backend: Any, request: TurnRequest,
             cancel: threading.Event | None = None,
             interrupted: threading.Event | None = None) -> Iterator[TaggedEvent]:
    """Store and generate one turn (see the module doc); yields its events.

    ``backend`` has ``reply(messages, settings, cancel)`` (a
    :class:`~app.chat.session.ChatSession` or ``app.chat.scripted.ScriptedSession``), and
    optionally ``pieces(tokens)`` and ``top2_gap(plain, dflash)``. ``cancel`` stops the reply
    (a Compare turn's later side does not start then); with ``interrupted`` set too (the app
    quits) the replies are stored ``interrupted`` rather than ``stopped``.
    """
    return _TurnRun(store, backend, request, cancel or threading.Event(),
                 interrupted or threading.Event()).run()


class _TurnRun:
    """One :func:`run_turn` call while it runs: the request, the backend, the cancel flags
    and each side's stored result and error."""

    def __init__(self, store: Store, backend: Any, request: TurnRequest,
                 cancel: threading.Event, interrupted: threading.Event) -> None:
        self.store, self.backend, self.request = store, backend, request
        self.cancel, self.interrupted = cancel, interrupted
        pieces = getattr(backend, "pieces", None)
        self.pieces: Callable[[list[int]], list[str]] = pieces or (lambda tokens: [])
        self.results: dict[str, ReplyResult] = {}  # tag -> the stored copy of its result
        self.errors: dict[str, str] = {}
        self.replies: dict[str, Any] = {}  # tag -> app.chat.events.Reply (top-two gap)
        self.ran: list[str] = []  # the sides that ran, in order
        self.resume_records: dict[str, dict | None] = {}  # tag -> RESUME_KEY's value
        self.save_failed = False  # a growth write failed (SaveFailed was sent)

    def _drafter_blocks(self) -> dict[str, int]:
        """The backend's drafters' block sizes by mode (none for a backend without drafters,
        e.g. the scripted session)."""
        drafter_for = getattr(self.backend, "drafter_for", None)
        out = {}
        for mode in DRAFTER_MODES:
            d = drafter_for(mode) if drafter_for is not None else None
            if d is not None:
                out[mode] = d.config.block_size
        out[Mode.LOOKUP.value] = DEFAULT_BLOCK
        return out

    def run(self) -> Iterator[TaggedEvent]:
        req = self.request
        if req.continue_of is not None:
            yield from self._run_continue()
            return
        check = getattr(self.backend, "check_prompt", None)  # scripted sessions have none
        try:
            with self.store.transaction():  # a refused prompt rolls the rows back
                begun = begin_turn(self.store, req, self._drafter_blocks())
                first = begun.reply_ids[req.keys[0]]
                messages = prompt_for(self.store, first, req.system_prompt)
                if check is not None:
                    check(messages, dataclasses.replace(
                        req.settings, mode=req.tags[0] or req.settings.mode))
        except PromptTooLongError as exc:
            yield TaggedEvent(TurnRefused(str(exc)))
            return
        except StoreWriteError as exc:
            log.error("saving the new turn: %s", exc)
            yield TaggedEvent(TurnNotStored(str(exc)))
            return
        except Exception as exc:
            log.exception("saving the new turn")
            yield TaggedEvent(TurnNotStarted(str(exc)))
            return
        yield TaggedEvent(begun)
        frozen = None
        if req.compare and req.settings.run_tools and req.settings.runnable_tools is None:
            # a Compare: both sides see the same tool results (one frozen clock)
            from app.chat.tools import builtin_tools

            frozen = builtin_tools(datetime.datetime.now(datetime.UTC))
        # A Compare's later sides reuse no more of the kept cache than its first side did
        # (PromptCache.cap_next_reuse): the same prefill, so their first tokens compare fairly.
        cap = getattr(self.backend, "cap_next_reuse", None) if req.compare else None
        first_reuse: int | None = None
        for tag, key in zip(req.tags, req.keys, strict=True):
            settings = req.settings  # each side a new record, the request's unchanged
            if tag:
                settings = dataclasses.replace(settings, mode=tag)
            if frozen is not None:
                settings = dataclasses.replace(settings, runnable_tools=frozen)
            if cap is not None and first_reuse is not None:
                cap(first_reuse)
            yield from self._side(tag, begun.reply_ids[key], messages, settings)
            if cap is not None:
                cap(None)  # a side that failed before its prefill leaves no cap behind
                done = self.replies.get(tag)
                first = next((r.summary for r in done.rounds if r.summary is not None),
                             None) if done is not None else None
                if first_reuse is None and first is not None:
                    first_reuse = first.reused_tokens  # its first round's: later rounds follow
            if self.cancel.is_set():
                break
        yield TaggedEvent(self._store_final(begun))

    def _side(self, tag: str, row_id: int, messages: list[dict], settings: ReplySettings,
              resume: ResumeRound | None = None,
              before: ReplyResult | None = None) -> Iterator[TaggedEvent]:
        """One reply: its events, its growth saved, then :class:`ReplyFinished`. With
        ``resume`` it continues ``before``, the stored reply Max tokens cut: its growth is not
        saved, the result is the whole reply (:meth:`ReplyResult.continued_by`), and on a
        failure the result is ``before`` as it was."""
        partial = PartialReply()
        result: ReplyResult | None = None
        error: str | None = None
        notice: Notice | None = None  # what the prompt left out to fit (stored with the row)
        last_save = 0.0
        extra = {"resume": resume} if resume is not None else {}
        try:
            for ev in self.backend.reply(messages, settings, self.cancel, **extra):
                at = time.monotonic()
                if isinstance(ev, ReplyDone):
                    result = ReplyResult.from_reply(ev.reply, settings, self.pieces)
                    self.replies[tag] = ev.reply
                elif isinstance(ev, Notice):
                    notice = ev
                else:
                    partial.add(ev)
                    if resume is None and at - last_save >= self.store.partial_interval_s:
                        last_save = at
                        failed = self._save_growth(row_id, partial)
                        if failed is not None and not self.save_failed:
                            self.save_failed = True  # said once a turn, at once
                            yield TaggedEvent(SaveFailed(failed), tag)
                yield TaggedEvent(ev, tag, at)
        except EngineError as exc:
            error = str(exc)
        except Exception as exc:
            log.exception("generation failed")
            error = f"Generation failed: {type(exc).__name__}: {exc}"
        if error is None and result is not None and result.finish_reason == "error":
            # the engine failed mid-run (its Done says so, e.g. a drafter that raised): the
            # reply failed, and keeps what it wrote (a continuation keeps nothing)
            cause = (result.summary.error if result.summary is not None
                     and result.summary.error else result.note or "the engine failed")
            error = cause if before is not None else f"Generation failed: {cause}"
        if error is not None:
            self.errors[tag] = error
            if before is not None:
                error = (f"Could not continue the reply: {error.rstrip('.')}. The reply is "
                         "kept as it was.")
            yield TaggedEvent(ReplyFailed(error), tag)
        if result is None:  # no ReplyDone (an error, or a scripted backend): build it here
            result = partial.result(settings, self.pieces, failed=error is not None,
                                    cancelled=self.cancel.is_set())
        if not result.tool_calls and partial.calls:
            result.tool_calls = list(partial.calls.values())
        if notice is not None:
            result.context_note = notice
        if before is not None:
            result = (dataclasses.replace(before) if error is not None else
                      before.continued_by(result, settings.max_tokens))
        if error is None and not self.request.compare:
            record = self._resume_record(tag, result, settings.mode)
            self.resume_records[tag] = record
            result.resumable = record is not None
        self._top2_gap(tag, result)
        self.results[tag] = dataclasses.replace(result)  # the GUI may annotate the one sent
        self.ran.append(tag)
        yield TaggedEvent(ReplyFinished(result), tag)

    def _resume_record(self, tag: str, result: ReplyResult, mode: str | None) -> dict | None:
        """What Continue needs to resume a reply Max tokens ended (:data:`RESUME_KEY`): its
        last round's prompt ids and thinking state and the models that made it; None for a
        reply that ended otherwise, or a backend that gives neither (a scripted session)."""
        reply = self.replies.get(tag)
        made_by = getattr(self.backend, "made_by", None)
        if result.finish_reason != "length" or reply is None or not reply.rounds or \
                made_by is None:
            return None
        made = made_by(mode)
        if made is None:
            return None
        last = reply.rounds[-1]
        return {"prompt_ids": [int(t) for t in last.prompt_ids],
                "starts_in_reasoning": bool(last.starts_in_reasoning), **made}

    # ------------------------------------------------------------------ Continue
    def _resume_point(self) -> tuple[Any, list[dict], ResumeRound, ReplyResult]:
        """The stored reply to continue, the messages it answers (its earlier rounds
        included), its :class:`ResumeRound` and its :class:`ReplyResult` as stored.

        Raises:
            CannotContinueError: it cannot be continued (the message says why).
            PromptTooLongError: its prompt and tokens already fill the context.
            app.chat.storage.StorageError: it cannot be read.
        """
        req = self.request
        row = self.store.get_message(req.continue_of)
        if row.role != "assistant":
            raise CannotContinueError("Only a reply can be continued.")
        if row.compare_group:
            raise CannotContinueError(
                "A Compare turn cannot be continued: its sides are compared as they ran. "
                "Raise Max tokens in File › Settings and send the prompt again.")
        if row.status != "complete" or row.finish_reason != "length":
            raise CannotContinueError(
                "Only a reply that Max tokens ended can be continued; this one "
                + ("was stopped." if row.status in ("stopped", "interrupted") else
                   "failed." if row.status == "error" else
                   "is still being written." if row.status == "generating" else
                   "ended by itself."))
        record = (row.generation or {}).get(RESUME_KEY)
        if not isinstance(record, dict) or not record.get("prompt_ids") or not row.token_ids:
            raise CannotContinueError(
                "This reply was stored without the token ids Continue resumes from (by an "
                "earlier version of the app): regenerate it with a higher Max tokens instead.")
        mode = row.mode or "plain"
        made_by = getattr(self.backend, "made_by", None)
        made = made_by(mode) if made_by is not None else None
        name = modes.label(mode)
        if made is None:
            raise CannotContinueError(
                "This backend cannot continue a reply." if made_by is None else
                f"This reply was made in {name}, and no model that runs {name} is loaded: "
                "load the pair that made it to continue it. The reply is kept as it is.")
        drafting = mode in DRAFTING_MODES
        if made["target"] != record.get("target") or \
                (drafting and made["drafter"] != record.get("drafter")):
            who = Path(str(record.get("target") or "?")).name
            if drafting and record.get("drafter"):
                who += f" with the drafter {Path(str(record['drafter'])).name}"
            raise CannotContinueError(
                f"This reply was made by {who}, which is not the pair loaded now: load it "
                "again to continue the reply (token ids belong to the model that wrote "
                "them). The reply is kept as it is.")
        before = ReplyResult.from_row(row)
        messages = prompt_for(self.store, row.id, req.system_prompt) + \
            [dict(m) for m in row.rounds[:-1]]
        resume = ResumeRound(
            prompt_ids=[int(t) for t in record["prompt_ids"]],
            tokens=list(row.token_ids), from_draft=list(row.from_draft),
            starts_in_reasoning=bool(record.get("starts_in_reasoning")),
            index=max(0, before.rounds - 1), first_call_index=len(row.tool_calls or []))
        check = getattr(self.backend, "check_resume", None)
        if check is not None:
            check(resume)
        return row, messages, resume, before

    def _run_continue(self) -> Iterator[TaggedEvent]:
        """Continue a stored reply Max tokens ended (see the module doc)."""
        req = self.request
        try:
            row, messages, resume, before = self._resume_point()
        except (CannotContinueError, PromptTooLongError) as exc:
            yield TaggedEvent(TurnRefused(str(exc)))
            return
        except Exception as exc:
            log.exception("reading the reply to continue")
            yield TaggedEvent(TurnNotStarted(str(exc)))
            return
        mode = row.mode or "plain"
        key = req.key or mode
        begun = TurnBegun(row.conversation_id, None, {key: row.id})
        yield TaggedEvent(begun)
        settings = dataclasses.replace(req.settings, mode=mode)
        yield from self._side("", row.id, messages, settings, resume, before)
        yield TaggedEvent(self._store_continued(begun, key))

    def _store_continued(self, begun: TurnBegun, key: str) -> TurnStored:
        """The continued reply's final state in its own row (nothing when it failed: the row
        stays as it was), under the same rules as a reply's (:meth:`_store_final`)."""
        row_id = begun.reply_ids[key]
        result = self.results.get("")
        if result is None or "" in self.errors:
            return TurnStored(begun.conversation_id, begun.reply_ids, key)
        status = "complete"
        if result.finish_reason == "cancelled":
            status = "interrupted" if self.interrupted.is_set() else "stopped"
        result = dataclasses.replace(result)
        generation = {RESUME_KEY: self.resume_records.get(""),
                      CONTINUED_KEY: list(result.continued)}

        def write(store: Store) -> None:
            finish_row(store, row_id, result, status)
            store.update_generation(row_id, generation)

        return self._final(begun, key, write, "the continued reply")

    def _save_growth(self, row_id: int, partial: PartialReply) -> str | None:
        """Save the reply's growth; what failed, for the user, or None when it was saved
        (or held back by the store's throttle). The reply keeps streaming either way and
        the final save tries again."""
        try:
            self.store.update_partial(row_id, content="".join(partial.content),
                                      reasoning="".join(partial.reasoning),
                                      token_ids=list(partial.tokens),
                                      from_draft=list(partial.flags))
        except StoreWriteError as exc:
            log.error("saving a partial reply: %s", exc)
            return str(exc)
        except Exception as exc:
            log.exception("saving a partial reply")
            return f"could not save the reply as it was written: {exc}"
        return None

    def _top2_gap(self, tag: str, result: ReplyResult) -> None:
        """In a Compare, a drafting side's top-two gap where it first differs from plain."""
        plain = self.replies.get("plain")
        gap_of = getattr(self.backend, "top2_gap", None)  # scripted sessions have none
        if tag not in DRAFTING_MODES or plain is None or tag not in self.replies or \
                gap_of is None or result.tokens == plain.all_tokens:
            return
        try:
            result.top2_gap = gap_of(plain, self.replies[tag])
        except Exception:  # a figure for the header; never fails the reply
            log.exception("top-two gap")

    def _store_final(self, begun: TurnBegun) -> TurnStored:
        """Every row's final state and the version the conversation continues from, in one
        transaction; when the store cannot write, the write is kept in the event
        (:attr:`TurnStored.pending`) to be tried again."""
        req = self.request
        interrupted = self.interrupted.is_set()
        rows = []
        for tag, key in zip(req.tags, req.keys, strict=True):
            # a Compare side stopped before it ran: empty, stopped
            result = self.results.get(tag) or ReplyResult(mode=tag, finish_reason="cancelled")
            error = self.errors.get(tag)
            # a side is stopped when the cancel cut it (its finish reason says so) or came
            # before it ran; a Compare side that had finished when Stop was pressed is complete
            stopped = result.finish_reason == "cancelled" or tag not in self.ran
            status = ("error" if error else ("interrupted" if interrupted else "stopped")
                      if stopped else "complete")
            generation = {}
            if self.resume_records.get(tag) is not None:  # Max tokens ended it
                generation[RESUME_KEY] = self.resume_records[tag]
            if result.context_note is not None:  # its prompt left turns out: said again later
                generation[CONTEXT_KEY] = result.context_note.to_dict()
            if req.compare and tag in DRAFTING_MODES and tag in self.ran:
                # the header's figure at the first divergence, for a reopened Compare
                generation[TOP2_GAP_KEY] = result.top2_gap
            rows.append((begun.reply_ids[key], dataclasses.replace(result), status, error,
                         generation))
        if req.compare:
            ran = [t for t in req.tags if t in self.ran]
            # continue from the first drafter's side (DFlash's, or DFlash2's when it is the
            # only one) when it finished, else from a side that finished (a side Stop cut
            # is partial), else from the first that ran
            first = req.tags[1]
            whole = [t for t in ran if t not in self.errors
                     and self.results[t].finish_reason != "cancelled"]
            chosen = (first if first in whole else whole[0] if whole
                      else ran[0] if ran else first)
        else:
            chosen = req.keys[0]
        active = (begun.reply_ids[chosen]
                  if len(begun.reply_ids) > 1 or req.regenerate_of is not None else None)

        def write(store: Store) -> None:
            for row_id, result, status, error, generation in rows:
                finish_row(store, row_id, result, status, error)
                if generation:
                    store.update_generation(row_id, generation)
            if active is not None:
                store.set_active(active)

        return self._final(begun, chosen, write, "the reply" if len(rows) == 1 else
                           "the Compare turn")

    def _final(self, begun: TurnBegun, chosen: str, write: Callable[[Store], None],
               what: str) -> TurnStored:
        """Make a turn's final ``write`` in one transaction: :class:`TurnStored`, with the
        write kept (:class:`PendingWrite`) when the store could not take it."""
        try:
            with self.store.transaction():
                write(self.store)
        except StoreWriteError as exc:
            log.error("saving %s: %s", what, exc)
            return TurnStored(begun.conversation_id, begun.reply_ids, chosen, str(exc),
                              PendingWrite(begun.conversation_id, what, write))
        except Exception as exc:
            log.exception("saving %s", what)
            return TurnStored(begun.conversation_id, begun.reply_ids, chosen, str(exc))
        return TurnStored(begun.conversation_id, begun.reply_ids, chosen)

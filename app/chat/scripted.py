"""A stand-in for :class:`~app.chat.session.ChatSession` that needs no model: scripted replies
through the same typed events (tests, the README screenshot, the UI latency bench).

Each reply replays the next :class:`ScriptedTurn` (the last one repeats): its reasoning word by
word, an optional tool call and result, then DFlash-like cycles. Cycle ``c`` commits
``accept(c) + 1`` tokens; the turn's content is emitted in ``chunk_chars`` pieces, one per cycle
(the whole content in the first cycle when ``chunk_chars`` is None), and cycles after the
content carry filler words ``" w<n>"``. The reply ends after ``cycles`` cycles (None: when the
content is out), after ``seconds`` of streaming, or when ``cancel`` is set (checked before
every cycle, as the engine does). ``tokens_per_s`` paces the stream; ``delay_s`` sleeps after
each cycle. The final ``Done`` carries a :class:`~app.engine.events.Summary` whose counts are
those of the events (``Summary.add_cycle``) and whose timings are the made-up ``figures``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from app.chat.events import (
    ContentDelta,
    Notice,
    ReasoningDelta,
    ToolCall,
    ToolCallDelta,
    ToolResultEvent,
    ToolRun,
)
from app.chat.session import ModelInfo, PairSpec
from app.chat.settings import ReplySettings, as_reply_settings
from app.engine.errors import ModelLoadError
from app.engine.events import CycleEvent, Done, Summary, TokenEvent
from app.engine.modes import DRAFTER_MODES, DRAFTING_MODES


@dataclass(frozen=True)
class ScriptedTurn:
    """One scripted reply: ``reasoning`` (split into words), ``content`` (Markdown), an
    optional tool call (``tool_call``: ``(name, arguments, result)``, the call succeeding with
    ``result``) and an optional :class:`~app.chat.events.Notice` sent first (``notice``: the
    prompt was fitted to the context, as ``ChatSession.reply`` says it)."""

    reasoning: str
    content: str
    tool_call: tuple[str, dict, object] | None = None
    notice: Notice | None = None


DEFAULT_TURN = ScriptedTurn(
    "Paris is the capital. Say it plainly.",
    "The capital is **Paris**.\n\n```python\nprint('Paris')\n```\n",
)


@dataclass
class ScriptedSession:
    """Scripted replies with DFlash-like figures (see the module doc).

    Attributes:
        turns: the replies, in order (the last repeats).
        cycles: cycles per reply (None: as many as the content needs).
        block: the drafter's block size shown (drafts per cycle: ``block - 1``; each
            cycle's ``CycleEvent.block``). With ``ReplySettings.auto_block`` in a DFlash mode
            the cycles carry a scripted ``reason`` and the last one is a plain step (block 1),
            and the summary says ``auto_block``.
        accept: accepted drafts in cycle ``c`` (default ``c % block``), 0..block-1.
        chunk_chars: characters of content per cycle (None: all in the first cycle).
        delay_s: seconds slept after each cycle; tokens_per_s: pace of the stream (None: as
            fast as it goes); seconds: stop streaming after this long (None: no limit).
        fail_load: a target path whose load fails with ``ModelLoadError``.
        figures: made-up Summary timings (``ttft_s``, ``tok_per_s``, ``rollback_share``,
            ``prompt_tokens``).
        info: ModelInfo fields for :meth:`load` (names, context length, memory).
        piece: the text shown for a token id (``pieces``); filler: the content of token ``n``
            after the scripted content is out (default ``" w<n>"``).
        reasoning_delay_s: seconds slept after each reasoning word.

    After a reply: ``summary`` (its Summary), ``emitted_cycles`` (over all replies),
    ``last_settings`` / ``last_messages`` (what it was asked), ``threads`` (thread idents of
    every load and reply).
    """

    turns: list[ScriptedTurn] = field(default_factory=lambda: [DEFAULT_TURN])
    cycles: int | None = 6
    block: int = 4
    accept: Callable[[int], int] | None = None
    chunk_chars: int | None = None
    delay_s: float = 0.0
    tokens_per_s: float | None = None
    seconds: float | None = None
    fail_load: str | None = None
    figures: dict = field(default_factory=lambda: {
        "prompt_tokens": 42, "ttft_s": 0.0123, "tok_per_s": 321.5, "rollback_share": 0.0625})
    info: dict = field(default_factory=lambda: {
        "target_name": "scripted", "drafter_name": "scripted-d", "context_length": 2048,
        "memory_bytes": 0})
    memory: int = 123 * 2**20
    piece: Callable[[int], str] = lambda t: f"t{t} "
    filler: Callable[[int], str] = lambda i: f" w{i}"
    reasoning_delay_s: float = 0.0

    def __post_init__(self) -> None:
        self.turn = 0
        self.auto_now = False  # this reply runs the automatic block size (reply())
        self.emitted_cycles = 0
        self.summary: Summary | None = None
        self.threads: list[int] = []
        self.last_settings: ReplySettings | None = None
        self.last_messages: list[dict] = []

    # ---- ChatSession's interface
    def load(self, spec: PairSpec) -> ModelInfo:
        """A made-up pair description (``ModelLoadError`` for ``fail_load``)."""
        self.threads.append(threading.get_ident())
        if self.fail_load and spec.target == self.fail_load:
            raise ModelLoadError(f"could not load {spec.target}: config.json is missing")
        return ModelInfo(target_path=spec.target, drafter_path=spec.drafter or "d",
                         drafter_block_size=self.block, spec=spec, **self.info)

    def unload(self) -> None:
        """Nothing to drop."""

    def memory_bytes(self) -> int:
        """The made-up memory figure (bytes)."""
        return self.memory

    def pieces(self, tokens: list[int]) -> list[str]:
        """Token texts (``piece`` of each id)."""
        return [self.piece(t) for t in tokens]

    def reply(self, messages: list[dict], settings: ReplySettings | dict,
              cancel: threading.Event | None = None, *, fit: bool = True) -> Iterator:
        """The next scripted turn's events (engine and reply event types), in ``settings``'
        mode (a :class:`~app.chat.settings.ReplySettings`; a values dict is converted as
        ``ChatSession.reply`` converts it). ``fit`` is taken as ``ChatSession.reply`` takes
        it; scripted turns fit nothing either way.

        Raises:
            SettingError: a settings dict with an unknown key or a bad value.
        """
        self.threads.append(threading.get_ident())
        rs = as_reply_settings(settings)
        self.last_settings, self.last_messages = rs, list(messages)
        turn = self.turns[min(self.turn, len(self.turns) - 1)]
        self.turn += 1
        # the automatic block size: read by _events (subclasses override it, 3 arguments)
        self.auto_now = rs.auto_block and rs.mode in DRAFTER_MODES
        events = self._events(turn, rs.mode, cancel or threading.Event())
        if turn.notice is not None:
            return itertools.chain([turn.notice], events)
        return events

    # ---- the stream
    def _events(self, turn: ScriptedTurn, mode: str, cancel: threading.Event) -> Iterator:
        auto = self.auto_now
        for i, word in enumerate(turn.reasoning.split(" ") if turn.reasoning else []):
            yield ReasoningDelta(word if i == 0 else " " + word)
            if self.reasoning_delay_s:
                time.sleep(self.reasoning_delay_s)
        if turn.tool_call is not None:
            from app.chat.tools import ToolResult

            name, arguments, result = turn.tool_call
            call = ToolCall("call_0", name, dict(arguments))
            yield ToolCallDelta(call)
            yield ToolResultEvent(0, ToolRun(call, ToolResult(ok=True, result=result,
                                                              duration_s=0.004)))
        content = turn.content
        step = self.chunk_chars or max(1, len(content))
        chunks = [content[i:i + step] for i in range(0, len(content), step)]
        n_cycles = self.cycles if self.cycles is not None else max(1, len(chunks))
        accept = self.accept or (lambda c: c % self.block)
        s = Summary(mode="dflash")
        idx, stopped, start = 0, False, time.perf_counter()
        for c in range(n_cycles):
            if cancel.is_set():
                stopped = True
                break
            if self.seconds is not None and time.perf_counter() - start >= self.seconds:
                break
            acc = max(0, min(self.block - 1, accept(c)))
            # the automatic block size (auto): the last cycle is a plain step
            length = 1 if auto and c == n_cycles - 1 else self.block
            if length == 1:
                acc = 0
            text = chunks[c] if c < len(chunks) else None
            for k in range(acc + 1):
                yield TokenEvent(100 + idx, idx, k < acc)
                if text is None:
                    yield ContentDelta(self.filler(idx))
                idx += 1
            if text:
                yield ContentDelta(text)
            ev = CycleEvent(c, length - 1, acc, acc + 1, acc < length - 1,
                            0.001, 0.002, 0.0005 if acc < length - 1 else 0.0, block=length,
                            reason=(f"block {length}: scripted" if length > 1 else
                                    "block 1 (a plain step): scripted") if auto else "")
            s.add_cycle(ev)
            self.emitted_cycles += 1
            yield ev
            if self.tokens_per_s:
                ahead = idx / self.tokens_per_s - (time.perf_counter() - start)
                if ahead > 0:
                    time.sleep(ahead)
            if self.delay_s:
                time.sleep(self.delay_s)
        s.set_rates(committed=idx)
        s.generated_tokens = idx
        s.stop_cause = "cancelled" if stopped else "end_token"
        s.auto_block = auto
        s.mode = mode if mode in DRAFTING_MODES else "plain"
        for key, value in self.figures.items():
            setattr(s, key, value)
        self.summary = s
        yield Done(s)

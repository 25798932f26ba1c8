"""The state of the reply being generated, typed (no dicts read through string keys).

A :class:`ReplyRun` is one request to the worker: an ordinary reply (one side, tag ""; a
reply continued after Max tokens is one too) or a Compare turn (sides "plain" and "dflash", and
"dflash2" with a DFlash2 drafter too, or "plain" and "dflash2" with only that drafter, run one
after the other). Each :class:`SideRun` collects what its events brought: live figures, text,
reasoning, tool calls, tokens, and at the end its :class:`~app.chat.turns.ReplyResult` or
error. Qt-free; the window owns one at a time (the worker stores the turn; the run only
remembers what to show).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.chat.events import TurnStored
from app.chat.settings import ReplySettings
from app.chat.turns import ConversationView, ReplyResult, Turn
from app.ui.panels import LiveStats


@dataclass
class SideRun:
    """One side of a request (``tag`` "" for an ordinary reply).

    ``calls`` maps a call's id (or ``name#n``) to the tool pane's dict (id, name, arguments,
    result, error, duration_s); ``tokens``/``flags`` are the generated ids and, per id,
    whether the drafter proposed it.
    """

    tag: str
    stats: LiveStats
    text: str = ""
    reasoning: str = ""
    calls: dict[str, dict] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    flags: list[bool] = field(default_factory=list)
    result: ReplyResult | None = None
    error: str | None = None

    def merge_call(self, d: dict, is_result: bool) -> None:
        """Add or update a tool call from a ``ToolCallDelta`` / ``ToolResultEvent`` dict; a
        result without an id goes to the last call of the same name."""
        key = d.get("id") or f"{d.get('name')}#{len(self.calls)}"
        if is_result and not d.get("id"):
            for ck, cv in reversed(list(self.calls.items())):
                if cv.get("name") == d.get("name"):
                    key = ck
                    break
        self.calls.setdefault(key, {}).update({a: b for a, b in d.items() if b is not None})


@dataclass
class ReplyRun:
    """One request: which conversation and turn it fills, its settings and its sides.

    ``key`` is the version key of an ordinary reply (``"dflash"``, ``"plain#2"``, ...);
    ``current`` the tag of the side streaming now.
    """

    id: int
    conv: ConversationView
    msg: Turn
    tags: list[str]
    mode: str
    key: str
    settings: ReplySettings
    sides: dict[str, SideRun]
    current: str = ""
    interrupted: bool = False
    """Set when the app quits while this reply is written (stored as ``interrupted``)."""
    text: str = ""
    """The user message sent ("" for a regenerated reply): back to the composer when the
    turn cannot be stored."""
    system_prompt: str = ""
    """The system prompt the turn was sent with (for the next turn's prefill)."""
    previous: tuple = ((), "")
    """The view's turns and the regenerated reply's chosen key before the request (restored
    when the turn cannot be stored)."""
    stored: TurnStored | None = None
    """The worker's :class:`~app.chat.events.TurnStored` once every row is final."""
    not_started: str | None = None
    """Why the turn could not be stored (``TurnNotStarted``; nothing ran), else None."""
    not_stored: bool = False
    """The turn could not be stored because the store could not write (``TurnNotStored``:
    a full disk, ...): said in the storage banner."""
    save_failed: bool = False
    """A write of the reply's growth failed while it ran (``SaveFailed``, said at once)."""
    refused: bool = False
    """The turn was refused as too long for the context, or a reply that cannot be continued
    (``TurnRefused``; nothing stored)."""
    continued: ReplyResult | None = None
    """For Continue: the reply Max tokens cut, as it was before (what its first event, the
    worker's ``RoundResumed``, extends; shown again when the continuation cannot start)."""

    @classmethod
    def start(cls, req_id: int, conv: ConversationView, msg: Turn, tags: list[str], mode: str,
              key: str, settings: ReplySettings, context_limit: int) -> ReplyRun:
        """A run with one empty :class:`SideRun` per tag (``context_limit`` in tokens)."""
        sides = {t: SideRun(t, LiveStats(context_limit=context_limit)) for t in tags}
        return cls(req_id, conv, msg, tags, mode, key, settings, sides, current=tags[0])

    @property
    def compare(self) -> bool:
        """True for a Compare turn."""
        return self.tags != [""]

    def side(self, tag: str) -> SideRun:
        """The side ``tag`` (the first one for an unknown tag)."""
        return self.sides.get(tag) or self.sides[self.tags[0]]

    def version_key(self, tag: str) -> str:
        """The version key a side's result is stored under."""
        return tag or self.key

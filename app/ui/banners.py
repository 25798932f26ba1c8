"""The window's message banner as one queue with priorities (Qt-free; the window draws it).

Every message the window shows above the chat (``app.ui.messages.MessageBar.show_banner`` /
``show_note``) is a :class:`BannerEntry` in one :class:`BannerQueue`. The banner shows the
entry of the highest :class:`Priority`; the queue keeps at most one entry per priority, the
newest, so:

* a message never replaces one of a higher priority: it waits behind it (an error outranks
  every note; "earlier turns were left out" outranks the "DFlash was slower" tip);
* a message replaces the one of its own priority (a newer note of the same kind is newer
  news);
* when the shown one is dismissed (the banner's close button), withdrawn by the code that
  made it (``MessageBar.withdraw_banner``) or expires (``ms``), the highest waiting one
  shows.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum


class Priority(IntEnum):
    """How much a banner message matters; a higher one is never covered by a lower one."""

    TIP = 10
    """Advice that can wait: "DFlash was slower than plain ... try a smaller block size"."""
    NOTE = 20
    """Routine information (``show_note``'s default): settings saved, a tool call kept as
    text, a drafter that does not fit, long chats degrading the model."""
    WARNING = 30
    """About the reply just given: earlier turns left out of its prompt to fit the context."""
    ERROR = 40
    """Something failed (``show_banner``'s default): a turn, a load, an export."""


@dataclass(frozen=True)
class BannerEntry:
    """One banner message.

    Attributes:
        text: the sentence shown.
        kind: ``"error"`` (the red banner) or ``"note"`` (the quiet one).
        priority: its :class:`Priority`.
        chat: the conversation it is about (None: about the app); the window drops it when
            another chat is shown.
        expires: when it goes by itself, in the caller's clock (seconds; None: it stays
            until dismissed).
        seq: order of arrival (larger is newer).
    """

    text: str
    kind: str
    priority: Priority
    chat: int | None = None
    expires: float | None = None
    seq: int = 0


@dataclass
class BannerQueue:
    """The entries waiting or shown, at most one per priority (see the module doc)."""

    entries: dict[Priority, BannerEntry] = field(default_factory=dict)
    _seq: itertools.count = field(default_factory=itertools.count, repr=False)

    def push(self, text: str, kind: str, priority: Priority, chat: int | None = None,
             expires: float | None = None) -> BannerEntry:
        """Add a message, replacing the one of the same priority; returns its entry (shown
        when it is :meth:`top`)."""
        entry = BannerEntry(text, kind, Priority(priority), chat, expires, next(self._seq))
        self.entries[entry.priority] = entry
        return entry

    def top(self, now: float | None = None) -> BannerEntry | None:
        """The entry to show: the highest priority's (None when empty). With ``now``, the
        entries expired by then are dropped first."""
        if now is not None:
            self.drop(lambda e: e.expires is not None and e.expires <= now)
        return self.entries[max(self.entries)] if self.entries else None

    def drop(self, which: Callable[[BannerEntry], bool]) -> int:
        """Remove every entry ``which`` picks; returns how many went."""
        gone = [p for p, e in self.entries.items() if which(e)]
        for p in gone:
            del self.entries[p]
        return len(gone)

    def replace(self, entry: BannerEntry, text: str) -> None:
        """Change a waiting or shown entry's text, keeping its place (no-op when gone)."""
        if self.entries.get(entry.priority) is entry:
            self.entries[entry.priority] = BannerEntry(text, entry.kind, entry.priority,
                                                       entry.chat, entry.expires, entry.seq)

    def next_expiry(self) -> float | None:
        """The earliest ``expires`` among the entries (None when none expires)."""
        times = [e.expires for e in self.entries.values() if e.expires is not None]
        return min(times) if times else None

    def clear(self) -> None:
        """Remove every entry."""
        self.entries.clear()

    def __len__(self) -> int:
        return len(self.entries)

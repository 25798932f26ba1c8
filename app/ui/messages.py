"""What the window says: the message banner above the chat (one queue with priorities,
``app.ui.banners``), the storage banner with its Retry now, and the short status messages
beside the model line. :class:`MessageBar` is given those widgets by the window; the other
controllers say things through it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QPushButton, QWidget

from app.ui.banners import BannerEntry, BannerQueue, Priority
from app.ui.state import WindowState
from app.ui.text import sentence

log = logging.getLogger("app.ui.window")

SAVE_RETRY_MS = 3000
"""While a write the store could not take is kept (a full disk), it is tried again this often
(milliseconds); the storage banner's Retry now tries at once."""
SAVED_NOTE_MS = 8000
"""How long the storage banner says a kept write is saved now before it goes (milliseconds)."""


class MessageBar:
    """The window's banners and status messages.

    Args:
        state: the window's state (its ``pending_writes`` and ``store``).
        banner, banner_row: the message banner's label and the row it sits in (with its
            close button).
        store_banner, store_banner_row, store_retry: the storage banner's label, its row,
            and its Retry now button (shown while a write is kept).
        flash_label: the status bar's message label (an ``ElidedLabel``).
        parent: the window: parent of the timers, and what Retry now's visibility is
            measured against.

    Attributes:
        banners: every message, shown or waiting (:class:`~app.ui.banners.BannerQueue`).
        banner_kind: the shown message's kind ("error", "note"; "" when none).
        banner_chat: the conversation id the shown message is about (None: the app).
        retry_timer: runs every :data:`SAVE_RETRY_MS` ms while a write is kept.
    """

    def __init__(self, state: WindowState, banner: QLabel, banner_row: QWidget,
                 store_banner: QLabel, store_banner_row: QWidget, store_retry: QPushButton,
                 flash_label: QLabel, parent: QWidget) -> None:
        self.state = state
        self.banner, self.banner_row = banner, banner_row
        self.store_banner, self.store_banner_row = store_banner, store_banner_row
        self.store_retry = store_retry
        self.flash_label = flash_label
        self.host = parent
        self.banners = BannerQueue()
        self.banner_kind = ""
        self.banner_chat: int | None = None
        self._banner_timer = QTimer(parent)  # the next message that expires
        self._banner_timer.setSingleShot(True)
        self._banner_timer.timeout.connect(self.show_top)
        self._flash_timer = QTimer(parent)
        self._flash_timer.setSingleShot(True)
        self._flash_timer.timeout.connect(lambda: self.flash_label.setText(""))
        self.retry_timer = QTimer(parent)  # runs while a write is kept (pending_writes)
        self.retry_timer.setInterval(SAVE_RETRY_MS)
        self.retry_timer.timeout.connect(self.retry_saves)
        store_retry.clicked.connect(self.retry_saves)

    def flash(self, text: str, ms: int = 5000) -> None:
        """A short status message beside the model line, cleared after ``ms``."""
        self.flash_label.setText(f"   ·   {text}" if text else "")
        self._flash_timer.start(ms)

    def show_banner(self, text: str, kind: str = "error", chat: int | None = None,
                    priority: Priority | None = None, ms: int | None = None) -> None:
        """Show a dismissable message above the chat. ``kind`` "error" (something failed:
        the red banner) or "note" (routine information: a quiet one). ``chat``: the id of the
        conversation the message is about (a turn that could not start or failed); it goes
        when another chat is shown. None: about the app (a model that did not load), kept.

        ``priority`` (default :attr:`Priority.ERROR` for an error, :attr:`Priority.NOTE`
        for a note): the banner is one queue (``app.ui.banners``), so a message waits behind
        a shown one of higher priority and shows when that one goes; it replaces one of its
        own priority. ``ms``: it goes by itself after that many milliseconds (None: when
        dismissed)."""
        if priority is None:
            priority = Priority.ERROR if kind == "error" else Priority.NOTE
        text = sentence(text)
        log.info("banner (%s, %s): %s", kind, Priority(priority).name.lower(), text)
        expires = time.monotonic() + ms / 1000 if ms is not None else None
        entry = self.banners.push(text, kind, priority, chat, expires)
        if self.show_top() is entry:
            self.flash(text, 8000)

    def show_note(self, text: str, priority: Priority = Priority.NOTE,
                  ms: int | None = None) -> None:
        """Routine information (not an error) in the quiet banner, at ``priority`` (see
        :meth:`show_banner`)."""
        self.show_banner(text, kind="note", priority=priority, ms=ms)

    def show_top(self) -> BannerEntry | None:
        """Draw the queue's highest message (or hide the banner when it is empty) and time
        the next expiry; returns the entry shown (None when none)."""
        entry = self.banners.top(time.monotonic())
        nxt = self.banners.next_expiry()
        if nxt is None:
            self._banner_timer.stop()
        else:
            self._banner_timer.start(max(0, int((nxt - time.monotonic()) * 1000) + 1))
        if entry is None:
            self.banner.setText("")
            self.banner_kind = ""
            self.banner_chat = None
            self.banner_row.hide()
            return None
        self.banner_kind = entry.kind
        self.banner_chat = entry.chat
        self.banner.setText(entry.text)
        self.banner.setProperty("kind", entry.kind)
        self.banner.setAccessibleName("Error" if entry.kind == "error" else "Note")
        self.banner.style().unpolish(self.banner)
        self.banner.style().polish(self.banner)
        self.banner_row.show()
        return entry

    def dismiss_banner(self) -> None:
        """The user closed the shown message: it goes, and the highest waiting one shows."""
        shown = self.banners.top()
        if shown is not None:
            self.banners.drop(lambda e: e is shown)
        self.show_top()

    def withdraw_banner(self, which: Callable[[BannerEntry], bool]) -> None:
        """Remove the messages, shown or waiting, that ``which(entry) -> bool`` picks (e.g.
        an error that is over now); the highest remaining one shows."""
        self.banners.drop(which)
        self.show_top()

    def clear_banner(self) -> None:
        """Hide every message, shown and waiting (a new reply starts, a new chat)."""
        self.banners.clear()
        self.show_top()

    def show_store_problem(self, text: str) -> None:
        """Say that chats are not being stored as they should be (kept in memory only this
        time, or a write that failed: the cause and the folder) in the storage banner above
        the chat. It stays until the user dismisses it: a model that loads, a reply that
        starts and another chat shown leave it, as they leave no other banner."""
        log.warning("storage banner: %s", text)
        self.store_banner.setText(sentence(text))
        self._store_kind("error", "Storage problem")
        self.store_banner_row.show()
        self.flash(sentence(text), 8000)

    def _store_kind(self, kind: str, name: str) -> None:
        self.store_banner.setProperty("kind", kind)
        self.store_banner.setAccessibleName(name)
        self.store_banner.style().unpolish(self.store_banner)
        self.store_banner.style().polish(self.store_banner)

    def clear_store_problem(self) -> None:
        """Hide the storage banner (the user dismissed it, or the store works again). While
        chats are kept in memory only the status bar keeps saying so; kept writes are still
        tried again (:meth:`retry_saves`)."""
        self.store_banner.setText("")
        self.store_banner_row.hide()

    def keep_unsaved(self, pending, error: str) -> None:
        """A turn's final write failed because the store could not write (``pending``, an
        ``app.chat.stored_turn.PendingWrite``; ``error`` names the cause and the folder):
        keep it, try it again every :data:`SAVE_RETRY_MS` ms (:meth:`retry_saves`) and say
        so in the storage banner, with Retry now."""
        self.state.pending_writes.add(pending)
        self.retry_timer.start()
        self.store_retry.show()
        self.show_store_problem(
            f"Could not save {pending.what}: {error}. It stays on screen (copy it, or export "
            "the chat), and it is saved as soon as there is room: the app tries again every "
            f"{SAVE_RETRY_MS / 1000:g} s (Retry now tries at once)")

    def retry_saves(self) -> bool:
        """Try the kept writes again (``PendingWrites.retry``, oldest first). When all are
        stored the timer stops and the storage banner says so, then goes after
        :data:`SAVED_NOTE_MS` ms; when one still fails the banner names its cause. Returns
        True when nothing is left to write."""
        pending = self.state.pending_writes
        if not len(pending):
            self.retry_timer.stop()
            self.store_retry.hide()
            return True
        error = pending.retry(self.state.store.db)
        if error is None:
            self.retry_timer.stop()
            self.store_retry.hide()
            self.say_saved("Saved: the reply that could not be saved is stored now")
            return True
        if self.store_retry.isVisibleTo(self.host) and \
                str(error) not in self.store_banner.text():
            self.show_store_problem(f"Still not saved: {error}. The app tries again every "
                                    f"{SAVE_RETRY_MS / 1000:g} s (Retry now tries at once)")
        return False

    def say_saved(self, text: str) -> None:
        """Say in the storage banner that what could not be saved is stored now (a quiet
        note that goes after :data:`SAVED_NOTE_MS` ms, unless something replaced it)."""
        log.info("storage banner: %s", text)
        shown = sentence(text)
        self.store_banner.setText(shown)
        self._store_kind("note", "Storage")
        self.store_banner_row.show()
        self.flash(shown, SAVED_NOTE_MS)

        def clear() -> None:
            if self.store_banner.text() == shown:
                self.clear_store_problem()

        QTimer.singleShot(SAVED_NOTE_MS, self.host, clear)

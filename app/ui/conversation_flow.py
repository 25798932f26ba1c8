"""The window's conversation actions: delete (stopping a running reply first, after asking),
rename, export and import, and the list's context menu. :class:`ConversationFlow` is mixed
into :class:`app.ui.window.MainWindow` (it uses the window's store, list and banner).
"""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QElapsedTimer, QEventLoop, QStandardPaths
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QInputDialog,
    QLineEdit,
    QMenu,
    QMessageBox,
)

from app.ui.text import file_name

RENAME_DIALOG_WIDTH = 420
"""Least width (px) of the Rename chat dialog's title field: room for a whole automatic title
(``app.chat.storage.TITLE_MAX_CHARS``, 60 characters)."""


def documents_folder() -> Path:
    """Where Export and Import open: the user's Documents folder when it exists, else the home
    folder (the platform's Documents path may name a folder that was never made, and a file
    dialog then opens in the folder the app was started from)."""
    folder = QStandardPaths.writableLocation(QStandardPaths.DocumentsLocation)
    return Path(folder) if folder and Path(folder).is_dir() else Path.home()


class ConversationFlow:
    """Delete, rename, export, import (see the module doc). Needs the attributes
    :class:`~app.ui.window.MainWindow` sets up."""

    def delete_chat(self) -> None:
        """Delete the shown conversation after confirmation; while a reply is written, the
        question says so and Yes stops the reply first."""
        if self.conv is None:
            return
        if self.busy:
            ok = QMessageBox.question(
                self, "Delete chat",
                f"A reply is still being written in “{self.conv.title}”. Stop it and delete "
                "the chat?")
            if ok != QMessageBox.Yes or not self.wait_until_idle():
                return
        else:
            ok = QMessageBox.question(self, "Delete chat", f"Delete “{self.conv.title}”?")
        if ok == QMessageBox.Yes:
            self.store.delete(self.conv.id)
            convs = self.store.list()
            self.select_conversation(self.store.get(convs[0].id) if convs else None)

    def wait_until_idle(self, timeout_ms: int = 15000) -> bool:
        """Stop the running reply and wait (events keep flowing) until it has ended and is
        stored; True when it did within ``timeout_ms``."""
        self.stop()
        loop = QEventLoop()
        clock = QElapsedTimer()
        clock.start()
        while self.busy and clock.elapsed() < timeout_ms:
            loop.processEvents(QEventLoop.AllEvents, 50)
            time.sleep(0.005)
        return not self.busy

    def _show_listed(self, conv_id: int) -> bool:
        """Show the listed conversation ``conv_id`` for an action on it; False while a reply
        is written or when it is gone."""
        if self.busy:
            return False
        conv = self.store.get(conv_id)
        if conv is None:
            return False
        if conv is not self.conv:
            self.select_conversation(conv)
        return True

    def _conv_menu(self, conv_id: int, where) -> None:
        if not self._show_listed(conv_id):
            return
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename_chat())
        menu.addAction("Export…", lambda: self.export_chat())
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self.delete_chat())
        menu.exec(where)

    def _rename_from_list(self, conv_id: int) -> None:
        """A double-click in the chat list: show that conversation and ask for its title."""
        if self._show_listed(conv_id):
            self.rename_chat()

    def rename_chat(self) -> None:
        """Ask for a new title for the shown conversation."""
        if self.conv is None:
            return
        dlg = QInputDialog(self)
        dlg.setWindowTitle("Rename chat")
        dlg.setLabelText("Title")
        dlg.setTextValue(self.conv.title)
        # QInputDialog.getText's field is ~180 px wide, too narrow for a 60-character title.
        # The dialog's layout sets its size, so the field gets it.
        field = dlg.findChild(QLineEdit)
        if field is not None:
            field.setMinimumWidth(RENAME_DIALOG_WIDTH)
        if dlg.exec() == QDialog.Accepted and dlg.textValue().strip():
            self.rename_conversation(dlg.textValue())

    def rename_conversation(self, title: str) -> None:
        """Set the shown conversation's title (stored at once)."""
        try:
            self.store.rename(self.conv.id, title)
            self.conv.title = " ".join(title.split())
        except Exception as exc:
            self.show_banner(f"Could not rename: {exc}")
        self._refresh_list()

    def export_chat(self, path: str | None = None) -> bool:
        """Export the shown conversation as Markdown (``.md``) or JSON (``.json``)."""
        if self.conv is None:
            self.show_banner("Export needs a saved conversation.")
            return False
        if path is None:
            # one safe file name, in Documents (not the folder the app was started from)
            start = documents_folder() / f"{file_name(self.conv.title)}.md"
            path, _ = QFileDialog.getSaveFileName(
                self, "Export chat", str(start), "Markdown (*.md);;JSON (*.json)")
            if not path:
                return False
        if len(self.pending_writes):  # there may be room again: then the file has it all
            self.retry_saves()
        try:  # a reply not saved yet is exported as shown (TurnStore.export's pending)
            self.store.export(self.conv.id, Path(path), self.pending_writes)
        except Exception as exc:
            self.show_banner(f"Could not export: {exc}")
            return False
        # that failure is behind us now
        self.withdraw_banner(lambda e: e.kind == "error" and e.text.startswith("Could not export"))
        self.flash(f"Exported to {path}", 5000)
        return True

    def import_chat(self, path: str | None = None) -> bool:
        """Import a conversation exported as JSON and show it."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Import chat", str(documents_folder()),
                                                  "JSON (*.json)")
            if not path:
                return False
        try:
            conv = self.store.import_file(Path(path))
        except Exception as exc:
            self.show_banner(f"Could not import {Path(path).name}: {exc}")
            return False
        self.select_conversation(conv)
        # the copy reads like the chat it came from (same title, same turns): say it is new,
        # where a failed import's message was (that failure is over now)
        self.withdraw_banner(lambda e: e.kind == "error" and e.text.startswith("Could not import"))
        self.show_banner(f"Imported {Path(path).name} as a new chat, “{conv.title}” (shown; "
                         "a chat it was exported from stays as it was)", kind="note")
        self.flash(f"Imported {Path(path).name} as “{conv.title}”", 5000)
        return True


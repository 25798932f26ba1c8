"""The window's conversation actions: delete (stopping a running reply first, after asking),
rename, export and import, and the list's context menu: :class:`ConversationController`,
one of the window's controllers.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QStandardPaths
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QInputDialog,
    QLineEdit,
    QMenu,
    QMessageBox,
    QWidget,
)

from app.ui.conversation_list import ConversationList
from app.ui.messages import MessageBar
from app.ui.reply_flow import ReplyController
from app.ui.state import WindowState
from app.ui.text import file_name
from app.ui.transcript import TranscriptController

RENAME_DIALOG_WIDTH = 420
"""Least width (px) of the Rename chat dialog's title field: room for a whole automatic title
(``app.chat.storage.TITLE_MAX_CHARS``, 60 characters)."""


def documents_folder() -> Path:
    """Where Export and Import open: the user's Documents folder when it exists, else the home
    folder (the platform's Documents path may name a folder that was never made, and a file
    dialog then opens in the folder the app was started from)."""
    folder = QStandardPaths.writableLocation(QStandardPaths.DocumentsLocation)
    return Path(folder) if folder and Path(folder).is_dir() else Path.home()


class ConversationController:
    """Delete, rename, export, import and the chat list's menu (see the module doc).

    Args:
        state: the window's state (``store``, ``conv``, ``busy``, ``pending_writes``).
        conv_side: the chat list (its context menu and double-click ask for these actions).
        messages: where failures and results are said.
        transcript: shows a conversation and refreshes the list.
        replies: stops a running reply before its chat is deleted.
        parent: the window, parent of the dialogs.
    """

    def __init__(self, state: WindowState, conv_side: ConversationList, messages: MessageBar,
                 transcript: TranscriptController, replies: ReplyController,
                 parent: QWidget) -> None:
        self.state = state
        self.messages = messages
        self.transcript = transcript
        self.replies = replies
        self.host = parent
        conv_side.menuRequested.connect(self.show_menu)
        conv_side.renameRequested.connect(self.rename_from_list)

    def delete_chat(self) -> None:
        """Delete the shown conversation after confirmation; while a reply is written, the
        question says so and Yes stops the reply first."""
        conv, store = self.state.conv, self.state.store
        if conv is None:
            return
        if self.state.busy:
            ok = QMessageBox.question(
                self.host, "Delete chat",
                f"A reply is still being written in “{conv.title}”. Stop it and delete the "
                "chat?", QMessageBox.Yes | QMessageBox.No, QMessageBox.No)
            if ok != QMessageBox.Yes or not self.replies.wait_until_idle():
                return
        else:
            ok = QMessageBox.question(self.host, "Delete chat", f"Delete “{conv.title}”?",
                                      QMessageBox.Yes | QMessageBox.No, QMessageBox.No)
        if ok == QMessageBox.Yes:
            store.delete(conv.id)
            convs = store.list()
            self.transcript.select_conversation(store.get(convs[0].id) if convs else None)

    def _show_listed(self, conv_id: int) -> bool:
        """Show the listed conversation ``conv_id`` for an action on it; False while a reply
        is written or when it is gone."""
        if self.state.busy:
            return False
        conv = self.state.store.get(conv_id)
        if conv is None:
            return False
        if conv is not self.state.conv:
            self.transcript.select_conversation(conv)
        return True

    def show_menu(self, conv_id: int, where) -> None:
        """The chat list's context menu for ``conv_id`` at the global point ``where``."""
        if not self._show_listed(conv_id):
            return
        menu = QMenu(self.host)
        menu.addAction("Rename…", lambda: self.rename_chat())
        menu.addAction("Export…", lambda: self.export_chat())
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self.delete_chat())
        menu.exec(where)

    def rename_from_list(self, conv_id: int) -> None:
        """A double-click in the chat list: show that conversation and ask for its title."""
        if self._show_listed(conv_id):
            self.rename_chat()

    def rename_chat(self) -> None:
        """Ask for a new title for the shown conversation."""
        if self.state.conv is None:
            return
        dlg = QInputDialog(self.host)
        dlg.setWindowTitle("Rename chat")
        dlg.setLabelText("Title")
        dlg.setTextValue(self.state.conv.title)
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
            self.state.store.rename(self.state.conv.id, title)
            self.state.conv.title = " ".join(title.split())
        except Exception as exc:
            self.messages.show_banner(f"Could not rename: {exc}")
        self.transcript.refresh_list()

    def export_chat(self, path: str | None = None) -> bool:
        """Export the shown conversation as Markdown (``.md``) or JSON (``.json``)."""
        if self.state.conv is None:
            self.messages.show_banner("Export needs a saved conversation.")
            return False
        if path is None:
            # one safe file name, in Documents (not the folder the app was started from)
            start = documents_folder() / f"{file_name(self.state.conv.title)}.md"
            path, _ = QFileDialog.getSaveFileName(
                self.host, "Export chat", str(start), "Markdown (*.md);;JSON (*.json)")
            if not path:
                return False
        if len(self.state.pending_writes):  # there may be room again: then the file has it all
            self.messages.retry_saves()
        try:  # a reply not saved yet is exported as shown (ViewStore.export's pending)
            self.state.store.export(self.state.conv.id, Path(path), self.state.pending_writes)
        except Exception as exc:
            self.messages.show_banner(f"Could not export: {exc}")
            return False
        # that failure is behind us now
        self.messages.withdraw_banner(
            lambda e: e.kind == "error" and e.text.startswith("Could not export"))
        self.messages.flash(f"Exported to {path}", 5000)
        return True

    def import_chat(self, path: str | None = None) -> bool:
        """Import a conversation exported as JSON and show it."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self.host, "Import chat", str(documents_folder()),
                                                  "JSON (*.json)")
            if not path:
                return False
        try:
            conv = self.state.store.import_file(Path(path))
        except Exception as exc:
            self.messages.show_banner(f"Could not import {Path(path).name}: {exc}")
            return False
        self.transcript.select_conversation(conv)
        # the copy reads like the chat it came from (same title, same turns): say it is new,
        # where a failed import's message was (that failure is over now)
        self.messages.withdraw_banner(
            lambda e: e.kind == "error" and e.text.startswith("Could not import"))
        self.messages.show_banner(f"Imported {Path(path).name} as a new chat, “{conv.title}” "
                                  "(shown; a chat it was exported from stays as it was)",
                                  kind="note")
        self.messages.flash(f"Imported {Path(path).name} as “{conv.title}”", 5000)
        return True


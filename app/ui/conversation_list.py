"""The left-hand list of conversations with its search box and New chat button.

:class:`ConversationList` owns the list's state (which conversations are shown for the search
text, which one is current) and reads them from the store; the window answers its signals.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QStyle,
    QVBoxLayout,
)

log = logging.getLogger(__name__)


class ConversationList(QFrame):
    """Conversations, newest first, filtered by the search box (``ViewStore.search``).

    Signals:
        selected(int): the user picked the conversation with this id.
        newRequested(): the New chat button.
        menuRequested(int, QPoint): a context menu for this conversation at this global
            position.
        renameRequested(int): a double-click on this conversation (rename it).
    """

    selected = Signal(int)
    newRequested = Signal()
    menuRequested = Signal(int, QPoint)
    renameRequested = Signal(int)

    def __init__(self, store, parent=None) -> None:
        super().__init__(parent)
        self.store = store
        self.current_id: int | None = None
        self.setObjectName("side")
        self.list = QListWidget()
        self.list.setObjectName("conversations")
        self.list.setAccessibleName("Conversations")
        self.list.currentItemChanged.connect(self._on_current)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._on_menu)
        self.list.itemDoubleClicked.connect(
            lambda item: self.renameRequested.emit(int(item.data(Qt.UserRole))))
        self.list.setTextElideMode(Qt.ElideRight)
        new_btn = QPushButton(self.style().standardIcon(QStyle.SP_FileDialogNewFolder),
                              " New chat")
        new_btn.setAccessibleName("New chat")
        new_btn.setToolTip("New chat (Ctrl+N)")
        new_btn.clicked.connect(self.newRequested)
        title = QLabel("Chats")
        title.setObjectName("sectionTitle")
        self.search_box = QLineEdit()
        self.search_box.setPlaceholderText("Search chats")
        self.search_box.setClearButtonEnabled(True)
        self.search_box.setAccessibleName("Search chats")
        self.search_box.textChanged.connect(lambda _t: self.refresh())
        self.no_match = QLabel("")  # a search that finds nothing says so (not an empty list)
        self.no_match.setWordWrap(True)
        self.no_match.setObjectName("muted")
        self.no_match.hide()
        ll = QVBoxLayout(self)
        ll.setContentsMargins(8, 10, 8, 8)
        ll.addWidget(title)
        ll.addWidget(self.search_box)
        ll.addWidget(self.no_match)
        ll.addWidget(self.list, 1)
        ll.addWidget(new_btn)

    def refresh(self, current_id: int | None | object = ...) -> None:
        """Re-read the conversations (``current_id``: the one to mark as current; left out,
        the one marked before). The items are rebuilt only when the listed chats or their
        titles changed: a click that shows a chat refreshes the list from inside the click,
        and rebuilt items would lose a double-click's second click (no rename)."""
        if current_id is not ...:
            self.current_id = current_id
        convs = self.store.list()
        query = self.search_box.text().strip()
        if query:
            try:
                hits = set(self.store.search(query))
            except Exception:
                log.exception("search")
                hits = set()
            convs = [c for c in convs if c.id in hits]
        rows = [(conv.id, conv.title) for conv in convs]
        self.no_match.setText(f"No chats match “{query}”." if query and not rows else "")
        self.no_match.setVisible(bool(query and not rows))
        self.list.blockSignals(True)
        if rows != self.rows():
            self.list.clear()
            for conv_id, title in rows:
                item = QListWidgetItem(title)
                item.setData(Qt.UserRole, conv_id)
                item.setToolTip(title)
                self.list.addItem(item)
        current = next((i for i, (conv_id, _) in enumerate(rows)
                        if conv_id == self.current_id), -1)
        if current < 0:
            self.list.clearSelection()
        self.list.setCurrentRow(current)
        self.list.blockSignals(False)

    def rows(self) -> list[tuple[int, str]]:
        """(conversation id, title) of each listed chat, in order."""
        return [(int(self.list.item(i).data(Qt.UserRole)), self.list.item(i).text())
                for i in range(self.list.count())]

    BUSY_TIP = ("Chats can be switched when this reply is finished (or press Stop). The "
                "reply keeps writing in the chat it belongs to.")

    def set_busy(self, busy: bool) -> None:
        """While a reply is written the list is disabled (the view stays on that chat) and
        its tooltip says why."""
        self.list.setEnabled(not busy)
        self.list.setToolTip(self.BUSY_TIP if busy else "")

    def _on_current(self, item: QListWidgetItem | None, _prev=None) -> None:
        if item is not None:
            self.selected.emit(int(item.data(Qt.UserRole)))

    def _on_menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is not None:
            self.menuRequested.emit(int(item.data(Qt.UserRole)),
                                    self.list.viewport().mapToGlobal(pos))

"""The main window: conversations (left), chat and composer (centre), reasoning, tool calls
and live figures (right), status bar (loaded pair, memory, load progress).

Everything MLX happens on :class:`app.ui.worker.Worker`'s thread; this module only sends it
requests and renders the :class:`~app.ui.worker.UiEvent` batches it sends back, on a
``RENDER_MS`` timer (never per token).
"""

from __future__ import annotations

import atexit
import logging
import time
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QGuiApplication,
    QIcon,
    QKeySequence,
    QTextCursor,
)
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QStyle,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import APP_NAME
from app.chat.baseline import Baselines, SlowStreak
from app.chat.storage import StorageError
from app.chat.stored_turn import PendingWrites
from app.chat.turns import ConversationView, Turn, TurnStore
from app.engine.lookup import DEFAULT_BLOCK
from app.engine.modes import DRAFTING_MODES, Mode
from app.ui import settings as settings_mod
from app.ui.about import AboutDialog, debug_info
from app.ui.banners import BannerQueue, Priority
from app.ui.chat import ChatView, Composer
from app.ui.compare import CompareView
from app.ui.conversation_flow import ConversationFlow
from app.ui.conversation_list import ConversationList
from app.ui.details import DetailsPanel
from app.ui.fit import ElidedLabel
from app.ui.model_flow import ModelFlow, default_pair  # noqa: F401 (re-exported)
from app.ui.reply_flow import ReplyFlow
from app.ui.run_state import ReplyRun
from app.ui.serve_flow import ServeFlow
from app.ui.text import mode_label, sentence
from app.ui.theme import colours, make_palette, stylesheet
from app.ui.worker import (
    Backend,
    ModelInfo,
    UiEvent,
    WorkerThread,
    at_exit,
)

log = logging.getLogger(__name__)

RENDER_MS = 40
"""Render timer period in milliseconds (the issue asks for 30-50 ms)."""
MIN_WIDTH = 680
"""The window's minimum width in pixels: the conversations, the chat with its composer (its
buttons wrap onto more lines) and the figures column still fit, nothing cut."""
MIN_HEIGHT = 460
"""The window's minimum height in pixels: at :data:`MIN_WIDTH` the composer's row of buttons
wraps onto three lines and its settings line onto two or three, and all of it stays whole
and apart, with a few lines of the conversation above (below about 370 px the mode switch
would be drawn over the message box)."""
#: The side panel's narrowest (px): two figure tiles side by side (three from about 300 px,
#: ``LivePanel.columns_for``), so that a narrow window keeps its conversation the wider pane.
SIDE_MIN_WIDTH = 230
SAVE_RETRY_MS = 3000
"""While a write the store could not take is kept (a full disk), it is tried again this often
(milliseconds); the storage banner's Retry now tries at once."""
SAVED_NOTE_MS = 8000
"""How long the storage banner says a kept write is saved now before it goes (milliseconds)."""



class PaneSplitter(QSplitter):
    """The window's three panes (chat list, conversation, side panel) side by side.

    As a plain ``QSplitter`` with only the conversation stretching, a narrower window took
    all its lost width from the conversation: from 1280 to 880 px it went from 640 to 288 px,
    narrower than the side panel beside it (seen under Xvfb). After every resize this one
    keeps the conversation at least as wide as the side panel where it can, by narrowing the
    side panel, then the chat list, down to their minimum widths. A layout whose
    conversation is already the wider is left exactly as it is (a restored layout keeps the
    user's panel widths).

    The chat list and the side panel also grow back: a window made narrow and then wide again
    kept them at their narrow widths (118 and 285 px, tool names cut to "cou…", seen under
    Xvfb), and so did the next start, which restores the layout. :attr:`preferred` keeps the
    widths the user last dragged them to (210 and 380 px until then; the window saves and
    restores it), and a wider window gives them back up to those widths, as far as the
    conversation stays at least as wide as the side panel.
    """

    #: Default widths of the chat list and the side panel, in pixels.
    DEFAULT_PREFERRED = (210, 380)

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.preferred = list(self.DEFAULT_PREFERRED)
        self.splitterMoved.connect(self._remember)

    def _remember(self, *_args) -> None:
        """The user dragged a handle: the side panes' widths now are the ones to keep."""
        if self.count() == 3:
            left, _, right = self.sizes()
            self.preferred = [left, right]

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self.grow_back()
        self.keep_conversation_widest()

    def grow_back(self) -> None:
        """Widen the side panel, then the chat list, towards :attr:`preferred` while the
        conversation stays at least as wide as the side panel (never narrows anything)."""
        if self.count() != 3:
            return
        left, centre, right = self.sizes()
        total = left + centre + right
        if total <= 0:
            return
        new_right = max(right, min(self.preferred[1], (total - left) // 2))
        new_left = max(left, min(self.preferred[0], total - 2 * new_right))
        if (new_left, new_right) != (left, right):
            self.setSizes([new_left, total - new_left - new_right, new_right])

    def keep_conversation_widest(self) -> None:
        """Apply the rule above to the current sizes (no change when it already holds)."""
        if self.count() != 3:
            return
        left, centre, right = self.sizes()
        if centre >= right:
            return
        total = left + centre + right
        right_min = self.widget(2).minimumSizeHint().width()
        right_min = max(right_min, self.widget(2).minimumWidth())
        left_min = max(self.widget(0).minimumSizeHint().width(), 120)
        new_right = max(right_min, (total - left) // 2)
        new_left = left
        if total - left - new_right < new_right:  # the side panel is at its minimum
            new_left = max(left_min, min(left, total - 2 * new_right))
        self.setSizes([new_left, total - new_left - new_right, new_right])


class MainWindow(ConversationFlow, ModelFlow, ReplyFlow, ServeFlow, QMainWindow):
    """The DFlash Chat window.

    Args:
        backend: worker backend (default :class:`~app.chat.session.ChatSession`); tests pass
            fakes.
        store: conversation store (default: ``TurnStore(":memory:")``, chats in memory).
        qsettings: where defaults, layout and last model live (default: the app's QSettings).
        auto_load: load the last/default model when shown.
        data_dir: the app's data folder (models list, storage); None for the default.

    Signals: ``replyFinished(object)`` with the finished :class:`Turn` (tests, storage).
    """

    replyFinished = Signal(object)
    modelLoaded = Signal(object)
    loadFailed = Signal(str)
    benchFinished = Signal(object)

    def __init__(self, backend: Backend | None = None, store: TurnStore | None = None,
                 qsettings: QSettings | None = None, auto_load: bool = True,
                 data_dir: Path | None = None) -> None:
        super().__init__()
        self.data_dir = data_dir
        from app.engine.threads import forbid_engine_on_current_thread

        forbid_engine_on_current_thread()
        self.setWindowTitle(APP_NAME)
        self.setAccessibleName(APP_NAME)
        self.log_path: Path | None = None
        icon = Path(__file__).resolve().parents[2] / "packaging" / "icon" / "dflash_chat.png"
        if icon.is_file():  # a checkout; the frozen app gets its icon from the bundle
            self.setWindowIcon(QIcon(str(icon)))
        self.qs = qsettings or QSettings()
        self.store: TurnStore = store if store is not None else TurnStore(":memory:")
        self.defaults = settings_mod.load_defaults(self.qs)
        self.model: ModelInfo | None = None
        self.memory_bytes = 0
        self.conv: ConversationView | None = None
        self.busy = False
        self.baselines = Baselines()  # plain speeds measured since the app started
        self.slow_streak = SlowStreak()
        # drafter fit probes of the pairs loaded since the app started, by
        # app.chat.drafter_probe.pair_key (the Models window shows them)
        self.drafter_probes: dict = {}
        self._loading = None  # the PairSpec being loaded, None when no load runs
        self._req = 0
        self._run: ReplyRun | None = None
        self._pending: list[UiEvent] = []
        self.shown_message: Turn | None = None
        self._drafts: dict[int, str] = {}  # conversation id -> its unsent message
        self.pending_writes = PendingWrites()  # replies the store could not take yet
        self.benchmarking = False  # the short benchmark runs on the worker

        self.workers = WorkerThread(backend, self.store.db)  # the worker writes replies
        self.worker = self.workers.worker
        self.worker.loading.connect(self._on_loading)
        self.worker.loaded.connect(self._on_loaded)
        self.worker.probed.connect(self._on_probed)
        self.worker.loadFailed.connect(self._on_load_failed)
        self.worker.events.connect(self._on_events)
        self.worker.finished.connect(self._on_finished)
        self.worker.memory.connect(self._on_memory)
        self.worker.piecesReady.connect(self._on_pieces)
        self.worker.benchDone.connect(self._on_bench_done)
        self.worker.benchFailed.connect(self._on_bench_failed)

        self._build()
        self._build_menus()
        self.apply_theme()
        try:
            QGuiApplication.styleHints().colorSchemeChanged.connect(lambda *_: self.apply_theme())
        except AttributeError:  # pragma: no cover - Qt < 6.5
            pass
        self.timer = QTimer(self)
        self.timer.setInterval(RENDER_MS)
        self.timer.timeout.connect(self.render_pending)
        self.timer.start()
        self.retry_timer = QTimer(self)  # runs while a write is kept (pending_writes)
        self.retry_timer.setInterval(SAVE_RETRY_MS)
        self.retry_timer.timeout.connect(self.retry_saves)
        self._set_intro()
        self._restore()
        # the program may end without closing the window (sys.exit in a slot, a script):
        # shut down then too, before Qt's objects go (runs before the worker's own hook)
        self._at_exit = at_exit(self, "shutdown")
        if auto_load:
            QTimer.singleShot(0, self.load_last_or_default)

    # ------------------------------------------------------------------ layout
    def _build(self) -> None:
        st = self.style()
        # left: conversations
        self.conv_side = ConversationList(self.store)
        self.conv_side.selected.connect(self._on_conv_selected)
        self.conv_side.newRequested.connect(self.new_chat)
        self.conv_side.menuRequested.connect(self._conv_menu)
        self.conv_side.renameRequested.connect(self._rename_from_list)
        self.conv_list, self.search_box = self.conv_side.list, self.conv_side.search_box
        left = self.conv_side

        # centre: banner, chat, compare, composer
        self.banner = QLabel("")
        self.banner.setObjectName("banner")
        self.banner.setWordWrap(True)
        self.banner.setAccessibleName("Message")
        self.banner_kind = ""  # the shown message's kind ("error", "note"; "" when none)
        self.banner_chat: int | None = None  # the conversation the shown message is about
        self.banners = BannerQueue()  # every message, shown or waiting (app/ui/banners.py)
        self._banner_timer = QTimer(self)  # the next message that expires
        self._banner_timer.setSingleShot(True)
        self._banner_timer.timeout.connect(self._show_banner_top)
        self.banner_close = QToolButton()
        self.banner_close.setIcon(st.standardIcon(QStyle.SP_DialogCloseButton))
        self.banner_close.setAccessibleName("Dismiss message")
        self.banner_close.clicked.connect(self.dismiss_banner)
        self.banner_row = QWidget()
        br = QHBoxLayout(self.banner_row)
        br.setContentsMargins(12, 8, 12, 0)
        br.addWidget(self.banner, 1)
        br.addWidget(self.banner_close)
        self.banner_row.hide()
        # where chats are stored has its own banner: a memory-only store or a failed write
        # is said until the user dismisses it (show_store_problem)
        self.store_banner = QLabel("")
        self.store_banner.setObjectName("banner")
        self.store_banner.setProperty("kind", "error")
        self.store_banner.setWordWrap(True)
        self.store_banner.setTextInteractionFlags(Qt.TextSelectableByMouse)  # the folder
        self.store_banner.setAccessibleName("Storage problem")
        self.store_banner_close = QToolButton()
        self.store_banner_close.setIcon(st.standardIcon(QStyle.SP_DialogCloseButton))
        self.store_banner_close.setAccessibleName("Dismiss the storage message")
        self.store_banner_close.clicked.connect(self.clear_store_problem)
        # shown while a write the store could not take is kept: tries it again now
        self.store_retry = QPushButton("Retry now")
        self.store_retry.setAccessibleName("Retry saving now")
        self.store_retry.setToolTip("Try the unsaved writes again now (they are tried every "
                                    f"{SAVE_RETRY_MS / 1000:g} s anyway)")
        self.store_retry.clicked.connect(self.retry_saves)
        self.store_retry.hide()
        self.store_banner_row = QWidget()
        sr = QHBoxLayout(self.store_banner_row)
        sr.setContentsMargins(12, 8, 12, 0)
        sr.addWidget(self.store_banner, 1)
        sr.addWidget(self.store_retry)
        sr.addWidget(self.store_banner_close)
        self.store_banner_row.hide()
        self.chat = ChatView()
        self.chat.linkActivated.connect(self._on_chat_link)
        self.chat.rendered.connect(lambda conv, _streaming: self._update_regen_action(conv))
        self.legend = QLabel("")
        self.legend.setObjectName("legend")
        self.legend.setAccessibleName("Colour drafts legend")
        self.legend.setContentsMargins(12, 4, 12, 0)
        self.legend.setWordWrap(True)
        self.legend.hide()
        self.compare_view = CompareView()
        self.compare_view.chosen.connect(self._on_compare_choice)
        self.compare_view.hide()
        self.composer = Composer()
        self.composer.send.connect(self.send)
        self.composer.compare.connect(self.compare)
        self.composer.stop.connect(self.stop)
        self.composer.colour_box.toggled.connect(self._on_colour_toggled)
        self.composer.modeChanged.connect(self._on_mode_changed)
        self.centre_split = QSplitter(Qt.Vertical)
        self.centre_split.addWidget(self.chat)
        self.centre_split.addWidget(self.compare_view)
        self.centre_split.setChildrenCollapsible(False)
        centre = QWidget()
        cl = QVBoxLayout(centre)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.setSpacing(0)
        cl.addWidget(self.store_banner_row)
        cl.addWidget(self.banner_row)
        cl.addWidget(self.legend)
        cl.addWidget(self.centre_split, 1)
        cl.addWidget(self.composer)

        # right: live panel, reasoning, tools (scrolls when the window is small)
        self.details = DetailsPanel()
        right = QScrollArea()
        right.setObjectName("sideScroll")
        right.setWidgetResizable(True)
        right.setFrameShape(QFrame.NoFrame)
        right.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        right.setWidget(self.details)
        right.setMinimumWidth(SIDE_MIN_WIDTH)
        self.details_scroll = right
        d = self.details
        self.live, self.reasoning, self.tools = d.live, d.reasoning, d.tools
        self.live_section = d.live_section
        self.reasoning_section = d.reasoning_section
        self.tools_section = d.tools_section

        self.split = PaneSplitter(Qt.Horizontal)
        self.split.addWidget(left)
        self.split.addWidget(centre)
        self.split.addWidget(right)
        self.split.setStretchFactor(1, 1)
        self.split.setSizes([210, 640, 380])
        self.setCentralWidget(self.split)

        # status bar
        self.model_label = ElidedLabel("No model loaded")  # "…" and a tooltip when narrow
        self.model_label.setAccessibleName("Loaded models")
        self.memory_label = QLabel("")
        self.memory_label.setAccessibleName("Memory in use")
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)
        self.progress.setMaximumWidth(140)
        self.progress.setAccessibleName("Loading progress")
        self.progress.hide()
        # long messages end in "…" (they were cut mid-letter) with the whole one as tooltip
        self.flash_label = ElidedLabel("")
        self.flash_label.setAccessibleName("Status message")
        self.flash_label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self._flash_timer = QTimer(self)
        self._flash_timer.setSingleShot(True)
        self._flash_timer.timeout.connect(lambda: self.flash_label.setText(""))
        # lasting while chats are kept in memory only, after its banner was dismissed too
        self.store_label = QLabel("")
        self.store_label.setAccessibleName("Storage")
        self.store_label.hide()
        sb = self.statusBar()
        sb.addWidget(self.model_label)
        sb.addWidget(self.flash_label, 1)
        sb.addPermanentWidget(self.store_label)
        sb.addPermanentWidget(self.progress)
        sb.addPermanentWidget(self.memory_label)
        self.setMinimumSize(MIN_WIDTH, MIN_HEIGHT)
        self.resize(1280, 800)

    def _build_menus(self) -> None:
        st = self.style()

        def act(menu, text, slot, shortcut=None, icon=None) -> QAction:
            a = QAction(text, self)
            if shortcut:
                a.setShortcut(QKeySequence(shortcut))
            if icon is not None:
                a.setIcon(st.standardIcon(icon))
            # triggered(bool) would pass `checked` as the slot's first argument (a path,
            # a prompt, ...): the actions here take none from the menu
            a.triggered.connect(lambda _checked=False, s=slot: s())
            menu.addAction(a)
            return a

        mb = self.menuBar()
        f = mb.addMenu("&File")
        self.new_action = act(f, "New chat", self.new_chat, QKeySequence.New)
        act(f, "Models…", self.open_models, "Ctrl+M", QStyle.SP_DriveHDIcon)
        act(f, "Open model folder…", self.open_model_dialog, "Ctrl+O", QStyle.SP_DirOpenIcon)
        act(f, "Use default model", self.load_default)
        act(f, "Unload model", self.unload)
        self.serve_action = QAction("Serve on localhost", self)
        self.serve_action.setCheckable(True)
        self.serve_action.setToolTip("Serve the loaded pair on 127.0.0.1 (OpenAI API).")
        self.serve_action.toggled.connect(self.toggle_serving)
        f.addAction(self.serve_action)
        f.addSeparator()
        act(f, "Export chat…", self.export_chat, "Ctrl+E")
        act(f, "Import chat…", self.import_chat)
        f.addSeparator()
        # Ctrl+, (Cmd+, on macOS, where Qt reads Ctrl as Cmd) on every platform:
        # QKeySequence.Preferences has no key on Linux or Windows
        self.settings_action = act(f, "Settings…", self.open_settings, "Ctrl+,")
        f.addSeparator()
        act(f, "Quit", self.close, QKeySequence.Quit)
        c = mb.addMenu("&Chat")
        c.setToolTipsVisible(True)  # a disabled item says why (Regenerate on a Compare turn)
        self.send_action = act(c, "Send", lambda: self.composer._send(), "Ctrl+Return")
        self.stop_action = act(c, "Stop", self.stop, "Esc")
        self.compare_action = act(c, "Compare plain and DFlash",
                                  lambda: self.composer._compare(), "Ctrl+Shift+C")
        self.regen_action = act(c, "Regenerate last reply", self.regenerate, "Ctrl+R")
        self._update_regen_action(None)
        self.bench_action = act(c, "Run short benchmark", lambda: self.run_benchmark())
        act(c, "Rename chat…", self.rename_chat, "F2")
        act(c, "Delete chat", self.delete_chat)
        h = mb.addMenu("&Help")
        act(h, "About DFlash Chat", self.show_about)
        act(h, "Copy debug info", self.copy_debug_info)

    REGEN_TIP = "Generate a new version of the last reply in the selected mode."
    REGEN_COMPARE_TIP = ("A Compare turn cannot be regenerated: its sides are its versions. "
                         "Pick one with “continue from … instead” under the reply, or send "
                         "the prompt again.")
    REGEN_NONE_TIP = "There is no reply to regenerate yet."

    def _update_regen_action(self, conv) -> None:
        """Chat › Regenerate only where it can run: the last turn is a reply that is not a
        Compare turn (the tooltip says why not otherwise)."""
        msgs = conv.messages if conv is not None else []
        last = msgs[-1] if len(msgs) >= 2 and msgs[-1].role == "assistant" else None
        if last is None:
            ok, tip = False, self.REGEN_NONE_TIP
        elif last.is_compare:
            ok, tip = False, self.REGEN_COMPARE_TIP
        else:
            ok, tip = True, self.REGEN_TIP
        self.regen_action.setEnabled(ok)
        self.regen_action.setToolTip(tip)
        self.regen_action.setStatusTip(tip)

    def apply_theme(self) -> None:
        """Palette and stylesheet for the system's light/dark scheme."""
        c = colours()
        app = QApplication.instance()
        app.setPalette(make_palette(c))
        app.setStyleSheet(stylesheet(c))
        self.chat.palette_colours = c
        self.compare_view.colours = c
        self.live.chart.colours = {k: c[k] for k in ("bar", "bar_full", "muted", "border")}
        self.live.chart.update()
        self.chat.render(self.conv, streaming=self.busy)

    # ------------------------------------------------------------------ messages
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
        if self._show_banner_top() is entry:
            self.flash(text, 8000)

    def show_note(self, text: str, priority: Priority = Priority.NOTE,
                  ms: int | None = None) -> None:
        """Routine information (not an error) in the quiet banner, at ``priority`` (see
        :meth:`show_banner`)."""
        self.show_banner(text, kind="note", priority=priority, ms=ms)

    def _show_banner_top(self):
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
        self._show_banner_top()

    def withdraw_banner(self, which) -> None:
        """Remove the messages, shown or waiting, that ``which(entry) -> bool`` picks (an
        ``app.ui.banners.BannerEntry``: e.g. an error that is over now); the highest
        remaining one shows."""
        self.banners.drop(which)
        self._show_banner_top()

    def clear_banner(self) -> None:
        """Hide every message, shown and waiting (a new reply starts, a new chat)."""
        self.banners.clear()
        self._show_banner_top()

    def show_store_problem(self, text: str) -> None:
        """Say that chats are not being stored as they should be (kept in memory only this
        time, or a write that failed: the cause and the folder) in the storage banner above
        the chat. It stays until the user dismisses it: a model that loads, a reply that
        starts and another chat shown leave it, as they leave no other banner."""
        log.warning("storage banner: %s", text)
        self.store_banner.setText(sentence(text))
        self.store_banner.setProperty("kind", "error")
        self.store_banner.setAccessibleName("Storage problem")
        self.store_banner.style().unpolish(self.store_banner)
        self.store_banner.style().polish(self.store_banner)
        self.store_banner_row.show()
        self.flash(sentence(text), 8000)

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
        self.pending_writes.add(pending)
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
        if not len(self.pending_writes):
            self.retry_timer.stop()
            self.store_retry.hide()
            return True
        error = self.pending_writes.retry(self.store.db)
        if error is None:
            self.retry_timer.stop()
            self.store_retry.hide()
            self.say_saved("Saved: the reply that could not be saved is stored now")
            return True
        if self.store_retry.isVisibleTo(self) and str(error) not in self.store_banner.text():
            self.show_store_problem(f"Still not saved: {error}. The app tries again every "
                                    f"{SAVE_RETRY_MS / 1000:g} s (Retry now tries at once)")
        return False

    def say_saved(self, text: str) -> None:
        """Say in the storage banner that what could not be saved is stored now (a quiet
        note that goes after :data:`SAVED_NOTE_MS` ms, unless something replaced it)."""
        log.info("storage banner: %s", text)
        shown = sentence(text)
        self.store_banner.setText(shown)
        self.store_banner.setProperty("kind", "note")
        self.store_banner.setAccessibleName("Storage")
        self.store_banner.style().unpolish(self.store_banner)
        self.store_banner.style().polish(self.store_banner)
        self.store_banner_row.show()
        self.flash(shown, SAVED_NOTE_MS)

        def clear() -> None:
            if self.store_banner.text() == shown:
                self.clear_store_problem()

        QTimer.singleShot(SAVED_NOTE_MS, self, clear)

    # ------------------------------------------------------------------ conversations
    def _refresh_list(self) -> None:
        self.conv_side.refresh(self.conv.id if self.conv is not None else None)

    def new_chat(self) -> ConversationView | None:
        """Start a new conversation and show it; an empty one already in the list (no
        messages, no title of its own) is shown instead of adding another "New chat".
        None (the storage banner says why, the shown chat stays) when the store cannot
        write one."""
        if self.busy:
            # the reply stops and is stored first (within a cycle, events keep flowing), so
            # the new chat is the newest in the list, not second below the stopped one
            self.wait_until_idle(5000)
        try:
            conv = self._empty_chat() or self.store.new()
        except StorageError as exc:
            log.error("new chat: %s", exc)
            self.show_store_problem(f"Could not start a new chat: {exc}")
            return None
        self._save(conv)
        self.clear_banner()  # a message about the previous chat does not belong here
        self.conv_side.search_box.clear()  # a filter would hide the new chat from the list
        self.select_conversation(conv)
        self.composer.edit.setFocus()
        return conv

    def _empty_chat(self) -> ConversationView | None:
        """The shown conversation when it has no messages and no title of its own, else the
        newest such one in the list (None when there is none)."""
        if self.conv is not None and not self.conv.messages and self.conv.title == "New chat" \
                and not self.busy:
            return self.conv
        for c in self.store.list():
            if c.title == "New chat":
                full = self.store.get(c.id)
                if full is not None and not full.messages:
                    return full
        return None

    def select_conversation(self, conv: ConversationView | None) -> None:
        """Show ``conv`` (None: empty view)."""
        shown = self.conv.id if self.conv is not None else None
        new = conv.id if conv is not None else None
        # what is said about one chat goes with it: an error about its turn, or a note on
        # its reply or settings (errors about the app stay)
        self.withdraw_banner(lambda e: e.chat not in (None, new) or
                             (e.kind == "note" and shown not in (None, new)))
        if shown is not None and new not in (None, shown):
            self._swap_draft(shown, new)
        self.conv = conv
        self._refresh_list()
        self.chat.expanded = set()
        self.chat.earlier_steps = 0
        self.chat.follow = True
        self.chat.render(conv)
        last = next((m for m in reversed(conv.messages) if m.role == "assistant"), None) \
            if conv else None
        self.show_message_details(last)
        self._show_compare_of(last)
        self.update_settings_note()
        if self.chat.colour_drafts:
            self._request_pieces()
        if conv is not None:
            self.qs.setValue("last_conversation", conv.id)

    def _swap_draft(self, old: int, new: int) -> None:
        """Keep the message typed but not sent in chat ``old`` with that chat, and put chat
        ``new``'s back in the composer (empty when it has none), the caret at its end. In
        memory only: a draft is not saved across runs."""
        text = self.composer.edit.toPlainText()
        if text.strip():
            self._drafts[old] = text
        else:
            self._drafts.pop(old, None)
        self.composer.edit.setPlainText(self._drafts.pop(new, ""))
        self.composer.edit.moveCursor(QTextCursor.End)

    def _on_mode_changed(self, mode: str) -> None:
        """The switch moved: the settings line follows; mid-reply, say it is for the next."""
        self.update_settings_note()
        if self.busy and self._run is not None and not self._run.compare:
            now, new = mode_label(self._run.mode), mode_label(mode)
            self.composer.mode_note.setText(
                "" if new == now else f"{new} applies to the next reply; this one stays {now}.")

    def _show_compare_of(self, last: Turn | None) -> None:
        """The Compare view belongs to the shown chat: its last turn's comparison, shown as
        it looked live (from what is stored, ``CompareView.show_turn``), or hidden."""
        if last is not None and last.is_compare and last.versions:
            self.compare_view.show_turn(last)
            self._request_compare_pieces()
        else:
            self.compare_view.hide()

    def _shown_compare(self) -> tuple[int, Turn] | None:
        """(index, turn) of the Compare turn the Compare view shows for the shown chat (its
        last reply), None when the view is hidden or shows a reply being generated."""
        if self.conv is None or self.busy or self.compare_view.isHidden():
            return None
        for i in range(len(self.conv.messages) - 1, -1, -1):
            m = self.conv.messages[i]
            if m.role == "assistant":
                return (i, m) if m.is_compare and m.versions else None
        return None

    def _request_compare_pieces(self) -> None:
        """Ask the worker for the token texts of the shown Compare turn's sides (read back
        without them), so its first divergence is marked as it was live (with a model
        loaded; ``_on_pieces`` shows them)."""
        shown = self._shown_compare()
        if shown is not None:
            self._request_pieces(shown[0])

    def update_settings_note(self) -> None:
        """The composer's one-line summary of the settings a reply will use."""
        v = self.current_settings()
        block = v.get("block_size") or (
            DEFAULT_BLOCK if self.composer.mode() == Mode.LOOKUP else
            self.model.drafter_block_size if self.model else None)
        temp = v.get("temperature", 0.0)
        parts = ["greedy" if temp <= 0 else f"T {temp:g}", f"≤{v.get('max_tokens')} tok"]
        if self.composer.mode() in DRAFTING_MODES:
            parts[:0] = [f"block {block}" if block else "block: drafter's",
                         v.get("rollback", "tape")]
            if v.get("fast_verify"):
                parts.append("fast verify")
        if not v.get("thinking", True):
            parts.append("no thinking")
        self.composer.note.setText("Next reply: " + " · ".join(parts))
        self.composer.note.setToolTip("Settings for the next reply: " + ", ".join(parts)
                                      + " (File › Settings…)")

    def _on_conv_selected(self, conv_id: int) -> None:
        if self.busy:
            return
        conv = self.store.get(conv_id)
        if conv is not None and conv is not self.conv:
            self.select_conversation(conv)

    def show_message_details(self, msg: Turn | None) -> None:
        """Reasoning, tool calls and figures of ``msg`` in the right-hand panes."""
        self.shown_message = msg
        v = msg.version if msg else None
        block = self._block_for(v.result.mode, v.result.block_size) if v \
            else None
        self.details.show_turn(msg, self.model.context_length if self.model else 0, block)

    # ------------------------------------------------------------------ settings
    def current_settings(self) -> dict:
        """Effective settings for the shown conversation (defaults <- overrides)."""
        return settings_mod.effective(self.defaults, self.conv.settings if self.conv else {})

    def open_settings(self) -> None:
        """The settings dialog (non-blocking)."""
        dlg = settings_mod.SettingsDialog(
            self.current_settings(), self,
            max_block=self.model.drafter_block_size if self.model else None)
        dlg.saved.connect(self._on_settings_saved)
        dlg.setModal(True)
        dlg.show()
        self._settings_dialog = dlg

    def _on_settings_saved(self, values: dict, where: str) -> None:
        if where == "defaults":
            self.defaults = values
            settings_mod.save_defaults(self.qs, values)
            self.show_note("Saved as the defaults: every chat without its own settings uses "
                           "them from the next reply.")
        else:
            if self.conv is None and self.new_chat() is None:
                return  # the store could not make one (its banner says why)
            self.conv.settings = {k: v for k, v in values.items()
                                  if v != self.defaults.get(k)}
            self._save(self.conv)
            self.show_note(f"Saved for “{self.conv.title or 'this chat'}”: its next reply "
                           "uses them.")
        self.update_settings_note()

    # ------------------------------------------------------------------ help
    def debug_extra(self) -> dict:
        """Model paths and device for the debug report."""
        m = self.model
        drafter2 = {"DFlash2 drafter": m.drafter2_path} if m and m.drafter2_path else {}
        return {
            "MLX device": (m.device or "unknown") if m else "unknown (no model loaded)",
            "target": m.target_path if m else "none",
            "drafter": (m.drafter_path or "none") if m else "none",
            **drafter2,  # the one loaded beside a DFlash drafter
            "MLX memory (bytes)": self.memory_bytes,
            "log file": str(self.log_path) if self.log_path else "none",
            "BLAS": m.blas if m and m.blas else None,
        }

    def show_about(self) -> None:
        """The About box."""
        dlg = AboutDialog(self.debug_extra(), self.model.card if self.model else "", self)
        dlg.show()
        self._about = dlg

    def copy_debug_info(self) -> None:
        """Versions, device, BLAS and model paths to the clipboard."""
        QGuiApplication.clipboard().setText(debug_info(self.debug_extra()))
        self.flash("Debug info copied", 3000)

    # ------------------------------------------------------------------ lifecycle
    def _restore(self) -> None:
        geo = self.qs.value("window/geometry")
        if isinstance(geo, QByteArray):
            self.restoreGeometry(geo)
        for name, split in (("window/split", self.split), ("window/centre", self.centre_split)):
            val = self.qs.value(name)
            if isinstance(val, QByteArray):
                split.restoreState(val)
        panes = self.qs.value("window/panes")
        try:
            self.split.preferred = [int(panes[0]), int(panes[1])]
        except (TypeError, ValueError, IndexError, KeyError):
            pass  # none saved yet: the default widths
        self.split.grow_back()
        self.composer.set_mode(str(self.qs.value("composer/mode", "dflash")))
        colour = self.qs.value("composer/colour_drafts", False)
        self.composer.colour_box.setChecked(colour in (True, "true", "1", 1))
        last = self.qs.value("last_conversation")
        conv = None
        try:
            conv = self.store.get(int(last)) if last is not None else None
        except (TypeError, ValueError):
            conv = None
        if conv is None:
            convs = self.store.list()
            conv = self.store.get(convs[0].id) if convs else None
        self.select_conversation(conv)
        if self.store.problem:
            self.show_store_problem(
                f"Chats are kept in memory only this time: {self.store.problem}")
            self.store_label.setText("Chats not saved")
            self.store_label.setToolTip("Chats are kept in memory only this time and are "
                                        f"lost at quit: {self.store.problem}")
            self.store_label.show()

    def save_layout(self) -> None:
        """Window geometry, splitter states, the switch and Colour drafts to QSettings."""
        self.qs.setValue("window/geometry", self.saveGeometry())
        self.qs.setValue("window/split", self.split.saveState())
        self.qs.setValue("window/panes", list(self.split.preferred))
        self.qs.setValue("window/centre", self.centre_split.saveState())
        self.qs.setValue("composer/mode", self.composer.mode())
        self.qs.setValue("composer/colour_drafts", self.composer.colour_box.isChecked())
        self.qs.sync()

    def shutdown(self, timeout_ms: int = 15000) -> None:
        """Cancel a running reply, keep its partial text (stored as ``interrupted``: the app
        closed while it was written), stop the worker thread, close the store (a second call
        does nothing). Closing the window, quitting the app and the program's end
        (``atexit``) call it."""
        if getattr(self, "_shut", False):
            return
        self._shut = True
        atexit.unregister(self._at_exit)
        if self.busy:
            if self._run is not None:
                self._run.interrupted = True
            self.wait_until_idle(timeout_ms)
        self.timer.stop()
        self.retry_timer.stop()
        self.save_layout()
        self.stop_serving()
        self.workers.stop(timeout_ms)
        if len(self.pending_writes):  # a last try; else the rows are ``interrupted`` next time
            self.pending_writes.retry(self.store.db)
        try:
            self.store.close()
        except Exception:
            log.exception("closing the store")

    def confirm_quit_while_busy(self) -> bool:
        """Ask whether to quit while a reply is being written (True: quit)."""
        answer = QMessageBox.question(
            self, "Quit while a reply is written?",
            "A reply is still being written. Quit anyway? What it has written so far is kept "
            "and marked “interrupted”.",
            QMessageBox.Yes | QMessageBox.No, QMessageBox.No)
        return answer == QMessageBox.Yes

    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().showEvent(event)
        if not getattr(self, "_shown_once", False):
            self._shown_once = True
            self.composer.edit.setFocus(Qt.OtherFocusReason)  # typing goes to the message

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt override)
        if self.busy and not getattr(self, "_shut", False) and \
                not self.confirm_quit_while_busy():
            event.ignore()
            return
        self.shutdown()
        super().closeEvent(event)

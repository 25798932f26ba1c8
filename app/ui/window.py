"""The main window: conversations (left), chat and composer (centre), reasoning, tool calls
and live figures (right), status bar (loaded pair, memory, load progress).

Everything MLX happens on :class:`app.ui.worker.Worker`'s thread. :class:`MainWindow` builds
the widgets and menus and composes the controllers that act on them, each given the shared
:class:`~app.ui.state.WindowState` and the widgets and worker it uses: ``messages``
(:class:`~app.ui.messages.MessageBar`), ``transcript``
(:class:`~app.ui.transcript.TranscriptController`), ``replies``
(:class:`~app.ui.reply_flow.ReplyController`, which renders the worker's
:class:`~app.ui.worker.UiEvent` batches on a ``RENDER_MS`` timer, never per token),
``models`` (:class:`~app.ui.model_flow.ModelController`), ``conversations``
(:class:`~app.ui.conversation_flow.ConversationController`) and ``serve``
(:class:`~app.ui.serve_flow.ServeController`).
"""

from __future__ import annotations

import atexit
import logging
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QGuiApplication,
    QIcon,
    QKeySequence,
    QShortcut,
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
from app.chat.session import ModelInfo, PairSpec
from app.chat.storage import RESCUE_ADVICE
from app.chat.turns import ConversationView, ViewStore
from app.ui import settings as settings_mod
from app.ui.about import AboutDialog, debug_info
from app.ui.chat import ChatView, Composer
from app.ui.compare import CompareView
from app.ui.conversation_flow import ConversationController
from app.ui.conversation_list import ConversationList
from app.ui.details import DetailsPanel
from app.ui.fit import ElidedLabel
from app.ui.messages import SAVE_RETRY_MS, MessageBar
from app.ui.model_flow import ModelController, default_pair  # noqa: F401 (re-exported)
from app.ui.reply_flow import ReplyController
from app.ui.serve_flow import SERVE_TIP, ServeController
from app.ui.state import WindowState
from app.ui.theme import colours, make_palette, stylesheet
from app.ui.transcript import TranscriptController
from app.ui.worker import Backend, WorkerThread, at_exit

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


class MainWindow(QMainWindow):
    """The DFlash Chat window.

    Args:
        backend: worker backend (default :class:`~app.chat.session.ChatSession`); tests pass
            fakes.
        store: conversation store (default: ``ViewStore(":memory:")``, chats in memory).
        qsettings: where defaults, layout and last model live (default: the app's QSettings).
        auto_load: load the last/default model when shown.
        data_dir: the app's data folder (models list, storage); None for the default.

    Signals: ``replyFinished(object)`` with the finished :class:`~app.chat.turns.Turn`;
    ``modelLoaded(object)`` with the loaded pair's ``ModelInfo``; ``loadFailed(str)`` with
    the message; ``benchFinished(object)`` with the benchmark's result dict, None when it
    failed.

    Attributes:
        state: the shared :class:`~app.ui.state.WindowState` (``conv``, ``model``, ``busy``
            and ``defaults`` are also properties of the window).
        messages, transcript, replies, models, conversations, serve: the controllers (see
            the module doc).
        worker, workers: the worker that owns MLX and its thread.
    """

    replyFinished = Signal(object)
    modelLoaded = Signal(object)
    loadFailed = Signal(str)
    benchFinished = Signal(object)

    def __init__(self, backend: Backend | None = None, store: ViewStore | None = None,
                 qsettings: QSettings | None = None, auto_load: bool = True,
                 data_dir: Path | None = None) -> None:
        super().__init__()
        from app.engine.threads import forbid_engine_on_current_thread

        forbid_engine_on_current_thread()
        self.setWindowTitle(APP_NAME)
        self.setAccessibleName(APP_NAME)
        self.log_path: Path | None = None
        icon = Path(__file__).resolve().parents[2] / "packaging" / "icon" / "dflash_chat.png"
        if icon.is_file():  # a checkout; the frozen app gets its icon from the bundle
            self.setWindowIcon(QIcon(str(icon)))
        self.qs = qsettings or QSettings()
        self.store: ViewStore = store if store is not None else ViewStore(":memory:")
        self.state = WindowState(self.qs, self.store, settings_mod.load_defaults(self.qs),
                                 data_dir)
        self.workers = WorkerThread(backend, self.store.db)  # the worker writes replies
        self.worker = self.workers.worker

        self._build()
        self._compose()
        self._build_menus()
        self.apply_theme()
        try:
            QGuiApplication.styleHints().colorSchemeChanged.connect(lambda *_: self.apply_theme())
        except AttributeError:  # pragma: no cover - Qt < 6.5
            pass
        self.timer = QTimer(self)
        self.timer.setInterval(RENDER_MS)
        self.timer.timeout.connect(self.replies.render_pending)
        self.timer.start()
        self.models.set_intro()
        self.store.on_read_error = self._store_unreadable
        self._restore()
        # the program may end without closing the window (sys.exit in a slot, a script):
        # shut down then too, before Qt's objects go (runs before the worker's own hook)
        self._at_exit = at_exit(self, "shutdown")
        if auto_load:
            QTimer.singleShot(0, self.models.load_last_or_default)

    def _compose(self) -> None:
        """The controllers, each given the state, widgets and worker it uses."""
        st = self.state
        self.messages = MessageBar(st, self.banner, self.banner_row, self.store_banner,
                                   self.store_banner_row, self.store_retry, self.flash_label,
                                   self)
        self.banner_close.clicked.connect(self.messages.dismiss_banner)
        self.store_banner_close.clicked.connect(self.messages.clear_store_problem)
        self.serve = ServeController(st, self.worker, self.messages, self.serve_action,
                                     self.serve_label)
        self.transcript = TranscriptController(st, self.worker, self.messages, self.conv_side,
                                               self.chat, self.composer, self.compare_view,
                                               self.details, self.legend, self)
        self.replies = ReplyController(st, self.worker, self.messages, self.transcript,
                                       self.conv_side, self.chat, self.composer,
                                       self.compare_view, self.centre_split, self.details,
                                       self, self.replyFinished.emit)
        self.transcript.stop_reply = self.replies.wait_until_idle
        self.models = ModelController(st, self.worker, self.messages, self.chat, self.composer,
                                      self.compare_action, self.progress, self.model_label,
                                      self.memory_label, self.statusBar(), self, self.replies,
                                      self.serve, self.transcript, self.modelLoaded.emit,
                                      self.loadFailed.emit, self.benchFinished.emit)
        self.conversations = ConversationController(st, self.conv_side, self.messages,
                                                    self.transcript, self.replies, self)
        self.chat.linkActivated.connect(self._on_chat_link)

    # the state most callers (main, tools, tests) read, and the actions they take
    @property
    def conv(self) -> ConversationView | None:
        """The shown conversation (``WindowState.conv``)."""
        return self.state.conv

    @property
    def model(self) -> ModelInfo | None:
        """The loaded pair, None when none is (``WindowState.model``)."""
        return self.state.model

    @property
    def busy(self) -> bool:
        """Whether a reply is being generated (``WindowState.busy``)."""
        return self.state.busy

    @property
    def defaults(self) -> dict:
        """The default reply settings (``WindowState.defaults``)."""
        return self.state.defaults

    @defaults.setter
    def defaults(self, values: dict) -> None:
        self.state.defaults = values

    def load_model(self, target: PairSpec | str, drafter: str = "") -> None:
        """Load a pair on the worker (``ModelController.load_model``)."""
        self.models.load_model(target, drafter)

    def new_chat(self) -> ConversationView | None:
        """Start a new conversation and show it (``TranscriptController.new_chat``)."""
        return self.transcript.new_chat()

    def select_conversation(self, conv: ConversationView | None) -> None:
        """Show ``conv`` (``TranscriptController.select_conversation``)."""
        self.transcript.select_conversation(conv)

    def send(self, text: str) -> bool:
        """Send ``text`` and generate a reply (``ReplyController.send``)."""
        return self.replies.send(text)

    def stop(self) -> None:
        """Stop the running reply (``ReplyController.stop``)."""
        self.replies.stop()

    def _on_chat_link(self, link: str) -> None:
        """A link in the conversation view: the shown chat's own links go to the transcript,
        the ones that start a reply (an example, Continue, Edit) to the replies."""
        if self.transcript.on_link(link):
            return
        kind, _, arg = link.partition(":")
        try:
            if kind == "example":
                self.replies.send_example(int(arg))
            elif kind == "continue":
                self.replies.continue_reply()
            elif kind == "edit":
                self.replies.edit_message(int(arg))
        except ValueError:
            return

    # ------------------------------------------------------------------ layout
    def _build(self) -> None:
        st = self.style()
        # left: conversations
        self.conv_side = ConversationList(self.store)
        self.conv_list, self.search_box = self.conv_side.list, self.conv_side.search_box
        left = self.conv_side

        # centre: banner, chat, compare, composer
        self.banner = QLabel("")
        self.banner.setObjectName("banner")
        self.banner.setWordWrap(True)
        self.banner.setAccessibleName("Message")
        self.banner_close = QToolButton()
        self.banner_close.setIcon(st.standardIcon(QStyle.SP_DialogCloseButton))
        self.banner_close.setAccessibleName("Dismiss message")
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
        # shown while a write the store could not take is kept: tries it again now
        self.store_retry = QPushButton("Retry now")
        self.store_retry.setAccessibleName("Retry saving now")
        self.store_retry.setToolTip("Try the unsaved writes again now (they are tried every "
                                    f"{SAVE_RETRY_MS / 1000:g} s anyway)")
        self.store_retry.hide()
        self.store_banner_row = QWidget()
        sr = QHBoxLayout(self.store_banner_row)
        sr.setContentsMargins(12, 8, 12, 0)
        sr.addWidget(self.store_banner, 1)
        sr.addWidget(self.store_retry)
        sr.addWidget(self.store_banner_close)
        self.store_banner_row.hide()
        self.chat = ChatView()
        self.chat.rendered.connect(lambda conv, _streaming: self._update_chat_actions(conv))
        self.legend = QLabel("")
        self.legend.setObjectName("legend")
        self.legend.setAccessibleName("Colour drafts legend")
        self.legend.setContentsMargins(12, 4, 12, 0)
        self.legend.setWordWrap(True)
        self.legend.hide()
        self.compare_view = CompareView()
        self.compare_view.hide()
        self.composer = Composer()
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
        # no Tab stop of its own (it showed nothing): Tab goes to the panes and buttons in
        # it, and the scroll area brings the focused one into view
        right.setFocusPolicy(Qt.NoFocus)
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
        # lasting while chats are kept in memory only, after its banner was dismissed too
        self.store_label = QLabel("")
        self.store_label.setAccessibleName("Storage")
        self.store_label.hide()
        # lasting while File › Serve on localhost serves (its address)
        self.serve_label = QLabel("")
        self.serve_label.setAccessibleName("Local server")
        self.serve_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.serve_label.hide()
        sb = self.statusBar()
        sb.addWidget(self.model_label)
        sb.addWidget(self.flash_label, 1)
        sb.addPermanentWidget(self.serve_label)
        sb.addPermanentWidget(self.store_label)
        sb.addPermanentWidget(self.progress)
        sb.addPermanentWidget(self.memory_label)
        self.setMinimumSize(MIN_WIDTH, MIN_HEIGHT)
        self.resize(1280, 800)

        # the actions a controller keeps in step (File › Serve on localhost, Chat › Compare);
        # the menus are built once the controllers are
        self.serve_action = QAction("Serve on localhost", self)
        self.serve_action.setCheckable(True)
        self.serve_action.setToolTip(SERVE_TIP)
        self.compare_action = QAction("Compare plain and DFlash", self)
        self.compare_action.setShortcut(QKeySequence("Ctrl+Shift+C"))
        self.compare_action.triggered.connect(lambda _checked=False: self.composer._compare())

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
        models, chats = self.models, self.conversations
        self.new_action = act(f, "New chat", self.transcript.new_chat, QKeySequence.New)
        act(f, "Models…", models.open_models, "Ctrl+M", QStyle.SP_DriveHDIcon)
        act(f, "Open model folder…", models.open_model_dialog, "Ctrl+O", QStyle.SP_DirOpenIcon)
        act(f, "Use default model", models.load_default)
        act(f, "Unload model", models.unload_asking)
        f.addAction(self.serve_action)
        f.addSeparator()
        act(f, "Export chat…", chats.export_chat, "Ctrl+E")
        act(f, "Import chat…", chats.import_chat)
        f.addSeparator()
        # Ctrl+, (Cmd+, on macOS, where Qt reads Ctrl as Cmd) on every platform:
        # QKeySequence.Preferences has no key on Linux or Windows
        self.settings_action = act(f, "Settings…", self.transcript.open_settings, "Ctrl+,")
        f.addSeparator()
        act(f, "Quit", self.close, QKeySequence.Quit)
        c = mb.addMenu("&Chat")
        c.setToolTipsVisible(True)  # a disabled item says why (Regenerate on a Compare turn)
        self.send_action = act(c, "Send", lambda: self.composer._send(), "Ctrl+Return")
        self.stop_action = act(c, "Stop", self.replies.stop, "Esc")
        c.addAction(self.compare_action)
        self.regen_action = act(c, "Regenerate last reply", self.replies.regenerate, "Ctrl+R")
        # the shortcut of a menu item that is off does nothing at all: while Regenerate is
        # off, Ctrl+R says why instead (one of the two is on at a time)
        self.regen_why = QShortcut(QKeySequence("Ctrl+R"), self)
        self.regen_why.activated.connect(self._say_why_no_regen)
        self.bench_action = act(c, "Run short benchmark", lambda: models.run_benchmark())
        self.rename_action = act(c, "Rename chat…", chats.rename_chat, "F2")
        self.delete_action = act(c, "Delete chat", chats.delete_chat)
        self._update_chat_actions(None)
        h = mb.addMenu("&Help")
        act(h, "About DFlash Chat", self.show_about)
        act(h, "Copy debug info", self.copy_debug_info)

    REGEN_TIP = "Generate a new version of the last reply in the selected mode."
    REGEN_COMPARE_TIP = ("A Compare turn cannot be regenerated: its sides are its versions. "
                         "Pick one with “continue from … instead” under the reply, or send "
                         "the prompt again.")
    REGEN_NONE_TIP = "There is no reply to regenerate yet."

    def _update_chat_actions(self, conv) -> None:
        """Keep the Chat menu's items on the shown conversation ``conv`` (None: no chat is
        shown): Rename chat and Delete chat only while there is one, Regenerate as
        :meth:`_update_regen_action` says."""
        self.rename_action.setEnabled(conv is not None)
        self.delete_action.setEnabled(conv is not None)
        self._update_regen_action(conv)

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
        self.regen_why.setEnabled(not ok)

    def _say_why_no_regen(self) -> None:
        """Ctrl+R while Chat › Regenerate is off: say why (its tooltip) in a note."""
        self.messages.show_note(self.regen_action.toolTip())

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
        self.chat.render(self.state.conv, streaming=self.state.busy)

    # ------------------------------------------------------------------ help
    def debug_extra(self) -> dict:
        """Model paths and device for the debug report."""
        m = self.state.model
        drafter2 = {"DFlash2 drafter": m.drafter2_path} if m and m.drafter2_path else {}
        return {
            "MLX device": (m.device or "unknown") if m else "unknown (no model loaded)",
            "target": m.target_path if m else "none",
            "drafter": (m.drafter_path or "none") if m else "none",
            **drafter2,  # the one loaded beside a DFlash drafter
            "MLX memory (bytes)": self.state.memory_bytes,
            "log file": str(self.log_path) if self.log_path else "none",
            "BLAS": m.blas if m and m.blas else None,
        }

    def show_about(self) -> None:
        """The About box."""
        m = self.state.model
        dlg = AboutDialog(self.debug_extra(), m.card if m else "", self)
        dlg.show()
        self._about = dlg

    def copy_debug_info(self) -> None:
        """Versions, device, BLAS and model paths to the clipboard."""
        QGuiApplication.clipboard().setText(debug_info(self.debug_extra()))
        self.messages.flash("Debug info copied", 3000)

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
        self.transcript.select_conversation(conv)
        if self.store.problem:
            self.messages.show_store_problem(
                f"Chats are kept in memory only this time: {self.store.problem}")
            self.store_label.setText("Chats not saved")
            self.store_label.setToolTip("Chats are kept in memory only this time and are "
                                        f"lost at quit: {self.store.problem}")
            self.store_label.show()

    def _store_unreadable(self, error: str) -> None:
        """A read of the conversation database met damage (``ViewStore.on_read_error``, told
        once a run): say so in the storage banner (the chats that could be read stay)."""
        self.messages.show_store_problem(
            f"Some saved chats could not be read: {error}. The database is damaged: quit and "
            f"copy it aside. {RESCUE_ADVICE}")

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
        if self.state.busy:
            if self.replies.run is not None:
                self.replies.run.interrupted = True
            self.replies.wait_until_idle(timeout_ms)
        self.timer.stop()
        self.messages.retry_timer.stop()
        self.save_layout()
        self.serve.stop_serving()
        self.workers.stop(timeout_ms)
        pending = self.state.pending_writes
        if len(pending):  # a last try; else the rows are ``interrupted`` next time
            pending.retry(self.store.db)
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
        if self.state.busy and self.replies.writing and not getattr(self, "_shut", False) \
                and not self.confirm_quit_while_busy():
            event.ignore()
            return
        self.shutdown()
        super().closeEvent(event)

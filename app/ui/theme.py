"""Light and dark palettes that follow the system colour scheme, and the app's stylesheet.

The scheme comes from ``QStyleHints.colorScheme()`` (Qt >= 6.5); the window re-applies the
theme when it changes. Colours are a calm slate/teal set chosen for this app.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette

LIGHT = {
    "window": "#f6f7f9",
    "base": "#ffffff",
    "alt": "#eef1f4",
    "text": "#1f2328",
    "muted": "#667085",
    "accent": "#0f7b8a",
    "accent_text": "#ffffff",
    "border": "#d9dee5",
    "code_bg": "#f0f2f5",
    "user_bg": "#e8f3f5",
    "draft_bg": "#d6f0dd",
    "diff_bg": "#ffd7d5",
    "bar": "#2a9d8f",
    "bar_full": "#1d6f8a",
    "error": "#b42318",
}

DARK = {
    "window": "#1b1e23",
    "base": "#23272e",
    "alt": "#2b3038",
    "text": "#e6e8eb",
    "muted": "#9aa4b2",
    "accent": "#4fb8c4",
    "accent_text": "#0d1117",
    "border": "#3a404a",
    "code_bg": "#2d333b",
    "user_bg": "#213038",
    "draft_bg": "#1f4a33",
    "diff_bg": "#6b2b2b",
    "bar": "#3fb9a8",
    "bar_full": "#58a6d6",
    "error": "#ff7b72",
}


KEYBOARD_FOCUS = "keyboardFocus"
"""A bool property of the chat (:class:`app.ui.chat.ChatView`): True when it has or last had
the focus from the keyboard (Tab, Backtab, a shortcut), False from a click. Qt stylesheets
have no ``:focus-visible``; the chat's focus border is keyed on this instead."""

FIGURE_VALUE_PX = 17
"""The figure tiles' value size in pixels (a value too long for its tile is set smaller:
``app.ui.panels.FigureValue``)."""


def system_is_dark() -> bool:
    """True when the platform asks for a dark colour scheme."""
    app = QGuiApplication.instance()
    if app is None:
        return False
    try:
        return app.styleHints().colorScheme() == Qt.ColorScheme.Dark
    except AttributeError:  # pragma: no cover - Qt < 6.5
        return app.palette().color(QPalette.Window).lightness() < 128


def colours(dark: bool | None = None) -> dict:
    """The colour dict for ``dark`` (None: follow the system)."""
    if dark is None:
        dark = system_is_dark()
    return DARK if dark else LIGHT


def make_palette(c: dict) -> QPalette:
    """A :class:`QPalette` from a colour dict."""
    p = QPalette()
    p.setColor(QPalette.Window, QColor(c["window"]))
    p.setColor(QPalette.WindowText, QColor(c["text"]))
    p.setColor(QPalette.Base, QColor(c["base"]))
    p.setColor(QPalette.AlternateBase, QColor(c["alt"]))
    p.setColor(QPalette.Text, QColor(c["text"]))
    p.setColor(QPalette.Button, QColor(c["alt"]))
    p.setColor(QPalette.ButtonText, QColor(c["text"]))
    p.setColor(QPalette.Highlight, QColor(c["accent"]))
    p.setColor(QPalette.HighlightedText, QColor(c["accent_text"]))
    p.setColor(QPalette.ToolTipBase, QColor(c["base"]))
    p.setColor(QPalette.ToolTipText, QColor(c["text"]))
    p.setColor(QPalette.PlaceholderText, QColor(c["muted"]))
    p.setColor(QPalette.Link, QColor(c["accent"]))
    p.setColor(QPalette.Disabled, QPalette.Text, QColor(c["muted"]))
    p.setColor(QPalette.Disabled, QPalette.ButtonText, QColor(c["muted"]))
    return p


def stylesheet(c: dict) -> str:
    """The app stylesheet for colour dict ``c``.

    Every control Tab reaches shows that it has the focus (a stylesheet that sets borders
    hides Qt's own focus frame): fields, lists and views draw their border in the accent,
    buttons and check boxes in the text colour; combo and spin boxes keep the platform's
    frame and arrows (a border of their own would drop the arrows) and are tinted instead,
    the combo box's text in the accent. The chat list and the chat have a transparent
    border, so that the focused one's does not move their contents. The chat draws its
    border only when the focus came by keyboard (its :data:`KEYBOARD_FOCUS` property, as a
    browser's ``:focus-visible``): a click to select text or follow a link draws none (its
    ``#chat`` rule outweighs the ``QTextEdit:focus`` one)."""
    return f"""
    QWidget {{ font-size: 13px; }}
    QSplitter::handle {{ background: {c['border']}; }}
    QSplitter::handle:horizontal {{ width: 1px; }}
    QSplitter::handle:vertical {{ height: 1px; }}
    QListWidget#conversations {{ background: {c['alt']}; border: 1px solid transparent;
        padding: 5px; }}
    QListWidget#conversations::item {{ padding: 7px 8px; border-radius: 6px; }}
    QListWidget#conversations::item:selected {{ background: {c['accent']};
        color: {c['accent_text']}; }}
    QTextBrowser#chat {{ background: {c['base']}; border: 1px solid transparent;
        padding: 7px 15px; }}
    QPlainTextEdit#composer {{ background: {c['base']}; border: 1px solid {c['border']};
        border-radius: 8px; padding: 6px; }}
    QLineEdit {{ background: {c['base']}; border: 1px solid {c['border']}; border-radius: 6px;
        padding: 4px 6px; }}
    QPlainTextEdit#composer:focus {{ border: 1px solid {c['accent']}; }}
    QPushButton {{ padding: 5px 12px; border-radius: 6px; border: 1px solid {c['border']};
        background: {c['base']}; }}
    QPushButton:hover {{ border-color: {c['accent']}; }}
    QPushButton#send {{ background: {c['accent']}; color: {c['accent_text']};
        border: none; font-weight: 600; }}
    QPushButton#send:disabled {{ background: {c['border']}; color: {c['muted']}; }}
    QPushButton#send:focus {{ border: 1px solid {c['text']}; padding: 4px 11px; }}
    QPushButton:checked {{ background: {c['accent']}; color: {c['accent_text']};
        border-color: {c['accent']}; font-weight: 600; }}
    QPushButton#segLeft {{ border-top-right-radius: 0; border-bottom-right-radius: 0;
        margin-right: 0; min-width: 44px; padding: 5px 8px; }}
    QPushButton#segRight {{ border-top-left-radius: 0; border-bottom-left-radius: 0;
        margin-left: 0; border-left: none; min-width: 44px; padding: 5px 8px; }}
    QPushButton#segMid {{ border-radius: 0; margin-left: 0; margin-right: 0; border-left: none;
        min-width: 44px; padding: 5px 8px; }}
    QPushButton#segLeft:checked, QPushButton#segRight:checked, QPushButton#segMid:checked {{
        font-weight: normal; }}
    QPushButton:focus, QPushButton:checked:focus {{ border-color: {c['text']}; }}
    QFrame#side {{ background: {c['window']}; }}
    QLabel#sectionTitle {{ font-weight: 600; color: {c['text']}; }}
    QLabel#figureValue {{ font-size: {FIGURE_VALUE_PX}px; font-weight: 600; color: {c['text']}; }}
    QLabel#figureName {{ color: {c['muted']}; font-size: 11px; }}
    QLabel#muted {{ color: {c['muted']}; }}
    QFrame#figure {{ background: {c['base']}; border: 1px solid {c['border']};
        border-radius: 8px; }}
    QLabel#banner {{ background: {c['diff_bg']}; color: {c['text']}; padding: 6px 10px;
        border-radius: 6px; }}
    QLabel#banner[kind="note"] {{ background: {c['user_bg']}; color: {c['text']}; }}
    QTreeWidget, QPlainTextEdit {{ background: {c['base']}; border: 1px solid {c['border']};
        border-radius: 6px; }}
    QToolButton#collapse {{ border: none; font-weight: 600; }}
    QStatusBar {{ color: {c['muted']}; }}
    QLineEdit:focus, QPlainTextEdit:focus, QTextEdit:focus, QListView:focus, QTreeView:focus,
    QTableView:focus, QListWidget#conversations:focus,
    QTextBrowser#chat[{KEYBOARD_FOCUS}="true"]:focus {{ border: 1px solid {c['accent']}; }}
    QToolButton:focus, QToolButton#collapse:focus, QCheckBox:focus, QTabBar::tab:focus {{
        border: 1px solid {c['text']}; border-radius: 4px; }}
    QComboBox:focus {{ background: {c['user_bg']}; color: {c['accent']}; }}
    QSpinBox:focus, QDoubleSpinBox:focus {{ background: {c['user_bg']}; }}
    """

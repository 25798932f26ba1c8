"""Widgets that keep their contents whole at any width the window allows.

:class:`FlowLayout` lays its widgets out in a row and wraps them onto more lines when the row
does not fit (each widget always gets its size hint, so no label is cut); :class:`ElidedLabel`
is a one-line label that may be narrower than its text: it then ends in "…" and its tooltip
gives the whole text; :class:`ShortWhenNarrowLabel` wraps, and switches to a shorter form of
its text when the full one would not keep to one line per line.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtGui import QFontMetricsF, QPainter
from PySide6.QtWidgets import QLabel, QLayout, QSizePolicy, QStyleOption, QWidget


class FlowLayout(QLayout):
    """A row of widgets that wraps onto further lines when it is too narrow.

    Every widget gets its ``sizeHint()`` (never less), so a button's label is never cut; a
    line holds as many widgets as fit, in order. Widgets added with ``right=True`` sit at the
    right end of their line (e.g. the composer's Compare and Send). The layout has a height
    for its width (``heightForWidth``), so the widget above it grows a line when it wraps.

    Args:
        parent: the widget to lay out (optional).
        h_spacing, v_spacing: pixels between widgets on a line, and between lines.
    """

    def __init__(self, parent: QWidget | None = None, h_spacing: int = 6,
                 v_spacing: int = 6) -> None:
        super().__init__(parent)
        self._items: list = []
        self._right: set[int] = set()
        self.h_spacing, self.v_spacing = h_spacing, v_spacing
        self.setContentsMargins(0, 0, 0, 0)

    # ---- QLayout's interface
    def add_widget(self, widget: QWidget, right: bool = False) -> None:
        """Add ``widget`` at the end (``right``: at the right end of its line)."""
        self.addWidget(widget)
        if right:
            self._right.add(id(widget))

    def addItem(self, item) -> None:  # noqa: N802 (Qt override)
        """Qt's hook for :meth:`addWidget`: keep ``item`` at the end."""
        self._items.append(item)

    def count(self) -> int:
        """The number of items."""
        return len(self._items)

    def itemAt(self, index: int):  # noqa: N802 (Qt override)
        """The item at ``index`` (None past the end)."""
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int):  # noqa: N802 (Qt override)
        """Remove and return the item at ``index`` (None past the end)."""
        if 0 <= index < len(self._items):
            item = self._items.pop(index)
            if item.widget() is not None:
                self._right.discard(id(item.widget()))
            return item
        return None

    def expandingDirections(self) -> Qt.Orientation:  # noqa: N802 (Qt override)
        """Neither: the widgets keep their size hints."""
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:  # noqa: N802 (Qt override)
        """True: the height depends on how many lines the width needs."""
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 (Qt override)
        """The height the widgets need at ``width`` pixels (margins included)."""
        return self._do_layout(QRect(0, 0, width, 0), apply=False)

    def setGeometry(self, rect: QRect) -> None:  # noqa: N802 (Qt override)
        """Place the widgets in ``rect``."""
        super().setGeometry(rect)
        self._do_layout(rect, apply=True)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        """Everything on one line."""
        shown = self._shown()
        m = self.contentsMargins()
        if not shown:
            return QSize(m.left() + m.right(), m.top() + m.bottom())
        w = sum(i.sizeHint().width() for i in shown) + self.h_spacing * (len(shown) - 1)
        h = max(i.sizeHint().height() for i in shown)
        return QSize(w + m.left() + m.right(), h + m.top() + m.bottom())

    def minimumSize(self) -> QSize:  # noqa: N802 (Qt override)
        """The widest widget (each on its own line), and one line's height."""
        shown = self._shown()
        m = self.contentsMargins()
        w = max((i.sizeHint().width() for i in shown), default=0)
        h = max((i.sizeHint().height() for i in shown), default=0)
        return QSize(w + m.left() + m.right(), h + m.top() + m.bottom())

    # ---- the lines
    def _shown(self) -> list:
        return [i for i in self._items if not i.isEmpty()]

    def _lines(self, width: int) -> list[list]:
        """The shown items, line by line, for a content ``width``."""
        lines: list[list] = [[]]
        used = 0
        for item in self._shown():
            w = item.sizeHint().width()
            need = w if not lines[-1] else used + self.h_spacing + w
            if lines[-1] and need > width:
                lines.append([item])
                used = w
            else:
                lines[-1].append(item)
                used = need
        return [ln for ln in lines if ln]

    def _do_layout(self, rect: QRect, apply: bool) -> int:
        """Place the lines in ``rect`` (``apply`` False: only measure); the height used."""
        m = self.contentsMargins()
        area = rect.adjusted(m.left(), m.top(), -m.right(), -m.bottom())
        y = area.y()
        for n, line in enumerate(self._lines(area.width())):
            if n:
                y += self.v_spacing
            height = max(i.sizeHint().height() for i in line)
            if apply:
                self._place(line, area, y, height)
            y += height
        return y - area.y() + m.top() + m.bottom()

    def _place(self, line: list, area: QRect, y: int, height: int) -> None:
        """One line: its left items from the left edge, its right items at the right edge,
        each centred in the line's height."""
        x = area.x()
        for item in (i for i in line if id(i.widget()) not in self._right):
            size = item.sizeHint()
            item.setGeometry(QRect(QPoint(x, y + (height - size.height()) // 2), size))
            x += size.width() + self.h_spacing
        x = area.x() + area.width()
        for item in reversed([i for i in line if id(i.widget()) in self._right]):
            size = item.sizeHint()
            x -= size.width()
            item.setGeometry(QRect(QPoint(x, y + (height - size.height()) // 2), size))
            x -= self.h_spacing


class ElidedLabel(QLabel):
    """A one-line label that may be narrower than its text: the text then ends in "…" and
    the tooltip says it whole. :meth:`text` is always the whole text."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        # prefers its whole text, shrinks down to "…" (minimumSizeHint)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Preferred)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        """As narrow as "…" (the layout may give it less than its text)."""
        hint = super().minimumSizeHint()
        return QSize(self.fontMetrics().horizontalAdvance("…") + 4, hint.height())

    def elided(self) -> bool:
        """True when the shown text is shortened."""
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def paintEvent(self, _event) -> None:  # noqa: N802 (Qt override)
        p = QPainter(self)
        opt = QStyleOption()
        opt.initFrom(self)
        shown = self.fontMetrics().elidedText(self.text(), Qt.ElideRight,
                                              self.contentsRect().width())
        self.style().drawItemText(p, self.contentsRect(), int(self.alignment()), opt.palette,
                                  self.isEnabled(), shown, self.foregroundRole())
        p.end()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self._update_tip()

    def setText(self, text: str) -> None:  # noqa: N802 (Qt override)
        """Show ``text`` (shortened with "…" when it does not fit)."""
        super().setText(text)
        self._update_tip()

    def _update_tip(self) -> None:
        self.setToolTip(self.text() if self.elided() else "")



class WrapLabel(QLabel):
    """A word-wrapped label that prefers its text on one line: its size hint is the whole
    line (QLabel's own would wrap a short text into two balanced lines), and a narrower
    width wraps it, its height following (``heightForWidth``), so it is never cut.
    ``hide_empty``: the label hides while it has no text (it then takes no line)."""

    def __init__(self, text: str = "", parent: QWidget | None = None,
                 hide_empty: bool = False) -> None:
        super().__init__(text, parent)
        self.setWordWrap(True)
        self.hide_empty = hide_empty
        if hide_empty and not text:
            self.hide()

    def setText(self, text: str) -> None:  # noqa: N802 (Qt override)
        """Show ``text`` (and the label itself, unless it hides while empty)."""
        super().setText(text)
        if self.hide_empty:
            self.setVisible(bool(text))

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        """The text on one line (the longest line of a text with line breaks)."""
        m = self.contentsMargins()
        fm = QFontMetricsF(self.font())
        lines = self.text().split("\n") if self.text() else [""]
        # the fractional advance rounded up (the whole-pixel one may round down and wrap the
        # last word), plus a pixel for the text layout's own rounding
        w = math.ceil(max(fm.horizontalAdvance(line) for line in lines)) + 1
        w += m.left() + m.right() + 2 * self.margin()
        return QSize(w, self.heightForWidth(w))


class FullHeightLabel(WrapLabel):
    """A :class:`WrapLabel` whose minimum height follows its width: the lines its text wraps
    into at the width it was given. Layouts inside a scroll area or a tab widget lay a
    word-wrapped label out at the height of its unwrapped text, so a label that wraps to two
    lines would be drawn over the widget above it (a Compare side's figures over its text, at
    900x600); with the minimum the layout keeps room for every line, and the scroll area
    scrolls instead."""

    def _fit_height(self, width: int) -> None:
        h = self.heightForWidth(width) if self.text() else 0
        if h > 0 and h != self.minimumHeight():
            self.setMinimumHeight(h)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt override)
        """Show ``text`` and keep room for its lines at the present width."""
        super().setText(text)
        self._fit_height(self.width())

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self._fit_height(event.size().width())


class ShortWhenNarrowLabel(WrapLabel):
    """A :class:`WrapLabel` with a full and a short form of its text (:meth:`set_forms`): it
    shows the full form while every line of it fits the label's width (or before the label is
    shown), and the short form otherwise, with the full one in its tooltip. ``help`` is added
    to the tooltip in either case."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("", parent)
        self.full = ""
        self.short = ""
        self.help = ""

    def set_forms(self, full: str, short: str | None = None, help: str = "") -> None:
        """Set the two forms (``short`` None: the full one at every width) and the help."""
        self.full, self.short, self.help = full, full if short is None else short, help
        self._choose()

    def fits(self) -> bool:
        """Whether each line of the full form fits the label's current width."""
        if not self.isVisible():
            return True
        fm = QFontMetricsF(self.font())
        room = self.contentsRect().width() - 2 * self.margin()
        return all(math.ceil(fm.horizontalAdvance(line)) + 1 <= room
                   for line in self.full.split("\n"))

    def _choose(self) -> None:
        full = self.fits() or self.short == self.full
        text = self.full if full else self.short
        if text != self.text():
            super().setText(text)
        tip = self.help if full else "\n\n".join(t for t in (self.full, self.help) if t)
        self.setToolTip(tip)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self._choose()

    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().showEvent(event)
        self._choose()

"""Compare: the same prompt through plain and DFlash, side by side.

The first token where the two outputs differ is highlighted on both sides; when they agree
the header says "identical, N tokens"; when they differ it gives the target's top-two logit gap
at the first divergence (computed on the worker). Each side shows its figures; the header gives the
speed ratio (DFlash tok/s / plain tok/s). The user picks the version the conversation
continues from (DFlash's by default).
"""

from __future__ import annotations

import html

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
)

from app.engine.compare import first_divergence
from app.ui.render import SECTION_TITLES, mark_section, sections_html


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token that differs between ``a`` and ``b`` (token id lists); when
    one is a prefix of the other, the shorter length; None when they are equal
    (``app.engine.compare.first_divergence``)."""
    return first_divergence(a, b)


def verdict(plain, dflash) -> str:
    """Header text for two :class:`~app.ui.worker.ReplyResult` objects."""
    diff = first_difference(plain.tokens, dflash.tokens)
    rounds = max(getattr(plain, "rounds", 1), getattr(dflash, "rounds", 1))
    if diff is None:
        text = f"identical, {len(plain.tokens)} tokens"
        if rounds > 1:
            text += " in the last round (the answer after the tool calls)"
    else:
        gap = getattr(dflash, "top2_gap", None)
        gap = "" if gap is None else f"; top-two logit gap there {gap:.3g}"
        text = f"differ from token {diff} (of {len(plain.tokens)} plain / " \
               f"{len(dflash.tokens)} DFlash{gap})"
    where = mark_section(plain.pieces or dflash.pieces, diff) if diff is not None else None
    if where:
        text += f" · first divergence in the {SECTION_TITLES[where].lower()} (marked)"
    ps, ds = plain.summary, dflash.summary
    if ps is not None and ds is not None and ps.tok_per_s > 0:
        text += f" · DFlash {ds.tok_per_s / ps.tok_per_s:.2f}× plain speed"
    return text


def pieces_html(pieces: list[str], mark: int | None, colours: dict) -> str:
    """Token texts as HTML, the token at index ``mark`` on the highlight colour."""
    out = []
    for i, p in enumerate(pieces):
        body = html.escape(p).replace("\n", "<br>")
        if i == mark:
            body = (f'<span style="background-color:{colours.get("diff_bg", "#fdd")};">'
                    f"{body or '∅'}</span>")
        out.append(body)
    if mark is not None and mark >= len(pieces):
        out.append(f'<span style="background-color:{colours.get("diff_bg", "#fdd")};">'
                   "[ended]</span>")
    return "<p>" + "".join(out) + "</p>"


def text_sections_html(result, colours: dict) -> str:
    """A side without token texts: its reasoning, answer and tool calls as sections."""
    muted = colours.get("muted", "#667085")
    out = []
    for title, body in (("Reasoning", result.reasoning), ("Answer", result.content),
                        ("Tool calls", "<br>".join(
                            html.escape(f"{c.get('name')}({c.get('arguments')})")
                            for c in result.tool_calls or []))):
        if body.strip():
            text = body if title == "Tool calls" else html.escape(body.strip()).replace(
                "\n", "<br>")
            out.append(f'<p style="color:{muted}; font-size:small;"><b>{title}</b></p>'
                       f"<p>{text}</p>")
    return "".join(out) or "<p></p>"


def side_figures(result) -> str:
    """One line of figures for a side."""
    s = result.summary
    if s is None:
        return "no figures"
    parts = [f"{s.tok_per_s:.1f} tok/s", f"{s.generated_tokens} tokens",
             f"first token {s.ttft_s * 1000:.0f} ms"]
    if result.mode == "dflash":
        if s.tau is not None:
            parts.append(f"τ {s.tau:.2f}")
        if s.acceptance_rate is not None:
            parts.append(f"acceptance {s.acceptance_rate * 100:.0f}%")
        parts.append(f"{s.replays} replays")
    return " · ".join(parts)


class CompareView(QFrame):
    """Side-by-side view of a Compare turn. ``chosen(str)`` emits "plain" or "dflash"."""

    chosen = Signal(str)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("side")
        self.header = QLabel("")
        self.header.setObjectName("sectionTitle")
        self.header.setAccessibleName("Comparison result")
        self.colours: dict = {}
        self.texts: dict[str, QTextBrowser] = {}
        self.figs: dict[str, QLabel] = {}
        self.buttons: dict[str, QPushButton] = {}
        grid = QGridLayout()
        for col, (key, title) in enumerate((("plain", "Plain"), ("dflash", "DFlash"))):
            t = QLabel(title)
            t.setObjectName("sectionTitle")
            tb = QTextBrowser()
            tb.setAccessibleName(f"{title} reply")
            fig = QLabel("")
            fig.setObjectName("figureName")
            fig.setWordWrap(True)
            btn = QPushButton(f"Continue from {title}")
            btn.setCheckable(True)
            btn.setAccessibleName(f"Continue from {title}")
            btn.clicked.connect(lambda _=False, k=key: self._choose(k))
            grid.addWidget(t, 0, col)
            grid.addWidget(tb, 1, col)
            grid.addWidget(fig, 2, col)
            grid.addWidget(btn, 3, col)
            self.texts[key], self.figs[key], self.buttons[key] = tb, fig, btn
        top = QHBoxLayout()
        top.addWidget(self.header, 1)
        self.close_btn = QPushButton("Hide")
        self.close_btn.setAccessibleName("Hide comparison")
        self.close_btn.clicked.connect(self.hide)
        top.addWidget(self.close_btn)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 8, 12, 8)
        lay.addLayout(top)
        lay.addLayout(grid)
        self.results: dict = {}

    def _choose(self, key: str) -> None:
        self.set_choice(key)
        self.chosen.emit(key)

    def set_choice(self, key: str) -> None:
        """Check the button of the version the conversation continues from."""
        for k, b in self.buttons.items():
            b.setChecked(k == key)

    def show_running(self, which: str) -> None:
        """Header while a side is generating."""
        self.header.setText(f"Comparing… running {'DFlash' if which == 'dflash' else 'plain'}")

    def stream(self, key: str, text: str) -> None:
        """Show a side's streaming text (plain text)."""
        tb = self.texts[key]
        tb.setPlainText(text)
        tb.verticalScrollBar().setValue(tb.verticalScrollBar().maximum())

    def set_results(self, plain, dflash, chosen: str = "dflash") -> None:
        """Show two finished :class:`~app.ui.worker.ReplyResult`; either may be None (stopped
        before it ran)."""
        self.results = {"plain": plain, "dflash": dflash}
        mark = None
        if plain is not None and dflash is not None:
            mark = first_difference(plain.tokens, dflash.tokens)
            self.header.setText(verdict(plain, dflash))
        else:
            self.header.setText("comparison stopped before both sides ran")
        for key, r in self.results.items():
            if r is None:
                self.texts[key].setPlainText("")
                self.figs[key].setText("not run")
                self.buttons[key].setEnabled(False)
                continue
            self.buttons[key].setEnabled(True)
            if r.pieces:
                self.texts[key].setHtml(sections_html(r.pieces, mark, self.colours,
                                                      r.tool_calls))
            else:  # no token texts: the stored text, sections from the reply's fields
                self.texts[key].setHtml(text_sections_html(r, self.colours))
            self.figs[key].setText(side_figures(r))
        self.set_choice(chosen)


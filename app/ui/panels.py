"""Right-hand panes: the live figures panel with its per-cycle chart, the tool-call pane and
a collapsible section container.

Figure definitions (tooltips) are the engine's (``app/engine/events.py``, after the DFlash
paper): acceptance rate = accepted drafts / drafted; tau = mean tokens committed per verify
cycle; replays = cycles whose recurrent state was rolled back and re-run; rollback share =
rollback seconds / (draft + verify + rollback seconds).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import (
    QAbstractTextDocumentLayout,
    QColor,
    QFont,
    QFontMetricsF,
    QPainter,
    QPalette,
    QPen,
    QTextDocument,
    QTextOption,
)
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QStyle,
    QStyledItemDelegate,
    QToolButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.chat.events import CycleEvent, Summary
from app.engine.modes import Mode
from app.ui.text import plural, seconds_text
from app.ui.theme import FIGURE_VALUE_PX

FIGURES: list[tuple[str, str, str]] = [
    ("acceptance", "Acceptance",
     "How often the drafter's guesses were right. Acceptance rate = accepted draft tokens / "
     "drafted tokens (DFlash only); not the share of output tokens that came from the "
     "drafter."),
    ("tau", "τ (tokens/cycle)",
     "How many tokens each check by the big model gave on average (higher is faster). Tau = "
     "tokens committed per verify cycle (accepted drafts + 1, at most the block size); the "
     "prefill's first token is not a cycle."),
    ("replays", "Replays",
     "Times the model's memory had to be rewound because the draft was only partly right, "
     "or because the reply ended inside a drafted block (so a fully accepted reply can show "
     "one per round). Cycles whose recurrent state was rolled back and the committed tokens "
     "run again (through the recurrence only under 'tape', through the whole target under "
     "'replay')."),
    ("rollback_share", "Rollback share",
     "How much of the time went into rewinding after wrong guesses. Rollback seconds / "
     "(draft + verify + rollback seconds). Every cycle has a rollback stage, which with "
     "nothing to rewind only keeps the caches' books, so a reply with 0 replays can still "
     "show a small share. A greedy reply waits for the device once per cycle, in verify, so "
     "draft and rollback count the time to queue them; the benchmark (Chat > Run short "
     "benchmark, or bench --stage-timing) times each stage."),
    ("block", "Block",
     "How many tokens the last check by the big model covered. The last cycle's block length "
     "L: the pending token and L - 1 drafts (1: a plain step, no drafts). With the automatic "
     "block size (Settings › Block size › Automatic) it reads \"auto · L\" and the line below "
     "the chart says why that length was chosen, from the costs measured on this machine and "
     "the recent acceptance; the reply is exact either way."),
    ("tok_per_s", "tok/s",
     "How fast the reply was written. Generated tokens per second, from the first token to "
     "the last (reading the prompt is not counted)."),
    ("ttft", "First token",
     "How long you waited before the reply began. Time to first token: from the request to "
     "the first generated token (reading the prompt included)."),
    ("cycles", "Cycles",
     "How many guess-and-check steps DFlash ran. DFlash draft-verify cycles."),
    ("tokens", "Tokens",
     "How long the reply is, in the model's word pieces. Tokens generated (the end token "
     "included when generated)."),
    ("context", "Context",
     "How full the model's memory of this chat is. Prompt + generated tokens / the target's "
     "context limit."),
    ("prompt", "Prompt",
     "How much of the chat the model could skip re-reading. Prompt tokens reused from the "
     "kept cache of earlier turns (prefix reuse, recurrent state included) + prompt tokens "
     "read for this reply."),
]

DFLASH_ONLY = ("acceptance", "tau", "replays", "rollback_share", "block", "cycles")
"""Figures that only DFlash has (hidden for a plain reply)."""


@dataclass
class LiveStats:
    """Figures accumulated from the event stream while a reply is generated.

    Times are seconds on ``time.monotonic`` (the worker's stamps of the events, when given)
    and are replaced by the engine's :class:`Summary` figures when the reply finishes
    (:meth:`apply_summary`). Time to first token is the reply's: from the start of its first
    round (``started``, its prefill included) to its first token; once the first round's
    :class:`Summary` is in, its ``ttft_s`` (what the finished reply shows too).
    """

    started: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    last_token_at: float | None = None
    tokens: int = 0
    committed: int = 0
    prompt_tokens: int | None = None
    context_limit: int = 0
    summary: Summary | None = None
    running: Summary = field(default_factory=lambda: Summary(mode="dflash"))
    """The cycle figures so far, counted by :meth:`Summary.add_cycle` (as the engine does)."""
    mode: str = "dflash"
    rounds: int = 1
    """Generation rounds started so far (a tool reply runs several)."""
    round_summaries: list[Summary] = field(default_factory=list)
    """The engine's figures of each finished round."""
    continues_after: int = 0
    """For a reply continued after Max tokens: its generated tokens before (the figures
    while it runs are the continuation's; 0 for a new reply)."""
    last_reason: str = ""
    """Why the last cycle's block length was chosen (:attr:`CycleEvent.reason`; "" for fixed
    blocks, and for a reply shown from the store, whose cycles are not kept)."""

    @property
    def cycles(self) -> int:
        """DFlash cycles seen so far."""
        return self.running.cycles

    @property
    def accepted_lengths(self) -> list[int]:
        """Accepted drafts per cycle (the engine's once the reply finished)."""
        if self.summary is not None and self.summary.accepted_lengths:
            return self.summary.accepted_lengths
        return self.running.accepted_lengths

    def on_token(self, now: float | None = None) -> None:
        """Count one committed token."""
        now = time.monotonic() if now is None else now
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now
        self.tokens += 1

    def on_cycle(self, ev: CycleEvent) -> None:
        """Add one DFlash cycle."""
        self.running.add_cycle(ev)
        self.committed += ev.committed
        self.last_reason = ev.reason

    def on_round(self, index: int, prompt_tokens: int, now: float | None = None) -> None:
        """A generation round started (``index`` 0-based) at ``now`` (seconds,
        ``time.monotonic``); the first one starts the clock of the time to first token."""
        self.rounds = max(self.rounds, index + 1)
        self.prompt_tokens = prompt_tokens
        if index == 0 and self.first_token_at is None:
            self.started = time.monotonic() if now is None else now

    def on_done(self, s: Summary) -> None:
        """A round finished with the engine's figures ``s`` (the reply may go on)."""
        self.round_summaries.append(s)

    def apply_summary(self, s: Summary, rounds: list[Summary] | None = None) -> None:
        """Take the engine's final figures of the whole reply (the panel then shows exactly
        these); ``rounds``: each round's figures when known."""
        self.summary = s
        self.mode = s.mode
        self.prompt_tokens = s.prompt_tokens
        if rounds is not None:
            self.round_summaries = list(rounds)

    def block(self) -> tuple[int, bool] | None:
        """The last cycle's block length and whether the automatic block size chose it, or
        None (no cycle, or a length not recorded: 0). Live: the last :class:`CycleEvent`'s
        ``block``, automatic when it carried a ``reason``; finished: the summary's last
        ``block_lengths`` entry and ``auto_block``."""
        s = self.summary
        if s is not None:
            last = s.block_lengths[-1] if s.block_lengths else 0
            return (last, s.auto_block) if last > 0 else None
        last = self.running.block_lengths[-1] if self.running.block_lengths else 0
        return (last, bool(self.last_reason)) if last > 0 else None

    def values(self) -> dict:
        """The numbers the panel shows, keyed as in :data:`FIGURES` (None: not applicable).

        Units: acceptance and rollback_share as fractions, ttft in seconds, tok_per_s in
        tokens per second, context as (used, limit), block as (length L, automatic)."""
        s = self.summary
        if s is not None:
            return {
                "acceptance": s.acceptance_rate,
                "tau": s.tau,
                "replays": s.replays,
                "rollback_share": s.rollback_share,
                "block": self.block(),
                # no rate below two tokens (as while running), no time to first token
                # without a token (a reply stopped before its first)
                "tok_per_s": s.tok_per_s if s.generated_tokens > 1 else None,
                "ttft": s.ttft_s if s.generated_tokens else None,
                "cycles": s.cycles,
                "tokens": s.generated_tokens,
                "context": (s.prompt_tokens + s.generated_tokens, self.context_limit),
                "prompt": (s.reused_tokens, s.prompt_tokens - s.reused_tokens),
            }
        r = self.running
        # tau never claims more tokens than the Tokens card shows: the cycles' committed
        # tokens, at most the tokens seen minus each round's first (the prefill's)
        committed = self.committed
        if self.tokens:
            committed = min(committed, max(0, self.tokens - self.rounds))
        r.set_rates(committed)
        ttft = (self.first_token_at - self.started) if self.first_token_at else None
        if self.round_summaries and self.round_summaries[0].generated_tokens:
            ttft = self.round_summaries[0].ttft_s  # the engine's, as the finished reply shows
        rate = None
        if self.first_token_at is not None and self.last_token_at is not None \
                and self.tokens > 1 and self.last_token_at > self.first_token_at:
            rate = (self.tokens - 1) / (self.last_token_at - self.first_token_at)
        return {
            "acceptance": r.acceptance_rate,
            "tau": r.tau,
            "replays": r.replays,
            "rollback_share": r.rollback_share,
            "block": self.block(),
            "tok_per_s": rate,
            "ttft": ttft,
            "cycles": r.cycles,
            "tokens": self.tokens,
            "context": ((self.prompt_tokens or 0) + self.tokens, self.context_limit),
            "prompt": None,
        }


def format_figure(key: str, value) -> str:
    """Display text for one figure value ("–" when not applicable)."""
    if value is None:
        return "–"
    if key in ("acceptance", "rollback_share"):
        return f"{value * 100:.1f}%"
    if key == "tau":
        return f"{value:.2f}"
    if key == "tok_per_s":
        return f"{value:.1f}"
    if key == "ttft":
        return seconds_text(value)
    if key == "prompt":
        reused, prefilled = value
        return f"{reused:,} reused + {prefilled:,}"
    if key == "context":
        used, limit = value
        return f"{used:,} / {limit:,}" if limit else f"{used:,}"
    if key == "block":
        length, auto = value
        text = f"{length} (plain step)" if length == 1 else f"{length}"
        return f"auto · {text}" if auto else text
    return f"{value:,}"


class FigureValue(QLabel):
    """A figure tile's value, always shown whole however narrow the tile: on one line at the
    tile's size (:data:`~app.ui.theme.FIGURE_VALUE_PX`) or, when it is too long for that, a
    smaller one (:attr:`SIZES`); when no size fits it on one line it wraps between words,
    at the largest size whose every word fits. Should even that not fit, the tooltip starts
    with the whole value. ``tip`` is the figure's explanation (its tooltip)."""

    SIZES = (FIGURE_VALUE_PX, 14, 12)
    """Font sizes tried, in pixels, largest first."""

    def __init__(self, tip: str = "", parent=None) -> None:
        super().__init__("–", parent)
        self.setObjectName("figureValue")
        self.setWordWrap(True)
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.tip = tip
        self.setToolTip(tip)
        self.px = self.SIZES[0]
        """The font size the value is shown at now (pixels)."""

    def setText(self, text: str) -> None:  # noqa: N802 (Qt override)
        """Show ``text``, at the largest size that shows it whole."""
        if text != self.text():
            super().setText(text)
            self._fit()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self._fit()

    def _width(self, px: int, text: str) -> int:
        """``text``'s width at ``px`` pixels, rounded up (and a pixel for the layout's own
        rounding)."""
        font = QFont(self.font())
        font.setPixelSize(px)
        return math.ceil(QFontMetricsF(font).horizontalAdvance(text)) + 1

    def _choose(self, width: int) -> tuple[int, bool]:
        """(size, whole): the size to show the text at in ``width`` pixels, and whether it
        shows whole there."""
        text = self.text()
        for px in self.SIZES:
            if self._width(px, text) <= width:
                return px, True
        words = text.split() or [text]
        for px in self.SIZES:
            if max(self._width(px, w) for w in words) <= width:
                return px, True
        return self.SIZES[-1], False

    def _fit(self) -> None:
        width = self.contentsRect().width()
        if width <= 0:
            return
        px, whole = self._choose(width)
        if px != self.px:
            self.px = px
            # the widget's own rule wins over the app's stylesheet (theme.py)
            self.setStyleSheet("" if px == self.SIZES[0] else f"font-size: {px}px;")
        self.setToolTip(self.tip if whole else f"{self.text()}\n\n{self.tip}")


class AcceptChart(QWidget):
    """Bar chart of accepted draft tokens per cycle, drawn with QPainter; bars at the maximum
    (every draft accepted) use a second colour. Shows the last ``max_bars`` cycles, each in
    one of at least ``min_slots`` equal slots (so a few cycles are thin bars at the left; a
    histogram sets it to 0: one slot per bin, across the whole width)."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.values: list[int] = []
        self.max_value = 1
        self.max_bars = 120
        self.min_slots = 24
        self.caption: str | None = None  # footer text; None: "N cycles"
        self.colours = {"bar": "#2a9d8f", "bar_full": "#1d6f8a", "muted": "#667085",
                        "border": "#d9dee5"}
        self.setMinimumHeight(90)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.setAccessibleName("Accepted drafts per cycle chart")
        self.setToolTip("How many of the drafter's guesses the model kept at each step (taller "
                        "is better). Accepted draft tokens per DFlash cycle, newest on the "
                        "right; a dark bar: the whole block was accepted.")

    def set_values(self, values: list[int], max_value: int | None = None) -> None:
        """Replace the bars; ``max_value`` is the top of the scale (block size - 1)."""
        self.values = list(values)
        top = max(self.values, default=1)
        self.max_value = max(1, max_value or 0, top)
        self.update()

    def plot_rect(self) -> QRectF:
        """Where the bars are drawn (inside the scale's labels and the caption)."""
        return QRectF(self.rect()).adjusted(24, 6, -4, -14)

    def bar_rects(self) -> list[QRectF]:
        """The bars of the shown values (the last ``max_bars``), left to right."""
        r = self.plot_rect()
        vals = self.values[-self.max_bars:]
        n = max(len(vals), self.min_slots, 1)
        w = r.width() / n
        out = []
        for i, v in enumerate(vals):
            h = r.height() * v / self.max_value
            out.append(QRectF(r.left() + i * w + 0.5, r.bottom() - h, max(1.0, w - 1.5), h))
        return out

    def paintEvent(self, _event) -> None:  # noqa: N802 (Qt override)
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        r = self.plot_rect()
        p.setPen(QPen(QColor(self.colours["border"]), 1))
        p.drawLine(r.bottomLeft(), r.bottomRight())
        p.setPen(QColor(self.colours["muted"]))
        f = p.font()
        f.setPointSizeF(max(6.0, f.pointSizeF() * 0.8))
        p.setFont(f)
        p.drawText(QRectF(0, r.top() - 6, 22, 14), Qt.AlignRight, str(self.max_value))
        p.drawText(QRectF(0, r.bottom() - 8, 22, 14), Qt.AlignRight, "0")
        vals = self.values[-self.max_bars:]
        if not vals:
            p.drawText(r, Qt.AlignCenter, "no cycles yet")
            p.end()
            return
        for v, bar in zip(vals, self.bar_rects(), strict=True):
            colour = self.colours["bar_full"] if v >= self.max_value else self.colours["bar"]
            p.fillRect(bar, QColor(colour))
        p.setPen(QColor(self.colours["muted"]))
        p.drawText(QRectF(r.left(), r.bottom() + 1, r.width(), 13), Qt.AlignRight,
                   self.caption or f"{len(self.values)} cycles")
        p.end()


class LivePanel(QWidget):
    """The live figures (see :data:`FIGURES`) and the per-cycle chart."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        grid = QGridLayout()
        grid.setSpacing(6)
        self.labels: dict[str, QLabel] = {}
        self.tiles: dict[str, QFrame] = {}
        self.captions: dict[str, QLabel] = {}
        for key, name, tip in FIGURES:
            tile = QFrame(self)
            self.tiles[key] = tile
            tile.setObjectName("figure")
            tile.setToolTip(tip)
            lay = QVBoxLayout(tile)
            lay.setContentsMargins(8, 5, 8, 5)
            lay.setSpacing(0)
            value = FigureValue(tip)
            value.setAccessibleName(name)
            value.setAccessibleDescription(tip)
            caption = QLabel(name)
            caption.setObjectName("figureName")
            caption.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
            caption.setWordWrap(True)  # a narrow column wraps the name rather than cut it
            lay.addWidget(value)
            lay.addWidget(caption)
            self.labels[key] = value
            self.captions[key] = caption
        self.grid = grid
        self.scope_label = QLabel("")
        self.scope_label.setObjectName("figureName")
        self.scope_label.setAccessibleName("Which figures are shown")
        self.scope_label.setWordWrap(True)
        self.round_box = QComboBox()
        self.round_box.setAccessibleName("Show figures of")
        self.round_box.setToolTip("A reply that used tools ran the model once per round: "
                                  "pick the whole reply or one round.")
        self.round_box.hide()
        self.round_box.activated.connect(self._on_round_picked)
        scope = QHBoxLayout()
        scope.addWidget(self.scope_label, 1)
        scope.addWidget(self.round_box)
        self.mode_label = QLabel("")
        self.mode_label.setObjectName("figureName")
        self.mode_label.setWordWrap(True)
        self.chart = AcceptChart()
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addLayout(scope)
        outer.addLayout(grid)
        outer.addWidget(self.chart)
        outer.addWidget(self.mode_label)
        self.shown: dict = {}
        self._block_tip = self.labels["block"].tip
        self.mode = "dflash"
        self._stats: LiveStats | None = None
        self._block: int | None = None
        self._columns = 3  # short tiles to a row (2 in a narrow panel: columns_for)
        self._layout_tiles(plain=False)

    def show_stats(self, stats: LiveStats, block_size: int | None = None,
                   mode: str | None = None) -> None:
        """Show the figures of ``stats`` (the summary's when the reply finished). ``mode``
        "plain" hides the figures only DFlash has; default: the stats' own mode. The line
        above the figures says which they are (this reply so far, the reply total over its
        rounds, or one round); a finished reply of several rounds gets a round picker."""
        self._stats, self._block = stats, block_size
        self.mode = mode or (stats.summary.mode if stats.summary is not None else stats.mode)
        rounds = stats.round_summaries
        if stats.summary is None:
            self.round_box.hide()
            if stats.continues_after:
                scope = (f"This continuation so far (the reply had "
                         f"{plural(stats.continues_after, 'token')})")
            else:
                scope = "This reply so far" + (f" (round {stats.rounds}, after a tool call)"
                                               if stats.rounds > 1 else "")
            self.scope_label.setText(scope if stats.tokens else "")
        elif len(rounds) > 1:
            self.round_box.blockSignals(True)
            self.round_box.clear()
            self.round_box.addItem("Reply total")
            for i in range(len(rounds)):
                self.round_box.addItem(f"Round {i + 1}")
            self.round_box.setCurrentIndex(0)
            self.round_box.blockSignals(False)
            self.round_box.show()
            self.scope_label.setText(f"Reply total over {len(rounds)} rounds (tool calls)")
        else:
            self.round_box.hide()
            self.scope_label.setText("This reply")
        self._show(stats)

    WIDE = ("context", "prompt")
    """Figures whose values are long: two to a row, the others three to a row (in a narrow
    panel, :meth:`columns_for`: one long and two short ones to a row)."""

    def three_across_px(self) -> int:
        """The width three short tiles need side by side (pixels): below it they go two to a
        row, so a narrow window need not keep a side panel wider than its conversation."""
        def need(key: str) -> int:  # the value, and the caption's longest word (it wraps)
            caption = self.captions[key]
            fm = caption.fontMetrics()
            word = max(fm.horizontalAdvance(w) for w in caption.text().split())
            m = self.tiles[key].layout().contentsMargins()
            return max(self.tiles[key].minimumSizeHint().width(), word + m.left() + m.right() + 2)

        widest = max(need(k) for k in self.tiles if k not in self.WIDE)
        return 3 * widest + 2 * self.grid.spacing()

    def columns_for(self, width: int) -> int:
        """Short tiles to a row at ``width`` pixels: 3, or 2 below :meth:`three_across_px`."""
        return 3 if width >= self.three_across_px() else 2

    def _layout_tiles(self, plain: bool, columns: int | None = None) -> None:
        """Place the visible tiles without holes in a six-column grid: short figures
        ``columns`` (3 or 2; default: as now) to a row, then the wide ones one fewer."""
        columns = columns or self._columns
        for tile in self.tiles.values():
            self.grid.removeWidget(tile)
        keys = [k for k in self.labels if not (plain and k in DFLASH_ONLY)]
        small = [k for k in keys if k not in self.WIDE]
        wide = [k for k in keys if k in self.WIDE]
        span = 6 // columns
        for i, k in enumerate(small):
            self.grid.addWidget(self.tiles[k], i // columns, (i % columns) * span, 1, span)
        row = (len(small) + columns - 1) // columns
        per_row = columns - 1
        for i, k in enumerate(wide):
            self.grid.addWidget(self.tiles[k], row + i // per_row, (i % per_row) * (6 // per_row),
                                1, 6 // per_row)
        for k, tile in self.tiles.items():
            tile.setVisible(k in keys)
        self._plain_layout = plain
        self._columns = columns

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        columns = self.columns_for(event.size().width())
        if columns != self._columns:
            self._layout_tiles(self._plain_layout, columns)

    def _show(self, stats: LiveStats) -> None:
        self.shown = stats.values()
        plain = self.mode == Mode.PLAIN
        if plain != getattr(self, "_plain_layout", None):
            self._layout_tiles(plain)
        for key, label in self.labels.items():
            label.setText(format_figure(key, self.shown.get(key)))
        self.chart.setVisible(not plain)
        why = self.block_reason(stats)
        self.mode_label.setText(
            "Plain decoding: one token per step, no drafts, so acceptance, τ, replays, "
            "block and cycles do not apply." if plain else why)
        value = self.labels["block"]
        value.tip = f"{why}\n\n{self._block_tip}" if why and not plain else self._block_tip
        value.setToolTip(value.tip)
        value._fit()  # the whole value first when it does not fit (FigureValue)
        self.tiles["block"].setToolTip(value.tip)
        self.chart.set_values(stats.accepted_lengths,
                              (self._block - 1) if self._block else None)

    @staticmethod
    def block_reason(stats: LiveStats) -> str:
        """The line under the chart for a reply whose block lengths the automatic block size
        chose: why the last one (:attr:`LiveStats.last_reason`), or what it does when the
        reason is not known (a reply shown from the store); "" for fixed blocks."""
        block = stats.block()
        if block is None or not block[1]:
            return ""
        if stats.last_reason:
            return f"Automatic block size: {stats.last_reason}."
        return ("Automatic block size: each cycle's length chosen from the costs measured on "
                "this machine and the recent acceptance.")

    def _on_round_picked(self, index: int) -> None:
        st = self._stats
        if st is None or st.summary is None or not st.round_summaries:
            return
        if index <= 0:
            self.scope_label.setText(
                f"Reply total over {len(st.round_summaries)} rounds (tool calls)")
            self._show(st)
            return
        one = LiveStats(context_limit=st.context_limit)
        one.apply_summary(st.round_summaries[index - 1])
        self.scope_label.setText(f"Round {index} of {len(st.round_summaries)} only")
        self._show(one)

    def clear(self) -> None:
        """Back to dashes (nothing measured: not zeros) and an empty chart."""
        self.show_stats(LiveStats())
        self.shown = {key: None for key in self.labels}
        for label in self.labels.values():
            label.setText(format_figure("", None))
        self.scope_label.setText("")


PANE_HINT_HEIGHT = 110
"""Preferred height (px) of the side panel's reasoning and tool-call panes. The live figures'
tiles make the side panel height-for-width, so its scroll area sizes it to its *preferred*
height; with Qt's default hints (192 px each) that is 825 px in the 751 px a 1280x800 window
gives it, and the Tool calls pane would be cut. The layout's stretch still hands both panes
whatever height is left over."""


class Collapsible(QWidget):
    """A titled section whose body can be folded away (the arrow button toggles it)."""

    def __init__(self, title: str, body: QWidget, parent=None, expanded: bool = True) -> None:
        super().__init__(parent)
        self.button = QToolButton()
        self.button.setObjectName("collapse")
        self.button.setText(title)
        self.button.setCheckable(True)
        self.button.setChecked(expanded)
        self.button.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.button.setArrowType(Qt.DownArrow if expanded else Qt.RightArrow)
        self.button.setAccessibleName(f"Show or hide {title}")
        self.button.toggled.connect(self._toggle)
        self.body = body
        body.setVisible(expanded)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        lay.addWidget(self.button)
        lay.addWidget(body)

    def _toggle(self, on: bool) -> None:
        self.button.setArrowType(Qt.DownArrow if on else Qt.RightArrow)
        self.body.setVisible(on)


class _WrappedDetailDelegate(QStyledItemDelegate):
    """Draws a :class:`ToolPane` detail row (arguments, result, error: spanned over the three
    columns) wrapped to the pane's width, and gives it the height that takes. A
    ``QTreeWidget`` sizes a spanned row for its first column and elides the rest, so a long
    error ended in "…" and could not be read."""

    PAD = 4  #: px left and right of the text

    def _document(self, option, index, width: float) -> QTextDocument:
        doc = QTextDocument()
        doc.setDocumentMargin(0)
        doc.setDefaultFont(option.font)
        wrap = QTextOption()
        wrap.setWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        doc.setDefaultTextOption(wrap)
        doc.setPlainText(str(index.data() or ""))
        doc.setTextWidth(max(40.0, width))
        return doc

    def _spanned(self, index) -> bool:
        tree = self.parent()
        return index.parent().isValid() and tree.isFirstColumnSpanned(index.row(), index.parent())

    def sizeHint(self, option, index) -> QSize:  # noqa: N802 - Qt's name
        """A detail row's wrapped height at the pane's width; other rows as Qt sizes them."""
        if not self._spanned(index):
            return super().sizeHint(option, index)
        tree = self.parent()  # detail rows sit one level below a call: two indentations in
        width = tree.viewport().width() - tree.indentation() * 2 - 2 * self.PAD
        doc = self._document(option, index, width)
        return QSize(int(width), math.ceil(doc.size().height()) + 2)

    def paint(self, painter, option, index) -> None:
        if not self._spanned(index):
            super().paint(painter, option, index)
            return
        self.initStyleOption(option, index)
        option.text = ""  # the background and focus as Qt draws them; the text wrapped below
        style = option.widget.style() if option.widget else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, option, painter, option.widget)
        rect = option.rect.adjusted(self.PAD, 1, -self.PAD, 0)
        doc = self._document(option, index, rect.width())
        context = QAbstractTextDocumentLayout.PaintContext()
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        context.palette.setColor(QPalette.ColorRole.Text, option.palette.color(
            QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text))
        painter.save()
        painter.translate(rect.topLeft())
        doc.documentLayout().draw(painter, context)
        painter.restore()


class ToolPane(QTreeWidget):
    """Tool calls of the shown reply: one row per call (name, status, duration) with the
    arguments as formatted JSON and the result (or error) as children, wrapped to the pane's
    width (:class:`_WrappedDetailDelegate`)."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setColumnCount(3)
        self.setHeaderLabels(["Tool", "Status", "Time"])
        self.setAccessibleName("Tool calls")
        self.setRootIsDecorated(True)
        self.setWordWrap(True)
        self.header().setStretchLastSection(False)
        self.header().setSectionResizeMode(0, self.header().ResizeMode.Stretch)
        self.setItemDelegate(_WrappedDetailDelegate(self))
        self._calls: list[dict] = []

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        """Re-wrap the detail rows to the new width."""
        super().resizeEvent(event)
        self.doItemsLayout()

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        """Compact preferred height (:data:`PANE_HINT_HEIGHT`)."""
        return QSize(super().sizeHint().width(), PANE_HINT_HEIGHT)

    def set_calls(self, calls: list[dict]) -> None:
        """Show ``calls`` (dicts with name, arguments, result, error, duration_s)."""
        if calls == self._calls:
            return
        self._calls = [dict(c) for c in calls]
        self.clear()
        for c in self._calls:
            if c.get("error"):
                status = "error"
            elif c.get("result") is not None:
                status = "done"
            else:
                status = "running"
            dur = c.get("duration_s")
            item = QTreeWidgetItem([str(c.get("name", "?")), status,
                                    f"{dur * 1000:.0f} ms" if isinstance(dur, (int, float))
                                    else ""])
            args = c.get("arguments") or {}
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    pass
            arg_text = json.dumps(args, indent=2, ensure_ascii=False) \
                if not isinstance(args, str) else args
            QTreeWidgetItem(item, ["arguments:\n" + arg_text])
            if c.get("error"):
                QTreeWidgetItem(item, ["error: " + str(c["error"])])
            elif c.get("result") is not None:
                res = c["result"]
                text = res if isinstance(res, str) else json.dumps(res, indent=2,
                                                                   ensure_ascii=False)
                QTreeWidgetItem(item, ["result:\n" + text])
            self.addTopLevelItem(item)
            for i in range(item.childCount()):
                item.child(i).setFirstColumnSpanned(True)
            item.setExpanded(True)

    def calls(self) -> list[dict]:
        """The calls shown (copies)."""
        return [dict(c) for c in self._calls]

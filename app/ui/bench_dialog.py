"""The window's short benchmark: plain vs DFlash (tape and replay) on the loaded pair, shown
as a table and as the live panel's charts (accepted drafts per cycle, and their histogram)."""

from __future__ import annotations

import re
from collections import Counter

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from app.engine.modes import Mode
from app.ui.panels import AcceptChart

COLUMNS = [
    ("mode", "Mode"),
    ("pooled_tok_per_s", "tok/s"),
    ("pooled_ratio_to_plain", "× plain"),
    ("ratio_to_plain", "× plain (median of pairs)"),
    ("time_to_answer_s", "Time to answer"),
    ("answer_ratio_to_plain", "× plain (answer)"),
    ("tau", "τ"),
    ("acceptance_rate", "Acceptance"),
    ("replays", "Replays"),
    ("identical_tokens", "Same tokens"),
]
"""The table's columns: the figures of ``python -m app bench`` (``app.engine.bench.aggregate``)
with the same definitions, so the two agree on the same prompts."""


HEADER_TIPS = {
    "mode": "How the tokens were made: plain (one at a time) or DFlash / DFlash2 with its "
            "block size; tape rollback unless it says replay. Each row's tooltip gives its "
            "name in python -m app bench.",
    "pooled_tok_per_s": "How fast the replies were written. Generated tokens over generation "
                        "seconds, pooled over every prompt (reading the prompt not counted).",
    "pooled_ratio_to_plain": "How many times as fast as plain on the same prompts: this row's "
                             "tok/s over plain's tok/s.",
    "ratio_to_plain": "How many times as fast as plain, taken prompt by prompt: the median "
                      "of the per-prompt ratios tok/s / plain tok/s.",
    "time_to_answer_s": "How long a reply took from the start to its last token, reading the "
                        "whole prompt included: each run starts with an empty cache, where a "
                        "chat reuses its preamble. Median over the prompts, in seconds.",
    "answer_ratio_to_plain": "How many times as fast as plain the whole replies were: plain's "
                             "total time to answer over this row's.",
    "tau": "How many tokens each check by the big model gave on average. Tokens committed "
           "per verify cycle, at most the block size; a reply's last cycle, cut short by Max "
           "tokens or the reply's end, drafts and commits fewer, so τ can be below the block "
           "size at 100% acceptance.",
    "acceptance_rate": "How often the drafter's guesses were right. Accepted draft tokens / "
                       "drafted tokens.",
    "replays": "Times the model's memory had to be rewound because the draft was only partly "
               "right. Cycles rolled back and re-run.",
    "rollback_share": "How much of the time went into rewinding. Rollback seconds / (draft + "
                      "verify + rollback seconds); every cycle has a rollback stage, so 0 "
                      "replays can still show a small share.",
    "identical_tokens": "Whether DFlash wrote exactly the same tokens as plain (it should, "
                        "with greedy sampling).",
}
"""Header tooltips: a plain sentence first, then the definition."""


_MODE = re.compile(r"(plain|dflash2?)(?:\+(tape|replay)@(\d+))?((?:\+(?:fast|nosel))*)")


def mode_title(name: str) -> str:
    """The table's words for a benchmark mode name of ``app.engine.bench`` (``plain``,
    ``dflash+tape@16``, ``dflash+replay@16+fast``, ``dflash2+tape@16+nosel``, ...): e.g.
    "DFlash2, selector off (block 16)". A name it does not know is shown as it is."""
    m = _MODE.fullmatch(name)
    if m is None:
        return name
    kind, rollback, block, flags = m.groups()
    if kind == Mode.PLAIN:
        return "Plain" if not (rollback or flags) else name
    words = ["DFlash2" if kind == Mode.DFLASH2 else "DFlash"]
    if rollback == "replay":
        words.append("replay rollback")
    if "+fast" in flags:
        words.append("fast verify, not exact")
    if "+nosel" in flags:
        words.append("selector off")
    return ", ".join(words) + (f" (block {block})" if block else "")


def cell_text(key: str, value) -> str:
    """Display text of one benchmark figure ("–" when not applicable)."""
    if value is None:
        return "–"
    if key == "identical_tokens":
        return "yes" if value else "NO"
    if key in ("acceptance_rate", "rollback_share"):
        return f"{value * 100:.1f}%"
    if key in ("tok_per_s", "pooled_tok_per_s"):
        return f"{value:.1f}"
    if key == "time_to_answer_s":
        return f"{value:.2f} s"
    if key in ("ratio_to_plain", "pooled_ratio_to_plain", "answer_ratio_to_plain", "tau"):
        return f"{value:.2f}"
    return str(value)


def histogram(accepted: list[int], block_size: int) -> list[int]:
    """Cycles per accepted length 0..block_size-1."""
    counts = Counter(accepted)
    return [counts.get(k, 0) for k in range(block_size)]


class BenchDialog(QDialog):
    """Shows the dict of ``ChatSession.benchmark``: ``{"modes": {name: figures},
    "accepted": [...], "prompts": n, "block_size": B}``."""

    def __init__(self, parent, result: dict) -> None:
        super().__init__(parent)
        self.setWindowTitle("Benchmark: plain vs DFlash")
        self.setAccessibleName("Benchmark results")
        modes = result["modes"]
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel(
            f"{result['prompts']} held-out prompts, one run each, greedy, block size "
            f"{result['block_size']}, every mode warmed up first, the order rotating. "
            "For the full benchmark run <code>python -m app bench</code>."))
        self.table = QTableWidget(len(modes), len(COLUMNS))
        self.table.setHorizontalHeaderLabels([title for _, title in COLUMNS])
        for col, (key, _) in enumerate(COLUMNS):
            tip = HEADER_TIPS.get(key)
            if tip:
                self.table.horizontalHeaderItem(col).setToolTip(tip)
        for row, (name, fig) in enumerate(modes.items()):
            for col, (key, _) in enumerate(COLUMNS):
                item = QTableWidgetItem(mode_title(name) if key == "mode"
                                        else cell_text(key, fig.get(key)))
                if key == "mode":
                    item.setToolTip(f"{name} in python -m app bench")
                self.table.setItem(row, col, item)
        self.table.resizeColumnsToContents()
        self.table.resizeRowsToContents()
        self._fit_table()
        layout.addWidget(self.table)
        layout.addWidget(QLabel("Accepted drafts per cycle (DFlash + tape)"))
        self.cycles_chart = AcceptChart()
        self.cycles_chart.set_values(result["accepted"], result["block_size"] - 1)
        layout.addWidget(self.cycles_chart)
        layout.addWidget(QLabel("Histogram: cycles by accepted drafts (0 on the left)"))
        self.histogram_chart = AcceptChart()
        self.histogram_chart.caption = f"0..{result['block_size'] - 1} accepted"
        self.histogram_chart.min_slots = 0  # one slot per bin
        self.histogram_chart.setToolTip("Number of cycles that accepted k drafts, k from 0.")
        self.histogram_chart.set_values(histogram(result["accepted"], result["block_size"]))
        layout.addWidget(self.histogram_chart)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.resize(760, 480)

    def _fit_table(self) -> None:
        """Size the table to its cells: exactly as tall as its header and rows, and at least
        as wide as its columns, so every cell shows without scrolling whatever room the
        dialog leaves it (the charts take the rest)."""
        t = self.table
        t.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        t.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        t.horizontalHeader().setStretchLastSection(True)
        frame = 2 * t.frameWidth()
        t.setFixedHeight(t.horizontalHeader().sizeHint().height()
                         + t.verticalHeader().length() + frame)
        t.setMinimumWidth(t.verticalHeader().sizeHint().width()
                          + t.horizontalHeader().length() + frame)

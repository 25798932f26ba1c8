"""The right-hand panes: live figures, the model's reasoning, tool calls.

:class:`DetailsPanel` owns the three panes and what they show: a reply being generated
(reasoning appended as it streams, tool calls as they run, figures on each render tick) or a
finished turn (:meth:`show_turn`).
"""

from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QFrame, QPlainTextEdit, QVBoxLayout

from app.chat.conversation import continued_text
from app.chat.turns import ReplyResult, Turn
from app.ui.panels import PANE_HINT_HEIGHT, Collapsible, LivePanel, LiveStats, ToolPane
from app.ui.render import cut_for_view


class ReasoningPane(QPlainTextEdit):
    """The model's reasoning, read-only, with a compact preferred height
    (:data:`PANE_HINT_HEIGHT`)."""

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(super().sizeHint().width(), PANE_HINT_HEIGHT)


class DetailsPanel(QFrame):
    """Live figures, reasoning and tool calls, each in a :class:`Collapsible` section."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("side")
        self.live = LivePanel()
        self.reasoning = ReasoningPane()
        self.reasoning.setReadOnly(True)
        self.reasoning.setAccessibleName("Reasoning")
        self.reasoning.setPlaceholderText("The model's reasoning appears here.")
        self.tools = ToolPane()
        self.live_section = Collapsible("Live figures", self.live)
        self.reasoning_section = Collapsible("Reasoning", self.reasoning)
        self.tools_section = Collapsible("Tool calls", self.tools)
        rl = QVBoxLayout(self)
        rl.setContentsMargins(10, 10, 10, 10)
        rl.setSpacing(10)
        rl.addWidget(self.live_section)
        rl.addWidget(self.reasoning_section, 2)
        rl.addWidget(self.tools_section, 2)

    def clear(self) -> None:
        """Empty every pane (a new reply starts)."""
        self.reasoning.clear()
        self.tools.set_calls([])
        self.live.clear()

    def append_reasoning(self, text: str) -> None:
        """Add streamed reasoning text at the end."""
        cur = self.reasoning.textCursor()
        cur.movePosition(QTextCursor.End)
        cur.insertText(text)

    def say_continued(self, result: ReplyResult | None) -> None:
        """After the figures of a finished reply are shown: when it was continued after Max
        tokens (``ReplyResult.continued``), the line above them says so, and that they
        cover the whole reply."""
        if result is not None and result.continued:
            label = self.live.scope_label
            label.setText(f"{label.text()} ({continued_text(result.continued)}; the figures "
                          "are over the whole reply)")

    def show_turn(self, msg: Turn | None, context_length: int, block_size: int | None) -> None:
        """Reasoning, tool calls and figures of ``msg``'s chosen version (empty for None or a
        user message). ``context_length`` in tokens; ``block_size`` for the chart's scale
        (None for plain)."""
        v = msg.version if msg else None
        reasoning, cut = cut_for_view(v.result.all_reasoning() if v else "")
        if cut:  # as the bubble: the start only (the store and Export keep all of it)
            reasoning += (f"\n\n… {cut:,} more characters not shown here, to keep the pane "
                          "quick: export the chat (File › Export) to read all of it")
        self.reasoning.setPlainText(reasoning)
        self.tools.set_calls(v.result.tool_calls if v else [])
        if v is not None and v.result.summary is not None:
            st = LiveStats(context_limit=context_length)
            st.apply_summary(v.result.summary, v.result.round_summaries)
            self.live.show_stats(st, block_size, v.result.mode)
            self.say_continued(v.result)
        else:  # nothing to show: not the previous reply's figures
            self.live.clear()
            if v is not None:
                self.live.scope_label.setText("No figures for this reply")

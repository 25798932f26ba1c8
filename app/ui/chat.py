"""The chat view (rendered conversation) and the composer (input box, switch, buttons).

The view renders finished messages as Markdown (``app.ui.render``) and streams the reply being
generated as plain text appended at the end (cheap per tick); when the reply finishes the whole
conversation is rendered again. Auto-scroll follows new text only while the view is scrolled
to the bottom: scrolling up pauses it, scrolling back down resumes it.
"""

from __future__ import annotations

import html

from PySide6.QtCore import QElapsedTimer, QEvent, Qt, QUrl, Signal
from PySide6.QtGui import (
    QGuiApplication,
    QKeyEvent,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
)
from PySide6.QtWidgets import (
    QBoxLayout,
    QButtonGroup,
    QCheckBox,
    QHBoxLayout,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QStackedWidget,
    QTextBrowser,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from app.chat.baseline import NO_BASELINE
from app.chat.conversation import continued_text, finish_text
from app.chat.turns import ConversationView, Turn
from app.engine.modes import DRAFTER_MODES, DRAFTING_MODES, MODES, Mode
from app.ui.fit import FlowLayout, WrapLabel
from app.ui.render import (
    VIEW_MESSAGE_CHARS,
    answer_tokens_html,
    cut_for_view,
    cut_note_html,
    message_html,
    spells_its_text,
    starts_in_reasoning,
)
from app.ui.text import mode_label, plural
from app.ui.theme import KEYBOARD_FOCUS


def compare_tip(drafters: tuple[str, ...] = ("dflash",)) -> str:
    """The Compare button's tooltip: plain, then each of the pair's ``drafters`` (modes:
    DFlash, DFlash2 or both)."""
    then = "".join(f", then with {mode_label(m)}" for m in drafters)
    return f"Run the prompt plain{then}, side by side (Ctrl+Shift+C)"


NO_BASELINE_TIP = ("No plain speed to compare with yet. A speed-up is shown against the median "
                   "of at least 3 plain measurements (plain replies, Compare plain sides, the "
                   "short benchmark) made since the pair was loaded, on the same pair, dtype "
                   "and Max tokens, with prompts within ±50% of this one's length; a "
                   "Compare's DFlash side is measured against its own plain side.")
NO_ANSWER_IN_REASONING = "No answer: the model's reply ended inside its reasoning (above)."
"""Shown where a finished reply has reasoning but no answer, no tool call and no error."""
NO_ANSWER = "No answer: the model ended its reply without writing one."
"""Shown where a finished reply has no text at all, no tool call and no error."""
NO_ANSWER_AT_LIMIT = "No answer: the reply reached Max tokens before the model wrote one."
"""Shown instead of the two above when Max tokens ended the reply (in its reasoning, or in a
tool call that was then not run): the model was not done."""
CONTINUE_TIP = ("Max tokens ended this reply: continue it where it stopped, in the mode that "
                "made it, for up to Max tokens more (File › Settings). It stays one reply.")
"""The Continue link's tooltip."""
NO_CONTINUE_COMPARE = "not continued (Compare)"
NO_CONTINUE_COMPARE_TIP = ("Max tokens ended this side. A Compare turn is not continued: its "
                           "sides are compared as they ran. Raise Max tokens in File › "
                           "Settings and send the prompt again for longer replies.")
"""Where a Compare turn's chosen side was cut by Max tokens: said instead of a Continue link."""


def compare_label(drafters: tuple[str, ...] = ("dflash",)) -> str:
    """The Compare action's name: the sides it runs, plain and the pair's ``drafters``
    (modes): "Compare plain and DFlash2", "Compare plain, DFlash and DFlash2"."""
    names = ["plain", *(mode_label(m) for m in drafters)]
    return f"Compare {', '.join(names[:-1])} and {names[-1]}"

SIDE_NOTE_PX = 200
"""The mode note sits beside the settings line when this many pixels are left for it, else
under it."""

STREAM_MARKDOWN_CHARS = 6000
"""Streamed replies up to this many characters are re-rendered as Markdown every tick."""

VIEW_TURNS = 100
"""The chat view draws at most this many of the conversation's latest turns, and more
(this many at a time) each time "Show earlier messages" is clicked."""
VIEW_CHARS = 300_000
"""...and only as many of them, from the last, as fit in this many characters (each message
counted as shown, :data:`app.ui.render.VIEW_MESSAGE_CHARS` at most; the last turn always
drawn); each "Show earlier messages" adds as much again."""


def figures_line(msg: Turn) -> str:
    """The per-reply figures line: mode, tok/s, tau, replays, block size (``block auto``
    when the automatic block size chose it), rollback, state (stopped, or how it ended:
    ``app.chat.conversation.finish_text``)."""
    v = msg.version
    if v is None:
        return ""
    r = v.result
    parts = [mode_label(r.mode) if r.mode in DRAFTING_MODES else "Plain"]
    s = r.summary
    if s is not None and (not v.stopped or s.tok_per_s > 0):
        parts.append(f"{s.tok_per_s:.1f} tok/s")  # a stopped reply's: up to the stop
    if s is not None and not v.stopped:
        if r.mode in DRAFTING_MODES and s.tau is not None:
            parts.append(f"τ {s.tau:.2f}")
            parts.append(plural(s.replays, "replay"))
    if v.stopped:
        # the engine's counts when it reported them (every round of a tool reply), so the
        # footer agrees with the panel
        cycles = s.cycles if s is not None else 0
        parts.append(plural(s.generated_tokens if s is not None else len(r.tokens), "token"))
        if r.mode in DRAFTING_MODES:
            parts.append(plural(cycles, "cycle"))
    elif s is not None:
        parts.append(plural(s.generated_tokens, "token"))
    if r.rounds > 1:
        parts.append(f"{r.rounds} rounds")
    if r.continued:
        parts.append(continued_text(r.continued))
    if r.mode in DRAFTING_MODES:
        auto = s is not None and s.auto_block  # the automatic block size ran
        parts.append("block auto" if auto else f"block {r.block_size or 'default'}")
        parts.append(r.rollback)
    if v.interrupted:
        parts.append("interrupted (the app closed while it was written)")
    elif v.stopped:
        parts.append("stopped")
    elif ended := finish_text(r.finish_reason, s.stop_cause if s is not None else None):
        parts.append(ended)
    if v.error:
        parts.append("error")
    return " · ".join(parts)


class ChatView(QTextBrowser):
    """Read-only rendered conversation with copy links on code blocks.

    Signals: ``linkActivated(str)`` for app links (``continue:``, ``choose:plain``,
    ``choose:dflash``, ``reasoning:N``, ``earlier:`` to draw earlier turns); copy links
    are handled here (clipboard: ``copy:N`` a code block, ``copymsg:N`` / ``copyreasoning:N``
    the whole text of a message cut in the view);
    ``rendered(object)`` after each :meth:`render`, with the conversation (or None) and
    whether it streams (the window keeps its actions in step with what is shown)."""

    linkActivated = Signal(str)
    rendered = Signal(object, bool)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("chat")
        self.setAccessibleName("Conversation")
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(self._on_anchor)
        self.codes: list[str] = []
        self.palette_colours: dict = {}
        self.colour_drafts = False
        self.follow = True
        self._editing = False
        self._stream_text = ""
        self._stream_pos: int | None = None
        self.expanded: set[int] = set()
        """Indices of the messages whose reasoning is unfolded in the bubble."""
        self.earlier_steps = 0
        """How many times "Show earlier messages" was clicked in the conversation shown (0
        when another is shown): the view draws (1 + this) times :data:`VIEW_TURNS` turns
        and :data:`VIEW_CHARS` characters."""
        self.first_shown = 0
        """The index of the first turn drawn by the last :meth:`render` (earlier ones are
        behind "Show earlier messages")."""
        self._conv: ConversationView | None = None
        self.intro_title = ""
        self.intro_about = ""
        self.intro_examples: list = []
        self.verticalScrollBar().valueChanged.connect(self._on_scroll)
        self.verticalScrollBar().rangeChanged.connect(self._on_range)

    # ---- scrolling
    def _at_bottom(self) -> bool:
        sb = self.verticalScrollBar()
        return sb.value() >= sb.maximum() - 4

    def _on_scroll(self, _value: int) -> None:
        if not self._editing:
            self.follow = self._at_bottom()

    def _on_range(self, _lo: int, hi: int) -> None:
        if self.follow and not self._editing:
            self.verticalScrollBar().setValue(hi)

    def _begin_edit(self) -> tuple[bool, int]:
        """Freeze scroll tracking while the document is rebuilt (it may shrink to nothing for
        a moment, which would look like "scrolled to the bottom")."""
        self._editing = True
        return self.follow, self.verticalScrollBar().value()

    def _end_edit(self, state: tuple[bool, int]) -> None:
        follow, value = state
        sb = self.verticalScrollBar()
        sb.setValue(sb.maximum() if follow else min(value, sb.maximum()))
        self.follow = follow
        self._editing = False

    def _prompt_versions(self, m: Turn) -> str:
        """"version 2 of 3 · ‹ previous · next ›" after an edited user message's edit link
        (links ``prompt:<storage id>``), as replies show theirs; "" when never edited."""
        if not m.edits or m.ids.get("") not in m.edits:
            return ""
        c = self.palette_colours
        pos = m.edits.index(m.ids[""])
        out = f'<span style="color:{c.get("muted")}; font-size:small;"> · version {pos + 1} ' \
              f'of {len(m.edits)}'
        link = f' · <a href="prompt:{{}}" style="color:{c.get("accent")};">{{}}</a>'
        if pos > 0:
            out += link.format(m.edits[pos - 1], "‹&nbsp;previous")
        if pos < len(m.edits) - 1:
            out += link.format(m.edits[pos + 1], "next&nbsp;›")
        return out + "</span>"

    def _on_anchor(self, url: QUrl) -> None:
        link = url.toString()
        if link.startswith("copy:"):
            try:
                QGuiApplication.clipboard().setText(self.codes[int(link[5:])])
            except (ValueError, IndexError):
                pass
            return
        if link.startswith(("copymsg:", "copyreasoning:")):
            text = self.full_text(link)
            if text is not None:
                QGuiApplication.clipboard().setText(text)
            return
        self.linkActivated.emit(link)

    def full_text(self, link: str) -> str | None:
        """The whole text behind a cut message's "Copy all" link: ``copymsg:N`` (turn N's
        message, a reply's chosen version) or ``copyreasoning:N`` (its reasoning); None
        for a link to no such turn."""
        kind, _, index = link.partition(":")
        try:
            m = self._conv.messages[int(index)]
        except (AttributeError, ValueError, IndexError):
            return None
        if m.role == "user":
            return m.content
        v = m.version
        if v is None:
            return None
        return v.result.all_reasoning() if kind == "copyreasoning" else v.result.content

    @staticmethod
    def _shown_chars(m: Turn) -> int:
        """How many characters turn ``m`` takes in the view (its cut message)."""
        if m.role == "user":
            text = m.content
        else:
            v = m.version
            text = v.result.content if v is not None else ""
        return min(len(text), VIEW_MESSAGE_CHARS)

    def _first_to_draw(self, msgs: list[Turn]) -> int:
        """The index of the first turn to draw: the latest ones within the turn and
        character bounds (:data:`VIEW_TURNS`, :data:`VIEW_CHARS`), the last always."""
        steps = 1 + max(0, self.earlier_steps)
        first = max(0, len(msgs) - VIEW_TURNS * steps)
        budget = VIEW_CHARS * steps
        i = len(msgs) - 1
        while i > first:
            budget -= self._shown_chars(msgs[i])
            if budget - self._shown_chars(msgs[i - 1]) < 0:
                return i
            i -= 1
        return first

    def _earlier_html(self, hidden: int) -> str:
        c = self.palette_colours
        return (f'<p style="color:{c.get("muted")}; font-size:small;">'
                f"{hidden:,} earlier message{'s' if hidden != 1 else ''} not shown · "
                f'<a href="earlier:" style="color:{c.get("accent")};">Show earlier '
                "messages</a></p>")

    # ---- the focus border: by keyboard only
    KEYBOARD_REASONS = (Qt.TabFocusReason, Qt.BacktabFocusReason, Qt.ShortcutFocusReason)
    KEPT_REASONS = (Qt.ActiveWindowFocusReason, Qt.PopupFocusReason, Qt.MenuBarFocusReason)

    def focusInEvent(self, event) -> None:  # noqa: N802 (Qt override)
        """Set :data:`~app.ui.theme.KEYBOARD_FOCUS` from how the focus came: True by Tab,
        Backtab or a shortcut, unchanged when it comes back after another window, a popup
        or the menu bar, else (a click, the program) False; the stylesheet draws the focus
        border only when True. Re-polished only when the value changes."""
        reason = event.reason()
        was = bool(self.property(KEYBOARD_FOCUS))
        keyboard = was if reason in self.KEPT_REASONS else reason in self.KEYBOARD_REASONS
        if keyboard != was:
            self.setProperty(KEYBOARD_FOCUS, keyboard)
            self.style().unpolish(self)
            self.style().polish(self)
        super().focusInEvent(event)

    # ---- tooltips of footer figures (``title`` in the HTML)
    def viewportEvent(self, event) -> bool:  # noqa: N802 (Qt override)
        if event.type() == QEvent.ToolTip:
            tip = self.cursorForPosition(event.pos()).charFormat().toolTip()
            if tip:
                QToolTip.showText(event.globalPos(), tip, self.viewport())
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)

    def tooltip_of(self, text: str) -> str:
        """The tooltip on the first piece of the shown text containing ``text`` ("" if
        none)."""
        block = self.document().begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                frag = it.fragment()
                if frag.isValid() and text in frag.text() and frag.charFormat().toolTip():
                    return frag.charFormat().toolTip()
                it += 1
            block = block.next()
        return ""

    # ---- rendering
    def set_intro(self, title: str, about: str, examples: list) -> None:
        """What an empty chat shows: ``title`` (the model, or why there is none), ``about``
        (what the model is) and ``examples`` (:class:`app.chat.examples.Example`, each a
        link ``example:N`` that sends it)."""
        self.intro_title, self.intro_about = title, about
        self.intro_examples = list(examples)

    def _intro_html(self) -> str:
        c = self.palette_colours
        muted = c.get("muted", "#667085")
        out = [f'<div><p style="margin-top:24px; font-size:large;"><b>'
               f"{html.escape(self.intro_title)}</b></p>"]
        if self.intro_about:
            out.append(f'<p style="color:{muted};">{html.escape(self.intro_about)}</p>')
        if self.intro_examples:
            out.append('<p style="margin-top:14px;"><b>Try one of these</b></p>')
            for i, ex in enumerate(self.intro_examples):
                tag = (f' <span style="color:{muted}; font-size:small;">· uses a tool</span>'
                       if ex.needs_tools else "")
                out.append(f'<p style="margin-left:12px;"><a href="example:{i}" '
                           f'style="color:{c.get("accent")}; text-decoration:none;">'
                           f"› {html.escape(ex.prompt)}</a>{tag}</p>")
        out.append("</div>")
        return "".join(out)

    def render(self, conv: ConversationView | None, streaming: bool = False) -> None:
        """Render the whole conversation (``streaming``: the last turn is being generated
        and is streamed by :meth:`append_stream`)."""
        c = self.palette_colours
        self.codes = []
        out = [f'<div style="color:{c.get("text", "#000")};">']
        msgs = conv.messages if conv else []
        if not msgs and self.intro_title:
            out.append(self._intro_html())
        last_assistant = max((i for i, m in enumerate(msgs) if m.role == "assistant"),
                             default=-1)
        # a very long chat draws its latest turns only; the rest is a click away
        self._conv = conv
        self.first_shown = first = self._first_to_draw(msgs) if msgs else 0
        hidden = first + (conv.earlier if conv is not None else 0)
        if hidden:
            out.append(self._earlier_html(hidden))
        for i in range(first, len(msgs)):
            m = msgs[i]
            if m.role == "user":
                text, cut = cut_for_view(m.content)
                out.append(
                    f'<table width="100%" cellpadding="10" style="margin-top:10px;'
                    f' background-color:{c.get("user_bg")};"><tr><td>'
                    f'<b style="color:{c.get("accent")};">You</b>'
                    + ("" if streaming else
                       f'&nbsp;&nbsp;<a href="edit:{i}" style="color:{c.get("muted")};'
                       f' font-size:small;">edit</a>' + self._prompt_versions(m))
                    + '<br>'
                    f'{message_html(text, self.codes, c, keep_line_breaks=True)}'
                    + (cut_note_html(cut, f"copymsg:{i}", c) if cut else "")
                    + '</td></tr></table>')
            elif m.role == "assistant":
                out.append(self._assistant_html(i, m, i == last_assistant, streaming))
        out.append("</div>")
        state = self._begin_edit()
        self.setHtml("".join(out))
        self._stream_pos = None
        self._base_codes = list(self.codes)
        self._stream_len = 0
        self._stream_text = ""
        self._stream_plain = False
        if streaming:
            cur = QTextCursor(self.document())
            cur.movePosition(QTextCursor.End)
            cur.insertBlock(QTextBlockFormat(), QTextCharFormat())
            self._stream_pos = cur.position()
        if state[0]:
            # following: the (hidden) text cursor goes to the end too, so whatever makes the
            # view show its cursor (Qt does on the first show of the window) shows the end,
            # not the top
            self.moveCursor(QTextCursor.End)
        self._end_edit(state)
        self.rendered.emit(conv, streaming)

    def _assistant_html(self, i: int, m: Turn, is_last: bool, streaming: bool) -> str:
        c = self.palette_colours
        head = f'<p style="margin-top:14px;"><b style="color:{c.get("accent")};">Assistant</b>'
        v = m.version
        if v is None:
            return head + ("" if streaming else " <i>(no reply)</i>") + "</p>"
        r = v.result
        head += "</p>"
        reasoning = r.all_reasoning()  # every round's: one stopped early in round 2 has some
        if reasoning:
            open_ = i in self.expanded
            head += (f'<p style="color:{c.get("muted")}; font-size:small;">'
                     f'<a href="reasoning:{i}" style="color:{c.get("muted")};">'
                     f"{'▾' if open_ else '▸'} Reasoning "
                     f"({plural(len(reasoning.split()), 'word')})</a>"
                     f"{'' if open_ else ' — click to show it here and in the pane'}</p>")
            if open_:
                shown_r, cut_r = cut_for_view(reasoning)
                body_r = html.escape(shown_r).replace("\n", "<br>")
                head += (f'<p style="color:{c.get("muted")}; font-size:small; '
                         f'margin-left:12px;">{body_r}</p>')
                if cut_r:
                    head += cut_note_html(cut_r, f"copyreasoning:{i}", c)
        coloured = None
        content, cut = cut_for_view(r.content)
        if self.colour_drafts and r.pieces and not cut and \
                spells_its_text(r, answer_only=True):
            # only the answer is coloured (reasoning and tool calls have their own place);
            # token texts whose answer is not the stored one (another tokenizer's, or a tool
            # call kept as text) are not used: the stored text is shown as it is
            coloured = answer_tokens_html(r.pieces, r.from_draft, c, starts_in_reasoning(r))
        if coloured is not None:
            body = coloured
        else:
            body = message_html(content, self.codes, c, readable_numbers=True) \
                if content.strip() else ""
            if cut:  # the view shows the start; the store, Copy all and Export keep it all
                body += cut_note_html(cut, f"copymsg:{i}", c)
        if r.tool_calls:
            names = ", ".join(html.escape(str(t.get("name"))) for t in r.tool_calls)
            body += (f'<p style="color:{c.get("muted")}; font-size:small;">'
                     f"Called {names} (see the tool pane)</p>")
        if v.error:
            body += (f'<p style="color:{c.get("error")};">Error: {html.escape(v.error)}</p>')
        elif not ((streaming and is_last) or v.stopped or r.content.strip() or r.tool_calls):
            note = (NO_ANSWER_AT_LIMIT if r.finish_reason == "length" else
                    NO_ANSWER_IN_REASONING if reasoning else NO_ANSWER)
            body += f'<p style="color:{c.get("muted")};"><i>{note}</i></p>'
        foot = f'<p style="color:{c.get("muted")}; font-size:small;">{figures_line(m)}'
        if r.mode in DRAFTING_MODES and r.speed_checked and not v.stopped and not v.error:
            if r.speedup is not None:
                foot += (f' · <span title="{html.escape(r.speedup.tooltip())}">'
                         f"{html.escape(r.speedup.label())}</span>")
            else:
                foot += (f' · <span title="{html.escape(NO_BASELINE_TIP)}">'
                         f"{NO_BASELINE}</span>")
        if r.context_note is not None:  # lasting: stored with the reply, shown when reopened
            foot += (f' · <span title="{html.escape(r.context_note.message)}">'
                     f"{html.escape(r.context_note.label())}</span>")
        if m.is_compare:
            # a link to each other side that wrote something (not one stopped before it ran
            # or before its first token)
            others = [k for k in MODES
                      if k in m.versions and k != m.chosen and not m.versions[k].empty]
            foot += " · compare turn"
            for other in others:
                label = "Plain" if other == Mode.PLAIN else mode_label(other)
                foot += (f' · <a href="choose:{other}" style="color:{c.get("accent")};">'
                         f"continue from {label} instead</a>")
        if not m.is_compare and len(m.versions) > 1:
            keys = list(m.versions)
            pos = keys.index(m.chosen)
            foot += f" · version {pos + 1} of {len(keys)}"
            if pos > 0:
                foot += (f' · <a href="version:{i}:{keys[pos - 1]}" '
                         f'style="color:{c.get("accent")};">‹&nbsp;previous</a>')
            if pos < len(keys) - 1:
                foot += (f' · <a href="version:{i}:{keys[pos + 1]}" '
                         f'style="color:{c.get("accent")};">next&nbsp;›</a>')
        if is_last and not streaming and r.finish_reason == "length" and not v.stopped \
                and not v.error:
            if m.is_compare:  # its sides are compared as they ran: the tooltip says so
                foot += (f' · <span title="{html.escape(NO_CONTINUE_COMPARE_TIP)}">'
                         f"{NO_CONTINUE_COMPARE}</span>")
            elif r.resumable:  # its row keeps the token ids to resume from
                foot += (f' · <a href="continue:" title="{html.escape(CONTINUE_TIP)}" '
                         f'style="color:{c.get("accent")};">Continue</a>')
        foot += "</p>"
        return head + body + foot

    def set_stream(self, text: str) -> None:
        """Show ``text``, the reply generated so far, below the last message.

        Up to :data:`STREAM_MARKDOWN_CHARS` characters the streamed part is re-rendered as
        Markdown each tick; past that only the new characters are appended as plain text,
        so a tick costs the same however long the reply grows."""
        if self._stream_pos is None or text == self._stream_text:
            return
        state = self._begin_edit()
        cur = QTextCursor(self.document())
        if len(text) <= STREAM_MARKDOWN_CHARS and not self._stream_plain:
            cur.setPosition(self._stream_pos)
            cur.movePosition(QTextCursor.End, QTextCursor.KeepAnchor)
            cur.removeSelectedText()
            codes = list(self._base_codes)
            cur.insertHtml(message_html(text, codes, self.palette_colours,
                                        readable_numbers=True))
            self.codes = codes
        else:
            if not self._stream_plain:  # switch to plain appends from here on
                self._stream_plain = True
            cur.movePosition(QTextCursor.End)
            cur.insertText(text[self._stream_len:], QTextCharFormat())
        self._stream_len = len(text)
        self._stream_text = text
        self._end_edit(state)



def _fixed_row(widgets: list, spacing: int) -> QWidget:
    """``widgets`` side by side in one fixed-size widget (one unit of the composer's wrapping
    row), ``spacing`` pixels apart."""
    row = QWidget()
    row.setSizePolicy(QSizePolicy.Fixed, QSizePolicy.Fixed)
    box = QHBoxLayout(row)
    box.setContentsMargins(0, 0, 0, 0)
    box.setSpacing(spacing)
    for w in widgets:
        box.addWidget(w)
    return row

EMPTY_SEND = "Type a message first: Send (or Enter) sends it."
"""The composer's note after Send with an empty message (it goes when typing starts)."""
EMPTY_COMPARE = "Type a message, then Compare runs it in each mode."
"""The composer's note after Compare with an empty message (it goes when typing starts)."""


class Composer(QWidget):
    """Input box with the Plain | DFlash (| DFlash2) switch, Colour drafts, Compare and one Send button
    that becomes Stop, in the same place, while a reply is written (as LM Studio and GPT4All
    do); the settings line for the next reply sits on its own line, never cut. In a narrow
    window the row of buttons wraps (:class:`~app.ui.fit.FlowLayout`): Compare and Send go to
    a line of their own at the right, every button whole.

    Enter sends, Shift+Enter inserts a new line, Tab moves the focus on. A mouse press on
    Stop within the platform's double-click interval after Send started the reply is ignored
    (the second click of a double-click on Send does not stop the reply it started). Signals: ``send(str)``,
    ``stop()``, ``compare(str)``, ``modeChanged(str)``; ``mode()`` returns "plain", "dflash",
    "dflash2" or "lookup" (the DFlash2 button shows only when the loaded pair has a DFlash2
    drafter: :meth:`set_modes`; Lookup needs no drafter)."""

    send = Signal(str)
    stop = Signal()
    compare = Signal(str)
    modeChanged = Signal(str)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.edit = QPlainTextEdit()
        self.edit.setObjectName("composer")
        self.edit.setPlaceholderText("Message the model — Enter to send, Shift+Enter for a new line")
        self.edit.setAccessibleName("Message input")
        self.edit.setFixedHeight(76)
        self.edit.setTabChangesFocus(True)  # Tab reaches the switch and Send, as in LM Studio
        self.edit.installEventFilter(self)
        self.plain_btn = QPushButton("Plain")
        self.plain_btn.setObjectName("segLeft")
        self.dflash_btn = QPushButton("DFlash")
        self.dflash_btn.setObjectName("segMid")
        self.dflash2_btn = QPushButton("DFlash2")
        self.dflash2_btn.setObjectName("segMid")
        self.lookup_btn = QPushButton("Lookup")
        self.lookup_btn.setObjectName("segRight")
        for b, tip in ((self.plain_btn, "Plain: the model writes one token at a time. Each "
                                        "token is one forward pass of the target model."),
                       (self.dflash_btn, "DFlash: a small drafter guesses several tokens at "
                                         "once and the model checks them in one pass. "
                                         "Block-diffusion speculative decoding; exact: with "
                                         "greedy sampling the text equals plain's."),
                       (self.dflash2_btn, "DFlash2: DFlash with convolutions in the drafter "
                                          "and a candidate selector that picks each guess "
                                          "among the model's top candidates given the guess "
                                          "before it; as exact as DFlash."),
                       (self.lookup_btn, "Lookup: no drafter; the guesses are the tokens "
                                         "that followed the latest earlier occurrence of the "
                                         "last few tokens in the chat (prompt lookup), "
                                         "checked by the model in one pass. Fast when the "
                                         "answer copies text (a tool result, a list); as "
                                         "exact as DFlash.")):
            b.setCheckable(True)
            b.setToolTip(tip)
            b.setAccessibleName(f"{b.text()} decoding")
        self.mode_group = QButtonGroup(self)
        self.mode_group.setExclusive(True)
        self.mode_group.addButton(self.plain_btn)
        self.mode_group.addButton(self.dflash_btn)
        self.mode_group.addButton(self.dflash2_btn)
        self.mode_group.addButton(self.lookup_btn)
        self.dflash2_btn.setVisible(False)
        self.dflash2_btn.setEnabled(False)
        self.dflash_btn.setChecked(True)
        self.mode_group.buttonToggled.connect(
            lambda _b, on: on and self.modeChanged.emit(self.mode()))
        self.colour_box = QCheckBox("Colour drafts")
        self.colour_box.setToolTip("Colour drafts: tint the answer's words the drafter guessed "
                                   "right. Tinted: a draft token the target accepted; plain: "
                                   "a token the target produced itself. The answer is shown as "
                                   "the tokens the model wrote (no Markdown formatting, numbers "
                                   "without thousands separators).")
        self.colour_box.setAccessibleName("Colour drafter tokens")
        self.send_btn = QPushButton("Send")
        self.send_btn.setObjectName("send")
        self.send_btn.setToolTip("Send (Enter / Ctrl+Return)")
        self.send_btn.setAccessibleName("Send")
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setObjectName("send")
        self.stop_btn.setToolTip("Stop generating (Esc); what was written so far is kept")
        self.stop_btn.setAccessibleName("Stop")
        self.stop_btn.setEnabled(False)
        self.stop_btn.installEventFilter(self)
        self.action_stack = QStackedWidget()
        self.action_stack.addWidget(self.send_btn)
        self.action_stack.addWidget(self.stop_btn)
        width = max(self.send_btn.sizeHint().width(), self.stop_btn.sizeHint().width(), 72)
        self.action_stack.setFixedWidth(width)
        self.action_stack.setSizePolicy(QSizePolicy.Fixed, QSizePolicy.Fixed)
        self._busy_clock = QElapsedTimer()
        self.compare_btn = QPushButton("Compare")
        self.compare_btn.setToolTip(compare_tip())
        self.compare_btn.setAccessibleName(compare_label())
        self.note = WrapLabel("")
        self.note.setObjectName("figureName")
        self.note.setAccessibleName("Settings for the next reply")
        self.mode_note = WrapLabel("", hide_empty=True)
        self.mode_note.setObjectName("figureName")
        self.mode_note.setAccessibleName("Mode note")
        # the switch, Colour drafts, and Compare + Send at the right: one row that wraps
        # onto a second (and third) line when the window is narrow, each widget whole
        self.mode_seg = _fixed_row([self.plain_btn, self.dflash_btn, self.dflash2_btn,
                                    self.lookup_btn], 0)
        self.actions = _fixed_row([self.compare_btn, self.action_stack], 6)
        self.row = FlowLayout(h_spacing=12, v_spacing=6)
        self.row.add_widget(self.mode_seg)
        self.row.add_widget(self.colour_box)
        self.row.add_widget(self.actions, right=True)
        # the mode note beside the settings line, or under it in a narrow composer
        self.info = QBoxLayout(QBoxLayout.LeftToRight)
        self.info.setSpacing(12)
        self.info.addWidget(self.note)
        self.info.addWidget(self.mode_note, 1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 8, 12, 10)
        lay.setSpacing(6)
        lay.addWidget(self.edit)
        lay.addLayout(self.row)
        lay.addLayout(self.info)
        self.send_btn.clicked.connect(self._send)
        self.edit.textChanged.connect(self._typed)
        self.stop_btn.clicked.connect(self.stop.emit)
        self.compare_btn.clicked.connect(self._compare)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        m = self.layout().contentsMargins()
        room = self.width() - m.left() - m.right() - self.note.sizeHint().width()
        side = room >= SIDE_NOTE_PX + self.info.spacing()
        self.info.setDirection(QBoxLayout.LeftToRight if side else QBoxLayout.TopToBottom)
        self.info.setSpacing(12 if side else 2)

    def mode(self) -> str:
        """"dflash", "dflash2", "lookup" or "plain" (the switch)."""
        if self.dflash2_btn.isChecked():
            return "dflash2"
        if self.lookup_btn.isChecked():
            return "lookup"
        return "dflash" if self.dflash_btn.isChecked() else "plain"

    def set_mode(self, mode: str) -> None:
        """Set the switch. "dflash2" before a pair offers it is kept until :meth:`set_modes`
        says whether it does, and shown, disabled, so that a switch restored while the pair
        loads always shows one mode selected."""
        if mode == Mode.DFLASH2 and self.dflash2_btn.isHidden():
            self._offer_dflash2(True, enabled=False)
        btn = {"dflash": self.dflash_btn, "dflash2": self.dflash2_btn,
               "lookup": self.lookup_btn}.get(mode, self.plain_btn)
        btn.setChecked(True)

    def _offer_dflash2(self, shown: bool, enabled: bool) -> None:
        """Show or hide the DFlash2 button (between DFlash and Lookup)."""
        self.dflash2_btn.setVisible(shown)
        self.dflash2_btn.setEnabled(enabled)

    def set_modes(self, modes: tuple[str, ...] | list[str], reason: str = "") -> None:
        """Offer the loaded pair's modes (``ModelInfo.modes``: "plain", "dflash",
        "dflash2", "lookup"): DFlash2 shows only when offered, Lookup is enabled when offered; a switch on a mode no longer offered moves
        to DFlash, else Plain; ``reason`` is DFlash's tooltip when no drafter is loaded."""
        v2 = "dflash2" in modes
        self._offer_dflash2(v2, enabled=v2)
        lost = self.mode() not in modes
        self.set_dflash_available("dflash" in modes or v2, reason)
        drafters = tuple(m for m in DRAFTER_MODES if m in modes) or ("dflash",)
        self.compare_btn.setToolTip(compare_tip(drafters))
        self.compare_btn.setAccessibleName(compare_label(drafters))
        self.dflash_btn.setEnabled("dflash" in modes)
        self.lookup_btn.setEnabled("lookup" in modes)
        if lost or not self.mode_group.checkedButton().isEnabled():
            self.set_mode("dflash" if "dflash" in modes else
                          "dflash2" if v2 else "plain")

    def set_busy(self, busy: bool) -> None:
        """Generating: Send turns into Stop (same place, same size), Compare off; and back."""
        self.send_btn.setEnabled(not busy)
        self.compare_btn.setEnabled(not busy and (self.dflash_btn.isEnabled()
                                                  or self.dflash2_btn.isEnabled()))
        self.stop_btn.setEnabled(busy)
        self.action_stack.setCurrentWidget(self.stop_btn if busy else self.send_btn)
        if busy:
            self._busy_clock.start()
        else:
            self.mode_note.setText("")

    def set_dflash_available(self, ok: bool, reason: str = "") -> None:
        """Enable DFlash (and Compare) only with a drafter; ``reason`` is shown otherwise."""
        self.dflash_btn.setEnabled(ok)
        self.compare_btn.setEnabled(ok)
        self.dflash_btn.setToolTip(self.dflash_btn.toolTip() if ok else reason)
        if not ok:
            on_drafter = self.mode() in DRAFTER_MODES
            self._offer_dflash2(False, enabled=False)
            if on_drafter:  # Lookup and Plain need no drafter: kept
                self.plain_btn.setChecked(True)

    def _take(self) -> str | None:
        text = self.edit.toPlainText().strip()
        if not text or not self.send_btn.isEnabled():
            return None
        self.edit.clear()
        return text

    def _nothing_typed(self, note: str) -> bool:
        """An empty (or spaces-only) message while idle: ``note`` says what the button needs
        (Send always answers) and the box gets the focus."""
        if self.edit.toPlainText().strip() or not self.send_btn.isEnabled():
            return False
        self.mode_note.setText(note)
        self.edit.setFocus()
        return True

    def _send(self) -> None:
        if self._nothing_typed(EMPTY_SEND):
            return
        text = self._take()
        if text:
            self.mode_note.setText("")
            self.send.emit(text)

    def _typed(self) -> None:
        """Typing answers an empty Send's or Compare's note: it goes."""
        if self.mode_note.text() in (EMPTY_SEND, EMPTY_COMPARE) and self.edit.toPlainText():
            self.mode_note.setText("")

    def _compare(self) -> None:
        if self._nothing_typed(EMPTY_COMPARE):
            return
        text = self._take()
        if text:
            self.mode_note.setText("")
            self.compare.emit(text)

    def _too_soon_to_stop(self) -> bool:
        """True within the double-click interval after Send turned into Stop."""
        return self._busy_clock.isValid() and \
            self._busy_clock.elapsed() < QGuiApplication.styleHints().mouseDoubleClickInterval()

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 (Qt override)
        if obj is self.stop_btn and event.type() in (QEvent.MouseButtonPress,
                                                     QEvent.MouseButtonDblClick,
                                                     QEvent.MouseButtonRelease) \
                and self._too_soon_to_stop():
            return True  # the second click of a double-click on Send
        if obj is self.edit and event.type() == QEvent.KeyPress:
            ke: QKeyEvent = event
            if ke.key() in (Qt.Key_Return, Qt.Key_Enter) and \
                    not ke.modifiers() & Qt.ShiftModifier:
                self._send()
                return True
        return super().eventFilter(obj, event)

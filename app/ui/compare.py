"""Compare: the same prompt through plain and DFlash side by side, and DFlash2 as a third side
when the loaded pair has a DFlash2 drafter too.

Each drafting side is judged against plain once (:func:`judge`, a :class:`Verdict`); the
header's width only picks its full or short wording. The first token where the two outputs
differ is highlighted on both sides; when they agree the header says "identical, N tokens";
when they differ it gives the target's top-two logit gap at the first divergence (computed on
the worker). A side stopped while everything it wrote equals the other side's is partial, not a
divergence, in whichever round Stop cut it: "stopped after N tokens (all equal to plain's)",
nothing marked (:func:`cut_before_differing`), and the chat does not continue from it by
default. Sides sampled at a temperature above 0 are not expected to match, and the header says
so instead of "identical" or "differs". Each side shows its figures; the header gives the speed
ratio (DFlash tok/s / plain tok/s) when neither side was stopped. With three sides
the header has one such line per drafting side, each against plain ("DFlash: …", "DFlash2: …").
A view too narrow for its columns (and a three-sided one under :data:`NARROW_PX`) shows the
sides as tabs instead, so opening Compare never widens the window. The user picks the version
the conversation continues from (DFlash's by default).

A chat whose last turn is a Compare reopens it (:meth:`CompareView.show_turn`) from what is
stored: each side's reply row with its figures and its top-two gap, a side stopped before it
ran as "not run" (:func:`stored_sides`). What storage cannot give back is left out and the
header says so: a side whose row is missing, the gap of a row stored before it was kept, and
the mark on the first divergence until the token texts come from the loaded model's tokenizer.
"""

from __future__ import annotations

import dataclasses
import html
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QStackedWidget,
    QTabWidget,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.chat.measure import ReplyFigures
from app.engine.compare import first_divergence
from app.engine.modes import DRAFTER_MODES, DRAFTING_MODES, Mode
from app.ui.fit import FullHeightLabel, ShortWhenNarrowLabel
from app.ui.render import (
    SECTION_TITLES,
    call_text,
    cut_for_view,
    earlier_rounds,
    earlier_rounds_html,
    mark_section,
    sections_html,
    spells_its_text,
    starts_in_reasoning,
)
from app.ui.text import mode_label, plural, seconds_text

SIDES = (Mode.PLAIN, *DRAFTER_MODES)
"""Every side a Compare can have, in column order (DFlash2 only with a DFlash2 drafter):
plain and the modes that run a drafter."""
NARROW_PX = 900
"""Below this width a three-sided Compare shows its sides as tabs."""
TEXT_MIN_PX = 64
"""The least height of a side's text (pixels; about three lines)."""


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token that differs between ``a`` and ``b`` (token id lists); when
    one is a prefix of the other, the shorter length; None when they are equal
    (``app.engine.compare.first_divergence``)."""
    return first_divergence(a, b)


def cut_before_differing(cut, whole) -> bool:
    """True when ``cut`` (a :class:`~app.chat.turns.ReplyResult`) was stopped (finish reason
    "cancelled") before it generated anything that differs from ``whole``'s: its earlier
    rounds are ``whole``'s first ones (:func:`generated_rounds`) and, in the round it was
    stopped in, either that is ``whole``'s last round and its tokens a strict prefix of
    ``whole``'s, or that is an earlier round of ``whole`` and its reasoning and text so far
    start what ``whole`` generated there (or it was stopped once that round's tool calls
    were made). Such a side is partial, not a divergence."""
    if cut.finish_reason != "cancelled":
        return False
    mine, theirs = generated_rounds(cut), generated_rounds(whole)
    rounds, last = getattr(cut, "rounds", 1), getattr(whole, "rounds", 1)
    if rounds == last:
        n = len(cut.tokens)
        return n < len(whole.tokens) and cut.tokens == whole.tokens[:n] and mine == theirs
    if rounds > last or mine != theirs[:len(mine)]:
        return False
    if len(mine) >= rounds:  # stopped after its round's tool calls: the round is whole
        return True
    if len(mine) >= len(theirs):
        return False
    reasoning, text, _ = theirs[len(mine)]
    so_far, written = str(cut.reasoning or "").strip(), str(cut.content or "").strip()
    if written:
        return so_far == reasoning and text.startswith(written)
    return reasoning.startswith(so_far)


def stopped_before_differing(plain, other) -> bool:
    """True when ``other`` (a drafting side's :class:`~app.chat.turns.ReplyResult`) was stopped
    before it wrote anything that differs from ``plain``'s (:func:`cut_before_differing`),
    in the same round as plain's last or an earlier one. Such a side is partial, not a
    divergence."""
    return cut_before_differing(other, plain)


def sampled_temperature(plain, other) -> float:
    """The temperature the two sides sampled at (the higher of the two; 0.0: both greedy)."""
    return max(float(getattr(plain, "temperature", 0.0) or 0.0),
               float(getattr(other, "temperature", 0.0) or 0.0))


def divergence(plain, other) -> int | None:
    """The index of the last round's token to mark where ``other`` first differs from
    ``plain`` (:attr:`Verdict.mark` of :func:`judge`); None when they are equal, when one
    side was stopped before it differed, when they were sampled (temperature above 0) or
    when the stopped side's last round is an earlier round than plain's."""
    return judge(plain, other).mark


def generated_rounds(result) -> list[tuple]:
    """What the model generated in each round before the last of a tool reply: per assistant
    message that made tool calls, ``(reasoning, text, ((name, arguments JSON), ...))``, read
    from ``ReplyResult.messages`` (live or stored). Tool results are inputs, not compared."""
    import json

    out = []
    for m in getattr(result, "messages", None) or []:
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            continue
        calls = tuple((str((c.get("function") or {}).get("name")),
                       json.dumps((c.get("function") or {}).get("arguments"), sort_keys=True,
                                  default=str)) for c in m["tool_calls"])
        out.append((str(m.get("reasoning_content") or "").strip(),
                    str(m.get("content") or "").strip(), calls))
    return out


def _first_differing_round(a: list[tuple], b: list[tuple]) -> int | None:
    """1-based number of the first earlier round where ``a`` and ``b`` (two
    :func:`generated_rounds`) differ, the round after the shorter one's when one is the start
    of the other; None when they are equal."""
    if a == b:
        return None
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) + 1


def _same_rounds_words(n: int) -> str:
    return "earlier round the same" if n == 1 else f"{n} earlier rounds the same"


def earlier_rounds_note(plain, dflash) -> tuple[str, bool]:
    """For a tool reply, the verdict's words on its earlier rounds and whether the two sides
    generated the same reasoning, text and tool calls in all of them
    (:func:`generated_rounds`): ("earlier round the same", True), ("2 earlier rounds the
    same", True) or ("round 1 already differs", False); ("", False) when neither side has
    earlier rounds. What the words mean is in :data:`VERDICT_HELP`."""
    a, b = generated_rounds(plain), generated_rounds(dflash)
    if not a and not b:
        return "", False
    k = _first_differing_round(a, b)
    if k is None:
        return _same_rounds_words(len(a)), True
    return f"round {k} already differs", False


#: The verdict's tooltip: what its short words stand for (a verdict is kept to about one line
#: a side, so that the compared replies keep their height in a 1280x800 window).
VERDICT_HELP = (
    "Identical: the drafting side generated exactly plain decoding's tokens.\n"
    "For a reply with tool calls, the tokens compared are the last round's (the answer after "
    "the tool calls); each earlier round is compared by what it generated: its reasoning, "
    "text and tool calls (tool results are inputs, not generated).\n"
    "Stopped before it differed: Stop cut a side while everything it had written equalled "
    "the other side's.\n"
    "Sampled: at a temperature above 0 each side draws its tokens at random, so the sides "
    "are not expected to match token for token.\n"
    "Speed: the drafting side's tok/s over plain's, for the same reply.")


@dataclass(frozen=True)
class Verdict:
    """One drafting side against plain, judged once (:func:`judge`) and worded at two lengths;
    the header's width only picks the wording.

    Attributes:
        kind: "identical" (the same tokens, and the same earlier rounds of a tool reply),
            "differs" (a token of the last round or an earlier round differs), "stopped" (a
            side was stopped before anything it wrote differed) or "sampled" (temperature
            above 0: the sides are not expected to match).
        full: the header's line for a wide view, e.g. "identical, 59 tokens · DFlash 1.99×
            plain speed".
        short: the same verdict in fewer words, e.g. "identical · 1.99× plain".
        mark: index of the last round's token to highlight on both sides (the first
            divergence); None when nothing is marked.
    """

    kind: str
    full: str
    short: str
    mark: int | None = None


def _stopped_words(cut, whole, whose: str, equal_to: str) -> tuple[str, str]:
    """(full, short) words for ``cut`` stopped before it differed from ``whole``
    (:func:`cut_before_differing`); ``whose`` starts them ("" or "plain "), ``equal_to``
    names the other side ("plain's", "DFlash's")."""
    n = len(cut.tokens)
    rounds, last = getattr(cut, "rounds", 1), getattr(whole, "rounds", 1)
    earlier = len(generated_rounds(cut)) if rounds > 1 else 0
    if rounds < last:
        where = f"stopped in round {rounds} of {last} "
        text = where + ("before its first token" if n == 0 else
                        f"after {plural(n, 'token')} (all equal to {equal_to})")
        short = f"{whose}stopped before it differed"
    else:
        of = " of the last round" if rounds > 1 else ""
        text = ("stopped before its first token" + of if n == 0 else
                f"stopped after {plural(n, 'token')}{of} (all equal to {equal_to})")
        short = (f"{whose}stopped before it differed" if n == 0 or whose else
                 f"stopped after {plural(n, 'token')}, all equal")
    if earlier:
        text += f", {_same_rounds_words(earlier)}"
    return whose + text, short


def judge(plain, other, label: str = "DFlash", named: bool = True) -> Verdict:
    """The verdict on two :class:`~app.chat.turns.ReplyResult` objects (``label`` names the
    drafting side ``other``: "DFlash" or "DFlash2"; ``named=False`` leaves it out of the
    speed-up, for a header line that starts with it), computed once for both wordings.

    The tokens compared are the last round's; for a tool reply the earlier rounds are
    compared by what they generated (:func:`earlier_rounds_note`), and any that differs makes
    the sides differ. A side stopped before it differed (:func:`cut_before_differing`, either
    side) is "stopped", whatever the round counts. Sides sampled at a temperature above 0
    (:func:`sampled_temperature`) are "sampled": not expected to match. The speed ratio
    (``other``'s tok/s over plain's) is given when neither side was stopped. Kept short (the
    tooltip, :data:`VERDICT_HELP`, explains it)."""
    stopped = "cancelled" in (plain.finish_reason, other.finish_reason)
    speed_full = speed_short = ""
    ps, ds = plain.summary, other.summary
    if ps is not None and ds is not None and ps.tok_per_s > 0 and not stopped:
        ratio = f"{ds.tok_per_s / ps.tok_per_s:.2f}× plain"
        speed_full = f" · {label + ' ' if named else ''}{ratio} speed"
        speed_short = f" · {ratio}"
    temperature = sampled_temperature(plain, other)
    if temperature > 0:
        full = f"sampled (temperature {temperature:g}): sides are not expected to match"
        cut = other if other.finish_reason == "cancelled" else plain if stopped else None
        if cut is not None:
            who = "" if cut is other else "plain "
            full += f"; {who}stopped after {plural(len(cut.tokens), 'token')}"
        return Verdict("sampled", full + speed_full,
                       "sampled, not expected to match" + speed_short)
    if cut_before_differing(other, plain):
        full, short = _stopped_words(other, plain, "", "plain's")
        return Verdict("stopped", full, short)
    if cut_before_differing(plain, other):
        full, short = _stopped_words(plain, other, "plain ", f"{label}'s")
        return Verdict("stopped", full, short)
    p_rounds, o_rounds = getattr(plain, "rounds", 1), getattr(other, "rounds", 1)
    if other.finish_reason == "cancelled" and o_rounds < p_rounds:
        # stopped in an earlier round than plain's last: its tokens are another round's
        k = _first_differing_round(generated_rounds(plain), generated_rounds(other))
        k = k if k is not None else len(generated_rounds(other)) + 1
        return Verdict("differs", f"stopped in round {o_rounds} of {p_rounds}; round {k} "
                       "already differs", f"round {k} differs")
    rounds = max(p_rounds, o_rounds)
    earlier, all_same = earlier_rounds_note(plain, other) if rounds > 1 else ("", False)
    round_differs = bool(earlier) and not all_same
    diff = first_difference(plain.tokens, other.tokens)
    n = len(plain.tokens)
    if diff is None and not round_differs:
        if all_same:
            full = (f"identical in {'both' if rounds == 2 else f'all {rounds}'} rounds "
                    f"({n} tokens in the last)")
        elif rounds > 1:
            full = f"identical, {n} tokens in the last round"
        else:
            full = f"identical, {n} tokens"
        return Verdict("identical", full + speed_full, "identical" + speed_short)
    if diff is None:
        full = f"{earlier}; last round identical, {plural(n, 'token')}"
    else:
        gap = getattr(other, "top2_gap", None)
        gap = "" if gap is None else f"; top-two logit gap there {gap:.3g}"
        full = (f"differs from token {diff} (of {n} plain / {len(other.tokens)} {label}"
                f"{', stopped' if other.finish_reason == 'cancelled' else ''}{gap})")
        if earlier:
            full += f" in the last round; {earlier}"
        shown = plain if plain.pieces else other
        where = mark_section(shown.pieces, diff, starts_in_reasoning(shown))
        if where:
            full += f" · first divergence in the {SECTION_TITLES[where].lower()} (marked)"
    short = earlier.replace(" already", "") if round_differs else f"differs from token {diff}"
    return Verdict("differs", full + speed_full, short + speed_short, diff)


def verdict(plain, dflash, label: str = "DFlash", named: bool = True, short: bool = False
            ) -> str:
    """Header text for two :class:`~app.chat.turns.ReplyResult` objects: :func:`judge`'s
    full wording, or with ``short=True`` its short one ("identical", "differs from token
    12", "round 1 differs", "stopped after 9 tokens, all equal", "sampled, not expected to
    match", with the speed as "1.99× plain"), for a header too narrow for the full form."""
    v = judge(plain, dflash, label, named)
    return v.short if short else v.full


def text_sections_html(result, colours: dict) -> str:
    """A side without token texts: its reasoning, answer and tool calls as sections."""
    muted = colours.get("muted", "#667085")
    out = []
    for title, body in (("Reasoning", result.reasoning), ("Answer", result.content),
                        ("Tool calls", "<br>".join(
                            html.escape(call_text(c)) for c in result.tool_calls or []))):
        if body.strip():
            cut = 0
            if title != "Tool calls":  # a huge imported side: its start, as the chat shows
                shown, cut = cut_for_view(body.strip())
                body = html.escape(shown).replace("\n", "<br>")
            out.append(f'<p style="color:{muted}; font-size:small;"><b>{title}</b></p>'
                       f"<p>{body}</p>")
            if cut:
                out.append(f'<p style="color:{muted}; font-size:small;">… {cut:,} more '
                           "characters not shown here: export the chat (File › Export) to "
                           "read all of it</p>")
    return "".join(out) or "<p></p>"


def side_figures(result) -> str:
    """One line of figures for a side ("N tokens (stopped)" for a side that was stopped)."""
    s = result.summary
    if s is None:
        return "no figures"
    stopped = " (stopped)" if getattr(result, "finish_reason", "") == "cancelled" else ""
    tool_s = sum(float(c.get("duration_s") or 0.0) for c in getattr(result, "tool_calls", None) or ()
                 if isinstance(c, dict))
    fig = ReplyFigures.of_summary(result.mode, s, tool_s)
    parts = [f"{s.tok_per_s:.1f} tok/s", f"{s.generated_tokens} tokens{stopped}"]
    if fig.time_to_answer_s > 0 and not stopped:
        tools = f" (tools {seconds_text(fig.tool_s)})" if fig.tool_s > 0 else ""
        parts.append(f"answer in {seconds_text(fig.time_to_answer_s)}{tools}")
    if s.generated_tokens:  # stopped before its first token: no time to first token
        parts.append(f"first token {seconds_text(s.ttft_s)}")
    if result.mode in DRAFTING_MODES:
        if s.tau is not None:
            parts.append(f"τ {s.tau:.2f}")
        if s.acceptance_rate is not None:
            parts.append(f"acceptance {s.acceptance_rate * 100:.0f}%")
        parts.append(plural(s.replays, "replay"))
    return " · ".join(parts)


def stored_sides(turn) -> tuple[dict, tuple[str, ...], list[str]]:
    """A Compare :class:`~app.chat.turns.Turn` (read back from storage, or kept from this
    run) as :meth:`CompareView.set_results` shows it.

    Returns ``(results, missing, notes)``: ``results`` maps each side (plain, DFlash unless
    the turn's one drafting side is DFlash2, DFlash2 when the turn has one) to its
    :class:`~app.chat.turns.ReplyResult` or None (not run, or not stored); ``missing`` the sides with no stored row; ``notes`` what storage
    could not give back, for the header (the gap of a row stored without it, the mark on the
    first divergence while the token texts are not there)."""
    results: dict = {}
    missing: list[str] = []
    for key in SIDES:
        v = turn.versions.get(key)
        if v is None:
            if key == Mode.PLAIN or key == Mode.DFLASH and "dflash2" not in turn.versions:
                results[key] = None
                missing.append(key)
            continue
        r = v.result
        if r.pieces and not spells_its_text(r):
            r = dataclasses.replace(r, pieces=[])
        results[key] = None if v.never_ran else r
    notes: list[str] = []
    plain = results.get("plain")
    differ = [r for k, r in results.items() if k != Mode.PLAIN and r is not None
              and plain is not None and divergence(plain, r) is not None]
    if any(r.top2_gap is None and not r.gap_checked for r in differ):
        notes.append("the top-two logit gap was not stored")
    if differ and not (plain.pieces and all(r.pieces for r in differ)):
        notes.append("the first divergence is not marked (its token texts are not stored)")
    return results, tuple(missing), notes


_TAB_FRAME: list[int] = []


def _tab_frame_width() -> int:
    """How much wider a tab widget is than its page (frame and margins, in pixels; measured
    once with the app's style)."""
    if not _TAB_FRAME:
        page = QWidget()
        page.setMinimumWidth(100)
        tabs = QTabWidget()
        tabs.addTab(page, "Plain")
        _TAB_FRAME.append(max(0, tabs.minimumSizeHint().width() - 100))
        tabs.deleteLater()
    return _TAB_FRAME[0]


class CompareView(QFrame):
    """Side-by-side view of a Compare turn. ``chosen(str)`` emits "plain", "dflash" or
    "dflash2".

    Two sides (plain and the pair's one drafter, DFlash or DFlash2) as columns; with a
    DFlash2 side beside DFlash (:meth:`set_sides`) three columns, or three tabs while the
    view is narrower than :data:`NARROW_PX`; any sides as tabs while the view is narrower
    than its columns need (:meth:`columns_width`)."""

    chosen = Signal(str)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("side")
        # a long verdict wraps and, when even one line a side would not fit, gives way to a
        # short one (the full one in the tooltip): it never widens the window
        self.header = ShortWhenNarrowLabel()
        self.header.setObjectName("sectionTitle")
        self.header.set_forms("", help=VERDICT_HELP)
        self.header.setAccessibleName("Comparison result")
        self.colours: dict = {}
        self.texts: dict[str, QTextBrowser] = {}
        self.figs: dict[str, QLabel] = {}
        self.titles: dict[str, QLabel] = {}  # a column's title (tabs name their side)
        self.buttons: dict[str, QPushButton] = {}
        self.columns: dict[str, QWidget] = {}
        self.sides: tuple[str, ...] = ("plain", "dflash")
        self.columns_row = QWidget()
        self.row = QHBoxLayout(self.columns_row)
        self.row.setContentsMargins(0, 0, 0, 0)
        for key in SIDES:
            title = mode_label(key)
            col = QWidget()
            v = QVBoxLayout(col)
            v.setContentsMargins(0, 0, 0, 0)
            t = QLabel(title)
            t.setObjectName("sectionTitle")
            self.titles[key] = t
            tb = QTextBrowser()
            tb.setAccessibleName(f"{title} reply")
            # the text takes what height there is, down to a few lines (it scrolls itself):
            # a low window shrinks it before the whole view has to scroll
            tb.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Ignored)
            tb.setMinimumHeight(TEXT_MIN_PX)
            fig = FullHeightLabel("")
            fig.setObjectName("figureName")
            btn = QPushButton(f"Continue from {title}")
            btn.setCheckable(True)
            btn.setAccessibleName(f"Continue from {title}")
            btn.clicked.connect(lambda _=False, k=key: self._choose(k))
            v.addWidget(t)
            v.addWidget(tb, 1)
            v.addWidget(fig)
            v.addWidget(btn)
            self.row.addWidget(col)
            col.setVisible(key in self.sides)
            self.columns[key] = col
            self.texts[key], self.figs[key], self.buttons[key] = tb, fig, btn
        self.tabs = QTabWidget()
        self.tabs.setAccessibleName("Compared replies")
        self.stack = QStackedWidget()
        self.stack.addWidget(self.columns_row)
        self.stack.addWidget(self.tabs)
        self.tabbed = False
        top = QHBoxLayout()
        top.addWidget(self.header, 1)
        self.close_btn = QPushButton("Hide")
        self.close_btn.setAccessibleName("Hide comparison")
        self.close_btn.clicked.connect(self.hide)
        top.addWidget(self.close_btn, 0, Qt.AlignTop)
        # header and sides scroll when the window is too low for them (never drawn over
        # each other); the sides' arrangement follows the width there is (the viewport's)
        self.body = QFrame()
        self.body.setObjectName("side")
        self._body_layout = QVBoxLayout(self.body)
        self._body_layout.setContentsMargins(12, 8, 12, 8)
        self._body_layout.addLayout(top)
        self._body_layout.addWidget(self.stack, 1)
        self.scroll = QScrollArea()
        self.scroll.setObjectName("sideScroll")
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.scroll.setFocusPolicy(Qt.NoFocus)  # Tab goes to the sides (brought into view)
        self.scroll.setWidget(self.body)
        self.scroll.viewport().installEventFilter(self)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.scroll)
        self.results: dict = {}
        self.missing: tuple[str, ...] = ()
        """The sides shown without a stored row (:meth:`set_results`)."""

    def set_sides(self, sides: tuple[str, ...]) -> None:
        """Show these sides (``("plain", "dflash")``, ``("plain", "dflash2")`` or all of
        :data:`SIDES`)."""
        self.sides = tuple(k for k in SIDES if k in sides)
        self._arrange(force=True)

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 (Qt override)
        if obj is self.scroll.viewport() and event.type() == QEvent.Resize:
            self._arrange()
        return super().eventFilter(obj, event)

    def _side_margins(self) -> int:
        m = self._body_layout.contentsMargins()
        return m.left() + m.right()

    def columns_width(self) -> int:
        """The width the shown sides need as columns, each whole (pixels)."""
        mins = [self.columns[k].minimumSizeHint().width() for k in self.sides]
        return sum(mins) + self.row.spacing() * (len(mins) - 1) + self._side_margins()

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        """As narrow as the sides shown as tabs: opening Compare never widens the window
        (a view narrower than :meth:`columns_width` shows tabs)."""
        hint = super().minimumSizeHint()
        widest = max(self.columns[k].minimumSizeHint().width() for k in self.sides)
        top = (self.header.minimumSizeHint().width() + self._body_layout.spacing()
               + self.close_btn.sizeHint().width())
        bar = self.scroll.verticalScrollBar().sizeHint().width()  # when the body scrolls
        return QSize(max(widest + _tab_frame_width(), top) + self._side_margins() + bar,
                     hint.height())

    def _arrange(self, force: bool = False) -> None:
        """Columns, or tabs when the view is too narrow for the columns (and for three sides
        under :data:`NARROW_PX`); the widgets move between them."""
        width = self.scroll.viewport().width()  # the body may be wider: it never is narrower
        tabbed = (len(self.sides) > 2 and width < NARROW_PX) or width < self.columns_width()
        if tabbed == self.tabbed and not force:
            return
        self.tabbed = tabbed
        while self.tabs.count():
            self.tabs.removeTab(0)
        for key in SIDES:
            col = self.columns[key]
            if tabbed and key in self.sides:
                # the tab widget shows one page at a time: never force a page visible
                self.tabs.addTab(col, mode_label(key))
            else:
                self.row.addWidget(col)
                col.setVisible(not tabbed and key in self.sides)
        for title in self.titles.values():
            title.setVisible(not tabbed)  # the tab says it: its line goes to the text
        if tabbed:
            self.tabs.setCurrentIndex(0)
            for i in range(self.tabs.count()):
                self.tabs.widget(i).setVisible(i == 0)
        self.stack.setCurrentWidget(self.tabs if tabbed else self.columns_row)

    def _choose(self, key: str) -> None:
        self.set_choice(key)
        self.chosen.emit(key)

    def set_choice(self, key: str) -> None:
        """Check the button of the version the conversation continues from."""
        for k, b in self.buttons.items():
            b.setChecked(k == key)

    def show_running(self, which: str) -> None:
        """Header while a side is generating; that side's caption says "running…" and the
        sides after it "waiting" (a side done before it keeps its figures,
        :meth:`show_side`)."""
        name = mode_label(which) if which in DRAFTING_MODES else "plain"
        self.header.set_forms(f"Comparing… running {name}", help=VERDICT_HELP)
        if which in self.sides:
            later = self.sides[self.sides.index(which) + 1:]
            self.figs[which].setText("running…")
            for key in later:
                self.figs[key].setText("waiting")

    def show_side(self, key: str, result) -> None:
        """Show a side that finished while the Compare runs on: its text and figures (its
        button stays off and the first divergence unmarked until every side is done,
        :meth:`set_results`)."""
        self.results[key] = result
        self._show_result(key, result, None)

    def stream(self, key: str, text: str) -> None:
        """Show a side's streaming text (plain text)."""
        tb = self.texts[key]
        tb.setPlainText(text)
        tb.verticalScrollBar().setValue(tb.verticalScrollBar().maximum())

    def set_results(self, plain, dflash, chosen: str = "dflash", dflash2=None,
                    three: bool | None = None, missing: tuple[str, ...] = (),
                    note: str = "", sides: tuple[str, ...] | None = None) -> None:
        """Show finished :class:`~app.chat.turns.ReplyResult`; any may be None (stopped
        before it ran, or in ``missing``: not stored). ``sides`` names the sides shown
        (e.g. ``("plain", "dflash2")`` for a pair whose one drafter is DFlash2); without
        it, plain and DFlash, and DFlash2 too when ``three`` (default: ``dflash2`` is
        given). ``note`` goes under the verdict."""
        if sides is None:
            three = dflash2 is not None if three is None else three
            sides = SIDES if three else ("plain", "dflash")
        self.set_sides(sides)
        given = {"plain": plain, "dflash": dflash, "dflash2": dflash2}
        self.results = {k: given[k] for k in self.sides}
        self.missing = tuple(missing)
        # each drafting side judged once: its mark and both wordings of the header
        verdicts = {k: judge(plain, r, mode_label(k), named=len(self.results) == 2)
                    for k, r in self.results.items()
                    if k != Mode.PLAIN and plain is not None and r is not None}
        marks = {k: v.mark for k, v in verdicts.items()}
        plain_mark = next((m for m in marks.values() if m is not None), None)
        tail = f"\n{note}" if note else ""
        full, short = self._header(verdicts)
        self.header.set_forms(full + tail, short + tail, VERDICT_HELP)
        for key, r in self.results.items():
            if r is None:
                self.texts[key].setPlainText("")
                self.figs[key].setText("not stored" if key in self.missing else "not run")
                self.buttons[key].setEnabled(False)
                continue
            self.buttons[key].setEnabled(True)
            self._show_result(key, r, plain_mark if key == Mode.PLAIN else marks.get(key))
        self.set_choice(chosen)

    def _show_result(self, key: str, r, mark: int | None) -> None:
        """A side's text (its earlier rounds, then the last round with token ``mark``
        highlighted) and its figures."""
        earlier = earlier_rounds_html(r.messages, self.colours)
        # the calls an earlier round made are listed there, not again under the last round
        made = {c.get("id") for m in earlier_rounds(r.messages)
                for c in m.get("tool_calls") or []}
        r = dataclasses.replace(r, tool_calls=[c for c in r.tool_calls
                                               if c.get("id") not in made])
        if r.pieces:
            last = sections_html(r.pieces, mark, self.colours, r.tool_calls,
                                 starts_in_reasoning(r))
        else:  # no token texts: the stored text, sections from the reply's fields
            last = text_sections_html(r, self.colours)
        self.texts[key].setHtml(earlier + last)
        self.figs[key].setText(side_figures(r))

    def show_turn(self, turn) -> None:
        """Show a finished Compare :class:`~app.chat.turns.Turn` (a reopened chat's last
        turn) as it looked live: its sides, their figures, the verdict and the version the
        chat continues from; what storage lacks is left out and said under the verdict
        (:func:`stored_sides`)."""
        results, missing, notes = stored_sides(turn)
        note = ("Reopened from storage: " + "; ".join(notes) + ".") if notes else ""
        self.set_results(results["plain"], results.get("dflash"), turn.chosen or "dflash",
                         results.get("dflash2"), missing=missing, note=note,
                         sides=tuple(results))
        self.show()

    def _header(self, verdicts: dict[str, Verdict]) -> tuple[str, str]:
        """The verdict as (full, short) text: one line for two sides, one per drafting side
        for three, both wordings from each side's one :class:`Verdict` (``verdicts``, by
        side)."""
        res = self.results
        plain = res["plain"]
        missing = self.missing
        if "plain" in missing:
            return ("the plain side of this comparison is not stored",) * 2
        if len(res) == 2:
            key = self.sides[1]
            if key in missing:
                return (f"the {mode_label(key)} side of this comparison is not stored",) * 2
            if plain is None or res[key] is None:
                return ("comparison stopped before both sides ran",) * 2
            v = verdicts[key]
            return v.full, v.short
        if plain is None:
            return ("comparison stopped before the plain side ran",) * 2
        full, short = [], []
        for key in SIDES[1:]:
            label, r = mode_label(key), res[key]
            if r is None:
                words = "not stored" if key in missing else "stopped before it ran"
                full.append(f"{label}: {words}")
                short.append(f"{label}: {words}")
                continue
            v = verdicts[key]
            full.append(f"{label}: {v.full}")
            short.append(f"{label}: {v.short}")
        return "\n".join(full), "\n".join(short)

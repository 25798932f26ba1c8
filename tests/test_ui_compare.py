"""The Compare view as a user stops it, watches it run and reads its tool calls (offscreen,
pytest-qt, the scripted backend).

A side stopped while every token it wrote equals plain's is partial, not a divergence; a side
that finished shows its figures while the next side runs; tool calls read as JSON, as the tool
pane shows them.
"""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from test_ui_window import PROMPT, ScriptedBackend, make_window  # noqa: E402

from app.chat.turns import ReplyResult, Turn, Version  # noqa: E402
from app.engine.events import Summary  # noqa: E402
from app.ui.compare import CompareView, side_figures, stored_sides, verdict  # noqa: E402

# ``qs`` and the autouse ``_allow_engine_after`` are conftest.py fixtures.

COLOURS = {"diff_bg": "#ffd7d5", "muted": "#667085"}


def _side(mode, tokens, finish="stop", tok_per_s=100.0, **kw):
    return ReplyResult(mode=mode, tokens=list(tokens), pieces=[f"t{t} " for t in tokens],
                       content="".join(f"t{t} " for t in tokens), finish_reason=finish,
                       summary=Summary(mode=mode, generated_tokens=len(tokens),
                                       tok_per_s=tok_per_s), **kw)


def side_texts(qtbot, plain, dflash) -> dict[str, str]:
    """The plain text of each side of a two-sided Compare view showing ``plain``/``dflash``."""
    view = CompareView()
    qtbot.addWidget(view)
    view.colours = COLOURS
    view.set_results(plain, dflash)
    return {key: view.texts[key].toPlainText() for key in ("plain", "dflash")}


def _loaded_window(qtbot, qs):
    """A window with the scripted pair loaded, its replies long enough to stop (400 cycles
    of 4 tokens, 4 ms each)."""
    win = make_window(qtbot, qs, ScriptedBackend(cycles=400, block=4, delay_s=0.004))
    win.load_model("t", "d")
    qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
    return win


# ------------------------------------------------------------------ 1. a stopped side
def test_compare_stopped_in_the_dflash_side_is_not_called_a_divergence(qtbot, qs):
    """Stop while the DFlash side runs: its tokens are plain's first ones, so the header says
    it stopped (not "differs from token N"), nothing is marked and no speed-up is claimed."""
    win = _loaded_window(qtbot, qs)
    try:
        with qtbot.waitSignal(win.replyFinished, timeout=60_000) as blocker:
            assert win.replies.compare(PROMPT)
            qtbot.waitUntil(lambda: win.replies.run.sides["dflash"].stats.cycles >= 3,
                            timeout=30_000)
            win.stop()
        msg = blocker.args[0]
        plain, dflash = (msg.versions[k].result for k in ("plain", "dflash"))
        assert plain.finish_reason == "stop" and dflash.finish_reason == "cancelled"
        n = len(dflash.tokens)
        assert 0 < n < len(plain.tokens) and dflash.tokens == plain.tokens[:n]
        view = win.compare_view
        assert view.header.text() == f"stopped after {n} tokens (all equal to plain's)"
        diff_bg = view.colours["diff_bg"]
        for key in ("plain", "dflash"):
            assert diff_bg not in view.texts[key].toHtml()
            assert "[ended]" not in view.texts[key].toPlainText()
        assert view.figs["dflash"].text() == side_figures(dflash)
        assert f"{n} tokens (stopped)" in view.figs["dflash"].text()
        # reopened from storage it reads the same, with nothing said to be missing
        results, missing, notes = stored_sides(msg)
        assert (missing, notes) == ((), [])
        view.show_turn(msg)
        assert view.header.text() == f"stopped after {n} tokens (all equal to plain's)"
    finally:
        win.shutdown()


def test_verdict_of_a_stopped_side_says_stopped_or_where_it_differed():
    plain = _side("plain", range(64))
    stopped = _side("dflash", range(49), finish="cancelled", tok_per_s=286.0, top2_gap=8.79)
    assert verdict(plain, stopped) == "stopped after 49 tokens (all equal to plain's)"
    one = _side("dflash", range(1), finish="cancelled")
    assert verdict(plain, one) == "stopped after 1 token (all equal to plain's)"
    # tokens that differ before the stop are still a divergence, without a speed-up figure
    diverged = _side("dflash", [*range(30), 99, *range(31, 49)], finish="cancelled",
                     tok_per_s=286.0, top2_gap=0.5)
    assert verdict(plain, diverged) == (
        "differs from token 30 (of 64 plain / 49 DFlash, stopped; top-two logit gap there "
        "0.5) · first divergence in the answer (marked)")
    finished = _side("dflash", [*range(30), 99, *range(31, 64)], tok_per_s=286.0,
                     top2_gap=0.5)
    assert verdict(plain, finished) == (
        "differs from token 30 (of 64 plain / 64 DFlash; top-two logit gap there 0.5) · "
        "first divergence in the answer (marked) · DFlash 2.86× plain speed")
    # a side that ended on its own with fewer tokens than plain is a divergence (an early end)
    short = _side("dflash", range(49))
    assert verdict(plain, short).startswith("differs from token 49 (of 64 plain / 49 DFlash)")


def test_three_sided_compare_view_marks_nothing_for_a_stopped_prefix(qtbot):
    plain = _side("plain", range(10))
    dflash = _side("dflash", range(10), tok_per_s=250.0)
    dflash2 = _side("dflash2", range(4), finish="cancelled", tok_per_s=300.0)
    view = CompareView()
    qtbot.addWidget(view)
    view.colours = COLOURS
    view.set_results(plain, dflash, "dflash", dflash2)
    assert view.header.text().split("\n") == [
        "DFlash: identical, 10 tokens · 2.50× plain speed",
        "DFlash2: stopped after 4 tokens (all equal to plain's)"]
    for key in ("plain", "dflash", "dflash2"):
        assert "#ffd7d5" not in view.texts[key].toHtml()
    # stored: the stopped side's gap was never looked for, and that is not a missing figure
    turn = Turn("assistant", compare=True, chosen="dflash", versions={
        "plain": Version(dataclasses.replace(plain, status="stopped")),
        "dflash": Version(dataclasses.replace(dflash, status="stopped")),
        "dflash2": Version(dataclasses.replace(dflash2, gap_checked=False, status="stopped"))})
    assert stored_sides(turn)[2] == []


def test_earlier_rounds_note_reads_without_a_count_of_one():
    def tool_round(expression):
        return [{"role": "assistant", "content": "", "reasoning_content": "I calculate.",
                 "tool_calls": [{"id": "c", "type": "function", "function": {
                     "name": "calculator", "arguments": {"expression": expression}}}]},
                {"role": "tool", "tool_call_id": "c", "name": "calculator", "content": "1"}]

    one = [ReplyResult(mode=m, tokens=[1, 2], rounds=2, messages=tool_round("1+1"))
           for m in ("plain", "dflash")]
    assert verdict(*one) == "identical in both rounds (2 tokens in the last)"
    two = [ReplyResult(mode=m, tokens=[1, 2], rounds=3,
                       messages=tool_round("1+1") + tool_round("2+2"))
           for m in ("plain", "dflash")]
    assert verdict(*two) == "identical in all 3 rounds (2 tokens in the last)"


# ------------------------------------------------------------------ 2. captions while it runs
def test_a_finished_side_shows_its_figures_while_the_next_side_runs(qtbot, qs):
    win = _loaded_window(qtbot, qs)
    try:
        view = win.compare_view
        with qtbot.waitSignal(win.replyFinished, timeout=60_000):
            assert win.replies.compare(PROMPT)
            assert view.figs["plain"].text() == "running…"
            assert view.figs["dflash"].text() == "waiting"
            qtbot.waitUntil(lambda: win.replies.run.sides["dflash"].stats.cycles >= 3,
                            timeout=30_000)
            plain = win.replies.run.sides["plain"].result
            assert plain is not None and plain.summary is not None
            assert view.figs["plain"].text() == side_figures(plain)
            assert view.figs["plain"].text().startswith(f"321.5 tok/s · {len(plain.tokens)} "
                                                        "tokens · first token 12 ms")
            assert view.figs["dflash"].text() == "running…"
            assert "t100 " in view.texts["plain"].toPlainText()
            assert not view.buttons["plain"].isEnabled()  # chosen once every side is done
            win.stop()
        assert view.figs["plain"].text() == side_figures(plain)
        assert view.buttons["plain"].isEnabled() and view.buttons["dflash"].isEnabled()
    finally:
        win.shutdown()


# ------------------------------------------------------------------ 3. tool calls as JSON
def test_compare_shows_tool_call_arguments_as_json(qtbot):
    call = {"id": "call_0", "name": "convert_units",
            "arguments": {"value": 10, "from_unit": "km", "to_unit": "mile"}}
    degrees = {"id": "call_1", "name": "convert_units",
               "arguments": {"value": 20, "from_unit": "°C", "to_unit": "°F"}}
    shown = ('convert_units({"value": 10, "from_unit": "km", "to_unit": "mile"})',
             'convert_units({"value": 20, "from_unit": "°C", "to_unit": "°F"})')
    # plain: no token texts (sections from the reply's fields); DFlash: token texts
    plain = ReplyResult(mode="plain", tokens=[1, 2], content="10 km is 6.2 miles.",
                        tool_calls=[call, degrees], finish_reason="tool_calls")
    dflash = ReplyResult(mode="dflash", tokens=[1, 2], pieces=["10 km is", " 6.2 miles."],
                         content="10 km is 6.2 miles.", tool_calls=[call, degrees])
    for text in side_texts(qtbot, plain, dflash).values():
        assert all(s in text for s in shown), text
        assert "{'value'" not in text


def test_compare_sides_show_the_earlier_rounds_of_a_tool_reply(qtbot):
    """Each side of a Compare on a tool reply shows its earlier rounds (the reasoning before
    the call, the call and its result) above the last round's tokens: found on the demo pair,
    where a side showed only "I have the result for Kazakhstan now, so I can answer."."""
    rounds = [{"role": "assistant", "content": "",
               "reasoning_content": "I should check Kazakhstan with country_info.",
               "tool_calls": [{"id": "c", "type": "function", "function": {
                   "name": "country_info", "arguments": {"name": "Kazakhstan"}}}]},
              {"role": "tool", "tool_call_id": "c", "name": "country_info",
               "content": '{"ok": true, "result": {"currency": "Kazakhstani tenge"}}'},
              {"role": "assistant", "content": "The currency is the Kazakhstani tenge.",
               "reasoning_content": "I have the result for Kazakhstan now."}]
    call = {"id": "c", "name": "country_info", "arguments": {"name": "Kazakhstan"},
            "result": {"currency": "Kazakhstani tenge"}}
    plain = ReplyResult(mode="plain", tokens=[1, 2], content="The currency is the tenge.",
                        rounds=2, messages=rounds, tool_calls=[call])
    dflash = dataclasses.replace(plain, mode="dflash", pieces=["The currency", " is the tenge."])
    for text in side_texts(qtbot, plain, dflash).values():
        assert "Earlier round" in text, text
        assert "I should check Kazakhstan with country_info." in text
        assert text.count('country_info({"name": "Kazakhstan"})') == 1  # not again below
        assert "Kazakhstani tenge" in text  # the tool's result
        assert text.index("I should check") < text.index("the tenge.")
        # the last round's reasoning is the stored reply's own, not repeated from the rounds
        assert "I have the result for Kazakhstan now." not in text


def test_a_tool_replys_verdict_keeps_to_one_line_a_side_and_its_tooltip_explains(qtbot):
    """A new user's Compare of a tool reply at 1280x800 got a four-line bold verdict ("identical,
    59 tokens in the last round (the answer after the tool calls), its earlier round the same
    (text and tool calls) · DFlash 3.25× plain speed", twice), which left the compared replies
    about 140 px. The explanations now live in the header's tooltip."""
    from app.ui.compare import VERDICT_HELP, CompareView

    msgs = [{"role": "assistant", "content": "", "reasoning_content": "I look it up.",
             "tool_calls": [{"id": "c", "type": "function", "function": {
                 "name": "current_time", "arguments": {"timezone": "America/Anchorage"}}}]},
            {"role": "tool", "tool_call_id": "c", "name": "current_time", "content": "{}"}]
    sides = [ReplyResult(mode=m, tokens=list(range(59)), rounds=2, messages=msgs)
             for m in ("plain", "dflash", "dflash2")]
    view = CompareView()
    qtbot.addWidget(view)
    view.colours = COLOURS
    view.set_results(*sides[:2], "dflash", sides[2])
    lines = view.header.text().split("\n")
    assert lines == ["DFlash: identical in both rounds (59 tokens in the last)",
                     "DFlash2: identical in both rounds (59 tokens in the last)"]
    assert "the answer after the tool calls" in view.header.toolTip()
    assert view.header.toolTip() == VERDICT_HELP


def test_a_narrow_compare_view_gives_the_short_verdict_and_the_full_one_in_its_tooltip(qtbot):
    """At 900x650 a three-sided Compare of a tool reply wrapped its verdict onto six bold
    lines (seen under Xvfb), leaving the compared replies a 60 px strip. Where the full lines
    do not fit, the header now says only what happened and the speed, one line a side; the
    tooltip keeps the full verdict, and a wider view shows it again."""
    from app.ui.compare import VERDICT_HELP

    def side(mode, tok_per_s):
        return ReplyResult(mode=mode, tokens=list(range(59)), rounds=1,
                           summary=Summary(mode=mode, generated_tokens=59,
                                           tok_per_s=tok_per_s))

    view = CompareView()
    qtbot.addWidget(view)
    view.colours = COLOURS
    view.resize(1100, 400)
    view.show()
    qtbot.waitExposed(view)
    view.set_results(side("plain", 100.0), side("dflash", 199.0), "dflash",
                     side("dflash2", 188.0))
    full = ["DFlash: identical, 59 tokens · 1.99× plain speed",
            "DFlash2: identical, 59 tokens · 1.88× plain speed"]
    assert view.header.text().split("\n") == full
    assert view.header.toolTip() == VERDICT_HELP
    view.resize(260, 400)
    qtbot.waitUntil(lambda: view.header.text().split("\n") == [
        "DFlash: identical · 1.99× plain", "DFlash2: identical · 1.88× plain"])
    assert view.header.toolTip() == "\n".join(full) + "\n\n" + VERDICT_HELP
    view.resize(1100, 400)
    qtbot.waitUntil(lambda: view.header.text().split("\n") == full)


def test_the_short_verdict_says_what_happened():
    plain = ReplyResult(mode="plain", tokens=[1, 2, 3, 4])
    assert verdict(plain, ReplyResult(mode="dflash", tokens=[1, 2, 9, 4]),
                   short=True) == "differs from token 2"
    stopped = ReplyResult(mode="dflash", tokens=[1, 2], finish_reason="cancelled")
    assert verdict(plain, stopped, short=True) == "stopped after 2 tokens, all equal"


def test_side_figures_count_replays_in_the_singular_and_plural():
    one = _side("dflash", [1, 2, 3])
    one.summary.replays = 1
    assert "1 replay" in side_figures(one) and "1 replays" not in side_figures(one)
    one.summary.replays = 2
    assert "2 replays" in side_figures(one)


def test_a_side_stopped_in_its_reasoning_shows_it_as_reasoning(qtbot):
    """A new user stopped a Compare about 1 s in: the Plain side showed its reasoning ("The
    user wants to convert ...") under the heading Answer. The template opens ``<think>``, so
    the tokens hold no marker before ``</think>``; the reply's own fields say it was
    reasoning."""
    pieces = ["The", " user", " wants", " to", " convert"]
    stopped = ReplyResult(mode="plain", tokens=[1, 2, 3, 4, 5], pieces=pieces,
                          reasoning="The user wants to convert", content="",
                          finish_reason="cancelled",
                          summary=Summary(mode="plain", generated_tokens=5, tok_per_s=90.0))
    finished = dataclasses.replace(stopped, mode="dflash", pieces=[*pieces, "</think>", "42"],
                                   tokens=[1, 2, 3, 4, 5, 6, 7], content="42",
                                   finish_reason="stop")
    texts = side_texts(qtbot, stopped, finished)
    for key in ("plain", "dflash"):
        lines = texts[key].splitlines()
        assert "Reasoning" in lines and lines.index("Reasoning") < len(lines) - 1, texts[key]
        assert "The user wants to convert" in texts[key]
    assert "Answer" not in texts["plain"].splitlines(), texts["plain"]
    assert texts["dflash"].splitlines()[-2:] == ["Answer", "42"], texts["dflash"]


# ------------------------------------------------------------------ 4. verdicts (issue 40)
def _tool_reply(mode, expression="17*23", reasoning="I use the calculator.", tokens=(1, 2, 3),
                **kw):
    """A finished two-round tool reply: round 1 calls the calculator, round 2 answers."""
    messages = [{"role": "assistant", "content": "", "reasoning_content": reasoning,
                 "tool_calls": [{"id": "call_1", "type": "function", "function": {
                     "name": "calculator", "arguments": {"expression": expression}}}]},
                {"role": "tool", "tool_call_id": "call_1", "name": "calculator",
                 "content": '{"ok": true, "result": 391}'}]
    return ReplyResult(mode=mode, tokens=list(tokens), pieces=[f"t{t} " for t in tokens],
                       content="It is 391.", rounds=2, messages=messages,
                       finish_reason=kw.pop("finish", "stop"),
                       summary=Summary(mode=mode, generated_tokens=len(tokens),
                                       tok_per_s=kw.pop("tok_per_s", 100.0)), **kw)


def _cut_in_round_one(mode, tokens=(), reasoning="", content=""):
    """A drafting side the user's Stop cut in round 1 of a tool reply (as the live engine and
    a stored row give it back: one round, no earlier rounds)."""
    return ReplyResult(mode=mode, tokens=list(tokens), pieces=[f"t{t} " for t in tokens],
                       reasoning=reasoning, content=content, finish_reason="cancelled",
                       summary=Summary(mode=mode, generated_tokens=len(tokens),
                                       tok_per_s=50.0))


def test_a_side_stopped_in_an_earlier_round_than_plains_last_is_not_a_divergence(qtbot):
    """Stopped while the DFlash side ran (the plain side, a tool reply of two rounds, had
    finished), the header said "DFlash: differs from token 0" beside an empty DFlash side:
    the stopped side's round 1 was compared with plain's round 2 because the round counts
    differed. It is a side stopped before it differed, and nothing is marked."""
    from app.ui.compare import judge

    plain = _tool_reply("plain")
    empty = _cut_in_round_one("dflash")
    assert verdict(plain, empty) == "stopped in round 1 of 2 before its first token"
    assert verdict(plain, empty, short=True) == "stopped before it differed"
    assert judge(plain, empty).mark is None
    # stopped part-way through round 1's reasoning, every word so far plain's
    partway = _cut_in_round_one("dflash", range(4), reasoning="I use the")
    assert verdict(plain, partway) == (
        "stopped in round 1 of 2 after 4 tokens (all equal to plain's)")
    # a round 1 whose reasoning went another way is a divergence of round 1, not of token 0
    other = _cut_in_round_one("dflash", range(4), reasoning="I will guess")
    assert verdict(plain, other) == "stopped in round 1 of 2; round 1 already differs"
    assert verdict(plain, other, short=True) == "round 1 differs"
    assert judge(plain, other).mark is None
    # three sides, DFlash stopped and DFlash2 never run: as the window showed it
    view = CompareView()
    qtbot.addWidget(view)
    view.colours = COLOURS
    view.set_results(plain, empty, "plain", None, three=True)
    assert view.header.text().split("\n") == [
        "DFlash: stopped in round 1 of 2 before its first token",
        "DFlash2: stopped before it ran"]
    for key in ("plain", "dflash"):
        assert COLOURS["diff_bg"] not in view.texts[key].toHtml()
        assert "[ended]" not in view.texts[key].toPlainText()


def test_a_side_stopped_in_the_last_round_after_the_same_earlier_rounds():
    plain = _tool_reply("plain", tokens=range(10))
    cut = _tool_reply("dflash", tokens=range(4), finish="cancelled")
    assert verdict(plain, cut) == ("stopped after 4 tokens of the last round (all equal to "
                                   "plain's), earlier round the same")
    assert verdict(plain, cut, short=True) == "stopped after 4 tokens, all equal"


def test_a_stopped_plain_side_whose_tokens_start_the_other_is_not_a_divergence():
    plain = _side("plain", range(5), finish="cancelled")
    dflash = _side("dflash", range(9), tok_per_s=250.0)
    assert verdict(plain, dflash) == "plain stopped after 5 tokens (all equal to DFlash's)"
    assert verdict(plain, dflash, short=True) == "plain stopped before it differed"


def test_a_compare_cut_in_its_drafting_side_continues_from_the_finished_side():
    """The stopped DFlash side was the highlighted "Continue from DFlash" although plain's was
    the only whole reply: the conversation continues from a side that finished."""
    import threading

    from app.chat.scripted import ScriptedSession
    from app.chat.storage import Store
    from app.chat.stored_turn import ReplyFinished, TurnRequest, TurnStored, run_turn
    from app.engine.events import TokenEvent

    store = Store(":memory:")
    try:
        conv = store.new_conversation()
        cancel = threading.Event()
        settings = {"mode": "dflash", "block_size": 4, "rollback": "tape", "max_tokens": 64,
                    "temperature": 0.0}
        events, plain_done = [], False
        for item in run_turn(store, ScriptedSession(cycles=100),
                             TurnRequest(conv.id, "q", settings, tags=("plain", "dflash")),
                             cancel):
            events.append(item.event)
            if isinstance(item.event, ReplyFinished) and item.event.result.mode == "plain":
                plain_done = True
            elif plain_done and isinstance(item.event, TokenEvent):
                cancel.set()  # Stop while the DFlash side runs
        stored = events[-1]
        assert isinstance(stored, TurnStored)
        statuses = {k: store.get_message(i).status for k, i in stored.reply_ids.items()}
        assert statuses == {"plain": "complete", "dflash": "stopped"}
        assert stored.chosen == "plain"
    finally:
        store.close()


def test_the_short_and_the_full_verdict_are_one_verdict():
    """At 1280 px the short header said "identical" while round 1 differed, where the full
    one (1920 px) said "round 1 already differs". Both forms come from one :func:`judge`."""
    from app.ui.compare import judge

    plain = _tool_reply("plain")
    round_one = _tool_reply("dflash", expression="17*24", tok_per_s=200.0)
    v = judge(plain, round_one)
    assert v.kind == "differs" and v.mark is None
    assert v.full == ("round 1 already differs; last round identical, 3 tokens · "
                      "DFlash 2.00× plain speed")
    assert v.short == "round 1 differs · 2.00× plain"
    assert verdict(plain, round_one) == v.full
    assert verdict(plain, round_one, short=True) == v.short
    cases = {
        "identical": _tool_reply("dflash"),
        "differs": _tool_reply("dflash", tokens=(1, 2, 4)),
        "stopped": _tool_reply("dflash", tokens=(1,), finish="cancelled"),
        "sampled": _tool_reply("dflash", temperature=0.7),
    }
    for kind, other in cases.items():
        v = judge(plain, other)
        assert v.kind == kind, (kind, v)
        for text in (v.full, v.short):
            assert ("identical" in text.split(";")[0]) == (kind == "identical"), (kind, text)
            assert ("differ" in text) == (kind == "differs"), (kind, text)


def test_the_header_gives_one_verdict_at_1920_and_1280_px(qtbot, qs):
    """The window's Compare header says what the verdict is at either width (the full or
    the short wording), never "identical" for a tool reply whose round 1 differs."""
    from test_ui_fit import loaded, settle

    win, _ = loaded(qtbot, qs)
    try:
        plain = _tool_reply("plain")
        dflash = _tool_reply("dflash", expression="17*24", tok_per_s=200.0)
        dflash2 = _tool_reply("dflash2", tok_per_s=180.0)
        view = win.compare_view
        view.set_results(plain, dflash, "dflash", dflash2)
        view.show()
        seen = {}
        for width in (1920, 1280, 700):
            win.resize(width, 800)
            settle(qtbot, 120)
            lines = view.header.text().split("\n")
            seen[width] = lines
            assert lines[0].startswith("DFlash: round 1"), (width, lines)
            assert "identical" not in lines[0].split(";")[0], (width, lines)
            assert lines[1].startswith("DFlash2: identical"), (width, lines)
        assert seen[1920] == view.header.full.split("\n")
        assert seen[700] == view.header.short.split("\n")
    finally:
        win.shutdown()


def test_a_sampled_compare_says_its_sides_are_not_expected_to_match(qtbot):
    """At temperature 0.7 both sides sample: "identical" or "differs from token 3" says
    nothing about DFlash's exactness there. The verdict says so, and nothing is marked."""
    plain = _side("plain", range(8), temperature=0.7)
    dflash = _side("dflash", [0, 1, 2, 9, 9], temperature=0.7, tok_per_s=230.0)
    assert verdict(plain, dflash) == ("sampled (temperature 0.7): sides are not expected to "
                                      "match · DFlash 2.30× plain speed")
    assert verdict(plain, dflash, short=True) == "sampled, not expected to match · 2.30× plain"
    same = _side("dflash", range(8), temperature=0.7)
    assert verdict(plain, same).startswith("sampled (temperature 0.7): ")
    view = CompareView()
    qtbot.addWidget(view)
    view.colours = COLOURS
    view.set_results(plain, dflash)
    for key in ("plain", "dflash"):
        assert COLOURS["diff_bg"] not in view.texts[key].toHtml()


def test_a_replys_temperature_is_kept_live_and_stored():
    """The verdict reads the temperature from each side's result: live and reopened."""
    from app.chat.scripted import ScriptedSession
    from app.chat.storage import Store
    from app.chat.stored_turn import ReplyFinished, TurnRequest, run_turn

    store = Store(":memory:")
    try:
        conv = store.new_conversation()
        settings = {"mode": "dflash", "block_size": 4, "rollback": "tape", "max_tokens": 64,
                    "temperature": 0.7}
        events = [t.event for t in run_turn(store, ScriptedSession(cycles=3),
                                            TurnRequest(conv.id, "q", settings,
                                                        tags=("plain", "dflash")))]
        finished = [e.result for e in events if isinstance(e, ReplyFinished)]
        assert [r.temperature for r in finished] == [0.7, 0.7]
        for row_id in events[-1].reply_ids.values():
            assert ReplyResult.from_row(store.get_message(row_id)).temperature == 0.7
    finally:
        store.close()


def test_a_sides_figures_give_its_time_to_answer_with_the_tools_share():
    """Each Compare side shows its time to answer (prefill and every round, the tools' run
    time included and given beside it), as ``app.chat.measure`` defines it for every figure."""
    from app.chat.turns import ReplyResult
    from app.engine.events import Summary
    from app.ui.compare import side_figures

    s = Summary(mode="dflash", generated_tokens=40, tok_per_s=100.0, ttft_s=0.05, total_s=0.9,
                tau=8.0, acceptance_rate=0.9)
    r = ReplyResult(mode="dflash", summary=s, finish_reason="stop",
                    tool_calls=[{"id": "call_0", "name": "calculator", "duration_s": 0.35}])
    text = side_figures(r)
    assert "answer in 1.25 s (tools 350 ms)" in text
    stopped = ReplyResult(mode="dflash", summary=s, finish_reason="cancelled")
    assert "answer in" not in side_figures(stopped)  # a stopped side has no answer time

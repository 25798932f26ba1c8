"""Held-out set v2 of the demo pair (issue 43): the generator writes the committed files, its
expectations are what the app's tools return, and the scorer's new check kinds accept right
answers and refuse wrong ones (fake replies, no model)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # tools/ is not an installed package
    sys.path.insert(0, str(REPO))

from tools.demo_pair import evaluate as ev  # noqa: E402
from tools.demo_pair import heldout_v2 as h2  # noqa: E402


@pytest.fixture(scope="module")
def built():
    return h2.build()


def reply(content: str, calls: list[tuple[str, dict]] | None = None):
    """A stand-in for ``app.chat.reply.Reply``: one round with ``calls``, then the answer."""
    from app.chat.tools import run_tool

    tc = [SimpleNamespace(name=n, arguments=a) for n, a in (calls or [])]
    runs = [SimpleNamespace(result=run_tool(n, a)) for n, a in (calls or [])]
    rounds = [SimpleNamespace(tool_calls=tc, tool_runs=runs, content="")]
    if calls:
        rounds.append(SimpleNamespace(tool_calls=[], tool_runs=[], content=content))
    return SimpleNamespace(content=content, rounds=rounds)


# ---- the set -------------------------------------------------------------------------------------

def test_committed_files_are_the_seeded_generator_output(built):
    for path, obj in zip([h2.PROMPTS, h2.SCRIPTS, h2.LONG], built):
        assert json.loads(path.read_text("utf-8")) == obj, path.name


def test_generator_refuses_to_overwrite_without_force(tmp_path, monkeypatch):
    files = {k: tmp_path / f"{k}.json" for k in ("PROMPTS", "SCRIPTS", "LONG")}
    for k, f in files.items():
        monkeypatch.setattr(h2, k, f)
    files["SCRIPTS"].write_text("keep")
    assert h2.main([]) == 2
    assert files["SCRIPTS"].read_text() == "keep" and not files["PROMPTS"].exists()
    assert h2.main(["--force"]) == 0
    assert len(json.loads(files["SCRIPTS"].read_text())) == 40


def test_sizes_and_kinds(built):
    singles, scripts, long = built
    cats = [s["category"] for s in singles]
    assert 150 <= len(singles) <= 175 and cats.count("scope") >= 24
    small_talk = sum(cats.count(c) for c in ("greeting", "thanks", "bye", "self"))
    assert cats.count("scope") + small_talk >= 30
    assert len(scripts) == 40 and all(2 <= len(s["turns"]) <= 4 for s in scripts)
    assert len(long) == 3 and all(len(c["turns"]) == 30 for c in long)
    counts = sorted({s["expect"]["exact_count"] for s in singles if "exact_count" in s["expect"]})
    assert counts == [2, 3, 4, 6]
    texts = [s["messages"][0]["content"] for s in singles]
    assert len(set(texts)) == len(texts)
    assert any("%" in t or "percent" in t for t in texts)
    assert any("sqrt" in t or "square root" in t for t in texts)
    assert any("power" in t for t in texts)
    assert any(t.split()[0].startswith("-") or " -" in t for t in texts)
    assert any(" or " in t for t in texts)
    kinds = {c["category"] for c in long[0]["turns"] + long[1]["turns"] + long[2]["turns"]}
    assert {"reach_back", "follow_calc", "tool_time", "scope", "list_count"} <= kinds


def test_misspellings_are_not_names_the_tool_knows():
    from app.chat.tools.countries import find_country

    for right, typos in h2.MISSPELT.items():
        assert find_country(right) is not None, right
        for t in typos:
            assert find_country(t) is None, t


def test_expected_calls_run_and_expected_values_are_the_tools(built):
    from app.chat.tools import run_tool

    singles, scripts, long = built
    expects = [s["expect"] for s in singles] + [t["expect"] for s in scripts + long
                                                  for t in s["turns"]]
    for e in expects:
        for c in e.get("calls", []):
            assert run_tool(c["name"], c["arguments"]).ok, c
        if len(e.get("calls", [])) == 1 and e.get("numbers"):
            c = e["calls"][0]
            got = run_tool(c["name"], c["arguments"]).result
            got = got["value"] if isinstance(got, dict) and "value" in got else got
            if isinstance(got, dict):  # country_info: the population
                got = got["population"]
            assert e["numbers"] == [got], (c, e["numbers"])


def test_mental_arithmetic_values_and_expressions():
    from app.chat.tools import run_tool

    for text, value in h2.MENTAL:
        assert run_tool("calculator", {"expression": h2._mental_expr(text)}).result == value, text


def test_scope_and_small_talk_items_expect_no_call(built):
    for s in built[0]:
        if s["category"] in ("scope", "greeting", "thanks", "bye", "self"):
            assert s["expect"]["calls"] == [] and s["tools"] is True


# ---- the checker -------------------------------------------------------------------------------

def test_numbers_check_reads_separators_rounding_and_minus():
    assert ev.states_number("About 41,500,000 people.", 41500000)
    assert ev.states_number("-40 °C is −40 °F", -40)
    assert ev.states_number("It is 154.32 lb.", 154.3235835)
    assert not ev.states_number("It is 154.3 lb.", 154.3235835)
    assert not ev.states_number("It is 40 °F.", -40)
    assert not ev.states_number("12 times 11 is 23.", 132)
    ok, _, why = ev.check(reply("12 times 11 is 132."), {"calls": [], "numbers": [132]})
    assert ok and not why
    c_ok, a_ok, _ = ev.check(reply("12 times 11 is 23."), {"calls": [], "numbers": [132]})
    assert c_ok and not a_ok


def test_exact_count_refuses_five_when_two_were_asked():
    e = {"calls": [], "exact_count": 2, "list_items": ["Kenya", "Ghana", "Mali", "Chad", "Togo"]}
    five = "Here are five:\n1. Kenya\n2. Ghana\n3. Mali\n4. Chad\n5. Togo"
    assert not ev.check(reply(five), e)[1]
    assert ev.check(reply("1. Kenya\n2. Ghana"), e)[1]
    assert ev.check(reply("- Kenya\n- Ghana"), e)[1]
    assert not ev.check(reply("1. Kenya\n2. Peru"), e)[1]
    assert not ev.check(reply("1. Kenya\n2. Kenya"), e)[1]


def test_small_talk_needs_a_fitting_reply_and_no_call():
    thanks = {"calls": [], "any_of": h2.THANK_WORDS}
    assert ev.check(reply("You're welcome!"), thanks)[:2] == (True, True)
    assert not ev.check(reply("Hello! I am the DFlash Chat demo model."), thanks)[1]
    assert not ev.check(reply("I can't help with that."), thanks)[1]
    called = reply("You're welcome!", [("country_info", {"name": "France"})])
    assert not ev.check(called, thanks)[0]
    # whole words: "this" does not count as "hi"
    assert not ev.check(reply("this"), {"calls": [], "any_of": ["hi"]})[1]


def test_calls_optional_and_markup():
    e = {"calls": [{"name": "country_info", "arguments": {"name": "Kenya"}}],
         "calls_optional": True, "contains": ["Kenyan shilling"], "not_contains": h2.NO_MARKUP}
    assert ev.check(reply("They use the Kenyan shilling."), e)[:2] == (True, True)
    assert ev.check(reply("Kenyan shilling", [("country_info", {"name": "kenya"})]), e)[0]
    assert not ev.check(reply("Kenyan shilling", [("country_info", {"name": "Peru"})]), e)[0]
    markup = "<tool_call>\n<function=country_info> Kenyan shilling"
    assert not ev.check(reply(markup), e)[1]
    # without calls_optional a follow-up with no call fails, as before
    strict = {k: v for k, v in e.items() if k != "calls_optional"}
    assert not ev.check(reply("They use the Kenyan shilling."), strict)[0]


def test_v1_list_check_is_unchanged():
    e = {"calls": [], "list_items": ["Kenya", "Ghana", "Mali"], "count": 2}
    assert ev.check(reply("1. Kenya\n2. Ghana\n3. Mali"), e)[1]  # at least count
    assert not ev.check(reply("1. Kenya"), e)[1]


def test_resolve_ref_takes_the_country_of_the_item():
    e = {"ref": {"turn": 0, "index": 1, "field": "currency"}}
    got = ev.resolve_ref(e, ["Sure:\n1. The Gambia (Banjul)\n2. Ghana"])
    assert got["calls"] == [{"name": "country_info", "arguments": {"name": "Gambia"}}]
    assert got["contains"] == ["Gambian dalasi"] and got["calls_optional"]
    assert "unresolved" in ev.resolve_ref(e, ["no list here"])
    assert not ev.check(reply("Accra"), ev.resolve_ref(e, ["no list"]))[1]


def _turn(ok: bool, left: int, tau_cycles: tuple[int, int] | None = None) -> dict:
    t = {"call_ok": True, "answer_ok": ok, "left_out_turns": left, "prompt_tokens": 100,
         "identical": True}
    if tau_cycles:
        acc, cyc = tau_cycles
        t["dflash"] = [{"accepted": acc, "cycles": cyc}]
    return t


def test_report_long_counts_turns_left_out_and_tau():
    turns = [_turn(i != 3, 0 if i < 12 else 2, (9 * (i + 1), 1)) for i in range(15)]
    rep = ev.report_long([{"id": "c", "turns": turns}], dflash=True, last=10)
    chat = rep["per_chat"][0]
    assert chat["verdicts"] == "111011111111111" and chat["right"] == 14
    assert chat["first_left_out_turn"] == 12 and rep["turns_left_out_anywhere"]
    # taus of turns 5..14: 9 * (i + 1) + 1 = 55, 64, ..., 136; their median (91 + 100) / 2
    assert chat["tau_median_last"] == pytest.approx(95.5)
    assert rep["turn_accuracy"] == pytest.approx(14 / 15, abs=1e-3)


def test_load_set_names():
    singles, scripts = ev.load_set("v2")
    assert len(singles) == len(json.loads(h2.PROMPTS.read_text("utf-8")))
    assert ev.load_set("long")[0] == [] and len(ev.load_set("long")[1]) == 3
    with pytest.raises(ValueError, match="unknown set"):
        ev.load_set("v3")

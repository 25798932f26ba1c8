"""The demo pair's corpus v6 (issue 43): perturbed names keep canonical tool arguments, lists
honour the count asked for, the new calculator kinds and mental arithmetic are right, casual
and out-of-scope turns make no call, and long chats render as the app fits them into the
4,096-token context.

CPU only, no model weights (the tokenizer shipped beside the demo target measures prompts).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # tools/ is not an installed package
    sys.path.insert(0, str(REPO))

from tools.demo_pair import corpus, corpus6, data  # noqa: E402

HERE = REPO / "tools" / "demo_pair"


def _calls(turn: corpus.Turn) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for m in turn.replies
            for c in m.get("tool_calls", []) or []]


def test_typos_lead_back_to_one_country_and_the_tool_suggests_it():
    import random

    from app.chat.tools import run_tool
    from app.chat.tools.countries import find_country

    rng = random.Random(3)
    made = 0
    for rec in corpus._countries():
        t = corpus6.typo_name(rec["name"], rng)
        if t is None:
            continue
        made += 1
        assert t != rec["name"] and find_country(t) is None, (rec["name"], t)
        err = json.loads(run_tool("country_info", {"name": t}).content())["error"]
        assert f"did you mean {rec['name']}" in err, (t, err)
    assert made > 150


def test_perturbed_names_still_give_the_canonical_tool_argument(monkeypatch):
    from app.chat.tools import run_tool
    from app.chat.tools.countries import find_country

    monkeypatch.setattr(corpus6, "NAME_PERTURB_SHARE", 1.0)
    g = corpus6.GeneratorV6(21)
    changed = typos = 0
    for _ in range(300):
        t = g.fact(True, "capital")
        ((_, args),) = _calls(t)
        name = args["name"]
        g.perturb(t)
        assert _calls(t) == [("country_info", {"name": name})]
        assert name in t.replies[-1]["content"]  # the answer states the canonical name
        if name in t.user:
            continue
        changed += 1
        said = t.user
        rec = find_country(name)
        names = [rec["name"], *rec.get("aliases", [])]
        if any(n.lower() in said.lower() for n in names):
            continue  # lower case or an alias: the tool resolves it
        typos += 1
        # a typo: the tool's suggestion for the nearest words is the canonical name
        words = re.findall(r"[\w'-]+", re.sub(r"'s\b", "", said))
        hits = [(i, k) for k in (1, 2, 3) for i in range(len(words) - k + 1)
                if f"did you mean {name}" in json.loads(run_tool(
                    "country_info", {"name": " ".join(words[i:i + k])}).content()).get(
                        "error", "")]
        assert hits, (said, name)
    assert changed > 150 and typos > 50, (changed, typos)


def test_a_list_request_of_n_gives_n_items():
    g = corpus6.GeneratorV6(4)
    seen = set()
    words = {w: n for n, w in corpus6.COUNT_WORDS.items()}
    for _ in range(300):
        t = g.list_n(True)
        n = t.expect["count"]
        asked = re.search(r"\b(\d|two|three|four|five|six|seven|eight)\b", t.user)[1]
        assert int(words.get(asked, asked)) == n, t.user
        lines = t.replies[0]["content"].split("\n")[1:]
        assert len(lines) == n and len(set(lines)) == n
        assert [ln.split(". ", 1)[0] for ln in lines] == [str(i + 1) for i in range(n)]
        seen.add(n)
    assert seen == set(range(2, 9))


def test_calculator_kinds_send_a_spaced_expression_with_the_right_value():
    g = corpus6.GeneratorV6(8)
    kinds = {"%": 0, "sqrt": 0, "**": 0, "neg": 0, "nospace": 0}
    for _ in range(400):
        t = g.calc_kind(True)
        ((name, args),) = _calls(t)
        e = args["expression"]
        assert name == "calculator"
        assert "  " not in e and not re.search(r"\d[-+*/]\d", e), e  # spaced operators
        res = json.loads(next(m for m in t.replies if m["role"] == "tool")["content"])
        if res["ok"]:
            assert corpus.jtext(res["result"]) in t.replies[-1]["content"]
        if "/ 100" in e:
            p, m = re.match(r"(\d+) \* (\d+) / 100", e).groups()
            assert res["result"] == pytest.approx(int(p) * int(m) / 100)
            kinds["%"] += 1
        elif e.startswith("sqrt("):
            kinds["sqrt"] += 1
        elif "**" in e:
            a, b = map(int, e.split(" ** "))
            assert res["result"] == a**b
            kinds["**"] += 1
        elif e.startswith("-"):
            kinds["neg"] += 1
        elif re.search(r"\d[-+*x/]\d", t.user):
            kinds["nospace"] += 1
    assert min(kinds.values()) > 15, kinds


def test_negative_temperatures_convert_a_negative_value():
    g = corpus6.GeneratorV6(9)
    for _ in range(100):
        t = g.negative_temperature(True)
        ((name, args),) = _calls(t)
        assert name == "convert_units" and args["value"] < 0
        assert args["from_unit"] in ("degC", "degF")
        assert t.category == "negative_temp", t.replies[-1]


def test_mental_arithmetic_steps_are_true_and_end_on_the_answer():
    step = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")
    ops = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
           "/": lambda x, y: x / y}
    g = corpus6.GeneratorV6(10)
    for _ in range(500):
        t = g.mental(False)
        assert not _calls(t)
        found = step.findall(t.replies[0]["reasoning_content"])
        for x, op, y, z in found:
            assert ops[op](int(x), int(y)) == int(z), t.replies[0]
        x, op, y, z = step.findall(t.replies[0]["content"])[0]
        assert ops[op](int(x), int(y)) == int(z) and found[-1][3] == z
    t = None
    while t is None or "12" not in t.user:
        t = g.mental(False)


def test_casual_and_out_of_scope_turns_make_no_call():
    g = corpus6.GeneratorV6(12)
    for _ in range(200):
        for t in (g.casual(True), g.scope6(True)):
            assert not _calls(t) and len(t.replies) == 1
    t = g.scope6(True)
    assert t.replies[0]["content"] == corpus.SCOPE_ANSWER


def test_pronoun_follow_ups_name_the_country_of_an_earlier_turn():
    g = corpus6.GeneratorV6(14)
    back = []
    for _ in range(40):
        c = g.long_chat()
        for k, t in enumerate(c.turns):
            if t.category != "pronoun":
                continue
            name = t.expect["country"]
            earlier = c.turns[k - t.expect["back"]]
            text = json.dumps(earlier.replies, ensure_ascii=False)
            assert name in text, (t.user, name)
            final = t.replies[-1]["content"]
            assert name in final
            back.append(t.expect["back"])
    assert max(back) >= 3 and len(back) > 50


@pytest.mark.slow  # left to make test (CI): make test-fast stays under 5 minutes
def test_long_chats_render_within_the_context_as_the_app_fits_them(tmp_path):
    from app.chat.history import LEAVE_OUT_STEP, fit_for_tokenizer
    from app.chat.storage import Store
    from app.chat.templates import render_prompt
    from app.chat.tools import tool_schemas
    from app.models.loader import load_tokenizer
    from app.paths import demo_pair_dirs

    tok = load_tokenizer(demo_pair_dirs()[0])
    fitter = data.PromptFitter()
    g = corpus6.GeneratorV6(2)
    chats = []
    while len(chats) < 2:
        c = g.long_chat(36)
        if c.tools and c.enable_thinking:
            chats.append(c)
    store = Store(tmp_path / "chats.sqlite3")
    compared = left_out = 0
    for c in chats:
        tools = tool_schemas()
        msgs = c.messages()
        ex = data.fitted_chat_examples(c, tools, fitter)
        conv = store.new_conversation("t")
        ids = []
        for m in msgs:
            if m["role"] == "user":
                ids.append(store.add_message(conv.id, "user", m["content"]).id)
            elif m["role"] == "assistant":
                calls = [{"id": x["id"], "name": x["function"]["name"],
                          "arguments": x["function"]["arguments"]}
                         for x in m.get("tool_calls", [])]
                ids.append(store.add_message(conv.id, "assistant", m["content"],
                                             reasoning=m.get("reasoning_content", ""),
                                             tool_calls=calls or None, mode="plain").id)
            else:
                ids.append(store.add_message(conv.id, "tool", m["content"],
                                             tool_call_id=m["tool_call_id"], name=m["name"]).id)
        j = 0
        for k, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            prompt, completion = ex[j]
            j += 1
            n = fitter.count(prompt + completion)
            assert n <= data.CONTEXT, n
            if msgs[k - 1]["role"] != "user":
                continue  # a tool round extends the prompt fitted at the reply's start
            stored = store.prompt_for_reply(ids[k])
            fitted = fit_for_tokenizer(stored, tok, data.CONTEXT, reserve=data.REPLY_RESERVE,
                                       tools=tools, step=LEAVE_OUT_STEP, enable_thinking=True)
            app_text = render_prompt(tok, fitted.messages, tools=tools,
                                     enable_thinking=True).text
            assert prompt == app_text
            assert fitter.count(prompt) <= data.CONTEXT - data.REPLY_RESERVE
            left_out += fitted.left_out_turns > 0
            compared += 1
    store.close()
    assert compared >= 60 and left_out >= 3  # turns left out (two at a time) in both chats


@pytest.mark.slow  # left to make test (CI): make test-fast stays under 5 minutes
def test_v6_corpus_never_uses_a_heldout_text():
    """Neither held-out set's user texts (v1 beside the target, the frozen v2) occur in the
    corpus that ``build.prepare`` generates."""
    from tools.demo_pair import build, heldout_v2

    prompts = json.loads((HERE / "heldout_prompts.json").read_text())
    scripts = json.loads((HERE / "heldout_scripts.json").read_text())
    v2 = heldout_v2.user_texts()
    assert len(v2) > 250
    held = corpus.heldout_user_texts(prompts, scripts) | v2
    assert build.forbidden_texts(0) >= held
    g = corpus6.GeneratorV6(0)
    g.forbid(held)
    bare = {corpus6._bare(h) for h in held}
    for _ in range(3000):
        for t in g.chat().turns:
            assert t.user not in held and corpus6._bare(t.user) not in bare


def test_generate_texts_v6_fits_every_example_and_reports_kinds():
    stats: dict = {}
    pairs = data.generate_texts(1, 80, version="v6", stats=stats)
    assert pairs and stats["kinds"] and stats["replies_fitted"] > 0
    assert abs(sum(stats["kinds"].values()) - 1) < 0.01
    with pytest.raises(ValueError, match="unknown corpus version"):
        data.generate_texts(1, 1, version="v7")


def test_made_up_names_are_no_near_miss_of_a_real_country():
    from app.chat.tools import run_tool

    g = corpus6.GeneratorV6(6)
    for _ in range(150):
        t = g.bad_country(True)
        ((_, args),) = _calls(t)
        err = json.loads(run_tool("country_info", args).content())["error"]
        if args["name"] not in corpus.BAD_COUNTRIES:
            assert "did you mean" not in err, err

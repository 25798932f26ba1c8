"""Held-out set v2 of the demo pair: new-user phrasings written apart from the corpus.

The corpus generator (``tools/demo_pair/corpus.py``) was not read to write this module: its
templates are this module's own, written the way people type into a chat box (lowercase, no
question mark, "pls", "rn", "quick question", typos and casual spellings of names, "X or Y?"
questions, sums with no spaces, percentages, powers, square roots, negative temperatures, list
requests with a count, pronoun follow-ups, thanks / goodbye / casual greetings, out-of-scope
questions that name a country or a number), and a seeded pass of perturbations (casing, dropped
question marks, fillers) runs over them. Facts and expected values come from the app's own data
and tools (``resources/data/countries.json``, :func:`app.chat.tools.run_tool`), so an item's
expectation is what the real tool returns.

Three files, frozen once written (never used to choose corpus edits; see
``tools/demo_pair/README.md``, "Held-out set v2"):

* ``heldout_v2_prompts.json``: single-turn items (the format of ``heldout_prompts.json``; the
  category ``scope`` is the out-of-scope set);
* ``heldout_v2_scripts.json``: 2-4 turn scripts (the format of ``heldout_scripts.json``);
* ``heldout_v2_long.json``: three 30-turn chats of mixed questions (the scripts' format).

Expectation keys beyond the v1 set (checked by :mod:`tools.demo_pair.evaluate`): ``numbers``
(each value stated in the answer), ``any_of`` (at least one word or phrase, case-insensitive),
``not_contains``, ``exact_count`` (exactly N list items, each allowed by ``list_items``),
``calls_optional`` (no call, or the listed calls) and ``ref`` (a follow-up about an item of an
earlier answer's list, resolved when the script runs).

``python -m tools.demo_pair.heldout_v2 [--force] [--seed N]`` writes the three files; it refuses
to overwrite them without ``--force``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPTS = HERE / "heldout_v2_prompts.json"
SCRIPTS = HERE / "heldout_v2_scripts.json"
LONG = HERE / "heldout_v2_long.json"
SEED = 20261206
"""The seed the committed files were written with."""

NO_MARKUP = ["<tool_call>", "<function=", "</tool_call>"]
"""Raw tool-call markup never belongs in a final answer."""

# ---- facts from the app's data ---------------------------------------------------------------


def countries() -> dict[str, dict]:
    """The app's country records by name (``resources/data/countries.json``)."""
    from app.chat.tools.countries import load_countries

    return {c["name"]: c for c in load_countries()}


def tool_value(name: str, args: dict):
    """What the app's tool ``name`` returns for ``args`` (``result``); raises ``ValueError`` on
    a tool error (an item must expect a value the tool really gives)."""
    from app.chat.tools import run_tool

    r = run_tool(name, args)
    if not r.ok:
        raise ValueError(f"{name}({args}) failed: {r.error}")
    return r.result


def call(tool: str, **args) -> dict:
    """An expected call in the held-out format."""
    return {"name": tool, "arguments": args}


# ---- perturbations ------------------------------------------------------------------------------

MISSPELT = {
    "Philippines": ["phillipines", "Phillipines"], "Colombia": ["columbia", "Columbia"],
    "Morocco": ["marocco", "Morroco"], "Kazakhstan": ["kazakstan", "Kazakstan"],
    "Portugal": ["portugual"], "Venezuela": ["venezuala", "Venezuala"],
    "Indonesia": ["indonesa"], "Ethiopia": ["ethopia", "Ethiopa"], "Tanzania": ["tanzenia"],
    "Argentina": ["argentinia", "Argentinia"], "Ukraine": ["ukriane"], "Egypt": ["egpyt"],
    "Switzerland": ["swizerland", "Switzerlnd"], "Australia": ["austrailia", "Australa"],
    "Germany": ["germny"], "New Zealand": ["new zeland"], "Vietnam": ["veitnam"],
    "Mexico": ["mexcio"], "Thailand": ["thialand"], "Pakistan": ["pakistna"],
    "Chile": ["chille"], "Ireland": ["irland"], "Denmark": ["denmrak"], "Norway": ["norwy"],
    "Finland": ["finnland"], "Sweden": ["sweeden"], "Greece": ["grece"], "Poland": ["polnad"],
    "Jamaica": ["jamacia"], "Kenya": ["keyna"], "Cameroon": ["camroon"],
}
"""Misspellings people type (none is a name or alias in the app's data; checked by the tests)."""

CASUAL = {"United States": ["the us", "the states", "america"], "United Kingdom": ["the uk",
          "britain"], "Netherlands": ["holland"], "South Korea": ["s korea", "korea"],
          "Czech Republic": ["czechia"], "Turkey": ["turkiye"], "Myanmar": ["burma"],
          "United Arab Emirates": ["the uae"], "Brazil": ["brasil"]}
"""Casual names of countries (some are aliases the tool knows, some are not)."""

FILLERS_BEFORE = ["quick question, ", "hey, ", "pls ", "ok so ", "um ", "hi! ", "random q: ",
                  "so ", "btw ", "question: "]
FILLERS_AFTER = [" pls", " please", " these days", " rn", " thx", " right now", " again?",
                 " lol", " if you know", " ?"]


def casual_name(rng: random.Random, name: str, p_typo: float = 0.4) -> str:
    """A way a user might type ``name``: misspelt, casual, lowercase or as written."""
    r = rng.random()
    if name in MISSPELT and r < p_typo:
        return rng.choice(MISSPELT[name])
    if name in CASUAL and r < p_typo + 0.3:
        return rng.choice(CASUAL[name])
    return name.lower() if rng.random() < 0.5 else name


def roughen(rng: random.Random, text: str) -> str:
    """Seeded surface noise: lowercase, no final question mark, a filler before or after."""
    if rng.random() < 0.45:
        text = text[0].lower() + text[1:]
    if rng.random() < 0.35:
        text = text.lower()
    if text.endswith("?") and rng.random() < 0.45:
        text = text[:-1]
    r = rng.random()
    if r < 0.2:
        text = rng.choice(FILLERS_BEFORE) + text[0].lower() + text[1:]
    elif r < 0.35:
        text = text.rstrip("?.") + rng.choice(FILLERS_AFTER)
    return text


# ---- single-turn templates ----------------------------------------------------------------------

CAPITAL_T = ["what's the capital of {c}?", "capital of {c}?", "{c} capital city",
             "whats {c}'s capital", "which city is the capital of {c}",
             "do you know the capital city of {c}?", "{c} - capital?",
             "what city is {c} governed from", "where's the seat of government in {c}?",
             "i forgot the capital of {c}, help"]
CURRENCY_T = ["what money do they use in {c}?", "currency in {c}?", "{c} currency pls",
              "what do people pay with in {c}", "if i travel to {c} what cash do i need?",
              "which currency does {c} have", "money in {c}?",
              "what's the local currency over in {c}"]
LANG_T = ["what language do they speak in {c}?", "languages of {c}", "{c} official language?",
          "what do they speak in {c}", "which languages are official in {c}?",
          "what language is spoken in {c} these days", "in {c}, what do people speak?"]
POP_T = ["how many people live in {c}?", "population of {c}", "{c} population?",
         "how big is the population of {c}", "how many ppl are in {c}",
         "what's the headcount of {c} roughly"]
CONT_T = ["what continent is {c} on?", "{c} is in which continent", "where is {c}, which continent?",
          "continent of {c}?", "which part of the world is {c} in (continent)"]
EITHER_CONT_T = ["is {c} in {a} or {b}?", "{c}: {a} or {b}?", "would {c} be in {a} or in {b}"]
EITHER_CAP_T = ["is the capital of {c} {a} or {b}?", "{a} or {b}, which is {c}'s capital?",
                "capital of {c}, is it {a} or {b}"]
EITHER_CUR_T = ["do they use the {a} or the {b} in {c}?", "{c}: {a} or {b}, which currency?"]

CITIES = {"tokyo": "Asia/Tokyo", "nyc": "America/New_York", "new york": "America/New_York",
          "london": "Europe/London", "paris": "Europe/Paris", "sydney": "Australia/Sydney",
          "berlin": "Europe/Berlin", "dubai": "Asia/Dubai", "singapore": "Asia/Singapore",
          "moscow": "Europe/Moscow", "cairo": "Africa/Cairo", "chicago": "America/Chicago",
          "los angeles": "America/Los_Angeles", "toronto": "America/Toronto",
          "seoul": "Asia/Seoul", "bangkok": "Asia/Bangkok", "nairobi": "Africa/Nairobi",
          "istanbul": "Europe/Istanbul", "mexico city": "America/Mexico_City",
          "sao paulo": "America/Sao_Paulo", "hong kong": "Asia/Hong_Kong",
          "madrid": "Europe/Madrid", "rome": "Europe/Rome", "lagos": "Africa/Lagos"}
"""City as typed -> the IANA zone the tool should be asked for."""
TIME_T = ["what time is it in {city}?", "time in {city} rn", "whats the time in {city}",
          "current time {city}?", "do you know what time it is over in {city}",
          "{city} time now pls", "what's the clock saying in {city} right now?",
          "is it late in {city}? what time is it there", "tell me the local time for {city}"]
TIME_OR_T = ["is it morning or evening in {city} right now?",
             "is it day or night in {city} at the moment"]
TWO_TIMES_T = ["time in {a} and {b}?", "what time is it in {a} and in {b} right now"]


def _calc_items(rng: random.Random) -> list[tuple[str, str, float]]:
    """(text, expression, value) calculator questions, values from the calculator."""
    out = []
    for pct, of in [(15, 80), (20, 350), (12, 250), (35, 60), (8, 1250)]:
        t = rng.choice(["what's {p}% of {m}", "{p} percent of {m}?", "how much is {p} percent of {m}",
                        "calculate {p}% of {m} pls"]).format(p=pct, m=of)
        out.append((t, f"{pct}/100*{of}", None))
    for sq in [144, 729, 2025, 50]:
        t = rng.choice(["square root of {n}?", "what's the square root of {n}",
                        "sqrt of {n} pls", "whats the sqrt of {n}"]).format(n=sq)
        out.append((t, f"sqrt({sq})", None))
    for a, b in [(2, 16), (3, 7), (7, 4), (1.5, 3)]:
        t = rng.choice(["{a} to the power of {b}", "what is {a} to the power of {b}?",
                        "{a} raised to the {b}th power?"]).format(a=a, b=b)
        out.append((t, f"{a}**{b}", None))
    for expr in ["348+129", "1200/16", "57*19", "9001-4567", "250*4+17", "(18+6)*3"]:
        t = rng.choice(["{e}", "what is {e}", "{e}=?", "calc {e}", "whats {e}"]).format(e=expr)
        out.append((t, expr, None))
    for a, b in [(1384, 27), (96, 12)]:
        t = rng.choice(["if i split {a} between {b} people how much does each get",
                        "{a} divided by {b}?"]).format(a=a, b=b)
        out.append((t, f"{a}/{b}", None))
    for a, b in [(4567, 2389), (87, 64)]:
        t = rng.choice(["{a} minus {b}", "what's {a} take away {b}?"]).format(a=a, b=b)
        out.append((t, f"{a}-{b}", None))
    return [(t, e, tool_value("calculator", {"expression": e})) for t, e, _ in out]


def _convert_items(rng: random.Random) -> list[tuple[str, dict]]:
    """(text, convert_units arguments) questions."""
    rows = [("{v} c to f", -40, "degC", "degF"), ("whats -15 celsius in fahrenheit", -15, "degC", "degF"),
            ("minus 10 degrees f in celsius?", -10, "degF", "degC"),
            ("it's -25 degrees celsius outside, what is that in fahrenheit", -25, "degC", "degF"),
            ("0 fahrenheit in c?", 0, "degF", "degC"),
            ("5k in miles", 5, "km", "mile"), ("how many pounds is 70kg", 70, "kg", "lb"),
            ("6 feet in cm?", 6, "ft", "cm"), ("100 mph in kph pls", 100, "mph", "km/h"),
            ("how many liters is 20 gallons", 20, "gallon", "liter"),
            ("30 cm to inches", 30, "cm", "inch"), ("250g in ounces?", 250, "g", "oz"),
            ("convert 3 hours into minutes", 3, "hour", "minute"),
            ("1 mile is how many meters", 1, "mile", "m")]
    out = []
    for t, v, a, b in rows:
        out.append((t.format(v=v), {"value": v, "from_unit": a, "to_unit": b}))
    rng.shuffle(out)
    return out[:12]


MENTAL = [("whats 12 times 11", 132), ("7 x 8?", 56), ("45 + 38 =", 83), ("100 minus 37", 63),
          ("9*6", 54), ("what is half of 50", 25), ("15+27=?", 42), ("13 times 3?", 39),
          ("how much is 6 times 7", 42), ("quick one: 81 - 19", 62), ("20 plus 35?", 55),
          ("3 times 14", 42)]
"""Mental arithmetic (value from the question; the tests check each against Python)."""

LIST_T = ["name {n} countries in {k}", "give me {n} {k} countries", "list {n} countries from {k} pls",
          "can you list {n} countries in {k}?", "{n} countries in {k}?"]
LIST_CAP_T = ["name {n} capitals in {k}", "list {n} capital cities of {k}",
              "give me {n} capital cities in {k} pls"]

MEMORY_T = [("capital of {c}?", "capital"), ("what continent is {c} in", "continent"),
            ("{c} capital city?", "capital"), ("which continent is {c} part of?", "continent")]

GREETINGS = ["hello, anyone there?", "hey", "hi there!", "yo", "good morning", "heya :)",
             "hello?"]
THANKS = ["cheers", "thanks a lot!", "thx", "ty, that helps", "great, thank you", "awesome thanks"]
BYES = ["bye!", "ok bye", "see ya", "thanks, bye for now", "goodnight"]
SELF = ["who are you?", "what are you", "what can you do?"]

GREET_WORDS = ["hello", "hi", "hey", "help", "welcome", "good morning", "assist"]
THANK_WORDS = ["welcome", "glad", "pleasure", "anytime", "no problem", "happy to help"]
BYE_WORDS = ["bye", "goodbye", "see you", "take care", "welcome", "good night", "goodnight",
             "anytime", "glad"]
SELF_WORDS = ["demo model", "DFlash Chat"]

SCOPE = ["who is the president of France?", "who won the world cup in 2018",
         "who is the prime minister of the uk these days", "what happened in germany in 1989?",
         "write me a poem about brazil", "plan a 3 day trip to italy pls",
         "is it safe to travel to egypt right now", "best restaurants in tokyo?",
         "whats the weather in london tomorrow", "how do i get a visa for japan",
         "translate 'good morning' into spanish", "who was the first person on the moon",
         "how tall is mount everest", "when did world war 2 end", "recommend a good movie",
         "tell me a joke pls", "can you fix my python code", "what's bitcoin worth today",
         "give me a recipe that uses 3 eggs", "what's the best phone to buy in 2026",
         "who will win the election in the us?", "write a haiku about rain",
         "how many goals did messi score in 2022", "explain quantum physics to me",
         "what stocks should i buy", "who painted the mona lisa"]

CONTINENTS = ["Africa", "Asia", "Europe", "North America", "South America", "Oceania"]


def _pick(rng: random.Random, pool: list[str], n: int) -> list[str]:
    return rng.sample(pool, n)


def _item(cat: str, i: int, text: str, tools: bool, expect: dict) -> dict:
    expect.setdefault("not_contains", NO_MARKUP)
    return {"id": f"v2-{cat}-{i}", "category": cat,
            "messages": [{"role": "user", "content": text}], "tools": tools,
            "enable_thinking": True, "needs_tools": bool(expect.get("calls")), "expect": expect}


def expect_fact(cat_field: str, rec: dict) -> dict:
    """Expectation of a country_info answer about one field."""
    if cat_field == "capital":
        return {"contains": [rec["capital"]]}
    if cat_field == "currency":
        return {"contains": [rec["currency"]["name"]]}
    if cat_field == "languages":
        return {"contains": list(rec["languages"])}
    if cat_field == "population":
        return {"numbers": [rec["population"]]}
    if cat_field == "continent":
        return {"contains": [rec["continent"]]}
    raise ValueError(cat_field)


def singles(rng: random.Random) -> list[dict]:
    """The single-turn items (about 160, 26 of them out of scope)."""
    db = countries()
    names = sorted(db)
    typo_names = sorted(MISSPELT) + sorted(CASUAL)
    items: list[dict] = []

    def add(cat: str, text: str, tools: bool, expect: dict) -> None:
        items.append(_item(cat, len(items), text, tools, expect))

    for field, tmpl, n in [("capital", CAPITAL_T, 12), ("currency", CURRENCY_T, 10),
                           ("languages", LANG_T, 10), ("population", POP_T, 8),
                           ("continent", CONT_T, 8)]:
        for j in range(n):
            c = rng.choice(typo_names if j % 2 == 0 else names)
            text = roughen(rng, tmpl[j % len(tmpl)].format(c=casual_name(rng, c)))
            add(f"tool_{field}", text, True,
                {"calls": [call("country_info", name=c)], **expect_fact(field, db[c])})
    for j in range(8):  # "X or Y?"
        c = rng.choice(names)
        rec = db[c]
        kind = j % 3
        if kind == 0:
            other = rng.choice([k for k in CONTINENTS if k != rec["continent"]])
            a, b = rng.sample([rec["continent"], other], 2)
            text = rng.choice(EITHER_CONT_T).format(c=casual_name(rng, c), a=a, b=b)
            exp = expect_fact("continent", rec)
        elif kind == 1:
            other = db[rng.choice([n for n in names if n != c])]["capital"]
            a, b = rng.sample([rec["capital"], other], 2)
            text = rng.choice(EITHER_CAP_T).format(c=casual_name(rng, c), a=a, b=b)
            exp = expect_fact("capital", rec)
        else:
            other = db[rng.choice([n for n in names
                                   if db[n]["currency"]["name"] != rec["currency"]["name"]])]
            a, b = rng.sample([rec["currency"]["name"], other["currency"]["name"]], 2)
            text = rng.choice(EITHER_CUR_T).format(c=casual_name(rng, c), a=a, b=b)
            exp = expect_fact("currency", rec)
        add("either_or", roughen(rng, text), True, {"calls": [call("country_info", name=c)], **exp})
    cities = sorted(CITIES)
    for j, city in enumerate(_pick(rng, cities, 8)):
        text = roughen(rng, TIME_T[j % len(TIME_T)].format(city=city))
        add("tool_time", text, True, {"calls": [call("current_time", timezone=CITIES[city])],
                                      "time_of": [CITIES[city]]})
    for tmpl in TIME_OR_T:
        city = rng.choice(cities)
        add("tool_time", roughen(rng, tmpl.format(city=city)), True,
            {"calls": [call("current_time", timezone=CITIES[city])], "time_of": [CITIES[city]]})
    for tmpl in TWO_TIMES_T:
        a, b = rng.sample(cities, 2)
        while CITIES[a] == CITIES[b]:
            a, b = rng.sample(cities, 2)
        add("tool_time", roughen(rng, tmpl.format(a=a, b=b)), True,
            {"calls": [call("current_time", timezone=CITIES[a]),
                       call("current_time", timezone=CITIES[b])],
             "time_of": [CITIES[a], CITIES[b]]})
    calcs = _calc_items(rng)
    rng.shuffle(calcs)
    for text, expr, value in calcs[:16]:
        add("tool_calc", text, True, {"calls": [call("calculator", expression=expr)],
                                      "numbers": [value]})
    for text, args in _convert_items(rng):
        value = tool_value("convert_units", args)["value"]
        add("tool_convert", text, True, {"calls": [call("convert_units", **args)],
                                         "numbers": [value]})
    for j, (text, value) in enumerate(MENTAL):
        tools = j % 2 == 0
        exp: dict = {"numbers": [value]}
        exp["calls"] = [call("calculator", expression=_mental_expr(text))] if tools else []
        add("mental_tools" if tools else "mental", text, tools, exp)
    for j, n in enumerate([2, 3, 4, 6, 2, 3, 4, 6, 3, 2]):
        k = rng.choice(CONTINENTS)
        in_k = [r for r in db.values() if r["continent"] == k]
        caps = j % 3 == 2
        tmpl = rng.choice(LIST_CAP_T if caps else LIST_T)
        allowed = sorted({r["capital"] for r in in_k} if caps else
                         {x for r in in_k for x in [r["name"], *r.get("aliases", [])]})
        add("list_count", roughen(rng, tmpl.format(n=n, k=rng.choice([k, k.lower()]))), True,
            {"calls": [], "exact_count": n, "list_items": allowed})
    for j in range(6):  # facts without tools
        c = rng.choice(names)
        tmpl, field = MEMORY_T[j % len(MEMORY_T)]
        add("memory", roughen(rng, tmpl.format(c=casual_name(rng, c, 0.0))), False,
            {"calls": [], **expect_fact(field, db[c])})
    for text in _pick(rng, GREETINGS, 5):
        add("greeting", text, True, {"calls": [], "any_of": GREET_WORDS})
    for text in _pick(rng, THANKS, 5):
        add("thanks", text, True, {"calls": [], "any_of": THANK_WORDS})
    for text in _pick(rng, BYES, 4):
        add("bye", text, True, {"calls": [], "any_of": BYE_WORDS})
    for text in SELF:
        add("self", text, True, {"calls": [], "any_of": SELF_WORDS})
    for text in SCOPE:
        add("scope", text, True, {"calls": [], "scope": True})
    return items


def _mental_expr(text: str) -> str:
    """The calculator expression of a :data:`MENTAL` question."""
    import re

    t = text.replace("half of 50", "50 / 2").replace(" x ", " * ").replace("times", "*")
    t = t.replace("plus", "+").replace("minus", "-")
    nums = re.findall(r"\d+|[-+*/]", t.split(":")[-1])
    return "".join(nums)


# ---- scripts ------------------------------------------------------------------------------------

def _turn(user: str, category: str, expect: dict) -> dict:
    expect.setdefault("not_contains", NO_MARKUP)
    return {"user": user, "category": category, "expect": expect}


def country_follow(db: dict, c: str, field: str) -> dict:
    """A follow-up about a country named earlier: no call (the history has it) or the call."""
    return {"calls": [call("country_info", name=c)], "calls_optional": True, **expect_fact(field, db[c])}


def scripts(rng: random.Random) -> list[dict]:
    """The 2-4 turn scripts (40)."""
    db = countries()
    names = sorted(db)
    out: list[dict] = []

    def add(kind: str, turns: list[dict]) -> None:
        out.append({"id": f"v2-script-{len(out)}-{kind}", "kind": kind, "tools": True,
                    "enable_thinking": True, "turns": turns})

    cur_follow = ["what currency do they use there", "and the money there?",
                  "what do they pay with there?", "which currency do they have"]
    lang_follow = ["what language do they speak?", "and what do people speak there",
                   "languages there?"]
    for j in range(5):
        c = rng.choice(names)
        t = [_turn(roughen(rng, rng.choice(["tell me about {c}", "{c} capital?",
                                            "give me some facts on {c}"]).format(
                   c=casual_name(rng, c))), "tool_capital",
                   {"calls": [call("country_info", name=c)], "contains": [db[c]["capital"]]}),
             _turn(rng.choice(cur_follow), "follow_currency", country_follow(db, c, "currency"))]
        if j % 2 == 0:
            t.append(_turn(rng.choice(lang_follow), "follow_languages",
                           country_follow(db, c, "languages")))
        add("pronoun_country", t)
    for _ in range(5):
        c = rng.choice(names)
        add("languages_then_capital", [
            _turn(roughen(rng, rng.choice(LANG_T).format(c=casual_name(rng, c))), "tool_languages",
                  {"calls": [call("country_info", name=c)], **expect_fact("languages", db[c])}),
            _turn(rng.choice(["its capital?", "and its capital city", "what's its capital"]),
                  "follow_capital", country_follow(db, c, "capital"))])
    for j in range(4):
        k = CONTINENTS[j]
        n = 3 + j % 2
        allowed = sorted({x for r in db.values() if r["continent"] == k
                          for x in [r["name"], *r.get("aliases", [])]})
        idx, word = [(1, "the first one"), (2, "the second one"), (1, "the first"),
                     (2, "the 2nd one")][j]
        field = ["capital", "currency", "capital", "languages"][j]
        q = {"capital": "what's the capital of {w}?", "currency": "{w} - what currency?",
             "languages": "what do they speak in {w}"}[field].format(w=word)
        add("list_then_ref", [
            _turn(roughen(rng, rng.choice(LIST_T).format(n=n, k=k)), "list_count",
                  {"calls": [], "exact_count": n, "list_items": allowed}),
            _turn(q, "follow_ref", {"ref": {"turn": 0, "index": idx, "field": field}})])
    cities = sorted(CITIES)
    for j in range(4):
        a, b = rng.sample(cities, 2)
        while CITIES[a] == CITIES[b]:
            a, b = rng.sample(cities, 2)
        t = [_turn(roughen(rng, rng.choice(TIME_T).format(city=a)), "tool_time",
                   {"calls": [call("current_time", timezone=CITIES[a])], "time_of": [CITIES[a]]}),
             _turn(rng.choice(["and {b}?", "what about {b}", "and in {b} pls"]).format(b=b),
                   "follow_time", {"calls": [call("current_time", timezone=CITIES[b])],
                                   "time_of": [CITIES[b]]})]
        if j % 2:
            t.append(_turn(rng.choice(THANKS), "thanks", {"calls": [], "any_of": THANK_WORDS}))
        add("time_then_other", t)
    for j in range(5):
        a, b = rng.randint(12, 99), rng.randint(3, 40)
        d = rng.choice([2, 4, 5, 8])
        e = rng.randint(5, 500)
        v1 = tool_value("calculator", {"expression": f"{a}*{b}"})
        v2 = tool_value("calculator", {"expression": f"{v1}/{d}"})
        v3 = tool_value("calculator", {"expression": f"{v2}+{e}"})
        t = [_turn(rng.choice(["{a}*{b}?", "what is {a} times {b}", "whats {a} x {b}"]).format(
                 a=a, b=b), "tool_calc",
                   {"calls": [call("calculator", expression=f"{a}*{b}")], "numbers": [v1]}),
             _turn(rng.choice(["divide that by {d}", "now / {d}", "ok split that by {d}"]).format(
                 d=d), "follow_calc",
                   {"calls": [call("calculator", expression=f"{v1}/{d}")], "numbers": [v2]})]
        if j != 4:
            t.append(_turn(rng.choice(["now add {e}", "plus {e}?", "and add {e} to it"]).format(
                e=e), "follow_calc",
                {"calls": [call("calculator", expression=f"{v2}+{e}")], "numbers": [v3]}))
        if j in (0, 2):
            t.append(_turn(rng.choice(BYES), "bye", {"calls": [], "any_of": BYE_WORDS}))
        add("calc_chain", t)
    for _ in range(4):
        a, b = rng.randint(10, 400), rng.randint(10, 400)
        v = tool_value("calculator", {"expression": f"{a}+{b}"})
        unit_a, unit_b, word = rng.choice([("km", "mile", "miles"), ("kg", "lb", "pounds"),
                                           ("mile", "km", "km")])
        w = {"km": "km", "kg": "kg", "mile": "miles"}[unit_a]
        args = {"value": v, "from_unit": unit_a, "to_unit": unit_b}
        add("calc_then_convert", [
            _turn(rng.choice(["{a}+{b}", "what's {a} plus {b}", "{a} + {b} = ?"]).format(a=a, b=b),
                  "tool_calc", {"calls": [call("calculator", expression=f"{a}+{b}")],
                                "numbers": [v]}),
            _turn(f"ok if that's {w}, how many {word} is it", "follow_convert",
                  {"calls": [call("convert_units", **args)],
                   "numbers": [tool_value("convert_units", args)["value"]]})])
    for _ in range(4):
        x, y = rng.sample([-5, -12, -18, -30, -40, -7], 2)
        src, dst, ws, wd = rng.choice([("degC", "degF", "c", "f"), ("degF", "degC", "f", "c")])
        a1 = {"value": x, "from_unit": src, "to_unit": dst}
        a2 = {"value": y, "from_unit": src, "to_unit": dst}
        add("temp_again", [
            _turn(rng.choice(["{x} {s} in {d}?", "what's {x} degrees {s} in {d}",
                              "convert {x}{s} to {d}"]).format(x=x, s=ws, d=wd), "tool_convert",
                  {"calls": [call("convert_units", **a1)],
                   "numbers": [tool_value("convert_units", a1)["value"]]}),
            _turn(rng.choice(["and {y}?", "what about {y}", "now {y} pls"]).format(y=y),
                  "follow_convert", {"calls": [call("convert_units", **a2)],
                                     "numbers": [tool_value("convert_units", a2)["value"]]})])
    for _ in range(4):
        c = rng.choice(names)
        add("greet_q_bye", [
            _turn(rng.choice(GREETINGS), "greeting", {"calls": [], "any_of": GREET_WORDS}),
            _turn(roughen(rng, rng.choice(CAPITAL_T).format(c=casual_name(rng, c))),
                  "tool_capital", {"calls": [call("country_info", name=c)],
                                   **expect_fact("capital", db[c])}),
            _turn(rng.choice(["cheers, bye", "thanks! bye", "great thx, see ya"]), "bye",
                  {"calls": [], "any_of": BYE_WORDS + THANK_WORDS})])
    for q in ["who is the president of {c}?", "whats the weather like in {c} today",
              "write a song about {c}"]:
        c = rng.choice(names)
        add("scope_then_q", [
            _turn(q.format(c=casual_name(rng, c, 0.0)), "scope", {"calls": [], "scope": True}),
            _turn(rng.choice(["ok, then what about its population", "fine. how many people live there?"]),
                  "follow_population", country_follow(db, c, "population"))])
    for _ in range(2):
        c1, c2 = rng.sample(names, 2)
        add("compare_two", [
            _turn(roughen(rng, rng.choice(POP_T).format(c=casual_name(rng, c1))), "tool_population",
                  {"calls": [call("country_info", name=c1)], **expect_fact("population", db[c1])}),
            _turn(rng.choice(["what about {c}", "and {c}?"]).format(c=casual_name(rng, c2)),
                  "follow_population", {"calls": [call("country_info", name=c2)],
                                        **expect_fact("population", db[c2])})])
    return out


# ---- long chats ---------------------------------------------------------------------------------

def long_chats(rng: random.Random, n_chats: int = 3, n_turns: int = 30) -> list[dict]:
    """``n_chats`` chats of ``n_turns`` mixed turns: country questions with pronoun follow-ups,
    questions that name a country from several turns back, clocks, calculator chains,
    conversions, counted lists, thanks and out-of-scope questions; a greeting first and a
    goodbye last."""
    db = countries()
    names = sorted(db)
    cities = sorted(CITIES)
    out = []
    for ci in range(n_chats):
        turns: list[dict] = [_turn(rng.choice(GREETINGS), "greeting",
                                   {"calls": [], "any_of": GREET_WORDS})]
        asked: list[tuple[int, str]] = []  # (turn index, country)
        last_calc = None
        while len(turns) < n_turns - 1:
            kind = rng.choice(["country", "country", "back", "time", "calc", "calc_follow",
                               "convert", "list", "thanks", "scope", "mental"])
            if kind == "back":
                old = [c for i, c in asked if len(turns) - i >= 4]
                if not old:
                    continue
                c = rng.choice(old)
                field = rng.choice(["currency", "capital", "languages", "continent"])
                q = {"currency": "going back to {c}, what currency do they use?",
                     "capital": "earlier you looked up {c} - remind me of its capital",
                     "languages": "back to {c}: what languages are spoken there?",
                     "continent": "and {c} was on which continent again?"}[field]
                turns.append(_turn(q.format(c=c.lower() if rng.random() < 0.5 else c),
                                   "reach_back", country_follow(db, c, field)))
            elif kind == "country":
                c = rng.choice(names)
                field = rng.choice(["capital", "population", "currency", "languages"])
                tmpl = {"capital": CAPITAL_T, "population": POP_T, "currency": CURRENCY_T,
                        "languages": LANG_T}[field]
                turns.append(_turn(roughen(rng, rng.choice(tmpl).format(c=casual_name(rng, c))),
                                   f"tool_{field}", {"calls": [call("country_info", name=c)],
                                                     **expect_fact(field, db[c])}))
                asked.append((len(turns) - 1, c))
                if len(turns) < n_turns - 1 and rng.random() < 0.6:
                    f2 = rng.choice([f for f in ("capital", "currency", "languages", "continent")
                                     if f != field])
                    q = {"capital": "its capital?", "currency": "what currency do they use there",
                         "languages": "what language do they speak?",
                         "continent": "which continent is it on"}[f2]
                    turns.append(_turn(q, f"follow_{f2}", country_follow(db, c, f2)))
            elif kind == "time":
                city = rng.choice(cities)
                turns.append(_turn(roughen(rng, rng.choice(TIME_T).format(city=city)), "tool_time",
                                   {"calls": [call("current_time", timezone=CITIES[city])],
                                    "time_of": [CITIES[city]]}))
            elif kind == "calc":
                a, b = rng.randint(11, 999), rng.randint(2, 99)
                op = rng.choice(["+", "*", "-"])
                e = f"{a}{op}{b}"
                last_calc = tool_value("calculator", {"expression": e})
                turns.append(_turn(rng.choice(["{e}?", "what is {e}", "calc {e} pls"]).format(e=e),
                                   "tool_calc", {"calls": [call("calculator", expression=e)],
                                                 "numbers": [last_calc]}))
            elif kind == "calc_follow":
                if last_calc is None or turns[-1]["category"] not in ("tool_calc", "follow_calc"):
                    continue
                m = rng.choice([2, 3, 10])
                e = f"{last_calc}*{m}"
                last_calc = tool_value("calculator", {"expression": e})
                turns.append(_turn(rng.choice(["times that by {m}", "multiply that by {m}",
                                               "now x{m}"]).format(m=m), "follow_calc",
                                   {"calls": [call("calculator", expression=e)],
                                    "numbers": [last_calc]}))
            elif kind == "convert":
                text, args = rng.choice(_convert_items(random.Random(rng.random())))
                turns.append(_turn(text, "tool_convert",
                                   {"calls": [call("convert_units", **args)],
                                    "numbers": [tool_value("convert_units", args)["value"]]}))
            elif kind == "list":
                n = rng.choice([2, 3, 4])
                k = rng.choice(CONTINENTS)
                allowed = sorted({x for r in db.values() if r["continent"] == k
                                  for x in [r["name"], *r.get("aliases", [])]})
                turns.append(_turn(rng.choice(LIST_T).format(n=n, k=k), "list_count",
                                   {"calls": [], "exact_count": n, "list_items": allowed}))
            elif kind == "thanks":
                if turns[-1]["category"] in ("thanks", "greeting", "scope"):
                    continue
                turns.append(_turn(rng.choice(THANKS), "thanks",
                                   {"calls": [], "any_of": THANK_WORDS}))
            elif kind == "scope":
                turns.append(_turn(rng.choice(SCOPE), "scope", {"calls": [], "scope": True}))
            else:
                text, value = rng.choice(MENTAL)
                turns.append(_turn(text, "mental_tools",
                                   {"calls": [call("calculator", expression=_mental_expr(text))],
                                    "numbers": [value]}))
        turns.append(_turn(rng.choice(BYES), "bye", {"calls": [], "any_of": BYE_WORDS}))
        out.append({"id": f"v2-long-{ci}", "kind": "long", "tools": True,
                    "enable_thinking": True, "turns": turns})
    return out


# ---- writing ------------------------------------------------------------------------------------

def build(seed: int = SEED) -> tuple[list[dict], list[dict], list[dict]]:
    """(single-turn items, scripts, long chats), deterministic for ``seed``."""
    return (singles(random.Random(seed)), scripts(random.Random(seed + 1)),
            long_chats(random.Random(seed + 2)))


def user_texts() -> set[str]:
    """Every user text of the committed v2 files (single-turn items, scripts, long chats);
    empty when they are missing. The corpus never uses one of them (``build.prepare``)."""
    texts: set[str] = set()
    if PROMPTS.exists():
        texts |= {m["content"] for it in json.loads(PROMPTS.read_text("utf-8"))
                  for m in it["messages"] if m["role"] == "user"}
    for path in (SCRIPTS, LONG):
        if path.exists():
            texts |= {t["user"] for s in json.loads(path.read_text("utf-8")) for t in s["turns"]}
    return texts


def dumps(obj) -> str:
    """The files' JSON text (one space indent, UTF-8 kept, final newline)."""
    return json.dumps(obj, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the three files (see the module doc); refuses to overwrite without ``--force``."""
    p = argparse.ArgumentParser(description="write the demo pair's held-out set v2")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.add_argument("--seed", type=int, default=SEED)
    args = p.parse_args(argv)
    files = [PROMPTS, SCRIPTS, LONG]
    there = [f for f in files if f.exists()]
    if there and not args.force:
        print(f"refusing to overwrite {', '.join(f.name for f in there)} (the set is frozen; "
              "--force to rewrite)", file=sys.stderr)
        return 2
    for f, obj in zip(files, build(args.seed)):
        f.write_text(dumps(obj), encoding="utf-8")
        print(f"wrote {f} ({len(obj)} items)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Corpus v6 (issue 43): the v5e generator (:mod:`tools.demo_pair.corpus`) plus generalisation
and long chats, for fine-tuning the shipped v9 pair.

:class:`GeneratorV6` subclasses :class:`~tools.demo_pair.corpus.Generator` without changing
its random draws for the older versions (``Generator`` itself is untouched, so corpus v5e and
the frozen held-out sets are still what they were). What v6 adds, each chosen from the kinds of
failure issue 43 names, never from a held-out item:

* **Perturbed user texts** (:meth:`GeneratorV6.perturb`): casual spellings and one-edit typos of
  country and city names (:func:`typo_name`, checked to lead back to the same country or city
  and to no other), aliases ("Holland", "USA"), lower case, no final mark, fillers ("pls",
  "quick q:", "hey", "rn"), casual words ("whats", "u"). The tool call and the answer carry the
  canonical name; made-up names in tool errors are never perturbed (they must be copied) and
  are never near misses of a real name (:meth:`GeneratorV6._fake_name`).
* **More paraphrases** per category (:data:`T6`, :data:`F6`), some with a different word
  order ("{c} capital?", "in {c}, what currency ..."); any whose head is a held-out frame's
  head is dropped automatically (:func:`_without_heldout_heads`).
* **New kinds**: "X or Y?" comparisons (two ``country_info`` calls, or two ``current_time``
  calls for "is it later in A or B?"); percentages, square roots, powers, sums written without
  spaces and negative numbers sent to the calculator as a spaced expression; negative
  temperatures; small mental arithmetic without tools ("12 times 11") in true one-step facts;
  lists honouring the asked count (2-8); pronoun follow-ups resolved to the last country
  mentioned, up to four turns back, and "the first one" after a list; calculator chains of
  2-5 steps, each on the previous result; casual thanks, goodbyes and greetings ("cheers",
  "bye", "hello, anyone there?") answered briefly with no call; out-of-scope questions that
  name a country, a city or a number ("who is the president of {c}?", "who won the world cup
  in 2018?") answered with the scope sentence and no call.
* **Long chats** (:meth:`GeneratorV6.long_chat`): 20-40 turns of mixed topics with follow-ups
  that reach back; ``data.py`` renders them as the app presents them (oldest turns left out by
  ``app.chat.history.fit_history`` within the 4,096-token context less the 512 tokens the app
  keeps free for the reply).
"""

from __future__ import annotations

import datetime as dt
import difflib
import functools
import json
import re

from app.chat.tools.clock import current_time
from tools.demo_pair.corpus import (
    BAD_COUNTRIES,
    BAD_COUNTRIES_HELDOUT,
    CITY_ZONES,
    GREETING_ANSWER,
    SCOPE_ANSWER,
    SCOPE_MARK,
    THANKS_ANSWER,
    UNITS,
    Chat,
    F,
    Generator,
    T,
    Turn,
    assistant,
    fmt_list,
    jtext,
)

VERSION = "v6"
GOODBYE_ANSWER = "Goodbye! You're welcome back any time."
"""The answer to a goodbye (no tool call)."""
COUNT_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}
SMALL_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
               "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
               "seventeen", "eighteen", "nineteen", "twenty"]
LONG_SHARE = 0.035
"""Share of v6 chats that are long chats (20-40 turns)."""
NAME_PERTURB_SHARE = 0.3
"""Share of turns naming a real country or city whose name is perturbed."""
NOISE_SHARE = 0.35
"""Share of turns given v6's casual noise (on top of v5e's)."""

# ---- paraphrases ------------------------------------------------------------------------------
T6: dict[str, list[str]] = {
    "capital": [
        "whats the capital of {c}", "capital city of {c}?", "{c}'s capital is what?",
        "{c} - capital?", "which city is capital of {c}", "I forgot the capital of {c}, what "
        "is it?", "remind me, what's the capital of {c}?", "in {c}, what is the capital?",
        "for {c}, which city is the capital?", "capital for {c}?", "{c}: what's the capital?",
        "whats {c} capital", "the capital of {c} is?", "what do they call the capital of {c}?",
        "{c} capital city pls", "capital of {c} again?", "what city is {c}'s capital these days?",
        "the capital in {c}?", "{c}, capital?", "where's the capital of {c}, which city?"],
    "continent": [
        "{c} is in which continent", "what continent is {c} in", "which continent has {c}?",
        "{c} - which continent?", "what part of the world is {c} in", "remind me which "
        "continent {c} is on", "continent for {c}?", "{c}: continent?", "where in the world is "
        "{c}?", "{c} belongs to which continent?", "which continent would {c} be on?",
        "{c} continent pls", "in what continent do I find {c}?", "is {c} in asia or europe or "
        "where?", "what continent's {c} on"],
    "currency": [
        "what currency do they use in {c}", "what money does {c} use these days?",
        "{c} currency?", "currency in {c} pls", "what do they pay with in {c} nowadays?",
        "which money do I need in {c}?", "what is {c}'s money called?", "{c}: what currency?",
        "what's the local currency in {c}?", "what cash do people use in {c}?",
        "if I go to {c}, what currency do I need?", "currency used in {c} these days?",
        "what's the official currency of {c}", "{c} uses which currency?",
        "in {c}, what currency do they have?", "what do u pay with in {c}"],
    "languages": [
        "what language do they speak in {c}?", "what languages are spoken in {c} these days?",
        "{c} language?", "what do they speak in {c}", "which languages are official in {c}?",
        "official language of {c}?", "what language is spoken in {c}", "{c}: languages?",
        "what's the language in {c}?", "in {c}, what language do people use?",
        "which language would I hear in {c}?", "what languages does {c} have?",
        "main language of {c}?", "language spoken in {c} pls", "{c} - what do they speak?",
        "what language do ppl speak in {c}"],
    "population": [
        "how many people live in {c}?", "how many people are in {c} these days?",
        "population of {c} pls", "{c} population?", "what's the population of {c} nowadays?",
        "how big is the population of {c}?", "how many people does {c} have?",
        "{c}: how many people?", "roughly how many people live in {c}", "how populous is {c}?",
        "number of people in {c}?", "what is {c}'s population these days",
        "how many live in {c}?", "approx population of {c}?", "in {c}, how many people are "
        "there?", "{c} - population?"],
    "info": [
        "tell me about {c}", "what can you tell me about {c}?", "facts about {c} pls",
        "give me an overview of {c}", "{c} overview?", "info on {c}", "everything you know "
        "about {c}", "some facts on {c}?", "quick facts about {c}", "{c}: key facts?",
        "describe {c} for me", "tell me some stuff about {c}", "what do you know about {c}?",
        "{c} facts pls", "basic info about {c}?"],
    "time": [
        "what time is it in {city}?", "whats the time in {city} rn", "time in {city} pls",
        "{city} time?", "current time in {city}", "what's the time over in {city}?",
        "what time is it now in {city}", "{city}: what time is it?", "do you know the time in "
        "{city}?", "time now in {city}?", "what's the local time in {city} right now?",
        "what hour is it in {city}?", "what's the date and time in {city}?", "in {city}, what "
        "time is it?", "{city} - time pls", "time and date in {city}?"],
    "calc": [
        "{e}", "what's {e}?", "calculate {e}", "whats {e}", "{e} = ?", "compute {e} pls",
        "work out {e}", "can you do {e}?", "what does {e} come to?", "{e}?", "solve {e}",
        "how much is {e}", "quick math: {e}", "what do I get for {e}?", "{e} is what?"],
    "convert": [
        "convert {v} {frm} to {to}", "{v} {frm} in {to}?", "how many {to} is {v} {frm}?",
        "{v} {frm} to {to} pls", "what's {v} {frm} in {to}", "change {v} {frm} into {to}",
        "how much is {v} {frm} in {to}?", "turn {v} {frm} into {to}", "{v} {frm} -> {to}",
        "whats {v} {frm} in {to}", "express {v} {frm} in {to}", "if I have {v} {frm}, how "
        "many {to} is that?", "{v} {frm} = how many {to}?", "in {to}, what is {v} {frm}?"],
    "self": [
        "who are u", "what are you?", "what can u do", "are you a bot?", "what do you know?",
        "what can you help with?", "who am I talking to?", "what's your name?",
        "tell me about yourself", "what are you good at?", "what is this thing?",
        "are you an AI?", "what can I ask you?"],
    "explain": [
        "explain {t}", "{t}? explain pls", "how does {t} work", "can u explain {t}",
        "what's {t} in simple words", "{t} - what is it?", "explain {t} simply",
        "quick explanation of {t}?"],
}
F6: dict[str, list[str]] = {
    "capital": ["what's its capital?", "and its capital city?", "its capital?", "capital?",
                "what about its capital", "and the capital there?", "what's the capital there?",
                "which city is their capital?", "and what's the capital", "ok and its capital"],
    "currency": ["what currency do they use there", "what money do they use there?",
                 "and their currency?", "what do they pay with there", "currency there?",
                 "what's their money called?", "and what currency is it", "ok what currency "
                 "do they have?", "which currency do they use"],
    "languages": ["what language do they speak?", "what language do they speak there",
                  "and what do they speak?", "which languages do they use there?",
                  "what's spoken there?", "language there?", "and their language?",
                  "what languages do they have?", "ok and the language"],
    "population": ["how many people live there?", "how many people are there",
                   "and how many people?", "what's their population?", "population there?",
                   "how big is its population?", "and the population there"],
    "continent": ["which continent is it on?", "where is that?", "what continent is that in?",
                  "continent?", "and where is it located?", "which continent is that one in"],
}
ORDINALS = {0: ["first", "1st"], 1: ["second", "2nd"], 2: ["third", "3rd"]}
F6_ORDINAL = {
    "capital": ["what's the capital of the {o} one?", "and the {o} one's capital?",
                "capital of the {o} one?", "the {o} one - capital?"],
    "currency": ["what currency does the {o} one use?", "the {o} one, what currency?",
                 "and the currency of the {o} one?"],
    "languages": ["what do they speak in the {o} one?", "what language does the {o} one "
                  "have?", "the {o} one - what language?"],
    "population": ["how many people live in the {o} one?", "population of the {o} one?"],
    "info": ["tell me about the {o} one", "more about the {o} one?", "facts on the {o} one "
             "pls"],
}
COMPARE = {
    "more": ["which is bigger, {c} or {c2}?", "{c} or {c2}, which has more people?",
             "which has the larger population: {c} or {c2}?", "is {c} bigger than {c2}?",
             "who has more people, {c} or {c2}", "{c} or {c2} - which is more populous?",
             "which country is larger by population, {c} or {c2}?",
             "bigger population: {c} or {c2}?", "does {c} have more people than {c2}?",
             "{c} vs {c2} population?", "which one's bigger, {c} or {c2}",
             "{c} or {c2}?? which is bigger", "which is larger, {c} or {c2}?",
             "more people in {c} or in {c2}?"],
    "fewer": ["which is smaller, {c} or {c2}?", "which has fewer people, {c} or {c2}?",
              "{c} or {c2}, which is less populous?", "is {c} smaller than {c2}?",
              "which one has the smaller population, {c} or {c2}", "fewer people: {c} or {c2}?"],
}
COMPARE_TIME = ["is it later in {city} or {city2}?", "where is it later right now, {city} or "
                "{city2}?", "{city} or {city2}: where is it later?", "which is ahead in time, "
                "{city} or {city2}?", "is the clock later in {city} or in {city2}?"]
PERCENT = ["what's {p} percent of {m}?", "{p}% of {m}", "{p} percent of {m} pls",
           "calculate {p}% of {m}", "how much is {p}% of {m}?", "whats {p} percent of {m}",
           "{p} pct of {m}?", "what is {p}% of {m}?", "find {p} percent of {m}"]
SQRT = ["square root of {n}", "what's the square root of {n}?", "sqrt of {n}",
        "sqrt({n})?", "whats the sqrt of {n}", "calculate the square root of {n}",
        "the square root of {n} is?", "root of {n}?"]
POWER = ["{a} to the power of {b}", "what's {a} to the power of {b}?", "{a}^{b}",
         "{a} raised to the power {b}", "calculate {a}^{b}", "{a} to the power {b}?",
         "whats {a} to the {b}th power", "{a}**{b}"]
SQUARED = ["what's {a} squared?", "{a} squared", "{a} squared pls"]
CUBED = ["what's {a} cubed?", "{a} cubed"]
NOSPACE = ["{s}", "{s}?", "whats {s}", "{s}=", "{s} = ?", "calc {s}", "what is {s}"]
NEG_TEMP = ["convert {v} {frm} to {to}", "what's {v} {frm} in {to}?", "{v} {frm} in {to} pls",
            "how much is {v} {frm} in {to}?", "{v} {frm} to {to}?", "it's {v} {frm} outside, "
            "what is that in {to}?"]
MENTAL = ["what's {a} {w} {b}?", "{a} {w} {b}", "{a} {w} {b}?", "how much is {a} {w} {b}",
          "whats {a} {w} {b}", "{a}{s}{b}", "{a} {s} {b} = ?", "quick one: {a} {w} {b}",
          "what is {a} {w} {b} exactly?"]
LIST_N = {
    "country": ["name {n} countries in {cont}", "list {n} countries of {cont}",
                "{n} countries in {cont} pls", "just {n} countries in {cont}",
                "tell me {n} countries that are in {cont}", "what are {n} countries in "
                "{cont}?", "give me {n} countries from {cont}", "can you list {n} countries "
                "in {cont}?", "only {n} countries of {cont}, please", "I need {n} countries in "
                "{cont}"],
    "capital": ["name {n} capitals in {cont}", "list {n} capitals of {cont}",
                "{n} capitals in {cont} pls", "just {n} capital cities in {cont}",
                "what are {n} capitals in {cont}?", "give me {n} capitals from {cont}",
                "only {n} capitals of {cont}, please", "I need {n} capital cities in {cont}"],
}
THANKS6 = ["cheers", "thx", "ty", "thanks!!", "thank u", "great, thanks", "perfect, cheers",
           "awesome thx", "nice one, thanks", "cool thanks", "ok thanks", "cheers mate",
           "much appreciated", "that helps, thanks", "thank you so much!", "ta", "thanks a lot",
           "brilliant, thank you", "thx!", "ok cool, ty"]
BYE6 = ["bye", "goodbye", "bye!", "see ya", "see you later", "ok bye", "that's all, bye",
        "good night", "cya", "talk later", "gotta go, bye", "I'm done, goodbye", "bye bye",
        "ok that's it, bye", "later!"]
HELLO6 = ["hello, anyone there?", "hey", "yo", "hiya", "hello?", "anyone home?", "hi there!",
          "good evening", "sup", "howdy", "hey there, you awake?", "hello hello", "morning!",
          "hi, how are you?", "hey, you there?", "heya", "good afternoon", "hi!!", "helo"]
SCOPE6 = [
    "who is the president of {c}?", "who is the prime minister of {c}?", "who won the world "
    "cup in {year}?", "who won the election in {c} in {year}?", "what happened in {c} in "
    "{year}?", "what is the GDP of {c}?", "how big is {c} in square kilometers?",
    "what's the tallest mountain in {c}?", "what is {c} famous for?", "best time to visit "
    "{c}?", "is {c} safe to travel to?", "who is the king of {c}?", "what's the national dish "
    "of {c}?", "what's the national anthem of {c}?", "when did {c} become independent?",
    "how many times has {c} won the world cup?", "what is the largest city in {c}?",
    "who won the olympics in {year}?", "what was the number one song in {year}?",
    "who was born in {year}?", "how much did a house cost in {year}?", "convert {n} dollars "
    "to euros", "what's the exchange rate between {c} and {c2}?", "what's {n} dollars in "
    "yen?", "who won the nobel prize in {year}?", "is {c} a good place to live?",
    "what's the crime rate in {city}?", "who is the mayor of {city}?", "what's the weather "
    "in {c} this week?", "who was the leader of {c} in {year}?", "what's the best football "
    "team in {c}?", "what is the area of {c}?", "how many states does {c} have?",
    "who invented the telephone in {year}?", "what's the lottery number for {year}?",
    "what sport is popular in {c}?", "tell me a joke about {c}", "write a poem about {city}",
    "what should I eat in {city}?", "how do I get a visa for {c}?", "what's {c}'s "
    "national animal?", "who won the champions league in {year}?"]


def _bare(text: str) -> str:
    return text.strip().lower().rstrip(" .!?")


def _heldout_heads() -> set[str]:
    """Heads (text before the first placeholder, lower case) of every held-out frame of the
    v5e tables (the frozen v1 held-out sets are made from these)."""
    heads = set()
    tables = list(T.values()) + list(F.values()) + list(F["field"].values())
    for table in tables:
        for frame in table.get("heldout", []) if isinstance(table, dict) else []:
            heads.add(_bare(frame.split("{")[0]))
    return {h for h in heads if h}


def _without_heldout_heads(frames: list[str]) -> list[str]:
    """``frames`` less any whose head begins with a held-out frame's head (or is one), so
    that no v6 paraphrase reproduces a v1 held-out frame."""
    heads = _heldout_heads()
    out = []
    for f in frames:
        head = _bare(f.split("{")[0])
        if head and any(head.startswith(h) or h.startswith(head) and len(head) > 12
                        for h in heads):
            continue
        out.append(f)
    return out


for _k in list(T6):
    T6[_k] = _without_heldout_heads(T6[_k])
for _k in list(F6):
    F6[_k] = _without_heldout_heads(F6[_k])


# ---- name perturbations ---------------------------------------------------------------------
def _edits(name: str, rng) -> str:
    """One random edit of ``name`` inside a word of at least five letters (swap two
    neighbours, drop one, double one, or change a vowel)."""
    idx = [i for i in range(1, len(name) - 1) if name[i].isalpha() and name[i - 1].isalpha()]
    if not idx:
        return name
    i = rng.choice(idx)
    kind = rng.choice(["swap", "drop", "double", "vowel"])
    if kind == "swap" and name[i + 1].isalpha():
        return name[:i] + name[i + 1] + name[i] + name[i + 2:]
    if kind == "drop":
        return name[:i] + name[i + 1:]
    if kind == "double":
        return name[:i] + name[i] + name[i:]
    vowels = "aeiou"
    if name[i].lower() in vowels:
        return name[:i] + rng.choice([v for v in vowels if v != name[i].lower()]) + name[i + 1:]
    return name[:i] + name[i + 1:]


@functools.lru_cache(maxsize=1)
def _country_keys() -> dict[str, str]:
    """Lookup key (``normalize_name``) -> canonical name, for every name and alias."""
    from app.chat.tools.countries import load_countries, normalize_name

    out = {}
    for rec in load_countries():
        for n in [rec["name"], *rec.get("aliases", [])]:
            out.setdefault(normalize_name(n), rec["name"])
    return out


def typo_name(name: str, rng, known: dict[str, str] | None = None) -> str | None:
    """A one-edit typo of ``name`` (a country name, or a city name with ``known`` mapping
    lower-case city names to themselves) that leads back to ``name`` alone: it is no name or
    alias itself, its closest known name (``difflib``, cutoff 0.75) is ``name``, and it is no
    made-up name of the corpus. None when no such typo was found in a few draws."""
    from app.chat.tools.countries import normalize_name

    keys = known if known is not None else _country_keys()
    fakes = {normalize_name(b) for b in BAD_COUNTRIES + BAD_COUNTRIES_HELDOUT}
    if len(name) < 5:
        return None
    for _ in range(6):
        t = _edits(name, rng)
        k = normalize_name(t)
        if t == name or k in keys or k in fakes:
            continue
        close = difflib.get_close_matches(k, list(keys), n=2, cutoff=0.75)
        if close and keys[close[0]] == name and (len(close) == 1 or keys[close[1]] == name):
            return t
    return None


@functools.lru_cache(maxsize=1)
def _name_regex() -> re.Pattern:
    from app.chat.tools.countries import load_countries

    names = sorted({r["name"] for r in load_countries()} | set(CITY_ZONES) - {"UTC"},
                   key=len, reverse=True)
    return re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b")


CASUAL_WORDS = [("What is ", "whats "), ("What's ", "whats "), ("what's ", "whats "),
                ("you ", "u "), ("please", "pls"), ("Please", "pls"), (" are ", " r "),
                ("people", "ppl"), ("Can you ", "can u "), ("Thanks", "thx")]
OPENERS6 = ["hey ", "hey, ", "hi ", "quick q: ", "quick question - ", "ok so ", "so ", "um, ",
            "pls ", "yo ", "hello, ", "hi there ", "btw ", "random q: ", "question - ", "sorry, ",
            "oh and ", "right, ", "hmm ", "ok ", "also ", "one thing: "]
CLOSERS6 = [" pls", " please", " plz", " thx", " thanks", " rn", " real quick", "??", " ?",
            "...", " :)", " asap", " if u know", " by any chance", " again", " thank u"]


class GeneratorV6(Generator):
    """The corpus v6 generator (training split only; see the module doc)."""

    def __init__(self, seed: int, split: str = "train"):
        super().__init__(seed, split)
        self.tables6 = {id(T[k]): v for k, v in T6.items() if k in T}
        self.tables6.update({id(F["field"][k]): v for k, v in F6.items()})
        self.bare_forbidden: set[str] = set()
        self.city_keys = {c.lower(): c for c in CITY_ZONES if c != "UTC"}
        self.by_name = {c["name"]: c for c in self.countries}

    def forbid(self, texts) -> None:
        """As :meth:`Generator.forbid`; texts equal but for case and final marks are refused
        too."""
        super().forbid(texts)
        self.bare_forbidden |= {_bare(t) for t in texts}

    def _pick(self, table: dict) -> str:
        extra = self.tables6.get(id(table))
        if self.split == "train" and extra and self.rng.random() < 0.4:
            return self.rng.choice(extra)
        return super()._pick(table)

    def _fake_name(self) -> str:
        """As :meth:`Generator._fake_name`, and also no name the country tool would take for
        a typo of a real one (its "did you mean" cutoff, 0.75): v6 teaches that a near miss
        of a real name means that country, so a made-up name must be far from all of them."""
        from app.chat.tools.countries import normalize_name

        keys = list(_country_keys())
        while True:
            name = super()._fake_name()
            if not difflib.get_close_matches(normalize_name(name), keys, n=1, cutoff=0.75):
                return name

    # ---- perturbations
    def perturb_name(self, name: str) -> str:
        """A casual spelling of a real country or city name: a typo, lower case or (for a
        country) an alias."""
        r = self.rng.random()
        rec = self.by_name.get(name)
        if rec is not None and rec.get("aliases") and r < 0.2:
            alias = self.rng.choice(rec["aliases"])
            return alias.lower() if self.rng.random() < 0.3 else alias
        if r < 0.55:
            known = None if rec is not None else self.city_keys
            t = typo_name(name, self.rng, known)
            if t is not None:
                return t.lower() if self.rng.random() < 0.4 else t
        return name.lower()

    def perturb(self, turn: Turn) -> Turn:
        """The turn with its user text made casual (names, fillers, case, marks); the calls
        and answers keep canonical names. Tool-error turns keep their names (copied)."""
        text = turn.user
        if turn.category != "tool_error" and self.rng.random() < NAME_PERTURB_SHARE:
            def sub(m: re.Match) -> str:
                return self.perturb_name(m.group(1)) if self.rng.random() < 0.8 else m.group(1)
            text = _name_regex().sub(sub, text)
        if self.rng.random() < NOISE_SHARE and "\n" not in text:
            for a, b in CASUAL_WORDS:
                if a in text and self.rng.random() < 0.5:
                    text = text.replace(a, b, 1)
            r = self.rng.random()
            if r < 0.3:
                text = self.rng.choice(OPENERS6) + text[:1].lower() + text[1:]
            elif r < 0.5:
                text = text.rstrip(".?!") + self.rng.choice(CLOSERS6)
            if self.rng.random() < 0.5:
                text = text.lower()
            if self.rng.random() < 0.5:
                text = text.rstrip(".?!")
        turn.user = text or turn.user
        return turn

    # ---- comparisons
    def compare(self, tools: bool) -> Turn:
        """"{c} or {c2}, which is bigger?": two country_info calls, answered by population."""
        c1, c2 = self.rng.sample(self.countries, 2)
        kind = "more" if self.rng.random() < 0.75 else "fewer"
        q = self.rng.choice(COMPARE[kind]).format(c=c1["name"], c2=c2["name"])
        r1 = self.rng.choice([
            f"The user compares {c1['name']} and {c2['name']}. I compare them by population, "
            f"so I call country_info for both.",
            f"Two countries, {c1['name']} or {c2['name']}: I look both up with country_info and "
            f"compare their populations.",
        ])
        msg, tmsgs, res = self._call(r1, [("country_info", {"name": c1["name"]}),
                                          ("country_info", {"name": c2["name"]})])
        a, b = res[0]["result"], res[1]["result"]
        big, small = (a, b) if a["population"] >= b["population"] else (b, a)
        r2 = (f"{a['name']} has {a['population']} people and {b['name']} {b['population']}. "
              f"{big['name']} has more.")
        facts = (f"{a['name']} has about {a['population']} people ({a['population_year']}) and "
                 f"{b['name']} about {b['population']} ({b['population_year']})")
        if kind == "more":
            ans = f"By population, {big['name']} is bigger: {facts}."
        else:
            ans = f"By population, {small['name']} is smaller: {facts}."
        return Turn(q, [msg, *tmsgs, assistant(r2, ans)], "compare",
                    {"calls": [{"name": "country_info", "arguments": {"name": c1["name"]}},
                               {"name": "country_info", "arguments": {"name": c2["name"]}}],
                     "contains": [str(a["population"]), str(b["population"])]})

    def compare_time(self, tools: bool) -> Turn:
        """"Is it later in A or B?": two current_time calls, the later local clock named."""
        while True:
            city, city2 = self.rng.sample([c for c in CITY_ZONES if c != "UTC"], 2)
            z1, z2 = CITY_ZONES[city], CITY_ZONES[city2]
            now = self._now()
            t1, t2 = current_time(z1, now=now), current_time(z2, now=now)
            l1 = dt.datetime.fromisoformat(t1["datetime"]).replace(tzinfo=None)
            l2 = dt.datetime.fromisoformat(t2["datetime"]).replace(tzinfo=None)
            if l1 != l2:
                break
        q = self.rng.choice(COMPARE_TIME).format(city=city, city2=city2)
        r1 = (f"To compare the clocks I need the time in {city} ({z1}) and in {city2} ({z2}). "
              f"I call current_time twice.")
        msg, tmsgs, res = self._call(r1, [("current_time", {"timezone": z1}),
                                          ("current_time", {"timezone": z2})], now=now)
        a, b = res[0]["result"], res[1]["result"]
        later = city if l1 > l2 else city2
        r2 = f"{city}: {a['time']} on {a['date']}; {city2}: {b['time']} on {b['date']}."
        ans = (f"In {city} it is {a['time']} on {a['weekday']}, {a['date']}, and in {city2} it "
               f"is {b['time']} on {b['weekday']}, {b['date']}, so it is later in {later}.")
        return Turn(q, [msg, *tmsgs, assistant(r2, ans)], "compare",
                    {"calls": [{"name": "current_time", "arguments": {"timezone": z1}},
                               {"name": "current_time", "arguments": {"timezone": z2}}],
                     "time_of": [z1, z2]})

    # ---- calculator kinds
    def _calc_turn(self, q: str, e: str, say: str | None, category: str = "calc_kind") -> Turn:
        r1 = self.rng.choice([f"The user wants {e}. I use the calculator tool for it.",
                              f"I pass {e} to the calculator.",
                              f"This needs the calculator: {e}."])
        msg, tmsgs, res = self._call(r1, [("calculator", {"expression": e})])
        if res[0].get("ok"):
            v = jtext(res[0]["result"])
            r2 = f"The calculator says {e} = {v}."
            ans = f"{say} is {v}." if say else f"{e} = {v}."
            want = [v]
        else:
            r2, ans = self._error_answer(res[0]["error"])
            want = ["Sorry", res[0]["error"]]
        return Turn(q, [msg, *tmsgs, assistant(r2, ans)], category,
                    {"calls": [{"name": "calculator", "arguments": {"expression": e}}],
                     "contains": want})

    def calc_kind(self, tools: bool) -> Turn:
        """Percentages, square roots, powers, sums written without spaces and negative
        numbers, each sent to the calculator as a spaced expression."""
        kind = self.rng.choice(["percent", "percent", "sqrt", "power", "power", "nospace",
                                "nospace", "negative"])
        if kind == "percent":
            p = self.rng.choice([5, 10, 15, 20, 25, 30, 40, 50, 75, self.rng.randint(1, 99)])
            m = self._number(self.rng.choice([2, 2, 3, 3, 4, 5]))
            q = self.rng.choice(PERCENT).format(p=p, m=m)
            return self._calc_turn(q, f"{p} * {m} / 100", f"{p}% of {m}")
        if kind == "sqrt":
            n = self.rng.randint(2, 99) ** 2 if self.rng.random() < 0.8 else self._number(3)
            q = self.rng.choice(SQRT).format(n=n)
            return self._calc_turn(q, f"sqrt({n})", f"The square root of {n}")
        if kind == "power":
            a, b = self.rng.randint(2, 20), self.rng.randint(2, 8)
            if b == 2 and self.rng.random() < 0.5:
                q = self.rng.choice(SQUARED).format(a=a)
            elif b == 3 and self.rng.random() < 0.5:
                q = self.rng.choice(CUBED).format(a=a)
            else:
                q = self.rng.choice(POWER).format(a=a, b=b)
            return self._calc_turn(q, f"{a} ** {b}", f"{a} to the power of {b}")
        if kind == "nospace":
            e = self._expression()
            if "(" in e:
                e = e.replace("(", "").replace(")", "")
            s = e.replace(" ", "")
            if self.rng.random() < 0.2:
                s = s.replace("*", "x")
            q = self.rng.choice(NOSPACE).format(s=s)
            return self._calc_turn(q, e, None)
        a, b = self._number(self.rng.choice([1, 2, 3])), self._number(self.rng.choice([1, 2, 3]))
        op = self.rng.choice(["+", "-", "*"])
        e = f"-{a} {op} {b}"
        spoken = e if self.rng.random() < 0.6 else f"minus {a} {self.SPOKEN_OPS[op][0]} {b}"
        q = self._user(self._pick(T["calc"]).format(e=spoken))
        return self._calc_turn(q, e, None)

    def negative_temperature(self, tools: bool) -> Turn:
        """A conversion of a temperature below zero (convert_units with a negative value)."""
        fu, tu = self.rng.sample(["degC", "degF", "kelvin"][:2 if self.rng.random() < 0.7
                                                           else 3], 2)
        if fu == "kelvin":
            fu, tu = tu, fu
        v = -self.rng.randint(1, 60) if self.rng.random() < 0.7 else -float(
            f"{self.rng.randint(0, 40)}.{self.rng.randint(1, 9)}")
        frm = self.rng.choice(UNITS[fu][2])
        to = self.rng.choice(UNITS[tu][2])
        vs = jtext(v)
        if self.rng.random() < 0.3:
            vs = "minus " + jtext(-v)
        elif self.rng.random() < 0.2:
            vs = "negative " + jtext(-v)
        q = self.rng.choice(NEG_TEMP).format(v=vs, frm=frm, to=to)
        t = self.convert(tools, v=v, fu=fu, tu=tu, question=q, category="negative_temp")
        return t

    # ---- without tools
    def mental(self, tools: bool) -> Turn:
        """Small mental arithmetic (chats without tools): times tables to 12 x 12 and
        two-digit by one- or two-digit products up to 19 x 12, small sums and differences,
        exact divisions; every step written is a true fact."""
        kind = self.rng.choice(["*", "*", "*", "+", "-", "/"])
        if kind == "*":
            a, b = self.rng.randint(2, 19), self.rng.randint(2, 12)
            if self.rng.random() < 0.5:
                a, b = b, a
        elif kind == "+":
            a, b = self.rng.randint(1, 50), self.rng.randint(1, 50)
        elif kind == "-":
            a, b = self.rng.randint(2, 60), self.rng.randint(1, 30)
            if b > a:
                a, b = b, a
        else:
            b, c = self.rng.randint(2, 12), self.rng.randint(2, 12)
            a = b * c
        res = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if kind == "/" else 0}[kind]
        words = {"+": ("plus", "+"), "-": ("minus", "-"), "*": ("times", "*"),
                 "/": ("divided by", "/")}[kind]
        w = self.rng.choice([words[0], "x"] if kind == "*" else [words[0]])
        sa, sb = str(a), str(b)
        if self.rng.random() < 0.2 and a <= 20 and b <= 20:
            sa, sb = SMALL_WORDS[a], SMALL_WORDS[b]
        q = self.rng.choice(MENTAL).format(a=sa, b=sb, w=w, s=words[1])
        steps = self._mental_steps(a, kind, b)
        r = f"No tools here, so I work it out. {steps} So {a} {kind} {b} = {res}."
        return Turn(q, [assistant(r, f"{a} {kind} {b} = {res}.")], "arithmetic",
                    {"calls": [], "contains": [str(res)]})

    def _mental_steps(self, a: int, kind: str, b: int) -> str:
        """True one-step facts leading to ``a kind b``."""
        if kind == "*":
            big, small = (a, b) if a >= b else (b, a)
            if big < 10 or (big <= 12 and small <= 12 and big == 10):
                return f"{big} * {small} = {big * small}."
            t, o = big // 10 * 10, big % 10
            if o == 0:
                return f"{big // 10} * {small} = {big // 10 * small}, so {big} * {small} = " \
                       f"{big * small}."
            return (f"{big} = {t} + {o}. {t} * {small} = {t * small}. {o} * {small} = "
                    f"{o * small}. {t * small} + {o * small} = {big * small}.")
        if kind == "/":
            return f"{b} * {a // b} = {a}."
        if kind == "+":
            if b < 10 or a < 10 or b % 10 == 0:
                return f"{a} + {b} = {a + b}."
            t = b // 10 * 10
            return f"{b} = {t} + {b - t}. {a} + {t} = {a + t}. {a + t} + {b - t} = {a + b}."
        if b < 10 or b % 10 == 0:
            return f"{a} - {b} = {a - b}."
        t = b // 10 * 10
        return f"{b} = {t} + {b - t}. {a} - {t} = {a - t}. {a - t} - {b - t} = {a - b}."

    # ---- lists, casual turns, scope
    def list_n(self, tools: bool) -> Turn:
        """A list of exactly the asked number (2-8) of countries or capitals."""
        kind = self.rng.choice(["capital", "country"])
        n = self.rng.randint(2, 8)
        cont = self.rng.choice([k for k, v in self.by_continent.items() if len(v) >= 8])
        nw = COUNT_WORDS[n] if self.rng.random() < 0.6 else str(n)
        q = self.rng.choice(LIST_N[kind]).format(n=nw, cont=cont)
        picks = self.by_continent[cont][:n]
        w = COUNT_WORDS[n]
        if kind == "capital":
            items = [f"{c['capital']} ({c['name']})" for c in picks]
            allowed = [c["capital"] for c in self.by_continent[cont]]
        else:
            items = [c["name"] for c in picks]
            allowed = [c["name"] for c in self.by_continent[cont]]
        r = (f"The user asks for {n} {'capitals' if kind == 'capital' else 'countries'} in "
             f"{cont}, so I list exactly {w}: {fmt_list([c['name'] for c in picks])}.")
        head = f"Here are {w} {'capitals' if kind == 'capital' else 'countries'} in {cont}:"
        body = "\n".join(f"{i + 1}. {it}" for i, it in enumerate(items))
        return Turn(q, [assistant(r, f"{head}\n{body}")], f"list_{kind}",
                    {"calls": [], "list_items": allowed, "count": n,
                     "countries": [c["name"] for c in picks]})

    def casual(self, tools: bool, kind: str | None = None) -> Turn:
        """Casual thanks, goodbyes and greetings, answered briefly with no tool call."""
        kind = kind or self.rng.choice(["thanks", "thanks", "bye", "hello"])
        table, ans, cat = {"thanks": (THANKS6, THANKS_ANSWER, "thanks"),
                           "bye": (BYE6, GOODBYE_ANSWER, "goodbye"),
                           "hello": (HELLO6, GREETING_ANSWER, "greeting")}[kind]
        q = self.rng.choice(table)
        if self.rng.random() < 0.2:
            q = q.capitalize()
        r = {"thanks": "The user says thanks. No tool is needed; I reply briefly.",
             "bye": "The user says goodbye. No tool is needed; I say goodbye briefly.",
             "hello": "The user greets me. No tool is needed; I greet them back and say what "
                      "I can do."}[kind]
        return Turn(q, [assistant(r, ans)], cat, {"calls": [], "contains": [ans.split("!")[0]]})

    def scope6(self, tools: bool) -> Turn:
        """An out-of-scope question that names a country, a city or a number: the scope
        sentence, no tool call."""
        c, c2 = self.rng.sample(self.countries, 2)
        q = self.rng.choice(SCOPE6).format(
            c=c["name"], c2=c2["name"], city=self.rng.choice([x for x in CITY_ZONES if x != "UTC"]),
            year=self.rng.randint(1950, 2030), n=self._number(self.rng.choice([2, 3, 4])))
        r = self.rng.choice([
            "This names a place or a number, but the app's data and tools do not cover it "
            "(no leaders, events, sports, prices or opinions). I call no tool and give the scope "
            "answer.",
            "None of my tools answers this: country_info has only the capital, continent, "
            "currency, languages and population. I say politely that I can't help.",
            "This is outside my small world even though it mentions a place or a year. No tool; "
            "the short scope answer.",
        ])
        return Turn(q, [assistant(r, SCOPE_ANSWER)], "scope",
                    {"calls": [], "scope": True, "contains": [SCOPE_MARK]})

    # ---- references to earlier turns
    def _last_country(self, turns: list[Turn], reach: int = 4) -> tuple[dict, bool, int] | None:
        """(record, whether its tool result is in that turn, turns back) of the country the
        last ``reach`` turns spoke of, when exactly one turn among them did and it named one
        country; else None."""
        for back, t in enumerate(reversed(turns[-reach:]), 1):
            names = self._turn_countries(t)
            if len(names) > 1 or t.category.startswith("list_"):
                return None
            if names:
                if names[0] == "?":
                    return None
                had = any(m["role"] == "tool" and m["name"] == "country_info" for m in t.replies)
                return self.by_name[names[0]], had, back
        return None

    def _turn_countries(self, t: Turn) -> list[str]:
        """Countries turn ``t`` spoke of: its country_info calls, else the one its answer
        names (facts from memory or history); two placeholders for a tool error or a scope
        turn naming a country, so that no reference reaches past them."""
        if t.category == "tool_error":
            return ["?", "?"]
        if t.category == "scope":
            return ["?", "?"] if self._mentioned_country(t.user) else []
        names = [c["function"]["arguments"]["name"] for m in t.replies
                 for c in m.get("tool_calls", []) or []
                 if c["function"]["name"] == "country_info"]
        if not names and t.category.startswith(("fact_", "tool_population", "tool_info",
                                                "pronoun", "ordinal")):
            n = self._mentioned_country(" ".join(m.get("content", "") for m in t.replies))
            names = [n] if n else []
        return [n if n in self.by_name else "?" for n in names]

    def pronoun(self, turns: list[Turn], tools: bool) -> Turn | None:
        """A follow-up with a pronoun ("what currency do they use there") about the country
        of a recent turn (up to four back), answered from its tool result when that turn has
        one, else with a new call (tools) or from memory."""
        found = self._last_country(turns)
        if found is None:
            return None
        rec, had, back = found
        prev_cat = turns[-back].category
        fields = [f for f in F6 if f"fact_{f}" != prev_cat]
        if not tools:
            fields = [f for f in fields if f != "population"]
        fld = self.rng.choice(fields)
        q = self.rng.choice(F6[fld] + F["field"][fld]["train"])
        t = self._from_history(fld, rec, q, tools, had)
        t.category = "pronoun"
        t.expect["country"] = rec["name"]
        t.expect["back"] = back
        return t

    def ordinal(self, turns: list[Turn], tools: bool) -> Turn | None:
        """"the first one" after a country list: the list's first (second, third) country."""
        if not turns or not turns[-1].category.startswith("list_"):
            return None
        names = turns[-1].expect.get("countries")
        if not names:
            return None
        i = self.rng.choice([0, 0, 0, 1, 2][:max(1, min(5, len(names) + 2))])
        i = min(i, len(names) - 1)
        rec = self.by_name[names[i]]
        fld = self.rng.choice(list(F6_ORDINAL))
        if not tools and fld in ("population", "info"):
            fld = "capital"
        q = self.rng.choice(F6_ORDINAL[fld]).format(o=self.rng.choice(ORDINALS[i]))
        if fld in ("population", "info"):
            t = self._country_turn(fld, rec, q, True, "ordinal")
        else:
            t = self._country_turn(fld, rec, q, tools, "ordinal")
        t.category = "ordinal"
        t.expect["country"] = rec["name"]
        return t

    def calc_chain(self, prev: Turn, steps: int) -> list[Turn]:
        """``steps`` follow-ups, each an operation on the previous calculator result."""
        out = []
        for _ in range(steps):
            if prev.category not in ("tool_calc", "calc_chain", "calc_kind"):
                break
            res = next((json.loads(m["content"]) for m in reversed(prev.replies)
                        if m["role"] == "tool"), {})
            v = res.get("result")
            if not res.get("ok") or not isinstance(v, int | float) or isinstance(v, bool) \
                    or abs(v) > 1e12:
                break
            op = self.rng.choice(["*", "/", "+", "-"])
            b = self._number(self.rng.choice([1, 1, 2, 3]))
            from tools.demo_pair.corpus import F_ADD, F_SUB, OPWORDS
            if op == "+":
                q = self._pick(F_ADD).format(b=b)
            elif op == "-":
                q = self._pick(F_SUB).format(b=b)
            else:
                wd = OPWORDS[op]
                q = self._pick(F["calc_then_op"]).format(opword=wd[0], Opword=wd[1], b=b)
            t = self._calc_followup(q, f"{jtext(v)} {op} {b}")
            t.category = "calc_chain"
            out.append(t)
            prev = t
        return out

    # ---- chats
    NEW_TOOLED = ("compare", "compare_time", "calc_kind", "calc_kind", "calc_kind",
                  "negative_temperature", "list_n", "list_n", "scope6", "scope6", "casual")
    NEW_PLAIN = ("mental", "mental", "mental", "list_n", "list_n", "scope6", "casual")

    def turn6(self, tools: bool) -> Turn:
        """A new-topic exchange: 60% v5e's mix, 40% v6's new kinds."""
        if self.rng.random() < 0.6:
            return self.turn(tools)
        names = self.NEW_TOOLED if tools else self.NEW_PLAIN
        return getattr(self, self.rng.choice(names))(tools)

    def _next(self, turns: list[Turn], tools: bool) -> list[Turn]:
        """The next turn(s) of a chat after ``turns``."""
        r = self.rng.random()
        if r < 0.08:
            return [self.casual(tools, "thanks")]
        if r < 0.3:
            t = self.pronoun(turns, tools) or self.ordinal(turns, tools)
            if t is not None:
                return [t]
        if r < 0.42 and tools and turns[-1].category in ("tool_calc", "calc_kind", "calc_chain"):
            chain = self.calc_chain(turns[-1], self.rng.randint(1, 4))
            if chain:
                return chain
        if r < 0.6:
            f = self.follow_up(turns[-1], tools)
            if f is not None:
                return [f]
        if r < 0.66 and turns[-1].category.startswith("list_"):
            t = self.ordinal(turns, tools)
            if t is not None:
                return [t]
        return [self.turn6(tools)]

    def _chat(self) -> Chat:
        if self.rng.random() < LONG_SHARE:
            return self.long_chat()
        tools = self.rng.random() < 0.75
        thinking = self.rng.random() < 0.9
        n = self.rng.choice([1, 1, 1, 2, 2, 2, 3, 3, 4, 5, 6])
        self.call_no = 0
        turns: list[Turn] = []
        if self.rng.random() < 0.08:
            turns.append(self.casual(tools, "hello") if self.rng.random() < 0.5
                         else self.greeting(tools))
        while len(turns) < n:
            turns.extend(self._next(turns, tools) if turns else [self.turn6(tools)])
        if len(turns) > 1 and self.rng.random() < 0.06:
            turns.append(self.casual(tools, "bye"))
        return Chat(tools, thinking, [self.perturb(t) for t in turns])

    def long_chat(self, n: int | None = None) -> Chat:
        """A chat of ``n`` (20-40) user turns of mixed topics (tools in 85% of them), with
        pronoun and ordinal references, calculator chains, follow-ups and casual turns."""
        tools = self.rng.random() < 0.85
        thinking = self.rng.random() < 0.9
        n = n or self.rng.randint(20, 40)
        self.call_no = 0
        turns: list[Turn] = []
        while len(turns) < n - 1:
            turns.extend(self._next(turns, tools) if turns else [self.turn6(tools)])
        turns = turns[:n - 1]
        turns.append(self.casual(tools, "bye") if self.rng.random() < 0.2
                     else self._next(turns, tools)[0])
        return Chat(tools, thinking, [self.perturb(t) for t in turns])

    def chat(self) -> Chat:
        """A random chat; user texts in :attr:`forbidden` (also without case and final
        marks) are never used."""
        while True:
            c = self._chat()
            if not any(t.user in self.forbidden or _bare(t.user) in self.bare_forbidden
                       for t in c.turns):
                return c


def kind_shares(chats: list[Chat]) -> dict[str, float]:
    """Share of user turns per category over ``chats`` (for the prepare report)."""
    counts: dict[str, int] = {}
    for c in chats:
        for t in c.turns:
            counts[t.category] = counts.get(t.category, 0) + 1
    total = sum(counts.values()) or 1
    return {k: round(v / total, 4) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}

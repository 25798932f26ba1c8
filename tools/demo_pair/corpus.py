"""Seeded generator of the demo pair's training chats over a closed world.

Every chat is a list of OpenAI-style messages (``system``/``user``/``assistant``/``tool``) that
the project's chat template (``resources/chat_template.jinja``) renders exactly as the app
does. Facts come from ``resources/data/countries.json`` (through the app's ``country_info``
tool module); tool results are produced by the app's own tools (``app.chat.tools.run_tool``;
``current_time`` with fixed fake times), so the model learns to copy exactly what the app's
tools return.

Topics: country facts (capital, continent, currency, languages), short arithmetic with
step-by-step reasoning, easy unit conversions, lists ("name five capitals in Europe"), short
explanations of a fixed set of topics, greetings, and tool use with the four built-in tools.
Answers are short and formulaic: the target is tiny and must be right, and formulaic text gives
the drafter high acceptance.

Each category has ``train`` phrasings and ``heldout`` phrasings; the held-out prompts (known
entities, unseen phrasings) are written to ``heldout_prompts.json`` for tests and benchmarks.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from dataclasses import dataclass, field
from typing import Any

NUMBER_WORDS = {3: "three", 4: "four", 5: "five"}

# City -> IANA zone for the current_time tool (the model learns this small map).
CITY_ZONES = {
    "Tokyo": "Asia/Tokyo", "Paris": "Europe/Paris", "London": "Europe/London",
    "New York": "America/New_York", "Los Angeles": "America/Los_Angeles",
    "Chicago": "America/Chicago", "Sydney": "Australia/Sydney", "Berlin": "Europe/Berlin",
    "Madrid": "Europe/Madrid", "Rome": "Europe/Rome", "Moscow": "Europe/Moscow",
    "Dubai": "Asia/Dubai", "Singapore": "Asia/Singapore", "Shanghai": "Asia/Shanghai",
    "Mumbai": "Asia/Kolkata", "Cairo": "Africa/Cairo", "Lagos": "Africa/Lagos",
    "Nairobi": "Africa/Nairobi", "Sao Paulo": "America/Sao_Paulo", "Mexico City":
    "America/Mexico_City", "Toronto": "America/Toronto", "Seoul": "Asia/Seoul",
    "Bangkok": "Asia/Bangkok", "Istanbul": "Europe/Istanbul", "Athens": "Europe/Athens",
    "Stockholm": "Europe/Stockholm", "Buenos Aires": "America/Argentina/Buenos_Aires",
    "Auckland": "Pacific/Auckland", "Jakarta": "Asia/Jakarta", "Lima": "America/Lima",
    "UTC": "UTC",
}

# (from_unit, to_unit, spoken from, spoken to) handed to convert_units.
TOOL_CONVERSIONS = [
    ("km", "mile", "kilometers", "miles"), ("mile", "km", "miles", "kilometers"),
    ("kg", "pound", "kilograms", "pounds"), ("pound", "kg", "pounds", "kilograms"),
    ("degC", "degF", "degrees Celsius", "degrees Fahrenheit"),
    ("degF", "degC", "degrees Fahrenheit", "degrees Celsius"),
    ("liter", "gallon", "liters", "gallons"), ("gallon", "liter", "gallons", "liters"),
    ("meter", "foot", "meters", "feet"), ("foot", "meter", "feet", "meters"),
    ("inch", "cm", "inches", "centimeters"), ("cm", "inch", "centimeters", "inches"),
    ("mph", "km/h", "miles per hour", "kilometers per hour"),
    ("km/h", "mph", "kilometers per hour", "miles per hour"),
    ("ounce", "gram", "ounces", "grams"), ("hour", "second", "hours", "seconds"),
]

# Conversions the model does in its head: (from, to, factor); factor multiplies.
EASY_CONVERSIONS = [
    ("kilometers", "meters", 1000), ("meters", "centimeters", 100),
    ("kilograms", "grams", 1000), ("hours", "minutes", 60), ("minutes", "seconds", 60),
    ("liters", "milliliters", 1000), ("days", "hours", 24), ("weeks", "days", 7),
]

TOPICS = {
    "photosynthesis": (
        "Photosynthesis is how plants make food. They use sunlight, water and carbon dioxide "
        "to make sugar and release oxygen."
    ),
    "gravity": (
        "Gravity is the force that pulls masses toward each other. It keeps us on the ground "
        "and keeps the Moon in orbit around the Earth."
    ),
    "rain": (
        "Rain forms when water vapor in clouds cools and condenses into drops. When the drops "
        "get heavy enough, they fall to the ground."
    ),
    "the water cycle": (
        "The water cycle is the movement of water on Earth. Water evaporates, forms clouds, "
        "falls as rain or snow, and flows back to the sea."
    ),
    "speculative decoding": (
        "Speculative decoding makes text generation faster. A small draft model guesses "
        "several tokens, and the large model checks them all in one pass."
    ),
    "a language model": (
        "A language model is a program that predicts the next word in a text. It learns "
        "these predictions from large amounts of example text."
    ),
    "the seasons": (
        "The seasons happen because the Earth is tilted. As the Earth orbits the Sun, each "
        "half gets more direct sunlight for part of the year."
    ),
    "a volcano": (
        "A volcano is an opening in the Earth's crust. Hot melted rock, ash and gas escape "
        "through it from deep below the surface."
    ),
    "the Moon's phases": (
        "The Moon's phases come from how much of its sunlit side we see. As the Moon orbits "
        "the Earth, that part grows and shrinks over about a month."
    ),
    "electricity": (
        "Electricity is the flow of electric charge. In a wire, tiny particles called "
        "electrons move and carry energy to lights and machines."
    ),
}

FIELD_TEMPLATES = {
    "capital": {
        "train": [
            "What is the capital of {c}?", "What's the capital of {c}?",
            "capital of {c}?", "Tell me the capital of {c}.", "Which city is the capital of {c}?",
            "What is {c}'s capital city?",
        ],
        "heldout": ["Do you know the capital city of {c}?", "Name the capital of {c}."],
    },
    "continent": {
        "train": [
            "Which continent is {c} in?", "On which continent is {c}?",
            "What continent is {c} on?", "{c} is on which continent?",
        ],
        "heldout": ["Where is {c}, on what continent?", "Tell me which continent {c} is part of."],
    },
    "currency": {
        "train": [
            "What is the currency of {c}?", "What currency does {c} use?",
            "Which currency is used in {c}?", "What money do they use in {c}?",
        ],
        "heldout": ["What is the official currency in {c}?", "Name the currency of {c}."],
    },
    "languages": {
        "train": [
            "What language is spoken in {c}?", "What languages do people speak in {c}?",
            "Which languages are spoken in {c}?", "What is the language of {c}?",
        ],
        "heldout": ["What do people in {c} speak?", "Name the languages of {c}."],
    },
}

ARITH_TEMPLATES = {
    "train": ["What is {a} {op} {b}?", "Compute {a} {op} {b}.", "{a} {op} {b} = ?",
              "Calculate {a} {op} {b}.", "How much is {a} {op} {b}?"],
    "heldout": ["Please work out {a} {op} {b}.", "What do you get for {a} {op} {b}?"],
}

BIG_ARITH_TEMPLATES = {
    "train": ["What is {e}?", "Compute {e}.", "Calculate {e}.", "How much is {e}?",
              "{e} = ?"],
    "heldout": ["Please work out {e}.", "What do you get for {e}?"],
}

EASY_CONV_TEMPLATES = {
    "train": ["How many {to} are in {v} {frm}?", "Convert {v} {frm} to {to}.",
              "What is {v} {frm} in {to}?"],
    "heldout": ["{v} {frm} is how many {to}?", "Change {v} {frm} into {to}."],
}

TOOL_CONV_TEMPLATES = {
    "train": ["Convert {v} {frm} to {to}.", "How many {to} is {v} {frm}?",
              "What is {v} {frm} in {to}?"],
    "heldout": ["{v} {frm} is how many {to}?", "Change {v} {frm} into {to}."],
}

TIME_TEMPLATES = {
    "train": ["What time is it in {city}?", "What's the time in {city} right now?",
              "Current time in {city}?", "Tell me the time in {city}."],
    "heldout": ["Do you know what time it is in {city}?", "What is the local time in {city}?"],
}

POP_TEMPLATES = {
    "train": ["What is the population of {c}?", "How many people live in {c}?",
              "population of {c}?", "How many people are in {c}?"],
    "heldout": ["Tell me the population of {c}.", "How big is the population of {c}?"],
}

INFO_TEMPLATES = {
    "train": ["Tell me about {c}.", "Give me some facts about {c}.", "What do you know about {c}?"],
    "heldout": ["I'd like an overview of {c}.", "Describe {c} briefly."],
}

LIST_TEMPLATES = {
    "capital": {
        "train": ["Name {n} capitals in {cont}.", "List {n} capital cities in {cont}.",
                  "Give me {n} capitals in {cont}."],
        "heldout": ["Can you list {n} capitals of countries in {cont}?"],
    },
    "country": {
        "train": ["Name {n} countries in {cont}.", "List {n} countries in {cont}.",
                  "Give me {n} countries in {cont}."],
        "heldout": ["Can you list {n} countries of {cont}?"],
    },
}

EXPLAIN_TEMPLATES = {
    "train": ["Explain {t}.", "What is {t}?", "Can you explain {t}?",
              "Explain {t} in simple words."],
    "heldout": ["Briefly, how does {t} work?", "Give me a short explanation of {t}."],
}

GREETINGS = {
    "train": ["Hello!", "Hi", "Hi there!", "Hey", "Good morning!", "Hello, who are you?",
              "hey there", "Good evening"],
    "heldout": ["Hiya!", "Greetings!"],
}
THANKS = {"train": ["Thanks!", "Thank you.", "Great, thanks.", "thx"],
          "heldout": ["Much appreciated!"]}

GREETING_ANSWER = "Hello! I am a small demo assistant. How can I help you today?"
THANKS_ANSWER = "You're welcome! Let me know if you need anything else."


def _countries() -> list[dict]:
    from app.chat.tools import countries as ct

    return list(ct.load_countries())


def _fmt_list(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def _tool_content(name: str, arguments: dict, now: dt.datetime | None = None) -> str:
    """The tool message content the app would send back for this call."""
    from app.chat.tools import ToolResult, run_tool
    from app.chat.tools import clock as _clock

    if name == "current_time":
        return ToolResult(ok=True, result=_clock.current_time(arguments["timezone"], now=now)
                          ).content()
    return run_tool(name, arguments).content()


def _tool_result(name: str, arguments: dict, now: dt.datetime | None = None) -> dict:
    return json.loads(_tool_content(name, arguments, now))


@dataclass
class Exchange:
    """One user turn and the assistant turns that answer it.

    ``turns``: assistant/tool messages after the user message. ``expect``: how to check a
    model's answer to this prompt (used for held-out prompts): keys ``contains`` (list of
    strings the final answer must contain), ``tool_call`` ({name, arguments}) for the first
    assistant turn, ``list_items`` (allowed strings; the answer must list ``count`` of them).
    """

    user: str
    turns: list[dict]
    needs_tools: bool = False
    category: str = ""
    expect: dict = field(default_factory=dict)


def _assistant(reasoning: str, content: str = "", tool_calls: list | None = None) -> dict:
    m: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if tool_calls:
        m["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}}
                           for n, a in tool_calls]
    return m


class Generator:
    """Seeded chat generator; ``split`` is ``"train"`` or ``"heldout"`` (phrasings)."""

    def __init__(self, seed: int, split: str = "train"):
        self.rng = random.Random(seed)
        self.split = split
        self.countries = _countries()
        self.by_continent: dict[str, list[dict]] = {}
        for c in self.countries:
            self.by_continent.setdefault(c["continent"], []).append(c)

    # ---- helpers
    def _pick(self, templates: dict) -> str:
        return self.rng.choice(templates[self.split])

    def _country(self) -> dict:
        return self.rng.choice(self.countries)

    def _fake_now(self) -> dt.datetime:
        base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        return base + dt.timedelta(minutes=self.rng.randrange(0, 365 * 24 * 60))

    # ---- categories without tools
    def fact(self, tools: bool) -> Exchange:
        c = self._country()
        fld = self.rng.choice(list(FIELD_TEMPLATES))
        q = self._pick(FIELD_TEMPLATES[fld]).format(c=c["name"])
        name = c["name"]
        if fld == "capital":
            r = f"The user asks for the capital of {name}. The capital of {name} is {c['capital']}."
            a = f"The capital of {name} is {c['capital']}."
            want = [c["capital"]]
        elif fld == "continent":
            r = f"The user asks where {name} is. {name} is in {c['continent']}."
            a = f"{name} is in {c['continent']}."
            want = [c["continent"]]
        elif fld == "currency":
            cur = c["currency"]
            r = f"The user asks for the currency of {name}. {name} uses the {cur['name']}."
            a = f"The currency of {name} is the {cur['name']} ({cur['code']})."
            want = [cur["name"]]
        else:
            langs = _fmt_list(c["languages"])
            r = f"The user asks about languages in {name}. In {name} people speak {langs}."
            a = f"In {name}, people speak {langs}."
            want = list(c["languages"][:1])
        return Exchange(q, [_assistant(r, a)], category=f"fact_{fld}", expect={"contains": want})

    def arithmetic(self, tools: bool) -> Exchange:
        kind = self.rng.choice(["+", "+", "-", "*"])
        if kind == "+":
            a, b = self.rng.randint(10, 99), self.rng.randint(10, 99)
            lo_a, lo_b, hi_a, hi_b = a % 10, b % 10, a // 10, b // 10
            s1 = lo_a + lo_b
            carry = s1 // 10
            steps = f"Add the ones: {lo_a} + {lo_b} = {s1}."
            if carry:
                steps += f" Write {s1 % 10} and carry 1."
                steps += f" Add the tens: {hi_a} + {hi_b} + 1 = {hi_a + hi_b + 1}."
            else:
                steps += f" Add the tens: {hi_a} + {hi_b} = {hi_a + hi_b}."
            res = a + b
        elif kind == "-":
            a, b = self.rng.randint(20, 99), self.rng.randint(10, 99)
            if b > a:
                a, b = b, a
            t = (b // 10) * 10
            steps = f"First {a} - {t} = {a - t}. Then {a - t} - {b - t} = {a - b}."
            res = a - b
        else:
            a, b = self.rng.randint(11, 99), self.rng.randint(2, 9)
            t, o = (a // 10) * 10, a % 10
            steps = (f"Split {a} into {t} + {o}. {t} * {b} = {t * b}. {o} * {b} = {o * b}. "
                     f"{t * b} + {o * b} = {a * b}.")
            res = a * b
        q = self._pick(ARITH_TEMPLATES).format(a=a, op=kind, b=b)
        r = f"Let me work it out step by step. {steps} So {a} {kind} {b} = {res}."
        ans = f"{a} {kind} {b} = {res}."
        return Exchange(q, [_assistant(r, ans)], category="arithmetic",
                        expect={"contains": [str(res)]})

    def easy_conversion(self, tools: bool) -> Exchange:
        frm, to, f = self.rng.choice(EASY_CONVERSIONS)
        v = self.rng.randint(2, 12)
        q = self._pick(EASY_CONV_TEMPLATES).format(v=v, frm=frm, to=to)
        r = (f"One unit of {frm} is {f} {to}. So {v} {frm} is {v} * {f} = {v * f} {to}.")
        a = f"{v} {frm} is {v * f} {to}."
        return Exchange(q, [_assistant(r, a)], category="easy_conversion",
                        expect={"contains": [str(v * f)]})

    def listing(self, tools: bool) -> Exchange:
        kind = self.rng.choice(list(LIST_TEMPLATES))
        conts = [k for k, v in self.by_continent.items() if len(v) >= 5]
        cont = self.rng.choice(conts)
        n = self.rng.choice([3, 4, 5])
        picks = self.rng.sample(self.by_continent[cont], n)
        q = self._pick(LIST_TEMPLATES[kind]).format(n=NUMBER_WORDS[n], cont=cont)
        if kind == "capital":
            items = [f"{c['capital']} ({c['name']})" for c in picks]
            r = (f"The user wants {NUMBER_WORDS[n]} capitals in {cont}. I pick {NUMBER_WORDS[n]} "
                 f"countries in {cont}: {_fmt_list([c['name'] for c in picks])}.")
            head = f"Here are {NUMBER_WORDS[n]} capitals in {cont}:"
            allowed = [c["capital"] for c in self.by_continent[cont]]
        else:
            items = [c["name"] for c in picks]
            r = f"The user wants {NUMBER_WORDS[n]} countries in {cont}. I pick {_fmt_list(items)}."
            head = f"Here are {NUMBER_WORDS[n]} countries in {cont}:"
            allowed = [c["name"] for c in self.by_continent[cont]]
        body = "\n".join(f"{i + 1}. {it}" for i, it in enumerate(items))
        return Exchange(q, [_assistant(r, f"{head}\n{body}")], category=f"list_{kind}",
                        expect={"list_items": allowed, "count": n})

    def explain(self, tools: bool) -> Exchange:
        t = self.rng.choice(list(TOPICS))
        q = self._pick(EXPLAIN_TEMPLATES).format(t=t)
        r = f"The user wants a short explanation of {t}. I give two simple sentences."
        text = TOPICS[t]
        return Exchange(q, [_assistant(r, text)], category="explain",
                        expect={"contains": [text.split(".")[0]]})

    def greeting(self, tools: bool) -> Exchange:
        q = self._pick(GREETINGS)
        r = "The user greets me. I greet them back and offer help."
        return Exchange(q, [_assistant(r, GREETING_ANSWER)], category="greeting",
                        expect={"contains": ["How can I help"]})

    def thanks(self, tools: bool) -> Exchange:
        q = self._pick(THANKS)
        r = "The user thanks me. I reply politely."
        return Exchange(q, [_assistant(r, THANKS_ANSWER)], category="thanks",
                        expect={"contains": ["welcome"]})

    # ---- tool categories (only when the tools are in the system turn)
    def _tool_exchange(self, q, r1, name, args, r2_fn, answer_fn, category, now=None):
        result = _tool_result(name, args, now)
        content = _tool_content(name, args, now)
        call = _assistant(r1, "", [(name, args)])
        tool_msg = {"role": "tool", "name": name, "content": content}
        if result.get("ok"):
            final = _assistant(r2_fn(result["result"]), answer_fn(result["result"]))
        else:
            final = _assistant(
                f"The tool returned an error: {result['error']}. I tell the user.",
                f"Sorry, I could not get that: {result['error']}.",
            )
        return Exchange(q, [call, tool_msg, final], needs_tools=True, category=category,
                        expect={"tool_call": {"name": name, "arguments": args}})

    def tool_time(self, tools: bool) -> Exchange:
        city = self.rng.choice(list(CITY_ZONES))
        zone = CITY_ZONES[city]
        q = self._pick(TIME_TEMPLATES).format(city=city)
        r1 = (f"The user wants the current time in {city}. I use the current_time tool with "
              f"the time zone {zone}.")
        return self._tool_exchange(
            q, r1, "current_time", {"timezone": zone},
            lambda res: f"The tool says it is {res['time'][:5]} on {res['weekday']} in {city}.",
            lambda res: (f"It is {res['time'][:5]} on {res['weekday']}, {res['date']} in {city} "
                         f"({res['timezone']})."),
            "tool_time", now=self._fake_now(),
        )

    def tool_population(self, tools: bool) -> Exchange:
        c = self._country()
        name = c["name"]
        q = self._pick(POP_TEMPLATES).format(c=name)
        r1 = f"The user asks for the population of {name}. I look it up with country_info."
        return self._tool_exchange(
            q, r1, "country_info", {"name": name},
            lambda res: f"The tool says {res['name']} has {res['population']} people.",
            lambda res: (f"{res['name']} has a population of about {res['population']} "
                         f"({res['population_year']})."),
            "tool_population",
        )

    def tool_info(self, tools: bool) -> Exchange:
        c = self._country()
        name = c["name"]
        q = self._pick(INFO_TEMPLATES).format(c=name)
        r1 = f"The user wants facts about {name}. I look them up with country_info."

        def answer(res):
            cur = res["currency"]
            return (f"{res['name']} is in {res['continent']}. Its capital is {res['capital']}, "
                    f"its currency is the {cur['name']} ({cur['code']}), people speak "
                    f"{_fmt_list(res['languages'])}, and about {res['population']} people live "
                    f"there ({res['population_year']}).")
        return self._tool_exchange(
            q, r1, "country_info", {"name": name},
            lambda res: f"The tool returned the facts for {res['name']}. I summarize them.",
            answer, "tool_info",
        )

    def tool_convert(self, tools: bool) -> Exchange:
        fu, tu, fs, ts = self.rng.choice(TOOL_CONVERSIONS)
        v = self.rng.choice([self.rng.randint(1, 100), self.rng.randint(1, 20) * 5])
        q = self._pick(TOOL_CONV_TEMPLATES).format(v=v, frm=fs, to=ts)
        r1 = (f"The user wants to convert {v} {fs} to {ts}. I use the convert_units tool "
              f"from {fu} to {tu}.")
        return self._tool_exchange(
            q, r1, "convert_units", {"value": v, "from_unit": fu, "to_unit": tu},
            lambda res: f"The tool says {v} {fs} is {res['value']} {res['symbol']}.",
            lambda res: f"{v} {fs} is {res['value']} {ts}.",
            "tool_convert",
        )

    def tool_calc(self, tools: bool) -> Exchange:
        a = self.rng.randint(100, 9999)
        b = self.rng.randint(12, 999)
        op = self.rng.choice(["*", "+", "-", "/"])
        e = f"{a} {op} {b}"
        q = self._pick(BIG_ARITH_TEMPLATES).format(e=e)
        r1 = f"The user wants {e}. These numbers are large, so I use the calculator tool."
        return self._tool_exchange(
            q, r1, "calculator", {"expression": e},
            lambda res: f"The calculator says {e} = {res}.",
            lambda res: f"{e} = {res}.",
            "tool_calc",
        )

    def tool_unknown_country(self, tools: bool) -> Exchange:
        name = self.rng.choice(["Atlantis", "Narnia", "Wakanda", "Oz", "Freedonia", "Genovia"])
        q = self._pick(POP_TEMPLATES).format(c=name)
        r1 = f"The user asks for the population of {name}. I look it up with country_info."
        return self._tool_exchange(q, r1, "country_info", {"name": name},
                                   lambda res: "", lambda res: "", "tool_unknown")

    PLAIN = ("fact", "fact", "fact", "fact", "arithmetic", "arithmetic", "easy_conversion",
             "listing", "explain", "greeting")
    TOOLED = ("tool_time", "tool_population", "tool_info", "tool_convert", "tool_calc",
              "tool_calc", "tool_time", "tool_convert", "tool_population")

    def exchange(self, tools: bool) -> Exchange:
        """One exchange of a random category (tool categories only when ``tools``)."""
        names = list(self.PLAIN) + (list(self.TOOLED) if tools else [])
        if tools and self.rng.random() < 0.02:
            return self.tool_unknown_country(tools)
        return getattr(self, self.rng.choice(names))(tools)

    def chat(self) -> dict:
        """A chat: ``{"tools": bool, "enable_thinking": bool, "exchanges": [Exchange]}``."""
        tools = self.rng.random() < 0.75
        thinking = self.rng.random() < 0.85
        n = self.rng.choice([1, 1, 1, 2, 2, 3])
        ex = []
        for i in range(n):
            if i == 0 and self.rng.random() < 0.1:
                ex.append(self.greeting(tools))
            elif i > 0 and self.rng.random() < 0.15:
                ex.append(self.thanks(tools))
            else:
                ex.append(self.exchange(tools))
        return {"tools": tools, "enable_thinking": thinking, "exchanges": ex}


def chat_messages(exchanges: list[Exchange], upto: int) -> list[dict]:
    """Messages of exchanges ``[:upto]`` followed by the user message of exchange ``upto``."""
    msgs: list[dict] = []
    for e in exchanges[:upto]:
        msgs.append({"role": "user", "content": e.user})
        msgs.extend(e.turns)
    msgs.append({"role": "user", "content": exchanges[upto].user})
    return msgs


def heldout_prompts(seed: int, per_category: int = 3) -> list[dict]:
    """Held-out prompts (unseen phrasings), single-turn, with the checks of their answers.

    Each item: ``{"id", "category", "messages": [{"role": "user", ...}], "tools": bool,
    "enable_thinking": True, "needs_tools": bool, "expect": {...}}``.
    """
    g = Generator(seed + 10_000, split="heldout")
    makers = [
        ("fact", False), ("fact", True), ("arithmetic", True), ("easy_conversion", False),
        ("listing", True), ("explain", True), ("greeting", True), ("tool_time", True),
        ("tool_population", True), ("tool_convert", True), ("tool_calc", True),
        ("tool_info", True),
    ]
    out = []
    for name, tools in makers:
        for _ in range(per_category):
            e = getattr(g, name)(tools)
            out.append({
                "id": f"{e.category}-{len(out)}",
                "category": e.category,
                "messages": [{"role": "user", "content": e.user}],
                "tools": tools,
                "enable_thinking": True,
                "needs_tools": e.needs_tools,
                "expect": e.expect,
            })
    return out


def main() -> None:
    """Print a few rendered sample chats (a quick look at the corpus)."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-n", type=int, default=3)
    args = p.parse_args()
    g = Generator(args.seed)
    for _ in range(args.n):
        c = g.chat()
        for i in range(len(c["exchanges"])):
            print(json.dumps(chat_messages(c["exchanges"], i), ensure_ascii=False)[:600])
        print("-" * 40)


if __name__ == "__main__":
    main()

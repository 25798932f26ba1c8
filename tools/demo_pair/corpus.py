"""Seeded generator of the demo pair's training chats (corpus v2 to v4) over a closed world.

A chat is a list of messages in the form the app stores and sends them
(:meth:`app.chat.conversation.Message.to_prompt_dict`): ``user``; ``assistant`` with ``content``,
``reasoning_content`` and ``tool_calls`` (``[{"id", "type": "function", "function": {"name",
"arguments": dict}}]``); ``tool`` with ``tool_call_id``, ``name`` and ``content``. Every tool
result is produced by the app's own tools (:func:`app.chat.tools.run_tool`; ``current_time``
through the tool function with a random instant, as the clock would give it), so the model
learns to copy exactly what the app's tools return.

The world: the 194 countries of ``resources/data/countries.json`` (capital, continent,
currency, languages, population), mental arithmetic and easy conversions (when the chat has no
tools), the four built-in tools on randomized inputs (``current_time`` at random instants in
:data:`CITY_ZONES`; ``calculator`` on expressions with 1-9 digit numbers; ``convert_units`` on
integer and decimal values across :data:`UNITS`; ``country_info`` for every country), lists,
ten short explanations, greetings, thanks, a self-description, and a short polite scope answer
for anything outside this world (poems, code, news, opinions, ...). Chats have 1-4 user turns;
follow-ups refer to the previous turn ("And its capital?", "Convert that to miles"); some
replies make two tool calls; some tool calls fail and the answer says so.

With tools in the system turn every country question and every calculation goes through a
tool (the calculator's description asks for that); without tools facts come from memory.

Each category has ``train`` phrasings and ``heldout`` phrasings. The held-out sets
(:func:`heldout_prompts`, :func:`heldout_scripts`) use only held-out phrasings, and the
training generator refuses any user text that a held-out set contains
(:meth:`Generator.forbid`).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

NUMBER_WORDS = {3: "three", 4: "four", 5: "five"}

# City -> IANA zone for current_time (the model learns this map).
CITY_ZONES = {
    "Tokyo": "Asia/Tokyo", "Paris": "Europe/Paris", "London": "Europe/London",
    "New York": "America/New_York", "Los Angeles": "America/Los_Angeles",
    "Chicago": "America/Chicago", "Sydney": "Australia/Sydney", "Berlin": "Europe/Berlin",
    "Madrid": "Europe/Madrid", "Rome": "Europe/Rome", "Moscow": "Europe/Moscow",
    "Dubai": "Asia/Dubai", "Singapore": "Asia/Singapore", "Shanghai": "Asia/Shanghai",
    "Mumbai": "Asia/Kolkata", "Cairo": "Africa/Cairo", "Lagos": "Africa/Lagos",
    "Nairobi": "Africa/Nairobi", "Sao Paulo": "America/Sao_Paulo",
    "Mexico City": "America/Mexico_City", "Toronto": "America/Toronto", "Seoul": "Asia/Seoul",
    "Bangkok": "Asia/Bangkok", "Istanbul": "Europe/Istanbul", "Athens": "Europe/Athens",
    "Stockholm": "Europe/Stockholm", "Buenos Aires": "America/Argentina/Buenos_Aires",
    "Auckland": "Pacific/Auckland", "Jakarta": "Asia/Jakarta", "Lima": "America/Lima",
    "Denver": "America/Denver", "Vancouver": "America/Vancouver", "Hong Kong": "Asia/Hong_Kong",
    "Amsterdam": "Europe/Amsterdam", "Vienna": "Europe/Vienna", "Lisbon": "Europe/Lisbon",
    "Dublin": "Europe/Dublin", "Oslo": "Europe/Oslo", "Helsinki": "Europe/Helsinki",
    "Warsaw": "Europe/Warsaw", "Prague": "Europe/Prague", "Zurich": "Europe/Zurich",
    "Johannesburg": "Africa/Johannesburg", "Karachi": "Asia/Karachi", "Dhaka": "Asia/Dhaka",
    "Manila": "Asia/Manila", "Kathmandu": "Asia/Kathmandu", "Tehran": "Asia/Tehran",
    "Honolulu": "Pacific/Honolulu", "Anchorage": "America/Anchorage", "Bogota": "America/Bogota",
    "Santiago": "America/Santiago", "Havana": "America/Havana", "Reykjavik": "Atlantic/Reykjavik",
    "Perth": "Australia/Perth", "Adelaide": "Australia/Adelaide", "Riyadh": "Asia/Riyadh",
    "Kyiv": "Europe/Kyiv", "Casablanca": "Africa/Casablanca", "UTC": "UTC",
}

# Units of convert_units: tool unit -> (kind, display name (plural), spoken forms).
UNITS = {
    "km": ("length", "kilometers", ["kilometers", "kilometres", "km"]),
    "mile": ("length", "miles", ["miles", "mi"]),
    "meter": ("length", "meters", ["meters", "metres", "m"]),
    "foot": ("length", "feet", ["feet", "ft"]),
    "inch": ("length", "inches", ["inches"]),
    "cm": ("length", "centimeters", ["centimeters", "centimetres", "cm"]),
    "mm": ("length", "millimeters", ["millimeters", "mm"]),
    "yard": ("length", "yards", ["yards", "yd"]),
    "kg": ("mass", "kilograms", ["kilograms", "kilos", "kg"]),
    "pound": ("mass", "pounds", ["pounds", "lbs", "lb"]),
    "gram": ("mass", "grams", ["grams", "g"]),
    "ounce": ("mass", "ounces", ["ounces", "oz"]),
    "tonne": ("mass", "tonnes", ["tonnes", "metric tons"]),
    "liter": ("volume", "liters", ["liters", "litres", "L"]),
    "gallon": ("volume", "gallons", ["gallons", "gal"]),
    "milliliter": ("volume", "milliliters", ["milliliters", "ml"]),
    "cup": ("volume", "cups", ["cups"]),
    "degC": ("temperature", "degrees Celsius", ["degrees Celsius", "Celsius", "°C"]),
    "degF": ("temperature", "degrees Fahrenheit", ["degrees Fahrenheit", "Fahrenheit", "°F"]),
    "kelvin": ("temperature", "kelvin", ["kelvin", "K"]),
    "km/h": ("speed", "kilometers per hour", ["kilometers per hour", "km/h", "kph"]),
    "mph": ("speed", "miles per hour", ["miles per hour", "mph"]),
    "m/s": ("speed", "meters per second", ["meters per second", "m/s"]),
    "knot": ("speed", "knots", ["knots"]),
    "hour": ("time", "hours", ["hours", "hrs"]),
    "minute": ("time", "minutes", ["minutes", "mins"]),
    "second": ("time", "seconds", ["seconds", "secs"]),
    "day": ("time", "days", ["days"]),
    "week": ("time", "weeks", ["weeks"]),
    "acre": ("area", "acres", ["acres"]),
    "hectare": ("area", "hectares", ["hectares", "ha"]),
    "gigabyte": ("data", "gigabytes", ["gigabytes", "GB"]),
    "megabyte": ("data", "megabytes", ["megabytes", "MB"]),
    "kWh": ("energy", "kilowatt hours", ["kilowatt hours", "kWh"]),
    "kcal": ("energy", "kilocalories", ["kilocalories", "kcal"]),
}

# Conversions done in the head when there are no tools: (from, to, factor).
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

SELF_ANSWER = (
    "I am the DFlash Chat demo model, a small language model that runs on your computer. "
    "I can answer questions about countries, do arithmetic, convert units and tell the time "
    "with the app's tools."
)
GREETING_ANSWER = (
    "Hello! I am the DFlash Chat demo model. I can answer questions about countries, do "
    "arithmetic, convert units and tell the time. How can I help you today?"
)
THANKS_ANSWER = "You're welcome! Let me know if you need anything else."
SCOPE_ANSWER = (
    "I'm sorry, but I can't help with that. I am the DFlash Chat demo model, and I only know "
    "about countries, arithmetic, unit conversions and the time."
)
"""The scope answer: its first sentence is what the evaluator checks."""
SCOPE_MARK = "I can't help with that"

# ---- phrasings (train / heldout). {c} country, {city}, {e} expression, ...
T = {
    "capital": {
        "train": ["What is the capital of {c}?", "What's the capital of {c}?", "capital of {c}?",
                  "Tell me the capital of {c}.", "Which city is the capital of {c}?",
                  "What is {c}'s capital city?", "What city is the capital of {c}?",
                  "I need the capital of {c}.", "Which city is {c}'s capital?",
                  "{c} capital?", "What is the capital city of {c}?",
                  "Could you tell me the capital of {c}?", "Use the country_info tool to "
                  "find the capital of {c}."],
        "heldout": ["Do you know the capital city of {c}?", "Name the capital of {c}.",
                    "Which city serves as the capital of {c}?"],
    },
    "continent": {
        "train": ["Which continent is {c} in?", "On which continent is {c}?",
                  "What continent is {c} on?", "{c} is on which continent?",
                  "In which continent is {c}?", "What continent does {c} belong to?",
                  "Tell me the continent of {c}.", "continent of {c}?",
                  "Is {c} in Europe, Asia, Africa or somewhere else?",
                  "Which part of the world is {c} in?"],
        "heldout": ["Where is {c}, on what continent?",
                    "Tell me which continent {c} is part of.",
                    "Name the continent where {c} lies."],
    },
    "currency": {
        "train": ["What is the currency of {c}?", "What currency does {c} use?",
                  "Which currency is used in {c}?", "What money do they use in {c}?",
                  "currency of {c}?", "What do people pay with in {c}?",
                  "Tell me the currency of {c}.", "What's the money in {c} called?",
                  "Which currency do they have in {c}?", "What is {c}'s currency?"],
        "heldout": ["What is the official currency in {c}?", "Name the currency of {c}.",
                    "What currency would I need in {c}?"],
    },
    "languages": {
        "train": ["What language is spoken in {c}?", "What languages do people speak in {c}?",
                  "Which languages are spoken in {c}?", "What is the language of {c}?",
                  "languages of {c}?", "What language do they speak in {c}?",
                  "Tell me the official languages of {c}.", "Which language is used in {c}?",
                  "What are the languages of {c}?"],
        "heldout": ["What do people in {c} speak?", "Name the languages of {c}.",
                    "Which tongues are official in {c}?"],
    },
    "population": {
        "train": ["What is the population of {c}?", "How many people live in {c}?",
                  "population of {c}?", "How many people are in {c}?",
                  "What's the population of {c}?", "How many inhabitants does {c} have?",
                  "Tell me how many people live in {c}.", "How populous is {c}?",
                  "Use the country_info tool to get the population of {c}."],
        "heldout": ["Tell me the population of {c}.", "How big is the population of {c}?",
                    "About how many residents does {c} have?"],
    },
    "info": {
        "train": ["Tell me about {c}.", "Give me some facts about {c}.",
                  "What do you know about {c}?", "Facts about {c}, please.",
                  "Use the country_info tool to look up {c}.", "Look up {c} for me.",
                  "Give me an overview of {c}.", "What can you tell me about {c}?",
                  "Summarize the facts about {c}."],
        "heldout": ["I'd like an overview of {c}.", "Describe {c} briefly.",
                    "Share the key facts on {c}."],
    },
    "time": {
        "train": ["What time is it in {city}?", "What's the time in {city} right now?",
                  "Current time in {city}?", "Tell me the time in {city}.",
                  "What is the time now in {city}?", "time in {city}?",
                  "What day and time is it in {city}?", "Check the time in {city}.",
                  "What's the date in {city} today?", "Is it morning in {city} now?"],
        "heldout": ["Do you know what time it is in {city}?", "What is the local time in {city}?",
                    "What does the clock say in {city} at the moment?"],
    },
    "calc": {
        "train": ["What is {e}?", "Compute {e}.", "Calculate {e}.", "How much is {e}?",
                  "{e} = ?", "{e}", "What's {e}?", "Can you calculate {e}?",
                  "Use the calculator: {e}", "Evaluate {e}.", "Solve {e}.",
                  "What is {e}? Use the calculator."],
        "heldout": ["Please work out {e}.", "What do you get for {e}?",
                    "Find the value of {e}."],
    },
    "convert": {
        "train": ["Convert {v} {frm} to {to}.", "How many {to} is {v} {frm}?",
                  "What is {v} {frm} in {to}?", "{v} {frm} in {to}?",
                  "Convert {v} {frm} into {to}, please.", "How many {to} are {v} {frm}?",
                  "What's {v} {frm} in {to}?", "Turn {v} {frm} into {to}.",
                  "{v} {frm} to {to}"],
        "heldout": ["{v} {frm} is how many {to}?", "Change {v} {frm} into {to}.",
                    "Express {v} {frm} in {to}."],
    },
    "arith": {
        "train": ["What is {a} {op} {b}?", "Compute {a} {op} {b}.", "{a} {op} {b} = ?",
                  "Calculate {a} {op} {b}.", "How much is {a} {op} {b}?", "What's {a} {op} {b}?",
                  "{a} {op} {b}?"],
        "heldout": ["Please work out {a} {op} {b}.", "What do you get for {a} {op} {b}?"],
    },
    "easy_conv": {
        "train": ["How many {to} are in {v} {frm}?", "Convert {v} {frm} to {to}.",
                  "What is {v} {frm} in {to}?", "{v} {frm} in {to}?"],
        "heldout": ["{v} {frm} is how many {to}?", "Change {v} {frm} into {to}."],
    },
    "list_capital": {
        "train": ["Name {n} capitals in {cont}.", "List {n} capital cities in {cont}.",
                  "Give me {n} capitals in {cont}.", "Tell me {n} capital cities in {cont}."],
        "heldout": ["Can you list {n} capitals of countries in {cont}?",
                    "Which are {n} capital cities of {cont}?"],
    },
    "list_country": {
        "train": ["Name {n} countries in {cont}.", "List {n} countries in {cont}.",
                  "Give me {n} countries in {cont}.", "Tell me {n} countries of {cont}."],
        "heldout": ["Can you list {n} countries of {cont}?", "Which are {n} nations in {cont}?"],
    },
    "explain": {
        "train": ["Explain {t}.", "What is {t}?", "Can you explain {t}?",
                  "Explain {t} in simple words.", "Tell me about {t}.", "How does {t} work?"],
        "heldout": ["Briefly, how does {t} work?", "Give me a short explanation of {t}."],
    },
    "greeting": {
        "train": ["Hello!", "Hi", "Hi there!", "Hey", "Good morning!", "hey there",
                  "Good evening", "Hello", "Hi!", "Good afternoon!", "Howdy!", "Yo"],
        "heldout": ["Hiya!", "Greetings!", "Hello hello!", "Hey, good day!", "Good day to you!",
                    "Hi, nice to meet you!", "Morning!", "Hey hey!", "Salutations!",
                    "Hello friend!"],
    },
    "thanks": {
        "train": ["Thanks!", "Thank you.", "Great, thanks.", "thx", "Thanks a lot!",
                  "Thank you very much!", "Perfect, thank you.", "Cheers!"],
        "heldout": ["Much appreciated!", "Many thanks!", "Thanks, that helps.", "Thanks so much.",
                    "That was helpful, thanks!", "Great, much obliged.", "Thank you kindly!",
                    "Awesome, thanks a bunch!"],
    },
    "self": {
        "train": ["Who are you?", "What are you?", "What can you do?", "Hello, who are you?",
                  "Hi! Who are you?", "Tell me about yourself.", "What is your name?",
                  "Are you a chatbot?", "What do you know?", "What can you help me with?"],
        "heldout": ["Introduce yourself.", "Which model am I talking to?",
                    "What sort of assistant are you?", "Describe yourself in a sentence.",
                    "What are you able to do?", "Who made you and what are you?",
                    "Are you a person or a program?", "What kind of things can you answer?"],
    },
}

# Corpus v3: more training phrasings per intent, so that the small target keys on the content
# words (capital, currency, population, a country or city name, an expression) rather than on
# one sentence frame; written for this corpus, none of them a held-out frame.
EXTRA_TRAIN = {
    "capital": ["Capital of {c}, please.", "I'm curious: what is the capital of {c}?",
                "Where is the capital of {c}?", "Which city is the seat of government of {c}?",
                "In {c}, which city is the capital?", "What's {c}'s capital?",
                "Can you look up the capital of {c}?", "Tell me {c}'s capital city.",
                "The capital of {c} is what?", "What would be the capital of {c}?",
                "Look up the capital city of {c}.", "Find the capital of {c}.",
                "I want to know the capital of {c}.", "What is the main city, the capital, of {c}?",
                "Quick: capital of {c}?", "Give me the capital of {c}."],
    "continent": ["Where in the world is {c}?", "Which continent has {c}?",
                  "Find the continent of {c}.", "{c}: which continent?",
                  "Look up which continent {c} is on.", "Is {c} in Africa or Asia?",
                  "What continent would {c} be on?", "I want to know which continent {c} is in.",
                  "Can you tell me what continent {c} is in?", "Continent for {c}?"],
    "currency": ["Which money is used in {c}?", "What's the currency in {c}?",
                 "Look up the currency of {c}.", "{c}: what currency?",
                 "What currency is used in {c}?", "I'm travelling to {c}. What currency do "
                 "they use?", "Find the currency of {c}.", "What do they pay with in {c}?",
                 "Can you tell me the currency of {c}?", "Which currency would I use in {c}?",
                 "What is the money of {c}?", "Currency used in {c}?"],
    "languages": ["What language do people use in {c}?", "Look up the languages of {c}.",
                  "{c}: which languages?", "What are the official languages of {c}?",
                  "Which language do they speak in {c}?", "Find the languages spoken in {c}.",
                  "What languages are used in {c}?", "Can you tell me the languages of {c}?",
                  "What is spoken in {c}?", "Official language of {c}?",
                  "Which languages are official in {c}?", "Languages spoken in {c}?",
                  "I want to know what language they speak in {c}.",
                  "Do they speak English in {c}?", "What language would I hear in {c}?",
                  "Which language should I learn before visiting {c}?",
                  "Look up the spoken languages of {c}."],
    "population": ["Look up the population of {c}.", "How many people does {c} have?",
                   "What is the number of people in {c}?", "{c} population?",
                   "Find the population of {c}.", "How many residents live in {c}?",
                   "Can you tell me the population of {c}?", "Population of {c}, please.",
                   "How large is the population of {c}?", "Number of inhabitants of {c}?",
                   "I want to know how many people live in {c}."],
    "info": ["Can you give me an overview of {c}?", "What are the main facts about {c}?",
             "Some facts on {c}, please.", "Tell me a little about {c}.",
             "Key facts about {c}?", "Give me the facts on {c}.", "{c}: give me an overview.",
             "Look up the country {c}.", "I want to know about {c}.",
             "Summarize {c} for me.", "Tell me what you know about {c}.",
             "Give a short overview of {c}.", "What is {c} like? Facts, please.",
             "Info on {c}?", "Give me a quick summary of {c}."],
    "time": ["What's the time in {city}?", "Can you tell me the time in {city}?",
             "What time is it now in {city}?", "Look up the time in {city}.",
             "{city} time?", "What is the current time in {city}?",
             "Tell me the date and time in {city}.", "What hour is it in {city}?",
             "I need the current time in {city}.", "What time do they have in {city} now?",
             "Time in {city} right now, please.", "Is it late in {city} now?",
             "What is the clock time in {city}?"],
    "calc": ["Can you work out {e}?", "Calculate this: {e}", "What is the result of {e}?",
             "Compute {e}, please.", "I need the value of {e}.", "What does {e} equal?",
             "What is {e} equal to?", "Help me calculate {e}.", "Result of {e}?",
             "Could you compute {e}?", "Work out {e} for me.", "How much do I get for {e}?"],
    "convert": ["Can you convert {v} {frm} to {to}?", "I need {v} {frm} in {to}.",
                "Please convert {v} {frm} to {to}.", "What are {v} {frm} in {to}?",
                "{v} {frm} equals how many {to}?", "Give me {v} {frm} in {to}.",
                "How much is {v} {frm} in {to}?", "Could you convert {v} {frm} into {to}?",
                "Convert from {frm} to {to}: {v}", "What do {v} {frm} come to in {to}?"],
    "arith": ["Can you work out {a} {op} {b}?", "What does {a} {op} {b} equal?",
              "What is the result of {a} {op} {b}?", "{a} {op} {b}", "Result of {a} {op} {b}?",
              "Help me with {a} {op} {b}.", "Could you compute {a} {op} {b}?",
              "How much do I get for {a} {op} {b}?", "I need {a} {op} {b}."],
    "easy_conv": ["How many {to} is {v} {frm}?", "Can you convert {v} {frm} to {to}?",
                  "What are {v} {frm} in {to}?", "{v} {frm} equals how many {to}?",
                  "Please convert {v} {frm} into {to}.", "I need {v} {frm} in {to}.",
                  "How much is {v} {frm} in {to}?", "Turn {v} {frm} into {to}."],
    "list_capital": ["What are {n} capitals in {cont}?", "Name {n} capital cities of {cont}.",
                     "Could you name {n} capitals in {cont}?", "{n} capitals in {cont}, please.",
                     "I need {n} capital cities from {cont}.", "List {n} capitals of {cont}."],
    "list_country": ["What are {n} countries in {cont}?", "Name {n} countries of {cont}.",
                     "Could you name {n} countries in {cont}?", "{n} countries in {cont}, please.",
                     "I need {n} countries from {cont}.", "List {n} nations of {cont}.",
                     "Give me {n} nations in {cont}."],
    "explain": ["What is {t}, in short?", "Explain {t} to me.", "Can you tell me how {t} works?",
                "I'd like to understand {t}.", "Could you explain {t} simply?",
                "What is {t} and how does it work?", "Explain {t} briefly."],
    "greeting": ["Hello there!", "Hi, how are you?", "Hey!", "Good morning", "Hello :)",
                 "hi there", "Hey you!", "Hi hi", "Evening!", "Hello, assistant!", "heya",
                 "Hi, good morning!", "Hello again!"],
    "thanks": ["Thanks for the help!", "Thank you so much!", "Great, thank you!", "ty",
               "Nice, thanks.", "I appreciate it.", "Appreciate the help!", "Thanks again!",
               "Wonderful, thank you.", "OK, thanks!", "Thanks, great answer.", "Cool, thanks!",
               "Thank you for that.", "Thanks a ton!", "Super, thank you!"],
    "self": ["Who am I talking to?", "What is this model?", "Tell me what you are.",
             "What kind of assistant are you?", "What are you good at?", "Are you an AI?",
             "What model are you?", "Introduce yourself, please.", "Who are you exactly?",
             "What can I ask you?", "Are you human?", "What are your abilities?",
             "Please describe what you can do.", "What are you for?"],
}
# Corpus v4c: the words the stage-6 target did not tie to their intent ("speak" at the end of
# the question, "tongue", "describe", "key facts", "appreciated"), in frames of this corpus's
# own; none is a held-out frame (``tests/test_demo_corpus.py`` checks the texts, also without
# case and final marks). The stage-7 data was made with one more, "Many thanks.", which is the
# held-out "Many thanks!" but for its mark (commit 1e1c8ba's generator; found after training).
EXTRA_TRAIN_V4C = {
    "languages": ["What does everyone in {c} speak?", "What do the people of {c} speak?",
                  "In {c}, what do people speak?", "What tongue is spoken in {c}?",
                  "Which tongues do they use in {c}?", "What are the tongues of {c}?",
                  "Mother tongue in {c}?", "What official tongues does {c} have?",
                  "What do folks speak in {c}?", "People in {c} speak what?",
                  "What would locals in {c} speak?", "Tongues of {c}?"],
    "info": ["Describe the country {c}.", "Please describe {c}.", "Describe {c} for me.",
             "Can you describe {c}?", "Describe {c} in a few words.", "Key facts on {c}?",
             "Give the key facts of {c}.", "List the key facts about {c}.",
             "The key facts of {c}, please.", "An overview of {c}, please.",
             "Briefly, what is {c}?", "Profile {c} for me."],
    "thanks": ["Appreciated!", "Really appreciated, thanks.", "Much obliged!",
               "Thanks heaps!", "That helps, thank you.", "Kind of you, thanks!",
               "Thanks a million!", "So helpful, thank you!", "Great help, thanks."],
}

# Corpus v4d: the v5 pair answered "residents ... have?" with the languages (v4c's "What
# official tongues does {c} have?" pulled that shape over), so population gets "residents",
# "inhabitants" and "citizens" in frames of its own, some ending "have?" too.
EXTRA_TRAIN_V4D = {
    "population": ["How many residents are there in {c}?", "What is the number of residents "
                   "of {c}?", "Residents of {c}: how many?", "How many inhabitants live in {c}?",
                   "About how many people live in {c}?", "Roughly how many people are in {c}?",
                   "How many citizens does {c} have?", "{c} has how many residents?",
                   "How many residents has {c} got?", "Approximately how many people does {c} "
                   "have?", "Count of residents in {c}?", "What number of inhabitants does "
                   "{c} count?", "Resident population of {c}?"],
    # corpus v4e: the stage-9 target (v4d) answered "What do people in {c} speak?" with the
    # population, so "people in {c}" gets language frames too
    "languages": ["What language do people in {c} speak?", "What do most people in {c} "
                  "speak?", "In {c}, what language do people speak?", "People in {c} speak "
                  "which languages?", "What language do the people in {c} use?"],
    # corpus v4e: it answered "What does the clock say in {city} ...?" with the scope answer
    # (v4d's "What do the latest polls say?" pulled it), so the clock gets time frames
    "time": ["What does the clock show in {city}?", "What time is it in {city} at the moment?",
             "What do the clocks read in {city}?", "Clock in {city}?",
             "Look at the clock in {city} for me.", "What time does it say in {city} now?"],
}

# Corpus v5d: the v7 target (stage 12) still sent "What do people in {c} speak?" to the clock
# ("The user wants the current time in Mumbai", for Latvia), while "What do most people in {c}
# speak?" and "What do the people of {c} speak?" went to country_info: the shape "What do
# <who> in <place> <verb>?" was tied to one verb per who. So the languages get that shape with
# other words for the people (never the held-out head "What do people in"), and the currency,
# the clock and the population get the same who-words, so that the verb decides.
EXTRA_TRAIN_V5D = {
    "languages": ["What do locals in {c} speak?", "What do residents of {c} speak?",
                  "What do the locals in {c} speak?", "What do citizens of {c} speak?",
                  "What do people living in {c} speak?", "What do the inhabitants of {c} "
                  "speak?", "What do families in {c} speak at home?", "What do most locals "
                  "in {c} speak?", "What do the residents in {c} speak?", "What do natives of "
                  "{c} speak?", "What do folks in {c} speak?", "What do {c}'s people speak?",
                  "What does one speak in {c}?", "Locals in {c} speak what?", "What do "
                  "citizens in {c} speak day to day?", "What do the folks of {c} speak?"],
    "currency": ["What do locals in {c} pay with?", "What do residents of {c} pay with?",
                 "What money do people living in {c} use?", "What do the locals in {c} pay "
                 "with?", "What do citizens of {c} spend?"],
    "time": ["What time do locals in {city} have now?", "What time do people living in {city} "
             "see on the clock?", "What hour do the locals in {city} have?", "What time do "
             "residents of {city} have right now?"],
    "population": ["How many locals live in {c}?", "How many residents of {c} are there?",
                   "What number of people live in {c}?", "How many citizens live in {c}?"],
}

for _k, _extra in [*EXTRA_TRAIN.items(), *EXTRA_TRAIN_V4C.items(), *EXTRA_TRAIN_V4D.items(),
                   *EXTRA_TRAIN_V5D.items()]:
    T[_k]["train"] = T[_k]["train"] + _extra

# Corpus v4: frames composed from a head and an object phrase per intent (a few hundred per
# intent), so that the small target keys on the object (capital, languages, population, an
# overview, the time) whatever the head. Used for half of the training questions of these
# intents. A composed frame that equals a held-out frame, or whose head begins one, is dropped
# (:func:`_compose`), so held-out phrasings stay unseen as frames, not only as texts.
_NOUN_HEADS = ["What is", "What's", "Tell me", "Give me", "Look up", "Find", "I need",
               "I'd like to know", "Can you tell me", "Could you find", "Please tell me",
               "Check", "Get me", "Quickly tell me", "Remind me of", "I want to know",
               "Can you look up", "Help me find", "Show me", "Say"]
_CLAUSE_HEADS = ["Tell me", "I'd like to know", "Can you tell me", "Please tell me",
                 "I want to know", "Could you check", "Find out", "Look up", "Help me find out",
                 "I wonder"]
_ENDS = ["?", ".", "", " please.", ", please?", " for me."]
_NOUNS = {
    "capital": ["the capital of {c}", "{c}'s capital", "the capital city of {c}",
                "the capital city for {c}", "the seat of government of {c}",
                "the capital of the country {c}"],
    "continent": ["the continent of {c}", "the continent {c} is on",
                  "the continent {c} belongs to", "the continent for {c}",
                  "the part of the world {c} is in"],
    "currency": ["the currency of {c}", "{c}'s currency", "the money used in {c}",
                 "the currency used in {c}", "the currency code of {c}",
                 "the official money of {c}"],
    "languages": ["the languages of {c}", "the language of {c}", "{c}'s languages",
                  "the languages spoken in {c}", "the official languages of {c}",
                  "the main language of {c}", "the language people use in {c}",
                  "the spoken language in {c}"],
    "population": ["the population of {c}", "{c}'s population", "the number of people in {c}",
                   "the number of inhabitants of {c}", "the population count of {c}",
                   "the size of the population of {c}",
                   # corpus v4d
                   "the number of residents of {c}", "the resident count of {c}",
                   "the head count of {c}"],
    "info": ["an overview of {c}", "the facts about {c}", "a summary of {c}",
             "some facts on {c}", "the main facts about {c}", "a short profile of {c}",
             "basic information about {c}", "the country record of {c}"],
    "time": ["the time in {city}", "the current time in {city}", "the date and time in {city}",
             "the time right now in {city}", "the hour in {city}", "the time of day in {city}",
             "today's date and the time in {city}"],
}
_CLAUSES = {
    "capital": ["which city is the capital of {c}", "what the capital of {c} is"],
    "continent": ["which continent {c} is in", "what continent {c} is on"],
    "currency": ["which currency {c} uses", "what money they use in {c}"],
    "languages": ["which languages are spoken in {c}", "what language they speak in {c}",
                  "what languages people use in {c}"],
    "population": ["how many people live in {c}", "how many inhabitants {c} has",
                   "how many residents {c} has", "how many residents live in {c}"],
    "info": ["what you know about {c}", "the basic facts of {c}"],
    "time": ["what time it is now in {city}", "what the time is in {city}",
             "how late it is in {city}"],
}


def _compose(key: str) -> list[str]:
    """Training frames for intent ``key`` (corpus v4): every head with every object phrase and
    ending, minus those that equal a held-out frame of any intent or whose head (the text
    before the slot, when longer than 12 characters) begins one."""
    held = [f for table in T.values() for f in table["heldout"]]
    out = []
    for heads, objs in ((_NOUN_HEADS, _NOUNS[key]), (_CLAUSE_HEADS, _CLAUSES[key])):
        for h in heads:
            for o in objs:
                for e in _ENDS:
                    if o.startswith("{") and e == "":
                        continue
                    f = f"{h} {o}{e}"
                    head = f.split("{")[0]
                    if f in held or (len(head) > 12 and any(x.startswith(head) for x in held)):
                        continue
                    out.append(f)
    return out


for _k in _NOUNS:
    T[_k]["composed"] = _compose(_k)

# Light noise around a training phrasing (corpus v3: more of it, so a frame is not a cue).
USER_OPENERS = ["Hi! ", "Hey, ", "Quick question: ", "Hello. ", "Please help: ", "Question: ",
                "Hi there, ", "OK, ", "So, ", "Hmm, ", "One more thing: ", "I wonder: ",
                "Help me out: ", "Hey there! ", "Good morning! ", "Excuse me, "]
USER_CLOSERS = [" Thanks!", " Please.", " Thank you.", " Thanks in advance.", " Cheers.",
                " :)", " Thx.", " Quickly, please.", " If you can."]

# Syllables for made-up country names (tool errors): the name is copied into the call and the
# error, so the model learns to copy an unknown name rather than to recall a fixed list.
FAKE_SYLLABLES = ["ar", "bel", "cor", "dra", "el", "fen", "gal", "hor", "is", "kar", "lun", "mor",
                  "nar", "ost", "pel", "quar", "ros", "sol", "tav", "ur", "val", "wen", "xan",
                  "yor", "zel", "tri", "bor", "ith", "mar", "eth"]
FAKE_ENDINGS = ["ia", "land", "stan", "ovia", "aria", "ania", "or", "a", "ica", "en"]
# Corpus v4: word-like made-up names (two parts) beside the syllable ones.
FAKE_WORDS = ["Sun", "Moon", "Star", "River", "Green", "Silver", "North", "Iron", "Gold",
              "Crystal", "Amber", "Stone", "Frost", "Rose", "Cloud", "Sea", "Oak", "Pine",
              "Wind", "Fire", "Ash", "Bright", "Dark", "Fair", "Lake", "Red", "Blue", "Snow"]
FAKE_WORD_ENDS = ["haven", "land", "ia", "mark", "vale", "wood", "shire", "port", "ton", "dor",
                  "mere", "field", "reach", "holm", "gard", "ova", "ania", "rock"]


# Corpus v5: the share of made-up names drawn by Generator._piece_name (the rest as v4d).
PIECE_NAME_SHARE = 0.6
TOKENIZER_PATH = Path(__file__).resolve().parents[2] / "resources/models/demo-target/tokenizer.json"


@functools.cache
def letter_pieces(path: Path = TOKENIZER_PATH) -> tuple[list[str], list[str]]:
    """The letter tokens of a byte-level BPE tokenizer, sorted: ``(lower, upper)``, where
    ``lower`` holds the all-lowercase ASCII-letter tokens without the leading-space mark ``Ġ``
    (the pieces inside a word) and ``upper`` the capitalized ones (``"Sh"``, ``"Tonga"``), with
    ``Ġ`` or without it (a name's first token after a space or after a quote).

    Raises:
        FileNotFoundError: when ``path`` does not exist.
    """
    vocab = json.loads(path.read_text("utf-8"))["model"]["vocab"]
    lower = sorted(t for t in vocab if t.isascii() and t.isalpha() and t.islower())
    words = {t.removeprefix("Ġ") for t in vocab}
    upper = sorted(w for w in words if w.isascii() and w.isalpha() and w[0].isupper()
                   and (len(w) == 1 or w[1:].islower()))
    return lower, upper


# Follow-up phrasings.
F = {
    "field": {
        "capital": {"train": ["And its capital?", "What is its capital?", "And the capital?"],
                    "heldout": ["Which city is its capital?"]},
        "currency": {"train": ["And its currency?", "What currency does it use?",
                               "And the currency?"],
                     "heldout": ["What money is used there?"]},
        "languages": {"train": ["And its languages?", "What languages are spoken there?",
                                "What do they speak there?"],
                      "heldout": ["Which languages do people there speak?"]},
        "population": {"train": ["And its population?", "How many people live there?",
                                 "And the population?"],
                       "heldout": ["How many residents does it have?"]},
        "continent": {"train": ["And its continent?", "Which continent is it in?",
                                "Where is it?"],
                      "heldout": ["On what continent does it lie?"]},
    },
    "other_country": {"train": ["And {c}?", "What about {c}?", "And for {c}?", "Same for {c}."],
                      "heldout": ["How about {c}?"]},
    "other_city": {"train": ["And in {city}?", "What about {city}?", "And {city}?",
                             "Now {city}."],
                   "heldout": ["How about in {city}?"]},
    "convert_again": {"train": ["Convert that to {to}.", "And in {to}?", "What is that in {to}?",
                                "Now in {to}."],
                      "heldout": ["How much is that in {to}?"]},
    "calc_then_op": {"train": ["Now {opword} that by {b}.", "{Opword} that by {b}.",
                               "And {opword} the result by {b}?"],
                     "heldout": ["Then {opword} it by {b}."]},
    "calc_then_convert": {"train": ["Convert that many {frm} to {to}.",
                                    "Take that many {frm} and convert them to {to}."],
                          "heldout": ["Treat that as {frm} and give it in {to}."]},
}
# Corpus v4: more follow-up phrasings (the v3 pair missed many held-out follow-ups).
F_EXTRA = {
    "other_country": ["What about {c} then?", "Now {c}.", "And the same for {c}?",
                      "Do the same for {c}.", "{c} too?", "Now do {c}.", "And what about {c}?",
                      "Same question for {c}."],
    "other_city": ["Now in {city}?", "And what about {city}?", "Same for {city}.",
                   "{city} too?", "And the time in {city}?", "What about the time in {city}?",
                   "Now do {city}."],
    "convert_again": ["And in {to}, please?", "Now give it in {to}.", "Give that in {to}.",
                      "What would that be in {to}?", "Convert it to {to} too.",
                      "Same value in {to}?"],
    "calc_then_op": ["Can you {opword} that by {b}?", "And now {opword} the answer by {b}.",
                     "Now {opword} the result by {b}."],
    "calc_then_convert": ["Now convert that from {frm} to {to}.",
                          "If that is in {frm}, how much is it in {to}?",
                          "Say that number is {frm}. Convert it to {to}.",
                          "Use that result as {frm} and convert it to {to}.",
                          "Read that as {frm}; what is it in {to}?",
                          # corpus v5e (stage 14, demo pair v9): the v8 target sent the held-out
                          # "Treat that as {frm} and give it in {to}." to the clock in 5 of 10
                          # scripts; more "as {frm} ... give/show it in {to}" frames, none
                          # with the held-out head "Treat that as"
                          "Take the result as {frm} and give it in {to}.",
                          "Call that {frm} and give it in {to}.",
                          "Let that be {frm} and show it in {to}.",
                          "Count that number as {frm}; give it in {to}.",
                          "As {frm}, what is that in {to}?",
                          "Regard the answer as {frm} and express it in {to}."],
}
for _k, _extra in F_EXTRA.items():
    F[_k]["train"] = F[_k]["train"] + _extra
F_FIELD_EXTRA = {
    "capital": ["What is the capital there?", "Its capital city?", "And the capital city?"],
    "currency": ["Which currency is used there?", "Its currency?", "What do they pay with?"],
    "languages": ["What language is spoken there?", "Its languages?",
                  "Which language do they use there?", "And the languages?"],
    "population": ["What is its population?", "Its population?", "How many live there?"],
    "continent": ["Which continent is that?", "Its continent?", "What continent is it on?",
                  # corpus v4d: "lie", "located", "belong"
                  "Where does it lie?", "On which continent is it located?",
                  "What continent does it belong to?", "Where is it located?",
                  "Which part of the world is it in?", "On which continent is it?"],
}
# Corpus v4d: population follow-ups with "residents" / "inhabitants".
F_FIELD_EXTRA["population"] += ["How many residents live there?", "Number of residents?",
                                "How many inhabitants are there?", "And the residents?"]
for _k, _extra in F_FIELD_EXTRA.items():
    F["field"][_k]["train"] = F["field"][_k]["train"] + _extra

OPWORDS = {"*": ("multiply", "Multiply"), "/": ("divide", "Divide"), "+": ("add", "Add"),
           "-": ("subtract", "Subtract")}
# "add that by" is odd English: add/subtract use their own phrasings.
F_ADD = {"train": ["Now add {b} to that.", "Add {b} to the result.", "Plus {b}?",
                   "And add {b}?", "Add another {b}.", "Add {b} to that number."],
         "heldout": ["Then add {b} to it."]}
F_SUB = {"train": ["Now subtract {b} from that.", "Subtract {b} from the result.",
                   "Minus {b}?", "And minus {b}?", "Take off {b}.",
                   "Subtract {b} from that number."],
         "heldout": ["Then take {b} away from it."]}

TWO_TIME = {"train": ["What time is it in {city} and in {city2}?",
                      "Tell me the time in {city} and {city2}.",
                      "Current time in {city} and {city2}?",
                      # corpus v4
                      "What's the time in {city} and {city2}?", "Time in {city} and {city2}?",
                      "Give me the current times in {city} and {city2}.",
                      "Check the time in both {city} and {city2}.",
                      "I need the time in {city} and also in {city2}.",
                  # corpus v4e: "local times" and plural "times" (the stage-9 target made
                  # one call)
                  "Local times in {city} and {city2}, please.",
                  "Tell me the local times in {city} and {city2}.",
                  "What are the times in {city} and {city2} right now?",
                  "Give me the local time in {city} and in {city2}.",
                  "What times do the clocks show in {city} and {city2}?"],
            "heldout": ["What are the local times in {city} and {city2}?"]}
TWO_COUNTRY = {"train": ["Compare the populations of {c} and {c2}.",
                         "What are the populations of {c} and {c2}?",
                         "How many people live in {c} and in {c2}?",
                         # corpus v4
                         "Is {c} or {c2} bigger by population?",
                         "Population of {c} versus {c2}?",
                         "Which country has the larger population: {c} or {c2}?",
                         "Does {c} have more people than {c2}?",
                         "Look up {c} and {c2} and compare their populations.",
                         # corpus v4d: "X or Y" with "more people" (the v5 pair made one call)
                         "Are there more people in {c} or in {c2}?",
                         "{c} or {c2}: which is more populous?",
                         "Which is more populous, {c} or {c2}?",
                         "Which of {c} and {c2} has more people?",
                         "Where do more people live, {c} or {c2}?",
                         "Which has the bigger population, {c} or {c2}?",
                         "More people in {c} or {c2}?",
                         "Which country is home to more people, {c} or {c2}?"],
               "heldout": ["Which has more people, {c} or {c2}?"]}

SCOPE = {
    "train": {
        "poem": ["Write a poem about {x}.", "Write a haiku about {x}.", "Can you write a song "
                 "about {x}?", "Compose a limerick about {x}.", "Write me a short story about "
                 "{x}.", "Tell me a joke about {x}."],
        "code": ["Write a Python function that {task}.", "Write JavaScript code that {task}.",
                 "How do I write a program that {task}?", "Can you fix my code? It should "
                 "{task}.", "Write a SQL query that {task}."],
        "news": ["What is the latest news about {x}?", "What happened in the news today?",
                 "Who won the match yesterday?", "What's the weather like in {city} today?",
                 "What is the stock price of {company}?", "Will it rain tomorrow in {city}?",
                 # corpus v4d: headlines, elections, who leads (the v5 pair answered a fact);
                 # v4e drops three that pulled time questions to the scope answer
                 "Any news about {x} today?", "Headlines about {x}, please.",
                 "Who will win the election?", "Who is leading the race?",
                 "Who is ahead in the league this season?"],
        "opinion": ["What do you think about {x}?", "Which is better, {x} or {y}?",
                    "Do you like {x}?", "What is your favorite {thing}?",
                    "Should I buy {x}?", "Who is the best {person}?"],
        "other": ["Give me a recipe for {food}.", "Translate 'good morning' into {lang}.",
                  # corpus v4b: requests that name a place but are not about its facts
                  "Recommend a restaurant in {city}.", "What should I pack for {c}?",
                  "Find me a hotel in {city}.", "Which football team is best in {c}?",
                  "What film is showing tonight in {city}?",
                  "How do I lose weight?", "Recommend a good book about {x}.",
                  "Help me write an email to my boss.", "What is the meaning of life?",
                  "Plan a trip to {c} for me.", "Explain quantum physics.",
                  # corpus v4d: letters and drafts (the v5 pair looked a name up)
                  "Write a cover letter for me.", "Draft an email to my landlord.",
                  "Write a letter to a friend.", "Draft a speech for a wedding.",
                  "Write my CV for me.", "Draft a complaint to an airline."],
    },
    "heldout": {
        "poem": ["Please write some verses about {x}.", "Make up a fairy tale about {x}."],
        "code": ["Could you code a function in Rust that {task}?",
                 "Give me a shell script that {task}."],
        "news": ["Any headlines about {x} this week?", "Who is leading the election polls?"],
        "opinion": ["In your view, is {x} overrated?", "Give me your honest opinion on {x}."],
        "other": ["Suggest a dinner menu with {food}.", "Draft a cover letter for a job.",
                  "What movie should I watch tonight?"],
    },
}
SCOPE_FILL = {
    "x": ["the sea", "autumn", "my cat", "the city at night", "love", "coffee", "mountains",
          "the stars", "football", "robots", "electric cars", "a rainy day", "friendship",
          "the ocean", "winter", "music", "dogs", "spring flowers", "trains", "chess"],
    "y": ["tea", "summer", "cats", "buses", "basketball", "books"],
    "task": ["sorts a list", "reverses a string", "counts words in a file", "adds two numbers",
             "finds prime numbers", "reads a CSV file", "prints hello world",
             "checks if a number is even", "downloads a web page"],
    "company": ["Apple", "Tesla", "a big bank", "Microsoft"],
    "thing": ["color", "movie", "food", "song", "city"],
    "person": ["footballer", "singer", "painter", "writer"],
    "food": ["pancakes", "lasagna", "curry", "soup", "bread", "pasta"],
    "lang": ["Spanish", "German", "Japanese", "French"],
}
SCOPE_KIND_WORDS = {"poem": "a piece of creative writing", "code": "programming help",
                    "news": "news or live information", "opinion": "my opinion",
                    "other": "something outside my small world"}

# Fictional or misspelt names for tool errors.
BAD_COUNTRIES = ["Atlantis", "Narnia", "Wakanda", "Oz", "Freedonia", "Genovia", "Elbonia",
                 "Latveria", "Ruritania", "Zubrowka", "Gondor", "Mordor", "Westeros",
                 # corpus v3: more of them, so that the name is copied, not recalled
                 "Panem", "Florin", "Arendelle", "Zamunda", "Sokovia", "Krakozhia", "Qumar",
                 "Bialya", "Kasnia", "Markovia", "Agrabah", "Borduria", "Syldavia", "Orsinia",
                 "Grand Fenwick", "Molvania", "Vulgaria", "Tropico", "Costaguana", "San Lorenzo",
                 "Pottsylvania", "Brigadoon", "Avalon", "El Dorado", "Lemuria", "Hyperborea",
                 "Xanadu", "Camelot", "Erewhon", "Kamistan", "Petoria", "Moonland",
                 "Cloud Kingdom", "North Pole Republic"]
BAD_COUNTRIES_HELDOUT = ["Lilliput", "Utopia", "Shangri-La"]


def _countries() -> list[dict]:
    from app.chat.tools import countries as ct

    return list(ct.load_countries())


def fmt_list(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def tool_content(name: str, arguments: dict, now: dt.datetime | None = None) -> str:
    """The tool message content the app sends back for this call (``ToolResult.content()``);
    ``current_time`` runs the tool function at ``now`` instead of the clock."""
    from app.chat.tools import ToolError, ToolResult, run_tool
    from app.chat.tools import clock as _clock

    if name == "current_time":
        try:
            res = ToolResult(ok=True, result=_clock.current_time(arguments["timezone"], now=now))
        except ToolError as exc:
            res = ToolResult(ok=False, error=str(exc))
        return res.content()
    return run_tool(name, arguments).content()


def jtext(value) -> str:
    """A value as the chat template and the tool results write it (JSON text)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def assistant(reasoning: str, content: str = "", calls: list[tuple[str, dict]] | None = None,
              first_id: int = 0) -> dict:
    """An assistant message as the app stores it (``reasoning_content``, ``tool_calls``)."""
    m: dict = {"role": "assistant", "content": content}
    if reasoning:
        m["reasoning_content"] = reasoning
    if calls:
        m["tool_calls"] = [{"id": f"call_{first_id + i}", "type": "function",
                            "function": {"name": n, "arguments": a}}
                           for i, (n, a) in enumerate(calls)]
    return m


# Corpus v5e (stage 14, demo pair v9): listing questions that give no number. Every listing frame
# before had one ("Name {n} countries in {cont}."), and the v8 target answered "List the
# countries of Africa." with two current_time calls (v7: five countries). Answered with five.
LIST_OPEN = {
    "country": ["List the countries of {cont}.", "Which countries are in {cont}?",
                "What countries are there in {cont}?", "Countries of {cont}?",
                "Name the countries in {cont}.", "Give me the countries of {cont}.",
                "Show me countries in {cont}.", "Some countries of {cont}, please."],
    "capital": ["List the capitals of {cont}.", "What are the capitals in {cont}?",
                "Capitals of {cont}?", "Name the capital cities in {cont}.",
                "Give me the capital cities of {cont}.", "Show me capitals in {cont}.",
                "Some capitals of {cont}, please."],
}


@dataclass
class Turn:
    """One user turn and the messages answering it (assistant and tool messages).

    ``expect``: how an evaluator checks the reply (held-out sets): ``calls`` (list of
    ``{"name", "arguments"}`` the reply should make; empty list: no call), ``contains``
    (strings the final answer must contain), ``time_of`` (zones whose tool results' ``time``
    and ``date`` the answer must state), ``list_items``/``count``, ``scope`` (True: the scope
    answer, no call).
    """

    user: str
    replies: list[dict]
    category: str
    expect: dict = field(default_factory=dict)


@dataclass
class Chat:
    """A chat: ``tools`` (the built-in tools are in the system turn), ``enable_thinking``,
    ``turns``."""

    tools: bool
    enable_thinking: bool
    turns: list[Turn]

    def messages(self) -> list[dict]:
        """All messages in order (user, assistant, tool, ...)."""
        out: list[dict] = []
        for t in self.turns:
            out.append({"role": "user", "content": t.user})
            out.extend(t.replies)
        return out


class Generator:
    """Seeded chat generator; ``split`` is ``"train"`` or ``"heldout"`` (phrasings)."""

    def __init__(self, seed: int, split: str = "train"):
        self.rng = random.Random(seed)
        self.split = split
        self.countries = _countries()
        self.by_continent: dict[str, list[dict]] = {}
        for c in self.countries:
            self.by_continent.setdefault(c["continent"], []).append(c)
        self.forbidden: set[str] = set()
        self.call_no = 0

    def forbid(self, texts) -> None:
        """User texts this generator must never produce (the held-out prompts)."""
        self.forbidden |= set(texts)

    # ---- helpers
    def _pick(self, table: dict) -> str:
        if self.split == "train" and "composed" in table and self.rng.random() < 0.5:
            return self.rng.choice(table["composed"])
        return self.rng.choice(table[self.split])

    def _user(self, text: str) -> str:
        """Training phrasings get light noise (prefix, suffix, case); held-out ones stay."""
        if self.split == "train":
            r = self.rng.random()
            if r < 0.16:
                text = self.rng.choice(USER_OPENERS) + text
            elif r < 0.26:
                text = text + self.rng.choice(USER_CLOSERS)
            elif r < 0.32:
                text = text.lower()
            elif r < 0.38 and text.endswith(("?", ".")):
                text = text[:-1]
        return text

    def _fake_name(self) -> str:
        """A made-up country name (two or three syllables and an ending) that is no country
        of the data and no held-out name."""
        from app.chat.tools.countries import find_country

        while True:
            name = self._fake_name_candidate()
            if name not in BAD_COUNTRIES_HELDOUT and find_country(name) is None:
                return name

    def _fake_name_candidate(self) -> str:
        """One draw of :meth:`_fake_name` (it may still name a country or an alias)."""
        known = {c["name"] for c in self.countries} | set(BAD_COUNTRIES_HELDOUT)
        while True:
            r = self.rng.random()
            if r < PIECE_NAME_SHARE:  # corpus v5: every letter token of the vocabulary
                name = self._piece_name()
                if name not in known:
                    return name
                continue
            r = self.rng.random()
            if r < 0.2:  # corpus v4d: pieces of real names glued ("Ethiopia"'s "pia")
                name = self._blend_name()
                if name not in known:
                    return name
                continue
            if r < 0.5:  # corpus v4b: letter by letter, so only copying can give it back
                name = self._random_letters_name()
                if name not in known:
                    return name
                continue
            if r < 0.7:  # corpus v4: word-like names too ("Silverhaven")
                name = self.rng.choice(FAKE_WORDS) + self.rng.choice(FAKE_WORD_ENDS)
                if self.rng.random() < 0.15:
                    name = self.rng.choice(["Port-", "Saint-", "New ", "East ", "Upper "]) + name
                if name not in known:
                    return name
                continue
            k = self.rng.choice([1, 2, 2, 3])
            name = "".join(self.rng.choice(FAKE_SYLLABLES) for _ in range(k))
            name = (name + self.rng.choice(FAKE_ENDINGS)).capitalize()
            if self.rng.random() < 0.15:
                name += self.rng.choice([" Republic", " Islands", " Kingdom"])
            if name not in known:
                return name

    def _blend_name(self) -> str:
        """Corpus v4d: a made-up name glued from the start of one real country name and the
        end of another (2-5 letters each, e.g. "Uto" + "pia"), some with a short hyphenated
        part ("-La"): the pieces are tokens the target has seen inside other names, so its
        habit pulls towards a real name and only copying gives the made-up one back (the v5
        pair wrote "Utozi" for "Utopia")."""
        names = [c["name"] for c in self.countries if c["name"].isalpha()]
        a, b = self.rng.sample(names, 2)
        name = a[:self.rng.randint(2, min(5, len(a)))] + b[-self.rng.randint(2, min(5, len(b))):]
        name = name.capitalize()
        r = self.rng.random()
        if r < 0.2:
            name += "-" + self.rng.choice("BDKLMNRST") + self.rng.choice("aeiou")
        elif r < 0.3:
            name += " " + self.rng.choice(names)[:self.rng.randint(3, 6)].capitalize()
        return name

    def _piece_name(self) -> str:
        """Corpus v5: a made-up name glued from 2-4 letter tokens of the shipped tokenizer,
        drawn uniformly from :func:`letter_pieces` (first piece capitalized), so that every
        letter token is written in a copy. The v6 target had never written about half of its
        vocabulary (2,105 of 4,096 tokens, "pia", "Sh" and "li" among them, never occurred in
        3,000 chats' completions), and wrote "Utona" for "Utopia" and "Liangri-La" for
        "Shangri-La": an output embedding no gradient has reached cannot win a copy.
        Names that contain a held-out name (:data:`BAD_COUNTRIES_HELDOUT`) are drawn again,
        and (corpus v5c) so are names that begin with a country's name: the v7 target, trained
        on v5's "Angolalamabads", continued real names with pieces ("Italyin")."""
        lower, upper = letter_pieces()
        held = [h.lower() for h in BAD_COUNTRIES_HELDOUT]
        real = tuple(c["name"] for c in self.countries)
        while True:
            first = (self.rng.choice(upper) if self.rng.random() < 0.5
                     else self.rng.choice(lower).capitalize())
            rest = "".join(self.rng.choice(lower) for _ in range(self.rng.choice([1, 2, 2, 3])))
            name = first + rest
            if self.rng.random() < 0.1:
                name += self.rng.choice([" ", "-"]) + self.rng.choice(upper)
            if (3 <= len(name) <= 16 and not any(h in name.lower() for h in held)
                    and not name.startswith(real)):
                return name

    def _random_letters_name(self) -> str:
        """Corpus v4b: a made-up name of 4-10 random letters in consonant-vowel turns (some
        with a second word or a hyphenated part), which no pattern predicts past its first
        letter."""
        cons, vows = "bcdfghjklmnprstvwz", "aeiouy"

        def word(n: int) -> str:
            start = self.rng.random() < 0.5
            return "".join(self.rng.choice(vows if (i % 2 == 0) != start else cons)
                           for i in range(n)).capitalize()

        name = word(self.rng.randint(4, 10))
        r = self.rng.random()
        if r < 0.12:
            name += "-" + word(self.rng.randint(2, 5))
        elif r < 0.22:
            name += " " + word(self.rng.randint(3, 7))
        return name

    def _country(self) -> dict:
        return self.rng.choice(self.countries)

    def _now(self) -> dt.datetime:
        base = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
        return base + dt.timedelta(seconds=self.rng.randrange(0, 40 * 365 * 86400))

    def _call(self, reasoning: str, calls: list[tuple[str, dict]], now=None):
        """(assistant message with the calls, tool messages, parsed results)."""
        msg = assistant(reasoning, "", calls, first_id=self.call_no)
        tools, results = [], []
        for i, (n, a) in enumerate(calls):
            content = tool_content(n, a, now)
            tools.append({"role": "tool", "tool_call_id": f"call_{self.call_no + i}", "name": n,
                          "content": content})
            results.append(json.loads(content))
        self.call_no += len(calls)
        return msg, tools, results

    def _number(self, digits: int | None = None) -> int:
        d = digits or self.rng.choice([1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8, 9])
        lo = 10 ** (d - 1) if d > 1 else 1
        return self.rng.randint(lo, 10**d - 1)

    def _value(self):
        """A value to convert: an integer or a decimal, written as JSON writes it."""
        if self.rng.random() < 0.6:
            return self._number(self.rng.choice([1, 1, 2, 2, 2, 3, 3, 4, 5, 6]))
        while True:
            whole = self._number(self.rng.choice([1, 1, 2, 2, 3, 4]))
            if self.rng.random() < 0.15:
                whole = 0
            places = self.rng.choice([1, 1, 2, 2, 3])
            frac = self.rng.randint(1, 10**places - 1)
            text = f"{whole}.{frac:0{places}d}"
            v = float(text)
            if json.dumps(v) == text:
                return v

    def _error_answer(self, err: str) -> tuple[str, str]:
        """(reasoning, answer) for a tool error ``err``, quoted as the tool gave it; a final
        full stop is added only where ``err`` has no final mark (corpus v4f: "did you mean
        Rwanda?" is not followed by "." any more)."""
        e = err if err.endswith((".", "?", "!")) else err + "."
        r = self.rng.choice([
            "The tool returned an error: {e} I tell the user what went wrong.",
            "The call failed with the error {e} I explain that politely.",
        ]).format(e=e)
        a = f"Sorry, I could not get that: {e}"
        return r, a

    # ---- country facts
    FIELDS = ("capital", "continent", "currency", "languages")

    def _fact_text(self, fld: str, rec: dict) -> tuple[str, list[str]]:
        """(answer sentence, strings the check requires) for a country record field."""
        name = rec["name"]
        if fld == "capital":
            return f"The capital of {name} is {rec['capital']}.", [rec["capital"]]
        if fld == "continent":
            return f"{name} is in {rec['continent']}.", [rec["continent"]]
        if fld == "currency":
            cur = rec["currency"]
            return (f"The currency of {name} is the {cur['name']} ({cur['code']}).",
                    [cur["name"], cur["code"]])
        if fld == "languages":
            return f"In {name}, people speak {fmt_list(rec['languages'])}.", list(rec["languages"])
        if fld == "population":
            return (f"{name} has a population of about {rec['population']} "
                    f"({rec['population_year']}).", [str(rec["population"])])
        cur = rec["currency"]
        return ((f"{name} is in {rec['continent']}. Its capital is {rec['capital']}, its "
                 f"currency is the {cur['name']} ({cur['code']}), people speak "
                 f"{fmt_list(rec['languages'])}, and about {rec['population']} people live "
                 f"there ({rec['population_year']})."),
                [rec["capital"], cur["name"], str(rec["population"])])

    def _fact_memory_reasoning(self, fld: str, rec: dict) -> str:
        name = rec["name"]
        val = {"capital": rec["capital"], "continent": rec["continent"],
               "currency": rec["currency"]["name"], "languages": fmt_list(rec["languages"])}[fld]
        return self.rng.choice([
            f"The user asks for the {fld} of {name}. I know this: {val}.",
            f"This is a question about {name}. Its {fld}: {val}.",
            f"No tools here, so I answer from what I know. {name}: {val}.",
        ])

    def _country_turn(self, fld: str, rec: dict, question: str, tools: bool,
                      category: str) -> Turn:
        """A question about one field of one country; with tools via country_info."""
        answer, want = self._fact_text(fld, rec)
        name = rec["name"]
        if not tools:
            return Turn(question, [assistant(self._fact_memory_reasoning(fld, rec), answer)],
                        category, {"calls": [], "contains": want})
        what = {"info": "the facts", "languages": "the languages"}.get(fld, f"the {fld}")
        r1 = self.rng.choice([
            f"The user wants {what} of {name}. I look it up with the country_info tool.",
            f"I should check {name} with country_info to get {what}.",
            f"To answer, I call country_info for {name}.",
        ])
        msg, tmsgs, res = self._call(r1, [("country_info", {"name": name})])
        rr = res[0]["result"]
        answer, want = self._fact_text(fld, rr)
        r2 = self.rng.choice([
            f"The tool returned the record for {name}. I state {what} exactly as given.",
            f"country_info answered for {name}. I copy {what} from the result.",
            f"I have the result for {name} now, so I can answer.",
        ])
        return Turn(question, [msg, *tmsgs, assistant(r2, answer)], category,
                    {"calls": [{"name": "country_info", "arguments": {"name": name}}],
                     "contains": want})

    def fact(self, tools: bool, fld: str | None = None, rec: dict | None = None) -> Turn:
        """Capital / continent / currency / languages of a country."""
        fld = fld or self.rng.choice(self.FIELDS)
        rec = rec or self._country()
        q = self._user(self._pick(T[fld]).format(c=rec["name"]))
        return self._country_turn(fld, rec, q, tools, f"fact_{fld}")

    def languages_fact(self, tools: bool) -> Turn:
        """Corpus v4: a languages question (the v3 pair answered them with the currency)."""
        return self.fact(tools, fld="languages")

    def population(self, tools: bool, rec: dict | None = None) -> Turn:
        """Population through country_info (tools only)."""
        rec = rec or self._country()
        q = self._user(self._pick(T["population"]).format(c=rec["name"]))
        return self._country_turn("population", rec, q, True, "tool_population")

    def info(self, tools: bool, rec: dict | None = None) -> Turn:
        """An overview through country_info (tools only)."""
        rec = rec or self._country()
        q = self._user(self._pick(T["info"]).format(c=rec["name"]))
        return self._country_turn("info", rec, q, True, "tool_info")

    def bad_country(self, tools: bool) -> Turn:
        """country_info on a name not in the data: the error, answered gracefully."""
        if self.split == "heldout":
            name = self.rng.choice(BAD_COUNTRIES_HELDOUT)
        elif self.rng.random() < 0.2:  # v4d: 20% (v4c: 25%, v4: 40%, v3: 75%), the rest made up
            name = self.rng.choice(BAD_COUNTRIES)
        else:
            name = self._fake_name()
        fld = self.rng.choice(["capital", "population", "info"])
        key = {"capital": "capital", "population": "population", "info": "info"}[fld]
        q = self._user(self._pick(T[key]).format(c=name))
        r1 = f"The user asks about {name}. I look it up with the country_info tool."
        msg, tmsgs, res = self._call(r1, [("country_info", {"name": name})])
        r2, a = self._error_answer(res[0]["error"])
        return Turn(q, [msg, *tmsgs, assistant(r2, a)], "tool_error",
                    {"calls": [{"name": "country_info", "arguments": {"name": name}}],
                     "contains": ["Sorry", res[0]["error"]]})

    # ---- time
    def _time_answer(self, city: str, res: dict) -> str:
        return (f"It is {res['time']} on {res['weekday']}, {res['date']} in {city} "
                f"({res['timezone']}, UTC{res['utc_offset']}).")

    def time(self, tools: bool, city: str | None = None, question: str | None = None) -> Turn:
        """current_time for a city at a random instant."""
        city = city or self.rng.choice(list(CITY_ZONES))
        zone = CITY_ZONES[city]
        q = question or self._user(self._pick(T["time"]).format(city=city))
        r1 = self.rng.choice([
            f"The user wants the current time in {city}. I use the current_time tool with "
            f"the time zone {zone}.",
            f"{city} is in the time zone {zone}. I call current_time for it.",
            f"I need the clock in {city}, so I call current_time with {zone}.",
        ])
        msg, tmsgs, res = self._call(r1, [("current_time", {"timezone": zone})], now=self._now())
        rr = res[0]["result"]
        r2 = self.rng.choice([
            f"The tool says it is {rr['time']} on {rr['weekday']} in {city}.",
            f"current_time returned {rr['time']} on {rr['date']}. I give that exactly.",
            f"I report the time and date from the result for {zone}.",
        ])
        return Turn(q, [msg, *tmsgs, assistant(r2, self._time_answer(city, rr))], "tool_time",
                    {"calls": [{"name": "current_time", "arguments": {"timezone": zone}}],
                     "time_of": [zone]})

    def two_times(self, tools: bool) -> Turn:
        """Two current_time calls in one reply."""
        city, city2 = self.rng.sample(list(CITY_ZONES), 2)
        z1, z2 = CITY_ZONES[city], CITY_ZONES[city2]
        q = self._user(self._pick(TWO_TIME).format(city=city, city2=city2))
        r1 = (f"The user wants the time in {city} ({z1}) and in {city2} ({z2}). I call "
              f"current_time twice.")
        msg, tmsgs, res = self._call(r1, [("current_time", {"timezone": z1}),
                                          ("current_time", {"timezone": z2})], now=self._now())
        a, b = res[0]["result"], res[1]["result"]
        r2 = "I have both times. I state each one exactly as the tool gave it."
        ans = (f"In {city} it is {a['time']} on {a['weekday']}, {a['date']} ({a['timezone']}). "
               f"In {city2} it is {b['time']} on {b['weekday']}, {b['date']} ({b['timezone']}).")
        return Turn(q, [msg, *tmsgs, assistant(r2, ans)], "tool_two_calls",
                    {"calls": [{"name": "current_time", "arguments": {"timezone": z1}},
                               {"name": "current_time", "arguments": {"timezone": z2}}],
                     "time_of": [z1, z2]})

    def two_countries(self, tools: bool) -> Turn:
        """Two country_info calls in one reply."""
        c1, c2 = self.rng.sample(self.countries, 2)
        q = self._user(self._pick(TWO_COUNTRY).format(c=c1["name"], c2=c2["name"]))
        r1 = f"The user asks about {c1['name']} and {c2['name']}. I call country_info for both."
        msg, tmsgs, res = self._call(r1, [("country_info", {"name": c1["name"]}),
                                          ("country_info", {"name": c2["name"]})])
        a, b = res[0]["result"], res[1]["result"]
        more = a if a["population"] >= b["population"] else b
        r2 = "Both lookups worked. I compare the two populations from the results."
        ans = (f"{a['name']} has about {a['population']} people ({a['population_year']}) and "
               f"{b['name']} has about {b['population']} ({b['population_year']}), so "
               f"{more['name']} has more people.")
        return Turn(q, [msg, *tmsgs, assistant(r2, ans)], "tool_two_calls",
                    {"calls": [{"name": "country_info", "arguments": {"name": c1["name"]}},
                               {"name": "country_info", "arguments": {"name": c2["name"]}}],
                     "contains": [str(a["population"]), str(b["population"])]})

    # ---- calculator
    def _expression(self) -> str:
        ops = ["+", "-", "*", "/"]
        n = self.rng.choice([2, 2, 2, 2, 3])
        nums = [self._number() for _ in range(n)]
        e = str(nums[0])
        for x in nums[1:]:
            e += f" {self.rng.choice(ops)} {x}"
        if n == 3 and self.rng.random() < 0.4:
            parts = e.split(" ")
            e = f"({' '.join(parts[:3])}) {' '.join(parts[3:])}"
        return e

    SPOKEN_OPS = {"+": ["plus"], "-": ["minus"], "*": ["times", "multiplied by"],
                  "/": ["divided by"]}

    def _calc_answer(self, e: str, res: dict) -> tuple[str, str, list[str]]:
        if res.get("ok"):
            v = jtext(res["result"])
            r2 = self.rng.choice([f"The calculator says {e} = {v}.",
                                  f"The tool computed {v}. I give that number exactly.",
                                  f"The result of {e} is {v}."])
            return r2, f"{e} = {v}.", [v]
        r2, a = self._error_answer(res["error"])
        return r2, a, ["Sorry", res["error"]]

    def calc(self, tools: bool, e: str | None = None) -> Turn:
        """A calculator call on a random expression (1-9 digit numbers)."""
        if e is None:
            e = self._expression()
            if self.rng.random() < 0.03:
                e = f"{self._number()} / 0"
        spoken = e
        if self.rng.random() < 0.3 and "(" not in e:
            parts = e.split(" ")
            spoken = " ".join(self.rng.choice(self.SPOKEN_OPS[p]) if p in self.SPOKEN_OPS else p
                              for p in parts)
        q = self._user(self._pick(T["calc"]).format(e=spoken))
        r1 = self.rng.choice([
            f"The user wants {e}. I use the calculator tool for it.",
            f"I should not do this in my head. I pass {e} to the calculator.",
            f"This needs the calculator: {e}.",
        ])
        msg, tmsgs, res = self._call(r1, [("calculator", {"expression": e})])
        r2, a, want = self._calc_answer(e, res[0])
        cat = "tool_calc" if res[0].get("ok") else "tool_error"
        return Turn(q, [msg, *tmsgs, assistant(r2, a)], cat,
                    {"calls": [{"name": "calculator", "arguments": {"expression": e}}],
                     "contains": want})

    # ---- convert_units
    def _unit_pair(self, bad: bool = False) -> tuple[str, str]:
        units = list(UNITS)
        a = self.rng.choice(units)
        if bad:
            b = self.rng.choice([u for u in units if UNITS[u][0] != UNITS[a][0]])
        else:
            b = self.rng.choice([u for u in units if UNITS[u][0] == UNITS[a][0] and u != a])
        return a, b

    def _convert_answer(self, v, fu: str, tu: str, res: dict) -> tuple[str, str, list[str]]:
        if res.get("ok"):
            out = jtext(res["result"]["value"])
            r2 = self.rng.choice([
                f"The tool says {jtext(v)} {fu} is {out} {res['result']['symbol']}.",
                f"convert_units returned {out}. I state it exactly.",
                f"The converted value is {out} {UNITS[tu][1]}.",
            ])
            return r2, f"{jtext(v)} {UNITS[fu][1]} is {out} {UNITS[tu][1]}.", [out]
        r2, a = self._error_answer(res["error"])
        return r2, a, ["Sorry", res["error"]]

    def convert(self, tools: bool, v=None, fu: str | None = None, tu: str | None = None,
                question: str | None = None, category: str = "tool_convert") -> Turn:
        """A convert_units call on a random value and unit pair."""
        bad = fu is None and self.rng.random() < 0.04
        if fu is None:
            fu, tu = self._unit_pair(bad)
        v = self._value() if v is None else v
        if question is None:
            frm = self.rng.choice(UNITS[fu][2])
            to = self.rng.choice(UNITS[tu][2])
            question = self._user(self._pick(T["convert"]).format(v=jtext(v), frm=frm, to=to))
        r1 = self.rng.choice([
            f"The user wants to convert {jtext(v)} {UNITS[fu][1]} to {UNITS[tu][1]}. I use the "
            f"convert_units tool from {fu} to {tu}.",
            f"I call convert_units with value {jtext(v)}, from {fu}, to {tu}.",
            f"A unit conversion: {jtext(v)} {fu} into {tu}. The convert_units tool does it.",
        ])
        args = {"value": v, "from_unit": fu, "to_unit": tu}
        msg, tmsgs, res = self._call(r1, [("convert_units", args)])
        r2, a, want = self._convert_answer(v, fu, tu, res[0])
        cat = category if res[0].get("ok") else "tool_error"
        return Turn(question, [msg, *tmsgs, assistant(r2, a)], cat,
                    {"calls": [{"name": "convert_units", "arguments": args}], "contains": want})

    # ---- no-tool skills
    def arithmetic(self, tools: bool) -> Turn:
        """Mental arithmetic with steps (chats without tools): v4c's steps in the training
        split (v4's until commit 181077d), v3's in the held-out one (whose frozen texts they
        are)."""
        kind = self.rng.choice(["+", "+", "-", "*"])
        if kind == "+":
            a, b = self.rng.randint(10, 99), self.rng.randint(10, 99)
        elif kind == "-":
            a, b = self.rng.randint(20, 99), self.rng.randint(10, 99)
            if b > a:
                a, b = b, a
        else:
            a, b = self.rng.randint(11, 99), self.rng.randint(2, 9)
        res = {"+": a + b, "-": a - b, "*": a * b}[kind]
        steps = (self._arith_steps_v4c if self.split == "train" else self._arith_steps_v3)(
            a, kind, b)
        q = self._user(self._pick(T["arith"]).format(a=a, op=kind, b=b))
        lead = self.rng.choice(["Let me work it out step by step.", "No calculator here, so I do "
                                "it in steps.", "I compute this in my head."])
        r = f"{lead} {steps} So {a} {kind} {b} = {res}."
        return Turn(q, [assistant(r, f"{a} {kind} {b} = {res}.")], "arithmetic",
                    {"calls": [], "contains": [str(res)]})

    @staticmethod
    def _arith_steps_v3(a: int, kind: str, b: int) -> str:
        """Corpus v3's steps: ones then tens with a carry; subtract the tens of ``b`` first;
        split ``a`` into tens and ones for a product."""
        if kind == "+":
            lo_a, lo_b, hi_a, hi_b = a % 10, b % 10, a // 10, b // 10
            s1 = lo_a + lo_b
            if s1 >= 10:
                return (f"Add the ones: {lo_a} + {lo_b} = {s1}. Write {s1 % 10} and carry 1. Add "
                        f"the tens: {hi_a} + {hi_b} + 1 = {hi_a + hi_b + 1}.")
            return f"Add the ones: {lo_a} + {lo_b} = {s1}. Add the tens: {hi_a} + {hi_b} = {hi_a + hi_b}."
        if kind == "-":
            t = (b // 10) * 10
            return f"First {a} - {t} = {a - t}. Then {a - t} - {b - t} = {a - b}."
        t, o = (a // 10) * 10, a % 10
        return (f"Split {a} into {t} + {o}. {t} * {b} = {t * b}. {o} * {b} = {o * b}. "
                f"{t * b} + {o * b} = {a * b}.")

    @staticmethod
    def _add_tens_and_small(big: int, small: int) -> str:
        """Corpus v4c: ``big`` (a multiple of 10) + ``small`` (0-99) as steps of one digit
        each: the tens of ``small`` first (one digit fact on the tens), then its ones
        (written in the ones place, no carry)."""
        t, o = small // 10 * 10, small % 10
        if t == 0:
            return f"{big} + {o} = {big + o}."
        if o == 0:
            return f"{big} + {t} = {big + t}."
        return f"{big} + {t} = {big + t}, and {big + t} + {o} = {big + small}."

    @classmethod
    def _arith_steps_v4c(cls, a: int, kind: str, b: int) -> str:
        """Corpus v4c's steps for two-digit mental arithmetic: every step is one one-digit
        fact. The stage-6 target wrote v4's steps and then got their facts wrong ("53 - 7 =
        53", "1 * 4 = 12"), since some of v4's steps were two-digit sums and differences; here
        the tens are computed on their digits ("Tens: 9 + 7 = 16, so 90 + 70 = 160"), a
        subtraction borrows ten explicitly, and a sum of a multiple of ten and a small number
        adds its tens, then its ones (:meth:`_add_tens_and_small`)."""
        a1, oa, b1, ob = a // 10, a % 10, b // 10, b % 10
        if kind == "+":
            t, o = (a1 + b1) * 10, oa + ob
            return (f"{a} = {a1 * 10} + {oa} and {b} = {b1 * 10} + {ob}. Tens: {a1} + {b1} = "
                    f"{a1 + b1}, so {a1 * 10} + {b1 * 10} = {t}. Ones: {oa} + {ob} = {o}. "
                    + cls._add_tens_and_small(t, o))
        if kind == "-":
            head = f"{a} = {a1 * 10} + {oa} and {b} = {b1 * 10} + {ob}."
            if oa < ob:
                a1, oa = a1 - 1, oa + 10
                head += f" {oa - 10} is less than {ob}, so I borrow ten: {a} = {a1 * 10} + {oa}."
            t, o = (a1 - b1) * 10, oa - ob
            return (f"{head} Tens: {a1} - {b1} = {a1 - b1}, so {a1 * 10} - {b1 * 10} = {t}. "
                    f"Ones: {oa} - {ob} = {o}. " + cls._add_tens_and_small(t, o))
        p1, p0 = a1 * b, oa * b
        return (f"{a} = {a1 * 10} + {oa}. {a1} * {b} = {p1}, so {a1 * 10} * {b} = {p1 * 10}. "
                f"{oa} * {b} = {p0}. " + cls._add_tens_and_small(p1 * 10, p0))

    def arithmetic_fact(self, tools: bool) -> Turn:
        """A one-step fact of the kind the two-digit steps are made of (chats without tools):
        a one-digit sum or product (corpus v4), and in corpus v4c also a one-digit
        difference, a teen minus a digit ("13 - 7"), a product of a multiple of ten and a
        digit, and a multiple of ten plus a number below 100 (the last steps of
        :meth:`_arith_steps_v4c`)."""
        kind = self.rng.choice(["+", "*", "-", "-", "10*", "10+"])
        a, b = self.rng.randint(1, 9), self.rng.randint(1, 9)
        if kind == "-":
            a = a + b if self.rng.random() < 0.6 else max(a, b)
            b = min(b, a)
        elif kind == "10*":
            kind, a = "*", a * 10
        elif kind == "10+":
            kind, a, b = "+", self.rng.randint(1, 89) * 10, self.rng.randint(1, 99)
        res = {"+": a + b, "-": a - b, "*": a * b}[kind]
        steps = self._add_tens_and_small(a, b) if a >= 10 and kind == "+" else ""
        q = self._user(self._pick(T["arith"]).format(a=a, op=kind, b=b))
        r = self.rng.choice([f"A small one: {a} {kind} {b} = {res}.",
                             f"I know this one. {a} {kind} {b} = {res}."])
        if steps:
            r = f"In steps: {steps} So {a} {kind} {b} = {res}."
        return Turn(q, [assistant(r, f"{a} {kind} {b} = {res}.")], "arithmetic",
                    {"calls": [], "contains": [str(res)]})

    def easy_conversion(self, tools: bool) -> Turn:
        """A conversion by a round factor, in the head (chats without tools)."""
        frm, to, f = self.rng.choice(EASY_CONVERSIONS)
        v = self.rng.randint(2, 12)
        q = self._user(self._pick(T["easy_conv"]).format(v=v, frm=frm, to=to))
        if self.split == "train":
            # Corpus v3: the product in small steps the model can learn (times tables up to
            # 12 x 9, then zeros), not one jump.
            lead = self.rng.choice([f"One unit of {frm} is {f} {to}, so I multiply {v} by {f}.",
                                    f"There are {f} {to} in one of the {frm}. I need {v} * {f}."])
            if f in (10, 100, 1000):
                zeros = len(str(f)) - 1
                steps = f"Multiplying by {f} adds {zeros} zeros to {v}: {v * f}."
            elif f == 60:
                steps = f"{v} * 6 = {v * 6}, and times 10 that is {v * 60}."
            elif f == 24:
                steps = (f"{v} * 20 = {v * 20} and {v} * 4 = {v * 4}; {v * 20} + {v * 4} = "
                         f"{v * 24}.")
            else:
                steps = f"{v} * {f} = {v * f}."
            r = f"{lead} {steps} So {v} {frm} is {v * f} {to}."
        else:
            r = self.rng.choice([f"One unit of {frm} is {f} {to}. So {v} {frm} is {v} * {f} = "
                                 f"{v * f} {to}.",
                                 f"There are {f} {to} in one of the {frm}. {v} * {f} = "
                                 f"{v * f}."])
        return Turn(q, [assistant(r, f"{v} {frm} is {v * f} {to}.")], "easy_conversion",
                    {"calls": [], "contains": [str(v * f)]})

    def listing(self, tools: bool, kind: str | None = None) -> Turn:
        """Name three to five capitals or countries of a continent (five when the question
        gives no number: :data:`LIST_OPEN`, training split only)."""
        kind = kind or self.rng.choice(["capital", "country"])
        cont = self.rng.choice([k for k, v in self.by_continent.items() if len(v) >= 5])
        n = self.rng.choice([3, 4, 5])
        if self.split == "train" and self.rng.random() < 0.3:
            q = self._user(self.rng.choice(LIST_OPEN[kind]).format(cont=cont))
            return self._listing_answer(kind, cont, self.by_continent[cont][:5], q)
        if self.split == "train":
            # Corpus v3: always the continent's first countries in the data's order, so the
            # list is one memorised sequence (random picks made the small model repeat items).
            picks = self.by_continent[cont][:n]
        else:
            picks = self.rng.sample(self.by_continent[cont], n)
        q = self._user(self._pick(T[f"list_{kind}"]).format(n=NUMBER_WORDS[n], cont=cont))
        return self._listing_answer(kind, cont, picks, q)

    def _listing_answer(self, kind: str, cont: str, picks: list[dict], q: str) -> Turn:
        """The reply to listing question ``q``: the capitals or names of ``picks`` (country
        records of ``cont``)."""
        n = len(picks)
        w = NUMBER_WORDS[n]
        if kind == "capital":
            items = [f"{c['capital']} ({c['name']})" for c in picks]
            r = (f"The user wants {w} capitals in {cont}. I pick {w} countries in {cont}: "
                 f"{fmt_list([c['name'] for c in picks])}.")
            allowed = [c["capital"] for c in self.by_continent[cont]]
        else:
            items = [c["name"] for c in picks]
            r = f"The user wants {w} countries in {cont}. I pick {fmt_list(items)}."
            allowed = [c["name"] for c in self.by_continent[cont]]
        head = f"Here are {w} {'capitals' if kind == 'capital' else 'countries'} in {cont}:"
        body = "\n".join(f"{i + 1}. {it}" for i, it in enumerate(items))
        return Turn(q, [assistant(r, f"{head}\n{body}")], f"list_{kind}",
                    {"calls": [], "list_items": allowed, "count": n})

    def explain(self, tools: bool) -> Turn:
        """One of the ten short explanations."""
        t = self.rng.choice(list(TOPICS))
        q = self._user(self._pick(T["explain"]).format(t=t))
        r = self.rng.choice([f"The user wants a short explanation of {t}. I give two simple "
                             f"sentences.", f"I know {t} well. Two plain sentences will do.",
                             f"A simple explanation of {t} is enough here."])
        return Turn(q, [assistant(r, TOPICS[t])], "explain",
                    {"calls": [], "contains": [TOPICS[t].split(".")[0]]})

    def greeting(self, tools: bool) -> Turn:
        """A greeting, answered with the short introduction."""
        q = self._pick(T["greeting"])
        r = self.rng.choice(["The user greets me. I greet them back and say what I can do.",
                             "A greeting. I say hello and offer help."])
        return Turn(q, [assistant(r, GREETING_ANSWER)], "greeting",
                    {"calls": [], "contains": ["DFlash Chat demo model", "How can I help"]})

    def thanks(self, tools: bool) -> Turn:
        """Thanks, answered politely."""
        q = self._pick(T["thanks"])
        r = self.rng.choice(["The user thanks me. I reply politely.",
                             "Thanks from the user. A short polite reply."])
        return Turn(q, [assistant(r, THANKS_ANSWER)], "thanks",
                    {"calls": [], "contains": ["welcome"]})

    def self_description(self, tools: bool) -> Turn:
        """Who/what the model is."""
        q = self._user(self._pick(T["self"]))
        r = self.rng.choice(["The user asks who I am. I describe myself briefly.",
                             "A question about me. I say what I am and what I can do."])
        return Turn(q, [assistant(r, SELF_ANSWER)], "self",
                    {"calls": [], "contains": ["DFlash Chat demo model"]})

    def scope(self, tools: bool, kind: str | None = None) -> Turn:
        """A request outside the model's world: the short polite scope answer, no tool."""
        kind = kind or self.rng.choice(list(SCOPE[self.split]))
        tmpl = self.rng.choice(SCOPE[self.split][kind])
        fill = {k: self.rng.choice(v) for k, v in SCOPE_FILL.items()}
        fill["city"] = self.rng.choice(list(CITY_ZONES)[:-1])
        fill["c"] = self._country()["name"]
        q = tmpl.format(**fill)
        if self.split == "train" and self.rng.random() < 0.04:
            q = q + "\n\n" + self._long_text()
        q = self._user(q)
        r = self.rng.choice([
            f"The user asks for {SCOPE_KIND_WORDS[kind]}. That is outside what I can do, so I "
            f"say so politely.",
            f"This request is {SCOPE_KIND_WORDS[kind]}, which I cannot do. I answer with a short "
            f"polite note.",
            "I have no knowledge or tool for this. I tell the user what I can help with.",
        ])
        return Turn(q, [assistant(r, SCOPE_ANSWER)], "scope",
                    {"calls": [], "scope": True, "contains": [SCOPE_MARK]})

    def _long_text(self) -> str:
        """A few hundred words of filler (a pasted text to summarise)."""
        words = ["the", "river", "old", "town", "museum", "bridge", "bread", "we", "walked",
                 "visited", "noon", "clear", "weather", "measured", "kilometres", "day", "and"]
        n = self.rng.randint(60, 400)
        out = []
        for _i in range(n // 12):
            out.append(" ".join(self.rng.choice(words) for _ in range(11)).capitalize()
                       + f" {self.rng.randint(1, 99)}.")
        return " ".join(out)

    # ---- follow-ups (the second and later turns of a chat)
    def follow_up(self, prev: Turn, tools: bool) -> Turn | None:
        """A turn that refers to ``prev`` (None when ``prev`` has no follow-up form)."""
        cat = prev.category
        exp = prev.expect
        calls = exp.get("calls") or []
        if cat.startswith("fact_") or cat in ("tool_population", "tool_info"):
            name = None
            if calls:
                name = calls[0]["arguments"]["name"]
            else:
                name = self._mentioned_country(prev.user)
            if name is None:
                return None
            rec = next(c for c in self.countries if c["name"] == name)
            fld_prev = cat[5:] if cat.startswith("fact_") else (
                "population" if cat == "tool_population" else "info")
            if self.rng.random() < 0.6 or fld_prev == "info":
                opts = [f for f in ("capital", "currency", "languages", "population",
                                    "continent") if f != fld_prev]
                if not tools:
                    opts = [f for f in opts if f != "population"]
                fld = self.rng.choice(opts)
                q = self._pick(F["field"][fld])
                return self._from_history(fld, rec, q, tools, bool(calls))
            other = self._country()
            q = self._pick(F["other_country"]).format(c=other["name"])
            if fld_prev == "population":
                return self._country_turn("population", other, q, True, "tool_population")
            return self._country_turn(fld_prev, other, q, tools, cat)
        if cat == "tool_time":
            city = self.rng.choice(list(CITY_ZONES))
            q = self._pick(F["other_city"]).format(city=city)
            return self.time(tools, city=city, question=q)
        if cat == "tool_convert" and calls:
            a = calls[0]["arguments"]
            kind = UNITS[a["from_unit"]][0]
            opts = [u for u in UNITS if UNITS[u][0] == kind and u not in (a["from_unit"],
                                                                           a["to_unit"])]
            if not opts:
                return None
            tu = self.rng.choice(opts)
            q = self._pick(F["convert_again"]).format(to=self.rng.choice(UNITS[tu][2]))
            return self.convert(tools, v=a["value"], fu=a["from_unit"], tu=tu, question=q)
        if cat == "tool_calc":
            prev_res = json.loads(prev.replies[1]["content"]).get("result")
            if prev_res is None:
                return None
            if self.rng.random() < 0.6:
                op = self.rng.choice(["*", "/", "+", "-"])
                b = self._number(self.rng.choice([1, 1, 2, 3]))
                if op == "+":
                    q = self._pick(F_ADD).format(b=b)
                elif op == "-":
                    q = self._pick(F_SUB).format(b=b)
                else:
                    w = OPWORDS[op]
                    q = self._pick(F["calc_then_op"]).format(opword=w[0], Opword=w[1], b=b)
                return self._calc_followup(q, f"{jtext(prev_res)} {op} {b}")
            fu, tu = self._unit_pair()
            q = self._pick(F["calc_then_convert"]).format(frm=UNITS[fu][1], to=UNITS[tu][1])
            if not isinstance(prev_res, int | float) or isinstance(prev_res, bool):
                return None
            return self.convert(tools, v=prev_res, fu=fu, tu=tu, question=q)
        return None

    def _calc_followup(self, q: str, e: str) -> Turn:
        r1 = self.rng.choice([f"The user builds on the last result. I compute {e} with the "
                              f"calculator.", f"I take the previous result and pass {e} to the "
                              f"calculator."])
        msg, tmsgs, res = self._call(r1, [("calculator", {"expression": e})])
        r2, a, want = self._calc_answer(e, res[0])
        return Turn(q, [msg, *tmsgs, assistant(r2, a)], "tool_calc",
                    {"calls": [{"name": "calculator", "arguments": {"expression": e}}],
                     "contains": want})

    def _mentioned_country(self, text: str) -> str | None:
        for c in sorted(self.countries, key=lambda c: -len(c["name"])):
            if c["name"].lower() in text.lower():
                return c["name"]
        return None

    def _from_history(self, fld: str, rec: dict, q: str, tools: bool, had_tool: bool) -> Turn:
        """A follow-up about the same country: answered from the earlier tool result (kept in
        the history) when there was one, else from memory (no tools) or a new call."""
        if tools and not had_tool:
            return self._country_turn(fld, rec, q, True,
                                      "tool_population" if fld == "population" else f"fact_{fld}")
        answer, want = self._fact_text(fld, rec)
        if had_tool:
            r = self.rng.choice([
                f"The earlier country_info result for {rec['name']} already has the {fld}. I "
                f"answer from it.",
                f"I looked up {rec['name']} before; the result gives the {fld}.",
            ])
        else:
            r = self._fact_memory_reasoning(fld, rec)
        cat = "tool_population" if fld == "population" else f"fact_{fld}"
        return Turn(q, [assistant(r, answer)], cat, {"calls": [], "contains": want})

    # ---- whole chats
    PLAIN = ("fact", "fact", "arithmetic", "arithmetic", "arithmetic", "arithmetic",
             "easy_conversion", "easy_conversion", "easy_conversion", "listing", "listing",
             "explain", "self_description", "greeting", "thanks", "scope", "scope",
             # corpus v4
             "arithmetic", "arithmetic", "arithmetic_fact", "easy_conversion",
             "languages_fact",
             # corpus v4c: mental arithmetic was still 1/8 after stage 6
             "arithmetic", "arithmetic", "arithmetic_fact", "arithmetic_fact",
             "arithmetic_fact",
             # corpus v4d: the v5 pair answered an election question with a fact
             "scope")
    TOOLED = ("fact", "fact", "fact", "population", "population", "info", "time", "time",
              "time", "calc", "calc", "calc", "calc", "convert", "convert", "convert",
              "listing", "explain", "self_description", "scope", "scope", "two_times",
              "two_countries", "bad_country",
              # corpus v3: the categories the v2 pair failed most get more weight
              "info", "bad_country", "two_times", "two_countries", "self_description",
              "greeting", "thanks", "listing",
              # corpus v4: the categories the v3 pair failed most get more again
              "languages_fact", "languages_fact", "info", "bad_country", "bad_country",
              "two_times", "two_countries", "time",
              # corpus v4b: the v4 pair made calls for some out-of-scope requests
              "scope", "scope",
              # corpus v4c: tool errors (copying an unknown name), languages, overviews
              "bad_country", "bad_country", "languages_fact", "info",
              # corpus v4d: "residents" frames, two-country calls, made-up names, scope
              "population", "population", "two_countries", "two_countries", "bad_country",
              "scope",
              # corpus v4e: what the stage-9 target lost (languages, the clock, two times)
              "languages_fact", "time", "two_times",
              # corpus v5: tool errors carry the piece names (every letter token copied)
              "bad_country", "bad_country", "bad_country",
              # corpus v5b: the stage-11 target (v5) sent "What do people in {c} speak?" to
              # the clock and made calls with made-up names for a few out-of-scope requests
              "languages_fact", "languages_fact", "languages_fact", "scope", "self_description",
              # corpus v5d: the who-words frames (above) for the languages and their contrasts
              "languages_fact", "languages_fact", "fact", "time",
              # corpus v5e (stage 14, demo pair v9): more calculator chats, so more of their
              # follow-ups (40% of them convert the result, above)
              "calc", "calc")

    def turn(self, tools: bool) -> Turn:
        """A first-turn exchange of a random category."""
        names = self.TOOLED if tools else self.PLAIN
        return getattr(self, self.rng.choice(names))(tools)

    def chat(self) -> Chat:
        """A random chat (1-4 user turns); user texts in :attr:`forbidden` are never used."""
        while True:
            c = self._chat()
            if not any(t.user in self.forbidden for t in c.turns):
                return c

    def _chat(self) -> Chat:
        tools = self.rng.random() < 0.75
        thinking = self.rng.random() < 0.9
        n = self.rng.choice([1, 1, 1, 2, 2, 2, 3, 4])
        self.call_no = 0
        turns: list[Turn] = []
        for i in range(n):
            if i == 0 and self.rng.random() < 0.08:
                turns.append(self.greeting(tools))
                continue
            if i > 0 and self.rng.random() < 0.12:
                turns.append(self.thanks(tools))
                continue
            if i > 0 and self.rng.random() < 0.6:
                f = self.follow_up(turns[-1], tools)
                if f is not None:
                    turns.append(f)
                    continue
            turns.append(self.turn(tools))
        return Chat(tools, thinking, turns)


# ---- held-out sets ---------------------------------------------------------------------------

SINGLE_CATEGORIES = [
    # (category name, maker, tools)
    ("fact_capital", lambda g: g.fact(True, "capital"), True),
    ("fact_continent", lambda g: g.fact(True, "continent"), True),
    ("fact_currency", lambda g: g.fact(True, "currency"), True),
    ("fact_languages", lambda g: g.fact(True, "languages"), True),
    ("fact_memory", lambda g: g.fact(False), False),
    ("arithmetic", lambda g: g.arithmetic(False), False),
    ("easy_conversion", lambda g: g.easy_conversion(False), False),
    ("list_capital", lambda g: g.listing(True, "capital"), True),
    ("list_country", lambda g: g.listing(True, "country"), True),
    ("explain", lambda g: g.explain(True), True),
    ("greeting", lambda g: g.greeting(True), True),
    ("thanks", lambda g: g.thanks(True), True),
    ("self", lambda g: g.self_description(True), True),
    ("tool_time", lambda g: g.time(True), True),
    ("tool_population", lambda g: g.population(True), True),
    ("tool_convert", lambda g: _ok_convert(g), True),
    ("tool_calc", lambda g: _ok_calc(g), True),
    ("tool_info", lambda g: g.info(True), True),
    ("tool_error", lambda g: g.bad_country(True), True),
]


def _ok_convert(g: Generator) -> Turn:
    while True:
        fu, tu = g._unit_pair()
        t = g.convert(True, fu=fu, tu=tu)
        if t.category == "tool_convert":
            return t


def _ok_calc(g: Generator) -> Turn:
    while True:
        t = g.calc(True, e=g._expression())
        if t.category == "tool_calc":
            return t


def _item(t: Turn, tools: bool, ident: str, category: str) -> dict:
    return {"id": ident, "category": category, "messages": [{"role": "user", "content": t.user}],
            "tools": tools, "enable_thinking": True, "needs_tools": bool(t.expect.get("calls")),
            "expect": t.expect}


def heldout_prompts(seed: int, per_category: int = 8, scope_n: int = 24) -> list[dict]:
    """Held-out single-turn prompts (held-out phrasings) with the checks of their answers,
    followed by ``scope_n`` out-of-scope prompts (category ``scope``).

    Each item: ``{"id", "category", "messages": [{"role": "user", ...}], "tools": bool,
    "enable_thinking": True, "needs_tools": bool, "expect": {...}}`` (see :class:`Turn`).
    """
    g = Generator(seed + 10_000, split="heldout")
    out: list[dict] = []
    seen: set[str] = set()
    for cat, make, tools in SINGLE_CATEGORIES:
        k = 0
        while k < per_category:
            t = make(g)
            if t.user in seen:
                continue
            seen.add(t.user)
            out.append(_item(t, tools, f"{cat}-{len(out)}", cat))
            k += 1
    kinds = list(SCOPE["heldout"])
    k = 0
    while k < scope_n:
        t = g.scope(True, kinds[k % len(kinds)])
        if t.user in seen:
            continue
        seen.add(t.user)
        out.append(_item(t, k % 3 != 2, f"scope-{len(out)}", "scope"))
        k += 1
    return out


def heldout_scripts(seed: int, n: int = 48) -> list[dict]:
    """Held-out multi-round tool scripts: 2-3 user turns with tools, each with its checks.

    Each item: ``{"id", "kind", "tools": True, "enable_thinking": True, "turns": [{"user",
    "expect"}]}``. Replies are not stored: an evaluator sends each user turn, runs the app's
    reply runner with the real tools and builds the history as the app does.
    """
    g = Generator(seed + 20_000, split="heldout")
    kinds = ["country_field", "country_other", "time_other", "convert_again", "calc_op",
             "calc_convert", "two_times", "two_countries", "error_then", "thanks_after"]
    out = []
    seen: set[str] = set()
    i = 0
    while len(out) < n:
        kind = kinds[i % len(kinds)]
        i += 1
        g.call_no = 0
        if kind == "country_field":
            first = g.rng.choice([g.population, g.info])(True)
            f = None
            while f is None or f.expect.get("calls"):
                f = g.follow_up(first, True)
            turns = [first, f]
        elif kind == "country_other":
            first = g.fact(True)
            f = None
            while f is None or not f.expect.get("calls") or f.category != first.category:
                f = g.follow_up(first, True)
            turns = [first, f]
        elif kind == "time_other":
            first = g.time(True)
            turns = [first, g.follow_up(first, True)]
        elif kind == "convert_again":
            first = _ok_convert(g)
            f = g.follow_up(first, True)
            if f is None or f.category != "tool_convert":
                continue
            turns = [first, f]
        elif kind in ("calc_op", "calc_convert"):
            first = _ok_calc(g)
            f = None
            for _ in range(20):
                f = g.follow_up(first, True)
                if f is not None and (f.expect["calls"][0]["name"] == "calculator") == (
                        kind == "calc_op") and "Sorry" not in str(f.expect.get("contains")):
                    break
                f = None
            if f is None:
                continue
            turns = [first, f]
        elif kind == "two_times":
            turns = [g.two_times(True)]
            turns.append(g.thanks(True))
        elif kind == "two_countries":
            turns = [g.two_countries(True), g.thanks(True)]
        elif kind == "error_then":
            turns = [g.bad_country(True), g.population(True)]
        else:
            first = g.rng.choice([g.time, g.population, g.info])(True)
            turns = [first, g.thanks(True)]
        key = "|".join(t.user for t in turns)
        if key in seen:
            continue
        seen.add(key)
        out.append({"id": f"script-{len(out)}-{kind}", "kind": kind, "tools": True,
                    "enable_thinking": True,
                    "turns": [{"user": t.user, "category": t.category, "expect": t.expect}
                              for t in turns]})
    return out


def heldout_user_texts(prompts: list[dict], scripts: list[dict]) -> set[str]:
    """Every user text of the held-out sets."""
    texts = {it["messages"][0]["content"] for it in prompts}
    for s in scripts:
        texts |= {t["user"] for t in s["turns"]}
    return texts


def main() -> None:
    """Print a few sample chats as JSON (a quick look at the corpus)."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-n", type=int, default=3)
    args = p.parse_args()
    g = Generator(args.seed)
    for _ in range(args.n):
        c = g.chat()
        print(json.dumps({"tools": c.tools, "thinking": c.enable_thinking,
                          "messages": c.messages()}, ensure_ascii=False, indent=1)[:3000])
        print("-" * 40)


if __name__ == "__main__":
    main()

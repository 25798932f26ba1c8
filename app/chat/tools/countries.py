"""The ``country_info`` tool: facts about a country from ``resources/data/countries.json``.

The data file is the app's closed world of country facts (the bundled demo model's training
corpus is generated from the same file). Each record holds ``name``, ``capital``,
``continent``, ``currency`` (``{"name", "code"}``, ISO 4217), ``languages`` (list),
``population`` (approximate integer) with ``population_year``, and ``aliases``.
Lookup is case-insensitive, ignores accents, a leading "the" and punctuation, and matches
aliases ("USA", "Holland").
"""

from __future__ import annotations

import difflib
import functools
import json
import re
import unicodedata
from pathlib import Path

from app.chat.tools.base import ToolError
from app.paths import resource_path

RESULT_FIELDS = (
    "name",
    "capital",
    "continent",
    "currency",
    "languages",
    "population",
    "population_year",
)
"""The record fields :func:`country_info` returns, in order."""


def data_path() -> Path:
    """Path of the bundled ``countries.json``."""
    return resource_path("data", "countries.json")


@functools.lru_cache(maxsize=4)
def load_countries(path: str | None = None) -> tuple[dict, ...]:
    """All country records from ``path`` (default :func:`data_path`), in file order.

    Raises :class:`ToolError` when the file is missing or not in the expected form.
    """
    p = Path(path) if path else data_path()
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ToolError(f"the country data file is missing: {p}") from None
    except (OSError, ValueError) as exc:
        raise ToolError(f"the country data file cannot be read: {exc}") from None
    records = data.get("countries") if isinstance(data, dict) else None
    if not isinstance(records, list):
        raise ToolError(f"the country data file has no 'countries' list: {p}")
    return tuple(records)


def normalize_name(text: str) -> str:
    """The lookup key of a country name: accents stripped, case-folded, '&' -> 'and',
    punctuation dropped, a leading 'the' removed, spaces collapsed."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).casefold()
    text = text.replace("&", " and ")
    text = re.sub(r"[^\w\s]", " ", text)
    words = text.split()
    if words and words[0] == "the":
        words = words[1:]
    return " ".join(words)


@functools.lru_cache(maxsize=4)
def _index(path: str | None = None) -> dict[str, dict]:
    index: dict[str, dict] = {}
    for record in load_countries(path):
        for name in [record["name"], *record.get("aliases", [])]:
            index.setdefault(normalize_name(name), record)
    return index


def find_country(name: str, path: str | None = None) -> dict | None:
    """The record whose name or alias matches ``name`` (see :func:`normalize_name`), or None."""
    return _index(path).get(normalize_name(name))


def country_info(name: str) -> dict:
    """Tool entry point: the facts for country ``name`` (fields :data:`RESULT_FIELDS`).

    Raises :class:`ToolError` for an unknown name, suggesting at most three close names.
    """
    if not isinstance(name, str) or not normalize_name(name):
        raise ToolError("the country name is empty")
    if len(name) > 100:
        raise ToolError("the country name is too long")
    record = find_country(name)
    if record is None:
        close = difflib.get_close_matches(normalize_name(name), list(_index()), n=3, cutoff=0.75)
        names = []
        for key in close:
            n = _index()[key]["name"]
            if n not in names:
                names.append(n)
        hint = f"; did you mean {', '.join(names)}?" if names else ""
        raise ToolError(f"no country named '{name.strip():.60}' in the app's data{hint}")
    return {k: record[k] for k in RESULT_FIELDS}


PARAMETERS = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "description": 'The country\'s name in English, e.g. "France", "Japan", "USA".',
        }
    },
    "required": ["name"],
}
DESCRIPTION = (
    "Look up a country's capital, continent, currency, official languages and approximate "
    "population."
)

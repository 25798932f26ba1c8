"""Example prompts a model folder ships for its first screen: ``examples.json`` beside the
weights, ``[{"prompt": str, "needs_tools": bool}, ...]``. Qt-free and MLX-free.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

EXAMPLES_FILE = "examples.json"
MAX_EXAMPLES = 8
"""The first screen shows at most this many."""


@dataclass(frozen=True)
class Example:
    """One example prompt; ``needs_tools``: the answer comes from a tool (countries,
    calculator, units, time), so tools must be on."""

    prompt: str
    needs_tools: bool = False


def read_examples(folder: str | Path) -> list[Example]:
    """The examples of a model folder ([] when the file is absent or unreadable; entries
    without a non-empty string ``prompt`` are skipped; a problem is logged, never raised)."""
    path = Path(folder) / EXAMPLES_FILE
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("%s is not readable JSON (%s): no examples", path, exc)
        return []
    if not isinstance(data, list):
        log.warning("%s is not a list: no examples", path)
        return []
    out = []
    for item in data:
        if isinstance(item, dict) and isinstance(item.get("prompt"), str) and \
                item["prompt"].strip():
            out.append(Example(item["prompt"].strip(), bool(item.get("needs_tools", False))))
    return out[:MAX_EXAMPLES]


DEMO_ABOUT = ("The bundled demo pair: a small model made for this app. It knows countries "
              "(capitals, currencies, languages, population), arithmetic, unit conversions and "
              "the time in a city, using the app's tools for facts. It is tiny, so it is fast "
              "and often wrong outside those topics. It learned chats of up to about 40 turns "
              "within its 4,096-token context: start a new chat when answers go astray.")
"""What the first screen says about the bundled demo pair."""

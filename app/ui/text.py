"""Small wording helpers for what the window shows: counts with the right plural, messages
that start with a capital letter and end with a full stop, numbers with thousands separators.
"""

from __future__ import annotations

import re
import unicodedata

from app.engine import modes


def plural(n: int, word: str, many: str | None = None) -> str:
    """``"1 token"``, ``"2 tokens"`` (``many``: the plural when it is not ``word + "s"``)."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def sentence(text: str) -> str:
    """``text`` as a sentence: first letter upper case, a full stop at the end (unless it
    already ends with punctuation). Paths or names at the start are left alone when they
    begin with ``/`` or a digit."""
    text = str(text).strip()
    if not text:
        return text
    if text[0].isalpha() and text[0].islower():
        text = text[0].upper() + text[1:]
    if text[-1] not in ".!?…:)\"”'":
        text += "."
    return text


_UNSAFE_IN_NAMES = re.compile(r'[\x00-\x1f/\\:*?"<>|]')


_RESERVED_STEMS = re.compile(r"^(con|prn|aux|nul|com[0-9¹²³]|lpt[0-9¹²³])$", re.IGNORECASE)
"""Names Windows keeps for devices, whatever the suffix (``CON.md`` cannot be made)."""


def file_name(title: str, limit: int = 40) -> str:
    """``title`` as one file name without a suffix, safe on macOS, Linux and Windows: path
    separators and the characters Windows refuses (``/ \\ : * ? " < > |``, control
    characters) become ``-`` (none at either end: a title's closing ``?`` is left out),
    invisible format characters (``U+202E`` right-to-left override, zero-width spaces, bidi
    isolates: they make a name read as another) are left out, runs of white space one space,
    at most ``limit`` characters, a ``_`` after a stem Windows reserves for a device
    (``CON``, ``NUL``, ``COM1``, ...), ``"chat"`` when nothing is left
    (``"Convert km/h?"`` -> ``"Convert km-h"``)."""
    shown = "".join(ch for ch in title if unicodedata.category(ch) != "Cf")
    name = _UNSAFE_IN_NAMES.sub("-", " ".join(shown.split()))[:limit].strip(" .-")
    stem, dot, rest = name.partition(".")
    if _RESERVED_STEMS.match(stem.rstrip()):
        name = f"{stem.rstrip()}_{dot}{rest}"
    return name or "chat"


_BIG_INT = re.compile(r"(?<![\w.,])([1-9]\d{4,})(?![\w.,])")


def group_digits(text: str) -> str:
    """Whole numbers of five or more digits in ``text`` with thousands separators
    (``"19600000 people"`` -> ``"19,600,000 people"``); years, decimals and ids stay."""
    return _BIG_INT.sub(lambda m: f"{int(m.group(1)):,}", text)


def seconds_text(seconds: float) -> str:
    """A duration in ``seconds`` as the figures show it: whole milliseconds under a second
    (``"19 ms"``), seconds with two decimals from one second on (``"1.37 s"``)."""
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


mode_label = modes.label
"""``"Plain"``, ``"DFlash"`` or ``"DFlash2"`` for a mode (others as given): the Mode table's."""

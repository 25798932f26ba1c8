"""The one Mode table: its rows, and no second definition of the mode set in app/."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.engine.modes import (
    DRAFTER_MODES,
    DRAFTING_MODES,
    MODES,
    Mode,
    drafter_mode,
    label,
    needs_drafter,
)

APP = Path(__file__).resolve().parent.parent / "app"


def test_the_table():
    assert MODES == (Mode.PLAIN, Mode.DFLASH, Mode.DFLASH2, Mode.LOOKUP)
    assert [m.label for m in MODES] == ["Plain", "DFlash", "DFlash2", "Lookup"]
    assert DRAFTING_MODES == (Mode.DFLASH, Mode.DFLASH2, Mode.LOOKUP)
    # lookup drafts (tau, acceptance apply) but needs no drafter model
    assert DRAFTER_MODES == (Mode.DFLASH, Mode.DFLASH2)
    assert Mode.LOOKUP.drafts and not Mode.LOOKUP.needs_drafter
    assert needs_drafter("dflash") and not needs_drafter("lookup")
    assert not needs_drafter("plain") and not needs_drafter(None) and not needs_drafter("x")
    # a member is its stored / JSON / CLI value
    assert Mode.DFLASH == "dflash" and "dflash2" in DRAFTING_MODES and {"plain": 1}[Mode.PLAIN]
    assert "dflash" in DRAFTING_MODES and "plain" not in DRAFTING_MODES
    assert None not in DRAFTING_MODES and "x" not in DRAFTING_MODES
    assert label("dflash2") == "DFlash2" and label("lookup") == "Lookup"
    assert label("fast") == "fast"


def test_the_type_names_the_same_values():
    from typing import get_args

    from app.engine.modes import ModeName

    assert get_args(ModeName) == tuple(m.value for m in MODES)


def test_parse_names_the_modes():
    assert Mode.parse("dflash2") is Mode.DFLASH2
    with pytest.raises(ValueError, match="plain, dflash, dflash2, lookup, not 'fast'"):
        Mode.parse("fast")


def test_a_drafter_says_its_mode():
    assert drafter_mode(SimpleNamespace(config=SimpleNamespace(kind="dflash2"))) is Mode.DFLASH2
    assert drafter_mode(SimpleNamespace(config=SimpleNamespace())) is Mode.DFLASH
    assert drafter_mode(SimpleNamespace(kind="dflash2")) is Mode.DFLASH2
    assert drafter_mode(None) is Mode.DFLASH


def test_no_second_definition_of_the_modes():
    """The mode set, the drafting set, the labels and the drafter-kind lookup live in
    app/engine/modes.py only."""
    patterns = [
        re.compile(r'\(\s*"plain",\s*"dflash",\s*"dflash2"\s*\)'),  # the mode set
        re.compile(r'\(\s*"dflash",\s*"dflash2"\s*\)'),  # the drafting set
        re.compile(r'"dflash2":\s*"DFlash2"'),  # a label table
        re.compile(r'getattr\([^)]*"kind"'),  # a drafter's kind read by hand
    ]
    found = []
    for path in APP.rglob("*.py"):
        if path.name == "modes.py" and path.parent.name == "engine":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if any(p.search(line) for p in patterns):
                found.append(f"{path.relative_to(APP)}:{n}: {line.strip()}")
    assert found == [], "\n".join(found)

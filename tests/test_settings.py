"""app.chat.settings: one table of names, defaults and ranges; typed sampling; errors that name
the setting."""

from __future__ import annotations

import pytest

from app.chat.settings import (
    DEFAULTS,
    RANGES,
    ReplySettings,
    Sampling,
    SettingError,
    coerce,
    reply_settings,
    reply_values,
)


def test_coerce_reads_stored_strings_and_checks_ranges():
    assert coerce("max_tokens", "77") == 77 and coerce("thinking", "false") is False
    assert coerce("stop_strings", "END\n###") == ["END", "###"]
    assert coerce("temperature", 5, clamp=True) == RANGES["temperature"][1]
    with pytest.raises(SettingError, match="temperature 5.0 is out of range"):
        coerce("temperature", 5)
    with pytest.raises(SettingError, match="max_tokens must be a number"):
        coerce("max_tokens", "abc")
    with pytest.raises(SettingError, match="min_p must be a finite number"):
        coerce("min_p", "nan")
    with pytest.raises(SettingError, match="rollback must be one of tape, replay"):
        coerce("rollback", "rewind")
    with pytest.raises(SettingError, match="unknown setting 'temprature'"):
        coerce("temprature", 0.5)


def test_sampling_from_stored_values_maps_off_values():
    s = Sampling.from_values({"temperature": 0.7, "repetition_penalty": 1.0, "seed": -1})
    assert s == Sampling(temperature=0.7, top_p=1.0, top_k=0, min_p=0.0,
                         repetition_penalty=None, seed=None)
    assert not s.greedy and Sampling().greedy
    assert Sampling.from_values({"seed": 7, "repetition_penalty": 1.1}).generation_kwargs() == {
        "temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
        "repetition_penalty": 1.1, "seed": 7}


def test_reply_settings_from_window_values():
    values = reply_values(dict(DEFAULTS, temperature=0.5, stop_strings=["END"], seed=3,
                               use_tools=False), "dflash")
    rs = reply_settings(values)
    assert isinstance(rs, ReplySettings) and rs.mode == "dflash"
    assert rs.block_size is None and rs.stop == ["END"] and rs.enable_thinking is True
    assert rs.sampling == Sampling(temperature=0.5, seed=3)
    assert rs.tools is None and not rs.run_tools
    assert reply_settings(dict(values, use_tools=True)).run_tools


def test_a_typo_is_an_error_not_dropped():
    with pytest.raises(SettingError, match="unknown setting: temprature"):
        reply_settings({"mode": "plain", "temprature": 0.5})
    with pytest.raises(SettingError, match="top_p"):
        reply_settings({"mode": "plain", "top_p": 0})

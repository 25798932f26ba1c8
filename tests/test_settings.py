"""app.chat.settings: one table of names, defaults and ranges; typed sampling; errors that name
the setting."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields, replace

import pytest

from app.chat.settings import (
    DEFAULTS,
    RANGES,
    SAMPLING_KEYS,
    SPECS,
    ReplySettings,
    Sampling,
    SettingError,
    as_reply_settings,
    coerce,
    defaults,
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


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "turbo"}, "mode must be one of plain, dflash, dflash2"),
    ({"max_tokens": 0}, "max_tokens 0 is out of range: it must be between 1 and 131072"),
    ({"max_tokens": 1.5}, "max_tokens must be a whole number"),
    ({"max_tokens": True}, "max_tokens must be a whole number"),
    ({"block_size": 0}, "block_size must be at least 1"),
    ({"rollback": "rewind"}, "rollback must be one of tape, replay"),
    ({"fast_verify": "yes"}, "fast_verify must be true or false"),
    ({"stop": ["END", 3]}, "stop must be a list of strings"),
    ({"max_tool_rounds": -1}, "max_tool_rounds must be at least 0"),
    ({"tool_timeout_s": 0}, "tool_timeout_s must be above 0"),
    ({"sampling": {"temperature": 0.5}}, "sampling must be a Sampling"),
])
def test_reply_settings_refuse_bad_values_on_construction(kwargs, match):
    with pytest.raises(SettingError, match=match):
        ReplySettings(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": 2.5}, "temperature 2.5 is out of range: it must be between 0 and 2"),
    ({"temperature": float("nan")}, "temperature must be a finite number"),
    ({"top_p": 0}, "top_p 0 is out of range"),
    ({"top_k": 2.5}, "top_k must be a whole number"),
    ({"min_p": 1.5}, "min_p 1.5 is out of range"),
    ({"repetition_penalty": 0.5}, "repetition_penalty 0.5 is out of range"),
    ({"seed": -2}, "seed must be at least 0"),
    ({"seed": 2**40}, "it must be between -1 and 2147483647$"),  # not 2.14748e+09
])
def test_sampling_refuses_values_outside_the_table(kwargs, match):
    with pytest.raises(SettingError, match=match):
        Sampling(**kwargs)


def test_the_record_takes_a_mode_value_as_its_mode_member():
    from app.engine.modes import Mode

    rs = ReplySettings(mode="dflash2")
    assert rs.mode is Mode.DFLASH2 and rs.mode == "dflash2"
    assert replace(rs, mode="plain").mode is Mode.PLAIN and rs.mode is Mode.DFLASH2
    with pytest.raises(FrozenInstanceError):
        rs.max_tokens = 3


def test_from_values_is_the_window_values_through_the_dict_path():
    values = dict(DEFAULTS, temperature=0.7, block_size=0, seed=-1, thinking=False,
                  system_prompt="Be brief.", use_tools=False)
    rs = ReplySettings.from_values(values, "dflash")
    assert rs == reply_settings(reply_values(values, "dflash"))
    assert rs.block_size is None and rs.sampling.seed is None and rs.enable_thinking is False
    assert rs.system_prompt == "Be brief." and rs.max_tokens == DEFAULTS["max_tokens"]
    with pytest.raises(SettingError, match="max_tokens 0 is out of range"):
        ReplySettings.from_values(dict(values, max_tokens=0), "plain")
    assert as_reply_settings(rs) is rs
    assert as_reply_settings({"mode": "plain"}) == ReplySettings()
    with pytest.raises(SettingError, match="must be a ReplySettings"):
        as_reply_settings(["plain"])


def test_defaults_come_from_the_one_table():
    """The record's, the engine's and the CLI's defaults are the table's."""
    from app.cli import build_parser
    from app.engine.generate import GenerationConfig

    table = {name: spec.default for name, spec in SPECS.items()}
    rs = ReplySettings()
    assert rs.max_tokens == table["max_tokens"] == GenerationConfig().max_tokens
    assert rs.rollback == table["rollback"] == GenerationConfig().rollback
    assert rs.fast_verify == table["fast_verify"] == GenerationConfig().fast_verify
    assert rs.sampling == Sampling() == Sampling.from_values({})  # the table's defaults
    engine = GenerationConfig()
    assert Sampling().generation_kwargs() == {k: getattr(engine, k) for k in SAMPLING_KEYS}
    assert SAMPLING_KEYS == tuple(f.name for f in fields(Sampling))
    assert ReplySettings.from_values(defaults(), "plain").max_tokens == table["max_tokens"]
    args = build_parser().parse_args(["chat"])
    assert args.max_tokens == table["max_tokens"] and args.rollback == table["rollback"]
    assert args.temp == table["temperature"]


def test_every_value_the_table_allows_passes_the_engines_own_check():
    """The engine's sampling check is wider than the table (it refuses only what mlx-lm's
    sampler cannot run); every bound of the table passes it."""
    from types import SimpleNamespace

    from app.engine.generate import GenerationConfig, _check_sampling

    weight = SimpleNamespace(shape=(SPECS["top_k"].high + 1, 8))
    target = SimpleNamespace(model=SimpleNamespace(model=SimpleNamespace(
        embed_tokens=SimpleNamespace(weight=weight))))
    for bound in ("low", "high"):
        values = {k: getattr(SPECS[k], bound) for k in ("temperature", "top_p", "top_k",
                                                         "min_p", "repetition_penalty",
                                                         "seed")}
        values["top_k"] = int(values["top_k"])
        values["seed"] = int(values["seed"])
        kwargs = Sampling.from_values(values).generation_kwargs()
        _check_sampling(GenerationConfig(**kwargs), target)  # raises GenerationError if not
    from app.engine.errors import GenerationError

    with pytest.raises(GenerationError, match="temperature"):
        _check_sampling(GenerationConfig(temperature=-0.1), target)


def test_a_drafter_without_a_block_size_drafts_the_one_default():
    """None in the settings means the drafter's block size, and a drafter config that names
    none has :data:`app.engine.drafter.DEFAULT_BLOCK_SIZE`."""
    from app.engine.drafter import DEFAULT_BLOCK_SIZE, DrafterConfig

    cfg = {"architectures": ["DFlashDraftModel"], "hidden_size": 16, "intermediate_size": 32,
           "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
           "head_dim": 8, "vocab_size": 32, "rope_theta": 10000.0,
           "dflash_config": {"mask_token_id": 31, "target_layer_ids": [0, 1]}}
    assert DrafterConfig.from_dict(cfg).block_size == DEFAULT_BLOCK_SIZE == 16
    cfg["dflash_config"]["block_size"] = 4
    assert DrafterConfig.from_dict(cfg).block_size == 4
    assert ReplySettings().block_size is None and SPECS["block_size"].default == 0

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
    with pytest.raises(SettingError, match="temperature 5.0 is out of range"):
        coerce("temperature", 5)  # refused, never clamped to the bound
    with pytest.raises(SettingError, match="system_prompt has no value"):
        coerce("system_prompt", None)  # never the text "None"
    with pytest.raises(SettingError, match="system_prompt must be text, got 5"):
        coerce("system_prompt", 5)
    with pytest.raises(SettingError, match="max_tokens must be a number, got True"):
        coerce("max_tokens", True)
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


# ------------------------------------------------------------------ the preferences file
def _bound_text(x: float) -> str:
    """A range's end as a hand-edited settings.ini line writes it."""
    return str(int(x)) if float(x).is_integer() else repr(x)


_INT_5 = r"@Variant(\0\0\0\x2\0\0\0\x5)"  # QSettings' own int 5: no text, no list
_BAD_STORED = [  # (setting, the value as settings.ini holds it, as the warning shows it)
    ("system_prompt", "@Invalid()", "@Invalid()"),
    ("system_prompt", _INT_5, "5"),
    ("max_tokens", "-5", "'-5'"),
    ("max_tokens", "0", "'0'"),
    ("max_tokens", "131073", "'131073'"),
    ("max_tokens", "1.5", "'1.5'"),
    ("max_tokens", "abc", "'abc'"),
    ("max_tokens", "inf", "'inf'"),
    ("max_tokens", "@Invalid()", "@Invalid()"),
    ("block_size", "-1", "'-1'"),
    ("block_size", "65", "'65'"),
    ("block_size", "@Invalid()", "@Invalid()"),
    ("auto_block", "maybe", "'maybe'"),
    ("auto_block", "@Invalid()", "@Invalid()"),
    ("rollback", "rewind", "'rewind'"),
    ("rollback", "@Invalid()", "@Invalid()"),
    ("fast_verify", "2", "'2'"),
    ("thinking", "", "''"),
    ("thinking", "@Invalid()", "@Invalid()"),
    ("stop_strings", "@Invalid()", "@Invalid()"),
    ("stop_strings", _INT_5, "5"),
    ("use_tools", "yes", "'yes'"),
    ("temperature", "-5", "'-5'"),
    ("temperature", "2.01", "'2.01'"),
    ("temperature", "nan", "'nan'"),
    ("top_p", "0", "'0'"),
    ("top_p", "1.5", "'1.5'"),
    ("top_p", "@Invalid()", "@Invalid()"),
    ("top_k", "-3", "'-3'"),
    ("top_k", "100001", "'100001'"),
    ("top_k", "2.5", "'2.5'"),
    ("min_p", "7", "'7'"),
    ("min_p", "-0.1", "'-0.1'"),
    ("repetition_penalty", "0.5", "'0.5'"),
    ("repetition_penalty", "2.5", "'2.5'"),
    ("seed", "-2", "'-2'"),
    ("seed", "2147483648", "'2147483648'"),
    ("seed", "-inf", "'-inf'"),
]


def _preferences(tmp_path, lines: list[str]):
    """A settings.ini with these lines in its ``[generation]`` group, as QSettings reads it."""
    from PySide6.QtCore import QSettings

    path = tmp_path / "settings.ini"
    path.write_text("[generation]\n" + "".join(f"{line}\n" for line in lines),
                    encoding="utf-8")
    return QSettings(str(path), QSettings.IniFormat)


def test_every_setting_has_bad_stored_values_in_the_table():
    assert {key for key, _, _ in _BAD_STORED} == set(SPECS)


@pytest.mark.parametrize("key, stored, shown", _BAD_STORED)
def test_a_bad_stored_value_keeps_the_default_with_one_warning(tmp_path, caplog, key, stored,
                                                               shown):
    """Out of range (not clamped to the bound), of the wrong type, or QSettings' invalid value:
    the table's default, and one warning naming the key, the stored value and the default."""
    from app.ui.settings import load_defaults

    qs = _preferences(tmp_path, [f"{key}={stored}"])
    with caplog.at_level("WARNING", logger="app.ui.settings"):
        values = load_defaults(qs)
    assert values == defaults()
    assert values["system_prompt"] != "None"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert f"generation/{key} = {shown} is not usable" in warnings[0]
    assert warnings[0].endswith(f"using the default {DEFAULTS[key]!r}")


def test_valid_stored_values_load_unchanged_at_the_range_edges(tmp_path, caplog):
    from app.ui.settings import load_defaults

    for bound in ("low", "high"):
        lines = [f"{k}={_bound_text(getattr(SPECS[k], bound))}" for k in RANGES]
        lines += ["system_prompt=Be brief, please.", "stop_strings=END, ###",
                  f"rollback={SPECS['rollback'].choices[-1]}", "auto_block=true",
                  "fast_verify=true", "thinking=false", "use_tools=false"]
        with caplog.at_level("WARNING", logger="app.ui.settings"):
            values = load_defaults(_preferences(tmp_path, lines))
        assert {k: values[k] for k in RANGES} == {k: getattr(SPECS[k], bound) for k in RANGES}
        assert all(type(values[k]) is type(DEFAULTS[k]) for k in DEFAULTS)
        assert values["system_prompt"] == "Be brief, please."  # the INI's list, read back
        assert values["stop_strings"] == ["END", "###"]
        assert values["rollback"] == SPECS["rollback"].choices[-1]
        assert values["auto_block"] is values["fast_verify"] is True
        assert values["thinking"] is values["use_tools"] is False
    empty = load_defaults(_preferences(tmp_path, ["system_prompt=", "stop_strings="]))
    assert empty["system_prompt"] == "" and empty["stop_strings"] == []
    assert not [r for r in caplog.records if r.levelname == "WARNING"]

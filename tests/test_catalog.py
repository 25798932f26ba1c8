"""The model catalog: HF cache scan, folders, pairing, memory estimate, ``models`` CLI.

Fixture repos are written by hand in the hub cache layout
(``models--org--name/{blobs,snapshots/<rev>,refs/main}``) with the tiny configs of
``app.models.tiny`` and a small safetensors file; no MLX is needed.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from app.engine.errors import ModelLoadError, ModelNotFoundError, PairMismatchError
from app.models import catalog as cat
from app.models.tiny import drafter_config, target_config

REV = "0123456789abcdef0123456789abcdef01234567"


def _weights_bytes(tmp: Path, n: int) -> bytes:
    path = tmp / f"w{n}.safetensors"
    save_file({"w": np.arange(n, dtype=np.float32)}, str(path))
    return path.read_bytes()


def make_cache_repo(cache: Path, repo_id: str, files: dict[str, bytes], rev: str = REV) -> Path:
    """Write a repo into ``cache`` the way huggingface_hub does (blobs + symlinks + refs)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / rev
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).symlink_to(Path("../../blobs") / blob.name)
    return snap


def make_folder_model(folder: Path, config: dict, weights: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(weights)
    return folder


def tiny_target_config() -> dict:
    return target_config("qwen3_5", vocab_size=300, eos_id=299)


@pytest.fixture
def tiny_configs():
    t = tiny_target_config()
    d = drafter_config(t, mask_id=298, block_size=8, taps=[1, 3], sliding=True)
    return t, d


@pytest.fixture
def hf_home(tmp_path, monkeypatch, tiny_configs):
    """A temporary HF_HOME with a target, its drafter and a mismatched drafter."""
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    cache = home / "hub"
    t, d = tiny_configs
    w = _weights_bytes(tmp_path, 64)
    make_cache_repo(cache, "org/tiny-target", {"config.json": json.dumps(t).encode(),
                                                "model.safetensors": w})
    make_cache_repo(cache, "org/tiny-dflash", {"config.json": json.dumps(d).encode(),
                                                "model.safetensors": _weights_bytes(tmp_path, 8)})
    bad = {**d, "hidden_size": 128}
    make_cache_repo(cache, "org/other-dflash", {"config.json": json.dumps(bad).encode(),
                                                 "model.safetensors": _weights_bytes(tmp_path, 9)})
    # Not a model this app can use: no weights, and an unsupported model_type.
    make_cache_repo(cache, "org/no-weights", {"config.json": json.dumps(t).encode()})
    make_cache_repo(cache, "org/bert", {"config.json": b'{"model_type": "bert"}',
                                        "model.safetensors": w})
    return home


def make_catalog(tmp_path, **kw) -> cat.Catalog:
    return cat.Catalog(data_dir=tmp_path / "data", bundled=kw.pop("bundled", ()), **kw)


def test_scan_finds_target_and_drafter_in_hf_home_and_pairs_them(hf_home, tmp_path):
    catalog = make_catalog(tmp_path)
    assert catalog.cache_dir == hf_home / "hub"
    scan = catalog.scan()
    assert [t.name for t in scan.targets] == ["org/tiny-target"]
    assert sorted(d.name for d in scan.drafters) == ["org/other-dflash", "org/tiny-dflash"]
    target = scan.targets[0]
    assert target.source == "cache" and target.revision == REV
    assert target.path == hf_home / "hub" / "models--org--tiny-target" / "snapshots" / REV
    assert target.model_type == "qwen3_5"
    # size on disk: the blobs (config + weights)
    blobs = hf_home / "hub" / "models--org--tiny-target" / "blobs"
    assert target.size_bytes == sum(p.stat().st_size for p in blobs.iterdir())
    assert [d.name for d in catalog.drafters_for(target)] == ["org/tiny-dflash"]
    skipped = dict(scan.skipped)
    assert "no *.safetensors" in skipped["org/no-weights"]
    assert "bert" in skipped["org/bert"]


def test_mismatched_drafter_is_refused_with_the_field_named(hf_home, tmp_path):
    catalog = make_catalog(tmp_path)
    target = catalog.find("org/tiny-target")
    checks = {c.drafter.name: c for c in catalog.pair_checks(target)}
    bad = checks["org/other-dflash"]
    assert not bad.fits and bad.field == "hidden_size"
    assert "hidden_size" in bad.reason and "128" in bad.reason and "64" in bad.reason
    assert checks["org/tiny-dflash"].fits
    # fitting drafters are listed first
    assert catalog.pair_checks(target)[0].drafter.name == "org/tiny-dflash"


def test_hf_hub_cache_env_wins_over_hf_home(hf_home, tmp_path, monkeypatch):
    other = tmp_path / "other-cache"
    other.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(other))
    catalog = make_catalog(tmp_path)
    assert catalog.cache_dir == other
    assert catalog.scan().targets == []


@pytest.mark.parametrize(
    "change, field",
    [
        ({"vocab_size": 512}, "vocab_size"),
        ({"hidden_size": 32}, "hidden_size"),
        ({"num_target_layers": 7}, "num_target_layers"),
        ({"dflash_config": {"block_size": 8, "mask_token_id": 1, "target_layer_ids": [1, 6]}},
         "target_layer_ids"),
        ({"dflash_config": {"block_size": 8, "mask_token_id": 300, "target_layer_ids": [1, 3]}},
         "mask_token_id"),
    ],
)
def test_check_pair_configs_names_each_field(tiny_configs, change, field):
    t, d = tiny_configs
    cat.check_pair_configs(t, d)  # the matching pair passes
    with pytest.raises(PairMismatchError) as info:
        cat.check_pair_configs(t, {**d, **change})
    assert info.value.field == field


def test_check_pair_reads_text_config_and_top_level_dflash_fields():
    # Qwen3.5 as published: the language fields sit under text_config; an older drafter keeps
    # block_size/taps at the top level.
    target = {"model_type": "qwen3_5", "text_config": {"vocab_size": 248320, "hidden_size": 2560,
                                                     "num_hidden_layers": 32}}
    drafter = {"architectures": ["DFlashDraftModel"], "vocab_size": 248320, "hidden_size": 2560,
               "num_target_layers": 32, "block_size": 16, "mask_token_id": 248070,
               "target_layer_ids": [1, 8, 15, 22, 29]}
    cat.check_pair_configs(target, drafter)
    with pytest.raises(PairMismatchError) as info:
        cat.check_pair_configs(target, {**drafter, "target_layer_ids": [1, 8, 32]})
    assert info.value.field == "target_layer_ids" and "32" in str(info.value)


def test_folders_persist_and_bundled_pair_is_listed(tmp_path, tiny_configs, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    t, d = tiny_configs
    w = _weights_bytes(tmp_path, 16)
    bundled_t = make_folder_model(tmp_path / "res" / "demo-target", t, w)
    bundled_d = make_folder_model(tmp_path / "res" / "demo-dflash", d, w)
    mine = tmp_path / "mine"
    make_folder_model(mine / "a-target", {**t, "hidden_size": 32}, w)
    make_folder_model(mine / "a-dflash", {**d, "hidden_size": 32}, w)

    catalog = make_catalog(tmp_path, bundled=(bundled_t, bundled_d))
    found = catalog.add_folder(mine)
    assert sorted(e.name for e in found) == ["a-dflash", "a-target"]
    saved = json.loads((tmp_path / "data" / "model_folders.json").read_text())
    assert saved == {"folders": [str(mine.resolve())]}

    again = make_catalog(tmp_path, bundled=(bundled_t, bundled_d))  # a new session
    scan = again.scan()
    assert [(e.name, e.source) for e in scan.targets] == [("demo-target", "bundled"),
                                                          ("a-target", "folder")]
    demo = again.find("demo-target")
    assert [x.name for x in again.drafters_for(demo)] == ["demo-dflash"]
    a_target = again.find(str(mine / "a-target"))
    assert [x.name for x in again.drafters_for(a_target)] == ["a-dflash"]
    assert a_target.size_bytes == len(w) + len(json.dumps({**t, "hidden_size": 32}))

    assert again.remove_folder(mine) is True
    assert [e.name for e in again.scan().targets] == ["demo-target"]
    assert json.loads(again.folders_file.read_text()) == {"folders": []}


def test_add_folder_errors(tmp_path):
    catalog = make_catalog(tmp_path)
    with pytest.raises(ModelNotFoundError):
        catalog.add_folder(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="no MLX model"):
        catalog.add_folder(empty)
    assert catalog.folders() == []


def test_missing_folders_are_listed_and_removed_as_stored(tmp_path, monkeypatch):
    """An added folder no longer on disk (deleted, or on an unplugged drive) is in
    ``missing_folders`` (in the order added), and ``remove_folder`` given the path as the
    list stores it forgets it even where expanding and resolving would change it (a
    hand-written ``~/...``); the other folders stay, in their order."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    data = tmp_path / "data"
    data.mkdir()
    here = tmp_path / "here"
    here.mkdir()
    stored = [str(tmp_path / "gone"), "~/models-typed-by-hand", str(here)]
    (data / "model_folders.json").write_text(json.dumps({"folders": stored}))
    catalog = make_catalog(tmp_path)
    assert catalog.missing_folders() == [Path(stored[0]), Path(stored[1])]
    assert catalog.remove_folder(Path(stored[1])) is True
    assert json.loads(catalog.folders_file.read_text()) == {"folders": [stored[0], stored[2]]}
    assert catalog.remove_folder(stored[0]) is True
    assert catalog.missing_folders() == [] and catalog.folders() == [here]
    assert catalog.remove_folder(stored[0]) is False


def test_corrupt_folders_file_is_kept_aside_not_lost(tmp_path, tiny_configs):
    t, _ = tiny_configs
    data = tmp_path / "data"
    data.mkdir()
    (data / "model_folders.json").write_text("{not json")
    catalog = make_catalog(tmp_path)
    assert catalog.folders() == [] and "could not read" in catalog.folders_error
    model = make_folder_model(tmp_path / "m", t, _weights_bytes(tmp_path, 4))
    catalog.add_folder(model)
    assert (data / "model_folders.json.bad").read_text() == "{not json"
    assert json.loads((data / "model_folders.json").read_text())["folders"] == [str(model)]


def test_dflash_unavailable_reason(hf_home, tmp_path, tiny_configs):
    catalog = make_catalog(tmp_path)
    assert catalog.dflash_unavailable_reason(catalog.find("org/tiny-target")) is None
    t, _ = tiny_configs
    lone = make_folder_model(tmp_path / "lone", {**t, "vocab_size": 999},
                             _weights_bytes(tmp_path, 4))
    catalog.add_folder(lone)
    reason = catalog.dflash_unavailable_reason(catalog.find(str(lone)))
    assert "vocab_size" in reason and "plain decoding only" in reason


def test_cache_bytes_counts_attention_and_recurrent_layers(tiny_configs):
    t, d = tiny_configs  # 6 layers, full attention every 3rd: layers 2 and 5
    kv, state = cat.cache_bytes(t, 1000)
    assert kv == 2 * (2 * 2 * 16 * 1000 * 2)  # 2 layers x K,V x kv_heads x head_dim x ctx x bf16
    conv_dim = 2 * 2 * 16 + 4 * 16
    assert state == 4 * (4 * 16 * 16 * 4 + 3 * conv_dim * 2)
    # drafter: one sliding layer (window 32) + one full layer, float32
    dkv, dstate = cat.cache_bytes(d, 1000)
    assert dkv == 2 * 2 * 16 * 4 * (32 + 1000) and dstate == 0
    # Qwen3.5-4B-like published layout: 32 layers, 8 full-attention, 4 KV heads x 256
    q = {"model_type": "qwen3_5", "text_config": {"num_hidden_layers": 32,
         "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
         "hidden_size": 2560, "full_attention_interval": 4, "torch_dtype": "bfloat16"}}
    assert cat.cache_bytes(q, 262144)[0] == 8 * 2 * 4 * 256 * 262144 * 2


def test_memory_estimate_warns_above_75_percent(hf_home, tmp_path):
    catalog = make_catalog(tmp_path)
    target = catalog.find("org/tiny-target")
    drafter = catalog.find("org/tiny-dflash")
    est = cat.estimate_memory(target, drafter, context=1000, machine_bytes=10**9)
    assert est.weights_bytes == (target.path / "model.safetensors").stat().st_size
    kv, state = cat.cache_bytes(target.config, 1000)
    assert (est.kv_bytes, est.state_bytes) == (kv, state)
    assert est.total_bytes == est.weights_bytes + kv + state + est.drafter_bytes
    assert not est.warn and "of 1.0 GB" in est.message()
    # "drafter 20.3 MB" beside drafters of 6.6 MB and 864 KB read as a wrong sum (a new
    # user's pass): the figure holds their K/V at the context too, and says so
    dkv, _ = cat.cache_bytes(drafter.config, 1000)
    assert est.drafter_bytes == cat.drafter_weights_size(drafter) + dkv
    assert f"drafter weights and K/V {cat.format_bytes(est.drafter_bytes)}" in est.message()
    small = cat.estimate_memory(target, drafter, context=1000,
                                machine_bytes=int(est.total_bytes / 0.8))
    assert small.warn and "above 75%" in small.message()
    just = cat.estimate_memory(target, drafter, context=1000,
                               machine_bytes=int(est.total_bytes / 0.7))
    assert not just.warn


def test_machine_memory_is_read():
    n = cat.machine_memory_bytes()
    assert n is not None and n > 256 * 2**20


def test_known_pairs_table():
    by_drafter = {p.drafter_repo: p for p in cat.KNOWN_PAIRS}
    assert by_drafter["z-lab/Qwen3.5-4B-DFlash"].target_repo == "mlx-community/Qwen3.5-4B-4bit"
    assert by_drafter["z-lab/Qwen3.5-4B-DFlash"].thinking is True
    assert by_drafter["z-lab/Qwen3-8B-DFlash-b16"].thinking is False
    assert by_drafter["z-lab/Qwen3-4B-DFlash-b16"].thinking is False
    for size in ("9B", "27B", "35B-A3B"):
        assert f"z-lab/Qwen3.5-{size}-DFlash" in by_drafter
    assert "z-lab/Qwen3.6-35B-A3B-DFlash" in by_drafter
    assert cat.known_pair_for("MLX-community/qwen3.5-4b-4bit").drafter_repo == (
        "z-lab/Qwen3.5-4B-DFlash"
    )


def test_catalog_does_not_import_mlx(hf_home, tmp_path):
    import subprocess

    code = (
        "import sys; from app.models.catalog import Catalog; "
        f"c = Catalog(data_dir={str(tmp_path / 'd')!r}, bundled=()); "
        "s = c.scan(); [c.pair_checks(t) for t in s.targets]; "
        "print(len(s.targets), 'mlx' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], check=True)
    assert out.stdout.split() == ["1", "False"]


def test_models_cli_json(hf_home, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DFLASH_RESOURCES", str(tmp_path / "no-resources"))
    from app.cli import main

    assert main(["models", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    targets = {t["name"]: t for t in report["targets"]}
    assert targets["org/tiny-target"]["source"] == "cache"
    assert targets["org/tiny-target"]["drafters"] == ["org/tiny-dflash"]
    assert targets["org/tiny-target"]["not_fitting"][0]["field"] == "hidden_size"
    assert targets["org/tiny-target"]["path"].endswith(REV)
    mem = targets["org/tiny-target"]["memory"]
    kv, state = cat.cache_bytes(tiny_target_config(), 4096)
    assert (mem["kv_bytes"], mem["state_bytes"], mem["context_tokens"]) == (kv, state, 4096)
    assert mem["drafter_bytes"] > 0 and mem["message"].startswith("needs about")
    assert {d["name"] for d in report["drafters"]} == {"org/tiny-dflash", "org/other-dflash"}
    assert all(d["size_bytes"] > 0 for d in report["drafters"])
    assert len(report["known_pairs"]) == len(cat.KNOWN_PAIRS)

    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "org/tiny-target  [cache" in text and "fit: org/tiny-dflash" in text

    assert main(["models", "--add-folder", str(tmp_path / "nope")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_real_tiny_pair_from_the_cache_pairs_and_loads(tiny_root, tmp_path, monkeypatch):
    """A loadable tiny pair placed in the cache: the catalog pairs it, the engine loads the
    paths the catalog gives and agrees that the pair fits."""
    from app.models.loader import check_pair, load_drafter, load_target
    from app.models.tiny import build_tiny_pair

    t_dir, d_dir = build_tiny_pair(tiny_root, "qwen3_5", seed=0, block_size=16)
    cache = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    for repo, folder in (("org/tiny-real", t_dir), ("org/tiny-real-dflash", d_dir)):
        make_cache_repo(cache, repo, {p.name: p.read_bytes() for p in folder.iterdir()
                                      if p.is_file() and p.name != "built.json"})
    catalog = make_catalog(tmp_path)
    target = catalog.find("org/tiny-real")
    assert target is not None and target.kind == "target"
    drafter = catalog.drafters_for(target)[0]
    assert drafter.name == "org/tiny-real-dflash"
    loaded_t, loaded_d = load_target(str(target.path)), load_drafter(str(drafter.path))
    check_pair(loaded_t, loaded_d)
    assert loaded_d.config.block_size == drafter.to_dict()["block_size"] == 16
    est = cat.estimate_memory(target, drafter, context=256)
    assert est.weights_bytes == (t_dir / "model.safetensors").stat().st_size


def test_drafter_defaults_are_named(tmp_path, caplog):
    import json
    import logging

    from app.models.catalog import drafter_defaults_used, warn_drafter_defaults

    full = {"architectures": ["DFlashDraftModel"], "rope_theta": 10000.0,
            "dflash_config": {"block_size": 8}}
    assert drafter_defaults_used(full) == []
    assert drafter_defaults_used({"rope_parameters": {"rope_theta": 1e6}, "block_size": 4}) == []
    bare = {"architectures": ["DFlashDraftModel"]}
    assert drafter_defaults_used(bare) == [
        "the drafter config has no block_size; the default 16 is used",
        "the drafter config has no rope_theta; the default 1e+06 is used",
    ]
    (tmp_path / "config.json").write_text(json.dumps(bare))
    with caplog.at_level(logging.WARNING, logger="app.models.catalog"):
        assert len(warn_drafter_defaults(tmp_path)) == 2
    assert "no rope_theta; the default 1e+06 is used" in caplog.text
    assert warn_drafter_defaults(tmp_path / "missing") == []

"""DFlash2 drafters stored as an adapter on a DFlash drafter's backbone
(``app.models.adapter``): the split keeps only the differing tensors, adapter + backbone load
to the full export's weights, bad adapters raise typed errors naming the path or tensor, and
the bundled DFlash2 adapter on the demo pair gives plain decoding's tokens (greedy, exact)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import pytest
from engine_fixtures import run
from mlx.utils import tree_flatten
from test_dflash2 import _mask_id, dflash2_config, write_checkpoint

from app.engine.errors import ModelLoadError
from app.models.adapter import BACKBONE_KEY, write_adapter
from app.models.loader import check_pair, load_drafter, load_target
from app.paths import demo_dflash2_dir, demo_pair_dirs

ADDED = ("_conv.", "candidate_selector.")


@pytest.fixture(scope="module")
def split(tiny_hybrid, tmp_path_factory):
    """(full export, DFlash backbone folder, adapter folder) of a tiny random DFlash2 drafter:
    the backbone holds the full export's backbone tensors, byte for byte."""
    target, _ = tiny_hybrid
    root = tmp_path_factory.mktemp("adapter")
    full = write_checkpoint(root / "full", dflash2_config(target.path, _mask_id(target)), seed=3)
    tensors = mx.load(str(full / "model.safetensors"))
    backbone = root / "backbone"
    backbone.mkdir()
    mx.save_safetensors(str(backbone / "model.safetensors"),
                        {k: v for k, v in tensors.items() if not any(a in k for a in ADDED)})
    cfg = json.loads((full / "config.json").read_text())
    cfg["architectures"] = ["DFlashDraftModel"]
    (backbone / "config.json").write_text(json.dumps(cfg))
    (full / "train_log.json").write_text("{}")
    info = write_adapter(full, backbone, root / "adapter")
    return full, backbone, root / "adapter", info


def _params(drafter) -> dict:
    return dict(tree_flatten(drafter.model.parameters()))


def test_the_adapter_keeps_only_the_convolutions_and_the_selector(split):
    full, backbone, adapter, info = split
    kept = set(mx.load(str(adapter / "model.safetensors")))
    assert kept == set(info["kept"])
    # 2 layers x 2 convolutions x 2 tensors + 3 selector tensors
    assert len(kept) == 11 and all(any(a in k for a in ADDED) for k in kept)
    assert info["shared"] == len(mx.load(str(full / "model.safetensors"))) - 11
    cfg = json.loads((adapter / "config.json").read_text())
    assert cfg[BACKBONE_KEY] == "../backbone"
    assert (adapter / "train_log.json").read_text() == "{}"
    assert info["bytes"] < (full / "model.safetensors").stat().st_size / 2


def test_adapter_plus_backbone_loads_the_full_exports_weights(split, tiny_hybrid):
    full, _, adapter, _ = split
    a, b = load_drafter(adapter), load_drafter(full)
    assert a.kind == b.kind == "dflash2"
    pa, pb = _params(a), _params(b)
    assert set(pa) == set(pb) and len(pa) == 36
    for name in pa:
        assert pa[name].dtype == pb[name].dtype
        assert mx.array_equal(pa[name], pb[name]).item(), name
    check_pair(tiny_hybrid[0], a)


def test_an_absolute_backbone_path_works_too(split, tmp_path):
    full, backbone, _, _ = split
    write_adapter(full, backbone, tmp_path / "abs", ref=str(backbone.resolve()))
    pa, pb = _params(load_drafter(tmp_path / "abs")), _params(load_drafter(full))
    assert all(mx.array_equal(pa[k], pb[k]).item() for k in pb)


def _copy_adapter(split, tmp_path, **cfg_changes) -> Path:
    _, backbone, adapter, _ = split
    out = tmp_path / "a"
    shutil.copytree(adapter, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg[BACKBONE_KEY] = str(backbone.resolve())
    cfg.update(cfg_changes)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_a_missing_backbone_folder_is_named(split, tmp_path):
    out = _copy_adapter(split, tmp_path, **{BACKBONE_KEY: "../no-such-drafter"})
    with pytest.raises(ModelLoadError, match=r"backbone folder .*no-such-drafter.* does not "
                                             r"exist"):
        load_drafter(out)


@pytest.mark.parametrize("value", [3, "", ["../x"]])
def test_a_backbone_key_that_is_no_path_is_refused(split, tmp_path, value):
    out = _copy_adapter(split, tmp_path, **{BACKBONE_KEY: value})
    with pytest.raises(ModelLoadError, match=f"{BACKBONE_KEY} is .*not a folder path"):
        load_drafter(out)


def test_a_backbone_without_weights_is_refused(split, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = _copy_adapter(split, tmp_path, **{BACKBONE_KEY: str(empty)})
    with pytest.raises(ModelLoadError, match="empty has no model.safetensors"):
        load_drafter(out)


def test_a_tensor_in_neither_folder_is_named(split, tmp_path):
    _, backbone, _, _ = split
    part = tmp_path / "part"
    part.mkdir()
    t = mx.load(str(backbone / "model.safetensors"))
    t.pop("layers.1.mlp.down_proj.weight")
    mx.save_safetensors(str(part / "model.safetensors"), t)
    out = _copy_adapter(split, tmp_path, **{BACKBONE_KEY: str(part)})
    with pytest.raises(ModelLoadError, match=r"layers\.1\.mlp\.down_proj\.weight is neither in "
                                             r"the adapter nor in its backbone folder .*part"):
        load_drafter(out)


def test_a_misfit_backbone_tensor_is_named_with_its_folder(split, tmp_path):
    _, backbone, _, _ = split
    bad = tmp_path / "bad"
    bad.mkdir()
    t = mx.load(str(backbone / "model.safetensors"))
    t["fc.weight"] = t["fc.weight"][:, :-1]
    mx.save_safetensors(str(bad / "model.safetensors"), t)
    out = _copy_adapter(split, tmp_path, **{BACKBONE_KEY: str(bad)})
    with pytest.raises(ModelLoadError, match=r"backbone folder .*bad does not fit: its tensor "
                                             r"fc\.weight has shape"):
        load_drafter(out)


def test_a_full_checkpoint_ignores_no_tensor_and_needs_no_backbone(split):
    full, _, _, _ = split
    assert BACKBONE_KEY not in json.loads((full / "config.json").read_text())
    assert len(_params(load_drafter(full))) == 36


# --- the bundled DFlash2 drafter ------------------------------------------------------------


def test_the_bundled_dflash2_drafter_is_an_adapter_on_demo_dflash():
    folder = demo_dflash2_dir()
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    assert cfg[BACKBONE_KEY] == "../demo-dflash"
    stored = mx.load(str(folder / "model.safetensors"))
    assert len(stored) == 11 and all(any(a in k for a in ADDED) for k in stored)
    assert {v.dtype for v in stored.values()} == {mx.float16}
    log = json.loads((folder / "train_log.json").read_text())
    assert log["args"]["freeze_backbone"] == "True"
    assert log["tau_eval"]["selector"]["tau_offline"] > log["tau_dflash"]["tau_offline"]


@pytest.fixture(scope="module")
def demo2():
    tdir, _ = demo_pair_dirs()
    target = load_target(str(tdir))
    drafter = load_drafter(str(demo_dflash2_dir()))
    check_pair(target, drafter)
    return target, drafter


PROMPTS = ["What is the capital of France?", "Convert 5 km to miles.", "Hello!"]


@pytest.mark.parametrize("question", PROMPTS)
def test_bundled_greedy_dflash2_equals_plain(demo2, question):
    target, drafter = demo2
    ids = list(target.tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                                    add_generation_prompt=True))
    plain = run(target, ids, mode="plain", max_tokens=40)
    d2 = run(target, ids, drafter, mode="dflash2", max_tokens=40)
    off = run(target, ids, drafter, mode="dflash2", max_tokens=40, selector=False)
    assert len(plain.tokens) >= 20
    assert d2.tokens == plain.tokens and off.tokens == plain.tokens
    assert d2.summary.mode == "dflash2" and any(d2.from_draft)


def test_bench_csv_takes_every_rows_fields(tmp_path):
    """DFlash2 modes' figures carry ``selector``, which plain's lack: the summary CSV must
    still be written (the first bench on the demo pair with DFlash2 failed there)."""
    import csv

    from app.commands.bench import _write_csv

    path = tmp_path / "s.csv"
    _write_csv(path, [{"name": "plain", "tau": None},
                      {"name": "dflash2+tape@16", "tau": 9.5, "selector": True}])
    rows = list(csv.DictReader(path.open()))
    assert rows[0] == {"name": "plain", "tau": "", "selector": ""}
    assert rows[1] == {"name": "dflash2+tape@16", "tau": "9.5", "selector": "True"}

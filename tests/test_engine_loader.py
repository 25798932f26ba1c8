"""Drafter and target loading: every published config generation loads; every bad case raises
its typed error with the field or file named."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from app.engine.drafter import DFlashDrafter, DrafterConfig, default_target_layer_ids
from app.engine.errors import (
    ModelLoadError,
    ModelNotFoundError,
    PairMismatchError,
    UnsupportedArchitectureError,
)
from app.models.loader import (
    check_pair,
    check_pair_configs,
    load_drafter,
    load_target,
    resolve_model_path,
)

# Scaled-down copies of the published drafter configs (field layout kept, sizes shrunk).
QWEN35_4B_CURRENT = {  # current revision: 6 layers, 8 taps, sliding layers, rope_parameters
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 6, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "num_target_layers": 32,
    "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"},
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "sliding_window": 4096,
    "tie_word_embeddings": False, "dtype": "bfloat16",
    "dflash_config": {"block_size": 16, "mask_token_id": 500,
                      "target_layer_ids": [1, 5, 9, 13, 17, 21, 25, 29]},
}
QWEN35_4B_EARLIER = {  # earlier revision: 5 layers, 5 taps, full attention, rope_theta on top
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 5, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "num_target_layers": 32,
    "rope_theta": 1000000, "block_size": 16,
    "dflash_config": {"mask_token_id": 497, "target_layer_ids": [1, 8, 15, 22, 29]},
}
QWEN3_8B = {  # top-level block_size, no layer_types, taps from the config
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 5, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 512, "num_target_layers": 36, "block_size": 16,
    "rope_theta": 1000000,
    "dflash_config": {"mask_token_id": 501, "target_layer_ids": [1, 9, 17, 25, 33]},
}


def _write_drafter(folder, cfg, extra=None, drop=None, reshape=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    model = DFlashDrafter(DrafterConfig.from_dict(cfg))
    weights = dict(tree_flatten(model.parameters()))
    if drop:
        weights.pop(drop)
    if reshape:
        weights[reshape] = mx.zeros((3, 3))
    weights.update(extra or {})
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    return folder


@pytest.mark.parametrize(
    "cfg,block,taps,mask,types",
    [
        (QWEN35_4B_CURRENT, 16, [1, 5, 9, 13, 17, 21, 25, 29], 500,
         ["sliding_attention"] * 5 + ["full_attention"]),
        (QWEN35_4B_EARLIER, 16, [1, 8, 15, 22, 29], 497, ["full_attention"] * 5),
        (QWEN3_8B, 16, [1, 9, 17, 25, 33], 501, ["full_attention"] * 5),
    ],
)
def test_published_config_generations_load(tmp_path, cfg, block, taps, mask, types):
    d = load_drafter(_write_drafter(tmp_path / "d", cfg))
    assert d.config.block_size == block
    assert d.config.target_layer_ids == taps
    assert d.config.mask_token_id == mask
    assert d.config.layer_types == types
    rope = cfg.get("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta"))
    assert d.config.rope_theta == float(rope)
    assert d.model.layers[0].self_attn.sliding == (types[0] == "sliding_attention")


def test_default_taps_spread_from_layer_1_to_n_minus_3():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    cfg = {k: v for k, v in QWEN3_8B.items() if k != "dflash_config"}
    cfg["mask_token_id"] = 7
    assert DrafterConfig.from_dict(cfg).target_layer_ids == [1, 9, 17, 25, 33]


def test_extra_embedding_and_head_tensors_are_ignored(tmp_path):
    extra = {"embed_tokens.weight": mx.zeros((512, 64)), "lm_head.weight": mx.zeros((512, 64))}
    d = load_drafter(_write_drafter(tmp_path / "d", QWEN3_8B, extra=extra))
    assert "embed_tokens" not in dict(tree_flatten(d.model.parameters()))


def test_missing_folder_and_uncached_repo(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelNotFoundError, match="no model folder"):
        load_drafter(tmp_path / "nope")
    with pytest.raises(ModelNotFoundError, match="z-lab/Qwen3.5-4B-DFlash"):
        resolve_model_path("z-lab/Qwen3.5-4B-DFlash")


def test_missing_files(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="config.json"):
        load_drafter(tmp_path / "empty")
    folder = _write_drafter(tmp_path / "d", QWEN3_8B)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_drafter(folder)


def test_other_architecture_is_refused_by_name(tmp_path):
    cfg = {**QWEN3_8B, "architectures": ["Eagle3DraftModel"]}
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match="Eagle3DraftModel"):
        load_drafter(tmp_path / "d")


def test_dflash2_config_without_its_fields_is_a_load_error(tmp_path):
    """DFlash2 checkpoints load now (tests/test_dflash2.py); one lacking the DFlash2 fields is
    refused by name of the missing field."""
    cfg = {**QWEN3_8B, "architectures": ["DFlash2DraftModel"]}
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="conv_kernel_size"):
        load_drafter(tmp_path / "d")


def test_corrupt_safetensors(tmp_path):
    folder = _write_drafter(tmp_path / "d", QWEN3_8B)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(b"\x00\x01garbage" + data[: len(data) // 3])
    with pytest.raises(ModelLoadError, match="not a readable safetensors"):
        load_drafter(folder)


def test_wrong_tensor_shape_and_missing_tensor(tmp_path):
    with pytest.raises(ModelLoadError, match=r"fc\.weight has shape \(3, 3\)"):
        load_drafter(_write_drafter(tmp_path / "a", QWEN3_8B, reshape="fc.weight"))
    with pytest.raises(ModelLoadError, match="lack the tensor norm.weight"):
        load_drafter(_write_drafter(tmp_path / "b", QWEN3_8B, drop="norm.weight"))


def test_missing_config_field(tmp_path):
    cfg = {k: v for k, v in QWEN3_8B.items() if k != "vocab_size"}
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="vocab_size"):
        load_drafter(tmp_path / "d")


def test_pair_checks_name_the_field(tiny_hybrid, tmp_path):
    target, drafter = tiny_hybrid
    check_pair(target, drafter)  # the real pair fits
    base = json.loads((drafter.path / "config.json").read_text())
    cases = [
        ({"vocab_size": 1000}, "vocab_size"),
        ({"hidden_size": 32}, "hidden_size"),
        ({"num_target_layers": 32}, "num_target_layers"),
    ]
    for change, field in cases:
        with pytest.raises(PairMismatchError) as err:
            check_pair_configs(target.config, {**base, **change})
        assert err.value.field == field
    bad_taps = {**base, "dflash_config": {**base["dflash_config"], "target_layer_ids": [1, 9]}}
    with pytest.raises(PairMismatchError, match="target_layer_ids") as err:
        check_pair_configs(target.config, bad_taps)
    assert err.value.field == "target_layer_ids"
    folder = tmp_path / "bad"
    shutil.copytree(drafter.path, folder)
    (folder / "config.json").write_text(json.dumps(bad_taps))
    with pytest.raises(PairMismatchError, match="taps target layer 9"):
        check_pair(target, load_drafter(folder))


def test_target_loads_through_mlx_lm_with_its_tokenizer(tiny_hybrid, tmp_path):
    target, _ = tiny_hybrid
    assert target.model_type == "qwen3_5"
    assert target.tokenizer.has_thinking and target.tokenizer.has_tool_calling
    assert target.eos_token_ids == {target.tokenizer.convert_tokens_to_ids("<|im_end|>")}
    folder = tmp_path / "t"
    shutil.copytree(target.path, folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError):
        load_target(folder)


def test_damaged_weights_and_unknown_model_types_are_named(tiny_hybrid, tmp_path):
    """A new user's pass: a cut-off weights file said "RuntimeError: [read] Unable to read 3
    bytes from file", and a model_type mlx-lm does not know, with an empty weights file, said
    "Unable to read 8 bytes" instead of the type. The type is checked before the weights are
    read, and a weights file MLX cannot read is called damaged or incomplete."""
    target, _ = tiny_hybrid
    cut = tmp_path / "cut"
    shutil.copytree(target.path, cut)
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-3])  # an interrupted download
    with pytest.raises(ModelLoadError, match=r"model.safetensors is damaged or incomplete"):
        load_target(cut)
    foo = tmp_path / "foo"
    shutil.copytree(target.path, foo)
    cfg = json.loads((foo / "config.json").read_text())
    (foo / "config.json").write_text(json.dumps({**cfg, "model_type": "foobar"}))
    (foo / "model.safetensors").write_bytes(b"")
    with pytest.raises(UnsupportedArchitectureError, match="model type 'foobar' is not supported"):
        load_target(foo)


def test_target_folder_problems_are_named(tiny_hybrid, tmp_path):
    target, drafter = tiny_hybrid

    def copy(name):
        folder = tmp_path / name
        shutil.copytree(target.path, folder)
        return folder

    not_object = copy("list")
    (not_object / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match="not a JSON object"):
        load_target(not_object)
    with pytest.raises(ModelLoadError, match="is a DFlash drafter"):
        load_target(drafter.path)
    no_tok = copy("notok")
    (no_tok / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer files"):
        load_target(no_tok)
    bad_field = copy("badfield")
    cfg = json.loads((bad_field / "config.json").read_text())
    (bad_field / "config.json").write_text(json.dumps({**cfg, "hidden_size": "abc"}))
    with pytest.raises(ModelLoadError, match="could not load badfield"):
        load_target(bad_field)
    no_type = copy("notype")
    (no_type / "config.json").write_text(json.dumps({k: v for k, v in cfg.items()
                                                     if k != "model_type"}))
    with pytest.raises(ModelLoadError, match="no model_type"):
        load_target(no_type)


def test_drafter_config_problems_are_named(tmp_path):
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "config.json").write_text("[]")
    with pytest.raises(ModelLoadError, match="not a JSON object"):
        load_drafter(tmp_path / "list")
    zero = {**QWEN3_8B, "block_size": 0}
    (tmp_path / "zero").mkdir()
    (tmp_path / "zero" / "config.json").write_text(json.dumps(zero))
    with pytest.raises(ModelLoadError, match="block_size is 0"):
        load_drafter(tmp_path / "zero")


def test_checkpoint_dtype_kept_on_gpu_backends_upcast_only_on_cpu(tiny_root, monkeypatch):
    """``_on_cpu`` means the CPU device, not "no Metal" (MLX's CUDA backend has no Metal);
    ``keep_dtype`` overrides the choice."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map

    from app.models import loader
    from app.models.tiny import build_tiny_pair

    monkeypatch.setattr(mx.metal, "is_available", lambda: False)  # as on CUDA
    assert loader._on_cpu() is (mx.default_device() == mx.cpu)
    t_dir, d_dir = build_tiny_pair(tiny_root / "dtype", "qwen3", seed=3)
    half = tiny_root / "dtype-half"
    if not half.exists():
        import shutil

        shutil.copytree(t_dir, half)
        weights = mx.load(str(half / "model.safetensors"))
        mx.save_safetensors(str(half / "model.safetensors"),
                            tree_map(lambda a: a.astype(mx.bfloat16), weights))
    dtypes = {v.dtype for _, v in tree_flatten(loader.load_target(half).model.parameters())}
    assert dtypes == {mx.float32}  # this CPU upcasts
    kept = loader.load_target(half, keep_dtype=True).model.parameters()
    assert {v.dtype for _, v in tree_flatten(kept)} == {mx.bfloat16}
    monkeypatch.setattr(loader, "_on_cpu", lambda: False)  # a GPU backend
    gpu = loader.load_target(half).model.parameters()
    assert {v.dtype for _, v in tree_flatten(gpu)} == {mx.bfloat16}


def test_unrestorable_cache_type_refuses_dflash_naming_it(tiny_hybrid, monkeypatch):
    from mlx_lm.models.cache import QuantizedKVCache

    from app.engine.errors import UnsupportedArchitectureError
    from app.engine.target import TargetRunner

    target, _ = tiny_hybrid
    monkeypatch.setattr(TargetRunner, "make_cache",
                        lambda self: [QuantizedKVCache() for _ in self.layers])
    with pytest.raises(UnsupportedArchitectureError, match="QuantizedKVCache"):
        TargetRunner(target.model, target.model_type)


def test_model_type_that_does_not_fit_the_weights_is_one_line(tiny_root):
    """mlx-lm lists every unexpected tensor; the message names the model_type and one
    example, in one line."""
    from app.models.tiny import build_tiny_pair

    t_dir, _ = build_tiny_pair(tiny_root / "misfit", "qwen3", seed=4)
    bad = tiny_root / "misfit-llama"
    if not bad.exists():
        shutil.copytree(t_dir, bad)
        cfg = json.loads((bad / "config.json").read_text())
        cfg["model_type"] = "llama"  # qwen3 weights have q_norm/k_norm that llama lacks
        (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError) as info:
        load_target(bad)
    msg = str(info.value)
    assert "\n" not in msg and "model_type 'llama'" in msg
    assert "12 tensors the checkpoint has" in msg and ("q_norm" in msg or "k_norm" in msg)


# ------------------------------------------------------------------ integer typed weights
def _as_int32(src, dst, keep=lambda name: False):
    """A copy of the model folder ``src`` at ``dst`` whose tensors are int32 (those ``keep``
    names stay as they are), as a checkpoint saved with the wrong dtype is."""
    shutil.copytree(src, dst)
    weights = mx.load(str(dst / "model.safetensors"))
    mx.save_safetensors(str(dst / "model.safetensors"),
                        {k: v if keep(k) else (v * 100).astype(mx.int32)
                         for k, v in weights.items()})
    return dst


def test_a_target_with_int32_weights_is_refused_naming_the_folder_and_dtype(tiny_root,
                                                                            tmp_path):
    """Loaded as they were, int32 weights gave a model that wrote only end tokens."""
    from app.engine.errors import IntegerWeightsError
    from app.models.tiny import build_tiny_pair

    t_dir, _ = build_tiny_pair(tiny_root, "qwen3", seed=0, block_size=16)
    folder = _as_int32(t_dir, tmp_path / "int32-target")
    with pytest.raises(IntegerWeightsError) as caught:
        load_target(folder)
    err = caught.value
    assert isinstance(err, ModelLoadError)  # the CLI's exit 2, the window's failed load
    assert err.dtype == "int32" and err.folder == folder and err.count > 1
    assert str(folder) in str(err) and "int32 weights" in str(err)
    assert "not floating point" in str(err)
    # one integer tensor among float ones is refused too, and named
    one = _as_int32(t_dir, tmp_path / "one-int32",
                    keep=lambda k: k != "model.norm.weight")
    with pytest.raises(IntegerWeightsError, match=r"int32 weights \(model\.norm\.weight\)"):
        load_target(one)


def test_a_drafter_with_int32_weights_is_refused(tiny_root, tmp_path):
    from app.engine.errors import IntegerWeightsError
    from app.models.tiny import build_tiny_pair

    _, d_dir = build_tiny_pair(tiny_root, "qwen3", seed=0, block_size=16)
    folder = _as_int32(d_dir, tmp_path / "int32-drafter")
    with pytest.raises(IntegerWeightsError, match="int32") as caught:
        load_drafter(folder)
    assert str(folder) in str(caught.value)


def test_quantized_layers_packed_integer_weights_are_not_refused(tiny_root):
    """A quantized layer's packed weight is uint32 by design; its float scales and biases
    beside it are what the check reads."""
    from app.engine.errors import IntegerWeightsError
    from app.models.loader import check_floating_weights

    w, scales, biases = mx.quantize(mx.ones((8, 64)), group_size=64, bits=4)
    assert w.dtype == mx.uint32
    pairs = [("layers.0.proj.weight", w), ("layers.0.proj.scales", scales),
             ("layers.0.proj.biases", biases), ("norm.weight", mx.ones((4,)))]
    check_floating_weights(pairs, tiny_root, quantized={"layers.0.proj"})
    with pytest.raises(IntegerWeightsError, match="uint32"):  # the same, not quantized
        check_floating_weights(pairs, tiny_root)
    with pytest.raises(IntegerWeightsError, match="int32"):  # integer biases of a layer
        check_floating_weights(pairs[:2] + [("layers.0.proj.biases", biases.astype(mx.int32))],
                               tiny_root, quantized={"layers.0.proj"})


TRICKY = "<|im_start|>system\n# Tools\n\nYou may call 12345 times ?? naïve café\n\n  x<|im_end|>\n"


def test_the_demo_target_splits_text_as_its_tokenizer_json_does():
    """transformers 5 rebuilds a ``qwen3_5`` folder's tokenizer with Qwen's own splitting
    rules; the demo pair was trained on its tokenizer.json's (digits one by one, GPT-2 byte
    level), so the loaded target must split prompts exactly as that file does."""
    from tokenizers import Tokenizer

    from app.models.loader import load_target, load_tokenizer
    from app.paths import demo_pair_dirs

    folder = demo_pair_dirs()[0]
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    want = raw.encode(TRICKY, add_special_tokens=False).ids
    assert want.count(208) >= 3  # "\n\n" is two "\n" tokens in the file's splitting
    for tok in (load_tokenizer(folder), load_target(folder).tokenizer):
        assert tok.encode(TRICKY, add_special_tokens=False) == want
        assert tok.decode(want) == TRICKY


def test_a_tokenizer_of_its_own_class_is_left_as_transformers_builds_it(tmp_path):
    """Only a folder whose tokenizer_config names the generic PreTrainedTokenizerFast gets
    the file's splitting back; one naming a model's own class keeps that class's rules."""
    import json
    import shutil

    from app.models.loader import keep_file_tokenizer
    from app.paths import demo_pair_dirs

    folder = tmp_path / "own"
    shutil.copytree(demo_pair_dirs()[0], folder)
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    tok = mlx_load_tokenizer(folder)
    before = tok.encode(TRICKY, add_special_tokens=False)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert keep_file_tokenizer(tok, folder) is False
    assert tok.encode(TRICKY, add_special_tokens=False) == before
    (folder / "tokenizer_config.json").unlink()
    assert keep_file_tokenizer(tok, folder) is False

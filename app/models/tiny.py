"""Tiny random-weight model pairs for tests and for running before a real pair is present.

:func:`build_tiny_pair` writes two folders:

* a target loadable by ``mlx_lm.load`` (``qwen3_5`` hybrid: Gated DeltaNet + attention layers,
  or dense ``qwen3``), float32, with a small byte-level BPE tokenizer that carries the Qwen
  special tokens and the project's chat template (``resources/chat_template.jinja``);
* a DFlash drafter in the z-lab checkpoint layout (``config.json`` with ``dflash_config``, and
  ``model.safetensors`` with ``fc``, ``hidden_norm``, ``layers.*``, ``norm``).

Random weights say nothing sensible, but every id is a real token and the shapes exercise the
same code as real checkpoints. Configs are scaled-down copies of Qwen3.5's and z-lab's.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
    "<|mask|>",
]

_SAMPLE_TEXT = """\
The capital of France is Paris. The currency of Japan is the yen. Water boils at 100 degrees.
What is 17 times 23? Let me think step by step: 17 * 23 = 391. The answer is 391.
<function=calculator> <parameter=expression> sqrt(16) + 2 </parameter> </function>
Hello! How can I help you today? Here are five capitals in Europe: Berlin, Madrid, Rome,
Vienna, Lisbon. 1 2 3 4 5 6 7 8 9 0 km miles kilograms pounds UTC Europe/Paris
{"name": "country_info", "arguments": {"name": "Peru"}} Ünïcödé café 東京 北京 😀 🚀
"""


def build_tokenizer(folder: Path, vocab_size: int = 512, chat_template: str | None = None) -> int:
    """Train a byte-level BPE on a small built-in text and save HF tokenizer files.

    Writes ``tokenizer.json`` and ``tokenizer_config.json`` (``eos_token`` ``<|im_end|>``,
    the chat template). Returns the vocabulary size including special tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from app.paths import resource_path

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_SAMPLE_TEXT] * 4, trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    template = chat_template or resource_path("chat_template.jinja").read_text()
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "bos_token": None,
                "add_bos_token": False,
                "model_max_length": 4096,
                "chat_template": template,
                "added_tokens_decoder": {
                    str(tok.token_to_id(t)): {"content": t, "special": True}
                    for t in SPECIAL_TOKENS
                },
            },
            indent=1,
        )
    )
    return tok.get_vocab_size()


def target_config(family: str, vocab_size: int, eos_id: int, hidden_size: int = 64) -> dict:
    """A scaled-down config for ``qwen3_5`` (hybrid), ``qwen3`` (dense) or ``llama`` with
    sliding-window layers (``layer_types``, window 24). Head sizes scale with ``hidden_size``
    (a multiple of 64)."""
    if hidden_size % 64:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of 64")
    common = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden_size // 4,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "eos_token_id": eos_id,
    }
    if family == "qwen3":
        return {
            **common,
            "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
            "rope_theta": 1_000_000.0,
        }
    if family == "qwen3_5":
        return {
            **common,
            "model_type": "qwen3_5",
            "architectures": ["Qwen3_5ForCausalLM"],
            "linear_num_value_heads": 4,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": hidden_size // 4,
            "linear_value_head_dim": hidden_size // 4,
            "linear_conv_kernel_dim": 4,
            "full_attention_interval": 3,
            "rope_parameters": {
                "type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [1, 1, 0],
            },
        }
    if family == "llama":
        return {
            **common,
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "rope_theta": 10000.0,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
            "sliding_window": 24,
        }
    raise ValueError(f"unknown tiny family {family!r}")


def drafter_config(
    target_cfg: dict, mask_id: int, block_size: int, taps: list[int], sliding: bool
) -> dict:
    """A z-lab-layout drafter config for ``target_cfg`` (current revision's fields)."""
    n_layers = 2
    layer_types = ["sliding_attention", "full_attention"] if sliding else ["full_attention"] * 2
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": target_cfg["hidden_size"],
        "intermediate_size": 128,
        "num_hidden_layers": n_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 1_000_000.0, "rope_type": "default"},
        "vocab_size": target_cfg["vocab_size"],
        "max_position_embeddings": 4096,
        "num_target_layers": target_cfg["num_hidden_layers"],
        "tie_word_embeddings": False,
        "layer_types": layer_types,
        "sliding_window": 32,
        "dtype": "float32",
        "dflash_config": {
            "block_size": block_size,
            "mask_token_id": mask_id,
            "target_layer_ids": taps,
        },
    }


def _save_mlx_model(model, folder: Path, config: dict) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    folder.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(config, indent=1))


def build_tiny_pair(
    root: Path,
    family: str = "qwen3_5",
    seed: int = 0,
    block_size: int = 8,
    sliding: bool = True,
    weight_scale: float = 1.0,
    hidden_size: int = 64,
) -> tuple[Path, Path]:
    """Write a tiny random target and drafter under ``root``; returns their folders.

    Reuses folders already built with the same arguments (a ``built.json`` marker).

    Args:
        family: ``qwen3_5`` (hybrid), ``qwen3`` (dense) or ``llama`` (sliding-window layers).
        seed: ``mx.random`` seed for the weights.
        block_size: the drafter's ``dflash_config.block_size``.
        sliding: give the drafter one ``sliding_attention`` layer.
        weight_scale: multiplies the target's random weights (larger -> peakier logits).
        hidden_size: the target's (and drafter's) width; 64 unless rounding must show.
    """
    import hashlib

    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import _get_classes

    from app.engine.drafter import DFlashDrafter, DrafterConfig
    from app.paths import resource_path

    root = Path(root)
    template = resource_path("chat_template.jinja").read_bytes()
    key = {"family": family, "seed": seed, "block_size": block_size, "sliding": sliding,
           "weight_scale": weight_scale, "hidden_size": hidden_size, "version": 3,
           "template": hashlib.sha256(template).hexdigest()[:16]}
    target_dir, drafter_dir = root / f"{family}-target", root / f"{family}-dflash"
    marker = root / f"{family}-built.json"
    if marker.is_file() and json.loads(marker.read_text()) == key:
        return target_dir, drafter_dir

    vocab = build_tokenizer(target_dir)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    eos_id, mask_id = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|mask|>")
    tcfg = target_config(family, vocab, eos_id, hidden_size)
    mx.random.seed(seed)
    model_cls, args_cls = _get_classes(tcfg)
    target = model_cls(args_cls.from_dict(tcfg))
    if weight_scale != 1.0:
        scaled = [(k, v * weight_scale) for k, v in tree_flatten(target.parameters())
                  if v.ndim >= 2]
        target.update(tree_unflatten(scaled))
    mx.eval(target.parameters())
    _save_mlx_model(target, target_dir, tcfg)

    n = tcfg["num_hidden_layers"]
    dcfg = drafter_config(tcfg, mask_id, block_size, [1, n - 3], sliding)
    drafter = DFlashDrafter(DrafterConfig.from_dict(dcfg))
    mx.eval(drafter.parameters())
    _save_mlx_model(drafter, drafter_dir, dcfg)
    marker.write_text(json.dumps(key))
    return target_dir, drafter_dir


FALLBACK_FOLDER = "tiny-pair"
"""Folder under ``app.paths.cache_dir()`` of the pair used when the demo pair is missing."""


def fallback_pair() -> tuple[Path, Path]:
    """The tiny pair the app falls back to when the bundled demo pair is missing (built once
    in ``cache_dir() / FALLBACK_FOLDER``, then reused); the window, the session and the CLI
    all use this one."""
    from app.paths import cache_dir

    return build_tiny_pair(cache_dir() / FALLBACK_FOLDER)

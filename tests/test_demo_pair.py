"""The bundled demo pair (issues 6 and 18): it loads with the app's loaders, fits together,
answers held-out prompts through the app's reply runner with the real tools, and DFlash gives
the same tokens as plain decoding.

The held-out sets are the frozen ``heldout_prompts.json`` / ``heldout_scripts.json`` beside the
target (made by ``tools/demo_pair/corpus.py``; the corpus never used their texts). Greedy,
exact verify, float32 compute on CPU (the loader upcasts). A fixed subset runs here; the full
figures are in the model cards (``python -m tools.demo_pair.evaluate --dflash``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from app.paths import demo_dflash2_dir, demo_pair_dirs

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # tools/ is not an installed package
    sys.path.insert(0, str(REPO))

from tools.demo_pair import evaluate as ev  # noqa: E402

TARGET_DIR, DRAFTER_DIR = demo_pair_dirs()
DFLASH2_DIR = demo_dflash2_dir()

# Held-out items the shipped pair answers correctly (a fixed subset of the model card's run).
SINGLE_IDS = ["fact_capital-0", "tool_time-111", "tool_convert-127", "greeting-80",
              "scope-155"]
SCRIPT_IDS = ["script-4-calc_op", "script-40-country_other"]


@pytest.fixture(scope="module")
def pair():
    return ev.load_pair()


@pytest.fixture(scope="module")
def heldout():
    return ev.load_heldout(), ev.load_scripts()


def test_files_are_float16_and_within_the_size_cap():
    from safetensors import safe_open

    total = 0
    # all three folders count: the target, the DFlash drafter and the DFlash2 adapter
    for folder in (TARGET_DIR, DRAFTER_DIR, DFLASH2_DIR):
        assert sorted(p.name for p in folder.glob("*.safetensors")) == ["model.safetensors"]
        f = folder / "model.safetensors"
        total += f.stat().st_size
        with safe_open(str(f), "np") as st:
            dtypes = {str(st.get_tensor(k).dtype) for k in st.keys()}
        assert dtypes == {"float16"}
        assert (folder / "README.md").exists()
    assert total <= 30_000_000
    assert (DFLASH2_DIR / "model.safetensors").stat().st_size < 1_000_000


def test_configs_follow_the_published_layouts():
    tcfg = json.loads((TARGET_DIR / "config.json").read_text())
    dcfg = json.loads((DRAFTER_DIR / "config.json").read_text())
    assert tcfg["model_type"] == "qwen3_5"
    kinds = tcfg["layer_types"]
    assert "linear_attention" in kinds and "full_attention" in kinds
    assert dcfg["architectures"] == ["DFlashDraftModel"]
    assert dcfg["model_type"] == "qwen3"
    assert dcfg["dflash_config"]["block_size"] == 16
    assert dcfg["num_target_layers"] == tcfg["num_hidden_layers"]
    tok = json.loads((TARGET_DIR / "tokenizer.json").read_text())
    added = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert dcfg["dflash_config"]["mask_token_id"] == added["<|mask|>"]
    assert len(tok["model"]["vocab"]) <= 8192
    for t in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
              "</tool_call>", "<tool_response>", "</tool_response>", "<|endoftext|>"):
        assert t in added


def test_heldout_sets_are_frozen_copies(heldout):
    for name in ("heldout_prompts.json", "heldout_scripts.json"):
        shipped = json.loads((TARGET_DIR / name).read_text())
        source = json.loads((REPO / "tools" / "demo_pair" / name).read_text())
        assert shipped == source
    prompts, scripts = heldout
    assert len(prompts) == 176 and len(scripts) == 48
    assert len({p["id"] for p in prompts}) == len(prompts)


@pytest.mark.slow  # left to make test (CI): make test-fast stays under 5 minutes
def test_examples_are_heldout_prompts_the_pair_answers(pair, heldout):
    examples = json.loads((TARGET_DIR / "examples.json").read_text())
    assert 4 <= len(examples) <= 6
    assert all(set(e) == {"prompt", "needs_tools"} for e in examples)
    by_text = {p["messages"][0]["content"]: p for p in heldout[0]}
    target, drafter = pair
    for e in examples[:2]:
        item = by_text[e["prompt"]]
        assert e["needs_tools"] == item["needs_tools"]
        row = ev.run_single(target, drafter, item, dflash=False)
        assert row["ok"], (e["prompt"], row["why"])


def test_loads_with_app_loaders_and_tokenizer_features(pair):
    target, drafter = pair
    assert target.model_type == "qwen3_5"
    tok = target.tokenizer
    assert tok.has_thinking and tok.think_start == "<think>"
    assert tok.has_tool_calling and tok.tool_call_start == "<tool_call>"
    assert target.eos_token_ids == {tok.convert_tokens_to_ids("<|im_end|>")}
    assert drafter.config.block_size == 16
    assert drafter.config.mask_token_id == tok.convert_tokens_to_ids("<|mask|>")


@pytest.mark.slow
def test_heldout_subset_correct_and_dflash_identical(pair, heldout):
    target, drafter = pair
    items = [p for p in heldout[0] if p["id"] in SINGLE_IDS]
    assert len(items) == len(SINGLE_IDS)
    rows = [ev.run_single(target, drafter, it, dflash=True) for it in items]
    fails = [(r["id"], r["why"]) for r in rows if not r["ok"]]
    assert not fails, fails
    assert all(r["identical"] for r in rows)
    # Tool prompts took two rounds (call, then the answer after the result).
    assert all(len(r["plain"]) == 2 for r in rows if r["category"].startswith("tool_"))
    drafted = sum(x["drafted"] for r in rows for x in r["dflash"])
    accepted = sum(x["accepted"] for r in rows for x in r["dflash"])
    assert drafted > 0 and accepted / drafted > 0.3


@pytest.mark.slow
def test_heldout_script_through_the_reply_runner(pair, heldout):
    target, drafter = pair
    scripts = [s for s in heldout[1] if s["id"] in SCRIPT_IDS]
    assert len(scripts) == len(SCRIPT_IDS)
    for s in scripts:
        res = ev.run_script(target, drafter, s, dflash=True)
        for t in res["turns"]:
            assert t["call_ok"] and t["answer_ok"], (t["user"], t["why"])
            assert t["identical"], t["user"]


def test_load_pair_takes_a_target_folder_without_a_drafter_folder(tmp_path):
    # evaluate.py --target DIR alone used to load the bundled target instead of DIR.
    import shutil

    shutil.copytree(TARGET_DIR, tmp_path / "t")
    target, drafter = ev.load_pair(tmp_path / "t")
    assert Path(target.path).resolve() == (tmp_path / "t").resolve()
    assert Path(drafter.path).resolve() == DRAFTER_DIR.resolve()

"""The bundled demo pair (issue 6): it loads with the app's loaders, fits together, answers
held-out phrasings, calls tools in a form the app parses, and DFlash matches plain decoding.

The held-out prompts are the frozen ``heldout_prompts.json`` beside the target (phrasings the
training corpus never used; made by ``tools/demo_pair/corpus.py``). Greedy decoding, float32
compute on CPU (the loader upcasts), short ``max_tokens``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from app.paths import demo_pair_dirs

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # tools/ is not an installed package
    sys.path.insert(0, str(REPO))

from tools.demo_pair.evaluate import check, load_heldout, run_item, tool_call_valid  # noqa: E402

TARGET_DIR, DRAFTER_DIR = demo_pair_dirs()


@pytest.fixture(scope="module")
def pair():
    from app.engine.loader import check_pair, load_drafter, load_target

    target = load_target(str(TARGET_DIR))
    drafter = load_drafter(str(DRAFTER_DIR))
    check_pair(target, drafter)
    return target, drafter


@pytest.fixture(scope="module")
def heldout():
    return load_heldout()


def _pick(items, category, n=1):
    got = [it for it in items if it["category"] == category][:n]
    assert got, f"no held-out prompt of category {category}"
    return got


def test_files_are_float16_and_small():
    from safetensors import safe_open

    total = 0
    for folder in (TARGET_DIR, DRAFTER_DIR):
        f = folder / "model.safetensors"
        assert f.stat().st_size < 16 * 2**20
        total += sum(p.stat().st_size for p in folder.iterdir())
        with safe_open(str(f), "np") as st:
            dtypes = {str(st.get_tensor(k).dtype) for k in st.keys()}
        assert dtypes == {"float16"}
        assert (folder / "README.md").exists()
    assert total < 30 * 2**20


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
    for t in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
              "</tool_call>", "<tool_response>", "</tool_response>", "<|endoftext|>"):
        assert t in added


def test_heldout_prompts_are_frozen_copy():
    shipped = json.loads((TARGET_DIR / "heldout_prompts.json").read_text())
    source = json.loads((REPO / "tools" / "demo_pair" / "heldout_prompts.json").read_text())
    assert shipped == source
    cats = {it["category"] for it in shipped}
    assert {"fact_capital", "arithmetic", "easy_conversion", "explain", "greeting", "tool_time",
            "tool_population", "tool_convert", "tool_calc", "tool_info"} <= cats
    assert len(shipped) == 36 and len({it["id"] for it in shipped}) == 36
    # Held-out phrasings are not training phrasings.
    from tools.demo_pair.corpus import FIELD_TEMPLATES

    capital_q = [it["messages"][0]["content"] for it in shipped
                 if it["category"] == "fact_capital"]
    train_prefixes = [t.split("{c}")[0] for t in FIELD_TEMPLATES["capital"]["train"]]
    assert not any(q.startswith(p) and p for q in capital_q for p in train_prefixes)


def test_loads_with_app_loaders_and_tokenizer_features(pair):
    target, drafter = pair
    assert target.model_type == "qwen3_5"
    tok = target.tokenizer
    assert tok.has_thinking and tok.think_start == "<think>"
    assert tok.has_tool_calling and tok.tool_call_start == "<tool_call>"
    assert target.eos_token_ids == {tok.convert_tokens_to_ids("<|im_end|>")}
    assert drafter.config.block_size == 16
    assert drafter.config.mask_token_id == tok.convert_tokens_to_ids("<|mask|>")


def test_answers_heldout_fact_questions(pair, heldout):
    target, _ = pair
    items = _pick(heldout, "fact_capital", 2) + _pick(heldout, "greeting", 1)
    results = [(it, run_item(target, it, max_tokens=64)) for it in items]
    fails = [(it["messages"][0]["content"], check(it, r)[1]) for it, r in results
             if not check(it, r)[0]]
    assert not fails, fails
    # The reply came with a reasoning block that the pipeline split off.
    assert all(r["reasoning"] for _, r in results)


def test_tool_prompt_gives_schema_valid_call(pair, heldout):
    target, drafter = pair
    item = _pick(heldout, "tool_time", 1)[0]
    r = run_item(target, item, max_tokens=96)
    assert tool_call_valid(r), r["content"]
    ok, why = check(item, r)
    assert ok, why
    assert r["reasoning"]
    assert "<tool_call>" not in r["content"]
    # The same reply under DFlash: token-identical, with partial blocks rolled back.
    fast = run_item(target, item, mode="dflash", drafter=drafter, max_tokens=96)
    assert fast["tokens"] == r["tokens"]
    assert [c.to_dict() for c in fast["tool_calls"]] == [c.to_dict() for c in r["tool_calls"]]
    assert fast["summary"].replays > 0


def test_dflash_matches_plain_on_heldout(pair, heldout):
    target, drafter = pair
    items = _pick(heldout, "fact_currency", 1) + _pick(heldout, "fact_languages", 1)
    accepted = drafted = 0
    for it in items:
        plain = run_item(target, it, max_tokens=48)
        fast = run_item(target, it, mode="dflash", drafter=drafter, max_tokens=48)
        assert fast["tokens"] == plain["tokens"], it["messages"][0]["content"]
        accepted += fast["summary"].accepted
        drafted += fast["summary"].drafted
        assert check(it, plain)[0], plain["content"]
    # The trained drafter is right far more often than chance (vocabulary of 4,096 tokens).
    assert drafted > 0 and accepted / drafted > 0.3

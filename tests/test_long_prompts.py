"""Long prompts: no transformers warning about the tokenizer's maximum length (the app checks
the context itself), and the drafter's scratch rows for a block (DraftContextCache.with_block)
give what concatenating the context and the block gives."""

from __future__ import annotations

import logging

import mlx.core as mx
import pytest

from app.engine.drafter import DraftContextCache


@pytest.fixture(scope="module")
def tiny_target_dir(tmp_path_factory):
    from app.models.tiny import build_tiny_pair

    return build_tiny_pair(tmp_path_factory.mktemp("long_prompts"), "qwen3", seed=0,
                           block_size=8)[0]


def test_a_prompt_past_the_tokenizers_max_length_prints_no_warning(tiny_target_dir, capfd):
    import json

    from app.models.loader import TOKENIZER_NO_LIMIT, load_target

    config = json.loads((tiny_target_dir / "tokenizer_config.json").read_text())
    assert config["model_max_length"] == 4096  # what transformers compares a prompt with
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        target = load_target(tiny_target_dir)
        capfd.readouterr()
        ids = target.tokenizer.apply_chat_template(
            [{"role": "user", "content": "The capital of France is Paris. " * 700}],
            add_generation_prompt=True)
        again = target.tokenizer.encode("Hello world! " * 2000)
    finally:
        logger.removeHandler(handler)
    assert len(ids) > 4096 and len(again) > 4096
    err = capfd.readouterr().err
    assert "Token indices sequence length" not in err
    assert not [r for r in records if "Token indices sequence length" in r.getMessage()]
    assert target.tokenizer._tokenizer.model_max_length == TOKENIZER_NO_LIMIT


@pytest.mark.parametrize("window", [None, 40])
def test_block_rows_written_past_the_context_equal_a_concatenation(window):
    """with_block writes the block into the buffers' spare rows instead of concatenating:
    the same keys and values, and the cache's own rows and offset unchanged."""
    cache = DraftContextCache(window, margin=4)
    cache.step = 16
    mx.random.seed(0)
    L = 5
    for rows in [30, 7, 1, 12, 9, 16]:
        k = mx.random.normal((1, 2, rows, 8))
        v = mx.random.normal((1, 2, rows, 8))
        cache.append(k, v)
        kb = mx.random.normal((1, 2, L, 8))
        vb = kb + 1
        lo = cache.visible_start(cache.offset)
        held_k, held_v = cache.fetch(lo)
        want_k = mx.concatenate([held_k, kb], axis=2)
        want_v = mx.concatenate([held_v, vb], axis=2)
        offset, size = cache.offset, cache.size
        got_k, got_v = cache.with_block(lo, kb, vb)
        assert mx.array_equal(got_k, want_k).item() and mx.array_equal(got_v, want_v).item()
        assert (cache.offset, cache.size) == (offset, size)
        again_k, again_v = cache.fetch(lo)
        assert mx.array_equal(again_k, held_k).item() and mx.array_equal(again_v, held_v).item()
    assert window is None or cache.start > 0  # the window dropped old rows on the way
    empty = DraftContextCache(window)
    kb = mx.ones((1, 2, L, 8))
    assert empty.with_block(0, kb, kb)[0] is kb  # nothing held: the block alone

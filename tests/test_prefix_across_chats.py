"""The prefix cache across conversations: a new chat reuses the system + tools preamble, a chat
the user comes back to reuses its whole state, and both give a cold run's tokens and caches.

Caches are compared as the exactness suite compares them (``tests/test_engine_exact.py``:
every layer's attention K/V and Gated DeltaNet state, zero tolerance except float32 under
OpenBLAS), on a hybrid and a dense family in the dtypes users run.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from engine_fixtures import FAST, collect
from test_engine_exact import _variant, cache_state, cache_tol, max_difference

from app.chat.reply import ReplySettings, preamble_boundary
from app.engine.generate import GenerationConfig, generate
from app.engine.prefix import PromptCache


@pytest.fixture(scope="module")
def wide_root(tmp_path_factory):
    """Where this module's tiny pairs are built (one per family and dtype)."""
    return tmp_path_factory.mktemp("prefix_pairs")


SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}


def _chat(target, *texts: str) -> tuple[list[int], list[int]]:
    """(prompt ids, boundaries) of a conversation: the system message, then ``texts`` as the
    user's messages (a one-message chat when one text is given)."""
    convo = [SYSTEM] + [{"role": "user", "content": t} for t in texts]
    ids = list(target.tokenizer.apply_chat_template(convo, add_generation_prompt=True))
    return ids, preamble_boundary(target, convo, ReplySettings(), ids)


def _gen(target, ids, boundaries, session, drafter=None, mode="plain", n=10):
    cfg = GenerationConfig(mode=mode, max_tokens=n, block_size=4)
    return collect(generate(target, ids, cfg, drafter, session=session, boundaries=boundaries))


@pytest.mark.parametrize("mode", ["plain", "dflash"])
@pytest.mark.parametrize("name", ["qwen3_5-float32", "qwen3_5-bfloat16", "qwen3-bfloat16"] if FAST
                         else ["qwen3_5-float32", "qwen3_5-bfloat16", "qwen3_5-4bit-bf16",
                               "qwen3-bfloat16", "qwen3-4bit-bf16"])
def test_a_new_chat_reuses_the_preamble_and_equals_a_cold_run(wide_root, name, mode):
    target, drafter, dtype = _variant(wide_root, name)
    first, b1 = _chat(target, "Name a capital.")
    second, b2 = _chat(target, "What is two plus two?")
    assert b1 == b2 and 0 < b1[0] < len(second)  # the preamble, shared by both chats
    warm = PromptCache()
    _gen(target, first, b1, warm, drafter, mode)
    reused = _gen(target, second, b2, warm, drafter, mode)
    # a hybrid target resumes at the snapshot; a dense one trims to the longest common prefix
    assert reused.summary.reused_tokens == b2[0] if name.startswith("qwen3_5") else \
        reused.summary.reused_tokens >= b2[0]
    cold = PromptCache()
    fresh = _gen(target, second, b2, cold, drafter, mode)
    assert fresh.summary.reused_tokens == 0
    assert reused.tokens == fresh.tokens
    worst = max_difference(cache_state(warm.target_cache), cache_state(cold.target_cache))
    assert worst <= cache_tol(dtype), f"{name} {mode}: caches differ by {worst:.3g}"
    if mode == "dflash":  # the drafter's context was reused too, and covers the same rows
        assert warm.drafter_len == cold.drafter_len == len(warm.ids)
        for a, b in zip(warm.drafter_cache, cold.drafter_cache):
            n = b.size
            assert a.offset == b.offset
            np.testing.assert_allclose(np.array(a.keys[..., :n, :].astype(mx.float32)),
                                       np.array(b.keys[..., :n, :].astype(mx.float32)),
                                       atol=1e-2 if dtype != mx.float32 else 1e-4)


@pytest.mark.parametrize("name", ["qwen3_5-bfloat16", "qwen3-bfloat16"])
def test_coming_back_to_a_chat_reuses_its_whole_state(wide_root, name):
    """Chat A, then chat B, then A's next turn: A's state is brought back from the saved
    states whole (not only the preamble), and the turn equals the one a session that never
    left A gives, tokens and caches bit for bit."""
    target, drafter, dtype = _variant(wide_root, name)
    a1, ba = _chat(target, "Name a capital.")
    b1, bb = _chat(target, "What is two plus two?")
    switched, stayed = PromptCache(), PromptCache()
    first = _gen(target, a1, ba, switched)
    assert _gen(target, a1, ba, stayed).tokens == first.tokens
    _gen(target, b1, bb, switched)
    assert [len(s.ids) for s in switched.saved] == [len(a1) + len(first.tokens) - 1]
    a2 = a1 + first.tokens + list(target.tokenizer.encode("\nAnd another?",
                                                          add_special_tokens=False))
    back = _gen(target, a2, ba, switched)
    assert switched.last_source == "saved"
    assert back.summary.reused_tokens == len(a1) + len(first.tokens) - 1
    same = _gen(target, a2, ba, stayed)
    assert back.tokens == same.tokens
    assert max_difference(cache_state(switched.target_cache), cache_state(stayed.target_cache)) == 0


def test_a_saved_state_is_never_changed_by_later_turns(wide_root):
    """The saved copy of chat A shares arrays with the working state that went on to chat B;
    B's prefill writes new buffers and leaves A's rows and recurrent state as they were."""
    target, _, _ = _variant(wide_root, "qwen3_5-bfloat16")
    a1, ba = _chat(target, "Name a capital.")
    b1, bb = _chat(target, "What is two plus two?")
    cache = PromptCache()
    _gen(target, a1, ba, cache)
    before = cache_state(cache.target_cache)
    _gen(target, b1, bb, cache, n=20)
    (saved,) = cache.saved
    assert max_difference(cache_state(saved.target_cache), before) == 0
    assert cache_state(saved.target_cache) and cache.ids[: ba[0]] == saved.ids[: ba[0]]


def test_saved_states_are_bounded_in_bytes_least_recently_used_first(wide_root):
    target, _, _ = _variant(wide_root, "qwen3_5-bfloat16")
    chats = [_chat(target, f"Question number {i}?") for i in range(4)]
    cache = PromptCache()
    for ids, b in chats:
        _gen(target, ids, b, cache)
    assert len(cache.saved) == 3
    counted = sum(a.nbytes for a in _all_arrays(cache))
    assert cache.nbytes < counted  # the preamble's rows and snapshot are shared, counted once
    cache.resize(cache.nbytes - 1)  # one state too many: the least recently used goes
    assert [next(i for i, (ids, _) in enumerate(chats) if s.ids[: len(ids)] == ids)
            for s in cache.saved] == [1, 2]
    cache.resize(0)
    assert cache.saved == [] and cache.target_cache is not None  # the working state stays


def test_no_saved_states_with_a_zero_bound(wide_root):
    target, _, _ = _variant(wide_root, "qwen3_5-bfloat16")
    cache = PromptCache(max_bytes=0)
    (a, ba), (b, bb) = _chat(target, "Name a capital."), _chat(target, "Two plus two?")
    _gen(target, a, ba, cache)
    again = _gen(target, b, bb, cache)
    assert cache.saved == [] and again.summary.reused_tokens == ba[0]


def _all_arrays(cache: PromptCache) -> list:
    from app.engine.prefix import _state_arrays

    out = _state_arrays(cache.target_cache, cache.drafter_cache, cache.snapshots,
                        cache.kept_contexts)
    for s in cache.saved:
        out += _state_arrays(s.target_cache, s.drafter_cache, s.snapshots, s.kept_contexts)
    return out


def test_the_bound_is_set_by_the_cli_flag_or_its_variable(monkeypatch):
    """``python -m app --prefix-cache-mb N`` sets DFLASH_PREFIX_CACHE_MB, which
    default_max_bytes reads (0: keep only the last reply's state); without it, a tenth of
    the memory within 256 MiB..2 GiB."""
    import os

    from app.cli import build_parser, main
    from app.engine.prefix import PREFIX_CACHE_ENV, default_max_bytes

    monkeypatch.delenv(PREFIX_CACHE_ENV, raising=False)
    assert default_max_bytes(8 * 1024**3) == 8 * 1024**3 // 10
    assert default_max_bytes(1024**3) == 256 * 1024**2
    assert default_max_bytes(64 * 1024**3) == 2 * 1024**3
    monkeypatch.setenv(PREFIX_CACHE_ENV, "0")
    assert default_max_bytes() == 0 and PromptCache().max_bytes == 0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--prefix-cache-mb", "-1"])
    assert main(["--prefix-cache-mb", "64", "tools"]) == 0
    assert os.environ[PREFIX_CACHE_ENV] == "64" and default_max_bytes() == 64 * 1024**2

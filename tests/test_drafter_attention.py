"""The drafter's attention computes what z-lab's reference computes (CPU, float32).

The rule (``app.engine.drafter.attention_visibility``): every layer is non-causal; a
``sliding_attention`` layer with window ``w`` lets a query at position ``q`` see the keys at
positions ``k`` with ``|q - k| <= w - 1`` (flash-attn's ``window_size=(w - 1, w - 1)``, which
transformers passes for ``sliding_window=w``); no window when ``use_sliding_window`` is false.
The reference below recomputes every layer over the whole context with masks built by a double
loop over positions, and a plain softmax attention; the drafter under test keeps bounded caches.
"""

from __future__ import annotations

import copy

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.rope_utils import YarnRoPE, initialize_rope

from app.engine.drafter import (
    DFlashDrafter,
    DraftContextCache,
    DrafterConfig,
    attention_visibility,
)
from app.engine.errors import ModelLoadError

HIDDEN, VOCAB, N_TAPS = 32, 61, 2


def _tolerance() -> float:
    """1e-6 on logits with the mlx-cpu wheel's reference BLAS (measured: 0, bitwise equal).
    An optimized BLAS (OpenBLAS, what ``make test`` preloads) rounds a float32 product
    differently with its row count (``shared/DFLASH_NOTES.md``, "Numerics"), and the reference
    projects every context row in one product while the cache projects them chunk by chunk:
    measured up to 4e-6 there, so 2e-5 under an optimized BLAS."""
    from app.engine.blas import blas_in_use

    info = blas_in_use(load_mlx=True)
    return 2e-5 if info.optimized else 1e-6


TOL = _tolerance()


def _config(**over) -> dict:
    cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": HIDDEN, "intermediate_size": 48, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "vocab_size": VOCAB, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "sliding_window": 7, "use_sliding_window": True, "max_position_embeddings": 4096,
        "dflash_config": {"block_size": 4, "mask_token_id": VOCAB - 1,
                          "target_layer_ids": [0, 1]},
    }
    cfg.update(over)
    return cfg


def _drafter(seed: int = 0, **over) -> DFlashDrafter:
    mx.random.seed(seed)
    model = DFlashDrafter(DrafterConfig.from_dict(_config(**over)))
    # random (non-unit) norm weights, so every norm matters
    from mlx.utils import tree_flatten, tree_unflatten

    params = [(k, v + 0.3 * mx.random.normal(v.shape) if v.ndim == 1 else v)
              for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    return model


# -- an independent reference ---------------------------------------------------------------

def _reference_mask(q_start, q_len, k_start, k_len, window, causal=False) -> np.ndarray:
    """Double loop over positions: the reference's visibility, True = attend."""
    m = np.zeros((q_len, k_len), dtype=bool)
    for i in range(q_len):
        q = q_start + i
        for j in range(k_len):
            k = k_start + j
            ok = True
            if causal and k > q:
                ok = False
            if window is not None:
                if q - k > window - 1:
                    ok = False
                if not causal and k - q > window - 1:
                    ok = False
            m[i, j] = ok
    return m


def _softmax_attention(q, k, v, mask, scale):
    """q (B, H, L, D), k/v (B, Hkv, S, D), mask (L, S) bool; a plain float32 attention."""
    rep = q.shape[1] // k.shape[1]
    k = mx.repeat(k, rep, axis=1)
    v = mx.repeat(v, rep, axis=1)
    scores = (q * scale) @ k.transpose(0, 1, 3, 2)
    scores = mx.where(mx.array(mask), scores, -np.inf)
    return mx.softmax(scores, axis=-1, precise=True) @ v


def reference_hidden(model: DFlashDrafter, taps_all: mx.array, block_emb: mx.array,
                     window_override="config") -> mx.array:
    """The drafter's final hidden states recomputed from scratch over the whole context
    ``taps_all`` (B, P, n_taps * hidden): keys for every context position, masks from
    :func:`_reference_mask`."""
    ctx = model.hidden_norm(model.fc(taps_all))
    P, L = taps_all.shape[1], block_emb.shape[1]
    h = block_emb
    for layer in model.layers:
        att = layer.self_attn
        window = att.window if window_override == "config" else window_override
        x = layer.input_layernorm(h)
        B = x.shape[0]
        q = att.q_norm(att.q_proj(x).reshape(B, L, att.n_heads, att.head_dim))
        q = att.rope(q.transpose(0, 2, 1, 3), offset=P)
        both = mx.concatenate([ctx, x], axis=1)
        k = att.k_norm(att.k_proj(both).reshape(B, P + L, att.n_kv_heads, att.head_dim))
        v = att.v_proj(both).reshape(B, P + L, att.n_kv_heads, att.head_dim)
        k = att.rope(k.transpose(0, 2, 1, 3), offset=0)
        v = v.transpose(0, 2, 1, 3)
        mask = _reference_mask(P, L, 0, P + L, window, att.causal)
        out = _softmax_attention(q, k, v, mask, att.scale)
        h = h + att.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.norm(h)


# -- masks ----------------------------------------------------------------------------------

@pytest.mark.parametrize("window", [None, 1, 3, 4, 7, 50])
@pytest.mark.parametrize("ctx_len", [0, 2, 6, 20])
@pytest.mark.parametrize("block", [1, 4, 9])
def test_mask_matches_the_double_loop(window, ctx_len, block):
    """Full (window None) and sliding layers; context shorter and longer than the window;
    a block longer than the window (the general case)."""
    for lo in sorted({0, max(0, ctx_len - (window or 1) + 1), ctx_len}):
        k_len = ctx_len - lo + block
        got = attention_visibility(ctx_len, block, lo, k_len, window)
        want = _reference_mask(ctx_len, block, lo, k_len, window)
        if got is None:
            assert want.all()
        else:
            assert got.dtype == mx.bool_ and got.shape == (block, k_len)
            assert (np.array(got) == want).all()


def test_mask_examples_pinned():
    # window 3 (keys within 2 positions on either side), 4 context rows, a block of 3
    got = np.array(attention_visibility(4, 3, 0, 7, 3)).astype(int)
    assert got.tolist() == [
        [0, 0, 1, 1, 1, 1, 1],  # q=4 sees 2..6
        [0, 0, 0, 1, 1, 1, 1],  # q=5 sees 3..6 (7 would be next)
        [0, 0, 0, 0, 1, 1, 1],  # q=6 sees 4..6
    ]
    # the block is bidirectional: no key of the block is masked for window >= block size
    assert attention_visibility(0, 4, 0, 4, None) is None
    assert attention_visibility(0, 4, 0, 4, 4) is None
    # a causal config (``is_causal: true``) masks later block keys
    causal = np.array(attention_visibility(2, 3, 0, 5, None, causal=True)).astype(int)
    assert causal.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


def test_block_is_bidirectional_in_sliding_layers():
    """Fails on the old behaviour (causal block in sliding layers): with only sliding layers
    the first block row must still depend on the last one."""
    model = _drafter(layer_types=["sliding_attention"] * 3)
    taps = mx.random.normal((1, 5, N_TAPS * HIDDEN))
    emb = mx.random.normal((1, 4, HIDDEN))
    emb2 = mx.concatenate([emb[:, :3], emb[:, 3:] + 1.0], axis=1)
    h1 = model(emb, taps, model.make_cache())
    h2 = model(emb2, taps, model.make_cache())
    assert float(mx.abs(h1[:, 0] - h2[:, 0]).max()) > 1e-3
    ref = reference_hidden(model, taps, emb)
    assert float(mx.abs(h1 - ref).max()) <= TOL


# -- bounded caches equal the unbounded computation -----------------------------------------

def _cycles(model, caches, n_cycles=24, seed=1, prompt=5, head=None):
    """Run prefill + cycles through ``model`` with ``caches`` and through the reference;
    returns (max logit difference, draft tokens equal in every cycle, max cache rows)."""
    rng = np.random.default_rng(seed)
    L = model.config.block_size
    head = head if head is not None else mx.random.normal((VOCAB, HIDDEN), key=mx.random.key(7))
    taps_all = mx.array(rng.standard_normal((1, prompt, N_TAPS * HIDDEN)).astype(np.float32))
    model.extend_context(taps_all, caches)
    pending_taps = None
    worst, same, rows = 0.0, True, 0
    for _ in range(n_cycles):
        emb = mx.array(rng.standard_normal((1, L, HIDDEN)).astype(np.float32))
        got = model(emb, pending_taps, caches)
        if pending_taps is not None:
            taps_all = mx.concatenate([taps_all, pending_taps], axis=1)
        want = reference_hidden(model, taps_all, emb)
        lg, lw = got[:, 1:] @ head.T, want[:, 1:] @ head.T
        worst = max(worst, float(mx.abs(lg - lw).max()))
        same &= mx.argmax(lg, -1).tolist() == mx.argmax(lw, -1).tolist()
        assert all(cc.offset == taps_all.shape[1] for cc in caches)
        rows = max(rows, *(0 if cc.keys is None else cc.keys.shape[2]
                           for cc in caches if cc.window is not None))
        n = int(rng.integers(1, L + 1))  # committed this cycle: accepted + 1
        pending_taps = mx.array(rng.standard_normal((1, n, N_TAPS * HIDDEN)).astype(np.float32))
    return worst, same, rows, taps_all.shape[1]


@pytest.mark.parametrize("margin,step", [(0, 4), (3, 8)])
def test_bounded_cache_equals_unbounded_reference(margin, step):
    """Context grows well past the window (7) over many cycles; sliding caches hold only
    the window's rows; drafts identical, logits within 1e-6 (reference BLAS)."""
    model = _drafter()
    caches = model.make_cache()
    for c in caches:
        c.margin, c.step = margin, step
    worst, same, rows, ctx = _cycles(model, caches)
    assert ctx > 4 * 7
    assert same
    assert worst <= TOL, worst
    assert rows <= 7 - 1 + margin + 2 * step
    full = [c for c in caches if c.window is None]
    assert full and all(c.start == 0 and c.size == ctx for c in full)
    assert all(c.start > 0 and c.size <= 7 - 1 + margin + 2 * step
               for c in caches if c.window is not None)


def test_default_cache_bounded_by_window_and_margin():
    """The default margin and step, context past window + margin (long prompt prefill)."""
    model = _drafter(sliding_window=9)
    caches = model.make_cache()
    worst, same, rows, ctx = _cycles(model, caches, n_cycles=6, prompt=700)
    assert same and worst <= TOL, worst
    c = caches[0]
    assert c.keep == 9 - 1 + c.margin and rows <= c.keep + 2 * c.step
    assert c.start >= ctx - c.keep - 2 * c.step and c.exact


def test_window_larger_than_block_and_block_larger_than_window():
    for window, block in [(1, 4), (2, 4), (3, 8), (64, 4)]:
        model = _drafter(sliding_window=window, dflash_config={
            "block_size": block, "mask_token_id": VOCAB - 1, "target_layer_ids": [0, 1]})
        caches = model.make_cache()
        for c in caches:
            c.margin, c.step = 0, 4
        worst, same, _, _ = _cycles(model, caches, n_cycles=10)
        assert same and worst <= TOL, (window, block, worst)


# -- trimming (prefix reuse) ----------------------------------------------------------------

def test_trim_within_margin_is_exact_and_deeper_trim_is_reported():
    model = _drafter()
    caches = model.make_cache()
    for c in caches:
        c.margin, c.step = 4, 4
    rng = np.random.default_rng(3)
    taps = mx.array(rng.standard_normal((1, 30, N_TAPS * HIDDEN)).astype(np.float32))
    model.extend_context(taps, caches)
    assert all(c.can_trim_exactly(4) for c in caches)
    for c in caches:
        assert c.trim(4) == 4 and c.offset == 26 and c.exact
    new = mx.array(rng.standard_normal((1, 3, N_TAPS * HIDDEN)).astype(np.float32))
    emb = mx.array(rng.standard_normal((1, 4, HIDDEN)).astype(np.float32))
    got = model(emb, new, caches)
    want = reference_hidden(model, mx.concatenate([taps[:, :26], new], axis=1), emb)
    assert float(mx.abs(got - want).max()) <= TOL
    # a trim deeper than the margin: said beforehand, the cache still runs
    sliding = caches[0]
    assert not sliding.can_trim_exactly(20) and caches[1].can_trim_exactly(20)
    for c in caches:
        c.trim(20)
    assert all(c.offset == 9 for c in caches) and not sliding.exact
    out = model(emb, new, caches)
    assert out.shape == (1, 4, HIDDEN) and all(c.offset == 12 for c in caches)


def test_trim_api_matches_kvcache():
    c = DraftContextCache(window=None)
    k = mx.ones((1, 2, 5, 8))
    c.append(k, k)
    assert c.is_trimmable() and c.trim(2) == 2 and c.offset == 3
    assert c.trim(10) == 3 and c.offset == 0 and c.fetch(0) == (None, None)


# -- config: use_sliding_window, rope_scaling, is_causal ------------------------------------

def test_use_sliding_window_false_means_no_window():
    model = _drafter(use_sliding_window=False)
    assert model.config.sliding_window is None
    assert all(layer.self_attn.window is None for layer in model.layers)
    assert model.layers[0].self_attn.sliding  # still a sliding_attention layer by name
    caches = model.make_cache()
    assert all(c.window is None for c in caches)
    rng = np.random.default_rng(5)
    taps = mx.array(rng.standard_normal((1, 40, N_TAPS * HIDDEN)).astype(np.float32))
    emb = mx.array(rng.standard_normal((1, 4, HIDDEN)).astype(np.float32))
    got = model(emb, taps, caches)
    assert float(mx.abs(got - reference_hidden(model, taps, emb, window_override=None)).max()) \
        <= TOL
    # with the window on, the same weights give a different result (40 > window 7)
    windowed = copy.deepcopy(model)
    for layer, t in zip(windowed.layers, model.config.layer_types):
        layer.self_attn.window = 7 if t == "sliding_attention" else None
    other = windowed(emb, taps, windowed.make_cache())
    assert float(mx.abs(got - other).max()) > 1e-3
    # absent use_sliding_window keeps the configured window
    cfg = _config()
    del cfg["use_sliding_window"]
    assert DrafterConfig.from_dict(cfg).sliding_window == 7


@pytest.mark.parametrize("scaling", [
    None,
    {"rope_type": "linear", "factor": 2.0},
    {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 1024},
])
def test_rope_scaling_built_as_mlx_lm_does(scaling):
    over = {"rope_theta": 50000.0}
    if scaling is not None:
        over["rope_scaling"] = scaling
    model = _drafter(**over)
    want = initialize_rope(8, 50000.0, False, scaling, 4096)
    x = mx.random.normal((1, 4, 6, 8))
    for layer in model.layers:
        rope = layer.self_attn.rope
        assert type(rope) is type(want)
        assert mx.array_equal(rope(x, offset=1000), want(x, offset=1000))
    if scaling and scaling.get("rope_type") == "linear":
        assert model.layers[0].self_attn.rope.scale == 0.5


def test_rope_parameters_with_a_rope_type_are_honoured():
    params = {"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0,
              "original_max_position_embeddings": 1024}
    model = _drafter(rope_parameters=params)
    assert model.config.rope_theta == 10000.0
    assert isinstance(model.layers[0].self_attn.rope, YarnRoPE)
    plain = _drafter()  # rope_type default -> plain RoPE
    assert type(plain.layers[0].self_attn.rope) is nn.RoPE
    # rope_scaling wins over rope_parameters when both are given
    both = _drafter(rope_parameters=params, rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert type(both.layers[0].self_attn.rope) is nn.RoPE


def test_unknown_rope_type_is_a_load_error():
    with pytest.raises(ModelLoadError, match="RoPE type"):
        DrafterConfig.from_dict(_config(rope_scaling={"rope_type": "bogus", "factor": 2.0}))


def test_explicit_is_causal_config_masks_later_block_keys():
    model = _drafter(is_causal=True)
    assert all(layer.self_attn.causal for layer in model.layers)
    rng = np.random.default_rng(9)
    taps = mx.array(rng.standard_normal((1, 12, N_TAPS * HIDDEN)).astype(np.float32))
    emb = mx.array(rng.standard_normal((1, 4, HIDDEN)).astype(np.float32))
    got = model(emb, taps, model.make_cache())
    assert float(mx.abs(got - reference_hidden(model, taps, emb)).max()) <= TOL
    assert not _drafter().layers[0].self_attn.causal  # the default: non-causal


# -- through the generator and prefix reuse ---------------------------------------------------

def test_generation_with_bounded_caches_drafts_as_unbounded(tiny_dense, monkeypatch):
    """A whole DFlash run (tiny dense pair, drafter window 32) with bounded sliding caches
    (margin 8) drafts exactly what the same drafter drafts with caches that keep every row
    (the masks alone enforcing the window). Then prefix reuse: a trim within the margin
    gives the drafts of a cold run; a deeper one (the chat template re-rendering the reply)
    is reported as inexact, and the output still equals a cold run's."""
    from engine_fixtures import collect, prompt_ids

    from app.engine.drafter import DFlashDrafter
    from app.engine.generate import GenerationConfig, generate
    from app.engine.prefix import PromptCache

    target, drafter = tiny_dense
    window = drafter.model.layers[0].self_attn.window
    assert window == 32 and drafter.model.layers[1].self_attn.window is None
    margin, step = 8, 8

    def patched(keep_all):
        def make_cache(self):
            out = []
            for layer in self.layers:
                c = DraftContextCache(None if keep_all else layer.self_attn.window, margin)
                c.step = step
                out.append(c)
            return out
        return make_cache

    drafts: list = []
    real_draft = DFlashDrafter.draft

    def recording_draft(self, *a, **kw):
        out = real_draft(self, *a, **kw)
        drafts.append(out.tolist())
        return out

    def gen(ids, session=None, n=80):
        drafts.clear()
        cfg = GenerationConfig(mode="dflash", max_tokens=n, block_size=8)
        res = collect(generate(target, ids, cfg, drafter, session))
        return res, list(drafts)

    monkeypatch.setattr(DFlashDrafter, "draft", recording_draft)
    ids = prompt_ids(target)
    monkeypatch.setattr(DFlashDrafter, "make_cache", patched(True))
    full, full_drafts = gen(ids)
    monkeypatch.setattr(DFlashDrafter, "make_cache", patched(False))
    session = PromptCache()
    bounded, bounded_drafts = gen(ids, session)
    assert bounded.tokens == full.tokens
    assert bounded_drafts == full_drafts and len(bounded_drafts) > 8
    sliding = session.drafter_cache[0]
    assert sliding.offset == len(session.ids) > window + margin + 2 * step
    assert sliding.start > 0 and sliding.keys.shape[2] <= window - 1 + margin + 2 * step

    # a shallow trim (5 positions, within the margin): exact, the drafts of a cold run
    ids2 = session.ids[:-5] + ids[-6:]
    assert all(c.can_trim_exactly(len(session.ids) - (len(ids2) - 6)) for c in
               session.drafter_cache)
    warm, warm_drafts = gen(ids2, session, n=24)
    cold, cold_drafts = gen(ids2, None, n=24)
    assert warm.summary.reused_tokens == len(ids2) - 6
    assert warm.tokens == cold.tokens and warm_drafts == cold_drafts

    # a deep trim: the template re-renders the reply, the common prefix ends far back
    convo = [{"role": "user", "content": "What is the capital of France? Think first."},
             {"role": "assistant", "content": target.tokenizer.decode(warm.tokens)},
             {"role": "user", "content": "And of Spain?"}]
    ids3 = prompt_ids(target, convo)
    reuse = session.prepare(ids3, True)  # generate's own prepare then finds nothing to cut
    assert reuse > 0 and all(c.offset == reuse for c in session.drafter_cache)
    assert not session.drafter_cache[0].exact and session.drafter_cache[1].exact
    warm, _ = gen(ids3, session, n=16)
    cold, _ = gen(ids3, None, n=16)
    assert warm.summary.reused_tokens == reuse and warm.tokens == cold.tokens
    assert all(c.offset == len(session.ids) for c in session.drafter_cache)

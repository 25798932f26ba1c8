"""The target model as the DFlash loop needs it: forward passes that capture tap hidden states
and record the Gated DeltaNet inputs for an exact, cheap rollback.

mlx-lm's models are used as they are (no file of mlx-lm is edited): this module walks
``model.layers`` itself so it can read the residual stream after chosen layers. Attention layers
and MLPs are called as mlx-lm defines them. For Gated DeltaNet (GDN) layers
(``qwen3_5``, ``qwen3_5_moe``, ``qwen3_next``) :func:`gdn_forward` performs the same operations
as mlx-lm 0.32.2's ``GatedDeltaNet.__call__`` (pinned in pyproject.toml) while keeping the
per-position inputs of the recurrence (q, k, v, a, b) and the convolution input, so that a
partially accepted block can be rolled back by re-running only the recurrence over the
committed positions (:meth:`GDNTape.rollback`).

The GDN recurrence (Yang et al. 2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule")
is run through :func:`app.engine.kernels.gdn_kernel.gated_delta_update`: mlx-lm's ``gated_delta_update``
(so Apple GPUs keep mlx-lm's Metal kernel and the CPU its operations loop), or on MLX's CUDA
backend the project's own kernel, which plain decoding then shares (``generate._plain_body``).
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask, create_ssm_mask
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache
from mlx_lm.models.gated_delta import normalize_qk

from app.engine.errors import GenerationError, UnsupportedArchitectureError
from app.engine.gdn_chunked import chunked_gated_delta_update
from app.engine.kernels import gdn_kernel
from app.engine.kernels.gdn_kernel import gated_delta_update
from app.engine.kernels.row_products import use_row_stable_products

#: model_type values whose layer structure this module knows (taps and rollback).
TAP_FAMILIES = {"qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen3", "llama"}


@dataclass
class GDNTape:
    """What one GDN layer saw during a verify pass, enough to roll it back.

    Shapes (B = batch, S = verify length, K = conv kernel):
        conv_before: ``(B, K-1, conv_dim)`` conv state before the pass.
        state_before: ``(B, Hv, Dv, Dk)`` float32 recurrent state before the pass.
        conv_input: ``(B, K-1+S, conv_dim)`` the convolution's input.
        q, k: ``(B, S, Hk, Dk)`` normalised; v: ``(B, S, Hv, Dv)``; a, b: ``(B, S, Hv)``.
    """

    layer: Any
    cache: ArraysCache
    conv_before: mx.array
    state_before: mx.array | None
    conv_input: mx.array
    q: mx.array
    k: mx.array
    v: mx.array
    a: mx.array
    b: mx.array

    def restore(self) -> None:
        """Put the pre-verify conv and recurrent state back (no computation)."""
        self.cache[0] = self.conv_before
        self.cache[1] = self.state_before

    def rollback(self, n: int) -> None:
        """Set the cache to the state after the first ``n`` positions of the pass.

        Re-runs the recurrence over ``n`` positions from the pre-verify state (the same
        per-step operations the verify pass and plain decoding run) and cuts the conv state
        out of the recorded conv input: rows ``n .. n+K-2``.
        """
        attn = self.layer
        km1 = self.conv_before.shape[1]
        self.cache[0] = mx.contiguous(self.conv_input[:, n : n + km1, :])
        _, state = gated_delta_update(
            self.q[:, :n],
            self.k[:, :n],
            self.v[:, :n],
            self.a[:, :n],
            self.b[:, :n],
            attn.A_log,
            attn.dt_bias,
            self.state_before,
            None,
            use_kernel=not attn.training,
        )
        self.cache[1] = state


def _gdn_project(attn: nn.Module, x: mx.array):
    """The input projections of a GDN layer: ``(mixed_qkv, z, b, a)`` for either family."""
    B, S, _ = x.shape
    if hasattr(attn, "in_proj_qkvz"):  # qwen3_next
        q, k, v, z, b, a = attn.fix_query_key_value_ordering(
            attn.in_proj_qkvz(x), attn.in_proj_ba(x)
        )
        qkv = mx.concatenate([q.reshape(B, S, -1), k.reshape(B, S, -1), v.reshape(B, S, -1)], -1)
        return qkv, z, b, a
    qkv = attn.in_proj_qkv(x)
    z = attn.in_proj_z(x).reshape(B, S, attn.num_v_heads, attn.head_v_dim)
    return qkv, z, attn.in_proj_b(x), attn.in_proj_a(x)


def _split_heads(attn: nn.Module, conv_out: mx.array) -> list[mx.array]:
    """``[q, k, v]`` of the convolution's output ``(B, S, conv_dim)``: q and k
    ``(B, S, Hk, Dk)``, v ``(B, S, Hv, Dv)``."""
    B, S, _ = conv_out.shape
    return [
        t.reshape(B, S, h, d)
        for t, h, d in zip(
            mx.split(conv_out, [attn.key_dim, 2 * attn.key_dim], -1),
            [attn.num_k_heads, attn.num_k_heads, attn.num_v_heads],
            [attn.head_k_dim, attn.head_k_dim, attn.head_v_dim],
        )
    ]


def gdn_forward(
    attn: nn.Module,
    x: mx.array,
    mask,
    cache: ArraysCache,
    tapes: list[GDNTape] | None,
    chunked: bool = False,
) -> mx.array:
    """mlx-lm 0.32.2's ``GatedDeltaNet.__call__`` (qwen3_5 / qwen3_next), recording a tape.

    Args:
        attn: the layer's ``linear_attn`` module.
        x: ``(B, S, hidden)`` normed input.
        mask: the SSM mask from ``create_ssm_mask`` (None for unpadded batch 1).
        cache: the layer's ``ArraysCache(size=2)``: ``[conv_state, recurrent_state]``.
        tapes: when a list, a :class:`GDNTape` for this call is appended to it.
        chunked: compute the recurrence with the chunked (parallel-in-time) form
            (:mod:`app.engine.gdn_chunked`, the opt-in ``fast_verify``): the outputs agree with
            the step loop only to rounding, and that rounding reaches everything computed from
            them (deeper layers, attention K/V); it is not exact.

    Returns:
        ``(B, S, hidden)`` layer output; the cache is updated as mlx-lm would update it.
    """
    return _gdn_on_cache(attn, x, cache, tapes,
                         lambda conv, state: _gdn_mix(attn, x, conv, state, mask, chunked))


def _gdn_on_cache(attn: nn.Module, x: mx.array, cache: ArraysCache,
                  tapes: list[GDNTape] | None, mix, zero_state: bool = False) -> mx.array:
    """Run ``mix(conv_before, state_before)`` (:func:`_gdn_mix` or a compiled layer program:
    ``(out, conv_state, state, conv_input, q, k, v, a, b)``) on the states in ``cache``,
    store its new states, advance the cache by ``x``'s ``S`` positions and append the
    :class:`GDNTape`. An empty conv state is zeros; an empty recurrent state stays None
    unless ``zero_state`` (a compiled program takes arrays only). Returns ``out``."""
    B, S, _ = x.shape
    conv_before, state_before = cache[0], cache[1]
    if conv_before is None:
        conv_before = mx.zeros((B, attn.conv_kernel_size - 1, attn.conv_dim), dtype=x.dtype)
    if state_before is None and zero_state:
        state_before = mx.zeros((B, attn.num_v_heads, attn.head_v_dim, attn.head_k_dim),
                                dtype=mx.float32)
    out, cache[0], cache[1], *kept = mix(conv_before, state_before)
    cache.advance(S)
    if tapes is not None:
        tapes.append(GDNTape(attn, cache, conv_before, state_before, *kept))
    return out


def _gdn_mix(attn: nn.Module, x: mx.array, conv_before: mx.array, state_before, mask,
             chunked: bool = False):
    """The operations of mlx-lm 0.32.2's ``GatedDeltaNet.__call__`` as a pure function of
    arrays (what :func:`gdn_forward` and the compiled layer program both run).

    Args:
        x: ``(B, S, hidden)`` normed input; conv_before ``(B, K-1, conv_dim)``;
            state_before ``(B, Hv, Dv, Dk)`` or None (zeros); mask and chunked as in
            :func:`gdn_forward`.

    Returns:
        ``(out (B, S, hidden), conv_state, state, conv_input, q, k, v, a, b)``: the new conv
        and recurrent states and what a :class:`GDNTape` keeps.
    """
    B, S, _ = x.shape
    qkv, z, b, a = _gdn_project(attn, x)
    if mask is not None:
        qkv = mx.where(mask[..., None], qkv, 0)
    conv_input = mx.concatenate([conv_before, qkv], axis=1)
    conv_state = mx.contiguous(conv_input[:, -(attn.conv_kernel_size - 1):, :])
    conv_out = nn.silu(attn.conv1d(conv_input))
    q, k, v = _split_heads(attn, conv_out)
    q, k = normalize_qk(q, k, inv_scale=attn.head_k_dim**-0.5, eps=1e-6)
    update = chunked_gated_delta_update if chunked else gated_delta_update
    out, state = update(
        q, k, v, a, b, attn.A_log, attn.dt_bias, state_before, mask, use_kernel=not attn.training
    )
    out = attn.out_proj(attn.norm(out, z).reshape(B, S, -1))
    return out, conv_state, state, conv_input, q, k, v, a, b


COMPILE_LAYERS_ENV = "DFLASH_COMPILE_LAYERS"
"""``1`` runs the target's layers through ``mx.compile`` programs on MLX's CUDA backend
(:func:`compiled_layers_on`); unset or anything else: off."""


def compiled_layers_on() -> bool:
    """Whether :meth:`TargetRunner.run_layers` runs GDN layers and MLP blocks through
    ``mx.compile`` programs (:func:`_layer_programs`), and the drafters their layers' parts
    around each attention (``app.engine.drafter.DraftLayer``): only where the project's CUDA GDN
    kernel is active (:func:`app.engine.kernels.gdn_kernel.kernel_active`, so plain decoding
    runs through the runner too and steps and verify passes take the same programs) and
    :data:`COMPILE_LAYERS_ENV` is ``"1"``. Read at each pass.

    Opt-in although exact (tokens and every cache bit for bit the same as without it, on
    the GPU suite's float16, bfloat16 and 4-bit targets and a Qwen3.5-4B-shaped bf16 target):
    it halves the host's share of a pass and makes a 4B-shaped step 20-45% faster, but MLX
    compiles each fused kernel on its first use, which added 28 s to a fresh host's first
    warm-up (docs/performance.md, "At real scale"). Off CUDA it stays off: the CPU would
    compile C++ per shape."""
    return os.environ.get(COMPILE_LAYERS_ENV) == "1" and gdn_kernel.kernel_active()


def _gdn_block(layer: nn.Module, h: mx.array, conv_before: mx.array, state_before: mx.array):
    """One whole GDN decoder layer, unpadded, as a pure function of arrays (:func:`_gdn_mix`
    and the MLP around it): ``(h_out, conv_state, state, conv_input, q, k, v, a, b)``."""
    r, *rest = _gdn_mix(layer.linear_attn, layer.input_layernorm(h), conv_before, state_before,
                        None)
    h = h + r
    return (h + layer.mlp(layer.post_attention_layernorm(h)), *rest)


_PROGRAMS: dict[tuple[int, str], Any] = {}
"""``(id(owner), name)`` -> an ``mx.compile`` program (:func:`compiled_program`); an entry
goes when its owner is freed (MLX modules are dicts, so not weak-dictionary keys)."""


def compiled_program(owner: nn.Module, name: str, build):
    """The ``mx.compile`` program ``name`` of module ``owner``, made on first use as
    ``mx.compile(build(ref))`` where ``ref`` is a weak reference to ``owner`` (``build``
    returns a pure function of arrays that reaches the module through ``ref()``). A program
    is traced once per input shape and then replays its graph, with MLX's elementwise fusion,
    instead of running Python per operation. The weights are captured as constants at
    tracing: a module whose weights change needs a new program (a model switch builds new
    modules). The program holds ``owner`` weakly, so the module (and its entry) go when the
    model is unloaded."""
    key = (id(owner), name)
    program = _PROGRAMS.get(key)
    if program is None:
        program = _PROGRAMS[key] = mx.compile(build(weakref.ref(owner)))
        weakref.finalize(owner, _PROGRAMS.pop, key, None)
    return program


def _layer_programs(layer: nn.Module):
    """The ``mx.compile`` program (:func:`compiled_program`) of a target ``layer``: a GDN
    layer's whole block (:func:`_gdn_block`) or an attention layer's MLP block, traced once
    per input shape (the block lengths 1-16 and the prefill chunks: shapes that do not depend
    on the context length)."""
    if getattr(layer, "is_linear", False):
        return compiled_program(layer, "gdn_block",
                                lambda ref: lambda h, c, s: _gdn_block(ref(), h, c, s))
    return compiled_program(
        layer, "mlp_block",
        lambda ref: lambda h: h + ref().mlp(ref().post_attention_layernorm(h)))


class TargetRunner:
    """Forward passes over an mlx-lm target with tap capture and GDN tapes.

    Args:
        model: an mlx-lm model (``qwen3_5``, ``qwen3_5_moe``, ``qwen3_next``, ``qwen3``,
            ``llama``; other families raise :class:`UnsupportedArchitectureError`).
        model_type: the config's ``model_type``.
        fast_verify: run verify passes' GDN recurrence in the chunked form (near-exact, off by
            default; see ``GenerationConfig.fast_verify``). Off, a verify pass runs the same
            per-position operations as one-token steps (mlx-lm's ``gated_delta_update``).

    Raises:
        UnsupportedArchitectureError: a family without tap capture, or a cache type whose
            rollback the engine cannot make exact (named in the message).
    """

    def __init__(self, model: nn.Module, model_type: str, fast_verify: bool = False):
        if model_type not in TAP_FAMILIES:
            raise UnsupportedArchitectureError(
                f"DFlash needs tap capture, which this app implements for "
                f"{', '.join(sorted(TAP_FAMILIES))}; {model_type!r} runs in plain mode only"
            )
        use_row_stable_products(model)  # CUDA only; the loader did it already for its models
        self.model = model
        self.model_type = model_type
        self.inner = model.model  # qwen3_5: Model.model -> language_model.model
        self.layers = list(model.layers)
        self.first_layer = 0  # model-wide id of layers[0] (a shard's runner walks a range)
        self.hybrid = any(getattr(layer, "is_linear", False) for layer in self.layers)
        self.linear = [bool(getattr(layer, "is_linear", False)) for layer in self.layers]
        self.num_layers = len(self.layers)
        head_owner = getattr(model, "language_model", model)
        self._tied = getattr(head_owner.args, "tie_word_embeddings", False) or not hasattr(
            head_owner, "lm_head"
        )
        self._head_owner = head_owner
        self.fast_verify = bool(fast_verify) and self.hybrid
        check_restorable(self.make_cache())

    @property
    def embed_tokens(self) -> nn.Module:
        """The target's token embedding (shared with the drafter)."""
        return self.inner.embed_tokens

    @property
    def vocab_size(self) -> int:
        """Rows of the embedding table."""
        return int(self.inner.embed_tokens.weight.shape[0])

    @property
    def hidden_size(self) -> int:
        """Width of the residual stream: the final norm's weight width (a quantized
        embedding's weight is packed, so its width is not the model's)."""
        return int(self.inner.norm.weight.shape[-1])

    def lm_head(self, h: mx.array) -> mx.array:
        """Logits ``(..., V)`` from final-normed hidden states ``(..., hidden)``."""
        if self._tied:
            return self.inner.embed_tokens.as_linear(h)
        return self._head_owner.lm_head(h)

    def make_cache(self) -> list:
        """The model's own cache list (KVCache for attention, ArraysCache for GDN)."""
        return make_prompt_cache(self.model)

    def forward(
        self,
        ids: mx.array | None,
        cache: list,
        taps: list[int] | None = None,
        tapes: list[GDNTape] | None = None,
        all_logits: bool = True,
        embeds: mx.array | None = None,
    ) -> tuple[mx.array, mx.array | None]:
        """Run ``ids`` ``(1, S)`` int32 through the target, updating ``cache``.

        Args:
            embeds: ``(1, S, hidden)`` inputs to the first layer instead of the embeddings of
                ``ids`` (``ids`` may then be None); the warm-up uses it to run the layers
                without the embedding's gather.
            taps: 0-based layer ids whose outputs to return, concatenated on the last axis.
            tapes: a list that receives one :class:`GDNTape` per GDN layer (a verify pass; with
                ``fast_verify`` its recurrence runs chunked).
            all_logits: False computes logits for the last position only.

        Returns:
            logits ``(1, S, V)`` (or ``(1, 1, V)``) and taps ``(1, S, len(taps) * hidden)``
            (None when ``taps`` is None).
        """
        h = self.inner.embed_tokens(ids) if embeds is None else embeds
        h, captured = self.run_layers(h, cache, taps, tapes)
        tap_states = None
        if taps:
            tap_states = mx.concatenate([captured[i] for i in taps], axis=-1)
        if not all_logits:
            h = h[:, -1:, :]
        return self.lm_head(self.inner.norm(h)), tap_states

    def run_layers(
        self,
        h: mx.array,
        cache: list,
        taps: list[int] | None = None,
        tapes: list[GDNTape] | None = None,
        chunked: bool | None = None,
    ) -> tuple[mx.array, dict[int, mx.array]]:
        """Run the residual stream ``h`` ``(1, S, hidden)`` through :attr:`layers` (the layers
        ``first_layer .. first_layer + len(layers) - 1`` of the model), updating ``cache`` (one
        entry per layer of :attr:`layers`).

        Args:
            taps: model-wide 0-based layer ids whose outputs to capture (ids of other layers
                are ignored).
            tapes: a list that receives one :class:`GDNTape` per GDN layer (a verify pass).
            chunked: run the GDN recurrence in the chunked form; None: when ``fast_verify``
                is on and ``tapes`` is given.

        Returns:
            ``h`` after the last layer and ``{layer id: (1, S, hidden)}`` for the captured taps.
        """
        if chunked is None:
            chunked = self.fast_verify and tapes is not None
        ssm_cache = next((c for c, lin in zip(cache, self.linear) if lin), None)
        ssm_mask = create_ssm_mask(h, ssm_cache) if ssm_cache is not None else None
        masks: dict = {}  # one attention mask per kind of cache, as mlx-lm's models build them

        def attention_mask(c):
            key = (type(c), getattr(c, "max_size", None))
            if key not in masks:
                masks[key] = create_attention_mask(h, c)
            return masks[key]

        wanted = set(taps or ())
        captured: dict[int, mx.array] = {}
        compiled = ssm_mask is None and not chunked and compiled_layers_on()
        for j, (layer, c) in enumerate(zip(self.layers, cache)):
            if compiled:
                h = self._compiled_layer(j, layer, h, c, tapes, attention_mask)
            elif self.linear[j]:
                r = gdn_forward(
                    layer.linear_attn, layer.input_layernorm(h), ssm_mask, c, tapes,
                    chunked=chunked,
                )
                h = h + r
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            else:
                h = layer(h, mask=attention_mask(c), cache=c)
            if j + self.first_layer in wanted:
                captured[j + self.first_layer] = h
        return h, captured

    def _compiled_layer(self, j: int, layer: nn.Module, h: mx.array, c, tapes, attention_mask):
        """Layer ``j`` through its ``mx.compile`` programs (:func:`_layer_programs`), with the
        cache updated and the tape recorded as :func:`gdn_forward` does."""
        program = _layer_programs(layer)
        if not self.linear[j]:
            r = layer.self_attn(layer.input_layernorm(h), attention_mask(c), c)
            return program(h + r)
        return _gdn_on_cache(layer.linear_attn, h, c, tapes,
                             lambda conv, state: program(h, conv, state), zero_state=True)


def check_restorable(cache: list) -> None:
    """Refuse a cache list whose rollback the engine cannot make exact.

    Exact rollback exists for mlx-lm's ``KVCache`` (trim), ``RotatingKVCache`` (the rejected
    rows cut from the verify pass's temporally ordered buffer, :func:`trim_attention`) and the
    Gated DeltaNet ``ArraysCache`` (tapes). Anything else (e.g. ``QuantizedKVCache``,
    ``ChunkedKVCache``, ``CacheList``) is refused.

    Raises:
        UnsupportedArchitectureError: naming the cache type; plain decoding still works.
    """
    allowed = (KVCache, RotatingKVCache, ArraysCache)
    for c in cache:
        if type(c) not in allowed:
            raise UnsupportedArchitectureError(
                f"DFlash cannot roll back a {type(c).__name__} exactly (it supports KVCache, "
                "RotatingKVCache and Gated DeltaNet state); use plain mode for this model"
            )


def _trim_rotating(c: RotatingKVCache, n: int) -> None:
    """Drop the last ``n`` positions of a sliding-window cache right after a multi-token pass.

    mlx-lm's ``RotatingKVCache.trim`` only moves its offsets, which is wrong once the buffer
    has rotated. After a pass of S > 1 tokens (``_update_concat``) the buffer is in temporal
    order and ends with those S positions, so the rejected ones are its last ``n`` rows; cutting
    them leaves the rows the next step or pass needs (the last ``max_size - 1`` or more).

    Raises:
        GenerationError: the buffer is not in the state a multi-token pass leaves.
    """
    if c.keys is None or c._idx != c.keys.shape[2] or n > c.keys.shape[2]:
        raise GenerationError("sliding-window cache is not in the state a verify pass leaves")
    keep = c.keys.shape[2] - n
    c.keys = c.keys[..., :keep, :]
    c.values = c.values[..., :keep, :]
    c.offset -= n
    c._idx = keep


def trim_attention(cache: list, linear: list[bool], n: int) -> None:
    """Drop the last ``n`` positions from every attention cache (full or sliding-window),
    right after a verify pass of more than ``n`` tokens."""
    if n <= 0:
        return
    for c, lin in zip(cache, linear):
        if lin:
            continue
        if isinstance(c, RotatingKVCache):
            _trim_rotating(c, n)
        else:
            c.trim(n)


def cache_arrays(cache: list) -> list:
    """Every array a cache list holds (GDN conv/recurrent states, attention K/V), for
    ``mx.eval``."""
    out = []
    for c in cache:
        arrays = c.cache if isinstance(c, ArraysCache) else [getattr(c, "keys", None),
                                                              getattr(c, "values", None)]
        out.extend(a for a in arrays if a is not None)
    return out

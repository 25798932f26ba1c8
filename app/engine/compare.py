"""Comparing two decodings of one prompt: where they first differ, and whether the target
saw a near tie there (its top two logits almost equal), the one reason plain and DFlash may
part ways under greedy decoding. Used by ``compare``, the bench and the window's Compare view.
"""

from __future__ import annotations

from typing import Any


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """First index where the token id lists ``a`` and ``b`` differ, the shorter length when
    one is a prefix of the other, None when they are equal."""
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def near_tie(target, prompt_ids: list[int], prefix: list[int], tokens: dict[str, int | None],
             index: int) -> dict:
    """The target's top two logits after ``prompt_ids + prefix`` (one full forward, no cache).

    ``tokens``: the token each run chose there (None where a run had ended). Returns
    ``{"index", "top": [{"id", "logit"}, {"id", "logit"}], "gap", "<run>_token",
    "<run>_logit"}``; logits are float32 values of the target's last position.
    """
    import mlx.core as mx

    ids = mx.array([list(prompt_ids) + list(prefix)], dtype=mx.int32)
    logits = target.model(ids)[0, -1].astype(mx.float32)
    order = mx.argsort(-logits)[:2].tolist()
    values = logits.tolist()
    out: dict[str, Any] = {
        "index": index,
        "top": [{"id": int(i), "logit": float(values[i])} for i in order],
        "gap": float(values[order[0]] - values[order[1]]),
    }
    for name, tok in tokens.items():
        out[f"{name}_token"] = tok
        out[f"{name}_logit"] = None if tok is None else float(values[tok])
    return out

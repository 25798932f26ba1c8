"""Comparing two generations of the same prompt: where they diverge and how close the
target's choice was there.

A divergence between greedy plain and greedy DFlash is reported with the target's top-two
logit gap at that position (``shared/DFLASH_NOTES.md``, "Numerics": never assume a near-tie,
show it).
"""

from __future__ import annotations

from typing import Any


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """First index where ``a`` and ``b`` differ, the shorter length when one is a prefix of
    the other, None when equal."""
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

    from app.engine.threads import check_engine_thread

    check_engine_thread()
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

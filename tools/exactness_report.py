"""Print, per target variant of the exactness suite, how greedy DFlash compares with plain
decoding with the exact default verify and with the opt-in ``fast_verify``.

    python tools/exactness_report.py [VARIANT ...]     (default: every variant)

Variants, targets and the cache comparison are those of ``tests/test_engine_exact.py``
(random ``qwen3_5``/``qwen3`` targets of hidden size 256, converted by mlx-lm to float16,
bfloat16, 4-bit and 8-bit; an oracle drafter, block 16, 40 tokens). Columns: whether the tokens
equal plain's, the first divergence, and the largest difference between the target's cache and
plain's over all cycles. Run it with and without ``LD_PRELOAD`` of OpenBLAS to see the BLAS's
share (``python -m app --version`` names the BLAS in use). Where a cache differs, a line under
the row names the first cycle's position and the layers and arrays that differ there (K / V of
an attention layer, conv / recurrent state of a GDN layer).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import test_engine_exact as exact  # noqa: E402
from engine_fixtures import collect, prompt_ids  # noqa: E402
from mlx_lm.models.cache import ArraysCache  # noqa: E402

from app.engine.blas import blas_description  # noqa: E402
from app.engine.generate import GenerationConfig, generate  # noqa: E402
from app.engine.target import TargetRunner  # noqa: E402


class _Patch:
    """The one ``monkeypatch.setattr`` that :class:`exact.CacheSpy` needs."""

    def setattr(self, obj, name, value):
        setattr(obj, name, value)


class _FirstDifference:
    """``on_cycle`` callback: after every cycle compare the target cache with plain's at the
    same position (as ``exact.dflash_with_cache_checks``); keep the largest difference and,
    for the first cycle with any, which layers' arrays differ."""

    def __init__(self, ids: list[int], states: dict, spy):
        self.ids, self.states, self.spy = ids, states, spy
        self.worst = 0.0
        self.position = None
        self.where = ""

    def __call__(self, run, gen):
        pos = len(self.ids) + len(run.tokens) - 1  # the last committed token is pending
        if pos not in self.states:
            return
        mine, plain = exact.cache_state(self.spy.cache), self.states[pos]
        self.worst = max(self.worst, exact.max_difference(mine, plain))
        if self.where or not self.worst:
            return
        found = []
        for layer, (a, b, c) in enumerate(zip(mine, plain, self.spy.cache)):
            names = ("conv", "recurrent") if isinstance(c, ArraysCache) else ("K", "V", "offset")
            for name, x, y in zip(names, a, b):
                if x.shape != y.shape:
                    d = float("inf")
                else:
                    d = float(abs(x.astype("float64") - y).max()) if x.size else 0.0
                if d:
                    found.append(f"layer {layer} {name} {d:.3g}")
        self.position, self.where = pos, ", ".join(found[:6]) + (" ..." if len(found) > 6 else "")


def main(names: list[str]) -> int:
    names = names or list(exact.VARIANTS)
    unknown = [n for n in names if n not in exact.VARIANTS]
    if unknown:
        print(f"unknown variant {unknown[0]!r}; choose from {', '.join(exact.VARIANTS)}",
              file=sys.stderr)
        return 2
    print(f"BLAS: {blas_description()}")
    print(f"{'variant':<20}{'verify':>8}{'tokens equal':>14}{'first diff':>12}{'max cache diff':>16}")
    original = TargetRunner.make_cache
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            target, _, _ = exact._build(Path(tmp), name)
            ids = prompt_ids(target)
            reference = collect(generate(target, ids, GenerationConfig(
                max_tokens=exact.N_TOKENS + 20))).tokens
            plain = reference[: exact.N_TOKENS]
            states = exact.plain_states(target, ids, plain)
            for fast in (False, True):
                TargetRunner.make_cache = original
                spy = exact.CacheSpy(_Patch())
                first = _FirstDifference(ids, states, spy)
                spec = collect(generate(target, ids, GenerationConfig(
                    mode="dflash", max_tokens=exact.N_TOKENS, block_size=16,
                    fast_verify=fast), exact._oracle(target, ids, reference, 16)), first)
                worst = first.worst
                diff = next((i for i, (a, b) in enumerate(zip(plain, spec.tokens)) if a != b),
                            None)
                print(f"{name:<20}{'fast' if fast else 'exact':>8}"
                      f"{'yes' if spec.tokens == plain else 'NO':>14}"
                      f"{'-' if diff is None else diff:>12}{worst:>16.3g}", flush=True)
                if first.where:
                    print(f"    first at position {first.position}: {first.where}", flush=True)
    TargetRunner.make_cache = original
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

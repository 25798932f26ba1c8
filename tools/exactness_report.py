"""Print, per target variant of the exactness suite, how greedy DFlash compares with plain
decoding with the exact default verify and with the opt-in ``fast_verify``.

    python tools/exactness_report.py [VARIANT ...]     (default: every variant)

Variants, targets and the cache comparison are those of ``tests/test_engine_exact.py``
(random ``qwen3_5``/``qwen3`` targets of hidden size 256, converted by mlx-lm to float16,
bfloat16, 4-bit and 8-bit; an oracle drafter, block 16, 40 tokens). Columns: whether the tokens
equal plain's, the first divergence, and the largest difference between the target's cache and
plain's over all cycles. Run it with and without ``LD_PRELOAD`` of OpenBLAS to see the BLAS's
share (``python -m app --version`` names the BLAS in use).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import test_engine_exact as exact  # noqa: E402
from engine_fixtures import collect, prompt_ids  # noqa: E402

from app.engine.blas import blas_description  # noqa: E402
from app.engine.generate import GenerationConfig, generate  # noqa: E402
from app.engine.target import TargetRunner  # noqa: E402


class _Patch:
    """The one ``monkeypatch.setattr`` that :class:`exact.CacheSpy` needs."""

    def setattr(self, obj, name, value):
        setattr(obj, name, value)


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
                spec, worst = exact.dflash_with_cache_checks(
                    target, exact._oracle(target, ids, reference, 16), ids, plain, states, spy,
                    max_tokens=exact.N_TOKENS, block_size=16, fast_verify=fast)
                diff = next((i for i, (a, b) in enumerate(zip(plain, spec.tokens)) if a != b),
                            None)
                print(f"{name:<20}{'fast' if fast else 'exact':>8}"
                      f"{'yes' if spec.tokens == plain else 'NO':>14}"
                      f"{'-' if diff is None else diff:>12}{worst:>16.3g}", flush=True)
    TargetRunner.make_cache = original
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

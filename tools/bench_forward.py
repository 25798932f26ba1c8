"""Forward cost ratio of a target: a T-token pass against a 1-token pass, per BLAS.

Usage: ``.venv/bin/python tools/bench_forward.py [--model DIR] [--prefix N] [--repeats N]``

For T = 1, 4, 8, 16 new tokens after a prefix of ``--prefix`` tokens already in the cache,
times (median wall ms, forced with ``mx.eval``, after warm-up) two passes:

* ``model``: mlx-lm's own forward (``model(ids, cache=cache)``), all logits;
* ``verify``: the engine's DFlash verify forward (``TargetRunner.forward`` with the drafter's
  tap layers and the Gated DeltaNet tapes), the pass a DFlash cycle runs.

It runs itself twice in child processes: once with ``LD_PRELOAD`` cleared (the ``mlx-cpu``
wheel's bundled BLAS) and once with Debian's OpenBLAS preloaded (when
``/usr/lib/*/openblas-pthread/libblas.so.3`` exists), and prints the 16-token / 1-token
ratio for each. Issue 14's goal: a 16-token verify costs at most 2x a 1-token step.
The model defaults to the bundled demo target, else a tiny random pair under the cache folder.
A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LENGTHS = (1, 4, 8, 16)


def default_model() -> tuple[str, str]:
    """(target, drafter) folders: the bundled demo pair, else the tiny random pair."""
    from app.paths import cache_dir, demo_pair_dirs

    t, d = demo_pair_dirs()
    if (t / "config.json").is_file() and (d / "config.json").is_file():
        return str(t), str(d)
    from app.models.tiny import build_tiny_pair

    print("bundled demo pair missing: using the tiny random pair", file=sys.stderr)
    t, d = build_tiny_pair(cache_dir() / "tiny-pair")
    return str(t), str(d)


def _arrays(c) -> list:
    """The arrays a cache entry holds (KV keys/values or GDN conv/recurrent states)."""
    held = getattr(c, "cache", None)
    if held is None:
        held = [getattr(c, "keys", None), getattr(c, "values", None)]
    return [a for a in held if a is not None]


def measure(target_dir: str, drafter_dir: str, prefix: int, repeats: int) -> dict:
    """Median ms per pass for each T and pass kind, in this process."""
    import mlx.core as mx

    from app.engine.blas import blas_description
    from app.engine.target import TargetRunner
    from app.models.loader import load_drafter, load_target

    target = load_target(target_dir)
    taps = load_drafter(drafter_dir).config.target_layer_ids
    runner = TargetRunner(target.model, target.model_type)
    vocab = target.vocab_size
    prefix_ids = mx.array([[(7 * i + 3) % vocab for i in range(prefix)]], dtype=mx.int32)

    def one(kind: str, t: int) -> float:
        cache = runner.make_cache()
        runner.forward(prefix_ids, cache, all_logits=False)
        mx.eval([a for c in cache for a in _arrays(c)])
        ids = mx.array([[(11 * i + 5) % vocab for i in range(t)]], dtype=mx.int32)
        t0 = time.perf_counter()
        if kind == "model":
            out = target.model(ids, cache=cache)
            mx.eval(out)
        else:
            tapes: list = [] if runner.hybrid else None
            logits, tap_states = runner.forward(ids, cache, taps=taps, tapes=tapes)
            mx.eval(logits, tap_states)
        return 1000 * (time.perf_counter() - t0)

    res: dict = {"blas": blas_description(), "model": target_dir, "prefix": prefix, "ms": {}}
    for kind in ("model", "verify"):
        for t in LENGTHS:
            for _ in range(3):
                one(kind, t)
            res["ms"][f"{kind}:{t}"] = statistics.median(one(kind, t) for _ in range(repeats))
    return res


def main() -> int:
    """Parse arguments; parent: run both BLAS children and print; child: measure, print JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="target folder (needs --draft-model for the tap layers)")
    ap.add_argument("--draft-model", help="drafter folder")
    ap.add_argument("--prefix", type=int, default=64, help="tokens already in the cache")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.model, args.draft_model, args.prefix, args.repeats)))
        return 0
    from app.engine.blas import find_openblas

    if args.model and args.draft_model:
        t, d = args.model, args.draft_model
    else:
        t, d = default_model()
    runs = [("bundled BLAS", "")]
    lib = find_openblas()
    if lib:
        runs.append(("OpenBLAS preloaded", lib))
    else:
        print("Debian's OpenBLAS is not installed: only the bundled BLAS is measured",
              file=sys.stderr)
    for label, preload in runs:
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        if preload:
            env["LD_PRELOAD"] = preload
        cmd = [sys.executable, __file__, "--child", "--model", t, "--draft-model", d,
               "--prefix", str(args.prefix), "--repeats", str(args.repeats)]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if res.returncode != 0:
            print(f"{label}: failed\n{res.stderr}", file=sys.stderr)
            continue
        r = json.loads(res.stdout.strip().splitlines()[-1])
        print(f"== {label}: {r['blas']}")
        print(f"   model {r['model']}, {r['prefix']} tokens in the cache; median ms per pass")
        print("   {:<8}".format("pass") + "".join(f"{f'T={t}':>10}" for t in LENGTHS)
              + f"{'16/1':>8}")
        for kind in ("model", "verify"):
            ms = [r["ms"][f"{kind}:{t}"] for t in LENGTHS]
            print(f"   {kind:<8}" + "".join(f"{m:>10.2f}" for m in ms)
                  + f"{ms[-1] / ms[0]:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

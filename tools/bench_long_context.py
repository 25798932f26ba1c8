"""A DFlash cycle's cost by stage against the context length: does the drafter's cost stay
flat as the prompt grows?

    python tools/bench_long_context.py [--lengths 512 1024 2048 4096 8192 16384]
        [--cycles 12] [--accepted 7] [--block 16] [--window W] [--concat]
        [--target DIR --drafter DIR] [--json F]

For each context length C: the target prefills C tokens (random ids, fixed seed) keeping the
drafter's tap states, the drafter's context cache takes them, and then ``--cycles`` DFlash
cycles run the engine's own calls with each stage waited for (as
``GenerationConfig.stage_timing`` does): the draft (``drafter.draft``: the new context rows
appended to the drafter's cache plus one forward over the block), the verify
(``TargetRunner.forward`` over the block, with taps and Gated DeltaNet tapes) and the rollback
(``GDNTape.rollback`` and ``trim_attention``). Acceptance is fixed, not measured: every cycle
commits ``--accepted + 1`` tokens whatever the drafts are, so tau is the same at every length
and only the context length differs between rows. Medians over the cycles, after 3 untimed
ones. With ``--concat`` the drafter's old join of context and block K/V runs beside the
current one, each on its own caches, their cycles alternating (a busy machine slows both
alike).

The bundled demo pair's context is 4,096 tokens (``max_position_embeddings``): rows past it
run the same weights at positions the model was not trained for; the arithmetic (and so the
cost) is what a longer-context pair of the same shape does, the tokens mean nothing there
(marked ``*``). A benchmark, not a test: it asserts nothing. Run it with OpenBLAS preloaded
on Linux (tools/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class Cycles:
    """A ``length``-token context on the target and the drafter, and fixed-acceptance cycles
    over it (see the module doc); :meth:`step` runs one cycle and returns its stages'
    seconds."""

    def __init__(self, target, drafter, length: int, accepted: int, block: int,
                 seed: int = 0):
        import mlx.core as mx

        from app.engine.target import TargetRunner, cache_arrays

        self.runner = runner = TargetRunner(target.model, target.model_type)
        self.dmodel = drafter.model
        self.taps = list(drafter.config.target_layer_ids)
        self.n, self.block = accepted + 1, block
        mx.random.seed(seed)
        ids = mx.random.randint(4, runner.vocab_size, (length,)).astype(mx.int32)
        self.cache, self.dcache = runner.make_cache(), self.dmodel.make_cache()
        t0 = time.perf_counter()
        for a in range(0, length, 512):
            _, ctx = runner.forward(ids[None, a:a + 512], self.cache, taps=self.taps,
                                    all_logits=False)
            self.dmodel.extend_context(ctx, self.dcache)
            mx.eval(cache_arrays(self.cache), cache_arrays(self.dcache))
        self.prefill_s = time.perf_counter() - t0
        self.ctx_taps = None
        self.pending = 5

    def step(self) -> tuple[float, float, float]:
        """One cycle: (draft, verify, rollback) seconds, each stage waited for."""
        import mlx.core as mx

        from app.engine.target import cache_arrays, trim_attention

        runner, n = self.runner, self.n
        t0 = time.perf_counter()
        drafts = self.dmodel.draft(runner, self.pending, self.block, self.ctx_taps, self.dcache)
        mx.eval(drafts)
        t1 = time.perf_counter()
        block_ids = mx.concatenate([mx.array([self.pending], dtype=mx.int32),
                                    drafts.astype(mx.int32)])[None]
        tapes: list | None = [] if runner.hybrid else None
        logits, vtaps = runner.forward(block_ids, self.cache, taps=self.taps, tapes=tapes)
        mx.eval(logits, vtaps)
        t2 = time.perf_counter()
        for tape in tapes or ():
            tape.rollback(n)
        trim_attention(self.cache, runner.linear, self.block - n)
        mx.eval(cache_arrays(self.cache))
        t3 = time.perf_counter()
        self.ctx_taps = vtaps[:, :n]
        self.pending = int(mx.argmax(logits[0, n - 1]).item())
        return t1 - t0, t2 - t1, t3 - t2

    def row(self, times: list[tuple[float, float, float]]) -> dict:
        """Per-stage medians (ms) of ``times``, the drafter cache's size, the prefill's s."""
        out = {k: statistics.median(t[i] for t in times) * 1000
               for i, k in enumerate(("draft", "verify", "rollback"))}
        out["cycle"] = out["draft"] + out["verify"] + out["rollback"]
        out["drafter_cache_rows"] = int(sum(c.size for c in self.dcache))
        out["drafter_cache_mib"] = sum(c.nbytes for c in self.dcache) / 2**20
        out["prefill_s"] = self.prefill_s
        return out


def measure(target, drafter, length: int, cycles: int, accepted: int, block: int,
            variants: tuple[str, ...] = ("with_block",), warm: int = 3) -> list[dict]:
    """One row per variant: per-stage medians (ms) of ``cycles`` cycles after ``warm``
    untimed ones. Several variants run their cycles alternately (each on its own caches),
    so a busy machine slows them alike."""
    runs = {}
    for v in variants:
        with _joined_by(v):
            runs[v] = Cycles(target, drafter, length, accepted, block)
    times: dict[str, list] = {v: [] for v in variants}
    for i in range(warm + cycles):
        order = variants if i % 2 == 0 else variants[::-1]
        for v in order:
            with _joined_by(v):
                t = runs[v].step()
            if i >= warm:
                times[v].append(t)
    return [{**runs[v].row(times[v]), "variant": v} for v in variants]


@contextlib.contextmanager
def _joined_by(variant: str):
    """Run the drafter with its own ``DraftContextCache.with_block`` ("with_block"), or with
    the concatenation it replaced ("concat": the same values, every visible context row
    copied into a new array per layer per cycle)."""
    from app.engine.drafter import DraftContextCache

    own = DraftContextCache.with_block

    def concat(self, lo, keys, values):
        held_k, held_v = self.fetch(lo)
        if held_k is None:
            return keys, values
        import mlx.core as mx

        return (mx.concatenate([held_k, keys], axis=2),
                mx.concatenate([held_v, values], axis=2))

    if variant == "concat":
        DraftContextCache.with_block = concat
    try:
        yield
    finally:
        DraftContextCache.with_block = own


def main(argv: list[str] | None = None) -> int:
    import app  # noqa: F401  (OpenBLAS before MLX, as the app loads it)

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+",
                   default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--cycles", type=int, default=12, help="timed cycles per length")
    p.add_argument("--accepted", type=int, default=7,
                   help="drafts counted as accepted each cycle (tau = this + 1)")
    p.add_argument("--block", type=int, default=16, help="block size")
    p.add_argument("--target", help="target folder (default: the bundled demo target)")
    p.add_argument("--drafter", help="drafter folder (default: the bundled DFlash drafter)")
    p.add_argument("--window", type=int, metavar="W",
                   help="run every drafter layer as a sliding layer with this window (cost "
                   "only: the drafter was not trained so; shows the cost past a window)")
    p.add_argument("--concat", action="store_true",
                   help="also time each length with the drafter's context and block K/V "
                   "joined by concatenation, as before 2026-12-06 (a copy of every visible "
                   "context row per layer per cycle), for comparison")
    p.add_argument("--json", metavar="F", help="also write the rows as JSON")
    args = p.parse_args(argv)

    from app.engine.blas import blas_description
    from app.models.loader import load_drafter, load_target
    from app.paths import demo_pair_dirs

    t_dir, d_dir = demo_pair_dirs()
    target = load_target(args.target or t_dir)
    drafter = load_drafter(args.drafter or d_dir)
    if args.window:
        for layer in drafter.model.layers:
            layer.self_attn.sliding, layer.self_attn.window = True, args.window
        drafter.config.layer_types = ["sliding_attention"] * len(drafter.model.layers)
        drafter.config.sliding_window = args.window
    ctx = target.context_length
    print(f"target {target.name} ({target.model_type}, context {ctx:,}), drafter "
          f"{drafter.name} (layers {drafter.config.layer_types}, window "
          f"{drafter.config.sliding_window}); block {args.block}, tau {args.accepted + 1} "
          f"(fixed); BLAS: {blas_description()}")
    print(f"{'context':>8} {'draft ms':>9} {'verify ms':>10} {'rollback ms':>12} "
          f"{'cycle ms':>9} {'drafter K/V rows':>17} {'MiB':>6}")
    rows = []
    for length in args.lengths:
        variants = ("with_block", "concat") if args.concat else ("with_block",)
        for r in measure(target, drafter, length, args.cycles, args.accepted, args.block,
                         variants):
            r["context"] = length
            variant = r["variant"]
            rows.append(r)
            mark = "*" if length > ctx else " "
            print(f"{length:>7,}{mark} {r['draft']:>9.2f} {r['verify']:>10.2f} "
                  f"{r['rollback']:>12.2f} {r['cycle']:>9.2f} {r['drafter_cache_rows']:>17,} "
                  f"{r['drafter_cache_mib']:>6.1f}"
                  + ("  (concatenated, as before)" if variant == "concat" else ""), flush=True)
    if any(r["context"] > ctx for r in rows):
        print(f"* past the target's context ({ctx:,}): cost only, the tokens mean nothing")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

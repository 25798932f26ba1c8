"""Find the operation that makes a verify pass's rows differ from plain steps' (issue #21).

    python tools/probe_rows.py [VARIANT ...]     (default: qwen3_5-float16 qwen3_5-4bit-bf16)

For each target variant of the exactness suite (``tests/test_engine_exact.py``) it prefills
the same prompt into two caches, then runs the next ``--block`` tokens once as one pass
(a verify pass's shape) and once as that many one-token steps (plain decoding's), recording
the inputs and output of every module call (``nn.Linear``, ``nn.Conv1d``, norms, RoPE, ...)
and of the engine's ``gated_delta_update`` and ``normalize_qk``. The steps' records are joined
along the sequence axis and compared with the pass's, in the order the pass made them.

An operation whose inputs are equal bit for bit and whose output is not is one whose result
depends on how many rows it is given: the cause of a divergence. The report prints, per
variant, the first such operations and how many records differ at all. Run it on the device
whose divergence you are chasing (MLX's CUDA backend for #21; ``DFLASH_ROW_PRODUCTS`` set as
in the run that diverged).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402
import test_engine_exact as exact  # noqa: E402
from engine_fixtures import prompt_ids  # noqa: E402
from mlx_lm.models import qwen3, qwen3_next  # noqa: E402

import app.engine.target as target_module  # noqa: E402
from app.engine.kernels import row_products as rp  # noqa: E402
from app.engine.target import TargetRunner  # noqa: E402


class Recorder:
    """Records ``(name, inputs, output)`` per call while :attr:`on`; ``name`` is the module's
    path plus the call's index within one forward (a module may run more than once)."""

    def __init__(self):
        self.on = False
        self.calls: list[tuple[str, list[np.ndarray], list[np.ndarray]]] = []
        self._seen: dict[str, int] = defaultdict(int)

    def forward_done(self) -> None:
        """Start counting calls afresh (one forward over)."""
        self._seen.clear()

    def add(self, path: str, args, out) -> None:
        if not self.on:
            return
        n = self._seen[path]
        self._seen[path] += 1
        ins = [_np(a) for a in args if isinstance(a, mx.array)]
        outs = [_np(o) for o in (out if isinstance(out, tuple) else (out,))
                if isinstance(o, mx.array)]
        self.calls.append((f"{path}#{n}", ins, outs))


def _np(a: mx.array) -> np.ndarray:
    """A host copy; float16/bfloat16 values are exact in float32."""
    if a.dtype in (mx.float16, mx.bfloat16):
        a = a.astype(mx.float32)
    return np.array(a)


def instrument(model: nn.Module, rec: Recorder):
    """Give every module of ``model`` a recording ``__call__`` (a per-class subclass) and
    wrap the engine's GDN functions and mlx-lm's attention; returns a function that undoes
    all of it."""
    made: dict[type, type] = {}
    undo = []
    for path, module in model.named_modules():
        if module is model:
            continue
        cls = type(module)
        if cls not in made:
            def call(self, *args, __base=cls, **kwargs):
                out = __base.__call__(self, *args, **kwargs)
                rec.add(self._probe_path, list(args) + list(kwargs.values()), out)
                return out
            made[cls] = type(cls.__name__, (cls,), {"__call__": call})
        module.__class__ = made[cls]
        object.__setattr__(module, "_probe_path", path)
        undo.append(lambda m=module, c=cls: setattr(m, "__class__", c))
    for name in ("gated_delta_update", "normalize_qk", "chunked_gated_delta_update"):
        fn = getattr(target_module, name)

        def wrapped(*args, __fn=fn, __name=name, **kwargs):
            out = __fn(*args, **kwargs)
            rec.add(__name, [a for a in args if isinstance(a, mx.array)
                             and a.ndim >= 3], out)  # leave out the state (no sequence axis)
            return out
        setattr(target_module, name, wrapped)
        undo.append(lambda n=name, f=fn: setattr(target_module, n, f))
    for module in (qwen3_next, qwen3):
        fn = module.scaled_dot_product_attention

        def attention(queries, *args, __fn=fn, **kwargs):
            out = __fn(queries, *args, **kwargs)
            rec.add("scaled_dot_product_attention", [queries], out)  # keys: see k_proj, rope
            return out
        module.scaled_dot_product_attention = attention
        undo.append(lambda m=module, f=fn: setattr(m, "scaled_dot_product_attention", f))

    def restore() -> None:
        for step in reversed(undo):
            step()
    return restore


def _join(step_arrays: list[np.ndarray], like: np.ndarray) -> np.ndarray | None:
    """Concatenate the steps' arrays along the axis where the pass has all rows."""
    first = step_arrays[0]
    if first.shape == like.shape:  # no sequence axis (e.g. a state): compare the last step
        return step_arrays[-1]
    axes = [i for i, (a, b) in enumerate(zip(first.shape, like.shape)) if a != b]
    if len(axes) != 1 or first.ndim != like.ndim:
        return None
    ax, n = axes[0], len(step_arrays)
    if first.shape[ax] == 1:
        return np.concatenate(step_arrays, axis=ax)
    context = first.shape[ax] - 1  # e.g. a convolution's input: 3 earlier rows, then the new one
    if like.shape[ax] != context + n:
        return None
    rows = [np.take(first, range(context), axis=ax)]
    rows += [np.take(a, [a.shape[ax] - 1], axis=ax) for a in step_arrays]
    return np.concatenate(rows, axis=ax)


def compare(block_calls, step_calls) -> list[tuple[str, bool, float]]:
    """``(name, inputs equal, largest output difference)`` per call of the pass."""
    by_name: dict[str, list] = defaultdict(list)
    for name, ins, outs in step_calls:
        by_name[name].append((ins, outs))
    rows = []
    for name, ins, outs in block_calls:
        steps = by_name.get(name)
        if not steps:
            continue
        ins_equal = True
        for j, a in enumerate(ins):
            joined = _join([s[0][j] for s in steps if j < len(s[0])], a)
            if joined is None or joined.shape != a.shape or not np.array_equal(joined, a):
                ins_equal = False
        worst = 0.0
        for j, a in enumerate(outs):
            joined = _join([s[1][j] for s in steps if j < len(s[1])], a)
            if joined is None or joined.shape != a.shape:
                worst = float("inf")
            else:
                worst = max(worst, float(np.max(np.abs(joined.astype(np.float64) - a))))
        rows.append((name, ins_equal, worst))
    return rows


def probe_target(model: nn.Module, model_type: str, ids: list[int], block: int = 16):
    """Compare one ``block``-token pass with ``block`` one-token steps after the prompt
    ``ids`` (the module docstring); returns :func:`compare`'s rows. The model is restored
    afterwards."""
    runner = TargetRunner(model, model_type)
    rec = Recorder()
    nxt = np.random.default_rng(0).integers(0, runner.vocab_size, size=block).tolist()

    def prefilled():
        cache = runner.make_cache()
        logits, _ = runner.forward(mx.array([ids]), cache)
        mx.eval(logits, [c.state for c in cache])
        return cache

    restore = instrument(model, rec)
    try:
        cache = prefilled()
        rec.on, rec.calls = True, []
        mx.eval(runner.forward(mx.array([nxt]), cache, tapes=[])[0])
        block_calls, rec.calls, rec.on = rec.calls, [], False
        rec.forward_done()
        cache = prefilled()
        rec.on = True
        for t in nxt:
            mx.eval(runner.forward(mx.array([[t]]), cache)[0])
            rec.forward_done()
        step_calls, rec.on = rec.calls, False
    finally:
        restore()
    return compare(block_calls, step_calls)


def probe(name: str, root: Path, block: int) -> None:
    """Print the report for one variant of the exactness suite."""
    target, _, _ = exact._build(root, name)
    rows = probe_target(target.model, target.model_type, prompt_ids(target), block)
    differ = [r for r in rows if r[2] != 0.0]
    causes = [r for r in differ if r[1]]
    print(f"\n{name}: {len(rows)} calls compared, {len(differ)} outputs differ, "
          f"{len(causes)} with equal inputs")
    for call, _, worst in causes[:12]:
        print(f"  row-count dependent: {call:<48} max |diff| {worst:.3g}")
    if differ and not causes:
        print(f"  first differing output: {differ[0][0]} (its inputs differ too)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*",
                        default=["qwen3_5-float16", "qwen3_5-4bit-bf16"])
    parser.add_argument("--block", type=int, default=16, help="tokens of the pass (16)")
    args = parser.parse_args()
    print(f"DFLASH_ROW_PRODUCTS={rp.mode()}")
    print(f"device: {mx.default_device()}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.variants:
            probe(name, Path(tmp), args.block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

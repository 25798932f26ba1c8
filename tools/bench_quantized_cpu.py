"""A 4-bit target on this device, kept quantized vs dequantized at load, as one JSON object.

    python tools/bench_quantized_cpu.py [--bits 4] [--repeats N] [--max-tokens N]
                                        [--prefix N] [--out FILE]

Made for issue #21 ("quantized targets on the CPU"): the bundled demo target is quantized with
mlx-lm's ``convert`` (affine, group 64, bf16 scales: what mlx-community checkpoints are) into a
temporary folder, then loaded twice, ``load_target(..., keep_quantized=True)`` and as the app
loads it by default (dequantized to float32 on the CPU). For each: a 1-token step and a
16-token verify pass (``tools/bench_gpu.py``'s ``forward_costs``: median ms after ``--prefix``
cached tokens) and plain vs DFlash with the bundled drafter on the demo prompt
(``pair_figures``: tok/s, ratio, tau, identical tokens). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _bench_gpu():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "tools" / "bench_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prefix", type=int, default=128)
    p.add_argument("--out", type=Path, help="also write the JSON here")
    args = p.parse_args(argv)

    import mlx.core as mx
    from mlx_lm.convert import convert

    from app import __version__
    from app.engine.blas import blas_description
    from app.engine.device import device_description
    from app.models.loader import load_drafter, load_target
    from app.paths import demo_pair_dirs

    bg = _bench_gpu()
    t_dir, d_dir = demo_pair_dirs()
    drafter = load_drafter(d_dir)
    taps = list(drafter.config.target_layer_ids)
    result: dict = {"header": {"app": __version__, "mlx": mx.__version__,
                               "device": device_description(mx), "blas": blas_description(),
                               "target": f"{t_dir.name}, {args.bits}-bit (group 64, bf16 "
                                         "scales)", "drafter": d_dir.name}}
    with tempfile.TemporaryDirectory() as tmp:
        q_dir = Path(tmp) / "q"
        convert(str(t_dir), str(q_dir), quantize=True, q_bits=args.bits, q_group_size=64,
                dtype="bfloat16")
        for name, keep in (("kept_quantized", True), ("dequantized", None)):
            target = load_target(q_dir, keep_quantized=keep)
            fig = bg.forward_costs(target.model, target.model_type, taps, args.prefix,
                                   args.repeats)
            fig.update(bg.pair_figures(target, drafter, args.max_tokens))
            fig["weights_note"] = target.weights_note
            result[name] = fig
            del target
    return bg.emit_json(result, args.out)


if __name__ == "__main__":
    sys.exit(main())

"""A window's start, timed as the window does it: from a fresh process to the first replies.

In order, in one process: PyTorch kept out first (``app.models.no_torch``, as ``python -m app``
does), the session's import, loading the bundled pair with its DFlash2 drafter
(``ChatSession.load``: on MLX's CUDA backend it first starts the kernel build in child
processes, then imports mlx-lm's loader and tokenizer, transformers included, and loads),
``ChatSession.warm_up`` (on CUDA: waits for the kernel build, then one plain and one DFlash
reply; the report's parts), then a first reply in each mode, as a user sending at once would
see them: plain, DFlash, DFlash2 (first event and total). ``start to ready`` is import + load
+ warm-up. ``--tokenizer-first`` imports transformers before the load instead (the JSON's
``tokenizer_import_s``, null otherwise: it is inside ``load_s``), which leaves it out of the
build's overlap. Run it on a fresh host, or with ``MLX_PTX_CACHE_DIR`` set to an empty folder for a
stand-in (every disk-cached kernel built again).

    python tools/bench_start.py [--max-tokens 64] [--json F]

Nothing is asserted; it prints figures. ``DFLASH_IMPORT_TORCH=1`` leaves PyTorch importable,
to measure what it costs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.models.no_torch import keep_torch_out  # noqa: E402

TORCH_HIDDEN = keep_torch_out()  # before anything imports transformers

QUESTION = "What is the capital of France?"


def main(argv: list[str] | None = None) -> int:
    """Run the start once and print its figures; returns 0."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens of each first reply")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument("--tokenizer-first", action="store_true",
                   help="import mlx-lm's tokenizer (transformers) before the load, timed apart")
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    from app.chat.session import ChatSession, PairSpec
    from app.engine.device import backend
    from app.paths import bundled_pair
    figures: dict = {"backend": backend(), "torch_hidden": TORCH_HIDDEN,
                     "import_s": time.perf_counter() - t0}
    figures["tokenizer_import_s"] = None  # inside load_s, as in the window
    if args.tokenizer_first:
        t = time.perf_counter()
        import mlx_lm.tokenizer_utils  # noqa: F401  (transformers, and PyTorch where importable)
        figures["tokenizer_import_s"] = time.perf_counter() - t

    target, drafter, dflash2 = bundled_pair()
    session = ChatSession()
    t = time.perf_counter()
    session.load(PairSpec(str(target), str(drafter), drafter2=str(dflash2)))
    figures["load_s"] = time.perf_counter() - t
    figures["torch_imported"] = sys.modules.get("torch") is not None

    from app.engine import warmup
    reports = []
    real = warmup.warm_up
    warmup.warm_up = lambda *a, **k: reports.append(real(*a, **k)) or reports[-1]
    t = time.perf_counter()
    session.warm_up()
    figures["warm_up_s"] = time.perf_counter() - t
    warmup.warm_up = real
    if reports:
        r, pb = reports[-1], reports[-1].prebuild
        figures["warm_up_parts"] = {
            "prebuild_s": pb.seconds if pb else 0.0, "processes": pb.processes if pb else 0,
            "recipes": len(pb.recipes) if pb else 0,
            "background": len(pb.background) if pb and pb.background else 0,
            "failed": list(pb.failed) if pb else [], "plain_s": r.plain_s,
            "drafted_s": list(r.drafted_s)}
    figures["start_to_ready_s"] = sum(figures[k] or 0.0 for k in
                                      ("import_s", "tokenizer_import_s", "load_s", "warm_up_s"))

    from app.engine.events import Done
    from app.engine.generate import GenerationConfig, generate
    ids = warmup.user_prompt_ids(session.target, QUESTION)
    figures["first_replies"] = {}
    for name, mode, d in (("plain", "plain", None), ("dflash", "dflash", session.drafter),
                          ("dflash2", "dflash", session.drafter2)):
        if mode != "plain" and d is None:
            continue
        t, first, n = time.perf_counter(), None, 0
        for ev in generate(session.target, ids, GenerationConfig(mode=mode,
                                                                 max_tokens=args.max_tokens), d):
            if first is None:
                first = time.perf_counter() - t
            if isinstance(ev, Done):
                n = ev.summary.generated_tokens
        figures["first_replies"][name] = {"first_event_s": first,
                                          "total_s": time.perf_counter() - t, "tokens": n}

    print(f"backend {figures['backend']}; PyTorch hidden: {TORCH_HIDDEN}, imported: "
          f"{figures['torch_imported']}")
    tok = figures["tokenizer_import_s"]
    print(f"import {figures['import_s']:.2f} s, "
          + (f"tokenizer import {tok:.2f} s, load " if tok is not None
             else "load (tokenizer import included) ")
          + f"{figures['load_s']:.2f} s, warm-up {figures['warm_up_s']:.2f} s: start to ready "
          f"{figures['start_to_ready_s']:.2f} s")
    if "warm_up_parts" in figures:
        print("warm-up parts:", json.dumps(figures["warm_up_parts"]))
    for name, f in figures["first_replies"].items():
        print(f"first {name} reply: first event {f['first_event_s']:.3f} s, total "
              f"{f['total_s']:.3f} s, {f['tokens']} tokens")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

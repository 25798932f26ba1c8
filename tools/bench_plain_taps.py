"""Plain decoding with and without the drafter's tap states kept (issue #19's 3% goal).

With a drafter loaded and a kept session, plain decoding records the target's tap states so a
later DFlash turn can reuse the prefix (``app.engine.generate._tap_keeper``). This benchmark
measures what that costs: the same prompts decoded plainly, greedy, with a fresh
:class:`~app.engine.prefix.PromptCache` per run, once without a drafter (no taps) and once
with the drafter (taps kept), in interleaved pairs so that load on a shared machine hits both
alike. It prints tok/s (generated tokens / generation seconds, prefill excluded) per variant
and the median of the paired ratios.

Usage: ``python -m tools.bench_plain_taps [--repeats N] [--max-tokens N]`` (bundled demo pair).
"""

from __future__ import annotations

import argparse
import statistics

from app.engine.events import TokenEvent
from app.engine.generate import GenerationConfig, generate
from app.engine.prefix import PromptCache
from app.engine.threads import allow_engine_on_current_thread
from app.models.loader import load_drafter, load_target
from app.paths import demo_pair_dirs

PROMPTS = [
    "Tell me about Chile.",
    "What is 17 times 23? Use the calculator.",
    "Name five countries in Africa.",
    "Explain photosynthesis.",
]


def _tok_s(target, ids, drafter, max_tokens: int) -> tuple[float, list[int]]:
    """(tok/s, tokens) of one plain greedy run with a fresh session."""
    cfg = GenerationConfig(mode="plain", max_tokens=max_tokens, temperature=0.0)
    gen = generate(target, ids, cfg, drafter=drafter, session=PromptCache())
    toks = [ev.token_id for ev in gen if isinstance(ev, TokenEvent)]
    return gen.summary.tok_per_s, toks


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints one line per variant and the paired ratio."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=200)
    args = p.parse_args(argv)
    allow_engine_on_current_thread()
    tdir, ddir = demo_pair_dirs()
    target, drafter = load_target(tdir), load_drafter(ddir)
    tok = target.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}],
                                       add_generation_prompt=True) for q in PROMPTS]
    for ids in prompts:  # warm-up
        _tok_s(target, ids, None, 8)
        _tok_s(target, ids, drafter, 8)
    plain, kept, ratios = [], [], []
    for _r in range(args.repeats):
        for ids in prompts:
            a, ta = _tok_s(target, ids, None, args.max_tokens)
            b, tb = _tok_s(target, ids, drafter, args.max_tokens)
            if ta != tb:
                raise SystemExit("tokens differ with the taps kept: a bug")
            plain.append(a)
            kept.append(b)
            ratios.append(b / a)
    print(f"plain, no drafter:      median {statistics.median(plain):.1f} tok/s")
    print(f"plain, drafter's taps:  median {statistics.median(kept):.1f} tok/s")
    print(f"paired ratio (taps / no taps): median {statistics.median(ratios):.3f} "
          f"over {len(ratios)} pairs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

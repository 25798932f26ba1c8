"""Cycles per second and bytes sent per committed token of a target sharded over 2 processes
(:mod:`app.engine.distributed`, MLX's ring backend on 127.0.0.1), plain vs DFlash.

    python tools/bench_distributed.py [--model M --draft-model D] [--max-tokens 128]
        [--repeats 2] [--layer-split 3,3] [--json]

Starts itself as rank 1 and runs as rank 0 (a ring hostfile on two free local ports). For each
mode (plain, DFlash at the drafter's block size, greedy) and each prompt it runs the reply
once to warm up, then ``--repeats`` times, and reports over the decode only (the prefill's
traffic and time left out): cycles per second (a plain cycle is one token), committed tokens
per cycle, bytes put on the network per committed token and per cycle (every hop, headers
included, counted on rank 0), and the share of the decode rank 0 spent waiting on the group
(the other rank's layers included). The same replies in one process (the whole target
loaded by rank 0, with no group) give the ``one process`` rows, and every sharded reply's
tokens are checked against them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.commands.distributed import free_ports  # noqa: E402

PROMPTS = [
    "Name five capitals in Europe.",
    "What is 17 times 23? Think step by step.",
    "Write a short note about the water cycle.",
]


def _decode_traffic(log: list) -> tuple[int, float]:
    """Bytes and wait seconds of a reply's exchanges after its prefill (the leading RESET
    and multi-position forward passes that are not verify passes)."""
    from app.engine.distributed import FORWARD, RESET, VERIFY

    k = 0
    while k < len(log):
        op, positions, flags, _, _ = log[k]
        if op == RESET or (op == FORWARD and positions > 1 and not flags & VERIFY):
            k += 1
            continue
        break
    rest = log[k:]
    return sum(e[3] for e in rest), sum(e[4] for e in rest)


def _reply(target, drafter, ids, mode: str, max_tokens: int) -> dict:
    from app.engine.events import CycleEvent, Done, TokenEvent
    from app.engine.generate import GenerationConfig, generate

    tokens, cycles, summary = [], 0, None
    cfg = GenerationConfig(mode=mode, max_tokens=max_tokens)
    for ev in generate(target, ids, cfg, drafter if mode != "plain" else None):
        if isinstance(ev, TokenEvent):
            tokens.append(ev.token_id)
        elif isinstance(ev, CycleEvent):
            cycles += 1
        elif isinstance(ev, Done):
            summary = ev.summary
    if summary.error:
        raise RuntimeError(summary.error)
    committed = len(tokens) - 1  # the prefill's token is no cycle's
    out = {"tokens": tokens, "committed": committed,
           "cycles": cycles if mode != "plain" else committed,
           "decode_s": summary.total_s - summary.ttft_s}
    shard = getattr(target, "shard", None)
    if shard is not None:
        out["bytes"], out["wait_s"] = _decode_traffic(shard.traffic.log)
    return out


def _rank0(args, link) -> dict:
    import mlx.core as mx

    from app.models.distributed import load_shard
    from app.models.loader import load_drafter, load_target

    mx.set_default_device(mx.cpu)
    shard = load_shard(args.model, link, args.layer_split)
    whole = load_target(args.model)
    drafter = load_drafter(args.draft_model)
    prompts = [list(whole.tokenizer.apply_chat_template(
        [{"role": "user", "content": p}], add_generation_prompt=True)) for p in PROMPTS]
    rows = {}
    for where, target in (("one process", whole), ("2 ranks", shard)):
        for mode in ("plain", "dflash"):
            runs = []
            for ids in prompts:
                _reply(target, drafter, ids, mode, args.max_tokens)  # warm-up
                runs += [_reply(target, drafter, ids, mode, args.max_tokens)
                         for _ in range(args.repeats)]
            rows[(where, mode)] = runs
    for mode in ("plain", "dflash"):  # the sharded replies' tokens are the one-process ones
        same = all(a["tokens"] == b["tokens"] for a, b in
                   zip(rows[("one process", mode)], rows[("2 ranks", mode)]))
        if not same:
            raise RuntimeError(f"{mode}: the sharded tokens differ from one process's")
    table = []
    for (where, mode), runs in rows.items():
        cycles = sum(r["cycles"] for r in runs)
        committed = sum(r["committed"] for r in runs)
        decode_s = sum(r["decode_s"] for r in runs)
        row = {"where": where, "mode": mode, "cycles": cycles, "committed": committed,
               "cycles_per_s": cycles / decode_s, "tokens_per_cycle": committed / cycles,
               "tok_per_s": committed / decode_s}
        if where == "2 ranks":
            nbytes = sum(r["bytes"] for r in runs)
            row.update(bytes_per_token=nbytes / committed, bytes_per_cycle=nbytes / cycles,
                       wait_share=sum(r["wait_s"] for r in runs) / decode_s)
        table.append(row)
    shard.shard.stop()
    return {"model": args.model, "draft_model": args.draft_model, "ranges": shard.shard.ranges,
            "max_tokens": args.max_tokens, "repeats": args.repeats, "prompts": len(PROMPTS),
            "rows": table}


def _print(report: dict) -> None:
    print(f"target {report['model']} over 2 ranks (layers {report['ranges']}), "
          f"{report['prompts']} prompts x {report['repeats']}, max {report['max_tokens']} tokens")
    print(f"{'':12} {'mode':7} {'cycles/s':>9} {'tok/cycle':>9} {'tok/s':>7} "
          f"{'B/token':>9} {'B/cycle':>9} {'wait':>5}")
    for r in report["rows"]:
        extra = (f"{r['bytes_per_token']:9,.0f} {r['bytes_per_cycle']:9,.0f} "
                 f"{100 * r['wait_share']:4.0f}%") if "bytes_per_token" in r else ""
        print(f"{r['where']:12} {r['mode']:7} {r['cycles_per_s']:9.1f} "
              f"{r['tokens_per_cycle']:9.2f} {r['tok_per_s']:7.1f} {extra}")


def main() -> int:
    from app.paths import bundled_pair

    pair = bundled_pair()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(pair[0]) if pair else None)
    p.add_argument("--draft-model", default=str(pair[1]) if pair else None)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--layer-split")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if "MLX_RANK" not in os.environ:  # start rank 1, then be rank 0
        fd, hostfile = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump([[f"127.0.0.1:{port}"] for port in free_ports(2)], f)
        os.environ["MLX_HOSTFILE"] = hostfile
        peer = subprocess.Popen([sys.executable, *sys.argv],
                                env=dict(os.environ, MLX_RANK="1"))
        os.environ["MLX_RANK"] = "0"
    else:
        peer = None
    from app.engine.distributed import join_group

    link = join_group()
    if link.rank != 0:
        import mlx.core as mx

        from app.models.distributed import load_shard

        mx.set_default_device(mx.cpu)
        load_shard(args.model, link, args.layer_split).serve()
        return 0
    report = _rank0(args, link)
    if peer is not None:
        peer.wait(timeout=30)
    print(json.dumps(report)) if args.json else _print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

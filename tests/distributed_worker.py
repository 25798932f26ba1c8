"""One rank of the 2-process tests in ``tests/test_distributed.py`` (CPU, ring backend).

Started with ``MLX_HOSTFILE`` and ``MLX_RANK`` set. Every rank loads its shard of each target;
rank 0 runs the scenario and writes a JSON report, the other rank serves until told to stop.

Scenarios:

* ``exact``: for each ``--pair TARGET[:DRAFTER]`` and run (plain, DFlash with tape and
  replay, DFlash2 when a DFlash2 drafter is given, fast verify), the tokens and every layer's
  cache of the sharded run against the same run in one process (the whole target loaded by
  rank 0), and a verify pass undone (``restore``) on both ranks;
* ``kill``/``hang``: a DFlash reply during which rank 0 kills (SIGKILL) or stops (SIGSTOP)
  rank 1, whose pid is in ``PEER_PID``: the reply's end, its error and the seconds it took.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

importlib.import_module("app.engine")  # an optimized BLAS before MLX, on Linux

import mlx.core as mx  # noqa: E402

mx.set_default_device(mx.cpu)

from app.engine import generate as gen  # noqa: E402
from app.engine.distributed import cache_state, join_group  # noqa: E402
from app.engine.events import CycleEvent, Done, TokenEvent  # noqa: E402
from app.engine.generate import GenerationConfig, generate  # noqa: E402
from app.engine.rollback import VerifyCheckpoint  # noqa: E402
from app.engine.target import TargetRunner  # noqa: E402
from app.models.distributed import load_shard  # noqa: E402
from app.models.loader import load_drafter, load_target  # noqa: E402

PROMPT = [{"role": "user", "content": "What is the capital of France? Think first."}]


def _collect(generation, on_cycle=None):
    tokens, cycles, done = [], [], None
    for ev in generation:
        if isinstance(ev, TokenEvent):
            tokens.append(ev.token_id)
        elif isinstance(ev, CycleEvent):
            cycles.append(ev)
            if on_cycle is not None:
                on_cycle(len(cycles))
        elif isinstance(ev, Done):
            done = ev.summary
    return tokens, cycles, done


class _Recorder:
    """Keeps the last cache list a one-process run made (plain or through a runner)."""

    def __init__(self):
        self.cache = None
        plain, runner = gen.make_prompt_cache, TargetRunner.make_cache

        def make_plain(model):
            self.cache = plain(model)
            return self.cache

        def make_runner(this):
            self.cache = runner(this)
            return self.cache

        gen.make_prompt_cache = make_plain
        TargetRunner.make_cache = make_runner


def _difference(a: list, b: list) -> float:
    """Largest absolute difference between two per-layer lists of arrays (inf when the
    layouts differ)."""
    if len(a) != len(b):
        return float("inf")
    worst = 0.0
    for xs, ys in zip(a, b):
        if len(xs) != len(ys):
            return float("inf")
        for x, y in zip(xs, ys):
            if x.shape != y.shape:
                return float("inf")
            worst = max(worst, mx.abs(x.astype(mx.float32) - y.astype(mx.float32)).max().item())
    return worst


def _runs(drafter2: bool) -> list[dict]:
    runs = [dict(mode="plain"), dict(mode="dflash", rollback="tape"),
            dict(mode="dflash", rollback="replay"),
            dict(mode="dflash", rollback="tape", fast_verify=True)]
    runs += [dict(mode="plain", temperature=0.8, seed=3),
             dict(mode="dflash", rollback="tape", temperature=0.8, seed=3),
             dict(mode="lookup", rollback="tape"),
             dict(mode="dflash", rollback="tape", auto_block=True)]
    if drafter2:
        runs.append(dict(mode="dflash2", rollback="tape"))
        runs.append(dict(mode="dflash2", rollback="tape", temperature=0.8, seed=3))
    return runs


def _same_auto_choices(whole, shard, drafter) -> None:
    """Before the automatic block size's runs: measure the pair's cost model through the
    sharded runner (the calibration's passes cross the network like a reply's), then give
    both runs that model, no online correction from measured times and no state carried from
    an earlier reply, so that they choose the same blocks and their caches compare bit for
    bit (with different blocks a sliding-window buffer holds the same rows rotated)."""
    from app.engine import block_control, costs

    model = costs.calibrate(gen.target_runner(shard), drafter, contexts=(8, 64), repeats=1)
    assert all(v > 0 for row in model.verify_ms for v in row), model
    for t in (whole, shard):
        costs.remember(drafter, t.model, model, "tape")
    block_control.COST_ALPHA = 0.0
    costs.known_state = lambda *a, **k: None


def exact(link, pairs: list[str], max_tokens: int) -> dict:
    report = {}
    for spec in pairs:
        tpath, _, dpaths = spec.partition(":")
        shard = load_shard(tpath, link)
        if link.rank != 0:
            shard.serve()
            continue
        whole = load_target(tpath)
        drafters = [load_drafter(d) for d in dpaths.split(",") if d]
        by_kind = {d.kind: d for d in drafters}
        ids = list(whole.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True))
        recorder = _Recorder()
        results = []
        for settings in _runs("dflash2" in by_kind):
            drafter = by_kind.get("dflash2" if settings["mode"] == "dflash2" else "dflash")
            if settings["mode"] == "lookup":
                drafter = None
            if settings.get("auto_block"):
                _same_auto_choices(whole, shard, drafter)
            cfg = GenerationConfig(max_tokens=max_tokens, block_size=None, **settings)
            ref_tokens, ref_cycles, ref_done = _collect(generate(whole, ids, cfg, drafter))
            ref_cache = [cache_state(c) for c in recorder.cache]
            before = shard.shard.traffic.bytes_sent
            tokens, cycles, done = _collect(generate(shard, ids, cfg, drafter))
            cache = shard.shard.gather_cache()
            results.append(dict(
                settings=settings, tokens=tokens, reference=ref_tokens,
                error=done.error, stop=done.stop_cause,
                cycles=len(cycles), replays=sum(c.replayed for c in cycles),
                partial=sum(1 for c in cycles if c.accepted < c.drafted),
                full=sum(1 for c in cycles if c.drafted and c.accepted == c.drafted),
                ref_replays=sum(c.replayed for c in ref_cycles),
                network_s=sum(c.network_s for c in cycles),
                ref_network_s=sum(c.network_s for c in ref_cycles),
                cache_layers=len(cache), cache_difference=_difference(cache, ref_cache),
                bytes=shard.shard.traffic.bytes_sent - before))
        results.append(_restore_check(shard, whole, ids))
        report[tpath] = results
        shard.shard.stop()
    return report


def _restore_check(shard, whole, ids) -> dict:
    """A verify pass on both ranks undone by ``restore``, and the same in one process."""
    caches = []
    for runner in (shard.shard, TargetRunner(whole.model, whole.model_type)):
        cache = runner.make_cache()
        runner.forward(mx.array([ids], dtype=mx.int32), cache, all_logits=False)
        dump = getattr(runner, "gather_cache", lambda c=cache: [cache_state(x) for x in c])
        before = dump()
        block = mx.array([ids[:7]], dtype=mx.int32)
        make = getattr(runner, "checkpoint", None)
        checkpoint = make(cache, "tape", mx.eval) if make else VerifyCheckpoint(
            runner, cache, "tape", mx.eval)
        runner.forward(block, cache, tapes=checkpoint.begin(block))
        grown = dump()
        checkpoint.restore()
        caches.append((before, grown, dump()))
    (before, grown, after), (_, _, one_after) = caches
    return dict(settings={"restore": True}, grown=_difference(grown, before),
                cache_difference=_difference(after, before),
                one_process_difference=_difference(after, one_after), cache_layers=len(after))


def peer_loss(link, pair: str, how: str, max_tokens: int) -> dict:
    tpath, _, dpath = pair.partition(":")
    shard = load_shard(tpath, link)
    if link.rank != 0:
        shard.serve()
        return {}
    drafter = load_drafter(dpath)
    ids = list(shard.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True))
    peer = int(os.environ["PEER_PID"])
    marks = {}

    def on_cycle(n):
        if n == 3:
            os.kill(peer, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            marks["t"] = time.perf_counter()

    if how == "kill":  # through the chat layer: the reply is stored as failed
        return _stored_turn(shard, drafter, on_cycle, marks, max_tokens)
    cfg = GenerationConfig(mode="dflash", max_tokens=max_tokens)
    tokens, cycles, done = _collect(generate(shard, ids, cfg, drafter), on_cycle)
    elapsed = time.perf_counter() - marks["t"] if "t" in marks else None
    return dict(stop=done.stop_cause, error=done.error, seconds=elapsed, tokens=len(tokens),
                cycles=len(cycles), lost=shard.shard.link.lost)


def _stored_turn(target, drafter, on_cycle, marks, max_tokens) -> dict:
    """One DFlash turn run and stored as the window runs it (``run_turn`` on a
    ``ChatSession``), the peer killed after 3 cycles: the stored reply's state."""
    from app.chat.reply import ReplySettings
    from app.chat.session import ChatSession
    from app.chat.storage import Store
    from app.chat.stored_turn import TurnRequest, run_turn
    from app.engine.events import CycleEvent as Cycle
    from app.engine.prefix import PromptCache

    store = Store(":memory:")
    session = ChatSession(store)
    session.target, session.drafter, session.cache = target, drafter, PromptCache()
    conv = store.new_conversation()
    request = TurnRequest(conv.id, "Write.", ReplySettings(mode="dflash", max_tokens=max_tokens))
    cycles = 0
    for tagged in run_turn(store, session, request):
        if isinstance(tagged.event, Cycle):
            cycles += 1
            on_cycle(cycles)
    elapsed = time.perf_counter() - marks["t"] if "t" in marks else None
    reply = store.active_path(conv.id)[-1]
    return dict(stop=reply.status, error=reply.error, seconds=elapsed, role=reply.role,
                tokens=len(reply.token_ids), cycles=cycles, lost=target.shard.link.lost)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["exact", "kill", "hang"])
    p.add_argument("--pair", action="append", default=[])
    p.add_argument("--max-tokens", type=int, default=40)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--out")
    args = p.parse_args()
    link = join_group(args.timeout)
    if args.scenario == "exact":
        report = exact(link, args.pair, args.max_tokens)
    else:
        report = peer_loss(link, args.pair[0], args.scenario, args.max_tokens)
    if link.rank == 0:
        Path(args.out).write_text(json.dumps(report))
    sys.stdout.flush()
    os._exit(0)  # a communication thread left on a lost peer must not hold the exit


if __name__ == "__main__":
    sys.exit(main())

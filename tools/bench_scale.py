"""DFlash at real scale (issue #44): plain vs DFlash / DFlash2 end to end on random-weight
targets with Qwen3.5-4B's and Qwen3.5-9B's shapes, with acceptance set to the published tau.

    python tools/bench_scale.py [--shapes 4b,9b|tiny] [--dtypes bfloat16,4bit]
                                [--prompt-lengths 512,4096] [--max-tokens 256] [--repeats 3]
                                [--modes plain,dflash,dflash2] [--tau 4.99] [--tau2 6.20]
                                [--json FILE]

A benchmark, not a test: nothing is asserted (``tests/test_bench_scale.py`` checks it on
``--shapes tiny``).

**Targets.** Random ``qwen3_5`` models built by ``tools/bench_gpu.py``'s ``random_target``
(``bfloat16``; ``4bit``: mlx-lm's affine quantization, group 64, bf16 scales; ``float32`` for
CPU runs). ``4b``: ``bench_gpu.QWEN35_4B`` (32 layers, hidden 2560, MLP 9216, 16/4 heads of
256, GDN 16 key / 32 value heads of 128, vocabulary 248320, tied embeddings). ``9b``: the same
family with hidden 4096, MLP 12288, untied embeddings (Qwen/Qwen3.5-9B's published
``config.json`` text config, as copied into public test fixtures: 32 layers, 16/4 heads of 256,
GDN 16/32 heads of 128, every 4th layer full attention, vocabulary 248320). ``tiny``: the
engine's tiny ``qwen3_5`` (``app/models/tiny.py``, vocabulary 512) for CPU tests.

**Drafters.** Random weights, z-lab's shapes (``shared/DFLASH_NOTES.md``): Qwen3.5-4B-DFlash
current revision, 6 layers (5 sliding, window 4096, + 1 full), hidden 2560, MLP 9216, 32/8
heads of 128, taps [1,5,9,...,29], block 16, mask 248077. For 9B the same layout at hidden
4096 / MLP 12288 (z-lab/Qwen3.5-9B-DFlash's config is not in the notes; 6 layers of that width
plus its 8-tap ``fc`` make 1.29 B parameters, the size of its published Q8_0 GGUF, 1.29 GiB).
DFlash2: the DFlash backbone plus DFlash2's extras (conv kernel 2, group 16, selector rank
256, top-16; every layer sliding, window 2048), as the notes describe it; no Qwen3.5 DFlash2
checkpoint is published, so this shape is an assumption.

**Acceptance control.** Random drafters accept nothing, so each drafter is wrapped
(:class:`ControlledDrafter`): every cycle it runs the real drafter forward (its cost is
paid: the override depends on its output), then replaces the proposal by the target's own
greedy continuation (a plain run's tokens, computed first) for ``k`` slots and wrong tokens
after them. ``k`` is drawn (seeded, the same sequence in every run of a configuration, so
warmed shapes repeat) from the truncated geometric law of i.i.d. per-token acceptance
(Leviathan et al. 2023, the standard speculative-decoding model): slot ``i`` is accepted with
probability ``a`` while all before it were, so ``P(k) = a^k (1 - a)`` for ``k < B-1`` and
``P(B-1) = a^(B-1)``; ``a`` is solved so that ``E[k + 1] = (1 - a^B) / (1 - a) = tau``
(``a`` = 0.806 for tau 4.99, 0.851 for 6.20). The uniforms behind the draws are stratified
(:class:`StratifiedUniforms`) so a 256-token run's mean lands near tau (simulated over 400
seeds: mean 4.94 for 4.99, range 4.64-5.20; 6.18 for 6.20, range 5.54-6.89; the last cycles
are cut to the tokens left). Compare modes at the tau each row reports.
Default tau: 4.99 (DFlash) and 6.20 (DFlash2): the DFlash2 authors' blog, Qwen3.5-4B on GSM8K
(``DFLASH_NOTES.md``, "DFlash2"). ``--tau`` / ``--tau2`` override. DFlash is exact, so the
tokens must equal plain's (``identical``); if they do not, the controlled proposals stop
matching and the measured tau drops below the requested one.

**Per configuration** (shape, dtype, prompt length; random prompt ids, seeded): a plain run
(the reference tokens; it also warms plain), one untimed run of each DFlash mode (warm-up),
then ``--repeats`` rounds of every mode, the order rotating each round; then one run of each
DFlash mode with ``stage_timing`` (waits after each stage) for the per-cycle draft / verify /
rollback ms, apart so the headline runs are unperturbed. Reported per mode: decode tok/s
(first token to last, median), time to answer (prefill included, median), TTFT, tau,
acceptance, cycles, identical, and the median per-round ratio against plain (decode and time
to answer). A row is printed and the JSON rewritten after every configuration, so a run cut
off by a time limit keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Qwen3.5-9B's text config where it differs from bench_gpu.QWEN35_4B (module docstring).
QWEN35_9B_DIFF = {"hidden_size": 4096, "intermediate_size": 12288,
                  "tie_word_embeddings": False}

#: z-lab/Qwen3.5-4B-DFlash (current revision), DFLASH_NOTES.md "Checkpoint format".
ZLAB_TAPS = [1, 5, 9, 13, 17, 21, 25, 29]
ZLAB_MASK = 248077

#: Published mean committed tokens per cycle: DFlash2 authors' blog, Qwen3.5-4B, GSM8K.
DEFAULT_TAU = {"dflash": 4.99, "dflash2": 6.20}

BLOCK = 16


def target_config(shape: str) -> dict:
    """The ``qwen3_5`` config of ``shape`` (``4b``, ``9b`` or ``tiny``)."""
    from bench_gpu import QWEN35_4B

    if shape == "4b":
        return dict(QWEN35_4B)
    if shape == "9b":
        return {**QWEN35_4B, **QWEN35_9B_DIFF}
    if shape == "tiny":
        from app.models.tiny import target_config as tiny

        return tiny("qwen3_5", vocab_size=512, eos_id=2, hidden_size=64)
    raise ValueError(f"unknown shape {shape!r} (4b, 9b or tiny)")


def drafter_config(tcfg: dict, kind: str, tiny: bool) -> dict:
    """A z-lab-layout DFlash (``kind="dflash"``) or DFlash2 drafter config for ``tcfg``."""
    n = tcfg["num_hidden_layers"]
    if tiny:
        from app.models.tiny import drafter_config as tiny_cfg

        cfg = tiny_cfg(tcfg, tcfg["vocab_size"] - 1, BLOCK, [1, n - 3], True)
        window = 32
    else:
        hidden = tcfg["hidden_size"]
        cfg = {
            "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
            "hidden_size": hidden, "intermediate_size": tcfg["intermediate_size"],
            "num_hidden_layers": 6, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 10_000_000.0,
            "vocab_size": tcfg["vocab_size"], "max_position_embeddings": 262144,
            "num_target_layers": n, "tie_word_embeddings": False,
            "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
            "use_sliding_window": True, "sliding_window": 4096,
            "dflash_config": {"block_size": BLOCK,
                              "mask_token_id": min(ZLAB_MASK, tcfg["vocab_size"] - 1),
                              "target_layer_ids": [t for t in ZLAB_TAPS if t < n]},
        }
        window = 2048
    if kind == "dflash2":
        cfg = dict(cfg, architectures=["DFlash2DraftModel"],
                   layer_types=["sliding_attention"] * cfg["num_hidden_layers"],
                   use_sliding_window=True, sliding_window=window)
        cfg["dflash_config"] = dict(cfg["dflash_config"], conv_kernel_size=2,
                                    conv_group_size=16, selector_rank=16 if tiny else 256,
                                    selector_top_k=16)
    return cfg


def build_drafter(tcfg: dict, kind: str, dtype: str, tiny: bool):
    """A random-weight DFlash / DFlash2 :class:`~app.models.loader.LoadedDrafter` (float32
    next to a float32 target, else bfloat16, as z-lab ships them)."""
    import mlx.core as mx
    from bench_gpu import cast_floats

    from app.engine.dflash2 import DFlash2Config, DFlash2Drafter
    from app.engine.drafter import DFlashDrafter, DrafterConfig
    from app.models.loader import LoadedDrafter

    raw = drafter_config(tcfg, kind, tiny)
    cfg = (DFlash2Config if kind == "dflash2" else DrafterConfig).from_dict(raw)
    model = (DFlash2Drafter if kind == "dflash2" else DFlashDrafter)(cfg)
    model.eval()
    cast_floats(model, "float32" if dtype == "float32" else "bfloat16")
    mx.eval(model.parameters())
    return LoadedDrafter(model=model, config=cfg, path=Path("."), name=f"random-{kind}")


def build_target(tcfg: dict, dtype: str, shape: str):
    """A random-weight :class:`~app.models.loader.LoadedTarget` (no end token: every run
    generates exactly ``max_tokens``)."""
    from bench_gpu import random_target

    from app.models.loader import LoadedTarget

    model = random_target(tcfg, dtype)
    return LoadedTarget(model=model, tokenizer=None, path=Path("."), name=f"random-{shape}",
                        model_type="qwen3_5", config=tcfg, eos_token_ids=set(),
                        context_length=int(tcfg.get("max_position_embeddings", 4096)))


# --- acceptance control -----------------------------------------------------------------------

def acceptance_probability(tau: float, block: int = BLOCK) -> float:
    """``a`` with ``(1 - a^B) / (1 - a) = tau`` (the mean of ``k + 1`` under the truncated
    geometric law of the module docstring), by bisection; ``tau`` in ``[1, B]``."""
    tau = min(max(tau, 1.0), float(block))
    mean = lambda a: sum(a ** i for i in range(block))  # noqa: E731  (1 + a + .. + a^(B-1))
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean(mid) < tau else (lo, mid)
    return (lo + hi) / 2


def draw_accepted(u: float, a: float, slots: int) -> int:
    """``k`` (accepted drafts, at most ``slots``) for the uniform ``u`` in [0, 1): the inverse
    of the truncated geometric law's CDF (``P(k >= i) = a^i``)."""
    k = 0
    while k < slots and u < a ** (k + 1):
        k += 1
    return k


class StratifiedUniforms:
    """Uniforms in [0, 1) drawn in shuffled strata of ``n`` (one in each ``[j/n, (j+1)/n)``),
    seeded: each draw is uniform, but the mean of a few dozen draws of any function of them is
    close to its expectation, so a 256-token run's tau is close to the requested one."""

    def __init__(self, seed: int, n: int = 16):
        self.rng, self.n, self.queue = random.Random(seed), n, []

    def __call__(self) -> float:
        if not self.queue:
            strata = list(range(self.n))
            self.rng.shuffle(strata)
            self.queue = [(j + self.rng.random()) / self.n for j in strata]
        return self.queue.pop()


class ControlledDrafter:
    """Wraps a drafter model so its proposal is ``reference[g+1 : g+1+k]`` then wrong tokens,
    ``k`` drawn per cycle (:func:`draw_accepted`); ``g`` is the pending token's index among
    the generated tokens (the drafter cache's offset minus the prompt length, after the real
    draft appended the new context). The real forward runs and the override depends on its
    output, so its cost is in every cycle."""

    def __init__(self, model, reference: list[int], prompt_len: int, tau: float, seed: int):
        self.inner = model
        self.config = model.config
        self.reference = reference
        self.prompt_len = prompt_len
        self.a = acceptance_probability(tau)
        self.uniform = StratifiedUniforms(seed)
        self.vocab = int(model.config.vocab_size)
        self.drawn: list[int] = []

    def make_cache(self):
        return self.inner.make_cache()

    def extend_context(self, taps, cache):
        return self.inner.extend_context(taps, cache)

    def _override(self, real, length: int, cache):
        import mlx.core as mx

        g = int(cache[0].offset) - self.prompt_len
        k = draw_accepted(self.uniform(), self.a, length - 1)
        self.drawn.append(k)
        ref = self.reference[g + 1: g + length]
        ref = ref + [0] * (length - 1 - len(ref))
        forced = ref[:k] + [(t + 1) % self.vocab for t in ref[k:]]
        return mx.array(forced, dtype=mx.int32) + 0 * real.astype(mx.int32)

    def draft(self, runner, pending, length, taps, cache):
        real = self.inner.draft(runner, pending, length, taps, cache)
        return self._override(real, length, cache)

    def propose(self, runner, pending, length, taps, cache, temperature=0.0, selector=True):
        real, cand, q = self.inner.propose(runner, pending, length, taps, cache,
                                           temperature=temperature, selector=selector)
        return self._override(real, length, cache), cand, q


# --- runs ---------------------------------------------------------------------------------

def run_once(target, prompt: list[int], mode: str, max_tokens: int, drafter=None,
             stage_timing: bool = False):
    """One generation: ``(tokens, Summary)``."""
    from app.engine.events import Done, TokenEvent
    from app.engine.generate import GenerationConfig, generate

    cfg = GenerationConfig(mode="plain" if mode == "plain" else "dflash",
                           max_tokens=max_tokens, stage_timing=stage_timing)
    tokens, summary = [], None
    for ev in generate(target, prompt, cfg, drafter if mode != "plain" else None):
        if isinstance(ev, TokenEvent):
            tokens.append(ev.token_id)
        elif isinstance(ev, Done):
            summary = ev.summary
    if summary.error:
        raise RuntimeError(f"{mode} run failed: {summary.error}")
    return tokens, summary


def _first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def measure(target, drafters: dict, prompt: list[int], max_tokens: int, repeats: int,
            taus: dict, seed: int, log=print) -> dict:
    """Every figure of one configuration (module docstring, "Per configuration")."""
    from app.models.loader import LoadedDrafter

    t0 = time.perf_counter()
    reference, _ = run_once(target, prompt, "plain", max_tokens)
    log(f"    reference plain run {time.perf_counter() - t0:.1f} s")

    def controlled(mode):
        real = drafters[mode]
        wrap = ControlledDrafter(real.model, reference, len(prompt), taus[mode], seed)
        return LoadedDrafter(model=wrap, config=real.config, path=real.path, name=real.name)

    modes = ["plain", *drafters]
    for mode in drafters:  # warm-up: the same k sequence, so the same shapes, as timed runs
        t0 = time.perf_counter()
        run_once(target, prompt, mode, max_tokens, controlled(mode))
        log(f"    warm-up {mode} {time.perf_counter() - t0:.1f} s")
    runs: dict = {m: [] for m in modes}
    for r in range(repeats):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for mode in order:
            drafter = controlled(mode) if mode != "plain" else None
            tokens, s = run_once(target, prompt, mode, max_tokens, drafter)
            runs[mode].append((tokens, s, drafter.model.drawn if drafter else None))
        log(f"    round {r + 1}/{repeats}: " + ", ".join(
            f"{m} {runs[m][-1][1].tok_per_s:.1f} tok/s" for m in modes))
    out: dict = {}
    for mode in modes:
        sums = [s for _, s, _ in runs[mode]]
        identical = all(t == reference for t, _, _ in runs[mode])
        row = {
            "decode_tok_per_s": statistics.median(s.tok_per_s for s in sums),
            "time_to_answer_s": statistics.median(s.total_s for s in sums),
            "ttft_s": statistics.median(s.ttft_s for s in sums),
            "generated_tokens": sums[0].generated_tokens,
            "identical": identical,
            "first_divergence": next((_first_diff(t, reference) for t, _, _ in runs[mode]
                                      if t != reference), None),
            "peak_memory_gb": max(s.peak_memory_bytes for s in sums) / 1e9,
        }
        if mode != "plain":
            drawn = runs[mode][0][2]
            plain = [s for _, s, _ in runs["plain"]]
            row.update({
                "tau": statistics.median(s.tau for s in sums),
                "tau_requested": taus[mode],
                # the mean of the drawn k + 1: the cycles that drafted (a last cycle with one
                # token left drafts nothing, commits 1 and is not drawn)
                "tau_drawn": sum(k + 1 for k in drawn) / max(len(drawn), 1),
                "acceptance": statistics.median(s.acceptance_rate for s in sums),
                "cycles": sums[0].cycles,
                "decode_x_plain": statistics.median(
                    s.tok_per_s / p.tok_per_s for s, p in zip(sums, plain)),
                "answer_x_plain": statistics.median(
                    p.total_s / s.total_s for s, p in zip(sums, plain)),
                "cycle_ms": 1000 * statistics.median(
                    (s.generated_tokens - 1) / s.tok_per_s / max(s.cycles, 1) for s in sums),
            })
            tokens, st = run_once(target, prompt, mode, max_tokens, controlled(mode),
                                  stage_timing=True)
            cycles = max(st.cycles, 1)
            row.update({
                "draft_ms_per_cycle": 1000 * st.draft_s / cycles,
                "verify_ms_per_cycle": 1000 * st.verify_s / cycles,
                "rollback_ms_per_cycle": 1000 * st.rollback_s / cycles,
                "replays_per_cycle": st.replays / cycles,
                "staged_identical": tokens == reference,
            })
            row["identical"] = row["identical"] and row["staged_identical"]
        else:
            row["step_ms"] = 1000 / row["decode_tok_per_s"] if row["decode_tok_per_s"] else None
        out[mode] = row
    return out


# --- output -------------------------------------------------------------------------------

HEAD = (f"{'config':<26}{'mode':<8}{'tok/s':>8}{'x':>6}{'answer s':>9}{'x':>6}{'ttft s':>8}"
        f"{'tau':>6}{'acc':>6}{'draft':>7}{'verify':>7}{'rollb':>7}  same")


def table_rows(name: str, figures: dict) -> list[str]:
    """Text rows of one configuration (ms columns: per cycle, from the staged run)."""
    rows = []

    def num(f, key, fmt):
        v = f.get(key)
        return format(v, fmt) if v is not None else format("-", fmt.split(".")[0])

    for mode, f in figures.items():
        rows.append(
            f"{name:<26}{mode:<8}{f['decode_tok_per_s']:>8.1f}{num(f, 'decode_x_plain', '>6.2f')}"
            f"{f['time_to_answer_s']:>9.2f}{num(f, 'answer_x_plain', '>6.2f')}"
            f"{f['ttft_s']:>8.2f}{num(f, 'tau', '>6.2f')}{num(f, 'acceptance', '>6.2f')}"
            f"{num(f, 'draft_ms_per_cycle', '>7.1f')}{num(f, 'verify_ms_per_cycle', '>7.1f')}"
            f"{num(f, 'rollback_ms_per_cycle', '>7.1f')}  {'yes' if f['identical'] else 'NO'}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="4b", help="4b, 9b and/or tiny (comma-separated)")
    p.add_argument("--dtypes", default="bfloat16,4bit",
                   help="bfloat16, 4bit (group 64, bf16 scales), float32")
    p.add_argument("--prompt-lengths", default="512,4096")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default="plain,dflash,dflash2")
    p.add_argument("--tau", type=float, default=DEFAULT_TAU["dflash"],
                   help="DFlash's mean committed tokens per cycle (default 4.99)")
    p.add_argument("--tau2", type=float, default=DEFAULT_TAU["dflash2"],
                   help="DFlash2's (default 6.20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, help="4b/9b: fewer target layers (CPU smoke runs; "
                   "the drafter keeps the taps below it)")
    p.add_argument("--vocab", type=int, help="4b/9b: a smaller vocabulary (CPU smoke runs)")
    p.add_argument("--json", type=Path, help="write the results here (after every config)")
    p.add_argument("--budget-s", type=float, default=0,
                   help="start no new configuration after this many seconds (0: no limit); "
                        "the skipped ones are listed in the JSON's 'skipped'")
    args = p.parse_args(argv)

    import mlx.core as mx

    from app.engine.device import backend, device_description
    from app.engine.kernels.gdn_kernel import kernel_active

    split = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    modes = split(args.modes)
    kinds = [m for m in modes if m in ("dflash", "dflash2")]
    taus = {"dflash": args.tau, "dflash2": args.tau2}
    result = {"header": {"mlx": mx.__version__, "device": str(mx.default_device()),
                         "device_name": device_description(mx),
                         "gdn_kernel": kernel_active(),
                         "platform": f"{platform.system()} {platform.machine()}",
                         "max_tokens": args.max_tokens, "repeats": args.repeats,
                         "block_size": BLOCK, "tau_requested": {k: taus[k] for k in kinds},
                         "seed": args.seed},
              "configs": {}}
    log = lambda *a: print(*a, flush=True)  # noqa: E731
    log(f"# {result['header']['device_name']}, mlx {mx.__version__}")
    lines = [HEAD]
    started = time.perf_counter()
    over = lambda: args.budget_s and time.perf_counter() - started > args.budget_s  # noqa: E731
    for shape in split(args.shapes):
        tcfg = target_config(shape)
        if shape != "tiny":
            tcfg.update({k: v for k, v in (("num_hidden_layers", args.layers),
                                           ("vocab_size", args.vocab)) if v})
        label = shape + (f"-L{args.layers}" if args.layers and shape != "tiny" else "") + (
            f"-V{args.vocab}" if args.vocab and shape != "tiny" else "")
        for dtype in split(args.dtypes):
            if over():
                result.setdefault("skipped", []).extend(
                    f"{label}-{dtype}-p{n}" for n in split(args.prompt_lengths))
                continue
            t0 = time.perf_counter()
            mx.random.seed(args.seed)
            target = build_target(tcfg, dtype, shape)
            drafters = {k: build_drafter(tcfg, k, dtype, shape == "tiny") for k in kinds}
            # random_target turned cuDNN attention off on CUDA, as the app's loader does
            result["header"]["cudnn_sdpa"] = backend() == "CUDA" and os.environ.get(
                "MLX_CUDA_USE_CUDNN_SDPA", "1") != "0"
            log(f"## {label} {dtype}: built in {time.perf_counter() - t0:.1f} s")
            for length in [int(x) for x in split(args.prompt_lengths)]:
                name = f"{label}-{dtype}-p{length}"
                if over():
                    result.setdefault("skipped", []).append(name)
                    log(f"## {name}: skipped (--budget-s)")
                    continue
                log(f"## {name}")
                rng = random.Random(args.seed + length)
                prompt = [rng.randrange(tcfg["vocab_size"]) for _ in range(length)]
                t0 = time.perf_counter()
                figures = measure(target, drafters, prompt, args.max_tokens, args.repeats,
                                  taus, args.seed, log)
                result["configs"][name] = {"shape": shape, "dtype": dtype,
                                           "prompt_tokens": length,
                                           "seconds": time.perf_counter() - t0, **figures}
                rows = table_rows(name, figures)
                lines += rows
                log("\n".join([HEAD, *rows]))
                if args.json:
                    args.json.write_text(json.dumps(result, indent=1))
            del target, drafters
            mx.clear_cache()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    log("\n# all configurations (ms columns per cycle, staged run; x = over plain, "
        "median of rounds)")
    log("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

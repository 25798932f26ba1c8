"""Warm a freshly loaded pair up: build the GPU kernels a reply needs before the user asks.

Why: on a GPU backend every kernel shape is compiled the first time it runs, so without a
warm-up the first prefill and the first DFlash reply pay for the builds (on a fresh CUDA host,
tens of seconds). :func:`warm_up` runs one short plain reply and one short DFlash reply of
each loaded drafter on a fixed prompt, so the first real reply finds the step, prefill-chunk,
verify, rollback and drafter kernels built.

On MLX's CUDA backend it first compiles the kernels that MLX caches on disk in parallel child
processes (:mod:`app.engine.kernels.kernel_prebuild`), and meanwhile builds the project's Gated
DeltaNet kernel in this process (:func:`build_gdn_kernel`; MLX keeps custom kernels in memory
only), so that the replies then only read what was built (load and warm-up times:
docs/performance.md, "Figures").

It leaves no state behind: no prompt cache (``session`` is None), and the models' weights are
not touched; only MLX's kernel caches grow. On the CPU there is nothing to build (no JIT
beyond what the first reply does in microseconds), so :func:`needs_warm_up` is False there and
callers skip it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from app.engine.device import backend
from app.engine.drafter import DEFAULT_BLOCK_SIZE
from app.engine.events import Done
from app.engine.generate import GenerationConfig, generate
from app.engine.kernels import kernel_prebuild

#: The prompt of the warm-up replies (token ids are what matter; any text would do).
WARM_UP_TEXT = "Warm-up: say hello in one short sentence, then stop."


@dataclass
class WarmUpReport:
    """What :func:`warm_up` did: seconds of the plain reply and of each DFlash reply
    (``drafted_s``, one entry per drafter), the tokens generated in all, the parallel
    kernel build before them (``prebuild``; None where none ran), and the seconds of the
    Lookup reply (``lookup_s``; None where none ran)."""

    plain_s: float
    drafted_s: list[float]
    tokens: int
    prebuild: kernel_prebuild.PrebuildReport | None = None
    lookup_s: float | None = None

    @property
    def seconds(self) -> float:
        """Total seconds, the kernel build included."""
        built = self.prebuild.seconds if self.prebuild else 0.0
        return built + self.plain_s + sum(self.drafted_s) + (self.lookup_s or 0.0)


def needs_warm_up() -> bool:
    """True on GPU backends (Metal, CUDA), whose kernels are built on first use."""
    return backend() != "CPU"


def build_gdn_kernel(target) -> bool:
    """Compile :mod:`app.engine.kernels.gdn_kernel`'s kernel for ``target``'s Gated DeltaNet shapes
    and dtype by running it once on a one-token input (nothing is kept). Returns False, doing
    nothing, when the kernel is not active here, the target has no such layer, or its shapes
    are ones the kernel does not take (key head dim not a multiple of 32)."""
    import mlx.core as mx

    from app.engine.kernels.gdn_kernel import instance_call, kernel_active

    gdn = kernel_prebuild.first_gdn_layer(target.model)
    if gdn is None or not kernel_active():
        return False
    hk, dk, hv, dv = gdn.num_k_heads, gdn.head_k_dim, gdn.num_v_heads, gdn.head_v_dim
    if dk % 32 or hv % hk:  # shapes the kernel does not take: mlx-lm's loop runs instead
        return False
    kernel, call = instance_call(kernel_prebuild.activation_dtype(target.model), dk, dv, hk, hv)
    mx.eval(kernel(**call))
    return True


def warm_layers(target, lengths: tuple[int, ...] = (32, 16, 1)) -> None:
    """Run ``target``'s layers and head once per length in ``lengths`` (a short prefill, a
    16-token verify, a one-token step) on zero inputs, with ``mx.compile`` off and without
    the embedding look-up (nothing is kept).

    Why: while child processes compile the fused kernels and gathers
    (:mod:`app.engine.kernels.kernel_prebuild`), this process can already do the first-use work that
    needs none of them (loading MLX's built-in kernels, cuBLAS set-up for these matrix
    shapes), which the first warm-up reply would otherwise do after the children. With
    ``mx.compile`` off, mlx-lm's compiled functions run as separate built-in operations, so
    no fused module is built here.
    """
    import mlx.core as mx

    from app.engine.errors import UnsupportedArchitectureError
    from app.engine.target import TargetRunner

    try:
        runner = TargetRunner(target.model, target.model_type)
    except UnsupportedArchitectureError:  # a plain-only family: its reply warms it
        return
    dtype = kernel_prebuild.activation_dtype(target.model)
    mx.disable_compile()
    try:
        for n in lengths:
            cache = runner.make_cache()
            zeros = mx.zeros((1, n, runner.hidden_size), dtype=dtype)
            mx.eval(runner.forward(None, cache, all_logits=n > 1, embeds=zeros)[0])
    finally:
        if not os.environ.get("MLX_DISABLE_COMPILE"):  # the user's own switch stays
            mx.enable_compile()


def _prebuild(target, drafters: list, later: list) -> kernel_prebuild.PrebuildReport:
    """The CUDA part of :func:`warm_up`: children build the kernels of ``target`` and
    ``drafters`` not recorded as built, while this process builds the GDN kernel and runs
    :func:`warm_layers`; then children are left building ``later``'s in the background
    (a drafted run that needs them waits for those children:
    :func:`~app.engine.kernels.kernel_prebuild.wait_background_for`). Not all at once, even
    with a core for each recipe: on a fresh H100 host (16 cores) 12 children side by side
    took 9.8 s against 7.5-8.0 s for the first drafter's 7, and the start to ready 11.0 s
    against 8.5-9.3 s (docs/performance.md). Recipes that children started at load
    (:func:`~app.engine.kernels.kernel_prebuild.start_early`, every drafter's: they run
    while the target loads, so they do not hold up this process's own work) are not started
    again: this waits for those children.
    Never raises: whatever fails is listed in the report's ``failed`` and left to the
    replies, and the children started are always waited for."""
    started = time.perf_counter()
    job, errors = None, []
    todo, rest, early = [], [], []
    try:
        # children started at load (start_early), read before what is built: a child that
        # ends in between is then in both, never in neither
        running = kernel_prebuild.building()
        done = kernel_prebuild.built_before()  # kernels already on disk from an earlier start
        needed = kernel_prebuild.recipes_for(target, drafters)
        custom = [r for r in needed if r[0] in kernel_prebuild.CUSTOM and r not in done]
        early = [r for r in needed if r in running and r not in done]
        todo = [r for r in needed if r not in done and r not in running and r not in custom]
        rest = [r for r in kernel_prebuild.recipes_for(target, drafters + later)
                if r not in done and r not in needed and r not in running]
        fresh = [r for r in custom if r not in running]
        if fresh:  # one child each, waited for below
            kernel_prebuild.start_background(fresh, len(fresh))
        job = kernel_prebuild.start(todo) if todo else None
        # this process's own first passes load the custom kernels the children compile
        # (MLX would compile each here, one after another, and keep it in memory only)
        kernel_prebuild.wait_background_for(custom)
        build_gdn_kernel(target)  # from the disk cache, or compiled here if that failed
        if (job is not None or early) and os.environ.get("DFLASH_WARM_LAYERS", "1") != "0":
            warm_layers(target)
    except Exception as exc:  # a warm-up aid only: the replies build what it missed
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        built = (job.wait() if job is not None  # its seconds count from the children's start
                 else kernel_prebuild.PrebuildReport(time.perf_counter() - started, 0, []))
        if early:  # the load's children (start_early): waited for here, as our own
            built.processes += len(kernel_prebuild.children_building(early))
            kernel_prebuild.wait_background_for(early)
            built.seconds = max(built.seconds, time.perf_counter() - started)
            built.recipes = early + built.recipes
    built.failed += errors
    if rest and not errors:
        try:
            kernel_prebuild.start_background(rest)
            built.background = rest
        except OSError as exc:
            built.failed.append(f"background: {exc}")
    return built


def user_prompt_ids(target, text: str) -> list[int]:
    """``text`` as one user message in the target's chat-template prompt (token ids), or its
    plain encoding for a tokenizer without a template."""
    tok = target.tokenizer
    try:
        return list(tok.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True))
    except Exception:  # a tokenizer without a chat template
        return list(tok.encode(text))


def warm_up(target, drafters: list | tuple = (), max_tokens: int | None = None,
            prebuild: bool | None = None, every_drafter: bool = False,
            auto_block: bool = False, lookup: bool = False) -> WarmUpReport:
    """Run one plain and one greedy DFlash reply per drafter, to build their kernels.

    Args:
        target: a ``LoadedTarget``.
        drafters: loaded drafters (``LoadedDrafter``; None entries are skipped).
        max_tokens: new tokens per reply; default twice the largest block size plus one, so
            a full block's verify and a partial block's rollback both run.
        prebuild: compile the disk-cached kernels in parallel processes first
            (:mod:`app.engine.kernels.kernel_prebuild`); default: on MLX's CUDA backend, unless
            :func:`app.engine.kernels.kernel_prebuild.enabled` says no. Then only the first drafter
            gets a warm-up reply: the kernels that only the other drafters need (a DFlash2
            drafter's candidate walk) are built by child processes left running in the
            background (``WarmUpReport.prebuild.background``; :func:`_prebuild`). While the children compile,
            this process builds the GDN kernel (:func:`build_gdn_kernel`) and runs
            :func:`warm_layers` (``DFLASH_WARM_LAYERS=0`` skips it, for measurements). A
            failed child is only reported (``WarmUpReport.prebuild.failed``): the replies
            build what it missed.
        every_drafter: with a prebuild, still build every drafter's kernels and run its
            reply before returning (a headless comparison runs them all at once).
        auto_block: run the drafters' replies with the automatic block size
            (``GenerationConfig.auto_block``), which measures each pair's cost model
            (:mod:`app.engine.costs`) here rather than in the first real reply.
        lookup: also run one Lookup reply (prompt-lookup drafts, no drafter) last, for a
            caller that times Lookup beside the others (``compare --lookup``).

    Returns:
        A :class:`WarmUpReport`.

    Raises:
        whatever ``generate`` raises in the warm-up replies (an ``EngineError`` for a pair
        that cannot run); nothing from the kernel build.
    """
    drafters = [d for d in drafters if d is not None]
    if prebuild is None:
        prebuild = backend() == "CUDA" and kernel_prebuild.enabled()
    built = None
    if prebuild:
        # The first drafter's kernels before its reply, the others' in the background (their
        # first reply waits for those children, then reads the kernels from disk).
        later = [] if every_drafter else drafters[1:]
        drafters = drafters if every_drafter else drafters[:1]
        built = _prebuild(target, drafters, later)
    blocks = [int(getattr(d.config, "block_size", None) or DEFAULT_BLOCK_SIZE)
              for d in drafters]
    n = max_tokens or 2 * max(blocks or [8]) + 1
    ids = user_prompt_ids(target, WARM_UP_TEXT)
    tokens = 0

    def one(mode: str, drafter) -> float:
        nonlocal tokens
        t0 = time.perf_counter()
        cfg = GenerationConfig(mode=mode, max_tokens=n, auto_block=auto_block)
        for ev in generate(target, ids, cfg, drafter):
            if isinstance(ev, Done):
                tokens += ev.summary.generated_tokens
        return time.perf_counter() - t0

    plain = one("plain", None)
    drafted = [one("dflash", d) for d in drafters]
    looked = one("lookup", None) if lookup else None
    return WarmUpReport(plain, drafted, tokens, built, looked)

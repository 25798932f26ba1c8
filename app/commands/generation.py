"""What the generating commands share (``chat``: :mod:`app.commands.chat`, ``compare``:
:mod:`app.commands.compare`, ``bench``: :mod:`app.commands.bench`): the common arguments, the
model pair from the arguments or the bundled demo pair, tool definitions, reply settings, and
the exit-code guard (0 ok, 2 bad arguments or unusable model files).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.chat.reply import ReplySettings
from app.chat.settings import RANGES, SPECS, Sampling
from app.engine.errors import EngineError
from app.engine.modes import DRAFTER_MODES, ROLLBACKS, Mode

# A question that needs a tool and a reasoning block, in the bundled pair's closed world.
DEFAULT_PROMPT = "What is the local time in Sydney?"


class CommandError(Exception):
    """A problem with the command's input (exit code 2, message on stderr)."""


# ------------------------------------------------------------------------------ arguments
def int_at_least(minimum: int):
    """An argparse ``type`` accepting whole numbers >= ``minimum`` (clear message otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def int_between(minimum: int, maximum: int):
    """An argparse ``type`` accepting whole numbers from ``minimum`` to ``maximum`` (clear
    message otherwise)."""
    at_least = int_at_least(minimum)

    def parse(text: str) -> int:
        value = at_least(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(
                f"must be between {minimum} and {maximum}, got {value}")
        return value

    return parse


_positive_int = int_at_least(1)
_non_negative_int = int_at_least(0)

AUTO = "auto"
"""``--block-size auto``: the automatic block size (``ReplySettings.auto_block``)."""


def block_size_arg(text: str) -> int | str:
    """An argparse ``type`` for ``--block-size``: a whole number >= 1, or ``auto``."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or 'auto')") from None


def block_settings(value: int | str | None) -> tuple[int | None, bool]:
    """``(block_size, auto_block)`` of a ``--block-size`` value: ``auto`` is the drafter's
    block size as the largest, chosen per cycle."""
    return (None, True) if value == AUTO else (value, False)


def auto_block_note(value: int | str | None, mode: str) -> str | None:
    """The note for ``--block-size auto`` in a ``mode`` without a drafter (plain, lookup),
    where it has no effect; None otherwise."""
    if value != AUTO or Mode(mode) in DRAFTER_MODES:
        return None
    how = ("lookup drafts as many tokens as its match gives, up to the block size"
           if Mode(mode) == Mode.LOOKUP else "plain decoding drafts nothing")
    return (f"note: --block-size auto has no effect in {Mode(mode).value} mode: it chooses a "
            f"drafter's blocks (dflash, dflash2); {how}")


def _temperature(text: str) -> float:
    """An argparse ``type`` for ``--temp``: the window's range (``RANGES["temperature"]``,
    0 to 2), so a temperature means the same in both."""
    low, high = RANGES["temperature"]
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g}, got {value:g}")
    return value


def utf8_text(text: str) -> str:
    """An argparse ``type`` for text that reaches the model or the tokenizer (system prompt,
    stop strings, ...): refuses an argument that is not valid UTF-8 (exit code 2 with the
    command's usage). Python decodes such bytes of the command line to lone surrogates,
    which the tokenizer fails on (``TextEncodeInput must be Union[...]``)."""
    from app.chat.templates import lone_surrogate

    at = lone_surrogate(text)
    if at is not None:
        code = ord(text[at])
        what = (f"the byte 0x{code - 0xDC00:02x} at character {at + 1} cannot be decoded"
                if 0xDC80 <= code <= 0xDCFF  # an undecodable byte (surrogateescape)
                else f"a lone surrogate U+{code:04X} at character {at + 1}")
        raise argparse.ArgumentTypeError(f"not valid UTF-8 text: {what} (give UTF-8 text; "
                                         "check the terminal's or the script's encoding)")
    return text


def prompt_text(text: str) -> str:
    """An argparse ``type`` for a user message: refuses an empty or blank one, as the
    window's composer does, and one that is not valid UTF-8 (:func:`utf8_text`) (exit code 2
    with the command's usage)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the message is empty: give some text to reply to")
    return utf8_text(text)


STDIN_PROMPT = "-"
"""``--prompt -``: the message is read from standard input (:func:`read_stdin_prompt`)."""


def read_stdin_prompt(command: str) -> str:
    """The message of ``--prompt -``: standard input read to its end (a pipe, a file, or
    the terminal until Ctrl+D, as ``cat`` reads it; a line on stderr says how to end it
    there), decoded as UTF-8 (a leading byte-order mark dropped, CRLF line ends read as LF),
    its trailing line ends dropped as a shell's ``$(cat)`` drops them.

    Raises:
        CommandError: no standard input, one that cannot be read or is not UTF-8, or one
            that holds no text but white space (the message says how to pipe one in).
    """
    stream = sys.stdin
    if stream is None:
        raise CommandError("--prompt -: there is no standard input to read it from")
    try:
        if stream.isatty():
            _warn("reading the message from the terminal: end it with Ctrl+D "
                  "(Ctrl+Z then Enter on Windows)")
        buffer = getattr(stream, "buffer", None)
        data = buffer.read() if buffer is not None else stream.read().encode("utf-8")
    except (OSError, ValueError) as exc:  # ValueError: a closed stream
        raise CommandError(f"--prompt -: cannot read standard input ({exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CommandError(f"--prompt -: standard input is not valid UTF-8 text: the byte "
                           f"0x{data[exc.start]:02x} at byte {exc.start + 1} cannot be "
                           "decoded") from None
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").rstrip("\n")
    if not text.strip():
        raise CommandError("--prompt -: standard input held no text to reply to (it was empty "
                           "or blank); pipe the message in: echo 'Hello' | python -m app "
                           f"{command} --prompt -")
    return text


def refuse_mode(p: argparse.ArgumentParser, command: str, why: str) -> None:
    """Give ``p`` (a command without a ``--mode``: ``compare``, ``bench``, ``serve``) a
    hidden ``--mode`` that is refused with ``why``: without it argparse took ``--mode plain``
    for an abbreviation of ``--model`` and the error spoke of a model named "plain"."""

    def parse(text: str) -> str:
        raise argparse.ArgumentTypeError(f"{command} has no --mode: {why}")

    p.add_argument("--mode", type=parse, help=argparse.SUPPRESS)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="target: a folder or a cached Hugging Face repo id "
                   "(default: the bundled demo pair)")
    p.add_argument("--draft-model", help="DFlash or DFlash2 drafter folder or cached repo id "
                   "(default with the bundled demo target: its drafter; without --model it "
                   "is paired with the bundled demo target)")
    p.add_argument("--prompt", type=prompt_text, default=DEFAULT_PROMPT,
                   help=f"the user message (not empty; '-' reads it from standard input to "
                   f"its end, its trailing line ends dropped; default: {DEFAULT_PROMPT!r})")
    p.add_argument("--system-prompt", type=utf8_text, help="a system message")
    max_tokens = SPECS["max_tokens"].default  # the window's default, from the one table
    p.add_argument("--max-tokens", type=_positive_int, default=max_tokens,
                   help=f"generated tokens at most per round (default {max_tokens})")
    p.add_argument("--block-size", type=block_size_arg,
                   help="DFlash block size, 1..the drafter's (default: the drafter's), or "
                   "'auto': each cycle's block (1 = a plain step, up to the drafter's) chosen "
                   "from the pair's measured costs and the recent acceptance (opt-in; "
                   "docs/performance.md, 'Automatic block size')")
    p.add_argument("--rollback", choices=list(ROLLBACKS), default=ROLLBACKS[0],
                   help=f"recurrent-state rollback under DFlash (default {ROLLBACKS[0]})")
    p.add_argument("--fast-verify", action="store_true",
                   help="near-exact: verify with the chunked Gated DeltaNet form (faster on "
                   "CPU for hybrid targets; can change tokens, see README); off by default")
    p.add_argument("--keep-quantized", action="store_true",
                   help="keep a quantized target's layers quantized on the CPU (by default "
                   "they are dequantized to float32 when that fits in memory: faster verify)")
    think = p.add_mutually_exclusive_group()
    think.add_argument("--think", dest="think", action="store_true", default=None,
                       help="thinking on in the chat template")
    think.add_argument("--no-think", dest="think", action="store_false",
                       help="thinking off in the chat template")
    p.add_argument("--temp", type=_temperature, default=0.0,
                   help="sampling temperature (default 0: greedy)")
    p.add_argument("--seed", type=int_between(0, RANGES["seed"][1]),
                   help="random seed for sampling (0 to 2147483647)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1)")
    p.add_argument("--top-k", type=_non_negative_int, default=0,
                   help="sample among the k most likely tokens (default 0: all)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens below min-p times the top probability (default 0)")
    p.add_argument("--repetition-penalty", type=float, default=None,
                   help="penalise tokens seen in the last 20 (mlx-lm; e.g. 1.1)")
    p.add_argument("--tools", default="builtin", metavar="{builtin,none,FILE}",
                   help="tool definitions shown to the model: the built-in tools (default), "
                   "none, or a JSON file of definitions")
    p.add_argument("--tool-parser", type=utf8_text,
                   help="mlx_lm.tool_parsers module to use instead of the one inferred from "
                   "the chat template (e.g. json_tools)")
    p.add_argument("--stop", action="append", type=utf8_text, default=[], metavar="TEXT",
                   help="stop string (repeatable)")
    p.add_argument("--run-tools", action="store_true",
                   help="run the model's tool calls (built-in tools) and continue the reply")
    p.add_argument("--max-tool-rounds", type=_non_negative_int, default=8,
                   help="tool rounds at most per reply (default 8)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    from app.commands.distributed import add_distributed_arguments

    add_distributed_arguments(p)


# ------------------------------------------------------------------------------ setup
def _warn(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _bundled_drafter(pair: tuple, mode: str | None) -> str:
    """The drafter of ``pair`` (:func:`app.paths.bundled_pair`) for ``mode``: the DFlash2 one
    for ``dflash2`` when bundled, else the DFlash one."""
    return str(pair[2] if mode == Mode.DFLASH2 and pair[2] is not None else pair[1])


def resolve_pair(args, need_drafter: bool) -> tuple[str, str | None]:
    """(target, drafter or None) paths/repo ids from the arguments, the bundled demo pair, or
    a tiny random pair built under ``cache_dir()`` (one line on stderr says so).

    With no ``--draft-model``, the bundled target gets its bundled drafter: the DFlash2 one
    for ``--mode dflash2``, else the DFlash one. A ``--draft-model`` without ``--model`` is
    paired with the bundled demo target."""
    from app.paths import bundled_pair, cache_dir, is_bundled_target

    mode = getattr(args, "mode", None)
    pair = bundled_pair()
    if args.model:
        if need_drafter and not args.draft_model:
            if pair is not None and is_bundled_target(args.model):
                return args.model, _bundled_drafter(pair, mode)
            hint = " (or use --mode plain)" if mode else ""
            kind = "DFlash2" if mode == Mode.DFLASH2 else "DFlash"
            raise CommandError(f"{kind} needs --draft-model with --model{hint}")
        return args.model, args.draft_model
    if args.draft_model:
        if pair is None:
            raise CommandError("--draft-model needs --model (the target it was made for): "
                               "the bundled demo target is missing")
        return str(pair[0]), args.draft_model
    if pair is not None:
        return str(pair[0]), _bundled_drafter(pair, mode)
    from app.models.tiny import FALLBACK_FOLDER, fallback_pair

    root = cache_dir() / FALLBACK_FOLDER
    _warn(f"The bundled demo pair is missing: using a tiny random-weight pair in {root} "
          "(its text is gibberish).")
    t, d = fallback_pair()
    return str(t), str(d)


def default_dflash2(args) -> str | None:
    """The DFlash2 drafter ``bench`` and ``compare`` add: ``--dflash2-model`` (``none``: no
    DFlash2 side), else, on the bundled demo pair (neither ``--model`` nor ``--draft-model``),
    the bundled DFlash2 drafter when it is there (:func:`app.paths.bundled_pair`); else None."""
    given = getattr(args, "dflash2_model", None)
    if given is not None:
        return None if str(given).lower() == "none" else str(given)
    if getattr(args, "model", None) or getattr(args, "draft_model", None):
        return None
    from app.paths import bundled_pair

    pair = bundled_pair()
    return None if pair is None or pair[2] is None else str(pair[2])


def load_tools(spec: str) -> list[dict] | None:
    """Tool definitions for ``--tools``: ``builtin``, ``none`` or a JSON file path."""
    if spec == "none":
        return None
    from app.chat.tools import ToolFileError, load_tool_file, tool_schemas

    if spec == "builtin":
        return tool_schemas()

    try:
        return tool_schemas(load_tool_file(Path(spec)))
    except ToolFileError as exc:
        raise CommandError(str(exc)) from None


def prepare_tools(run_tools: bool, tools: list[dict] | None):
    """When tools will run, start building the unit tool's registry off this thread
    (:func:`app.chat.tools.units.build_in_background`, ~0.4-0.6 s of pint on this project's
    CPU) while the pair loads, so the first ``convert_units`` call does not pay for it.

    Returns:
        The building thread (``join`` it before anything is timed), or None when nothing is
        built (no tools run, or the registry exists).
    """
    if not run_tools or not tools:
        return None
    from app.chat.tools.units import build_in_background

    return build_in_background()


def default_thinking(target: str, drafter: str | None) -> bool | None:
    """The known pair's recommended thinking setting, else None (the template's default)."""
    from app.models.catalog import known_pair_for

    for name in (drafter, target):
        pair = known_pair_for(name)
        if pair is not None:
            return pair.thinking
    return None


def settings_from_args(args, mode: str, tools: list[dict] | None, think: bool | None):
    """:class:`ReplySettings` for ``mode`` from parsed arguments."""
    block, auto = block_settings(args.block_size)
    return ReplySettings(
        mode=mode,
        max_tokens=args.max_tokens,
        block_size=block,
        auto_block=auto,
        rollback=args.rollback,
        fast_verify=args.fast_verify,
        enable_thinking=think,
        stop=list(args.stop),
        tools=tools,
        run_tools=args.run_tools,
        # Only the built-in tools run, and only when they are the ones offered to the model;
        # tools from a file are shown to the model but never run here.
        runnable_tools=None if args.tools == "builtin" else [],
        max_tool_rounds=args.max_tool_rounds,
        tool_parser=args.tool_parser,
        sampling=Sampling(temperature=args.temp, top_p=args.top_p, top_k=args.top_k,
                          min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                          seed=args.seed),
    )


def check_prompt_fits(target, messages: list[dict], settings) -> None:
    """Refuse, before anything is generated, a message that can never fit the model's
    context: its rendered prompt (with the tools offered and the thinking setting) takes the
    whole context or more. The reply would prefill it for minutes and then degrade; the
    server refuses the same request with 400 (``context_length_exceeded``). A prompt that
    fits but leaves less than ``--max-tokens`` is left to the reply's own warning.

    Raises:
        CommandError: the prompt's tokens and the context, in one line.
    """
    from app.chat.history import context_limit
    from app.chat.templates import ChatTemplateError, render_prompt

    try:
        prompt = render_prompt(target.tokenizer, messages, tools=settings.tools,
                               enable_thinking=settings.enable_thinking)
    except ChatTemplateError:
        return  # the reply says it, as before
    n = len(prompt.ids)
    limit = context_limit(getattr(target, "context_length", None) or 2**31 - 1)
    if n >= limit:
        raise CommandError(f"the prompt takes {n:,} tokens, over the model's context of "
                           f"{limit:,} tokens: shorten the message")


def _messages(args) -> list[dict]:
    msgs = []
    if args.system_prompt:
        msgs.append({"role": "system", "content": args.system_prompt})
    msgs.append({"role": "user", "content": args.prompt})
    return msgs


def _load(args, need_drafter: bool):
    from app.engine.costs import set_store
    from app.models.catalog import warn_drafter_defaults
    from app.models.loader import check_pair, load_drafter
    from app.paths import default_data_dir

    set_store(default_data_dir())  # measured cost models of --block-size auto are kept there
    tpath, dpath = resolve_pair(args, need_drafter)
    target = load_target_arg(args, tpath)
    if target.weights_note:
        _warn(f"note: {target.weights_note}")
    drafter = None
    if dpath and need_drafter:
        drafter = load_drafter(dpath)
        try:
            check_pair(target, drafter)
        except EngineError as exc:
            if getattr(args, "draft_model", None) and not getattr(args, "model", None):
                raise CommandError(f"{exc} (without --model, --draft-model is paired with "
                                   "the bundled demo target: give --model for its own "
                                   "target)") from None
            raise
        for note in warn_drafter_defaults(drafter.path):
            _warn(f"warning: {note}")
    elif getattr(args, "draft_model", None):
        problem = drafter_problem(target, args.draft_model)
        if problem:
            _warn(f"warning: --draft-model {args.draft_model} is not used in plain mode, and "
                  f"it could not be used with this target anyway: {problem}")
    return target, drafter, tpath, dpath


def load_target_arg(args, tpath: str):
    """The target for the arguments: in this process, or with ``--distributed`` sharded over
    a group (:func:`app.commands.distributed.load_sharded_target`; on a rank other than 0
    that call serves its layers and ends the process)."""
    from app.commands.distributed import check_distributed_only
    from app.models.loader import load_target

    check_distributed_only(args)
    if getattr(args, "distributed", None):
        from app.commands.distributed import load_sharded_target

        return load_sharded_target(args, tpath, keep_quantized_arg(args))
    return load_target(tpath, keep_quantized=keep_quantized_arg(args))


def _no_prebuild_if_sharded(target) -> dict:
    """``warm_up``'s keyword for ``target``: no kernel prebuild in child processes for a
    target sharded over a group (its model holds rank 0's layers only)."""
    return {"prebuild": False} if getattr(target, "shard", None) is not None else {}


def warm_up_on_gpu(target, drafters: list) -> None:
    """On a GPU backend, warm the loaded pair up as the window does after a load
    (:func:`app.engine.warmup.warm_up`, every drafter included), so that the first reply's
    figures are not a kernel build's; says so on stderr. Nothing on the CPU."""
    from app.engine.warmup import needs_warm_up, warm_up

    if needs_warm_up():
        report = warm_up(target, drafters, every_drafter=True, **_no_prebuild_if_sharded(target))
        _warn(f"note: warmed up in {report.seconds:.1f} s (building GPU kernels)")


def warm_up_both(target, drafters: list, auto_block: bool = False,
                 lookup: bool = False) -> None:
    """Before anything is timed, run every path that will be timed once on the loaded pair,
    on every backend (:func:`app.engine.warmup.warm_up`): plain, each drafter's (DFlash or
    DFlash2) and, with ``lookup``, Lookup. A process's first plain reply on the CPU is up
    to half as fast as its later ones, which made a cold plain side look slower than it is.
    Says on stderr how many paths, which, and how long it took (:func:`warmed_up_line`).
    ``auto_block``: the drafters' replies run with the automatic block size, which measures
    their cost models first."""
    from app.engine.modes import drafter_mode
    from app.engine.warmup import warm_up

    drafters = [d for d in drafters if d is not None]
    extra = {"auto_block": True} if auto_block else {}  # warm_up's defaults otherwise
    if lookup:
        extra["lookup"] = True
    report = warm_up(target, drafters, every_drafter=True, **extra,
                     **_no_prebuild_if_sharded(target))
    paths = ["plain", *(drafter_mode(d).label for d in drafters)]
    if lookup:
        paths.append(Mode.LOOKUP.label)
    _warn(warmed_up_line(paths, report.seconds))


def warmed_up_line(paths: list[str], seconds: float) -> str:
    """``note: warmed up 3 paths (plain, DFlash, DFlash2) in 2.1 s before timing``; with
    two paths, ``both paths (plain, DFlash)``."""
    count = "both paths" if len(paths) == 2 else f"{len(paths)} paths"
    return f"note: warmed up {count} ({', '.join(paths)}) in {seconds:.1f} s before timing"


def keep_quantized_arg(args) -> bool | None:
    """``load_target``'s ``keep_quantized`` for parsed arguments: True with
    ``--keep-quantized``, else None (the loader decides)."""
    return True if getattr(args, "keep_quantized", False) else None


def drafter_problem(target, draft_model: str) -> str | None:
    """Why ``draft_model`` could not serve as ``target``'s DFlash drafter (config-level
    checks only, nothing is loaded), or None when it looks usable."""
    from app.models.catalog import check_pair_configs, is_drafter_config, read_config
    from app.models.loader import resolve_model_path

    try:
        config = read_config(resolve_model_path(draft_model))
        if not is_drafter_config(config) and "DFlash2DraftModel" not in (
                config.get("architectures") or []):
            return "it is not a DFlash drafter (its config does not name DFlashDraftModel)"
        check_pair_configs(dict(target.config), config)
    except EngineError as exc:
        return str(exc)
    return None


# ------------------------------------------------------------------------------ commands
def _guard(fn, args) -> int:
    try:
        return fn(args)
    except (EngineError, CommandError, ValueError) as exc:
        _warn(f"error: {exc}")
        return 2



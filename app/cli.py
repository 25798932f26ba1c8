"""Command line: ``python -m app [--gui] [COMMAND ...]``.

With no command the window opens; with no display to open it on (Linux without
``DISPLAY``/``WAYLAND_DISPLAY``, or ``QT_QPA_PLATFORM=offscreen``) one line says so and the
headless comparison runs instead (``compare`` on a default demo prompt).

The global options ``--data-dir``, ``--prefix-cache-mb`` and ``--version`` go before the
command or after it (also after a nested one, ``tools run``), with the same meaning; given in
both places, the one after the command wins (:func:`add_global_options`). ``--gui`` goes before
only. ``--prompt -`` (chat, compare) reads the message from standard input
(:func:`app.commands.generation.read_stdin_prompt`) before the command runs.

Commands register themselves through a ``register(subparsers)`` function in their module
(see ``COMMAND_MODULES``); each sets ``func`` to a callable ``(args) -> int`` exit code.
Exit codes: 0 ok, 2 bad arguments or unusable model files (message on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from app import APP_NAME, __version__
from app.commands.generation import (
    DEFAULT_PROMPT,
    STDIN_PROMPT,
    CommandError,
    int_at_least,
    read_stdin_prompt,
)

# Modules that add subcommands, in --help order.
COMMAND_MODULES = [
    "app.commands.chat",
    "app.commands.compare",
    "app.commands.tools",
    "app.commands.models",
    "app.commands.bench",
    "app.commands.serve",
]



def version_text() -> str:
    """App, MLX and mlx-lm versions, the MLX device and the BLAS in use (one per line)."""
    lines = [f"{APP_NAME} {__version__}"]
    try:
        import mlx.core as mx

        from app.engine.device import backend_problem, device_description

        lines.append(f"mlx {mx.__version__} (device: {device_description(mx)})")
        problem = backend_problem(mx)
        if problem:
            lines.append(f"warning: {problem}")
        from app.engine.kernels.row_products import describe

        kernels = describe()
        if kernels:
            lines.append(kernels)
        from app.engine.target import COMPILE_LAYERS_ENV, compiled_layers_on

        if compiled_layers_on():
            lines.append(f"target layers: mx.compile programs ({COMPILE_LAYERS_ENV}=1; exact)")
    except Exception as exc:  # pragma: no cover - shown, not raised
        lines.append(f"mlx unavailable: {exc}")
    try:
        from importlib.metadata import version

        lines.append(f"mlx-lm {version('mlx-lm')}")
    except Exception as exc:  # pragma: no cover
        lines.append(f"mlx-lm unavailable: {exc}")
    try:
        from app.engine.blas import blas_description

        lines.append(f"BLAS: {blas_description()}")
    except ImportError:
        pass
    return "\n".join(lines)


#: System libraries Qt's X11 (xcb) plugin needs beyond PySide6's wheel, with their Debian
#: packages; without them Qt aborts the process when it opens a window.
QT_XCB_LIBS = {"xcb-icccm": "libxcb-icccm4", "xcb-keysyms": "libxcb-keysyms1",
               "xcb-cursor": "libxcb-cursor0"}


def missing_x11_packages() -> list[str]:
    """Debian packages of :data:`QT_XCB_LIBS` whose libraries are not installed (Linux with
    an X11 display, where Qt will take its X11 plugin: ``QT_QPA_PLATFORM`` unset without a
    Wayland session, or naming ``xcb`` first; empty elsewhere)."""
    if not sys.platform.startswith("linux") or not os.environ.get("DISPLAY"):
        return []
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    if platform:
        if platform.split(";")[0].split(":")[0].strip() != "xcb":
            return []
    elif os.environ.get("WAYLAND_DISPLAY"):
        return []
    import ctypes.util

    return [pkg for lib, pkg in QT_XCB_LIBS.items() if ctypes.util.find_library(lib) is None]


def display_problem() -> str | None:
    """Why Qt could not open a window here, in a few words, or None when it can (or when
    that cannot be told). Linux only, where Qt aborts the process (SIGABRT) when its X11
    plugin finds no display: neither ``DISPLAY`` nor ``WAYLAND_DISPLAY`` set, or a
    ``DISPLAY`` whose X server does not answer (checked by connecting with libxcb, which
    Qt's X11 plugin loads anyway). A ``QT_QPA_PLATFORM`` the user set is trusted."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM") \
            or os.environ.get("WAYLAND_DISPLAY"):
        return None
    display = os.environ.get("DISPLAY")
    if not display:
        return "no display (DISPLAY and WAYLAND_DISPLAY are not set)"
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("xcb")
    if name is None:
        return None  # cannot tell: Qt will say
    try:
        xcb = ctypes.CDLL(name)
        xcb.xcb_connect.restype = ctypes.c_void_p
        xcb.xcb_connect.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        xcb.xcb_connection_has_error.argtypes = [ctypes.c_void_p]
        xcb.xcb_disconnect.argtypes = [ctypes.c_void_p]
        conn = xcb.xcb_connect(display.encode(), None)
        failed = xcb.xcb_connection_has_error(conn)
        xcb.xcb_disconnect(conn)
    except (OSError, AttributeError):
        return None
    return f"the X11 display {display} does not answer" if failed else None


def has_display() -> bool:
    """True when a Qt window can be shown on this machine (:func:`display_problem`)."""
    if os.environ.get("QT_QPA_PLATFORM", "").startswith(("offscreen", "minimal")):
        return False
    return display_problem() is None


SHORT_USAGE_LINES = 4
"""A subcommand's usage text longer than this many lines is shortened in error messages."""


class SubcommandParser(argparse.ArgumentParser):
    """A subcommand's parser: an argument it does not know is reported with the subcommand's
    own usage (``python -m app chat: error: unrecognized arguments: ...``), not the top-level
    one's. Nested subcommands (``tools run``) use it too."""

    def _get_option_tuples(self, option_string):
        """The options an abbreviation (``--pr``) may stand for: the command's own only, when
        any matches, so that the global options every command takes after it (``--prefix-
        cache-mb``, ``--data-dir``) do not make ``chat --pr`` or ``models --d`` ambiguous;
        an abbreviation only a global option matches (``chat --data X``) stays that one."""
        found = super()._get_option_tuples(option_string)
        own = [t for t in found if not getattr(t[0], "global_option", False)]
        return own or found

    def parse_known_args(self, args=None, namespace=None):
        """Parse like :meth:`argparse.ArgumentParser.parse_args`: no argument is left over."""
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def error(self, message: str):
        """Exit with status 2 after ``message``, under a short usage line when the full one
        would run past :data:`SHORT_USAGE_LINES` lines (the options are in ``--help``): a
        mistyped value is then seen, not scrolled away under thirty options."""
        usage = self.format_usage()
        if usage.count("\n") > SHORT_USAGE_LINES:
            words = [a.metavar or a.dest for a in self._actions
                     if not a.option_strings and a.dest != "command" and a.help != "==SUPPRESS=="]
            usage = (f"usage: {self.prog} [options] {' '.join(str(w) for w in words)}".rstrip()
                     + f"  ({self.prog} --help lists the options)\n")
        self.exit(2, f"{usage}{self.prog}: error: {message}\n")


def check_data_dir(path: str) -> str | None:
    """Make sure ``--data-dir`` is a usable folder, creating it when missing; the one-line
    problem otherwise (every subcommand gets the same check), or None when it is usable."""
    from app.paths import data_dir_problem

    return data_dir_problem(path, "--data-dir")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="python -m app",
        description=f"{APP_NAME}: chat with local MLX models, plain or with DFlash or "
        "DFlash2 speculative decoding.",
    )
    parser.add_argument("--gui", action="store_true", help="open the window even without a display")
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                parser_class=SubcommandParser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for command in _command_parsers(parser):
        add_global_options(command, after_command=True)
    return parser


def add_global_options(parser: argparse.ArgumentParser, after_command: bool = False) -> None:
    """The options every command takes, before the command (``python -m app --data-dir X
    chat``) or after it (``python -m app chat --data-dir X``, also after a nested command
    such as ``tools run``), with the same meaning; given in both places, the one after the
    command wins. ``--gui`` is the top level's only: it is about the window, which opens
    only without a command.

    After the command (``after_command``) an option not given leaves no attribute (argparse's
    ``SUPPRESS``), so that the command's parser does not overwrite the top level's value with
    its default; given, it overwrites it (argparse copies a command's values over the top
    level's)."""
    group = parser
    unset: dict = {}
    if after_command:
        group = parser.add_argument_group(
            "global options", "also taken before the command; given in both places, the one "
            "after the command wins")
        unset = {"default": argparse.SUPPRESS}
    actions = [
        group.add_argument("--version", action="store_true", help="print versions and exit",
                           **unset),
        group.add_argument(
            "--data-dir", **unset,
            help="folder for conversations, settings and logs (default: the platform's "
            "app-data folder)",
        ),
        group.add_argument(
            "--prefix-cache-mb", type=int_at_least(0), metavar="MB", **unset,
            help="memory for saved conversation states that new chats and chats you come back "
            "to reuse (default: a tenth of RAM, 256 to 2048 MiB; 0 keeps only the last "
            "reply's)",
        ),
    ]
    for action in actions:  # SubcommandParser: a command's own option wins an abbreviation
        action.global_option = True


def _command_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every command's parser under ``parser``, nested ones (``tools run``) included, each
    once (an alias names the same parser)."""
    found: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # by identity
                found += [child, *_command_parsers(child)]
    return found


def asks_version(argv: list[str]) -> bool:
    """Whether ``--version`` is among ``argv`` (before a bare ``--``, after which nothing is an
    option): it prints the versions wherever it stands, before any other argument is checked
    (``tools run --version`` has no tool name, ``models --download --version`` no repo)."""
    end = argv.index("--") if "--" in argv else len(argv)
    return "--version" in argv[:end]


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run; returns the process exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if asks_version(argv):
            print(version_text())
            return 0
        return _parse_and_run(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep Python's exit flush quiet
        return 0


def _stdin_prompt(args) -> str:
    """The message of ``--prompt -``: standard input's, or, on a rank of ``--distributed``
    that this app started here, the one rank 0 read (passed in a private file).

    Raises:
        CommandError: as :func:`read_stdin_prompt`, or on a rank of an ``mlx.launch`` the
            user started (its standard input is ``mlx.launch``'s pipe).
        ValueError: the passed file cannot be read.
    """
    if getattr(args, "distributed", None) and "MLX_RANK" in os.environ:
        from app.commands.distributed import read_prompt_file

        passed = read_prompt_file()
        if passed is None:
            raise CommandError("--prompt - cannot be read by a rank that mlx.launch "
                               "started: give --prompt TEXT, or run the command "
                               "without mlx.launch (it starts the ranks itself)")
        return passed
    return read_stdin_prompt(args.command)


def _parse_and_run(argv: list[str]) -> int:
    """:func:`main` past ``--version``: parse, check the global options, run the command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.data_dir is not None:
        if not args.data_dir.strip():  # `--data-dir "$UNSET"`: not the real app-data folder
            print("error: --data-dir is empty: give a folder", file=sys.stderr)
            return 2
        problem = check_data_dir(args.data_dir)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        os.environ["DFLASH_DATA_DIR"] = args.data_dir
    if args.prefix_cache_mb is not None:
        from app.engine.prefix import PREFIX_CACHE_ENV

        os.environ[PREFIX_CACHE_ENV] = str(args.prefix_cache_mb)
    if args.version:  # an abbreviation before the command (`--vers`)
        print(version_text())
        return 0
    if args.command is None:
        missing = missing_x11_packages()
        shown = has_display()
        if missing and shown:
            print(
                "Qt cannot open a window on this X11 display without "
                f"{', '.join(missing)} (install with: sudo apt install {' '.join(missing)}; "
                "`make run` does it when run as root): running the headless comparison instead."
            )
        elif args.gui or shown:
            problem = None if shown else display_problem()
            if problem:  # --gui: Qt would abort the process
                print(f"error: cannot open the window: {problem}. Start an X server or set "
                      "DISPLAY to one, or run a subcommand (python -m app --help).",
                      file=sys.stderr)
                return 2
            from app.ui.main import run_gui

            return run_gui(args)
        else:
            print(
                "No display available: running the headless comparison on the bundled demo "
                "pair instead (use --gui to force the window)."
            )
        print(f"Prompt: {DEFAULT_PROMPT}")
        args = parser.parse_args(["compare", "--prompt", DEFAULT_PROMPT, "--run-tools"])
    if getattr(args, "prompt", None) == STDIN_PROMPT:  # --prompt -
        try:
            args.prompt = _stdin_prompt(args)
        except (CommandError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        args.prompt_from_stdin = True  # --distributed passes it on to the other ranks
    return args.func(args)

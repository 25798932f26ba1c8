"""`python -m app` options as a command-line user gives them: the global options before or
after the command (the one after it wins), and ``--prompt -`` reading the message from
standard input (chat, compare; passed on to the other ranks of ``--distributed``)."""

from __future__ import annotations

import io

import pytest

from app.cli import build_parser, main


def _exit_code(capsys, argv):
    """(exit code, stdout, stderr) of ``main(argv)``, whether it returns or argparse exits."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def clean_env(monkeypatch):
    """``main`` exports --data-dir and --prefix-cache-mb to the environment: undone after."""
    from app.engine.prefix import PREFIX_CACHE_ENV

    monkeypatch.delenv("DFLASH_DATA_DIR", raising=False)
    monkeypatch.delenv(PREFIX_CACHE_ENV, raising=False)
    return monkeypatch


# ------------------------------------------------------------------------------ global options
COMMANDS = [["chat"], ["compare"], ["bench"], ["serve"], ["models"], ["tools"],
            ["tools", "run", "calculator"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_global_options_are_taken_after_the_command_too(command, tmp_path):
    """`chat --data-dir X` was refused ("unrecognized arguments") while `--data-dir X chat`
    ran: both mean the same now, on every command and after a nested one (`tools run`)."""
    parser = build_parser()
    before = parser.parse_args(["--data-dir", str(tmp_path), "--prefix-cache-mb", "64",
                                *command])
    after = parser.parse_args([*command, "--data-dir", str(tmp_path),
                               "--prefix-cache-mb", "64"])
    for args in (before, after):
        assert args.data_dir == str(tmp_path) and args.prefix_cache_mb == 64
        assert args.version is False and args.gui is False
    assert parser.parse_args([*command, "--version"]).version is True
    plain = parser.parse_args(command)  # not given anywhere: the top level's defaults
    assert plain.data_dir is None and plain.prefix_cache_mb is None and plain.version is False


def test_the_option_after_the_command_wins(tmp_path):
    parser = build_parser()
    args = parser.parse_args(["--data-dir", "first", "--prefix-cache-mb", "1", "chat",
                              "--data-dir", "second", "--prefix-cache-mb", "2"])
    assert args.data_dir == "second" and args.prefix_cache_mb == 2
    # one given after, the other only before: each keeps its own
    args = parser.parse_args(["--data-dir", "first", "tools", "--prefix-cache-mb", "2"])
    assert args.data_dir == "first" and args.prefix_cache_mb == 2
    args = parser.parse_args(["--data-dir", "first", "tools", "run", "calculator"])
    assert args.data_dir == "first"


def test_a_global_option_after_the_command_is_checked_and_used(capsys, tmp_path, clean_env):
    """The same data-folder check and the same environment for the command, wherever the
    option was given."""
    import os

    from app.engine.prefix import PREFIX_CACHE_ENV

    new = tmp_path / "a" / "b"
    assert main(["tools", "--data-dir", str(new), "--prefix-cache-mb", "0"]) == 0
    assert new.is_dir() and os.environ["DFLASH_DATA_DIR"] == str(new)
    assert os.environ[PREFIX_CACHE_ENV] == "0"
    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad = blocker / "data"
    code, _, err = _exit_code(capsys, ["chat", "--model", "/nonexistent/model",
                                       "--data-dir", str(bad)])
    assert code == 2
    assert err.strip() == f"error: --data-dir {bad} cannot be created: Not a directory"
    code, _, err = _exit_code(capsys, ["tools", "run", "calculator", "--prefix-cache-mb", "-1"])
    assert code == 2
    assert "python -m app tools run: error: argument --prefix-cache-mb: must be at least 0" in err


def test_version_after_the_command_prints_the_versions(capsys, monkeypatch):
    import app.cli as cli

    monkeypatch.setattr(cli, "version_text", lambda: "DFlash Chat 0.test")
    for argv in (["--version"], ["chat", "--version"], ["tools", "run", "x", "--version"]):
        code, out, _ = _exit_code(capsys, argv)
        assert code == 0 and out == "DFlash Chat 0.test\n", argv


def test_command_help_lists_the_global_options(capsys):
    with pytest.raises(SystemExit):
        main(["chat", "--help"])
    out = capsys.readouterr().out
    assert "--data-dir" in out and "--prefix-cache-mb" in out and "--version" in out


def test_gui_is_refused_after_a_command(capsys):
    """--gui opens the window, which only happens without a command: after one it is an
    unknown argument, said with the command's usage (not taken and ignored)."""
    code, _, err = _exit_code(capsys, ["tools", "--gui"])
    assert code == 2
    assert "python -m app tools: error: unrecognized arguments: --gui" in err


# ------------------------------------------------------------------------------ --prompt -
def _stdin(data: bytes, tty: bool = False) -> io.TextIOWrapper:
    """A standard input holding ``data`` (as a pipe gives it, or a terminal)."""

    class Buffer(io.BytesIO):
        def isatty(self):
            return tty

    return io.TextIOWrapper(Buffer(data), encoding="utf-8")


@pytest.fixture
def seen(monkeypatch):
    """The parsed arguments chat and compare ran with (nothing loaded: the commands' own
    functions are replaced)."""
    import app.commands.chat as chat_cmd
    import app.commands.compare as compare_cmd

    got = []

    def spy(args):
        got.append(args)
        return 0

    monkeypatch.setattr(chat_cmd, "run_chat", spy)
    monkeypatch.setattr(compare_cmd, "run_compare", spy)
    return got


@pytest.mark.parametrize("command", ["chat", "compare"])
def test_prompt_dash_reads_the_message_from_stdin(capsys, monkeypatch, seen, command):
    """`echo ... | python -m app chat --prompt -`: standard input to its end, as UTF-8, the
    trailing line ends dropped (as `$(cat)` drops them), the rest kept."""
    monkeypatch.setattr("sys.stdin", _stdin("  Tokyo 東京\r\n\nand Paris?\n\n".encode()))
    code, _, err = _exit_code(capsys, [command, "--prompt", "-"])
    assert code == 0, err
    assert seen[-1].prompt == "  Tokyo 東京\n\nand Paris?"
    assert err == ""  # a pipe: nothing said


def test_prompt_dash_from_a_terminal_says_how_to_end_it(capsys, monkeypatch, seen):
    monkeypatch.setattr("sys.stdin", _stdin(b"typed in\n", tty=True))
    code, _, err = _exit_code(capsys, ["chat", "--prompt", "-"])
    assert code == 0 and seen[-1].prompt == "typed in"
    assert "reading the message from the terminal" in err and "Ctrl+D" in err


@pytest.mark.parametrize("data", [b"", b"\n", b"  \n\t\n"])
@pytest.mark.parametrize("command", ["chat", "compare"])
def test_prompt_dash_with_nothing_on_stdin_is_one_line_and_exit_2(capsys, monkeypatch, seen,
                                                                   command, data):
    monkeypatch.setattr("sys.stdin", _stdin(data))
    code, out, err = _exit_code(capsys, [command, "--prompt", "-"])
    assert code == 2 and not seen and out == ""
    assert err.startswith("error: --prompt -: standard input held no text to reply to")
    assert f"| python -m app {command} --prompt -" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_prompt_dash_refuses_stdin_that_is_not_utf8(capsys, monkeypatch, seen):
    monkeypatch.setattr("sys.stdin", _stdin(b"caf\xe9 au lait"))
    code, _, err = _exit_code(capsys, ["chat", "--prompt", "-"])
    assert code == 2 and not seen
    assert err.strip() == ("error: --prompt -: standard input is not valid UTF-8 text: the "
                           "byte 0xe9 at byte 4 cannot be decoded")


def test_prompt_dash_without_a_stdin_is_said(capsys, monkeypatch, seen):
    monkeypatch.setattr("sys.stdin", None)
    code, _, err = _exit_code(capsys, ["compare", "--prompt", "-"])
    assert code == 2 and not seen
    assert err.strip() == "error: --prompt -: there is no standard input to read it from"


def test_prompt_dash_through_a_shell_pipe():
    """`printf ... | python -m app chat --prompt - ...` as a shell runs it: an empty pipe is
    one line and exit 2 before any model is looked at; a message is read and the command
    goes on (here to its missing model)."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "app", "chat", "--prompt", "-", "--mode", "plain",
            "--model", "/nonexistent/model"]
    res = subprocess.run(argv, input=b"", capture_output=True, timeout=120)
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 2 and err.startswith("error: --prompt -: standard input held no")
    res = subprocess.run(argv, input="Hello 🙂\n".encode(), capture_output=True, timeout=120)
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 2 and "prompt" not in err and "/nonexistent/model" in err


def test_a_prompt_from_stdin_reaches_the_other_ranks(monkeypatch, tmp_path, capsys, seen):
    """--distributed starts the other ranks with the same command line; they cannot read
    this process's standard input. Ranks started here read the message from a private file
    in the data folder (a long message as one argv entry failed with "Argument list too
    long", and showed in `ps`); ranks on other hosts get it as a last ``--prompt=TEXT``."""
    import os
    import stat

    import app.commands.distributed as dist

    class Args:
        prompt = "line one\n--line two"
        prompt_from_stdin = True

    argv = ["chat", "--prompt", "-", "--distributed", "hosts.json"]
    monkeypatch.setattr("sys.argv", ["app", *argv])
    assert dist.rank_argv(Args()) == [*argv, "--prompt=line one\n--line two"]
    # and the parser reads it back as the message, whatever it starts with
    assert build_parser().parse_args(dist.rank_argv(Args())).prompt == "line one\n--line two"
    Args.prompt_from_stdin = False
    assert dist.rank_argv(Args()) == argv
    # the ranks started here get it in a file
    started = []

    class Child:
        def __init__(self, cmd, **kw):
            started.append((cmd, kw["env"]))

        def wait(self, timeout=None):
            return 0

    reaps = []
    monkeypatch.setattr(dist.subprocess, "Popen", Child)
    monkeypatch.setattr(dist.atexit, "register", reaps.append)
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path / "data"))
    for name in ("MLX_HOSTFILE", "MLX_RANK", dist.PROMPT_FILE_ENV):
        monkeypatch.setenv(name, "x")  # _spawn_local sets the first two: undone after
        monkeypatch.delenv(name)
    Args.prompt_from_stdin = True
    Args.prompt = "long " * 60_000  # 300 KB: over Linux's 128 KiB for one argument
    dist._spawn_local(2, Args())
    (cmd, env), = started
    assert cmd[3:] == argv  # [python, -m, app, ...]: no message on the command line
    path = env[dist.PROMPT_FILE_ENV]
    assert os.path.dirname(path) == str(tmp_path / "data")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # a rank reads it
    monkeypatch.setenv("MLX_RANK", "1")
    monkeypatch.setenv(dist.PROMPT_FILE_ENV, path)
    code, _, err = _exit_code(capsys, argv)
    assert code == 0, err
    assert seen[-1].prompt == Args.prompt
    for reap in reaps:
        reap()
    assert not os.path.exists(path)


def test_a_long_prompt_from_stdin_for_other_hosts_is_refused(monkeypatch):
    """Ranks on other hosts get the message on mlx.launch's command line: past what one
    argument may hold it is one clear line (exit 2 by the commands' guard), not an OSError."""
    import app.commands.distributed as dist

    class Args:
        prompt = "x" * 200_000
        prompt_from_stdin = True

    monkeypatch.setattr("sys.argv", ["app", "chat", "--prompt", "-"])
    with pytest.raises(dist.CommandError) as info:
        dist.rank_argv(Args())
    msg = str(info.value)
    assert "\n" not in msg and "200000 bytes" in msg and "--distributed" in msg


def test_prompt_dash_is_refused_on_a_rank_that_mlx_launch_started(capsys, monkeypatch, seen,
                                                                   tmp_path):
    """Under an mlx.launch the user started, standard input is mlx.launch's pipe, not the
    user's: said at once rather than waited on."""
    monkeypatch.setenv("MLX_RANK", "0")
    monkeypatch.setattr("sys.stdin", _stdin(b"never read"))
    code, _, err = _exit_code(capsys, ["chat", "--prompt", "-", "--distributed",
                                       str(tmp_path / "hosts.json")])
    assert code == 2 and not seen
    assert err.strip().startswith("error: --prompt - cannot be read by a rank that mlx.launch "
                                  "started: give --prompt TEXT")
    assert main(["chat", "--prompt", "-"]) == 0 and seen[-1].prompt == "never read"


# ------------------------------------------------------------------------------ tester's faults
@pytest.mark.parametrize("argv", [
    ["--data-dir", "", "tools"],
    ["tools", "--data-dir", ""],
    ["tools", "--data-dir="],
    ["tools", "--data-dir", "   "],
    ["--data-dir", "REAL", "tools", "--data-dir="],
])
def test_an_empty_data_dir_is_refused(capsys, clean_env, tmp_path, argv):
    """`--data-dir "$UNSET"` used the real app-data folder, even over one given before the
    command: one line and exit 2 now."""
    import os

    argv = [str(tmp_path / "real") if a == "REAL" else a for a in argv]
    code, out, err = _exit_code(capsys, argv)
    assert code == 2 and out == ""
    assert err.strip() == "error: --data-dir is empty: give a folder"
    assert "DFLASH_DATA_DIR" not in os.environ


@pytest.mark.parametrize("argv, dest, value", [
    (["chat", "--pr", "hi"], "prompt", "hi"),
    (["compare", "--pr", "hi"], "prompt", "hi"),
    (["models", "--p"], "probe", []),
    (["models", "--d", "org/repo"], "download", ["org/repo"]),
    (["chat", "--data", "D"], "data_dir", "D"),  # only a global option matches: taken
])
def test_a_command_option_keeps_its_abbreviation(argv, dest, value):
    """The global options after the command made `chat --pr`, `models --p` and `models --d`
    ambiguous: a command's own option wins an abbreviation now."""
    assert getattr(build_parser().parse_args(argv), dest) == value


def test_version_into_a_closed_pipe_is_quiet(monkeypatch):
    """`python -m app --version | head -1` ended with a BrokenPipeError traceback."""
    import subprocess
    import sys

    cmd = (f"{sys.executable} -m app --version | head -c 1 >/dev/null; "
           "echo rc=${PIPESTATUS[0]}")
    monkeypatch.setattr("app.cli.version_text", lambda: "x" * 100)

    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("sys.stdout", Closed())
    assert main(["--version"]) == 0
    monkeypatch.undo()
    res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in res.stderr and res.stdout.strip() == "rc=0", res.stderr


def test_version_after_tools_run_without_a_name(capsys, monkeypatch):
    import app.cli as cli

    monkeypatch.setattr(cli, "version_text", lambda: "DFlash Chat 0.test")
    for argv in (["tools", "run", "--version"], ["tools", "--version"],
                 ["models", "--download", "--version"]):
        code, out, err = _exit_code(capsys, argv)
        assert code == 0 and out == "DFlash Chat 0.test\n", (argv, err)
    # after a bare `--` it is no option
    code, out, _ = _exit_code(capsys, ["tools", "run", "--", "--version"])
    assert out == "" or "DFlash Chat 0.test" not in out

"""`python -m app` options as a command-line user gives them: the global options before or
after the command (the one after it wins)."""

from __future__ import annotations

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

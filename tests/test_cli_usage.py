"""`python -m app` usage errors a new user meets: the data folder checked once for every
command, empty prompts refused, unknown arguments shown with the subcommand's own usage,
tool timeouts above 0, and --help lines that name DFlash2 where it runs."""

from __future__ import annotations

import pytest

from app.cli import build_parser, main


def _exit_code(capsys, argv):
    """(exit code, stderr) of ``main(argv)``, whether it returns or argparse exits."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


# ------------------------------------------------------------------------------ --data-dir
def test_data_dir_that_cannot_be_created_is_one_line_for_models(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad = blocker / "data"  # under a file: the folder can never be made
    code, err = _exit_code(capsys, ["--data-dir", str(bad), "models", "--add-folder",
                                    str(tmp_path)])
    assert code == 2
    assert err.strip() == f"error: --data-dir {bad} cannot be created: Not a directory"
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["tools"], ["models", "--json"],
                                  ["chat", "--model", "/nonexistent/model"]])
def test_every_command_checks_the_data_dir_the_same_way(capsys, tmp_path, argv):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, err = _exit_code(capsys, ["--data-dir", str(blocker / "data"), *argv])
    assert code == 2 and "cannot be created" in err and len(err.strip().splitlines()) == 1


def test_a_new_data_dir_is_created(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("DFLASH_DATA_DIR", raising=False)
    new = tmp_path / "a" / "b"
    assert main(["--data-dir", str(new), "tools"]) == 0
    assert new.is_dir()


def test_models_says_in_one_line_when_the_folder_list_cannot_be_saved(capsys, tmp_path,
                                                                      monkeypatch):
    # no --data-dir: the app-data folder from the environment is unusable
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("DFLASH_DATA_DIR", str(blocker / "data"))
    from app.paths import demo_pair_dirs

    model = demo_pair_dirs()[1]  # a model folder the catalog accepts
    if not (model / "config.json").is_file():
        pytest.skip("the bundled demo pair is not in this checkout")
    code, err = _exit_code(capsys, ["models", "--add-folder", str(model)])
    assert code == 2 and "Traceback" not in err
    assert err.strip().startswith(f"error: cannot save the folder list in {blocker / 'data'}")


# ------------------------------------------------------------------------------ prompts
@pytest.mark.parametrize("command", ["chat", "compare"])
@pytest.mark.parametrize("prompt", ["", "   ", "\n\t"])
def test_empty_prompt_is_refused(capsys, command, prompt):
    # a missing model would also exit 2, but later and with another message
    with pytest.raises(SystemExit) as exc:
        main([command, "--prompt", prompt, "--model", "/nonexistent/model"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"python -m app {command}: error: argument --prompt: the message is empty" in err


NOT_UTF8 = b"\xff caf\xe9".decode("utf-8", "surrogateescape")
"""``$'\\xff caf\\xe9'`` as Python decodes it from the command line: lone surrogates."""


@pytest.mark.parametrize("command", ["chat", "compare"])
@pytest.mark.parametrize("option", ["--prompt", "--system-prompt", "--stop", "--tool-parser"])
def test_text_that_is_not_utf8_is_refused_where_it_is_parsed(capsys, command, option):
    """A non-UTF-8 argument crashed after the model loaded, with the tokenizer's
    ``TypeError: TextEncodeInput must be Union[...]`` and a traceback."""
    with pytest.raises(SystemExit) as exc:
        main([command, option, NOT_UTF8, "--model", "/nonexistent/model"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"python -m app {command}: error: argument {option}: not valid UTF-8 text: the " \
        "byte 0xff at character 1 cannot be decoded" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2  # usage, error


def test_a_non_utf8_prompt_exits_2_from_the_shell():
    """``python -m app chat --prompt $'\\xff caf\\xe9'`` as a shell runs it (bytes in argv)."""
    import os
    import subprocess
    import sys

    for command in ("chat", "compare"):
        res = subprocess.run([sys.executable, "-m", "app", command, "--prompt",
                              b"\xff caf\xe9"], capture_output=True, timeout=120,
                             env={**os.environ, "PYTHONUTF8": "1"})
        err = res.stderr.decode("utf-8", "replace")
        assert res.returncode == 2, err
        assert "error: argument --prompt: not valid UTF-8 text" in err
        assert "Traceback" not in err


def test_tool_arguments_that_are_not_utf8_are_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["tools", "run", "calculator", "--args", '{"expression": "1+' + NOT_UTF8 + '"}'])
    assert exc.value.code == 2
    assert "argument --args: not valid UTF-8 text" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["chat", "compare"])
def test_a_tool_file_with_text_that_is_not_utf8_exits_2_in_one_line(capsys, tiny_root,
                                                                    tmp_path, command):
    """A ``\\ud800`` escape in a --tools file reached the tokenizer, whose TypeError was a
    traceback; the chat template's check names the field (exit code 2)."""
    from app.models.tiny import build_tiny_pair

    target, drafter = build_tiny_pair(tiny_root, "qwen3_5", seed=0, block_size=16)
    tools = tmp_path / "tools.json"
    tools.write_text('[{"name": "f", "description": "bad \\ud800 text", '
                     '"parameters": {"type": "object", "properties": {}}}]')
    code, err = _exit_code(capsys, [command, "--model", str(target), "--draft-model",
                                    str(drafter), "--prompt", "hi", "--max-tokens", "2",
                                    "--tools", str(tools)])
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "error: tools[0].function.description is not valid UTF-8 text: it holds a lone "
        "surrogate (U+D800) at character 5")


def test_utf8_text_takes_any_valid_text():
    from app.commands.generation import prompt_text, utf8_text

    for text in ("naïve café 東京 🙂", "", "\t"):
        assert utf8_text(text) == text
    assert prompt_text("hi 🙂") == "hi 🙂"


# ------------------------------------------------------------------------------ unknown arguments
@pytest.mark.parametrize("argv, prog", [(["chat", "--bogus"], "python -m app chat"),
                                        (["compare", "--bogus"], "python -m app compare"),
                                        (["tools", "run", "calculator", "--bogus"],
                                         "python -m app tools run"),
                                        (["serve", "--bogus"], "python -m app serve")])
def test_unknown_argument_shows_the_subcommands_usage(capsys, argv, prog):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {prog} ")
    assert f"{prog}: error: unrecognized arguments: --bogus" in err


@pytest.mark.parametrize("command", ["chat", "compare", "bench"])
def test_a_bad_value_is_said_under_a_short_usage_line(capsys, command):
    """A command with many options names the mistake two lines down, not under its whole
    usage text; a short usage (``tools run``) is still shown whole."""
    with pytest.raises(SystemExit) as exc:
        main([command, "--max-tokens", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.splitlines()
    prog = f"python -m app {command}"
    assert err == [f"usage: {prog} [options]  ({prog} --help lists the options)",
                   f"{prog}: error: argument --max-tokens: must be at least 1, got 0"]
    with pytest.raises(SystemExit):
        main(["tools", "run"])
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m app tools run [-h] [--args JSON]") and " name" in err


@pytest.mark.parametrize("command", ["compare", "bench", "serve"])
def test_mode_on_a_command_without_it_is_not_taken_for_model(capsys, command):
    """`compare --mode plain` (chat's option, on a command that runs every mode or takes it
    per request) was read as an abbreviation of ``--model``: "error: DFlash needs
    --draft-model with --model", about a model named "plain". It is now refused as itself,
    under the command's usage, before anything is loaded."""
    code, err = _exit_code(capsys, [command, "--mode", "plain"])
    assert code == 2 and "Traceback" not in err
    prog = f"python -m app {command}"
    assert f"{prog}: error: argument --mode: {command} has no --mode" in err
    assert "--draft-model" not in err and "no model folder" not in err


@pytest.mark.parametrize("value, said", [("0", "block sizes must be at least 1, got 0"),
                                         ("8,-2", "block sizes must be at least 1, got -2"),
                                         (",", "give at least one block size")])
def test_bench_block_sizes_are_checked(capsys, value, said):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--block-sizes", value])
    assert exc.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("mode, said", [("lookup", True), ("plain", True), ("dflash", False),
                                        ("dflash2", False)])
def test_auto_block_without_a_drafter_mode_is_said(mode, said):
    from app.commands.generation import auto_block_note

    note = auto_block_note("auto", mode)
    assert (note is not None) == said
    if said:
        assert note.startswith(f"note: --block-size auto has no effect in {mode} mode")
        assert ("lookup drafts" in note) == (mode == "lookup")
    assert auto_block_note(8, mode) is None and auto_block_note(None, mode) is None


# ------------------------------------------------------------------------------ tools run
@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf", "soon"])
def test_tool_timeout_must_be_above_zero(capsys, timeout):
    with pytest.raises(SystemExit) as exc:
        main(["tools", "run", "calculator", "--timeout", timeout])
    assert exc.value.code == 2
    assert "argument --timeout" in capsys.readouterr().err


@pytest.mark.parametrize("timeout", ["1e20", "1e300"])
def test_a_tool_timeout_too_large_to_wait_for_is_refused(capsys, timeout):
    """`--timeout 1e20` was accepted, and the tool then "failed" with the thread library's
    "OverflowError: timestamp out of range for platform time_t"."""
    with pytest.raises(SystemExit) as exc:
        main(["tools", "run", "calculator", "--timeout", timeout, "--args",
              '{"expression": "1+1"}'])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --timeout: must be a number of seconds above 0 and at most" in err


def test_tool_timeout_above_zero_runs(capsys):
    assert main(["tools", "run", "calculator", "--timeout", "2.5", "--args",
                 '{"expression": "17*23"}']) == 0
    assert '"result": 391' in capsys.readouterr().out


# ------------------------------------------------------------------------------ --help
def test_help_lines_name_dflash2(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("    ")}
    assert "DFlash2" in lines["chat"] and "DFlash2" in lines["compare"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compare", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "'none' leaves it out" in out and "plain and DFlash only" in out


def test_no_display_gives_one_line_instead_of_a_qt_abort(monkeypatch, capsys):
    """A new user's `python -m app --gui` without a display, and a start with a stale
    DISPLAY: Qt aborted the process (exit 134) with misleading advice about xcb-cursor. The
    window is not tried then: --gui says why in one line (exit 2), and the display counts as
    none (``has_display``), so a plain start takes the headless comparison."""
    import ctypes.util

    from app import cli

    if not cli.sys.platform.startswith("linux"):
        pytest.skip("Linux's X11 check")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("DISPLAY", raising=False)
    assert "no display" in cli.display_problem()
    assert cli.main(["--gui"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot open the window: no display") and err.count("\n") == 1
    if ctypes.util.find_library("xcb") is None:
        pytest.skip("no libxcb to check a display with")
    monkeypatch.setenv("DISPLAY", ":87")  # no X server there
    assert "does not answer" in cli.display_problem() and not cli.has_display()
    assert cli.main(["--gui"]) == 2
    assert "the X11 display :87 does not answer" in capsys.readouterr().err


def test_temperature_has_the_windows_range(capsys):
    """A new user's pass: `chat --temp 5` ran (the CLI took 0 to 10) while Settings and
    import take 0 to 2. The CLI now takes the same range."""
    from app.chat.settings import RANGES

    assert RANGES["temperature"] == (0.0, 2.0)
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["chat", "--temp", "5"])
    assert exc.value.code == 2
    assert "--temp: must be between 0 and 2, got 5" in capsys.readouterr().err
    assert build_parser().parse_args(["chat", "--temp", "2"]).temp == 2.0


@pytest.mark.parametrize("command", ["chat", "compare"])
@pytest.mark.parametrize("seed, said", [("-1", "must be at least 0, got -1"),
                                        ("99999999999999999999", "must be between 0 and "
                                         "2147483647, got 99999999999999999999"),
                                        ("abc", "expected a whole number, got 'abc'")])
def test_seed_range_is_said_once_and_the_same_way(capsys, command, seed, said):
    """`--seed -1` said "seed must be at least 0 (None: not seeded)" while `--seed 1e20`-like
    values said "it must be between -1 and 2147483647" (the window's table, where -1 means
    unseeded): two ranges for one option. It is now checked where it is parsed, as
    --max-tokens and --temp are."""
    code, err = _exit_code(capsys, [command, "--seed", seed])
    assert code == 2
    assert f"python -m app {command}: error: argument --seed: {said}" in err


# ------------------------------------------------------------------------------ serve
def test_serve_with_a_missing_model_is_one_line_and_exit_2(capsys, tmp_path):
    code, err = _exit_code(capsys, ["serve", "--port", "0", "--model",
                                    str(tmp_path / "no-such-model")])
    assert code == 2 and "Traceback" not in err
    assert err.startswith("error: ") and "no-such-model" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, words", [(["--port", "-1"], "must be at least 0"),
                                         (["--max-queue", "0"], "must be at least 1"),
                                         (["--log-level", "loud"], "invalid choice")])
def test_serve_arguments_are_checked(capsys, argv, words):
    with pytest.raises(SystemExit) as exc:
        main(["serve", *argv])
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("port", ["65536", "70000", "4294967296"])
def test_serve_refuses_a_port_above_65535(capsys, port):
    """``serve --port 70000`` listened on 4464 (70000 - 65536) without a word. (Parsed
    only: a port taken would start a server.)"""
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["serve", "--port", port])
    assert exc.value.code == 2
    assert f"argument --port: must be between 0 and 65535, got {port} (a TCP port; 0 picks " \
        "a free one)" in capsys.readouterr().err
    assert build_parser().parse_args(["serve", "--port", "65535"]).port == 65535
    assert build_parser().parse_args(["serve", "--port", "0"]).port == 0


def test_bind_socket_refuses_a_port_out_of_range():
    from app.serve.server import ServeConfigError, bind_socket

    for port in (70000, -1):
        with pytest.raises(ServeConfigError, match="a TCP port is 0 to 65535"):
            bind_socket("127.0.0.1", port)


def test_serve_refuses_text_arguments_that_are_not_utf8(capsys, monkeypatch):
    for option in ("--api-key", "--host"):
        with pytest.raises(SystemExit) as exc:  # parsed only: a key taken would serve
            build_parser().parse_args(["serve", option, NOT_UTF8])
        assert exc.value.code == 2
        assert f"argument {option}: not valid UTF-8 text" in capsys.readouterr().err
    monkeypatch.setenv("DFLASH_API_KEY", NOT_UTF8)  # os.environ decodes bytes the same way
    code, err = _exit_code(capsys, ["serve", "--port", "0", "--model", "/nowhere"])
    assert code == 2 and err.startswith("error: $DFLASH_API_KEY is not valid UTF-8 text")
    assert len(err.strip().splitlines()) == 1


def test_serve_on_a_busy_port_says_so_before_loading(capsys):
    import socket

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        port = busy.getsockname()[1]
        code, err = _exit_code(capsys, ["serve", "--port", str(port), "--model", "/nowhere"])
    finally:
        busy.close()
    # the model (missing here) is not even looked at: the address comes first
    assert code == 2 and err.strip() == f"error: cannot listen on 127.0.0.1:{port}: the port " \
        "is in use"


def test_the_other_commands_work_without_the_servers_packages():
    """Only ``serve`` needs Starlette and uvicorn: the parser and every other command load
    without them (a GPU host given MLX alone runs ``python -m app compare``)."""
    import subprocess
    import sys

    code = ("import builtins, sys\n"
            "real = builtins.__import__\n"
            "def imp(name, *a, **k):\n"
            "    if name.split('.')[0] in ('uvicorn', 'starlette'):\n"
            "        raise ImportError('no ' + name)\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = imp\n"
            "from app.cli import main\n"
            "sys.exit(main(['chat', '--help']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--mode" in done.stdout


@pytest.mark.parametrize("command", ["chat", "compare", "bench"])
@pytest.mark.parametrize("option", [["--layer-split", "1,2"], ["--network-timeout", "-1"]])
def test_distributed_options_without_distributed_are_refused(capsys, tmp_path, monkeypatch,
                                                             command, option):
    """They were taken and ignored (a run went on with rc 0); now one line, exit 2, before
    a model loads."""
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path / "data"))
    code, err = _exit_code(capsys, [command, *option, "--max-tokens", "4"])
    assert code == 2
    assert f"{option[0]} is used only with --distributed HOSTFILE" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("grace", ["nan", "inf", "-1"])
def test_serve_grace_is_a_finite_number_of_seconds(capsys, grace):
    """``--grace nan`` and ``--grace inf`` were taken ("the nan s grace is over")."""
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["serve", "--grace", grace])
    assert exc.value.code == 2
    assert f"argument --grace: must be a number of seconds, 0 or more, got {grace}" in \
        capsys.readouterr().err
    assert build_parser().parse_args(["serve", "--grace", "2.5"]).grace == 2.5


def test_serve_with_an_empty_host_says_so(capsys):
    """``--host ""`` said "--host  would accept requests from other machines"."""
    code, err = _exit_code(capsys, ["serve", "--host", "", "--port", "0", "--model",
                                    "/nowhere"])
    assert code == 2
    assert err.strip() == "error: --host is empty: give the address to listen on (default " \
        "127.0.0.1)"


def test_serve_api_key_is_stripped_and_never_blank(capsys, monkeypatch):
    """``DFLASH_API_KEY='abc '`` started a server that refused every request (the client's
    token is stripped, the key was not); ``--api-key " "`` started one no client could use."""
    from app.commands.serve import API_KEY_ENV, api_key_of

    monkeypatch.setenv(API_KEY_ENV, "abc \n")
    assert api_key_of(None) == "abc"
    assert api_key_of(" sesame ") == "sesame"
    monkeypatch.delenv(API_KEY_ENV)
    assert api_key_of(None) is None
    code, err = _exit_code(capsys, ["serve", "--api-key", "  ", "--port", "0", "--model",
                                    "/nowhere"])
    assert code == 2 and err.strip() == "error: --api-key is blank: give a key, or leave the " \
        "option out for none"
    code, err = _exit_code(capsys, ["serve", "--api-key", "two words", "--port", "0",
                                    "--model", "/nowhere"])
    assert code == 2 and "--api-key holds a space" in err


def test_serve_names_the_bundled_target_with_its_drafters():
    """``serve --model resources/models/demo-target`` served plain and lookup only, while the
    help says the bundled target gets its drafter by default."""
    from app.commands.serve import serve_pair
    from app.paths import bundled_pair

    pair = bundled_pair()
    if pair is None or pair[2] is None:
        pytest.skip("the bundled demo pair is not in this checkout")
    target, drafter, drafter2 = (str(p) for p in pair)
    args = build_parser().parse_args(["serve", "--model", target])
    assert serve_pair(args) == (target, drafter, drafter2)
    args = build_parser().parse_args(["serve", "--model", target, "--dflash2-model", "none"])
    assert serve_pair(args) == (target, drafter, None)
    args = build_parser().parse_args(["serve"])
    assert serve_pair(args) == (target, drafter, drafter2)


# ------------------------------------------------------------------------------ models folders
def test_models_remove_folder_says_what_it_removed_and_a_gone_folder_how_to(
        capsys, tmp_path, monkeypatch):
    """`--remove-folder` printed nothing on success; a deleted added folder was listed as
    skipped with no hint of how to forget it."""
    import json

    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DFLASH_RESOURCES", str(tmp_path / "no-resources"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    gone = tmp_path / "gone"
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "model_folders.json").write_text(json.dumps({"folders": [str(gone)]}))
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith(f"skipped {gone}"))
    assert line == (f"skipped {gone}: folder no longer exists (python -m app models "
                    f"--remove-folder {gone} forgets it)")
    assert main(["models", "--remove-folder", str(gone)]) == 0
    captured = capsys.readouterr()
    assert f"removed {gone} from the folder list" in captured.err
    assert f"skipped {gone}" not in captured.out


@pytest.mark.parametrize("command", ["chat", "models", "tools"])
def test_readme_usage_lines_name_every_option_of_the_command(command):
    """README's `python -m app chat ...` usage omitted --keep-quantized, which --help lists."""
    import re
    from pathlib import Path

    from app.cli import _command_parsers

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = readme.split("python -m app [--data-dir DIR]", 1)[1].split("```", 1)[0]
    start = block.index(f"python -m app {command} ")
    nxt = re.search(r"^python -m app ", block[start + 1:], re.M)
    usage = block[start:start + 1 + nxt.start()] if nxt else block[start:]
    parser = next(p for p in _command_parsers(build_parser())
                  if p.prog == f"python -m app {command}")
    options = {s for a in parser._actions for s in a.option_strings
               if s.startswith("--") and s != "--help" and not getattr(a, "global_option", False)}
    missing = sorted(o for o in options if not re.search(re.escape(o) + r"(?![\w-])", usage))
    assert not missing, f"README's {command} usage lacks {missing}"

"""`python -m app chat` / `compare` on the tiny random pair: the JSON contract, both modes
identical, error exits, the tiny fallback, --run-tools rounds and the near-tie helper."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from engine_fixtures import FakeCancel
from test_engine_exact import expect_float32_difference_on_cuda

from app.chat import reply as reply_mod
from app.cli import main
from app.engine.compare import first_divergence, near_tie
from app.engine.events import CycleEvent, Done, Summary, TokenEvent

CHAT_FIELDS = {"mode", "block_size", "rollback", "tokens", "text", "summary", "content",
               "reasoning", "tool_calls", "finish_reason"}


@pytest.fixture(scope="module")
def pair_paths(tiny_root):
    from app.models.tiny import build_tiny_pair

    return build_tiny_pair(tiny_root, "qwen3_5", seed=0, block_size=16)


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def pair_args(pair_paths):
    return ["--model", str(pair_paths[0]), "--draft-model", str(pair_paths[1])]


def test_chat_json_identical_in_both_modes(capsys, pair_paths, request):
    expect_float32_difference_on_cuda(request, mx.float32, 16)  # the tiny float32 pair
    objs = {}
    for mode in ("plain", "dflash"):
        code, out, err = run_cli(capsys, "chat", *pair_args(pair_paths), "--mode", mode,
                                 "--prompt", "Name a capital.", "--max-tokens", "24",
                                 "--tools", "none", "--json")
        assert code == 0, err
        objs[mode] = json.loads(out)
        assert CHAT_FIELDS <= set(objs[mode])
    p, d = objs["plain"], objs["dflash"]
    assert p["mode"] == "plain" and d["mode"] == "dflash"
    assert p["block_size"] is None and d["block_size"] == 16
    for key in ("tokens", "text", "content", "reasoning", "tool_calls", "finish_reason"):
        assert p[key] == d[key], key
    assert len(p["tokens"]) == p["summary"]["generated_tokens"] > 0
    assert d["summary"]["cycles"] > 0 and d["summary"]["mode"] == "dflash"
    assert "rounds" not in p


def test_compare_json_identical_with_replays(capsys, pair_paths):
    code, out, err = run_cli(capsys, "compare", *pair_args(pair_paths), "--prompt", "Hello",
                             "--max-tokens", "32", "--tools", "none", "--block-size", "4",
                             "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert set(obj) == {"plain", "dflash", "identical", "first_divergence", "near_tie",
                        "sampled", "repeats", "speedup", "repeats_identical"}
    assert obj["identical"] is True and obj["first_divergence"] is None
    assert obj["near_tie"] is None
    assert obj["plain"]["tokens"] == obj["dflash"]["tokens"]
    assert obj["dflash"]["block_size"] == 4 and obj["dflash"]["summary"]["replays"] > 0
    assert obj["dflash"]["summary"]["fast_verify"] is False  # exact by default


def test_prompt_from_stdin_is_the_same_message_as_given_inline(capsys, pair_paths,
                                                               monkeypatch):
    """`echo 'Name a capital.' | python -m app chat --prompt -` replies as `--prompt 'Name a
    capital.'` does (the pipe's line end dropped)."""
    import io

    argv = ["chat", *pair_args(pair_paths), "--mode", "plain", "--max-tokens", "8",
            "--tools", "none", "--json"]
    code, out, err = run_cli(capsys, *argv, "--prompt", "Name a capital.")
    assert code == 0, err
    inline = json.loads(out)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"Name a capital.\n")))
    code, out, err = run_cli(capsys, *argv, "--prompt", "-")
    assert code == 0, err
    assert json.loads(out)["tokens"] == inline["tokens"]


def test_compare_repeats_rotate_the_sides_and_give_paired_and_pooled_speedups(
        capsys, pair_paths, monkeypatch):
    """--repeats 3: each side runs 3 times after both paths were warmed up, the order
    rotating (plain first, then DFlash first, ...); each side gives its runs' figures and the
    median time to answer; the speed-up is pooled and the median of paired ratios, both
    computed from those runs."""
    import statistics

    import app.commands.compare as compare_cmd

    order, real = [], compare_cmd.collect_reply

    def spy(target, drafter, messages, settings):
        order.append(settings.mode)
        return real(target, drafter, messages, settings)

    monkeypatch.setattr(compare_cmd, "collect_reply", spy)
    code, out, err = run_cli(capsys, "compare", *pair_args(pair_paths), "--prompt", "Hello",
                             "--max-tokens", "16", "--tools", "none", "--block-size", "4",
                             "--dflash2-model", "none", "--repeats", "3", "--json")
    assert code == 0, err
    assert "warmed up both paths" in err
    assert order == ["plain", "dflash", "dflash", "plain", "plain", "dflash"]
    obj = json.loads(out)
    assert obj["repeats"] == 3 and obj["repeats_identical"] is True
    assert obj["sampled"] is False
    for side in ("plain", "dflash"):
        runs = obj[side]["runs"]
        assert len(runs) == 3
        assert obj[side]["time_to_answer_s"] == statistics.median(
            r["time_to_answer_s"] for r in runs)
        assert obj[side]["tool_s"] == 0.0
    sp = obj["speedup"]
    assert sp["pairs"] == 3
    p, d = obj["plain"]["runs"], obj["dflash"]["runs"]
    pooled = sum(r["time_to_answer_s"] for r in p) / sum(r["time_to_answer_s"] for r in d)
    assert abs(sp["time_to_answer"] - pooled) < 1e-9
    paired = statistics.median(a["time_to_answer_s"] / b["time_to_answer_s"]
                               for a, b in zip(p, d))
    assert abs(sp["median_paired_time_to_answer"] - paired) < 1e-9


def test_fast_verify_flag_reaches_the_engine(capsys, pair_paths):
    code, out, err = run_cli(capsys, "chat", *pair_args(pair_paths), "--mode", "dflash",
                             "--prompt", "Hello", "--max-tokens", "8", "--tools", "none",
                             "--fast-verify", "--json")
    assert code == 0, err
    assert json.loads(out)["summary"]["fast_verify"] is True


def test_chat_human_output(capsys, pair_paths):
    code, out, err = run_cli(capsys, "chat", *pair_args(pair_paths), "--mode", "plain",
                             "--prompt", "Hi", "--max-tokens", "8", "--no-think",
                             "--tools", "none")
    assert code == 0, err
    last = out.rstrip("\n").splitlines()[-1]
    assert last.startswith("plain · 8 tokens · ") and last.endswith("finish length")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--model", "/nonexistent/model", "--draft-model", "/x"], "/nonexistent/model"),
        (["--model", "/nonexistent/model"], "DFlash needs --draft-model"),
        (["--draft-model", "/x"], "no model folder at /x"),  # on the bundled target
        (["--tools", "/nonexistent/tools.json"], "tool file not found"),
        (["--block-size", "99"], "block size 99"),
        (["--tool-parser", "nope"], "unknown tool parser"),
    ],
)
def test_bad_input_exits_2_without_traceback(capsys, pair_paths, extra, message):
    args = ["chat", "--prompt", "x", "--max-tokens", "2", "--mode", "dflash"]
    if "--model" not in extra and "--draft-model" not in extra:
        args += pair_args(pair_paths)
    code, out, err = run_cli(capsys, *args, *extra)
    assert code == 2
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["--max-tokens", "0"], ["--temp", "-1"],
                                  ["--rollback", "nope"], ["--think", "--no-think"]])
def test_bad_arguments_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(["chat", *argv])
    assert exc.value.code == 2


def test_missing_demo_pair_builds_tiny_pair(capsys, tmp_path, monkeypatch):
    import shutil

    from app.paths import resource_path

    res = tmp_path / "resources_without_models"
    res.mkdir()
    shutil.copy(resource_path("chat_template.jinja"), res / "chat_template.jinja")
    monkeypatch.setenv("DFLASH_RESOURCES", str(res))
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path / "cache"))
    code, out, err = run_cli(capsys, "chat", "--mode", "plain", "--prompt", "x",
                             "--max-tokens", "3", "--tools", "none", "--json")
    assert code == 0, err
    assert "bundled demo pair is missing" in err and str(tmp_path / "cache") in err
    assert (tmp_path / "cache" / "tiny-pair").is_dir()
    assert len(json.loads(out)["tokens"]) == 3


def test_near_tie_top_token_is_the_greedy_choice(tiny_hybrid):
    from app.chat.reply import ReplySettings, collect_reply

    target, drafter = tiny_hybrid
    rep = collect_reply(target, drafter, [{"role": "user", "content": "Hi"}],
                        ReplySettings(mode="plain", max_tokens=6))
    prompt = rep.rounds[0].prompt_ids
    for k in (0, 3):
        tie = near_tie(target, prompt, rep.tokens[:k], {"plain": rep.tokens[k]}, k)
        assert tie["index"] == k
        assert tie["top"][0]["id"] == rep.tokens[k] == tie["plain_token"]
        assert tie["plain_logit"] == tie["top"][0]["logit"]
        assert tie["gap"] == tie["top"][0]["logit"] - tie["top"][1]["logit"] >= 0


@pytest.mark.parametrize(
    "a, b, expected",
    [([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 5, 3], 1), ([1, 2], [1, 2, 3], 2),
     ([], [4], 0)],
)
def test_first_divergence(a, b, expected):
    assert first_divergence(a, b) == expected


CALC_CALL = ("<tool_call>\n<function=calculator>\n<parameter=expression>\n17*23\n</parameter>\n"
             "</function>\n</tool_call>")
"""A calculator call as the demo target writes it (17*23)."""


def _rounds(pair_paths, *texts: str) -> list[list[int]]:
    """Each text as one scripted round of the bundled target: its token ids and ``<|im_end|>``."""
    from app.models.loader import load_target

    tok = load_target(pair_paths[0]).tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    return [tok.encode(t, add_special_tokens=False) + [eos] for t in texts]


class _Scripted:
    """A scripted engine for the CLI: round k emits ``scripts[k]`` (token ids)."""

    def __init__(self, scripts):
        self.scripts, self.calls = scripts, 0

    def __call__(self, target, prompt_ids, config, drafter=None):
        ids = self.scripts[min(self.calls, len(self.scripts) - 1)]
        self.calls += 1
        mode = config.mode

        class Gen(FakeCancel):
            def __iter__(self):
                for i, t in enumerate(ids):
                    yield TokenEvent(t, i, from_draft=mode == "dflash" and i % 2 == 1)
                    if mode == "dflash" and i % 2 == 1:
                        yield CycleEvent(i // 2, 1, 1, 2, False, 0.0, 0.0, 0.0)
                yield Done(Summary(mode=mode, generated_tokens=len(ids), stop_cause="end_token"))

        return Gen()


def test_run_tools_json_has_rounds(capsys, pair_paths, monkeypatch):
    scripts = _rounds(pair_paths, CALC_CALL, "It is 391.")
    objs = []
    for mode in ("plain", "dflash"):
        monkeypatch.setattr(reply_mod, "_engine_generate", _Scripted(scripts))
        code, out, err = run_cli(capsys, "chat", *pair_args(pair_paths), "--mode", mode,
                                 "--prompt", "17*23?", "--no-think", "--run-tools", "--json")
        assert code == 0, err
        objs.append(json.loads(out))
    for obj in objs:
        assert obj["content"] == "It is 391." and obj["finish_reason"] == "stop"
        assert [r["finish_reason"] for r in obj["rounds"]] == ["tool_calls", "stop"]
        r0 = obj["rounds"][0]
        assert r0["tool_calls"] == [
            {"id": "call_0", "name": "calculator", "arguments": {"expression": "17*23"}}
        ]
        assert r0["results"][0]["ok"] is True and r0["results"][0]["result"] == 391
    timing = ("time_to_answer_s", "tool_s")
    for obj in objs:  # the tool ran inside the reply's time
        assert 0 < obj["tool_s"] < obj["time_to_answer_s"]
    strip = [{k: v for k, v in o.items() if k not in ("mode", "block_size", "summary", "reply_summary",
                                                      "from_draft", "rounds", *timing)}
             for o in objs]
    assert strip[0] == strip[1]


def test_near_tie_reported_at_a_forced_divergence(tiny_hybrid, request):
    # the tie's logits come from one pass over the reply, the reply's from steps
    expect_float32_difference_on_cuda(request, mx.float32, 16)
    from types import SimpleNamespace

    from app.chat.reply import ReplySettings, collect_reply, divergence_near_tie

    target, drafter = tiny_hybrid
    rep = collect_reply(target, drafter, [{"role": "user", "content": "Hi"}],
                        ReplySettings(mode="plain", max_tokens=6))
    changed = list(rep.tokens)
    changed[4] = (changed[4] + 1) % 100
    other = SimpleNamespace(rounds=[SimpleNamespace(tokens=changed,
                                                    prompt_ids=rep.rounds[0].prompt_ids)])
    tie = divergence_near_tie(target, rep, other)
    assert tie["index"] == 4 and first_divergence(rep.tokens, changed) == 4
    assert tie["plain_token"] == rep.tokens[4] == tie["top"][0]["id"]
    assert tie["dflash_token"] == changed[4] and tie["dflash_logit"] <= tie["plain_logit"]


def test_compare_human_output(capsys, pair_paths):
    code, out, err = run_cli(capsys, "compare", *pair_args(pair_paths), "--prompt", "Hi",
                             "--max-tokens", "8", "--tools", "none", "--no-think")
    assert code == 0, err
    assert "== plain ==" in out and "== dflash ==" in out and "identical: yes" in out


def test_run_tools_human_output_streams_call_result_and_answer(capsys, pair_paths, monkeypatch):
    scripts = _rounds(pair_paths, "Checking.\n" + CALC_CALL, "It is 391.")
    monkeypatch.setattr(reply_mod, "_engine_generate", _Scripted(scripts))
    code, out, err = run_cli(capsys, "chat", *pair_args(pair_paths), "--mode", "plain",
                             "--prompt", "17*23?", "--no-think", "--run-tools")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[:6] == [
        "[answer]",
        "Checking.",
        '[tool call] calculator {"expression": "17*23"}',
        '[tool result] {"ok": true, "result": 391}',
        "[answer]",
        "It is 391.",
    ]
    assert lines[-1].startswith("plain · ") and lines[-1].endswith("finish stop")


class _Cancellable(_Scripted):
    """:class:`_Scripted`, stopping as the engine does when cancelled (a stop string): no
    token after the cancel, and ``Done`` says ``cancelled``."""

    def __call__(self, target, prompt_ids, config, drafter=None):
        ids = self.scripts[min(self.calls, len(self.scripts) - 1)]
        self.calls += 1

        class Gen(FakeCancel):
            def __iter__(self):
                n = 0
                for i, t in enumerate(ids):
                    if self.cancelled:
                        break
                    yield TokenEvent(t, i)
                    n += 1
                yield Done(Summary(mode=config.mode, generated_tokens=n,
                                   stop_cause="cancelled" if self.cancelled else "end_token"))

        return Gen()


def test_the_figures_line_says_a_stop_string_ended_the_reply(capsys, pair_paths, monkeypatch):
    """`finish stop` alone read as if the model ended its answer itself; when a stop string
    ended it the line says so (`--json` is unchanged: ``finish_reason`` ``stop``, the
    summary's ``stop_cause`` ``stop_string``)."""
    text = "Paris is the capital. END here, then more."
    args = ["chat", *pair_args(pair_paths), "--mode", "plain", "--prompt", "Capital?",
            "--no-think", "--tools", "none", "--stop", "END"]
    monkeypatch.setattr(reply_mod, "_engine_generate", _Cancellable(_rounds(pair_paths, text)))
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    lines = out.splitlines()
    assert "Paris is the capital." in lines
    assert lines[-1].startswith("plain · ") and lines[-1].endswith("finish stop (stop string)")
    monkeypatch.setattr(reply_mod, "_engine_generate", _Cancellable(_rounds(pair_paths, text)))
    code, out, err = run_cli(capsys, *args, "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert obj["finish_reason"] == "stop" and obj["summary"]["stop_cause"] == "stop_string"
    assert obj["content"] == "Paris is the capital."
    # a reply that ended by itself still says only `finish stop`
    monkeypatch.setattr(reply_mod, "_engine_generate", _Cancellable(_rounds(pair_paths, text)))
    code, out, err = run_cli(capsys, *args[:-2])
    assert code == 0, err
    assert out.splitlines()[-1].endswith("· finish stop")


def test_compare_prints_every_round_and_the_whole_replys_figures(capsys, pair_paths,
                                                                  monkeypatch):
    """A new user's pass: `compare --run-tools` left out what the first round wrote before
    its tool call (chat printed it), and the figures line counted only the last round (32
    tokens where the window showed 85). Each side now prints every round, and its figures
    are the whole reply's, as the window's panel gives them (JSON: ``reply_summary``)."""

    first, second = _rounds(pair_paths, "Checking.\n" + CALC_CALL, "It is 391.")
    monkeypatch.setattr(reply_mod, "_engine_generate", _Scripted([first, second] * 3))
    code, out, err = run_cli(capsys, "compare", *pair_args(pair_paths), "--prompt", "17*23?",
                             "--no-think", "--run-tools")
    assert code == 0, err
    for side in out.split("== ")[1:]:
        lines = side.splitlines()
        assert lines.index("Checking.") < lines.index('[tool call] calculator {"expression": '
                                                      '"17*23"}')
        total = len(first) + len(second) - 2  # the end tokens are not generated text
        figures = [ln for ln in lines if " tokens in 2 rounds · " in ln]
        assert len(figures) == 1, side
        assert int(figures[0].split(" tokens in 2 rounds")[0].split("· ")[-1]) >= total
    monkeypatch.setattr(reply_mod, "_engine_generate", _Scripted([first, second] * 3))
    code, out, err = run_cli(capsys, "compare", *pair_args(pair_paths), "--prompt", "17*23?",
                             "--no-think", "--run-tools", "--json")
    obj = json.loads(out)
    for key in ("plain", "dflash"):
        whole, last = obj[key]["reply_summary"], obj[key]["summary"]
        assert whole["generated_tokens"] == sum(
            r["summary"]["generated_tokens"] for r in obj[key]["rounds"]) > last["generated_tokens"]


def test_data_dir_that_is_a_file_exits_2(capsys, tmp_path):
    from app.cli import main

    f = tmp_path / "file"
    f.write_text("x")
    assert main(["--data-dir", str(f), "models"]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_file_tools_are_offered_but_never_run(monkeypatch):
    import argparse

    from app.commands.generation import settings_from_args

    base = dict(max_tokens=8, block_size=None, rollback="tape", fast_verify=False, stop=[],
                run_tools=True,
                max_tool_rounds=8, tool_parser=None, temp=0.0, top_p=1.0, top_k=0, min_p=0.0,
                repetition_penalty=None, seed=None)
    builtin = settings_from_args(argparse.Namespace(tools="builtin", **base), "plain", [], None)
    from_file = settings_from_args(argparse.Namespace(tools="x.json", **base), "plain", [], None)
    assert builtin.runnable_tools is None  # the built-ins
    assert from_file.runnable_tools == []  # nothing runs: a call gets an error result


def test_missing_x11_libraries_are_named(monkeypatch):
    import ctypes.util

    from app import cli

    monkeypatch.setattr(cli.sys, "platform", "linux")
    monkeypatch.setenv("DISPLAY", ":99")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    real = ctypes.util.find_library
    monkeypatch.setattr(ctypes.util, "find_library",
                        lambda name: None if name == "xcb-cursor" else real(name) or "lib")
    assert cli.missing_x11_packages() == ["libxcb-cursor0"]
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")  # X11 asked for by name: still needed
    assert cli.missing_x11_packages() == ["libxcb-cursor0"]
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb:nograb")
    assert cli.missing_x11_packages() == ["libxcb-cursor0"]
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")  # no X11 window wanted: nothing missing
    assert cli.missing_x11_packages() == []
    monkeypatch.setenv("QT_QPA_PLATFORM", "wayland;xcb")  # another plugin first
    assert cli.missing_x11_packages() == []


def test_plain_mode_warns_about_an_unusable_draft_model(capsys, pair_paths, tmp_path):
    # a usable drafter: no warning in plain mode
    code, _, err = run_cli(capsys, "chat", *pair_args(pair_paths), "--mode", "plain",
                           "--prompt", "Hi", "--max-tokens", "2", "--tools", "none", "--json")
    assert code == 0 and "warning: --draft-model" not in err
    # the target given as the drafter: plain still runs, and says why it could not be used
    code, out, err = run_cli(capsys, "chat", "--model", str(pair_paths[0]), "--draft-model",
                             str(pair_paths[0]), "--mode", "plain", "--prompt", "Hi",
                             "--max-tokens", "2", "--tools", "none", "--json")
    assert code == 0 and len(json.loads(out)["tokens"]) == 2
    assert f"warning: --draft-model {pair_paths[0]} is not used in plain mode" in err
    assert "not a DFlash drafter" in err
    # a folder that does not exist
    code, _, err = run_cli(capsys, "chat", "--model", str(pair_paths[0]), "--draft-model",
                           str(tmp_path / "nope"), "--mode", "plain", "--prompt", "Hi",
                           "--max-tokens", "2", "--tools", "none", "--json")
    assert code == 0 and "could not be used with this target anyway" in err


def test_compare_runs_the_tools_on_one_frozen_clock(capsys, pair_paths, monkeypatch):
    """compare --run-tools: plain and DFlash see the same tool results, so a ticking clock
    between the two runs cannot make them differ (the headless ``make run`` shows this)."""
    import datetime as real

    from app.chat.tools import clock

    class TickingDatetime(real.datetime):  # the clock moves one second at every read
        reads = 0

        @classmethod
        def now(cls, tz=None):
            cls.reads += 1
            return real.datetime(2026, 1, 1, 12, 0, cls.reads, tzinfo=real.UTC)

    class Ticking:
        UTC, timedelta, datetime = real.UTC, real.timedelta, TickingDatetime

    monkeypatch.setattr(clock, "_dt", Ticking)
    assert clock.current_time("UTC")["time"] != clock.current_time("UTC")["time"]
    call = ("<tool_call>\n<function=current_time>\n<parameter=timezone>\nAsia/Tokyo\n"
            "</parameter>\n</function>\n</tool_call>")
    turn = _rounds(pair_paths, call, "Here it is.")
    monkeypatch.setattr(reply_mod, "_engine_generate", _Scripted(turn + turn))
    code, out, err = run_cli(capsys, "compare", *pair_args(pair_paths), "--prompt", "Time?",
                             "--no-think", "--run-tools", "--json")
    assert code == 0, err
    obj = json.loads(out)
    results = [obj[m]["rounds"][0]["results"][0] for m in ("plain", "dflash")]
    assert results[0]["ok"] and results[0]["result"]["timezone"] == "Asia/Tokyo"
    assert results[0]["result"] == results[1]["result"]


def test_builtin_tools_with_a_frozen_clock():
    import datetime

    from app.chat.tools import BUILTIN_TOOLS, builtin_tools, run_tool

    now = datetime.datetime(2026, 12, 1, 15, 26, 35, tzinfo=datetime.UTC)
    tools = builtin_tools(now)
    assert [t.name for t in tools] == [t.name for t in BUILTIN_TOOLS]
    got = run_tool("current_time", {"timezone": "Asia/Tokyo"}, tools=tools)
    assert got.ok and got.result["time"] == "00:26:35" and got.result["date"] == "2026-12-02"
    assert builtin_tools() == BUILTIN_TOOLS


def test_compare_warms_up_everywhere_and_chat_on_a_gpu_only(capsys, pair_paths, monkeypatch):
    """compare times both paths, so it warms both up first on every backend (a cold plain
    side on the CPU ran at half its later speed); chat gives a fresh start's figures on the
    CPU and warms up only to build GPU kernels."""
    from app.engine import warmup

    calls = []

    def fake_warm_up(target, drafters, every_drafter=False):
        calls.append(([d is not None for d in drafters], every_drafter))
        return warmup.WarmUpReport(0.5, [0.25], 3)

    monkeypatch.setattr(warmup, "warm_up", fake_warm_up)
    argv = [*pair_args(pair_paths), "--prompt", "Hi", "--max-tokens", "4", "--tools", "none"]
    code, _, err = run_cli(capsys, "compare", *argv, "--json")
    assert code == 0 and calls == [([True], True)]  # the CPU too
    assert "note: warmed up both paths (plain, DFlash) in 0.8 s before timing" in err
    assert run_cli(capsys, "chat", *argv, "--mode", "plain", "--json")[0] == 0
    assert len(calls) == 1 + warmup.needs_warm_up()  # chat warms up on a GPU only
    monkeypatch.setattr(warmup, "needs_warm_up", lambda: True)
    code, _, err = run_cli(capsys, "chat", *argv, "--mode", "plain", "--json")
    assert code == 0 and calls[-1] == ([False], True)  # plain mode loads no drafter
    assert "note: warmed up in 0.8 s (building GPU kernels)" in err


# ------------------------------------------------------------------------------ bundled pair
def _bundled_dirs():
    from app.paths import demo_dflash2_dir, demo_pair_dirs

    return (*demo_pair_dirs(), demo_dflash2_dir())


needs_bundled = pytest.mark.skipif(
    not all((d / "config.json").is_file() for d in _bundled_dirs()),
    reason="the bundled demo pair and its DFlash2 drafter are not in this checkout",
)


@needs_bundled
@pytest.mark.parametrize("mode, index", [("dflash", 1), ("dflash2", 2), ("plain", 1)])
def test_bundled_target_gets_the_bundled_drafter_of_its_mode(mode, index):
    import argparse

    from app.commands.generation import resolve_pair

    dirs = [str(d) for d in _bundled_dirs()]
    expected = (dirs[0], dirs[index])
    for model in (None, dirs[0]):  # the default pair, or the bundled target named
        args = argparse.Namespace(model=model, draft_model=None, mode=mode)
        assert resolve_pair(args, need_drafter=True) == expected
    # a --draft-model alone is paired with the bundled target
    args = argparse.Namespace(model=None, draft_model="/some/drafter", mode=mode)
    assert resolve_pair(args, need_drafter=True) == (dirs[0], "/some/drafter")


@needs_bundled
def test_chat_mode_dflash2_on_the_bundled_pair(capsys):
    """``chat --mode dflash2`` with no models given runs the bundled DFlash2 drafter, as the
    window does, and its tokens are plain's."""
    argv = ["chat", "--prompt", "Hi", "--max-tokens", "6", "--tools", "none", "--json"]
    code, out, err = run_cli(capsys, *argv, "--mode", "dflash2")
    assert code == 0, err
    v2 = json.loads(out)
    assert v2["mode"] == v2["summary"]["mode"] == "dflash2" and v2["summary"]["cycles"] > 0
    code, out, err = run_cli(capsys, *argv, "--mode", "plain")
    assert code == 0, err
    assert json.loads(out)["tokens"] == v2["tokens"]


@needs_bundled
def test_draft_model_alone_uses_the_bundled_target(capsys, pair_paths):
    drafter = str(_bundled_dirs()[1])
    code, out, err = run_cli(capsys, "chat", "--draft-model", drafter, "--mode", "dflash",
                             "--prompt", "Hi", "--max-tokens", "4", "--tools", "none", "--json")
    assert code == 0, err
    assert json.loads(out)["mode"] == "dflash"
    # a drafter made for another target: one line that says how to give its own target
    code, out, err = run_cli(capsys, "chat", "--draft-model", str(pair_paths[1]), "--prompt",
                             "Hi", "--max-tokens", "4", "--tools", "none")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "paired with the bundled demo target: give --model" in err


@needs_bundled
def test_compare_runs_dflash2_too_on_the_bundled_pair(capsys):
    """Like the window's three-sided Compare; --dflash2-model none leaves that side out."""
    argv = ["compare", "--prompt", "Hi", "--max-tokens", "6", "--tools", "none", "--json"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    obj = json.loads(out)
    assert {"dflash2", "dflash2_identical", "dflash2_first_divergence"} <= set(obj)
    assert obj["dflash"]["summary"]["mode"] == "dflash"
    assert obj["dflash2"]["summary"]["mode"] == "dflash2"
    assert obj["dflash2"]["tokens"] == obj["plain"]["tokens"] and obj["dflash2_identical"]
    code, out, err = run_cli(capsys, *argv, "--dflash2-model", "none")
    assert code == 0, err
    assert set(json.loads(out)) == {"plain", "dflash", "identical", "first_divergence",
                                    "near_tie", "sampled", "repeats", "speedup",
                                    "repeats_identical"}  # no dflash2 fields


@needs_bundled
def test_compare_names_every_path_it_warmed_up(capsys, monkeypatch):
    """compare said "warmed up both paths" when it warmed three or four (plain, DFlash,
    DFlash2 and, with --lookup, Lookup, which was not warmed up at all): the count and the
    names of the paths it warmed, each side it times among them."""
    from app.engine import warmup
    from app.engine.modes import drafter_mode

    calls = []

    def fake_warm_up(target, drafters, every_drafter=False, lookup=False):
        calls.append(([drafter_mode(d).value for d in drafters], lookup))
        return warmup.WarmUpReport(0.5, [0.25], 3)

    monkeypatch.setattr(warmup, "warm_up", fake_warm_up)
    argv = ["compare", "--prompt", "Hi", "--max-tokens", "4", "--tools", "none", "--json"]
    said = "note: warmed up {} in 0.8 s before timing"
    for extra, drafters, lookup, paths in [
            ([], ["dflash", "dflash2"], False, "3 paths (plain, DFlash, DFlash2)"),
            (["--lookup"], ["dflash", "dflash2"], True,
             "4 paths (plain, DFlash, DFlash2, Lookup)"),
            (["--dflash2-model", "none", "--lookup"], ["dflash"], True,
             "3 paths (plain, DFlash, Lookup)"),
            (["--draft-model", str(_bundled_dirs()[2])], ["dflash2"], False,
             "both paths (plain, DFlash2)")]:
        code, out, err = run_cli(capsys, *argv, *extra)
        assert code == 0, err
        assert calls[-1] == (drafters, lookup), extra
        assert said.format(paths) in err, err
        obj = json.loads(out)
        assert ("lookup" in obj) is lookup and ("dflash2" in obj) is ("dflash2" in drafters)


def test_the_window_and_the_cli_take_the_default_pair_from_one_place(tmp_path, monkeypatch):
    """``app.paths.bundled_pair`` says what the install bundles; the window's default pair
    (``default_pair``) and the CLI's drafter choice both follow it: all three models, no
    DFlash2 drafter, the target alone, nothing."""
    import argparse

    pytest.importorskip("PySide6")  # the window's side (a GPU host may have no Qt)
    from app.commands.generation import resolve_pair
    from app.paths import bundled_pair
    from app.ui.model_flow import default_pair

    monkeypatch.setenv("DFLASH_RESOURCES", str(tmp_path))
    models = tmp_path / "models"
    folders = {name: models / name for name in ("demo-target", "demo-dflash", "demo-dflash2")}
    for folder in folders.values():
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    t, d, d2 = (str(f) for f in folders.values())
    assert bundled_pair() == tuple(folders.values())
    spec = default_pair()
    assert (spec.target, spec.drafter, spec.drafter2, spec.tiny) == (t, d, d2, False)
    args = argparse.Namespace(model=None, draft_model=None, mode="dflash2")
    assert resolve_pair(args, need_drafter=True) == (t, d2)
    (folders["demo-dflash2"] / "config.json").unlink()
    assert bundled_pair() == (folders["demo-target"], folders["demo-dflash"], None)
    assert default_pair().drafter2 is None
    assert resolve_pair(args, need_drafter=True) == (t, d)  # loading then says DFlash2 lacks one
    (folders["demo-dflash"] / "config.json").unlink()
    assert bundled_pair() is None
    spec = default_pair()
    assert (spec.target, spec.drafter, spec.tiny) == (t, None, False)  # the target alone
    (folders["demo-target"] / "config.json").unlink()
    assert default_pair().tiny


def test_a_reply_stopped_at_a_tool_call_says_how_to_run_it(capsys, pair_paths, monkeypatch):
    """Without --run-tools, chat and compare end at the call; the last line says what to add."""
    from app.commands.chat import TOOL_HINT

    scripts = _rounds(pair_paths, CALC_CALL, "It is 391.")
    monkeypatch.setattr(reply_mod, "_engine_generate", _Scripted(scripts[:1]))
    code, out, err = run_cli(capsys, "chat", *pair_args(pair_paths), "--mode", "plain",
                             "--prompt", "17*23?", "--no-think")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[-2].endswith("finish tool_calls") and lines[-1] == TOOL_HINT
    monkeypatch.setattr(reply_mod, "_engine_generate", _Scripted(scripts))
    code, out, err = run_cli(capsys, "chat", *pair_args(pair_paths), "--mode", "plain",
                             "--prompt", "17*23?", "--no-think", "--run-tools")
    assert code == 0, err
    assert TOOL_HINT not in out
    monkeypatch.setattr(reply_mod, "_engine_generate", _Scripted(scripts[:1]))
    code, out, err = run_cli(capsys, "compare", *pair_args(pair_paths), "--prompt", "17*23?",
                             "--no-think")
    assert code == 0, err
    assert out.count("finish tool_calls") >= 2 and out.splitlines()[-1] == TOOL_HINT


@pytest.mark.parametrize("command", ["chat", "compare"])
def test_tool_setup_is_built_before_the_first_timed_reply(capsys, pair_paths, monkeypatch,
                                                          command):
    """`compare --run-tools` timed the unit tool's registry build (pint, ~0.5 s) inside
    plain's first conversion only ("tools 0.57 s" against 0.00 for DFlash): chat and compare
    start the build while the pair loads, and compare waits for it before timing a side."""
    from app.chat.tools import units

    events = []

    class Build:
        def join(self):
            events.append("joined")

    monkeypatch.setattr(units, "build_in_background",
                        lambda: events.append("started") or Build())
    scripted = _Scripted(list(_rounds(pair_paths, CALC_CALL, "It is 391.")) * 3)

    def generate(*a, **k):
        events.append("reply")
        return scripted(*a, **k)

    monkeypatch.setattr(reply_mod, "_engine_generate", generate)
    extra = ["--mode", "plain"] if command == "chat" else []
    code, out, err = run_cli(capsys, command, *pair_args(pair_paths), *extra,
                             "--prompt", "17*23?", "--no-think", "--run-tools")
    assert code == 0, err
    assert events[0] == "started"
    if command == "compare":
        assert events[1] == "joined" and events.count("joined") == 1
    events.clear()
    code, out, err = run_cli(capsys, command, *pair_args(pair_paths), *extra,
                             "--prompt", "17*23?", "--no-think", "--tools", "none")
    assert code == 0, err
    assert "started" not in events


class _InterruptedAfter(_Cancellable):
    """:class:`_Cancellable` that sends this process SIGINT (Ctrl+C) after its ``after``-th
    token, as a user pressing Ctrl+C while chat writes."""

    def __init__(self, scripts, after: int):
        super().__init__(scripts)
        self.after = after

    def __call__(self, *args, **kwargs):
        import os
        import signal

        gen, after = super().__call__(*args, **kwargs), self.after

        class Gen:  # passes Stop on to the generation it wraps
            def cancel(self):
                gen.cancel()

            def cancel_on(self, event):
                gen.cancel_on(event)

            def __iter__(self):
                for n, ev in enumerate(gen, 1):
                    yield ev
                    if n == after:
                        os.kill(os.getpid(), signal.SIGINT)

        return Gen()


@pytest.mark.parametrize("as_json", [True, False])
def test_ctrl_c_mid_reply_prints_it_as_far_as_it_got(capsys, pair_paths, monkeypatch, as_json):
    """Ctrl+C while `chat` wrote lost the reply: `--json` printed nothing at all (no object,
    so no ``finish_reason`` ``cancelled``), the text output stopped mid-word with
    "interrupted" glued to it and no figures. The first Ctrl+C now stops the reply within a
    cycle; it is printed as far as it got (``finish_reason`` ``cancelled``) and the exit
    code is 130, as for any interrupt."""
    import signal

    text = " ".join(["Paris is the capital of France."] * 8)
    monkeypatch.setattr(reply_mod, "_engine_generate",
                        _InterruptedAfter(_rounds(pair_paths, text), after=5))
    json_arg = ["--json"] if as_json else []
    code, out, err = run_cli(capsys, "chat", *pair_args(pair_paths), "--mode", "plain",
                             "--prompt", "Capital?", "--no-think", "--tools", "none",
                             *json_arg)
    assert code == 130, err
    assert "Traceback" not in err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    if as_json:
        obj = json.loads(out)
        assert obj["finish_reason"] == "cancelled"
        assert obj["summary"]["stop_cause"] == "cancelled"
        assert 5 <= len(obj["tokens"]) < len(text.split())
        assert obj["content"] and text.startswith(obj["content"])
    else:
        lines = out.splitlines()
        assert lines[0] == "[answer]" and text.startswith(lines[1])
        assert lines[-1].startswith("plain · ") and lines[-1].endswith("finish cancelled")


@pytest.mark.parametrize("command", ["chat", "compare"])
def test_a_prompt_over_the_context_is_refused_before_generating(capsys, pair_paths,
                                                                monkeypatch, command):
    """`chat --prompt - < 620KB.txt` prefilled for minutes before warning that the prompt was
    over the context: one line (tokens vs context) and exit 2 now, nothing generated."""
    import app.chat.reply as reply_mod

    def never(*a, **kw):
        raise AssertionError("generated")

    monkeypatch.setattr(reply_mod, "run_reply", never)
    monkeypatch.setattr("app.commands.generation.collect_reply", never, raising=False)
    monkeypatch.setattr(f"app.commands.{command}.collect_reply", never, raising=False)
    code, out, err = run_cli(capsys, command, *pair_args(pair_paths), "--prompt",
                             "word " * 5000, "--max-tokens", "4", "--tools", "none")
    assert code == 2, err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "4,096" in lines[0] and "tokens" in lines[0] and "context" in lines[0]

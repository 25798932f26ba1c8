"""``python -m app bench`` on a tiny random pair: JSON figures, files, ratios, interleaving."""

from __future__ import annotations

import csv
import json

import pytest

from app.cli import main
from app.engine import bench
from app.engine.events import Summary
from app.engine.modes import Mode

MODES = {"plain", "dflash+tape@2", "dflash+replay@2", "dflash+tape@4", "dflash+replay@4"}


@pytest.fixture(scope="module")
def pair_paths(tiny_root):
    from app.models.tiny import build_tiny_pair

    # Same arguments as conftest's tiny_hybrid, so the folders are shared.
    t, d = build_tiny_pair(tiny_root, "qwen3_5", seed=0, block_size=16)
    return str(t), str(d)


@pytest.fixture(scope="module")
def bench_run(pair_paths, tmp_path_factory):
    """One tiny bench run with --json and --out: (parsed stdout, out folder, prompt file)."""
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("bench")
    prompts = tmp / "prompts.json"
    prompts.write_text(json.dumps([{"id": "capital", "messages": [
        {"role": "user", "content": "What is the capital of France?"}]}]))
    out = tmp / "out"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["bench", "--model", pair_paths[0], "--draft-model", pair_paths[1],
                     "--prompts", str(prompts), "--repeats", "1", "--block-sizes", "2,4",
                     "--max-tokens", "16", "--json", "--out", str(out)])
    assert code == 0
    return json.loads(buf.getvalue()), out


def test_json_has_every_mode_with_sane_figures(bench_run, pair_paths):
    result, _ = bench_run
    modes = result["modes"]
    assert set(modes) == MODES
    for name, f in modes.items():
        for key in ("tok_per_s", "ttft_s", "acceptance_rate", "tau", "replays",
                    "rollback_share", "ratio_to_plain", "identical_tokens"):
            assert key in f, (name, key)
        assert f["identical_tokens"] is True
        assert f["tok_per_s"] > 0 and f["ttft_s"] > 0
        assert f["ratio_to_plain"] > 0
        assert f["runs"] == 1
        assert f["generated_tokens"] == modes["plain"]["generated_tokens"]
    assert modes["plain"]["ratio_to_plain"] == pytest.approx(1.0)
    assert modes["plain"]["replays"] == 0 and modes["plain"]["tau"] is None
    for b in (2, 4):
        tape, replay = modes[f"dflash+tape@{b}"], modes[f"dflash+replay@{b}"]
        assert 0 < tape["replays"] <= tape["cycles"]
        assert tape["replays"] == replay["replays"]
        assert tape["cycles"] == replay["cycles"]
        assert tape["acceptance_rate"] == replay["acceptance_rate"]
        assert 0 <= tape["acceptance_rate"] <= 1
        assert 1 <= tape["tau"] <= b
        assert 0 < tape["rollback_share"] < 1
        shares = tape["draft_share"] + tape["verify_share"] + tape["rollback_share"]
        assert shares == pytest.approx(1.0)
        # Every cycle that was not a full acceptance needed a rollback (hybrid target).
        assert result["tape_vs_replay_rollback"][str(b)] > 0
    assert result["identical_tokens"] is True
    best = max(modes[f"dflash+tape@{b}"]["ratio_to_plain"] for b in (2, 4))
    assert result["goals"]["best_tape_ratio_to_plain"] == pytest.approx(best)


def test_header_reports_versions_blas_and_models(bench_run, pair_paths):
    import mlx.core as mx

    from app import __version__
    from app.engine.blas import blas_description

    h = bench_run[0]["header"]
    assert h["app"] == __version__ and h["mlx"] == mx.__version__
    assert h["mlx_lm"] and h["device"]
    assert h["blas"] == blas_description()
    assert h["target"] == pair_paths[0] and h["drafter"] == pair_paths[1]
    assert h["block_sizes"] == [2, 4] and h["repeats"] == 1 and h["max_tokens"] == 16


def test_out_writes_json_csv_and_png(bench_run):
    result, out = bench_run
    saved = json.loads((out / "bench.json").read_text())
    assert set(saved["modes"]) == MODES
    with (out / "runs.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["mode"] for r in rows} == MODES and len(rows) == len(MODES)
    plain_row = next(r for r in rows if r["mode"] == "plain")
    assert float(plain_row["tok_per_s"]) == pytest.approx(result["modes"]["plain"]["tok_per_s"])
    with (out / "summary.csv").open() as fh:
        summary = {r["name"]: r for r in csv.DictReader(fh)}
    assert set(summary) == MODES
    assert summary["dflash+tape@4"]["mode"] == "dflash"
    assert int(summary["dflash+tape@4"]["replays"]) == result["modes"]["dflash+tape@4"]["replays"]
    for name in ("tok_per_s.png", "accepted_length.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def _rec(mode, prompt, repeat, tps, tokens=(1, 2, 3)):
    return bench.RunRecord(mode, prompt, repeat, 10, list(tokens),
                           Summary(mode=mode.mode, generated_tokens=len(tokens), tok_per_s=tps))


def test_ratio_is_the_median_of_pairwise_ratios_and_divergence_is_flagged():
    plain = bench.BenchRun("plain", Mode.PLAIN)
    tape = bench.BenchRun("dflash+tape@4", Mode.DFLASH, "tape", 4)
    records = [
        _rec(plain, "a", 0, 10.0), _rec(tape, "a", 0, 20.0),  # ratio 2
        _rec(plain, "b", 0, 20.0), _rec(tape, "b", 0, 20.0),  # ratio 1
        _rec(plain, "c", 0, 40.0), _rec(tape, "c", 0, 60.0, tokens=(1, 2, 4)),  # 1.5, differs
    ]
    figs = bench.aggregate(records, [plain, tape])
    # Pairwise median is 1.5; the ratio of medians would be 20/20 = 1.0.
    assert figs["dflash+tape@4"]["ratio_to_plain"] == pytest.approx(1.5)
    assert figs["dflash+tape@4"]["tok_per_s"] == pytest.approx(20.0)
    assert figs["dflash+tape@4"]["identical_tokens"] is False
    assert figs["plain"]["identical_tokens"] is True


def test_modes_are_interleaved_with_a_rotating_order(monkeypatch):
    calls = []

    def fake(target, drafter, ids, mode, max_tokens, prompt_id="", repeat=0):
        calls.append((mode.name, prompt_id, repeat, max_tokens))
        return _rec(mode, prompt_id, repeat, 1.0)

    monkeypatch.setattr(bench, "run_one", fake)
    modes = bench.make_modes([2, 4])
    recs = bench.run_matrix(None, None, [("a", [1]), ("b", [2])], modes, 2, 16)
    warm, timed = calls[: len(modes)], calls[len(modes):]
    assert all(c[3] == 8 for c in warm) and len(recs) == 2 * 2 * len(modes)
    firsts = [timed[i][0] for i in range(0, len(timed), len(modes))]
    assert firsts == [m.name for m in modes[:4]]  # each step starts one mode later
    for i in range(0, len(timed), len(modes)):
        assert sorted(c[0] for c in timed[i:i + len(modes)]) == sorted(m.name for m in modes)


@pytest.mark.slow  # left to make test (CI): make test-fast stays under 5 minutes
def test_scaling_prompts_have_exact_lengths_and_costs(tiny_hybrid, tmp_path):
    target, drafter = tiny_hybrid
    for n in (40, 97):
        assert len(bench._exact_length_prompt(target, n)) == n
    sc = bench.run_scaling(target, drafter, 4, lengths=(40, 80), max_tokens=8, generated=70,
                           repeats=2)
    assert [r["prompt_tokens"] for r in sc["context"]] == [40, 80]
    for r in sc["context"]:
        assert r["plain_ms_per_token"] > 0 and r["dflash_ms_per_token"] > 0
    assert [p["generated"] for p in sc["generated"]["plain"]] == [32, 64]
    assert "not meaningful" in sc["note"] and sc["repeats"] == 2
    result = {"header": {"target": "t", "device": "cpu", "blas": "x (y)"},
              "modes": {}, "scaling": sc}
    from app.commands.bench import plot_results

    paths = plot_results(result, [], tmp_path)
    assert (tmp_path / "cost_per_token.png") in paths
    assert (tmp_path / "cost_per_token.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_prompt_file_exits_2_with_a_message(pair_paths, tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text("[{\"id\": 1}]")
    code = main(["bench", "--model", pair_paths[0], "--draft-model", pair_paths[1],
                 "--prompts", str(bad), "--json"])
    assert code == 2
    assert "prompt 0 has no 'messages'" in capsys.readouterr().err


def test_an_out_folder_that_cannot_be_written_is_said_before_the_bench_runs(
        pair_paths, tmp_path, capsys, monkeypatch):
    """`bench --out /proc/nope` ran the whole benchmark, then said "cannot write the results"
    and printed nothing of them. The folder is now made and checked before anything runs."""
    import app.commands.bench as bench_cmd

    ran = []
    monkeypatch.setattr(bench_cmd, "run_matrix", lambda *a, **k: ran.append(1) or [])
    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad = blocker / "out"  # under a file: the folder can never be made
    code = main(["bench", "--model", pair_paths[0], "--draft-model", pair_paths[1],
                 "--out", str(bad), "--repeats", "1", "--max-tokens", "4"])
    assert code == 2 and not ran
    err = capsys.readouterr().err
    assert f"error: cannot write the results to {bad}" in err and "Traceback" not in err


def test_results_are_still_printed_when_writing_them_fails(pair_paths, tmp_path, capsys,
                                                           monkeypatch):
    """A write that fails after the run (disk full, folder removed meanwhile) still prints
    the report, then exits 2 saying what could not be written."""
    import app.commands.bench as bench_cmd

    def fail(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bench_cmd, "write_outputs", fail)
    prompts = tmp_path / "p.txt"
    prompts.write_text("Hello\n")
    code = main(["bench", "--model", pair_paths[0], "--draft-model", pair_paths[1],
                 "--prompts", str(prompts), "--out", str(tmp_path / "out"), "--repeats", "1",
                 "--block-sizes", "4", "--max-tokens", "4", "--dflash2-model", "none"])
    out, err = capsys.readouterr()
    assert code == 2
    assert "identical tokens in every mode" in out
    assert "error: cannot write the results to" in err and "No space left" in err


@pytest.mark.slow
def test_multi_turn_reuses_the_history(pair_paths, capsys):
    code = main(["bench", "--multi-turn", "--model", pair_paths[0], "--draft-model",
                 pair_paths[1], "--history-tokens", "300", "--max-tokens", "4", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    rows = result["turns"]
    assert [(r["mode"], r["turn"]) for r in rows] == [
        (m, t) for m in ("plain", "dflash") for t in (2, 3, 4, 5)
    ]
    for r in rows:
        assert 300 <= r["reused_tokens"] < r["prompt_tokens"]
        assert r["ratio"] == pytest.approx(r["reused_ttft_s"] / r["cold_ttft_s"])


def test_goals_from_figures():
    def mode(rb, ratio):
        return {"rollback": rb, "ratio_to_plain": ratio}

    result = {
        "modes": {"plain": mode(None, 1.0), "dflash+tape@4": mode("tape", 1.6),
                  "dflash+replay@4": mode("replay", 0.9), "dflash+tape@8": mode("tape", 2.3)},
        "tape_vs_replay_rollback": {"4": 0.1, "8": 0.25},
        "identical_tokens": True,
        "scaling": {"context": [
            {"prompt_tokens": 128, "plain_ms_per_token": 10.0, "dflash_ms_per_token": 5.0},
            {"prompt_tokens": 4096, "plain_ms_per_token": 15.0, "dflash_ms_per_token": 6.0}]},
    }
    g = bench.goals(result)
    assert g["best_tape_ratio_to_plain"] == 2.3 and g["tape_2x_plain_identical"] is True
    assert g["worst_tape_over_replay_rollback"] == 0.25
    assert g["tape_rollback_le_fifth_of_replay"] is False
    assert g["plain_cost_growth"] == pytest.approx(1.5)
    assert g["dflash_cost_growth"] == pytest.approx(1.2)
    assert g["dflash_growth_le_plain"] is True
    result["identical_tokens"] = False
    assert bench.goals(result)["tape_2x_plain_identical"] is False


def test_per_prompt_divergence_with_the_top_two_gap(tiny_hybrid):
    """bench --json gives identical / first_divergence / top2_gap per prompt and mode; the
    gap is the target's own top-two logit gap after plain's tokens up to the divergence."""
    from engine_fixtures import prompt_ids, top2_gap

    target, _ = tiny_hybrid
    ids = prompt_ids(target)
    plain = bench.BenchRun("plain", Mode.PLAIN)
    tape = bench.BenchRun("dflash+tape@4", Mode.DFLASH, "tape", 4)
    records = [_rec(plain, "a", 0, 10.0, tokens=(5, 6, 7)), _rec(tape, "a", 0, 20.0,
                                                                  tokens=(5, 6, 9)),
               _rec(plain, "b", 0, 10.0), _rec(tape, "b", 0, 10.0)]
    figs = bench.aggregate(records, [plain, tape])
    bench.add_top2_gaps(target, figs, records, {"a": ids, "b": ids})
    a, b = figs["dflash+tape@4"]["prompts"]["a"], figs["dflash+tape@4"]["prompts"]["b"]
    assert a["identical"] is False and a["first_divergence"] == 2
    assert a["top2_gap"] == pytest.approx(top2_gap(target, ids + [5, 6]), rel=1e-5)
    assert b == {"identical": True, "first_divergence": None, "top2_gap": None}
    assert figs["dflash+tape@4"]["fast_verify"] is False


def test_fast_verify_modes_are_opt_in_and_left_out_of_the_goals():
    names = [m.name for m in bench.make_modes([4])]
    assert names == ["plain", "dflash+tape@4", "dflash+replay@4"]
    modes = bench.make_modes([4], fast=True)
    assert [m.name for m in modes][-1] == "dflash+tape@4+fast" and modes[-1].fast
    result = {
        "modes": {"plain": {"rollback": None, "ratio_to_plain": 1.0},
                  "dflash+tape@4": {"rollback": "tape", "ratio_to_plain": 1.5},
                  "dflash+tape@4+fast": {"rollback": "tape", "ratio_to_plain": 2.5,
                                         "fast_verify": True}},
        "tape_vs_replay_rollback": {}, "identical_tokens": True, "scaling": None,
    }
    assert bench.goals(result)["best_tape_ratio_to_plain"] == 1.5


def test_stage_timing_is_opt_in_and_keeps_the_tokens(tiny_hybrid):
    target, drafter = tiny_hybrid
    ids = list(target.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello"}], add_generation_prompt=True))
    mode = bench.BenchRun("dflash+tape@8", Mode.DFLASH, "tape", 8)
    default = bench.run_one(target, drafter, ids, mode, 24)
    staged = bench.run_one(target, drafter, ids, mode, 24, stage_timing=True)
    assert default.tokens == staged.tokens and len(default.tokens) == 24
    assert staged.summary.stage_timing and not default.summary.stage_timing
    assert staged.summary.replays > 0 and staged.summary.rollback_s > 0


def test_text_table_columns_line_up_with_the_longest_mode_name():
    """A new user's pass: the row "dflash2+tape@16+nosel" (21 characters) pushed its figures
    out of line with the header in the text table; the mode column is now as wide as the
    longest name."""
    from app.commands.bench import text_report

    def mode(tok_per_s):
        return {"tok_per_s": tok_per_s, "pooled_tok_per_s": tok_per_s, "ratio_to_plain": 1.0,
                "ttft_s": 0.1,
                "acceptance_rate": None, "tau": None, "replays": 0, "draft_share": None,
                "verify_share": None, "rollback_share": None, "rollback_ms_per_replay": None,
                "peak_memory_bytes": 2**20, "identical_tokens": True}

    result = {"header": {"app": "0", "mlx": "0", "mlx_lm": "0", "device": "cpu", "blas": "-",
                         "target": "t", "drafter": "d", "prompts": "p", "repeats": 1,
                         "max_tokens": 8},
              "modes": {"plain": mode(100.0), "dflash2+tape@16+nosel": mode(250.0)},
              "identical_tokens": True}
    lines = text_report(result).splitlines()
    header = next(ln for ln in lines if ln.startswith("mode"))
    rows = [ln for ln in lines if ln.startswith(("plain ", "dflash2+tape@16+nosel "))]
    assert len(rows) == 2
    end = header.index("tok/s") + len("tok/s")
    assert [r[:end].rstrip()[-5:] for r in rows] == ["100.0", "250.0"]
    assert {len(r) for r in rows} == {len(header)}


def test_the_dflash2_line_gives_the_tables_pooled_tok_per_s():
    """The "DFlash2 vs DFlash" line under the table gave the median run's tok/s while the
    table's tok/s column is pooled, so the two disagreed; the line now gives the pooled
    figures (the JSON keeps the median ones under their names and adds the pooled ones)."""
    from app.commands.bench import text_report

    def mode(kind, median, pooled, tau):
        return {"mode": kind, "block_size": 16, "selector": True, "tok_per_s": median,
                "pooled_tok_per_s": pooled, "ratio_to_plain": 1.0, "ttft_s": 0.1,
                "acceptance_rate": 0.5, "tau": tau, "replays": 0, "draft_share": None,
                "verify_share": None, "rollback_share": None, "rollback_ms_per_replay": None,
                "peak_memory_bytes": 2**20, "identical_tokens": True}

    modes = {"plain": mode("plain", 100.0, 101.0, None),
             "dflash+tape@16": mode("dflash", 300.0, 310.5, 8.0),
             "dflash2+tape@16": mode("dflash2", 280.0, 290.5, 9.0)}
    pairs = bench.dflash2_vs_dflash(modes)
    assert pairs["16"]["dflash2_tok_per_s"] == 280.0  # the median, as before
    assert pairs["16"]["dflash2_pooled_tok_per_s"] == 290.5
    assert pairs["16"]["dflash_pooled_tok_per_s"] == 310.5
    result = {"header": {"app": "0", "mlx": "0", "mlx_lm": "0", "device": "cpu", "blas": "-",
                         "target": "t", "drafter": "d", "prompts": "p", "repeats": 1,
                         "max_tokens": 8},
              "modes": modes, "identical_tokens": True, "dflash2_vs_dflash": pairs}
    line = next(ln for ln in text_report(result).splitlines() if ln.startswith("DFlash2 vs"))
    assert line.endswith("tok/s (pooled, as in the table) 290.5 vs 310.5")

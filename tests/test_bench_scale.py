"""tools/bench_scale.py: the acceptance control hits the requested tau, DFlash stays exact, and
the JSON carries every figure (``--shapes tiny``, end to end, on the CPU)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_TOOLS = Path(__file__).resolve().parent.parent / "tools"
sys.path.insert(0, str(_TOOLS))
_SPEC = importlib.util.spec_from_file_location("bench_scale", _TOOLS / "bench_scale.py")
bench_scale = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench_scale)


@pytest.mark.parametrize("tau", [1.0, 2.5, 4.99, 6.2, 12.0])
def test_the_drawn_acceptance_lengths_have_the_requested_mean(tau):
    a = bench_scale.acceptance_probability(tau)
    uniform = bench_scale.StratifiedUniforms(seed=3)
    ks = [bench_scale.draw_accepted(uniform(), a, 15) for _ in range(4800)]
    assert max(ks) <= 15
    assert sum(k + 1 for k in ks) / len(ks) == pytest.approx(tau, rel=0.02)


@pytest.mark.slow  # left to make test (CI): make test-fast stays under 5 minutes
def test_tiny_end_to_end_is_exact_hits_tau_and_writes_the_json(tmp_path, capsys):
    out = tmp_path / "scale.json"
    rc = bench_scale.main(["--shapes", "tiny", "--dtypes", "float32", "--prompt-lengths", "24",
                           "--max-tokens", "128", "--repeats", "1", "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "tiny-float32-p24" in printed and "dflash2" in printed
    result = json.loads(out.read_text())
    assert result["header"]["tau_requested"] == {"dflash": 4.99, "dflash2": 6.2}
    config = result["configs"]["tiny-float32-p24"]
    assert config["prompt_tokens"] == 24
    for mode in ("plain", "dflash", "dflash2"):
        row = config[mode]
        assert row["identical"] is True and row["first_divergence"] is None
        assert row["generated_tokens"] == 128
        for key in ("decode_tok_per_s", "time_to_answer_s", "ttft_s", "peak_memory_gb"):
            assert row[key] > 0
    for mode in ("dflash", "dflash2"):
        row = config[mode]
        # every controlled proposal is accepted exactly as far as drawn
        assert row["tau"] == pytest.approx(row["tau_drawn"], rel=0.05)
        assert row["tau"] == pytest.approx(row["tau_requested"], rel=0.15)
        assert row["acceptance"] == pytest.approx((row["tau"] - 1) / 15, rel=0.2)
        for key in ("draft_ms_per_cycle", "verify_ms_per_cycle", "rollback_ms_per_cycle",
                    "decode_x_plain", "answer_x_plain", "cycle_ms"):
            assert row[key] > 0
        assert row["staged_identical"] is True and row["cycles"] > 10


@pytest.mark.parametrize("shape,params", [("4b", 0.634e9), ("9b", 1.292e9)])
def test_the_real_scale_drafters_have_z_labs_layout(shape, params):
    import math

    from app.engine.dflash2 import DFlash2Config
    from app.engine.drafter import DrafterConfig, expected_shapes

    target = bench_scale.target_config(shape)
    cfg = DrafterConfig.from_dict(bench_scale.drafter_config(target, "dflash", False))
    assert cfg.target_layer_ids == [1, 5, 9, 13, 17, 21, 25, 29] and cfg.block_size == 16
    assert cfg.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    assert cfg.hidden_size == target["hidden_size"] and cfg.sliding_window == 4096
    count = sum(math.prod(s) for s in expected_shapes(cfg).values())  # shapes only, lazy
    assert count == pytest.approx(params, rel=0.01)
    cfg2 = DFlash2Config.from_dict(bench_scale.drafter_config(target, "dflash2", False))
    assert cfg2.kind == "dflash2" and cfg2.selector_rank == 256 and cfg2.sliding_window == 2048

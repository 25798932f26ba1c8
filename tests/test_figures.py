"""The figures arithmetic lives in one place (``app.engine.events.Summary``); the live panel
and the bench reuse it."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def test_summary_arithmetic_is_shared_by_engine_panel_and_bench():
    """Summary.add_cycle / set_rates / pool: the one place figures are computed."""
    from app.engine.events import CycleEvent, Summary
    from app.ui.panels import LiveStats

    cycles = [CycleEvent(0, 3, 3, 4, False, 0.01, 0.02, 0.0),
              CycleEvent(1, 3, 1, 2, True, 0.01, 0.02, 0.01)]
    s = Summary(mode="dflash", generated_tokens=7)
    for ev in cycles:
        s.add_cycle(ev)
    s.set_rates(committed=6)
    assert (s.cycles, s.drafted, s.accepted, s.replays) == (2, 6, 4, 1)
    assert s.tau == 3.0 and s.acceptance_rate == 4 / 6 and s.accepted_lengths == [3, 1]
    assert abs(s.rollback_share - 0.01 / 0.07) < 1e-12
    live = LiveStats()
    for ev in cycles:
        live.on_cycle(ev)
    v = live.values()
    assert (v["acceptance"], v["tau"], v["replays"], v["cycles"]) == (4 / 6, 3.0, 1, 2)
    assert v["rollback_share"] == s.rollback_share
    pooled = Summary.pool([s, Summary(mode="dflash", generated_tokens=1)])
    assert pooled.cycles == 2 and pooled.tau == 3.0 and pooled.generated_tokens == 8
    assert Summary.pool([Summary(mode="plain", generated_tokens=5)], "plain").tau is None


def test_reply_total_keeps_the_drafting_mode_of_its_rounds():
    # A DFlash2 reply over two tool rounds is a DFlash2 reply (it was reported as plain, so the
    # window's live panel hid acceptance, tau and replays for it).
    from app.engine.events import CycleEvent, Summary

    for mode in ("dflash", "dflash2"):
        rounds = []
        for k in range(2):
            s = Summary(mode=mode, generated_tokens=10 + k, tok_per_s=50.0)
            s.add_cycle(CycleEvent(0, 3, 3, 4, False, 0.01, 0.02, 0.0))
            rounds.append(s)
        total = Summary.reply_total(rounds)
        assert total.mode == mode
        assert total.generated_tokens == 21
    plain = [Summary(mode="plain", generated_tokens=4, tok_per_s=10.0) for _ in range(2)]
    assert Summary.reply_total(plain).mode == "plain"


def test_a_continued_generation_counts_both_runs_over_the_first_prompt():
    """Continue after Max tokens: the reply's figures are over both runs (tokens, cycles and
    seconds summed, tok/s over the two runs' generation seconds, not the pause between them),
    with the first run's prompt, time to first token and reuse (the continuation's prompt
    holds the first run's tokens, which are counted as generated)."""
    from app.engine.events import CycleEvent, Summary

    before = Summary(mode="dflash", prompt_tokens=40, reused_tokens=0, generated_tokens=12,
                     tok_per_s=120.0, ttft_s=0.3, total_s=0.4, prefill_s=0.3,
                     stop_cause="length")
    before.add_cycle(CycleEvent(0, 7, 7, 8, False, 0.01, 0.02, 0.0))
    after = Summary(mode="dflash", prompt_tokens=52, reused_tokens=51, generated_tokens=12,
                    tok_per_s=60.0, ttft_s=0.01, total_s=0.2, prefill_s=0.01,
                    stop_cause="length")
    after.add_cycle(CycleEvent(0, 7, 3, 4, True, 0.01, 0.02, 0.01))
    whole = Summary.continued(before, after)
    assert whole.mode == "dflash" and whole.generated_tokens == 24
    assert whole.prompt_tokens == 40 and whole.reused_tokens == 0 and whole.ttft_s == 0.3
    assert whole.tok_per_s == 24 / (12 / 120.0 + 12 / 60.0)
    assert (whole.cycles, whole.drafted, whole.accepted, whole.replays) == (2, 14, 10, 1)
    assert whole.accepted_lengths == [7, 3] and whole.stop_cause == "length"
    assert abs(whole.total_s - 0.6) < 1e-12

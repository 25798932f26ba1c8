"""``app.chat.measure``: the one definition of a reply's figures and of a speed-up."""

from __future__ import annotations

import pytest

from app.chat.measure import ReplyFigures, median_figures, pooled_decode_tok_per_s, speedup


def fig(answer_s, tokens, tok_per_s, mode="plain", tool_s=0.0):
    return ReplyFigures(mode=mode, time_to_answer_s=answer_s, tool_s=tool_s, ttft_s=0.1,
                        generated_tokens=tokens, decode_tok_per_s=tok_per_s)


def test_pooled_and_median_of_paired_ratios_are_each_what_they_say():
    plain = [fig(1.0, 50, 50.0), fig(4.0, 100, 25.0), fig(2.0, 100, 50.0)]
    dflash = [fig(0.5, 50, 100.0, "dflash"), fig(1.0, 100, 100.0, "dflash"),
              fig(2.0, 100, 50.0, "dflash")]
    sp = speedup(plain, dflash)
    assert sp.pairs == 3
    # pooled: total seconds over total seconds (7.0 / 3.5), tokens over decode seconds
    assert sp.time_to_answer == pytest.approx(2.0)
    assert pooled_decode_tok_per_s(plain) == pytest.approx(250 / 7.0)
    assert pooled_decode_tok_per_s(dflash) == pytest.approx(250 / 3.5)
    assert sp.decode == pytest.approx(2.0)
    # paired: ratios 2, 4, 1 (answer) and 2, 4, 1 (decode): median 2
    assert sp.median_paired_time_to_answer == pytest.approx(2.0)
    assert sp.median_paired_decode == pytest.approx(2.0)
    assert "pooled over 3 pairs; median of paired ratios 2.00x, 2.00x" in sp.line()


def test_the_two_ratios_part_when_one_pair_dominates():
    # one long reply dominates the pooled figure; the median of pairs follows the typical one
    plain = [fig(1.0, 10, 10.0), fig(1.0, 10, 10.0), fig(10.0, 100, 10.0)]
    other = [fig(0.25, 10, 40.0), fig(0.25, 10, 40.0), fig(10.0, 100, 10.0)]
    sp = speedup(plain, other)
    assert sp.median_paired_time_to_answer == pytest.approx(4.0)
    assert sp.time_to_answer == pytest.approx(12.0 / 10.5)


def test_unpaired_lists_are_refused_and_missing_rates_give_none():
    with pytest.raises(ValueError, match="not paired"):
        speedup([fig(1, 1, 1)], [])
    sp = speedup([fig(1.0, 1, 0.0)], [fig(0.0, 1, 0.0)])
    assert sp.time_to_answer is None and sp.decode is None
    assert sp.median_paired_decode is None


def test_reply_figures_of_a_reply_count_every_round_and_the_tools():
    from app.chat.events import Reply, ReplyRound, ToolCall, ToolRun
    from app.chat.tools.base import ToolResult
    from app.engine.events import Summary

    def rnd(i, n, total, runs=()):
        s = Summary(mode="dflash", generated_tokens=n, tok_per_s=n / 0.5, ttft_s=0.2 + i,
                    total_s=total, cycles=2, drafted=6, accepted=3)
        s.set_rates(n - 1)
        return ReplyRound(i, "dflash", "", "", [], "stop", list(range(n)), [False] * n, "", s,
                          [], tool_runs=list(runs))

    run = ToolRun(ToolCall("c0", "calculator", {}), ToolResult(ok=True, result=1,
                                                                duration_s=0.3))
    reply = Reply("dflash", [rnd(0, 5, 1.0, [run]), rnd(1, 7, 2.0)], [], [])
    f = ReplyFigures.of(reply)
    assert f.generated_tokens == 12 and f.tool_s == pytest.approx(0.3)
    assert f.time_to_answer_s == pytest.approx(3.3)  # both rounds' seconds and the tool's
    assert f.ttft_s == pytest.approx(0.2)  # the first round's
    assert ReplyFigures.of(reply, wall_s=4.0).time_to_answer_s == 4.0
    med = median_figures([f, ReplyFigures.of(reply, 5.0), ReplyFigures.of(reply, 4.0)])
    assert med.time_to_answer_s == 4.0
    with pytest.raises(ValueError):
        median_figures([])

"""run_reply: prompt -> engine -> pipeline -> tools, with a scripted engine (to force tool calls
and stop strings from known token ids) and with the real tiny pair (plain vs DFlash)."""

from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace

import pytest
from engine_fixtures import FakeCancel

from app.chat import reply as reply_mod
from app.chat.pipeline import ContentDelta, StopStringHit
from app.chat.reply import (
    ReplyDone,
    ReplySettings,
    RoundFinished,
    RoundStarted,
    ToolResultEvent,
    collect_reply,
    run_reply,
)
from app.engine.errors import GenerationError
from app.engine.events import CycleEvent, Done, Summary, TokenEvent

CALL_17x23 = (
    "<think>\nneed the calculator\n</think>\n\n<tool_call>\n<function=calculator>\n"
    "<parameter=expression>\n17*23\n</parameter>\n</function>\n</tool_call>"
)
ANSWER = "The answer is 391."


class FakeGeneration(FakeCancel):
    """Emits scripted ids like the engine: one at a time (plain) or in blocks with a
    CycleEvent after each (dflash); checks cancel (its own or run_reply's Stop event, as
    ``cancel_on`` gives it) before each token/block."""

    def __init__(self, ids, block, max_tokens, eos, mode):
        super().__init__()
        self.ids, self.block, self.max_tokens, self.eos, self.mode = ids, block, max_tokens, eos, mode
        self.blocks_emitted = 0

    def __iter__(self):
        n, cause, i = 0, "length", 0
        step = self.block if self.mode == "dflash" else 1
        while i < len(self.ids) and n < self.max_tokens:
            if self.cancelled:
                cause = "cancelled"
                break
            chunk = self.ids[i:i + step][: self.max_tokens - n]
            ended = False
            for t in chunk:
                yield TokenEvent(t, n, from_draft=self.mode == "dflash" and t != chunk[0])
                n += 1
                if t in self.eos:
                    ended = True
                    break
            i += step
            self.blocks_emitted += 1
            if self.mode == "dflash":
                yield CycleEvent(self.blocks_emitted - 1, step - 1, len(chunk) - 1, len(chunk),
                                 False, 0.0, 0.0, 0.0)
            if ended:
                cause = "end_token"
                break
        yield Done(Summary(mode=self.mode, generated_tokens=n, stop_cause=cause))


class FakeEngine:
    """Replaces ``reply._engine_generate``; round k emits ``scripts[k]`` (the last script
    repeats). Records every prompt."""

    def __init__(self, tokenizer, scripts, block=5):
        self.tok = tokenizer
        self.eos = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
        self.scripts = [tokenizer.encode(s, add_special_tokens=False) + sorted(self.eos)
                        for s in scripts]
        self.block = block
        self.prompts: list[str] = []
        self.gens: list[FakeGeneration] = []

    def __call__(self, target, prompt_ids, config, drafter=None):
        assert (drafter is not None) == (config.mode == "dflash")
        self.prompts.append(self.tok.decode(prompt_ids))
        ids = self.scripts[min(len(self.prompts) - 1, len(self.scripts) - 1)]
        gen = FakeGeneration(ids, self.block, config.max_tokens, self.eos, config.mode)
        self.gens.append(gen)
        return gen


@pytest.fixture
def fake_target(qwen_tokenizer):
    eos = {qwen_tokenizer.convert_tokens_to_ids("<|im_end|>")}
    return SimpleNamespace(tokenizer=qwen_tokenizer, eos_token_ids=eos)


def run_fake(monkeypatch, target, scripts, settings, block=5, cancel_event=None):
    """Run a reply on the scripted engine; thinking is off unless the settings say otherwise
    (the scripts open their own <think> block)."""
    if settings.enable_thinking is None:
        settings = dataclasses.replace(settings, enable_thinking=False)
    engine = FakeEngine(target.tokenizer, scripts, block)
    monkeypatch.setattr(reply_mod, "_engine_generate", engine)
    drafter = object() if settings.mode == "dflash" else None
    events = list(run_reply(target, drafter, [{"role": "user", "content": "17*23?"}], settings,
                            cancel_event))
    assert isinstance(events[-1], ReplyDone)
    return events, events[-1].reply, engine


@pytest.mark.parametrize("mode, block", [("plain", 1), ("dflash", 3), ("dflash", 8)])
def test_tool_round_trip(monkeypatch, fake_target, mode, block):
    settings = ReplySettings(mode=mode, run_tools=True, max_tokens=500)
    events, rep, engine = run_fake(monkeypatch, fake_target, [CALL_17x23, ANSWER], settings, block)
    assert rep.content == ANSWER and rep.finish_reason == "stop"
    assert len(rep.rounds) == 2
    r0 = rep.rounds[0]
    assert r0.reasoning == "need the calculator" and r0.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.arguments) for c in r0.tool_calls] == [
        ("call_0", "calculator", {"expression": "17*23"})
    ]
    (run,) = r0.tool_runs
    assert run.result.ok and run.result.result == 391
    # The second prompt carries the call and its result back to the model.
    assert len(engine.prompts) == 2
    assert '<tool_response>\n{"ok": true, "result": 391}\n</tool_response>' in engine.prompts[1]
    assert "<parameter=expression>\n17*23\n</parameter>" in engine.prompts[1]
    assert [m["role"] for m in rep.messages] == ["assistant", "tool", "assistant"]
    assert rep.messages[1]["tool_call_id"] == "call_0"
    kinds = [type(e).__name__ for e in events if not isinstance(e, TokenEvent | CycleEvent)]
    assert kinds[0] == "RoundStarted" and "ToolCallDelta" in kinds
    assert kinds.index("RoundFinished") < kinds.index("ToolResultEvent") < kinds.index(
        "RoundStarted", 1)
    assert rep.rounds[0].to_dict()["results"][0]["result"] == 391


def test_round_trip_identical_in_both_modes(monkeypatch, fake_target):
    outs = []
    for mode, block in [("plain", 1), ("dflash", 4)]:
        _, rep, _ = run_fake(monkeypatch, fake_target, [CALL_17x23, ANSWER],
                             ReplySettings(mode=mode, run_tools=True), block)
        outs.append([(r.content, r.reasoning, [c.to_dict() for c in r.tool_calls],
                      r.finish_reason, r.tokens) for r in rep.rounds])
    assert outs[0] == outs[1]
    assert any(f for f in rep.from_draft)  # the dflash run marked drafted tokens


def test_preopened_thinking_round(monkeypatch, fake_target):
    script = "I should add.\n</think>\n\n" + ANSWER
    settings = ReplySettings(mode="dflash", enable_thinking=True)
    _, rep, engine = run_fake(monkeypatch, fake_target, [script], settings, block=4)
    assert engine.prompts[0].endswith("<|im_start|>assistant\n<think>\n")
    assert rep.reasoning == "I should add." and rep.content == ANSWER
    assert rep.messages == [
        {"role": "assistant", "content": ANSWER, "reasoning_content": "I should add."}
    ]


def test_without_run_tools_the_call_is_returned(monkeypatch, fake_target):
    settings = ReplySettings(mode="plain")
    _, rep, engine = run_fake(monkeypatch, fake_target, [CALL_17x23], settings)
    assert rep.finish_reason == "tool_calls" and len(engine.prompts) == 1
    assert [c.name for c in rep.tool_calls] == ["calculator"] and rep.rounds[0].tool_runs == []


def calc_call(expression: str) -> str:
    return (f"<tool_call>\n<function=calculator>\n<parameter=expression>\n{expression}\n"
            "</parameter>\n</function>\n</tool_call>")


def test_tool_round_limit(monkeypatch, fake_target):
    # a different call each round (a repeated one stops earlier, see below)
    settings = ReplySettings(mode="plain", run_tools=True, max_tool_rounds=2)
    scripts = [calc_call("17*23"), calc_call("2*3"), calc_call("5*5")]
    _, rep, engine = run_fake(monkeypatch, fake_target, scripts, settings)
    assert len(engine.prompts) == 3 and len(rep.rounds) == 3
    assert [len(r.tool_runs) for r in rep.rounds] == [1, 1, 0]
    assert rep.finish_reason == "tool_calls"
    assert rep.warnings[-1]["code"] == "tool_round_limit"
    # call ids stay unique across rounds
    assert [c.id for r in rep.rounds for c in r.tool_calls] == ["call_0", "call_1", "call_2"]


def test_the_same_call_again_stops_the_loop(monkeypatch, fake_target):
    settings = ReplySettings(mode="plain", run_tools=True, max_tool_rounds=8)
    _, rep, engine = run_fake(monkeypatch, fake_target, [CALL_17x23], settings)
    # round 0 runs the call; round 1 asks for it again: not run, the reply ends
    assert len(engine.prompts) == 2 and [len(r.tool_runs) for r in rep.rounds] == [1, 0]
    assert rep.warnings[-1]["code"] == "repeated_tool_call"
    assert "same tool call again (calculator" in rep.warnings[-1]["message"]
    assert rep.finish_reason == "tool_calls"


def test_the_same_tool_with_other_arguments_runs_again(monkeypatch, fake_target):
    settings = ReplySettings(mode="plain", run_tools=True)
    scripts = [calc_call("17*23"), calc_call("17*24"), ANSWER]
    _, rep, _ = run_fake(monkeypatch, fake_target, scripts, settings)
    assert [len(r.tool_runs) for r in rep.rounds] == [1, 1, 0]
    assert rep.rounds[1].tool_runs[0].result.result == 408 and rep.content == ANSWER
    assert not [w for w in rep.warnings if w["code"] == "repeated_tool_call"]


def test_unclosed_call_with_a_complete_body_runs_with_a_warning(monkeypatch, fake_target):
    unclosed = CALL_17x23[: -len("</tool_call>")]
    settings = ReplySettings(mode="plain", run_tools=True)
    events, rep, engine = run_fake(monkeypatch, fake_target, [unclosed, ANSWER], settings)
    (res,) = [e for e in events if isinstance(e, ToolResultEvent)]
    assert res.run.result.ok and res.run.result.result == 391
    assert rep.rounds[0].finish_reason == "tool_calls" and rep.content == ANSWER
    assert [w["code"] for w in rep.warnings] == ["unclosed_tool_call"]


def test_unknown_tool_gives_error_result_and_continues(monkeypatch, fake_target):
    bad = "<tool_call>\n<function=teleport>\n<parameter=to>\nMars\n</parameter>\n</function>\n</tool_call>"
    settings = ReplySettings(mode="plain", run_tools=True)
    events, rep, engine = run_fake(monkeypatch, fake_target, [bad, "Sorry."], settings)
    (res,) = [e for e in events if isinstance(e, ToolResultEvent)]
    assert not res.run.result.ok and "unknown tool 'teleport'" in res.run.result.error
    assert '"ok": false' in engine.prompts[1]
    assert rep.content == "Sorry." and rep.finish_reason == "stop"


def test_stop_string_cancels_engine_and_cuts_tokens(monkeypatch, fake_target):
    text = "Paris is the capital. STOP here and a long tail of more words after it"
    settings = ReplySettings(mode="dflash", stop=["STOP"], max_tokens=500)
    events, rep, engine = run_fake(monkeypatch, fake_target, [text], settings, block=4)
    assert rep.content == "Paris is the capital." and rep.finish_reason == "stop"
    gen = engine.gens[0]
    assert gen.cancelled
    total = len(engine.scripts[0])
    # the engine stopped after the block holding the stop string
    assert gen.blocks_emitted < (total + 3) // 4
    tok_events = [e.token_id for e in events if isinstance(e, TokenEvent)]
    assert tok_events == rep.tokens and rep.summary.generated_tokens == len(rep.tokens)
    assert "STOP" in fake_target.tokenizer.decode(rep.tokens)
    assert "STOP" not in fake_target.tokenizer.decode(rep.tokens[:-1])
    assert sum(isinstance(e, StopStringHit) for e in events) == 1


def test_cancel_event_stops_within_one_block(monkeypatch, fake_target):
    cancel = threading.Event()
    engine = FakeEngine(fake_target.tokenizer, [ANSWER * 5], block=3)
    monkeypatch.setattr(reply_mod, "_engine_generate", engine)
    settings = ReplySettings(mode="dflash", max_tokens=500)
    seen = 0
    rep = None
    for ev in run_reply(fake_target, object(), [{"role": "user", "content": "x"}], settings,
                        cancel):
        if isinstance(ev, TokenEvent):
            seen += 1
            cancel.set()
        if isinstance(ev, ReplyDone):
            rep = ev.reply
    assert rep.finish_reason == "cancelled"
    assert engine.gens[0].blocks_emitted == 1  # cancel took hold before the next block
    assert seen == 1 and len(rep.tokens) == 1


def test_dflash_without_drafter_is_a_typed_error(fake_target):
    with pytest.raises(GenerationError, match="needs a drafter"):
        list(run_reply(fake_target, None, [{"role": "user", "content": "x"}],
                       ReplySettings(mode="dflash")))


def _segments(rep):
    return [(r.content, r.reasoning, [c.to_dict() for c in r.tool_calls], r.finish_reason,
             r.tokens, r.text) for r in rep.rounds]


@pytest.mark.parametrize("think, with_tools", [(True, True), (False, False)])
def test_real_tiny_pair_plain_equals_dflash(tiny_hybrid, think, with_tools):
    from app.chat.tools import BUILTIN_TOOLS, tool_schemas

    target, drafter = tiny_hybrid
    msgs = [{"role": "user", "content": "What is 17*23? Use the calculator."}]
    tools = tool_schemas(BUILTIN_TOOLS[:1]) if with_tools else None
    base = dict(max_tokens=32, enable_thinking=think, tools=tools)
    first = collect_reply(target, drafter, msgs, ReplySettings(mode="plain", **base))
    # A stop string taken from the middle of what the model says, so both paths must cut.
    mid = len(first.text) // 2
    stop = first.text[mid:mid + 3]
    base["stop"] = [stop]
    plain = collect_reply(target, drafter, msgs, ReplySettings(mode="plain", **base))
    events = list(run_reply(target, drafter, msgs, ReplySettings(mode="dflash", **base)))
    dflash = events[-1].reply
    assert _segments(plain) == _segments(dflash)
    assert plain.finish_reason == dflash.finish_reason == "stop"
    assert 0 < len(plain.tokens) < len(first.tokens)
    assert plain.tokens == first.tokens[: len(plain.tokens)]
    assert stop not in plain.text and plain.text == first.text[: first.text.index(stop)]
    assert (plain.reasoning if think else plain.content) in first.text
    assert dflash.mode == "dflash" and dflash.summary.cycles > 0
    assert dflash.summary.generated_tokens == len(dflash.tokens)
    assert any(isinstance(e, CycleEvent) for e in events)
    assert isinstance(events[0], RoundStarted)
    assert sum(isinstance(e, RoundFinished) for e in events) == 1
    text = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert text == dflash.content


def test_a_context_overflow_is_warned_once_a_reply_with_separators(monkeypatch, fake_target):
    """A tool reply whose every round overflowed the context warned once per round, and the
    window's note repeated the sentence ("...; the prompt has 726 tokens and up to 100000
    more..."), its numbers bare."""
    target = SimpleNamespace(**vars(fake_target), context_length=1024)
    settings = ReplySettings(mode="plain", max_tokens=100_000, run_tools=True)
    _, reply, _ = run_fake(monkeypatch, target, [CALL_17x23, ANSWER], settings)
    assert len(reply.rounds) == 2
    overflow = [w for w in reply.warnings if w["code"] == "context_overflow"]
    assert len(overflow) == 1
    prompt = len(reply.rounds[0].prompt_ids)
    assert overflow[0]["message"] == (
        f"the prompt has {prompt:,} tokens and up to 100,000 more may be generated, beyond "
        "the model's context of 1,024: the reply may degrade")

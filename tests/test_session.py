"""ChatSession: prompts come from the stored messages (tool calls, tool results, reasoning as
generated), so a multi-turn tool chat keeps its facts and the next turn's prompt extends what
the target's cache holds (prefix reuse)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from engine_fixtures import FakeCancel

from app.chat import reply as reply_mod
from app.chat.reply import ReplyDone, ToolResultEvent
from app.chat.session import ChatSession, PairSpec
from app.chat.storage import Store
from app.chat.stored_turn import prompt_for
from app.chat.turns import finish_fields
from app.engine.events import Done, Summary, TokenEvent
from app.engine.prefix import common_prefix
from app.engine.threads import allow_engine_on_current_thread

LOOKUP = ("<tool_call>\n<function=country_info>\n<parameter=name>\nChile\n</parameter>\n"
          "</function>\n</tool_call>")
ANSWER_1 = "Chile is in South America; its capital is Santiago."
ANSWER_2 = "About 19.6 million people (2023)."


class PrefixEngine:
    """Replaces ``reply._engine_generate``: emits scripted replies and measures prefix reuse
    as a ``PromptCache`` does (the kept ids are the last prompt plus its generated tokens;
    the reused count is their common prefix with the new prompt, the last prompt token
    always prefilled)."""

    def __init__(self, tokenizer, scripts):
        self.tok = tokenizer
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.scripts = [tokenizer.encode(s, add_special_tokens=False) + [self.eos]
                        for s in scripts]
        self.prompts: list[list[int]] = []
        self.kept: list[int] = []
        self.reused: list[int] = []

    def __call__(self, target, prompt_ids, config, drafter=None, session=None,
                 boundaries=None):
        assert session is not None, "the session's prefix cache must reach the engine"
        prompt = list(prompt_ids)
        ids = self.scripts[len(self.prompts)]
        self.prompts.append(prompt)
        reused = min(common_prefix(self.kept, prompt), len(prompt) - 1) if self.kept else 0
        self.reused.append(reused)
        self.kept = prompt + ids
        engine = self

        class Gen(FakeCancel):
            def __iter__(self):
                for i, t in enumerate(ids):
                    yield TokenEvent(t, i, False)
                yield Done(Summary(mode=config.mode, generated_tokens=len(ids),
                                   prompt_tokens=len(prompt), reused_tokens=reused,
                                   stop_cause="end_token"))

        assert engine is self
        return Gen()


@pytest.fixture
def session(qwen_tokenizer):
    allow_engine_on_current_thread()
    store = Store(":memory:")
    s = ChatSession(store)
    eos = {qwen_tokenizer.convert_tokens_to_ids("<|im_end|>")}
    s.target = SimpleNamespace(tokenizer=qwen_tokenizer, eos_token_ids=eos,
                               context_length=8192)
    s.cache = object()  # stands for the PromptCache the engine would use
    yield s
    store.close()


SETTINGS = {"mode": "plain", "use_tools": True, "max_tokens": 200, "enable_thinking": False}


def test_multi_turn_tool_chat_keeps_the_tool_result_and_reuses_the_prefix(
        monkeypatch, session, qwen_tokenizer):
    engine = PrefixEngine(qwen_tokenizer, [LOOKUP, ANSWER_1, ANSWER_2])
    monkeypatch.setattr(reply_mod, "_engine_generate", engine)
    conv = session.store.new_conversation()

    events = list(session.send(conv.id, "Tell me about Chile.", SETTINGS))
    assert any(isinstance(e, ToolResultEvent) and e.run.result.ok for e in events)
    assert isinstance(events[-1], ReplyDone) and events[-1].reply.content == ANSWER_1
    first = session.store.get_message(session.last_reply_id)
    assert first.status == "complete" and first.content == ANSWER_1
    assert [m["role"] for m in first.rounds] == ["assistant", "tool", "assistant"]
    assert first.tool_calls[0]["name"] == "country_info"
    assert first.tool_calls[0]["result"]["population"] == 19600000
    turn1_last_prompt = engine.prompts[1]

    events = list(session.send(conv.id, "And its population?", SETTINGS))
    assert isinstance(events[-1], ReplyDone) and events[-1].reply.content == ANSWER_2
    turn2 = qwen_tokenizer.decode(engine.prompts[2])
    # turn 1's tool call and tool result are in turn 2's prompt
    assert "<function=country_info>" in turn2
    assert '"population": 19600000' in turn2
    assert turn2.index("Tell me about Chile.") < turn2.index("19600000") < \
        turn2.index("And its population?")
    # and turn 2 extends what the cache holds: all of turn 1's last round prompt is reused
    # but its generation prompt (the template writes a past turn without the empty think
    # block that opened the reply), so the reused prefix holds the tool call and result
    opener = qwen_tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    assert turn1_last_prompt[-len(opener):] == opener
    assert engine.reused[2] >= len(turn1_last_prompt) - len(opener)
    reused_text = qwen_tokenizer.decode(engine.prompts[2][:engine.reused[2]])
    assert '"population": 19600000' in reused_text
    summary = session.store.get_message(session.last_reply_id).summary
    assert summary["reused_tokens"] == engine.reused[2] > 0


def test_prompt_for_adds_the_system_prompt_once(session):
    store = session.store
    conv = store.new_conversation()
    store.add_message(conv.id, "user", "hi")
    row = store.begin_reply(conv.id, mode="plain")
    assert prompt_for(store, row.id, "Be brief.") == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert prompt_for(store, row.id, "  ") == [{"role": "user", "content": "hi"}]
    conv2 = store.new_conversation(system_prompt="Stored.")
    store.add_message(conv2.id, "user", "hi")
    row2 = store.begin_reply(conv2.id, mode="plain")
    assert prompt_for(store, row2.id, "Be brief.")[0] == {"role": "system",
                                                          "content": "Stored."}


def test_one_round_reply_stores_no_rounds(monkeypatch, session, qwen_tokenizer):
    engine = PrefixEngine(qwen_tokenizer, [ANSWER_1])
    monkeypatch.setattr(reply_mod, "_engine_generate", engine)
    conv = session.store.new_conversation()
    done = list(session.send(conv.id, "Where is Chile?", SETTINGS))[-1].reply
    fields = finish_fields(done)
    assert fields["rounds"] == [] and fields["content"] == ANSWER_1
    row = session.store.get_message(session.last_reply_id)
    assert row.rounds == [] and row.to_prompt_dicts() == [
        {"role": "assistant", "content": ANSWER_1}]


def test_a_message_too_long_for_the_context_is_not_stored(monkeypatch, session,
                                                          qwen_tokenizer):
    """A refused message (too long for the context) stores nothing, so the next turn's prompt
    keeps the earlier exchange instead of leaving it out with the refused message."""
    from app.chat.session import Notice
    from app.engine.errors import PromptTooLongError

    session.target.context_length = 2048  # the tool schema alone takes ~1,400
    engine = PrefixEngine(qwen_tokenizer, [ANSWER_1, ANSWER_2])
    monkeypatch.setattr(reply_mod, "_engine_generate", engine)
    conv = session.store.new_conversation()
    list(session.send(conv.id, "Where is Chile?", SETTINGS))
    before = [(m.role, m.content, m.status) for m in session.store.messages(conv.id)]
    title = session.store.get_conversation(conv.id).title
    with pytest.raises(PromptTooLongError, match="Shorten the message"):
        list(session.send(conv.id, "word " * 3000, SETTINGS))
    assert [(m.role, m.content, m.status) for m in session.store.messages(conv.id)] == before
    assert session.store.get_conversation(conv.id).title == title
    assert len(engine.prompts) == 1  # nothing ran
    events = list(session.send(conv.id, "And its population?", SETTINGS))
    assert not any(isinstance(e, Notice) for e in events)  # nothing left out
    assert "Where is Chile?" in qwen_tokenizer.decode(engine.prompts[1])
    assert events[-1].reply.content == ANSWER_2


def test_send_without_a_store_is_refused():
    with pytest.raises(RuntimeError, match="needs a store"):
        list(ChatSession().send(1, "hi", SETTINGS, threading.Event()))


def test_pair_spec_label_keeps_the_names():
    assert PairSpec("/c/snapshots/ab12cd", repo_id="z-lab/Qwen3.5-4B").label == \
        "z-lab/Qwen3.5-4B"
    assert PairSpec("/m/demo-target", display_name="Demo pair").label == "Demo pair"
    assert PairSpec("/m/demo-target").label == "demo-target"
    assert PairSpec(tiny=True).label == "tiny random pair"


def test_load_keeps_the_repo_id_as_the_name(tiny_root):
    """A cached repo loads from its snapshot folder; the name shown is the repo id, not the
    snapshot's commit hash (the folder name)."""
    from app.models.tiny import build_tiny_pair

    allow_engine_on_current_thread()
    t, d = build_tiny_pair(tiny_root, "qwen3_5", seed=0, block_size=16)
    s = ChatSession()
    info = s.load(PairSpec(str(t), str(d), repo_id="org/tiny-target"))
    try:
        assert info.target_name == "org/tiny-target" and info.spec.repo_id == "org/tiny-target"
        assert info.target_path == str(t) and info.drafter_block_size == 16
        plain = s.load(PairSpec(str(t)))
        assert plain.target_name == t.name and plain.drafter_name is None
    finally:
        s.unload()


def test_scripted_session_counts_what_it_emits():
    """The one scripted session (tests, screenshot, latency bench): its Summary's counts are
    those of its events, and cancel is checked before every cycle."""
    from app.chat.events import ContentDelta, ReasoningDelta, ToolResultEvent
    from app.chat.scripted import ScriptedSession, ScriptedTurn
    from app.engine.events import CycleEvent

    s = ScriptedSession(turns=[ScriptedTurn("a b", "abcdefgh", ("calculator", {"e": 1}, 2))],
                        cycles=None, block=4, chunk_chars=3, accept=lambda c: 2)
    events = list(s.reply([], {"mode": "dflash"}))
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "a b"
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == "abcdefgh"
    (tool,) = [e for e in events if isinstance(e, ToolResultEvent)]
    assert tool.run.result.result == 2
    cycles = [e for e in events if isinstance(e, CycleEvent)]
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    summary = events[-1].summary
    assert len(cycles) == summary.cycles == 3 and len(tokens) == summary.generated_tokens == 9
    assert summary.tau == 3.0 and summary.acceptance_rate == 6 / 9
    cancel = threading.Event()
    cancel.set()
    stopped = list(ScriptedSession(cycles=100).reply([], {"mode": "dflash"}, cancel))
    assert stopped[-1].summary.cycles == 0 and stopped[-1].summary.stop_cause == "cancelled"


def test_dflash_after_dflash2_reuses_the_prefix_on_the_demo_pair():
    """With both demo drafters loaded (as the window loads the demo pair), a DFlash reply after
    a DFlash2 one reuses the conversation's prefix: switching drafters keeps each drafter's
    context (``PromptCache.switch_drafter``). Before, the switch dropped it and the DFlash
    reply prefilled the whole conversation cold (a Compare's DFlash side too)."""
    from app.chat.session import ChatSession, PairSpec
    from app.paths import demo_dflash2_dir, demo_pair_dirs

    t, d = demo_pair_dirs()
    s = ChatSession()
    s.load(PairSpec(target=str(t), drafter=str(d), drafter2=str(demo_dflash2_dir())))
    settings = {"mode": "dflash", "max_tokens": 24, "use_tools": False, "temperature": 0.0}

    def turn(messages, mode):
        events = list(s.reply(messages, {**settings, "mode": mode}))
        done = events[-1]
        assert isinstance(done, ReplyDone)
        return done.reply

    chat = [{"role": "user", "content": "What is the capital of Chile?"}]
    first = turn(chat, "dflash")
    chat = chat + first.messages + [{"role": "user", "content": "And of Peru?"}]
    turn(chat, "dflash2")  # a DFlash2 turn: the DFlash context goes aside
    again = turn(chat, "dflash")  # as a Compare's next side, or the next message in DFlash
    assert again.summary.reused_tokens > 0
    assert s.cache.drafter_len == len(s.cache.ids)



@pytest.mark.parametrize("sides", [[], ["plain", "dflash"]])
def test_dflash2_after_plain_turns_reuses_the_prefix_on_the_demo_pair(sides):
    """With both demo drafters loaded, a DFlash2 reply after plain turns (the user's path: two
    plain questions, then DFlash2) and after a Compare's plain and DFlash sides on the same
    prompt reuses the target's prefix as a plain turn does: plain and DFlash turns keep the
    DFlash2 drafter's context in step too (``PromptCache.keep_context``). Before, it had none
    and the DFlash2 reply prefilled the whole conversation cold. Its tokens are a cold run's."""
    from app.chat.session import ChatSession, PairSpec
    from app.paths import demo_dflash2_dir, demo_pair_dirs

    t, d = demo_pair_dirs()
    spec = PairSpec(target=str(t), drafter=str(d), drafter2=str(demo_dflash2_dir()))
    settings = {"max_tokens": 24, "use_tools": False, "temperature": 0.0}

    def loaded():
        session = ChatSession()
        session.load(spec)
        return session

    def turn(session, messages, mode):
        done = list(session.reply(messages, {**settings, "mode": mode}))[-1]
        assert isinstance(done, ReplyDone)
        return done.reply

    def two_plain_turns(session):
        chat = [{"role": "user", "content": "What is the capital of Chile?"}]
        for question in ("And of Peru?", "And its population?"):
            chat = chat + turn(session, chat, "plain").messages
            chat.append({"role": "user", "content": question})
        return chat

    s = loaded()
    chat = two_plain_turns(s)
    reused = [turn(s, chat, mode).summary.reused_tokens for mode in sides]
    warm = turn(s, chat, "dflash2")
    twin = loaded()  # the same chat with a plain third turn
    plain = turn(twin, two_plain_turns(twin), "plain")
    assert warm.mode == "dflash2"
    assert warm.summary.reused_tokens == (reused[-1] if sides else plain.summary.reused_tokens)
    assert warm.summary.reused_tokens > 0
    assert s.cache.drafter_len == len(s.cache.ids)
    assert warm.tokens == turn(loaded(), chat, "dflash2").tokens == plain.tokens


@pytest.mark.slow  # left to make test (CI): make test-fast stays under 5 minutes
def test_a_compares_sides_start_from_the_same_reused_prefix_on_the_demo_pair():
    """Every side of a Compare prefills as much of the prompt as the first side did, so their
    times to first token compare like with like. Before, the plain side (first) prefilled the
    new turn from the last turn boundary it found, and the DFlash sides resumed from the
    snapshot that plain's prefill had just made: 745 ms against 22 ms to the first token in
    the window, a cache effect shown as a DFlash win (seen in a new-user pass)."""
    from app.chat.session import ChatSession, PairSpec
    from app.chat.storage import Store
    from app.chat.stored_turn import ReplyFinished, TurnRequest, run_turn
    from app.paths import demo_dflash2_dir, demo_pair_dirs

    t, d = demo_pair_dirs()
    store = Store(":memory:")
    s = ChatSession(store)
    s.load(PairSpec(target=str(t), drafter=str(d), drafter2=str(demo_dflash2_dir())))
    settings = {"mode": "dflash", "max_tokens": 200, "use_tools": True, "temperature": 0.0}
    conv = store.new_conversation()

    def turn(text, tags=("",)):
        events = [e.event for e in run_turn(store, s, TurnRequest(conv.id, text, settings,
                                                                     tags=tags))]
        return [e.result for e in events if isinstance(e, ReplyFinished)]

    turn("What is the capital of Chile?")
    sides = turn("What is the currency of Peru?", ("plain", "dflash", "dflash2"))
    assert [r.summary.mode for r in sides] == ["plain", "dflash", "dflash2"]
    assert all(len(r.round_summaries) == 2 for r in sides)  # a tool call, then the answer
    reused = [r.round_summaries[0].reused_tokens for r in sides]
    assert reused[0] > 0 and len(set(reused)) == 1, reused
    assert len({tuple(r.tokens) for r in sides}) == 1
    # a later single reply reuses as before (the cap held for the Compare's sides only)
    after = turn("And its capital?")
    assert after[0].summary.reused_tokens > 0
    store.close()


def test_a_trained_chat_length_leaves_turns_out_and_the_reply_keeps_the_note(
        monkeypatch, session, qwen_tokenizer):
    """A target whose folder states a short trained chat length: the next turn's prompt
    leaves the earlier turn out (the current message is still sent), the reply's first event
    says so, and its row keeps the note."""
    from app.chat.events import Notice
    from app.chat.turns import CONTEXT_KEY, ReplyResult

    engine = PrefixEngine(qwen_tokenizer, [LOOKUP, ANSWER_1, ANSWER_2])
    monkeypatch.setattr(reply_mod, "_engine_generate", engine)
    conv = session.store.new_conversation()
    events = list(session.send(conv.id, "Tell me about Chile.", SETTINGS))
    assert not any(isinstance(e, Notice) for e in events)
    session.target.trained_chat_length = 1  # shorter than any prompt: a soft cap
    events = list(session.send(conv.id, "And its population?", SETTINGS))
    notices = [e for e in events if isinstance(e, Notice)]
    assert events[0] is notices[0] and len(notices) == 1
    assert notices[0].left_out_turns == 1 and notices[0].budget == 1
    assert "the chat length this model was trained on" in notices[0].message
    prompt = qwen_tokenizer.decode(engine.prompts[2])
    assert "Tell me about Chile." not in prompt and "And its population?" in prompt
    row = session.store.get_message(session.last_reply_id)
    assert row.generation[CONTEXT_KEY] == notices[0].to_dict()
    assert ReplyResult.from_row(row).context_note == notices[0]


def test_load_starts_the_kernel_build_before_the_target_loads(monkeypatch, tiny_paths):
    """``ChatSession.load`` hands the target and its drafters to
    ``loader.start_kernel_build`` (which builds only on CUDA) before ``load_target``, so
    that a GPU's kernel build overlaps the load."""
    from app.models import loader

    calls = []
    real_load = loader.load_target
    monkeypatch.setattr(loader, "start_kernel_build",
                        lambda target, *drafters: calls.append(("build", target, *drafters)))
    monkeypatch.setattr(loader, "load_target",
                        lambda path, *a, **k: calls.append(("load", path)) or real_load(path))
    t, d = tiny_paths
    ChatSession().load(PairSpec(str(t), str(d)))
    assert calls == [("build", str(t), str(d), None), ("load", str(t))]

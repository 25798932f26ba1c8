"""Context budgeting: oldest turns are left out, never the system prompt or current message."""

from __future__ import annotations

import jinja2
import pytest

from app.chat.history import (
    ContextOverflowError,
    context_limit,
    fit_for_tokenizer,
    fit_history,
    split_turns,
    template_uses_past_reasoning,
    token_counter,
)


def words(messages: list[dict]) -> int:
    """A stand-in tokenizer: 4 tokens of framing per message, one per word, 3 for the
    generation prompt."""
    return 3 + sum(
        4 + len(m["content"].split()) + len(m.get("reasoning_content", "").split())
        for m in messages
    )


SYSTEM = {"role": "system", "content": "You are helpful."}  # 4 + 3 = 7 tokens
CURRENT = {"role": "user", "content": "current " * 10}  # 14 tokens


def turn(i: int) -> list[dict]:
    """38 tokens without reasoning: user 4+10, assistant 4+20 (+5 of reasoning)."""
    return [
        {"role": "user", "content": f"question{i} " + "q " * 9},
        {"role": "assistant", "content": f"answer{i} " + "a " * 19,
         "reasoning_content": "r " * 5},
    ]


def history(n: int) -> list[dict]:
    return [SYSTEM] + [m for i in range(n) for m in turn(i)] + [CURRENT]


def test_everything_fits():
    msgs = history(3)
    fit = fit_history(msgs, words, limit=10_000)
    assert fit.left_out_turns == 0 and fit.left_out_messages == 0
    assert fit.notice() is None
    assert fit.prompt_tokens == 3 + 7 + 3 * 38 + 14
    # earlier reasoning is not sent back; everything else is unchanged
    assert all("reasoning_content" not in m for m in fit.messages)
    assert [m["content"] for m in fit.messages] == [m["content"] for m in msgs]
    assert "reasoning_content" in msgs[2]  # the input was not modified


@pytest.mark.parametrize(("limit", "reserve", "kept"), [(300, 0, 7), (300, 100, 4), (62, 0, 1)])
def test_oldest_turns_are_left_out_and_counted(limit, reserve, kept):
    fit = fit_history(history(10), words, limit=limit, reserve=reserve)
    fixed = 3 + 7 + 14  # generation prompt + system + current
    assert fixed + kept * 38 <= limit - reserve < fixed + (kept + 1) * 38
    assert fit.left_out_turns == 10 - kept
    assert fit.left_out_messages == 2 * (10 - kept)
    assert fit.prompt_tokens == fixed + kept * 38
    assert fit.messages[0] == SYSTEM
    assert fit.messages[-1] == CURRENT
    # the newest turns are the ones kept, in order
    users = [m["content"].split()[0] for m in fit.messages if m["role"] == "user"][:-1]
    assert users == [f"question{i}" for i in range(10 - kept, 10)]
    notice = fit.notice()
    n = 10 - kept
    assert f"{n} earlier turns were left out" in notice
    # what it counts: this prompt as sent, not the later tool rounds the Prompt figure shows
    assert notice.endswith(f"(the prompt takes {fixed + kept * 38} of the {limit - reserve} "
                           "tokens left for it, before any tool results).")


def test_one_turn_left_out_reads_singular():
    fit = fit_history(history(2), words, limit=3 + 7 + 14 + 38)
    assert fit.left_out_turns == 1
    assert fit.notice().startswith("1 earlier turn was left out")


def test_current_message_too_long_raises_with_figures():
    msgs = [SYSTEM, *turn(0), {"role": "user", "content": "w " * 200}]
    with pytest.raises(ContextOverflowError) as info:
        fit_history(msgs, words, limit=150, reserve=20)
    assert info.value.needed == 3 + 7 + 204
    assert info.value.budget == 130
    assert "214 tokens" in str(info.value) and "130 are available" in str(info.value)
    with pytest.raises(ValueError, match="no room"):
        fit_history(msgs, words, limit=100, reserve=100)


def test_tool_round_trip_stays_with_its_turn_and_current_reasoning_is_kept():
    tool_turn = [
        {"role": "user", "content": "what time"},
        {"role": "assistant", "content": "", "reasoning_content": "use the clock",
         "tool_calls": [{"id": "c0", "type": "function",
                         "function": {"name": "current_time", "arguments": {}}}]},
        {"role": "tool", "content": "12:00", "tool_call_id": "c0"},
        {"role": "assistant", "content": "It is noon."},
    ]
    current = [
        {"role": "user", "content": "and in Tokyo"},
        {"role": "assistant", "content": "", "reasoning_content": "call it again",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "current_time", "arguments": {}}}]},
        {"role": "tool", "content": "21:00", "tool_call_id": "c1"},
    ]
    msgs = [SYSTEM, *tool_turn, *turn(1), *current]
    system, turns, cur = split_turns(msgs)
    assert system == [SYSTEM] and cur == current
    assert [len(t) for t in turns] == [4, 2]

    fit = fit_history(msgs, words, limit=words([SYSTEM, *turn(1), *current]) + 1)
    assert fit.left_out_turns == 1 and fit.left_out_messages == 4
    assert fit.messages[-2]["reasoning_content"] == "call it again"  # current turn: kept
    assert "reasoning_content" not in fit.messages[2]  # earlier turn: dropped

    kept = fit_history(msgs, words, limit=10_000, keep_reasoning=True)
    assert kept.messages[2]["reasoning_content"] == "use the clock"


def test_no_system_prompt_and_no_user_message():
    msgs = [*turn(0), *turn(1), CURRENT]
    fit = fit_history(msgs, words, limit=3 + 38 + 14)
    assert fit.left_out_turns == 1
    assert fit.messages[0]["content"].startswith("question1")
    only_assistant = [{"role": "assistant", "content": "hello"}]
    assert split_turns(only_assistant) == ([], [], only_assistant)


def test_context_limit_takes_the_smaller():
    assert context_limit(262_144, 8192) == 8192
    assert context_limit(4096, None) == 4096
    assert context_limit(4096, 0) == 4096
    with pytest.raises(ValueError, match="no context limit"):
        context_limit(None, None)


def test_real_tokenizer_counts_and_trims_minimally(qwen_tokenizer):
    count = token_counter(qwen_tokenizer, enable_thinking=False)
    msgs = [
        {"role": "system", "content": "You are terse."},
        *[m for i in range(6) for m in (
            {"role": "user", "content": f"The capital of France is Paris? ({i})"},
            {"role": "assistant", "content": "Yes, and it uses the euro.",
             "reasoning_content": "Let me think about this step by step."},
        )],
        {"role": "user", "content": "Hello world! How are you?"},
    ]
    # the counter agrees with tokenizing the rendered text
    text = qwen_tokenizer.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert count(msgs) == len(qwen_tokenizer.encode(text, add_special_tokens=False))

    full = count(msgs)
    limit = full // 2
    fit = fit_history(msgs, count, limit=limit)
    assert 0 < fit.left_out_turns < 6
    assert fit.prompt_tokens == count(fit.messages) <= limit
    # leaving out one turn fewer would not have fit
    system, turns, current = split_turns(msgs)
    one_more = system + [
        {k: v for k, v in m.items() if k != "reasoning_content"}
        for t in turns[fit.left_out_turns - 1:] for m in t
    ] + current
    assert count(one_more) > limit
    assert fit.messages[0]["content"] == "You are terse."
    assert fit.messages[-1]["content"] == "Hello world! How are you?"


def test_template_probe(qwen_tokenizer):
    def project(messages):
        return qwen_tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    # resources/chat_template.jinja shows reasoning only after the last user message
    assert template_uses_past_reasoning(project) is False
    everything = jinja2.Template(
        "{% for m in messages %}{{ m.content }}{{ m.reasoning_content or '' }}{% endfor %}"
    )
    assert template_uses_past_reasoning(lambda m: everything.render(messages=m)) is True

    def broken(messages):
        raise jinja2.TemplateError("no")

    assert template_uses_past_reasoning(broken) is False


def test_fit_for_tokenizer_leaves_out_old_turns_and_their_reasoning(qwen_tokenizer):
    msgs = [
        {"role": "user", "content": "Hello world! " * 20},
        {"role": "assistant", "content": "Paris.", "reasoning_content": "step by step"},
        {"role": "user", "content": "How are you?"},
        {"role": "assistant", "content": "Fine.", "reasoning_content": "The weather is nice"},
        {"role": "user", "content": "And today?"},
    ]
    roomy = fit_for_tokenizer(msgs, qwen_tokenizer, 100_000, enable_thinking=False)
    assert roomy.left_out_turns == 0
    assert all("reasoning_content" not in m for m in roomy.messages)
    rendered = qwen_tokenizer.apply_chat_template(
        roomy.messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert rendered.count("Hello world!") == 20 and "step by step" not in rendered

    # room for the last two turns only: the long first turn goes
    tight = roomy.prompt_tokens - 1
    fit = fit_for_tokenizer(msgs, qwen_tokenizer, tight + 50, reserve=50, enable_thinking=False)
    assert fit.left_out_turns == 1 and fit.left_out_messages == 2
    assert [m["content"] for m in fit.messages] == ["How are you?", "Fine.", "And today?"]
    assert fit.prompt_tokens <= tight


def tool_turn(i: int) -> list[dict]:
    """A turn with one tool round: user 4+2, the call 4+0, a long result 4+30, answer 4+3."""
    return [
        {"role": "user", "content": f"lookup{i} please"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": f"c{i}", "type": "function",
                         "function": {"name": "country_info", "arguments": {}}}]},
        {"role": "tool", "content": f"result{i} " + "field " * 29, "tool_call_id": f"c{i}"},
        {"role": "assistant", "content": f"answer{i} is here"},
    ]


def test_old_tool_results_are_shortened_before_any_turn_is_left_out():
    from app.chat.history import SHORTENED_MARK, TOOL_RESULT_KEEP_CHARS

    msgs = [SYSTEM, *tool_turn(0), *tool_turn(1), *tool_turn(2), CURRENT]
    full = words(msgs)
    short_words = len(("result0 " + "field " * 29)[:TOOL_RESULT_KEEP_CHARS].split()) + \
        len(SHORTENED_MARK.split())
    saved = 30 - short_words  # words one shortened result saves
    assert saved > 10
    # room for everything but one result's savings: the oldest turn's result is cut
    fit = fit_history(msgs, words, limit=full - 1)
    assert fit.left_out_turns == 0 and fit.shortened_turns == 1
    results = [m["content"] for m in fit.messages if m["role"] == "tool"]
    assert results[0].startswith("result0 field") and results[0].endswith(SHORTENED_MARK)
    assert results[1] == msgs[7]["content"] and results[2] == msgs[11]["content"]
    assert fit.prompt_tokens == full - saved
    assert "the tool results of 1 earlier turn were shortened" in fit.notice()
    assert "left out" not in fit.notice()
    # two results' worth: the two oldest are cut, every call keeps a result
    fit = fit_history(msgs, words, limit=full - saved - 1)
    assert (fit.left_out_turns, fit.shortened_turns) == (0, 2)
    assert sum(m["role"] == "tool" for m in fit.messages) == 3
    # with every result cut still too long: the oldest turn goes, the rest stay cut
    all_cut = full - 3 * saved
    fit = fit_history(msgs, words, limit=all_cut - 1)
    assert (fit.left_out_turns, fit.left_out_messages, fit.shortened_turns) == (1, 4, 2)
    assert fit.prompt_tokens == all_cut - (4 + 2 + 4 + 4 + short_words + 4 + 3)
    assert all(m["content"].endswith(SHORTENED_MARK)
               for m in fit.messages if m["role"] == "tool")
    assert fit.notice().startswith("1 earlier turn was left out of the prompt and the tool "
                                   "results of 2 earlier turns were shortened to fit")
    assert msgs[3]["content"] == "result0 " + "field " * 29  # the input is not changed


def test_shown_reasoning_goes_before_tool_results():
    msgs = [SYSTEM, *turn(0), *tool_turn(1), CURRENT]
    with_reasoning = words(msgs)
    fit = fit_history(msgs, words, limit=with_reasoning - 1, keep_reasoning=True)
    assert fit.dropped_reasoning and fit.shortened_turns == 0 and fit.left_out_turns == 0
    assert fit.prompt_tokens == with_reasoning - 5
    assert fit.notice() is None  # nothing the user wrote or saw in a result is missing


def test_a_trained_chat_length_caps_the_budget_softly():
    msgs = history(10)
    fixed = 3 + 7 + 14
    fit = fit_history(msgs, words, limit=10_000, trained=fixed + 3 * 38)
    assert fit.left_out_turns == 7 and fit.budget == fixed + 3 * 38 and fit.trained_cap
    assert "to fit the chat length this model was trained on" in fit.notice()
    # a cap above the context's room changes nothing
    roomy = fit_history(msgs, words, limit=300, trained=10_000)
    assert roomy.left_out_turns == fit_history(msgs, words, limit=300).left_out_turns
    assert not roomy.trained_cap and roomy.budget == 300
    # a current message longer than the cap is still sent, alone, when the context holds it
    long = [SYSTEM, *turn(0), {"role": "user", "content": "w " * 100}]
    fit = fit_history(long, words, limit=10_000, trained=50)
    assert fit.left_out_turns == 1 and fit.prompt_tokens == 3 + 7 + 104 > fit.budget
    with pytest.raises(ContextOverflowError):
        fit_history(long, words, limit=100, trained=50)


def test_a_growing_chat_leaves_turns_out_in_steps_so_its_start_holds():
    """With ``step=LEAVE_OUT_STEP`` the number of turns left out is a multiple of it (or every
    turn), never fewer than needed, so a chat growing by one turn changes its prompt's start
    at most every other turn; with the default every turn once the limit is reached."""
    from app.chat.history import LEAVE_OUT_STEP

    assert LEAVE_OUT_STEP == 2
    limit = 3 + 7 + 14 + 3 * 38
    stepped, fewest = [], []
    for n in range(3, 12):
        msgs = history(n)
        fit = fit_history(msgs, words, limit=limit, step=LEAVE_OUT_STEP)
        least = fit_history(msgs, words, limit=limit)
        assert fit.prompt_tokens <= limit
        assert fit.left_out_turns >= least.left_out_turns
        assert fit.left_out_turns % LEAVE_OUT_STEP == 0 or fit.left_out_turns == n
        stepped.append(fit.left_out_turns)
        fewest.append(least.left_out_turns)
    changes = sum(a != b for a, b in zip(stepped, stepped[1:]))
    assert changes < sum(a != b for a, b in zip(fewest, fewest[1:]))
    assert stepped[-1] > 0

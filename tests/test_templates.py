"""render_prompt through mlx-lm's TokenizerWrapper and the project's chat template."""

from __future__ import annotations

import pytest

from app.chat.templates import ChatTemplateError, opens_reasoning, render_prompt
from app.engine.errors import EngineError

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate arithmetic.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


def test_thinking_on_preopens_think(qwen_tokenizer):
    r = render_prompt(qwen_tokenizer, [{"role": "user", "content": "hi 東京"}])
    assert r.text == "<|im_start|>user\nhi 東京<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert r.starts_in_reasoning is True
    assert qwen_tokenizer.decode(r.ids) == r.text
    assert r.ids[0] == qwen_tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_thinking_off_closes_think(qwen_tokenizer):
    r = render_prompt(qwen_tokenizer, [{"role": "user", "content": "hi"}], enable_thinking=False)
    assert r.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert r.starts_in_reasoning is False


def test_system_and_tools_are_rendered(qwen_tokenizer):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "17*23?"}]
    r = render_prompt(qwen_tokenizer, msgs, tools=[CALC])
    flat = r.text.replace("\n", "")
    assert flat.startswith("<|im_start|>systemBe brief.# Tools")
    assert '"name": "calculator"' in r.text
    assert "<tools>" in r.text and "</tools>" in r.text


def test_tool_round_trip_history(qwen_tokenizer):
    msgs = [
        {"role": "user", "content": "17*23?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "use the tool",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": {"expression": "17*23"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": '{"ok": true, "result": 391}'},
    ]
    r = render_prompt(qwen_tokenizer, msgs, tools=[CALC])
    # Compared without newlines: the template's exact line breaks are its own business.
    flat = r.text.replace("\n", "")
    assert (
        "<|im_start|>assistant<think>use the tool</think><tool_call><function=calculator>"
        "<parameter=expression>17*23</parameter></function></tool_call><|im_end|>" in flat
    )
    assert (
        '<|im_start|>user<tool_response>{"ok": true, "result": 391}</tool_response>'
        "<|im_end|><|im_start|>assistant<think>" in flat
    )
    assert flat.endswith("<|im_start|>assistant<think>")
    assert r.starts_in_reasoning


@pytest.mark.parametrize(
    "messages, match",
    [
        ([], "non-empty"),
        ([{"content": "x"}], "message 0"),
        ([{"role": "robot", "content": "x"}], "role 'robot'"),
    ],
)
def test_bad_messages_raise_typed_error(qwen_tokenizer, messages, match):
    with pytest.raises(ChatTemplateError, match=match):
        render_prompt(qwen_tokenizer, messages)
    assert issubclass(ChatTemplateError, EngineError)


@pytest.mark.parametrize("messages, tools, where", [
    ([{"role": "user", "content": "\ud800 hi"}], None, "messages[0].content"),
    ([{"role": "user", "content": "caf\udce9"}], None, "messages[0].content"),
    ([{"role": "system", "content": "ok"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "calculator", "arguments": {
            "expression": "1+\udfff"}}}]}], None,
     "messages[1].tool_calls[0].function.arguments.expression"),
    ([{"role": "user", "content": "hi"}], [{**CALC, "function": {
        **CALC["function"], "description": "bad \ud800"}}], "tools[0].function.description"),
])
def test_text_that_is_not_utf8_is_a_typed_error_naming_the_field(qwen_tokenizer, messages,
                                                                  tools, where):
    """A lone surrogate (a JSON ``\\ud800`` escape, or a command-line argument's byte that is
    not UTF-8) made the tokenizer raise a bare ``TypeError: TextEncodeInput must be
    Union[...]``: the window, the CLI and the server saw a traceback. It is a
    ChatTemplateError naming the field now."""
    with pytest.raises(ChatTemplateError) as exc:
        render_prompt(qwen_tokenizer, messages, tools=tools)
    assert str(exc.value).startswith(f"{where} is not valid UTF-8 text: it holds a lone "
                                     "surrogate (U+")


def test_lone_surrogates_are_found_and_named():
    from app.chat.templates import invalid_text, lone_surrogate

    assert lone_surrogate("naïve 東京 🙂") is None
    assert lone_surrogate("ab\udcffc") == 2
    assert invalid_text({"a": ["ok", {"b": "x\ud800"}]}, "body") == (
        "body.a[1].b", "body.a[1].b is not valid UTF-8 text: it holds a lone surrogate "
        "(U+D800) at character 2")
    assert invalid_text({"\ud800": 1}, "kw")[0] == "kw"
    assert invalid_text({"a": [1, None, "fine"]}, "body") is None


def _tokenizer_with_config(src, dst, extra: dict):
    import json
    import shutil

    from mlx_lm.tokenizer_utils import load

    shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", **extra}
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    return load(dst)


def test_template_failure_is_wrapped(qwen_tokenizer_dir, tmp_path):
    tok = _tokenizer_with_config(
        qwen_tokenizer_dir, tmp_path, {"chat_template": "{{ raise_exception('no tools here') }}"}
    )
    with pytest.raises(ChatTemplateError, match="chat template failed.*no tools here"):
        render_prompt(tok, [{"role": "user", "content": "hi"}])


def test_no_template_is_a_clear_error(qwen_tokenizer_dir, tmp_path):
    tok = _tokenizer_with_config(qwen_tokenizer_dir, tmp_path, {})
    with pytest.raises(ChatTemplateError, match="no chat template"):
        render_prompt(tok, [{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<|im_start|>assistant\n<think>\n", True),
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),
        ("<|im_start|>assistant\n<think>\nold</think>x<|im_start|>assistant\n", False),
        ("<|im_start|>user\n<think><|im_end|>\n<|im_start|>assistant\n", False),
        ("plain text", False),
    ],
)
def test_opens_reasoning(text, expected):
    assert opens_reasoning(text, "<think>", "</think>") is expected
    assert opens_reasoning(text, None, None) is False

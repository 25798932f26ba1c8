"""The server's request checking and response shapes, without a model or HTTP
(``app.serve.protocol``)."""

from __future__ import annotations

import json

import pytest

from app.engine.events import Summary
from app.serve.protocol import (
    ApiError,
    CompletionResult,
    chunk_object,
    completion_object,
    parse_chat_request,
    parse_messages,
    sse,
    usage_object,
)

USER = {"role": "user", "content": "hi"}


def _error(body) -> ApiError:
    with pytest.raises(ApiError) as exc:
        parse_chat_request(body)
    return exc.value


def test_messages_become_chat_template_messages():
    msgs = parse_messages([
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What time "},
                                     {"type": "text", "text": "is it?"}]},
        {"role": "assistant", "content": None, "reasoning_content": "I call the clock.",
         "tool_calls": [{"id": "call_x_0", "type": "function", "function": {
             "name": "current_time", "arguments": "{\"timezone\": \"UTC\"}"}}]},
        {"role": "tool", "tool_call_id": "call_x_0", "content": "{\"ok\": true}"},
    ])
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    assert msgs[1] == {"role": "user", "content": "What time is it?"}
    assert msgs[2] == {"role": "assistant", "content": "", "reasoning_content":
                       "I call the clock.", "tool_calls": [
                           {"id": "call_x_0", "type": "function", "function": {
                               "name": "current_time", "arguments": {"timezone": "UTC"}}}]}
    assert msgs[3] == {"role": "tool", "tool_call_id": "call_x_0", "name": "current_time",
                       "content": "{\"ok\": true}"}


def test_fields_are_typed_with_the_apps_ranges():
    req = parse_chat_request({
        "messages": [USER], "stream": True, "stream_options": {"include_usage": True},
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
        "repetition_penalty": 1.0, "seed": -1, "stop": "END", "max_tokens": 10,
        "max_completion_tokens": 20, "mode": "plain", "block_size": 4,
        "chat_template_kwargs": {"enable_thinking": False}, "user": "someone",
        "parallel_tool_calls": True, "presence_penalty": 0})
    assert req.stream and req.include_usage and req.mode == "plain" and req.block_size == 4
    assert req.max_tokens == 20  # max_completion_tokens wins, as OpenAI's newer name
    assert req.stop == ["END"] and req.enable_thinking is False
    s = req.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p) == (0.7, 0.9, 40, 0.05)
    assert s.repetition_penalty is None and s.seed is None  # 1 and -1 mean off
    default = parse_chat_request({"messages": [USER]})
    assert default.sampling.greedy and default.mode is None and default.tools is None


@pytest.mark.parametrize("change, param, words", [
    ({"temperature": 2.5}, "temperature", "between 0 and 2"),
    ({"temperature": True}, "temperature", "must be a number"),
    ({"top_k": 1.5}, "top_k", "whole number"),
    ({"seed": -5}, "seed", "out of range"),
    ({"stop": [1]}, "stop", "list of strings"),
    ({"stop": ["x"] * 17}, "stop", "at most 16"),
    ({"block_size": 0}, "block_size", "at least 1"),
    ({"block_size": "fast"}, "block_size", 'at least 1 or "auto", got "fast"'),
    ({"block_size": "16"}, "block_size", 'or "auto"'),
    ({"max_tokens": 2.0}, "max_tokens", "whole number"),
    ({"logprobs": True}, "logprobs", "not supported"),
    ({"frequency_penalty": 0.5}, "frequency_penalty", "repetition_penalty"),
    ({"response_format": {"type": "json_object"}}, "response_format", "text"),
    ({"chat_template_kwargs": {"add_vision_id": True}}, "chat_template_kwargs", "only"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}},
      "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice", "not among"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "missing"),
])
def test_bad_fields_name_themselves(change, param, words):
    error = _error({"messages": [USER], **change})
    assert error.status == 400 and error.param == param and words in error.message
    assert error.body() == {"error": {"message": error.message, "type": "invalid_request_error",
                                      "param": param, "code": error.code}}


BAD = "\ud800 hi"
"""Text with a lone surrogate: what a JSON ``"\\ud800 hi"`` decodes to."""


@pytest.mark.parametrize("change, param", [
    ({"messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "ok"},
                                                {"type": "text", "text": BAD}]}]},
     "messages[0].content[1].text"),
    ({"messages": [USER, {"role": "assistant", "content": None, "reasoning_content": BAD}]},
     "messages[1].reasoning_content"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [{"id": "c", "function": {
        "name": "f", "arguments": json.dumps({"x": BAD})}}]}]},
     "messages[1].tool_calls[0].function.arguments.x"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [{"id": "c", "function": {
        "name": "f", "arguments": '{"x": "\\ud800"}'}}]}]},  # escaped inside the string
     "messages[1].tool_calls[0].function.arguments.x"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [{"id": "c", "function": {
        "name": "f" + BAD, "arguments": "{}"}}]}]}, "messages[1].tool_calls[0].function.name"),
    ({"messages": [USER, {"role": "tool", "tool_call_id": "c", "name": BAD, "content": "1"}]},
     "messages[1].name"),
    ({"messages": [USER, {"role": "tool", "tool_call_id": BAD, "content": "1"}]},
     "messages[1].tool_call_id"),
    ({"messages": [USER, {"role": "tool", "tool_call_id": "c", "content": BAD}]},
     "messages[1].content"),
    ({"stop": BAD}, "stop"),
    ({"stop": ["ok", BAD]}, "stop[1]"),
    ({"model": BAD}, "model"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": BAD}}]},
     "tools[0].function.description"),
    ({"chat_template_kwargs": {BAD: True}}, "chat_template_kwargs"),
])
def test_text_that_is_not_utf8_is_refused_naming_its_field(change, param):
    """A JSON-escaped lone surrogate (``"\\ud800"``) decodes to text the tokenizer cannot
    take: the server answered 500 (an AssertionError in the handler). It is a 400 naming
    the field now."""
    error = _error({"messages": [USER], **change})
    assert error.status == 400 and error.param == param, (error.param, error.message)
    assert error.body()["error"]["type"] == "invalid_request_error"
    assert "is not valid UTF-8 text: it holds a lone surrogate (U+D800)" in error.message
    json.dumps(error.body(), ensure_ascii=False).encode("utf-8")  # the body can be sent


def test_block_size_auto_sets_the_automatic_block_size():
    req = parse_chat_request({"messages": [USER], "block_size": "auto"})
    assert req.auto_block and req.block_size is None  # the largest block: the drafter's
    fixed = parse_chat_request({"messages": [USER], "block_size": 8})
    assert not fixed.auto_block and fixed.block_size == 8
    assert not parse_chat_request({"messages": [USER]}).auto_block
    for spelled in ("AUTO", " Auto "):  # as the CLI's --block-size takes it
        assert parse_chat_request({"messages": [USER], "block_size": spelled}).auto_block


def test_the_dflash_object_says_whether_auto_ran():
    assert completion_object(_result(), "chatcmpl-x", "m")["dflash"]["auto_block"] is False
    auto = _result(summary=Summary(mode="dflash", auto_block=True, cycles=3,
                                   block_lengths=[16, 1, 6]))
    assert completion_object(auto, "chatcmpl-x", "m")["dflash"]["auto_block"] is True
    assert completion_object(auto, "chatcmpl-x", "m")["dflash"]["block_lengths"] == [16, 1, 6]


def test_tool_choice_shows_all_none_or_one_tool():
    tools = [{"type": "function", "function": {"name": n, "parameters": {}}}
             for n in ("a", "b")]
    assert parse_chat_request({"messages": [USER], "tools": tools}).tools == tools
    assert parse_chat_request({"messages": [USER], "tools": tools,
                               "tool_choice": "none"}).tools is None
    one = parse_chat_request({"messages": [USER], "tools": tools, "tool_choice": {
        "type": "function", "function": {"name": "b"}}})
    assert one.tools == tools[1:]


@pytest.mark.parametrize("name", ["bad name!", "", "x" * 65, "caf\u00e9", "a/b", "f()"])
def test_a_tool_name_outside_openais_rule_is_a_400_naming_it(name):
    """The server took `"bad name!"` (the CLI's tool files refuse it): OpenAI's rule,
    letters, digits, '_' and '-', 1 to 64, with '.' and ':' as tool bridges use them."""
    tools = [{"type": "function", "function": {"name": "ok_1", "parameters": {}}},
             {"type": "function", "function": {"name": name, "parameters": {}}}]
    err = _error({"messages": [USER], "tools": tools})
    assert err.status == 400
    assert err.param == ("tools[1]" if name == "" else "tools[1].function.name")


def test_tool_names_inside_openais_rule_are_taken():
    tools = [{"type": "function", "function": {"name": n, "parameters": {}}}
             for n in ("get-weather", "_x", "9lives", "a" * 64, "github.search", "mcp:fetch")]
    assert parse_chat_request({"messages": [USER], "tools": tools}).tools == tools


def _result(**kw) -> CompletionResult:
    summary = Summary(mode="dflash", prompt_tokens=100, reused_tokens=90, generated_tokens=12,
                      ttft_s=0.05, tok_per_s=200.0, cycles=2, drafted=15, accepted=10,
                      acceptance_rate=10 / 15, tau=5.5, replays=1, stop_cause="end_token")
    base = dict(content="", reasoning="Thinking.", tool_calls=[
        ("call_0", "calculator", {"expression": "2+2"})], finish_reason="tool_calls",
        summary=summary, block_size=16, completion_tokens=12, reasoning_tokens=4)
    return CompletionResult(**{**base, **kw})


def test_a_completion_carries_tool_calls_usage_and_the_dflash_figures():
    obj = completion_object(_result(), "chatcmpl-00112233445566778899aabb", "demo", created=7)
    message = obj["choices"][0]["message"]
    assert message["content"] is None and message["reasoning_content"] == "Thinking."
    (call,) = message["tool_calls"]
    assert call == {"id": "call_66778899aabb_0", "type": "function", "function": {"name": "calculator",
                                                     "arguments": "{\"expression\": \"2+2\"}"}}
    assert json.loads(call["function"]["arguments"]) == {"expression": "2+2"}
    assert obj["choices"][0]["finish_reason"] == "tool_calls"
    assert obj["usage"] == {"prompt_tokens": 100, "completion_tokens": 12, "total_tokens": 112,
                            "prompt_tokens_details": {"cached_tokens": 90},
                            "completion_tokens_details": {"reasoning_tokens": 4}}
    figures = obj["dflash"]
    for key in ("mode", "block_size", "tau", "acceptance_rate", "drafted", "accepted",
                "replays", "tok_per_s", "ttft_s", "prompt_tokens", "reused_tokens"):
        assert key in figures
    assert (figures["mode"], figures["block_size"], figures["tau"], figures["drafted"],
            figures["accepted"], figures["reused_tokens"]) == ("dflash", 16, 5.5, 15, 10, 90)


def test_usage_says_how_many_completion_tokens_were_reasoning():
    """``usage.completion_tokens_details.reasoning_tokens``, as OpenAI, vLLM and llama.cpp
    give it: the reply's tokens inside its thinking block (0 without one), in the
    non-streamed object and the ``include_usage`` chunk alike."""
    thought = _result(reasoning_tokens=9, completion_tokens=12)
    assert usage_object(thought)["completion_tokens_details"] == {"reasoning_tokens": 9}
    plain = _result(reasoning="", reasoning_tokens=0)
    assert usage_object(plain)["completion_tokens_details"] == {"reasoning_tokens": 0}
    assert completion_object(thought, "chatcmpl-x", "m")["usage"] == usage_object(thought)
    # the fields that were there keep their names and values
    assert {k: v for k, v in usage_object(thought).items()
            if k != "completion_tokens_details"} == {
        "prompt_tokens": 100, "completion_tokens": 12, "total_tokens": 112,
        "prompt_tokens_details": {"cached_tokens": 90}}


def test_a_cancelled_reply_finishes_as_stop_with_its_cause_kept():
    summary = Summary(mode="plain", stop_cause="cancelled", generated_tokens=3)
    obj = completion_object(_result(tool_calls=[], content="Hel", finish_reason="cancelled",
                                    summary=summary, block_size=None), "chatcmpl-x", "m")
    assert obj["choices"][0]["finish_reason"] == "stop"
    assert obj["choices"][0]["message"]["content"] == "Hel"
    assert obj["dflash"]["stop_cause"] == "cancelled" and obj["dflash"]["block_size"] is None


def test_stream_chunks_and_events():
    chunk = chunk_object("chatcmpl-1", "m", 5, {"content": "é"})
    assert chunk["choices"] == [{"index": 0, "delta": {"content": "é"}, "logprobs": None,
                                 "finish_reason": None}]
    assert chunk_object("chatcmpl-1", "m", 5, None, usage={})["choices"] == []
    assert sse(chunk) == ("data: " + json.dumps(chunk, ensure_ascii=False) + "\n\n").encode()
    assert sse("[DONE]") == b"data: [DONE]\n\n"

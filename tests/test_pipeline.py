"""The text pipeline: token ids from a real byte-level BPE tokenizer (Qwen special tokens),
fed at every chunk boundary and at seeded random chunkings, with tags and multi-byte
characters split across tokens."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest
from mlx_lm.tokenizer_utils import _byte_decoder

from app.chat.pipeline import (
    ContentDelta,
    Delta,
    PipelineWarning,
    ReasoningDelta,
    StopStringHit,
    TextPipeline,
    ToolCall,
    ToolCallDelta,
    finish_reason_for,
)


@dataclass
class PipelineResult:
    """Everything :func:`run_pipeline` collected."""

    deltas: list[Delta] = field(default_factory=list)
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    warnings: list[PipelineWarning] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_hit: str | None = None


def run_pipeline(
    tokenizer, chunks: Iterable[Iterable[int]], stop_cause: str = "end_token", **kwargs
) -> PipelineResult:
    """Feed ``chunks`` of token ids through a new :class:`TextPipeline` (``kwargs`` go to its
    constructor), stopping early on a stop string or end token, then finish it with
    ``stop_cause``; returns the collected :class:`PipelineResult`."""
    pipe = TextPipeline(tokenizer, **kwargs)
    deltas: list[Delta] = []
    for chunk in chunks:
        deltas += pipe.feed(chunk)
        if pipe.stopped:
            break
    deltas += pipe.finish("cancelled" if pipe.stop_hit else stop_cause)
    return PipelineResult(
        deltas=deltas,
        content=pipe.content,
        reasoning=pipe.reasoning,
        tool_calls=list(pipe.tool_calls),
        warnings=list(pipe.warnings),
        tokens=list(pipe.tokens),
        text=pipe.text,
        finish_reason=pipe.finish_reason,
        stop_hit=pipe.stop_hit,
    )

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_note",
            "description": "d",
            "parameters": {
                "type": "object",
                "properties": {"body": {"type": "string"}, "count": {"type": "integer"}},
            },
        },
    }
]

XML_TWO_CALLS = (
    "I'll check both.\n<tool_call>\n<function=calculator>\n<parameter=expression>\n17*23\n"
    "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=write_note>\n"
    '<parameter=body>\nline one\nline two: {"k": [1, 2]}\n</parameter>\n<parameter=count>\n3\n'
    "</parameter>\n</function>\n</tool_call>"
)
JSON_CALL = (
    '<tool_call>\n{"name": "lookup", "arguments": {"query": {"city": "東京", '
    '"tags": ["a", {"b": null}]}}}\n</tool_call>'
)
NESTED = {"query": {"city": "東京", "tags": ["a", {"b": None}]}}

# name, generated text, end token appended, pipeline kwargs, engine stop cause, expected
CASES = [
    (
        "preopened_think",
        "Let me think: 2+2.\nIt is 4.\n</think>\n\nThe answer is 4.",
        True,
        {"starts_in_reasoning": True},
        "end_token",
        dict(reasoning="Let me think: 2+2.\nIt is 4.", content="The answer is 4.", calls=[],
             finish="stop", warnings=[]),
    ),
    (
        "think_in_output_literal_tool_call",
        "<think>\nHmm, a literal <tool_call> here stays.\n</think>\n\nDone 🙂.",
        True,
        {},
        "end_token",
        dict(reasoning="Hmm, a literal <tool_call> here stays.", content="Done 🙂.", calls=[],
             finish="stop", warnings=[]),
    ),
    (
        "xml_two_calls",
        XML_TWO_CALLS,
        True,
        {"tools": TOOLS},
        "end_token",
        dict(reasoning="", content="I'll check both.",
             calls=[("call_0", "calculator", {"expression": "17*23"}),
                    ("call_1", "write_note",
                     {"body": 'line one\nline two: {"k": [1, 2]}', "count": 3})],
             finish="tool_calls", warnings=[]),
    ),
    (
        "compact_xml_call_as_the_template_renders_it",
        "<tool_call>\n<function=calculator><parameter=expression>\nsqrt(16) + 2\n</parameter>"
        "</function>\n</tool_call>",
        True,
        {},
        "end_token",
        dict(reasoning="", content="",
             calls=[("call_0", "calculator", {"expression": "sqrt(16) + 2"})],
             finish="tool_calls", warnings=[]),
    ),
    (
        "json_call_override",
        JSON_CALL,
        True,
        {"tool_parser": "json_tools"},
        "end_token",
        dict(reasoning="", content="", calls=[("call_0", "lookup", NESTED)],
             finish="tool_calls", warnings=[]),
    ),
    (
        "json_call_inferred_parser_fallback",
        "<think>\nuse lookup\n</think>\n\n" + JSON_CALL,
        True,
        {},
        "end_token",
        dict(reasoning="use lookup", content="", calls=[("call_0", "lookup", NESTED)],
             finish="tool_calls", warnings=[]),
    ),
    (
        "unclosed_call",
        "Try: <tool_call>\n<function=calculator>\n<parameter=expression>\n1+1",
        True,
        {},
        "end_token",
        dict(reasoning="",
             content="Try: <tool_call>\n<function=calculator>\n<parameter=expression>\n1+1",
             calls=[], finish="stop", warnings=["malformed_tool_call"]),
    ),
    (
        "unclosed_call_with_a_complete_body",
        "Try: <tool_call>\n<function=calculator>\n<parameter=expression>\n1+1\n</parameter>\n"
        "</function>",
        True,
        {},
        "end_token",
        dict(reasoning="", content="Try:", calls=[("call_0", "calculator",
                                                    {"expression": "1+1"})],
             finish="tool_calls", warnings=["unclosed_tool_call"]),
    ),
    (
        "invalid_json_call",
        '<tool_call>\n{"name": "x", "arguments": {oops}\n</tool_call>\nSorry.',
        True,
        {"tool_parser": "json_tools"},
        "end_token",
        dict(reasoning="",
             content='<tool_call>\n{"name": "x", "arguments": {oops}\n</tool_call>\nSorry.',
             calls=[], finish="stop", warnings=["malformed_tool_call"]),
    ),
    (
        "unclosed_parameter",
        "<tool_call>\n<function=calculator>\n<parameter=expression>\n1+1\n</function>\n</tool_call>",
        True,
        {},
        "end_token",
        dict(reasoning="",
             content="<tool_call>\n<function=calculator>\n<parameter=expression>\n1+1\n"
             "</function>\n</tool_call>",
             calls=[], finish="stop", warnings=["malformed_tool_call"]),
    ),
    (
        "stop_string",
        "Paris is the capital.\nEND-OF-ANSWER\nmore text",
        False,
        {"stop": ["END-OF"]},
        "length",
        dict(reasoning="", content="Paris is the capital.", calls=[], finish="stop",
             warnings=[]),
    ),
    (
        "stop_string_cjk",
        "東京と北京と上海",
        False,
        {"stop": ["北京"]},
        "length",
        dict(reasoning="", content="東京と", calls=[], finish="stop", warnings=[]),
    ),
    (
        "stop_prefix_flushed_at_end",
        "The end is nigh END-O",
        True,
        {"stop": ["END-OF"]},
        "end_token",
        dict(reasoning="", content="The end is nigh END-O", calls=[], finish="stop",
             warnings=[]),
    ),
    (
        "emoji_cjk_length",
        "Café 東京 🙂🎉 naïve",
        False,
        {},
        "length",
        dict(reasoning="", content="Café 東京 🙂🎉 naïve", calls=[], finish="length",
             warnings=[]),
    ),
]


def natural_ids(tok, text: str) -> list[int]:
    """The tokenizer's own encoding (tags are single special tokens)."""
    return tok.encode(text, add_special_tokens=False)


def byte_ids(tok, text: str) -> list[int]:
    """One token per UTF-8 byte: every tag and every multi-byte character is split."""
    enc = {b: c for c, b in _byte_decoder().items()}
    ids = [tok.convert_tokens_to_ids(enc[b]) for b in text.encode("utf-8")]
    assert all(isinstance(i, int) for i in ids)
    return ids


def chunkings(ids: list[int], seed: int = 0, n_random: int = 6):
    """Every single split point, one token per chunk, and seeded random chunkings."""
    for k in range(1, len(ids)):
        yield [ids[:k], ids[k:]]
    yield [[i] for i in ids]
    rng = random.Random(seed)
    for _ in range(n_random):
        chunks, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 9)
            chunks.append(ids[i:i + n])
            i += n
        yield chunks


def check_result(res, expected, stop=None):
    got_calls = [(c.id, c.name, c.arguments) for c in res.tool_calls]
    assert res.reasoning == expected["reasoning"]
    assert res.content == expected["content"]
    assert got_calls == expected["calls"]
    assert res.finish_reason == expected["finish"]
    assert [w.code for w in res.warnings] == expected["warnings"]
    content = "".join(d.text for d in res.deltas if isinstance(d, ContentDelta))
    reasoning = "".join(d.text for d in res.deltas if isinstance(d, ReasoningDelta))
    assert content == res.content and reasoning == res.reasoning
    for d in res.deltas:
        if isinstance(d, ContentDelta | ReasoningDelta):
            assert "\ufffd" not in d.text
    assert [d.call for d in res.deltas if isinstance(d, ToolCallDelta)] == res.tool_calls


@pytest.mark.parametrize("encoding", ["natural", "bytes"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_chunking_gives_the_same_segments(qwen_tokenizer, case, encoding):
    name, text, with_eos, kwargs, cause, expected = case
    tok = qwen_tokenizer
    ids = (natural_ids if encoding == "natural" else byte_ids)(tok, text)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    if with_eos:
        ids = ids + [eos]
    runs = 0
    for chunks in chunkings(ids, seed=len(text)):
        res = run_pipeline(tok, chunks, stop_cause=cause, **kwargs)
        check_result(res, expected)
        runs += 1
    assert runs == len(ids) + 6


def test_tags_split_across_tokens_really_are(qwen_tokenizer):
    """The byte stream spells <think> over 7 tokens; the natural one uses one token."""
    assert len(byte_ids(qwen_tokenizer, "<think>")) == 7
    assert len(natural_ids(qwen_tokenizer, "<think>")) == 1


def test_stop_string_cuts_tokens_after_it(qwen_tokenizer):
    tok = qwen_tokenizer
    text = "Paris is the capital.\nEND-OF-ANSWER\nmore text"
    for ids in (natural_ids(tok, text), byte_ids(tok, text)):
        pipe = TextPipeline(tok, stop=["END-OF"])
        deltas = pipe.feed(ids)  # one block, as DFlash commits it
        assert pipe.stopped and pipe.stop_hit == "END-OF"
        hits = [d for d in deltas if isinstance(d, StopStringHit)]
        assert len(hits) == 1 and hits[0].kept_tokens == len(pipe.tokens)
        kept = pipe.tokens
        assert kept == ids[: len(kept)] and len(kept) < len(ids)
        assert "END-OF" in tok.decode(kept)
        assert "END-OF" not in tok.decode(kept[:-1])
        assert pipe.feed(ids[:3]) == [] and pipe.tokens == kept  # ignored after the stop
        pipe.finish("cancelled")
        assert pipe.finish_reason == "stop"
        assert pipe.text == "Paris is the capital.\n"


def test_stop_string_first_half_never_shown_mid_stream(qwen_tokenizer):
    tok = qwen_tokenizer
    text = "abc STO more STOP tail"
    for ids in (natural_ids(tok, text), byte_ids(tok, text)):
        pipe = TextPipeline(tok, stop=["STOP"])
        shown = ""
        for i in ids:
            for d in pipe.feed(i):
                if isinstance(d, ContentDelta):
                    shown += d.text
            assert not shown.endswith(("S", "ST", "STO")) or shown == "abc STO"
            if pipe.stopped:
                break
        pipe.finish("cancelled")
        assert pipe.content == "abc STO more"


def test_end_token_mid_chunk_drops_later_tokens(qwen_tokenizer):
    tok = qwen_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    head, tail = natural_ids(tok, "Hello world"), natural_ids(tok, " junk after")
    pipe = TextPipeline(tok)
    pipe.feed(head + [eos] + tail)
    assert pipe.ended and pipe.stopped
    assert pipe.tokens == head + [eos]
    pipe.finish("end_token")
    assert pipe.content == "Hello world" and pipe.text == "Hello world"
    assert pipe.finish_reason == "stop"


def test_bad_typed_parameter_keeps_the_call_with_text_value(qwen_tokenizer):
    text = (
        "<tool_call>\n<function=write_note>\n<parameter=count>\nmany\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    res = run_pipeline(qwen_tokenizer, [natural_ids(qwen_tokenizer, text)], tools=TOOLS)
    assert [(c.name, c.arguments) for c in res.tool_calls] == [("write_note", {"count": "many"})]
    assert res.finish_reason == "tool_calls"


def test_call_ids_continue_from_first_call_index(qwen_tokenizer):
    res = run_pipeline(
        qwen_tokenizer, [natural_ids(qwen_tokenizer, XML_TWO_CALLS)], first_call_index=5
    )
    assert [c.id for c in res.tool_calls] == ["call_5", "call_6"]


def test_malformed_call_warning_carries_raw_text(qwen_tokenizer):
    text = "Try: <tool_call>\n<function=calculator>"
    res = run_pipeline(qwen_tokenizer, [natural_ids(qwen_tokenizer, text)])
    (w,) = [d for d in res.deltas if isinstance(d, PipelineWarning)]
    assert w.text == "<tool_call>\n<function=calculator>"
    plain = "".join(d.text for d in res.deltas if isinstance(d, ContentDelta) and not d.malformed)
    flagged = [d.text for d in res.deltas if isinstance(d, ContentDelta) and d.malformed]
    assert plain == "Try:" and flagged == [" <tool_call>\n<function=calculator>"]


def test_a_call_the_user_stopped_is_not_called_malformed(qwen_tokenizer):
    """Stopping a Compare while the model wrote its tool call showed a "Malformed tool call
    kept as text" banner and "<tool_call>" as the answer (Xvfb pass): the call was cut by the
    user, not written wrong by the model. It is now left out of the content, not run, and
    the warning says the reply was stopped inside a call."""
    text = "Try: <tool_call>\n<function=calculator>"
    res = run_pipeline(qwen_tokenizer, [natural_ids(qwen_tokenizer, text)],
                       stop_cause="cancelled")
    (w,) = res.warnings
    assert w.code == "stopped_in_tool_call"
    assert w.message == "stopped while the model was writing a tool call: it was not run"
    assert w.text == "<tool_call>\n<function=calculator>"
    assert res.content == "Try:" and res.tool_calls == []
    assert not any(isinstance(d, ContentDelta) and d.malformed for d in res.deltas)
    assert res.finish_reason == "cancelled"
    # a complete body the user cut before its end marker is not run either
    done = "<tool_call>\n<function=calculator>\n<parameter=expression>\n1+1\n</parameter>\n</function>"
    res = run_pipeline(qwen_tokenizer, [natural_ids(qwen_tokenizer, done)],
                       stop_cause="cancelled")
    assert res.tool_calls == [] and [w.code for w in res.warnings] == ["stopped_in_tool_call"]
    # the model's own unclosed call (it ended) is still flagged as before
    res = run_pipeline(qwen_tokenizer, [natural_ids(qwen_tokenizer, text)])
    assert [w.code for w in res.warnings] == ["malformed_tool_call"]


def test_a_call_cut_by_max_tokens_is_not_called_malformed(qwen_tokenizer):
    """With Max tokens 20, a reply cut inside its tool call showed "Malformed tool call kept as
    text: the tool call was not closed" (a new user's Xvfb pass): the model was not wrong, it
    ran out of tokens. The cut call is left out of the content, not run, and the warning
    says the limit ended the reply inside it; the finish reason stays ``length``."""
    text = "Try: <tool_call>\n<function=calculator>"
    res = run_pipeline(qwen_tokenizer, [natural_ids(qwen_tokenizer, text)], stop_cause="length")
    (w,) = res.warnings
    assert w.code == "cut_in_tool_call"
    assert w.message == ("the reply reached Max tokens while the model was writing a tool "
                         "call: it was not run")
    assert w.text == "<tool_call>\n<function=calculator>"
    assert res.content == "Try:" and res.tool_calls == []
    assert not any(isinstance(d, ContentDelta) and d.malformed for d in res.deltas)
    assert res.finish_reason == "length"


def test_a_complete_call_cut_before_its_end_marker_says_max_tokens_did_it(qwen_tokenizer):
    """Max tokens can end a reply right after ``</function>``, one token before
    ``</tool_call>`` (the demo pair, Max tokens 48 or 24 + Continue 24, under Xvfb): the
    complete body is a call, as before, but the warning said the model had left the end
    marker out. It now says the limit ended the reply there."""
    done = ("<tool_call>\n<function=calculator>\n<parameter=expression>\n1+1\n</parameter>\n"
            "</function>")
    res = run_pipeline(qwen_tokenizer, [natural_ids(qwen_tokenizer, done)], stop_cause="length")
    (w,) = res.warnings
    assert w.code == "unclosed_tool_call" and [c.name for c in res.tool_calls] == ["calculator"]
    assert w.message == ("the reply reached Max tokens just before the tool call's end marker "
                         "(</tool_call>); its complete body was read as a call")
    res = run_pipeline(qwen_tokenizer, [natural_ids(qwen_tokenizer, done)])  # the model ended
    assert res.warnings[0].message == ("the tool call was not closed (</tool_call> missing); "
                                       "its complete body was read as a call")


def test_unknown_tool_parser_name_is_a_clear_error(qwen_tokenizer):
    with pytest.raises(ValueError, match="unknown tool parser 'nope'"):
        TextPipeline(qwen_tokenizer, tool_parser="nope")


@pytest.mark.parametrize(
    "cause, stop_hit, calls, expected",
    [
        ("end_token", False, False, "stop"),
        ("end_token", False, True, "tool_calls"),
        ("length", False, False, "length"),
        ("length", False, True, "tool_calls"),
        ("cancelled", True, False, "stop"),
        ("cancelled", False, True, "cancelled"),
        ("error", False, True, "error"),
    ],
)
def test_finish_reason_table(cause, stop_hit, calls, expected):
    assert finish_reason_for(cause, stop_hit=stop_hit, has_tool_calls=calls) == expected


def test_call_to_unknown_function_is_still_a_parsed_call(qwen_tokenizer):
    text = "<tool_call>\n<function=teleport>\n<parameter=to>\nMars\n</parameter>\n</function>\n</tool_call>"
    res = run_pipeline(qwen_tokenizer, [byte_ids(qwen_tokenizer, text)], tools=TOOLS)
    assert [(c.name, c.arguments) for c in res.tool_calls] == [("teleport", {"to": "Mars"})]
    assert res.finish_reason == "tool_calls" and res.warnings == []


def test_json_call_with_string_arguments_is_decoded(qwen_tokenizer):
    text = '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": [1, {\\"y\\": 2}]}"}\n</tool_call>'
    res = run_pipeline(qwen_tokenizer, [natural_ids(qwen_tokenizer, text)], tool_parser="json_tools")
    assert [(c.name, c.arguments) for c in res.tool_calls] == [("f", {"x": [1, {"y": 2}]})]


def test_without_a_tool_parser_calls_stay_plain_content(qwen_tokenizer_dir, tmp_path):
    import json
    import shutil

    from mlx_lm.tokenizer_utils import load

    shutil.copy(qwen_tokenizer_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load(tmp_path)  # no chat template: mlx-lm infers no tool parser
    assert tok.tool_parser is None
    text = "<think>\nhm\n</think>\n\nA <tool_call>\n{\"name\": \"f\"}\n</tool_call>"
    res = run_pipeline(tok, [byte_ids(tok, text)])
    assert res.reasoning == "hm"
    assert res.content == "A <tool_call>\n{\"name\": \"f\"}\n</tool_call>"
    assert res.tool_calls == [] and res.warnings == [] and res.finish_reason == "stop"


# ------------------------------------------------------------------ reasoning tokens
def _count_fed(tok, ids, chunks=None, **kwargs) -> tuple[int, TextPipeline]:
    """Feed ``ids`` (in ``chunks`` when given) and finish; (reasoning tokens, pipeline)."""
    pipe = TextPipeline(tok, **kwargs)
    for chunk in chunks or [ids]:
        pipe.feed(chunk)
        if pipe.stopped:
            break
    pipe.finish("cancelled" if pipe.stop_hit else "end_token")
    return pipe.reasoning_tokens, pipe


def test_reasoning_tokens_count_the_ids_inside_the_thinking_block(qwen_tokenizer):
    """``reasoning_tokens`` counts token ids, not characters: the ids read inside the
    thinking block (a pre-opened one from the first id), the markers' own single tokens
    left out, the answer and the end token too; the same at every chunking."""
    tok = qwen_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    thought = "Let me think: 2+2.\nIt is 4.\n"
    ids = natural_ids(tok, thought + "</think>\n\nThe answer is 4.") + [eos]
    inside = natural_ids(tok, thought)
    assert ids[:len(inside)] == inside and len(inside) < len(thought)  # tokens, not chars
    for chunks in chunkings(ids, seed=3):
        count, pipe = _count_fed(tok, ids, chunks, starts_in_reasoning=True)
        assert count == len(inside)
        assert pipe.reasoning == thought.strip() and pipe.content == "The answer is 4."
    # the block opened in the reply: <think> is not counted either
    opened = natural_ids(tok, "<think>\n" + thought + "</think>\n\nDone.") + [eos]
    assert _count_fed(tok, opened)[0] == len(natural_ids(tok, "\n" + thought))
    # no thinking block: none; a reply cut while thinking: every id it kept
    assert _count_fed(tok, natural_ids(tok, "Just the answer.") + [eos])[0] == 0
    assert _count_fed(tok, inside, starts_in_reasoning=True)[0] == len(inside)


def test_reasoning_tokens_stop_at_a_stop_string_and_count_split_markers(qwen_tokenizer):
    tok = qwen_tokenizer
    # a stop string met while thinking: only the ids kept before it count
    count, pipe = _count_fed(tok, natural_ids(tok, "Paris, I think. More\n</think>\n\nParis."),
                             starts_in_reasoning=True, stop=["I think"])
    assert pipe.stop_hit == "I think" and 0 < count < len(pipe.tokens)
    assert count == len(pipe.tokens) - 1  # the id that completed the stop string is not
    # a closing marker spelled over several ids: the ids before its last one were read
    # inside the block (the text could still have been reasoning)
    text = "Hm.\n</think>\n\nOK."
    count = _count_fed(tok, byte_ids(tok, text), starts_in_reasoning=True)[0]
    assert count == len("Hm.\n</think") == len(byte_ids(tok, "Hm.\n</think"))

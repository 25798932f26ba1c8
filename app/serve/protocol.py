"""OpenAI chat-completions requests in, response objects and stream chunks out (no MLX here).

:func:`parse_chat_request` checks a decoded JSON body and returns a typed :class:`ChatRequest`
whose ``messages`` are already chat-template messages (what ``app.chat.templates.render_prompt``
reads: assistant ``tool_calls`` arguments as dicts, tool results named). Every problem is an
:class:`ApiError` naming the field (``param``), which the API turns into an HTTP status and an
OpenAI-style body ``{"error": {"message", "type", "param", "code"}}``.

:class:`CompletionResult` is what the worker reports at the end of a reply (the reply's texts,
tool calls and the engine's :class:`~app.engine.events.Summary`); :func:`completion_object`,
:func:`chunk_object` and :func:`usage_object` / :func:`dflash_object` turn it into the JSON the
client reads. Figures are mapped from the Summary, never computed here.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from app.chat.events import Summary
from app.chat.settings import DECODING_MODES, Sampling, SettingError, coerce
from app.chat.templates import invalid_text

TOOL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")
"""What a function's name may be: OpenAI's rule for ``tools[].function.name`` (its API
reference: a-z, A-Z, 0-9, underscores and dashes, at most 64), with dots and colons too,
which tool bridges use (``github.search``); no spaces or other characters, which the
model would have to write back inside a tool call."""

MAX_STOP_STRINGS = 16
"""Stop strings one request may give (OpenAI allows 4; more costs nothing here)."""

IGNORED_FIELDS = frozenset({"user", "metadata", "store", "parallel_tool_calls", "service_tier",
                            "logit_bias", "prediction", "modalities", "reasoning_effort",
                            "web_search_options", "audio", "safety_identifier",
                            "prompt_cache_key"})
"""Request fields accepted and not used (clients send them by default); see docs/serve.md."""


class ApiError(Exception):
    """A request the server answers with an error status (OpenAI's error shape).

    Attributes:
        status: the HTTP status (400 bad request, 401, 404 unknown model, 413 body too large,
            429 queue full, 500, 503 shutting down or not loaded).
        message: one sentence for the user (naming the field or the limit).
        type: OpenAI's error type (``invalid_request_error``, ``authentication_error``,
            ``not_found_error``, ``rate_limit_error``, ``server_error``).
        param: the request field at fault (e.g. ``messages[2].content``), or None.
        code: a machine-readable code (e.g. ``context_length_exceeded``), or None.
        headers: HTTP headers the answer carries (``Retry-After`` on a 429, ``Allow`` on a
            405).
    """

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        """``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 :class:`ApiError` (``invalid_request_error``)."""
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class ChatRequest:
    """One checked ``POST /v1/chat/completions`` body.

    Attributes:
        messages: chat-template messages (``role`` system/user/assistant/tool; ``content``
            str; assistant ``tool_calls`` with dict arguments and ``reasoning_content``; tool
            messages with ``tool_call_id`` and ``name``), at least one.
        model: the model the client named (None: the loaded one).
        tools: OpenAI function definitions shown to the model (None: none, or
            ``tool_choice`` ``"none"``).
        stream: answer with server-sent events.
        include_usage: ``stream_options.include_usage`` (a last chunk with ``usage`` and no
            choices).
        mode: ``"plain"``, ``"dflash"``, ``"dflash2"`` or ``"lookup"``; None: DFlash when a
            drafter is loaded, else plain.
        block_size: DFlash block size (None: the drafter's; for ``lookup``
            :data:`app.engine.lookup.DEFAULT_BLOCK`). The request's ``"auto"`` leaves it None
            and sets ``auto_block``.
        auto_block: the request's ``block_size`` was ``"auto"``: DFlash and DFlash2 choose
            each cycle's block length, 1 (a plain step) up to the drafter's block size
            (``ReplySettings.auto_block``); plain and lookup ignore it.
        max_tokens: generated tokens at most (None: what the context leaves, capped by the
            server's default).
        stop: stop strings (matched on the decoded text).
        sampling: temperature, top_p, top_k, min_p, repetition_penalty, seed.
        enable_thinking: ``chat_template_kwargs.enable_thinking`` (None: the server's default).
    """

    messages: list[dict]
    model: str | None = None
    tools: list[dict] | None = None
    stream: bool = False
    include_usage: bool = False
    mode: str | None = None
    block_size: int | None = None
    max_tokens: int | None = None
    auto_block: bool = False
    stop: list[str] = field(default_factory=list)
    sampling: Sampling = field(default_factory=Sampling)
    enable_thinking: bool | None = None


# ------------------------------------------------------------------------------ parsing
def check_text(value: Any, param: str) -> None:
    """Refuse text the model cannot be given: a string in ``value`` (strings, lists and
    objects of them, keys included) holding a lone surrogate, which JSON's ``\\ud800``
    escapes decode to (``app.chat.templates.invalid_text``); the tokenizer would fail on it.

    Raises:
        ApiError: 400 naming the field (``param`` and the path below it).
    """
    found = invalid_text(value, param)
    if found is not None:
        path, message = found
        raise bad_request(f"{message}; send valid UTF-8 text", path)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict, name: str, setting: str | None = None) -> Any:
    """``body[name]`` coerced as the app setting ``setting`` (its type and range), or None
    when absent or null."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{name} must be a number, got {json.dumps(value)}", name)
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_request(f"{name} must be a finite number", name)
    try:
        return coerce(setting or name, value)
    except SettingError as exc:
        raise bad_request(str(exc).replace(setting or name, name, 1), name) from None


def _text_content(content: Any, param: str, allow_none: bool) -> str:
    """A message's content as text: a string, or a list of ``{"type": "text", "text"}``
    parts joined; None (or absent) only where ``allow_none``."""
    if content is None:
        if allow_none:
            return ""
        raise bad_request(f"{param} is missing", param)
    if isinstance(content, str):
        check_text(content, param)
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(f"{param}[{i}] is a {kind!s} part: only text parts are "
                                  "supported (this server has no image or audio input)",
                                  f"{param}[{i}]")
            check_text(part["text"], f"{param}[{i}].text")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"{param} must be a string or a list of text parts", param)


def _tool_calls(calls: Any, param: str) -> list[dict]:
    """An assistant message's OpenAI ``tool_calls`` as the chat template's entries
    (``function.arguments`` parsed from its JSON string into a dict)."""
    if not isinstance(calls, list):
        raise bad_request(f"{param} must be a list", param)
    out = []
    for j, call in enumerate(calls):
        p = f"{param}[{j}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise bad_request(f"{p} must be an object with a 'function'", p)
        fn = call["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"{p}.function.name must be a non-empty string", f"{p}.function.name")
        check_text(name, f"{p}.function.name")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                raise bad_request(f"{p}.function.arguments is not valid JSON: {exc.msg}",
                                  f"{p}.function.arguments") from None
        if not isinstance(args, dict):
            raise bad_request(f"{p}.function.arguments must encode a JSON object",
                              f"{p}.function.arguments")
        check_text(args, f"{p}.function.arguments")
        if call.get("id"):
            check_text(str(call["id"]), f"{p}.id")
        out.append({"id": str(call.get("id") or f"call_{j}"), "type": "function",
                    "function": {"name": name, "arguments": args}})
    return out


def parse_messages(raw: Any) -> list[dict]:
    """OpenAI ``messages`` as chat-template messages (see :class:`ChatRequest`).

    ``developer`` messages count as ``system`` ones, and the leading ones are joined into one
    (:func:`_one_system_message`); a tool message gets the ``name`` of the call it answers
    (looked up by ``tool_call_id`` in the assistant messages before it).

    Raises:
        ApiError: 400 naming the message and field at fault.
    """
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages must be a non-empty list", "messages")
    names: dict[str, str] = {}
    out: list[dict] = []
    for i, m in enumerate(raw):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{p} must be an object", p)
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise bad_request(f"{p}.role must be one of system, developer, user, assistant, "
                              f"tool; got {json.dumps(role)}", f"{p}.role")
        msg: dict[str, Any] = {"role": role}
        if role == "assistant":
            msg["content"] = _text_content(m.get("content"), f"{p}.content", allow_none=True)
            key = "reasoning_content" if "reasoning_content" in m else "reasoning"
            reasoning = m.get(key)
            if isinstance(reasoning, str) and reasoning:
                check_text(reasoning, f"{p}.{key}")
                msg["reasoning_content"] = reasoning
            if m.get("tool_calls"):
                msg["tool_calls"] = _tool_calls(m["tool_calls"], f"{p}.tool_calls")
                for c in msg["tool_calls"]:
                    names[c["id"]] = c["function"]["name"]
        else:
            msg["content"] = _text_content(m.get("content"), f"{p}.content", allow_none=False)
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise bad_request(f"{p}.tool_call_id is missing", f"{p}.tool_call_id")
            check_text(call_id, f"{p}.tool_call_id")
            msg["tool_call_id"] = call_id
            if isinstance(m.get("name"), str):
                check_text(m["name"], f"{p}.name")
            name = m.get("name") if isinstance(m.get("name"), str) else names.get(call_id)
            if name:
                msg["name"] = name
        out.append(msg)
    return _one_system_message(out)


def _one_system_message(messages: list[dict]) -> list[dict]:
    """Join the leading system messages into one (their texts, a blank line between), as
    chat templates show one system message, first.

    Raises:
        ApiError: 400 for a system message after the first other message (the template
            would drop it or fail).
    """
    lead = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
    for i in range(lead, len(messages)):
        if messages[i]["role"] == "system":
            raise bad_request(f"messages[{i}] is a system (or developer) message: system "
                              "messages must come before the conversation (the chat template "
                              "shows one system message, first)", f"messages[{i}].role")
    if lead < 2:
        return messages
    joined = "\n\n".join(m["content"] for m in messages[:lead])
    return [{"role": "system", "content": joined}, *messages[lead:]]


def parse_tools(body: dict) -> list[dict] | None:
    """The ``tools`` shown to the model after ``tool_choice``: ``"auto"`` (default) all of
    them, ``"none"`` none, ``{"type": "function", "function": {"name"}}`` only that one (it is
    offered, not forced). ``"required"`` is refused: forcing a call would need constrained
    decoding, which this exact server does not do.

    Raises:
        ApiError: 400 for malformed tools or an unusable ``tool_choice``.
    """
    tools = body.get("tools")
    if tools is None:
        if body.get("tool_choice") is not None:
            raise bad_request("tool_choice needs tools: the request offers none",
                              "tool_choice")
        return None
    if not isinstance(tools, list):
        raise bad_request("tools must be a list of function definitions", "tools")
    names = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" \
                or not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                or not fn["name"]:
            raise bad_request(f"tools[{i}] must be {{\"type\": \"function\", \"function\": "
                              "{\"name\": ..., \"parameters\": {...}}}", f"tools[{i}]")
        if not TOOL_NAME.match(fn["name"]):
            raise bad_request(f"tools[{i}].function.name must be letters, digits, '_', '-', "
                              f"'.' or ':' (1 to 64 of them), got {fn['name']!r:.70}",
                              f"tools[{i}].function.name")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON schema object",
                              f"tools[{i}].function.parameters")
        names.append(fn["name"])
    check_text(tools, "tools")
    choice = body.get("tool_choice", "auto")
    if choice in (None, "auto"):
        return tools or None
    if choice == "none":
        return None
    if choice == "required":
        raise bad_request("tool_choice \"required\" is not supported: this server does not "
                          "constrain decoding; use \"auto\" or name one function", "tool_choice",
                          "unsupported_value")
    fn = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request("tool_choice must be \"auto\", \"none\" or {\"type\": \"function\", "
                          "\"function\": {\"name\": ...}}", "tool_choice")
    if fn["name"] not in names:
        raise bad_request(f"tool_choice names {fn['name']!r}, which is not among the tools",
                          "tool_choice")
    return [t for t in tools if t["function"]["name"] == fn["name"]]


def parse_chat_request(body: Any) -> ChatRequest:
    """Check a decoded ``/v1/chat/completions`` body and type it.

    Numbers are checked against the app's own setting ranges (``app.chat.settings.SPECS``:
    temperature 0-2, top_p 0.01-1, top_k 0-100000, min_p 0-1, repetition_penalty 1-2, seed
    -1..2**31-1). Fields in :data:`IGNORED_FIELDS` are accepted and not used; ``n`` above 1,
    ``logprobs``, non-zero ``presence_penalty``/``frequency_penalty`` and a JSON
    ``response_format`` are refused (not supported). Other unknown fields are ignored, as
    OpenAI-compatible servers usually do.

    Raises:
        ApiError: 400 naming the field (``param``) and what is wrong with it.
    """
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string", "model")
    check_text(model, "model")
    messages = parse_messages(body.get("messages"))
    tools = parse_tools(body)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("stream must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    if options and not stream:
        raise bad_request("stream_options is only allowed with \"stream\": true",
                          "stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise bad_request("stream_options.include_usage must be true or false",
                          "stream_options.include_usage")
    mode = body.get("mode")
    if mode is not None and mode not in DECODING_MODES:
        raise bad_request(f"mode must be one of {', '.join(DECODING_MODES)}, got "
                          f"{json.dumps(mode)}", "mode")
    block = body.get("block_size")
    # "auto" as the CLI's --block-size takes it: any case, spaces around it ignored
    auto_block = isinstance(block, str) and block.strip().lower() == "auto"
    if auto_block:
        block = None  # the largest block stays the drafter's
    elif block is not None and (not _is_int(block) or block < 1):
        raise bad_request(f"block_size must be a whole number of at least 1 or \"auto\", got "
                          f"{json.dumps(block)}", "block_size")
    max_tokens = None
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value) or value < 1:
            raise bad_request(f"{name} must be a whole number of at least 1, got "
                              f"{json.dumps(value)}", name)
        max_tokens = value if max_tokens is None else max_tokens
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request("stop must be a string or a list of strings", "stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise bad_request(f"stop may hold at most {MAX_STOP_STRINGS} strings", "stop")
    check_text(body.get("stop"), "stop")
    _refuse_unsupported(body)
    temperature = _number(body, "temperature")
    top_p = _number(body, "top_p")
    top_k = _number(body, "top_k")
    min_p = _number(body, "min_p")
    penalty = _number(body, "repetition_penalty")
    seed = _number(body, "seed")
    sampling = Sampling(
        temperature=0.0 if temperature is None else float(temperature),
        top_p=1.0 if top_p is None else float(top_p),
        top_k=0 if top_k is None else int(top_k),
        min_p=0.0 if min_p is None else float(min_p),
        repetition_penalty=None if penalty in (None, 1.0) else float(penalty),
        seed=None if seed is None or seed < 0 else int(seed),
    )
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise bad_request("chat_template_kwargs must be an object", "chat_template_kwargs")
    check_text(kwargs, "chat_template_kwargs")  # its keys are named in the error below
    unknown = sorted(set(kwargs) - {"enable_thinking"})
    if unknown:
        raise bad_request(f"chat_template_kwargs: only enable_thinking is supported, got "
                          f"{', '.join(unknown)}", "chat_template_kwargs")
    thinking = kwargs.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise bad_request("chat_template_kwargs.enable_thinking must be true or false",
                          "chat_template_kwargs.enable_thinking")
    return ChatRequest(messages=messages, model=model, tools=tools, stream=stream,
                       include_usage=include_usage, mode=mode, block_size=block,
                       auto_block=auto_block,
                       max_tokens=max_tokens, stop=[s for s in stop if s], sampling=sampling,
                       enable_thinking=thinking)


def _refuse_unsupported(body: dict) -> None:
    """400 for fields whose asked behaviour this server does not have."""
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_request("n must be 1: this server writes one choice per request", "n",
                          "unsupported_value")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise bad_request("logprobs are not supported by this server", "logprobs",
                          "unsupported_value")
    for name in ("presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value not in (None, 0, 0.0):
            raise bad_request(f"{name} is not supported; use repetition_penalty (1-2)", name,
                              "unsupported_value")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise bad_request("response_format: only {\"type\": \"text\"} is supported (no "
                          "constrained JSON output)", "response_format", "unsupported_value")


# ------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class CompletionResult:
    """A finished reply as the worker reports it (plain values, no MLX).

    Attributes:
        content: the answer text (reasoning and tool-call markup removed).
        reasoning: the thinking text ("" when none).
        tool_calls: ``(id, name, arguments dict)`` per call, in order.
        finish_reason: the reply's (``stop``, ``length``, ``tool_calls``, ``cancelled``,
            ``error``; see ``app.chat.pipeline.finish_reason_for``).
        summary: the engine's figures for the reply (``app.engine.events.Summary``).
        block_size: the DFlash block size that ran (None for plain).
        completion_tokens: generated tokens the reply kept (the end token included when
            generated).
        reasoning_tokens: of those, the ones generated inside the thinking block
            (``app.chat.pipeline.TextPipeline.reasoning_tokens``); 0 without one.
    """

    content: str
    reasoning: str
    tool_calls: list[tuple[str, str, dict]]
    finish_reason: str
    summary: Summary
    block_size: int | None
    completion_tokens: int
    reasoning_tokens: int = 0


def new_completion_id() -> str:
    """``chatcmpl-`` and 24 random hex digits."""
    return "chatcmpl-" + secrets.token_hex(12)


def openai_finish_reason(reason: str) -> str:
    """The reply's finish reason in OpenAI's vocabulary: ``stop``, ``length`` and
    ``tool_calls`` as they are; ``cancelled`` (server shutdown) and ``error`` become ``stop``
    (``dflash.stop_cause`` keeps the engine's cause)."""
    return reason if reason in ("stop", "length", "tool_calls") else "stop"


def call_id(completion_id: str, index: int) -> str:
    """The id a reply's ``index``-th tool call gets: ``call_<12 hex of the completion>_<n>``,
    unique across the requests of a conversation (the session numbers calls from 0 in
    every reply; the chat template does not render ids, so the prefix cache is unaffected)."""
    return f"call_{completion_id[-12:]}_{index}"


def tool_call_object(completion_id: str, index: int, name: str, arguments: dict,
                     with_index: bool = False) -> dict:
    """One OpenAI ``tool_calls`` entry: ``{"id", "type": "function", "function": {"name",
    "arguments": JSON string}}`` (``index`` first, for stream deltas)."""
    entry: dict[str, Any] = {"id": call_id(completion_id, index), "type": "function",
                             "function": {"name": name,
                                          "arguments": json.dumps(arguments,
                                                                  ensure_ascii=False)}}
    return {"index": index, **entry} if with_index else entry


def usage_object(result: CompletionResult) -> dict:
    """OpenAI ``usage``: prompt, completion and total tokens,
    ``prompt_tokens_details.cached_tokens`` = the prompt tokens reused from the prefix cache
    (not prefilled again) and ``completion_tokens_details.reasoning_tokens`` = the completion
    tokens generated inside the thinking block (0 without one)."""
    s = result.summary
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": s.prompt_tokens + result.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": s.reused_tokens},
            "completion_tokens_details": {"reasoning_tokens": result.reasoning_tokens}}


def dflash_object(result: CompletionResult) -> dict:
    """The ``dflash`` extension object: the engine's figures for this reply (``Summary``).

    ``mode``, ``block_size`` (None for plain), ``tau`` (mean tokens committed per verify
    cycle) and ``acceptance_rate`` (accepted / drafted; both None when nothing was drafted),
    ``drafted``, ``accepted``, ``replays``, ``cycles``, ``tok_per_s`` (generated tokens per
    second of generation, prefill excluded), ``ttft_s`` (seconds to the first token, prefill
    included), ``prefill_s``, ``prompt_tokens``, ``reused_tokens`` (of the prompt, from the
    prefix cache), ``generated_tokens``, ``stop_cause`` (``end_token``, ``length``,
    ``cancelled``, ``error``), ``auto_block`` (True when the automatic block size chose each
    cycle's block length: a DFlash or DFlash2 reply of a request with ``block_size``
    ``"auto"``; ``block_size`` is then the largest block it could choose), ``block_lengths``
    (each verify cycle's block length L in order, 1 a plain step without drafts; empty for
    plain).
    """
    s = result.summary
    return {"mode": s.mode, "block_size": result.block_size, "tau": s.tau,
            "acceptance_rate": s.acceptance_rate, "drafted": s.drafted, "accepted": s.accepted,
            "replays": s.replays, "cycles": s.cycles, "tok_per_s": s.tok_per_s,
            "ttft_s": s.ttft_s, "prefill_s": s.prefill_s, "prompt_tokens": s.prompt_tokens,
            "reused_tokens": s.reused_tokens, "generated_tokens": s.generated_tokens,
            "stop_cause": s.stop_cause, "auto_block": s.auto_block,
            "block_lengths": list(s.block_lengths)}


def completion_object(result: CompletionResult, completion_id: str, model: str,
                      created: int | None = None) -> dict:
    """The non-streamed ``chat.completion`` object, with ``usage`` and ``dflash``.

    ``message.content`` is None when the reply is only tool calls; ``reasoning_content`` is
    there when the model reasoned."""
    message: dict[str, Any] = {"role": "assistant",
                               "content": result.content if result.content or
                               not result.tool_calls else None}
    if result.reasoning:
        message["reasoning_content"] = result.reasoning
    if result.tool_calls:
        message["tool_calls"] = [tool_call_object(completion_id, i, name, args)
                                 for i, (_, name, args) in enumerate(result.tool_calls)]
    return {"id": completion_id, "object": "chat.completion",
            "created": int(time.time()) if created is None else created, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": openai_finish_reason(result.finish_reason)}],
            "usage": usage_object(result), "dflash": dflash_object(result)}


def chunk_object(completion_id: str, model: str, created: int, delta: dict | None,
                 finish_reason: str | None = None, **extra: Any) -> dict:
    """One ``chat.completion.chunk``: one choice with ``delta`` (None: no choices, as the
    ``include_usage`` chunk has) and ``finish_reason``; ``extra`` adds top-level fields
    (``usage``, ``dflash``)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish_reason}]
    return {"id": completion_id, "object": "chat.completion.chunk", "created": created,
            "model": model, "choices": choices, **extra}


def sse(obj: dict | str) -> bytes:
    """One server-sent event: ``data: <json>\\n\\n`` (a str is sent as is, e.g. ``[DONE]``)."""
    text = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {text}\n\n".encode()

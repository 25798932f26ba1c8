"""Render a conversation into prompt token ids through the model's own chat template.

The template is the one that came with the model (``tokenizer_config.json`` /
``chat_template.jinja``, read by mlx-lm's loader into its ``TokenizerWrapper``); the project's
own Qwen3.5-style template is ``resources/chat_template.jinja``. Rendering goes through
``TokenizerWrapper.apply_chat_template`` so mlx-lm's handling of the thinking switch
(``enable_thinking`` or the model's own keyword) applies unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.engine.errors import EngineError


class ChatTemplateError(EngineError):
    """The conversation cannot be rendered: the model has no chat template, the template
    raised (e.g. a role it does not accept), or a message is not a ``{"role", "content"}``
    mapping. The message says which."""


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered generation prompt.

    Attributes:
        ids: prompt token ids (list[int]), encoded without extra special tokens (the template
            writes its own).
        text: the rendered prompt text.
        starts_in_reasoning: True when the generation prompt pre-opened the thinking block
            (the text after the last assistant header holds an unclosed ``<think>``), so the
            reply's first tokens are reasoning.
    """

    ids: list[int]
    text: str
    starts_in_reasoning: bool


_ROLES = {"system", "user", "assistant", "tool"}
_ASSISTANT_HEADER = "<|im_start|>assistant"


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("a conversation must be a non-empty list of messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ChatTemplateError(f"message {i} is not a mapping with a 'role'")
        if m["role"] not in _ROLES:
            raise ChatTemplateError(
                f"message {i} has role {m['role']!r}; expected one of {sorted(_ROLES)}"
            )


def lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate (U+D800..U+DFFF) in ``text``, or None when it
    is valid Unicode text (it encodes as UTF-8).

    Python puts them in a ``str`` for bytes that are not UTF-8 (a command-line argument's
    undecodable bytes become U+DC80..U+DCFF) and for a JSON ``\\ud800`` escape; tokenizers
    refuse such text (``TypeError: TextEncodeInput must be Union[...]``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _not_utf8(what: str, text: str, at: int) -> str:
    return (f"{what} is not valid UTF-8 text: it holds a lone surrogate "
            f"(U+{ord(text[at]):04X}) at character {at + 1}")


def invalid_text(value: Any, where: str) -> tuple[str, str] | None:
    """The first string in ``value`` (a string, or lists and dicts of them, keys included)
    that is not valid UTF-8 text (:func:`lone_surrogate`), as ``(path, message)``: ``path``
    names it from ``where`` (``messages[0].content``; a bad key names its mapping), and
    ``message`` says what is wrong, for an error. None when all of it is valid."""
    if isinstance(value, str):
        at = lone_surrogate(value)
        return None if at is None else (where, _not_utf8(where, value, at))
    if isinstance(value, dict):
        for key, item in value.items():
            at = lone_surrogate(key) if isinstance(key, str) else None
            if at is not None:
                return where, _not_utf8(f"a key of {where}", key, at)
            found = invalid_text(item, f"{where}.{key}")
            if found:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = invalid_text(item, f"{where}[{i}]")
            if found:
                return found
    return None


def opens_reasoning(prompt_text: str, think_start: str | None, think_end: str | None) -> bool:
    """True when the last assistant turn of ``prompt_text`` holds an unclosed ``think_start``.

    The assistant turn is the text after the last ``<|im_start|>assistant`` (the whole text
    when that header is absent). ``think_start``/``think_end`` are the tokenizer's thinking
    markers (``TokenizerWrapper.think_start``/``think_end``); with either None it is False.
    """
    if not think_start or not think_end:
        return False
    pos = prompt_text.rfind(_ASSISTANT_HEADER)
    tail = prompt_text[pos:] if pos >= 0 else prompt_text
    start = tail.rfind(think_start)
    return start >= 0 and tail.find(think_end, start + len(think_start)) < 0


def render_prompt(
    tokenizer,
    messages: list[dict],
    *,
    tools: list[dict] | None = None,
    enable_thinking: bool | None = None,
) -> RenderedPrompt:
    """Render ``messages`` with the generation prompt and encode it.

    Args:
        tokenizer: an mlx-lm ``TokenizerWrapper`` (``LoadedTarget.tokenizer``).
        messages: OpenAI-style messages: ``{"role": "system"|"user"|"assistant"|"tool",
            "content": str}``; assistant messages may carry ``reasoning_content`` and
            ``tool_calls`` (``[{"id", "type": "function", "function": {"name", "arguments":
            dict}}]``); tool messages carry the tool's result as ``content``.
        tools: OpenAI-style tool definitions given to the template, or None.
        enable_thinking: passed to the template (mlx-lm maps it to the model's own keyword);
            None keeps the tokenizer's default (on when the vocabulary has thinking tokens).

    Returns:
        :class:`RenderedPrompt`.

    Raises:
        ChatTemplateError: no chat template, malformed messages, the template failed, or the
            text is not valid UTF-8 (a lone surrogate: :func:`lone_surrogate`).
    """
    _check_messages(messages)
    if not getattr(tokenizer, "has_chat_template", False):
        raise ChatTemplateError("this model has no chat template; cannot render a conversation")
    kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": False}
    if tools:
        kwargs["tools"] = tools
    if enable_thinking is not None:
        kwargs["enable_thinking"] = bool(enable_thinking)
    try:
        text = tokenizer.apply_chat_template(messages, **kwargs)
    except Exception as exc:  # jinja2 errors and template-raised exceptions
        raise ChatTemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(text, str):
        raise ChatTemplateError(f"the chat template returned {type(text).__name__}, not text")
    if lone_surrogate(text) is not None:  # the tokenizer would raise a bare TypeError
        found = invalid_text(messages, "messages") or invalid_text(tools, "tools")
        raise ChatTemplateError(found[1] if found else
                                "the rendered prompt is not valid UTF-8 text")
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    starts = opens_reasoning(
        text, getattr(tokenizer, "think_start", None), getattr(tokenizer, "think_end", None)
    )
    return RenderedPrompt(ids=ids, text=text, starts_in_reasoning=starts)


def bench_prompt_ids(target, prompt) -> list[int]:
    """Prompt ids of an ``app.engine.bench.BenchPrompt`` (``messages``, ``tools`` flag,
    ``enable_thinking``) through the target's chat template, with the built-in tool
    definitions when ``prompt.tools``."""
    tools = None
    if prompt.tools:
        try:
            from app.chat.tools import tool_schemas

            tools = tool_schemas()
        except ImportError:
            tools = None
    return render_prompt(target.tokenizer, prompt.messages, tools=tools,
                         enable_thinking=prompt.enable_thinking).ids

"""Fit a conversation into the model's context: leave out the oldest turns, say how many.

Messages are chat-template dicts (``Store.prompt_for_reply``). They split into:

* the system prompt: the first message when its role is ``system`` (always kept);
* earlier turns: each a ``user`` message with the assistant/tool messages after it;
* the current turn: the last ``user`` message and everything after it (e.g. a tool round trip
  in progress); always kept.

The rendered prompt is measured with a caller-given token counter (normally
:func:`token_counter` over the target's tokenizer and chat template) against
``limit - reserve`` tokens; the fewest oldest turns are left out so that it fits. Earlier
turns' reasoning (``reasoning_content``) is not sent back unless asked (``keep_reasoning``,
see :func:`template_uses_past_reasoning`); the current turn's reasoning is kept, as the
Qwen3.5 template shows it between tool calls of one turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

TokenCounter = Callable[[list[dict]], int]
"""``count(messages) -> int``: tokens of the prompt rendered from ``messages``."""


class ContextOverflowError(ValueError):
    """The system prompt and the current turn alone exceed the token budget.

    Attributes:
        needed: tokens of the smallest prompt (system prompt + current turn).
        budget: tokens available (limit - reserve).
    """

    def __init__(self, needed: int, budget: int):
        self.needed = needed
        self.budget = budget
        super().__init__(
            f"the message is too long for the model's context: the prompt needs {needed:,} "
            f"tokens even without earlier turns, and {budget:,} are available"
        )


@dataclass
class FittedHistory:
    """The messages to render, and what was left out.

    Attributes:
        messages: chat-template dicts to send (copies; the input is not changed).
        left_out_turns: earlier turns left out (int, 0 when everything fit).
        left_out_messages: messages in those turns.
        prompt_tokens: tokens of the rendered prompt, by the counter.
        budget: tokens available (limit - reserve).
    """

    messages: list[dict] = field(default_factory=list)
    left_out_turns: int = 0
    left_out_messages: int = 0
    prompt_tokens: int = 0
    budget: int = 0

    def notice(self) -> str | None:
        """A sentence for the user when turns were left out, else None. Its token figure is
        this prompt's as sent (tool schema and generation prompt included); a reply's tool
        rounds add their calls and results to later rounds' prompts, which the Prompt figure
        of the whole reply counts."""
        if not self.left_out_turns:
            return None
        n = self.left_out_turns
        what = "1 earlier turn was" if n == 1 else f"{n} earlier turns were"
        return (
            f"{what} left out of the prompt to fit the model's context "
            f"(the prompt takes {self.prompt_tokens:,} of the {self.budget:,} tokens left for "
            "it, before any tool results)."
        )


def context_limit(model_max: int | None, user_limit: int | None = None) -> int:
    """The context limit in tokens: the smaller of the model's maximum and a user setting.

    Raises:
        ValueError: neither is a positive int.
    """
    limits = [int(x) for x in (model_max, user_limit) if x is not None and int(x) > 0]
    if not limits:
        raise ValueError("no context limit: give the model's maximum or a user limit")
    return min(limits)


def split_turns(messages: Sequence[dict]) -> tuple[list[dict], list[list[dict]], list[dict]]:
    """(system messages, earlier turns, current turn) as described in the module doc.

    With no user message at all, everything after the system prompt is the current turn.
    """
    msgs = list(messages)
    system = msgs[:1] if msgs and msgs[0].get("role") == "system" else []
    rest = msgs[len(system) :]
    user_idx = [i for i, m in enumerate(rest) if m.get("role") == "user"]
    if not user_idx:
        return system, [], rest
    current_start = user_idx[-1]
    turns: list[list[dict]] = []
    for m in rest[:current_start]:
        if m.get("role") == "user" or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    return system, turns, rest[current_start:]


def _without_reasoning(m: dict) -> dict:
    out = dict(m)
    out.pop("reasoning_content", None)
    out.pop("reasoning", None)
    return out


def fit_history(
    messages: Sequence[dict],
    count_tokens: TokenCounter,
    limit: int,
    *,
    reserve: int = 0,
    keep_reasoning: bool = False,
) -> FittedHistory:
    """Leave out the fewest oldest turns so the rendered prompt fits ``limit - reserve`` tokens.

    Args:
        messages: chat-template dicts, oldest first.
        count_tokens: tokens of the prompt rendered from a message list (assumed to grow when
            a turn is added back; found by bisection, so O(log turns) calls).
        limit: context limit in tokens (:func:`context_limit`).
        reserve: tokens kept free for the reply (e.g. ``max_tokens``).
        keep_reasoning: send earlier turns' reasoning back too.

    Raises:
        ContextOverflowError: the system prompt and current turn alone do not fit.
        ValueError: ``limit - reserve`` is not positive.
    """
    budget = int(limit) - int(reserve)
    if budget <= 0:
        raise ValueError(f"no room for a prompt: limit {limit} minus reserve {reserve}")
    system, turns, current = split_turns(messages)
    if not keep_reasoning:
        turns = [[_without_reasoning(m) for m in turn] for turn in turns]
    system = [dict(m) for m in system]
    current = [dict(m) for m in current]

    def build(dropped: int) -> list[dict]:
        return system + [m for turn in turns[dropped:] for m in turn] + current

    counts: dict[int, int] = {}

    def tokens(dropped: int) -> int:
        if dropped not in counts:
            counts[dropped] = int(count_tokens(build(dropped)))
        return counts[dropped]

    if tokens(0) <= budget:
        best = 0
    elif tokens(len(turns)) > budget:
        raise ContextOverflowError(tokens(len(turns)), budget)
    else:
        lo, hi = 0, len(turns)  # tokens(lo) > budget, tokens(hi) <= budget
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if tokens(mid) <= budget:
                hi = mid
            else:
                lo = mid
        best = hi
    return FittedHistory(
        messages=build(best),
        left_out_turns=best,
        left_out_messages=sum(len(t) for t in turns[:best]),
        prompt_tokens=tokens(best),
        budget=budget,
    )


def token_counter(tokenizer, *, tools: list[dict] | None = None, **template_kwargs) -> TokenCounter:
    """A :data:`TokenCounter` rendering with the tokenizer's chat template.

    Args:
        tokenizer: a Hugging Face tokenizer or mlx-lm ``TokenizerWrapper`` (which forwards
            ``apply_chat_template``).
        tools: tool definitions rendered into the prompt (they take room too).
        template_kwargs: e.g. ``enable_thinking=False``.
    """

    def count(messages: list[dict]) -> int:
        ids = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, **template_kwargs
        )
        if hasattr(ids, "keys") and "input_ids" in ids:  # BatchEncoding from newer versions
            ids = ids["input_ids"]
        return len(ids)

    return count


_PROBE = "past-reasoning-probe-7f3a"


def template_uses_past_reasoning(render: Callable[[list[dict]], str]) -> bool:
    """Whether a chat template shows an earlier turn's reasoning when given it.

    ``render(messages) -> str`` renders a prompt (e.g. ``tokenizer.apply_chat_template(m,
    tokenize=False, add_generation_prompt=True)``). A two-turn probe conversation whose first
    reply carries a marker in ``reasoning_content`` is rendered; True when the marker shows.
    """
    probe = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": _PROBE},
        {"role": "user", "content": "c"},
    ]
    try:
        return _PROBE in render(probe)
    except Exception:  # a template that rejects the probe does not use it either
        return False


def fit_for_tokenizer(
    messages: Sequence[dict],
    tokenizer,
    limit: int,
    *,
    reserve: int = 0,
    tools: list[dict] | None = None,
    **template_kwargs,
) -> FittedHistory:
    """:func:`fit_history` measured with the tokenizer's own chat template.

    Earlier turns' reasoning is sent back only when the template shows it
    (:func:`template_uses_past_reasoning`). ``tools`` and ``template_kwargs`` (e.g.
    ``enable_thinking``) are rendered as they will be for generation. Raises as
    :func:`fit_history` does.
    """

    def render(msgs: list[dict]) -> str:
        return tokenizer.apply_chat_template(
            msgs, tools=tools, tokenize=False, add_generation_prompt=True, **template_kwargs
        )

    return fit_history(
        messages,
        token_counter(tokenizer, tools=tools, **template_kwargs),
        limit,
        reserve=reserve,
        keep_reasoning=template_uses_past_reasoning(render),
    )

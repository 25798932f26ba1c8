"""Fit a conversation into the model's context: leave out the oldest turns, say how many.

Messages are chat-template dicts (``Store.prompt_for_reply``). They split into:

* the system prompt: the first message when its role is ``system`` (always kept);
* earlier turns: each a ``user`` message with the assistant/tool messages after it;
* the current turn: the last ``user`` message and everything after it (e.g. a tool round trip
  in progress); always kept.

The rendered prompt is measured with a caller-given token counter (normally
:func:`token_counter` over the target's tokenizer and chat template) against a budget:
``limit - reserve`` tokens, or less when the model was trained on shorter chats
(``trained``, a soft cap: see :func:`fit_history`). Earlier turns' reasoning
(``reasoning_content``) is not sent back unless asked (``keep_reasoning``, see
:func:`template_uses_past_reasoning`); the current turn's reasoning is kept, as the Qwen3.5
template shows it between tool calls of one turn.

When the prompt does not fit, what goes first is what the next answer needs least, in this
order (each step only when the one before was not enough):

1. earlier turns' reasoning (when the template shows it);
2. earlier turns' tool results, oldest turn first: each result longer than
   :data:`TOOL_RESULT_KEEP_CHARS` characters is cut to its start and marked
   (:data:`SHORTENED_MARK`); the calls themselves stay, so every call still has its result;
3. whole earlier turns, oldest first (the turns kept keep their shortened results).

Steps 2 and 3 can go several turns at a time (``step``; the app uses
:data:`LEAVE_OUT_STEP`), so that a growing chat's prompt keeps its start for a turn and the
cached prefix is reused.

The system prompt and the current turn are never changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

TokenCounter = Callable[[list[dict]], int]
"""``count(messages) -> int``: tokens of the prompt rendered from ``messages``."""

TOOL_RESULT_KEEP_CHARS = 80
"""Characters of an earlier turn's tool result kept when results are shortened to fit the
context (step 2 of the module doc): enough for a short value (a time, a sum, a capital), so
that a follow-up which reaches back can still read it."""

LEAVE_OUT_STEP = 2
"""Earlier turns are left out (and their tool results shortened) in multiples of this many:
a chat that grows by one turn then changes its prompt's start every other turn, not every
turn, so the turn in between reuses the cached prefix instead of prefilling the whole history
again (``app.engine.prefix``)."""

SHORTENED_MARK = " … (shortened to fit the context)"
"""Appended to a tool result cut to :data:`TOOL_RESULT_KEEP_CHARS` characters."""


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
        shortened_turns: earlier turns kept whose tool results were shortened
            (:data:`TOOL_RESULT_KEEP_CHARS`); 0 when none was.
        dropped_reasoning: True when earlier turns' reasoning, which the template shows,
            was left out to fit (never True with ``keep_reasoning`` off: it is not sent then).
        prompt_tokens: tokens of the rendered prompt, by the counter.
        budget: tokens available: ``limit - reserve``, or the trained chat length when that
            is smaller (``trained`` in :func:`fit_history`).
        trained_cap: True when that trained chat length set the budget.
    """

    messages: list[dict] = field(default_factory=list)
    left_out_turns: int = 0
    left_out_messages: int = 0
    shortened_turns: int = 0
    dropped_reasoning: bool = False
    prompt_tokens: int = 0
    budget: int = 0
    trained_cap: bool = False

    def notice(self) -> str | None:
        """A sentence for the user when turns were left out or tool results of earlier turns
        shortened, else None. Its token figure is this prompt's as sent (tool schema and
        generation prompt included); a reply's tool rounds add their calls and results to
        later rounds' prompts, which the Prompt figure of the whole reply counts."""
        n, k = self.left_out_turns, self.shortened_turns
        if not n and not k:
            return None
        what = ("the chat length this model was trained on" if self.trained_cap
                else "the model's context")
        parts = []
        if n:
            parts.append(("1 earlier turn was" if n == 1 else f"{n} earlier turns were")
                         + " left out of the prompt")
        if k:
            parts.append(("the tool results of 1 earlier turn were" if k == 1 else
                          f"the tool results of {k} earlier turns were") + " shortened")
        head = " and ".join(parts)
        return (
            f"{head} to fit {what} "
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


def shorten_tool_result(m: dict) -> dict:
    """A copy of ``m`` whose text content is cut to :data:`TOOL_RESULT_KEEP_CHARS`
    characters and marked (:data:`SHORTENED_MARK`) when ``m`` is a ``tool`` message with a
    longer string content; else ``m`` unchanged (the same dict)."""
    content = m.get("content")
    if m.get("role") != "tool" or not isinstance(content, str) or \
            len(content) <= TOOL_RESULT_KEEP_CHARS:
        return m
    return {**m, "content": content[:TOOL_RESULT_KEEP_CHARS].rstrip() + SHORTENED_MARK}


def _shortened(turn: list[dict]) -> list[dict] | None:
    """``turn`` with its tool results shortened, or None when none of them is long."""
    out = [shorten_tool_result(m) for m in turn]
    return out if any(a is not b for a, b in zip(out, turn, strict=True)) else None


def _smallest(count: int, fits: Callable[[int], bool]) -> int | None:
    """The smallest ``i`` in ``0..count`` with ``fits(i)`` (``fits`` monotonic: once True,
    True for every larger ``i``), by bisection; None when ``fits(count)`` is False."""
    if fits(0):
        return 0
    if not fits(count):
        return None
    lo, hi = 0, count  # fits(lo) False, fits(hi) True
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _in_steps(n: int, most: int, step: int) -> int:
    """``n`` rounded up to a multiple of ``step``, at most ``most`` (leaving out or
    shortening more than the fewest needed still fits: the count only grows)."""
    return min(most, -(-n // max(1, int(step))) * max(1, int(step)))


def fit_history(
    messages: Sequence[dict],
    count_tokens: TokenCounter,
    limit: int,
    *,
    reserve: int = 0,
    keep_reasoning: bool = False,
    trained: int | None = None,
    step: int = 1,
) -> FittedHistory:
    """Fit the rendered prompt into the budget, changing as little as possible, in the order
    of the module doc: earlier reasoning, then earlier tool results (oldest turn first),
    then whole earlier turns (oldest first).

    Args:
        messages: chat-template dicts, oldest first.
        count_tokens: tokens of the prompt rendered from a message list (assumed to grow when
            a turn or a result is added back; each step is a bisection, so O(log turns)
            calls).
        limit: context limit in tokens (:func:`context_limit`).
        reserve: tokens kept free for the reply (e.g. ``max_tokens``).
        keep_reasoning: send earlier turns' reasoning back too (left out first when the
            prompt does not fit).
        trained: the longest prompt, in tokens, of the chats the model was trained on
            (``app.models.catalog.trained_chat_length``), or None. When it is below
            ``limit - reserve`` it is the budget, as a soft cap: a prompt whose system
            prompt and current turn alone are longer is sent with every earlier turn left
            out, as long as it fits ``limit - reserve``.
        step: leave out (and shorten) earlier turns in multiples of this many (the fewest
            needed rounded up; 1: the fewest), so that a chat growing by one turn keeps its
            prompt's start for ``step - 1`` turns (:data:`LEAVE_OUT_STEP`).

    Raises:
        ContextOverflowError: the system prompt and current turn alone do not fit
            ``limit - reserve``.
        ValueError: ``limit - reserve`` is not positive.
    """
    hard = int(limit) - int(reserve)
    if hard <= 0:
        raise ValueError(f"no room for a prompt: limit {limit} minus reserve {reserve}")
    capped = trained is not None and 0 < int(trained) < hard
    budget = int(trained) if capped else hard
    system, turns, current = split_turns(messages)
    system = [dict(m) for m in system]
    current = [dict(m) for m in current]
    plain = [[_without_reasoning(m) for m in turn] for turn in turns]
    full = [[dict(m) for m in turn] for turn in turns] if keep_reasoning else plain
    short = [_shortened(t) or t for t in plain]
    long_results = [i for i, t in enumerate(plain) if short[i] is not t]

    counts: dict[tuple, int] = {}

    def build(kept: list[list[dict]]) -> list[dict]:
        return system + [m for turn in kept for m in turn] + current

    def tokens(key: tuple, kept: list[list[dict]]) -> int:
        if key not in counts:
            counts[key] = int(count_tokens(build(kept)))
        return counts[key]

    def shortened(k: int) -> list[list[dict]]:  # tool results of the k oldest long ones cut
        cut = set(long_results[:k])
        return [short[i] if i in cut else t for i, t in enumerate(plain)]

    def result(kept: list[list[dict]], key: tuple, *, left_out: int = 0, cut: int = 0,
               reasoning: bool = False, cap: bool = capped) -> FittedHistory:
        return FittedHistory(
            messages=build(kept), left_out_turns=left_out,
            left_out_messages=sum(len(t) for t in turns[:left_out]),
            shortened_turns=cut, dropped_reasoning=reasoning,
            prompt_tokens=tokens(key, kept), budget=budget if cap else hard,
            trained_cap=cap and bool(left_out or cut or reasoning))

    first = ("full",) if keep_reasoning else ("cut", 0)  # the same prompt without reasoning
    if tokens(first, full) <= budget:
        return result(full, first)
    if keep_reasoning and tokens(("cut", 0), plain) <= budget:
        return result(plain, ("cut", 0), reasoning=True)
    k = _smallest(len(long_results),
                  lambda k: tokens(("cut", k), shortened(k)) <= budget)
    if k is not None:
        k = _in_steps(k, len(long_results), step)
        return result(shortened(k), ("cut", k), cut=k, reasoning=keep_reasoning)

    def without(d: int) -> list[list[dict]]:
        return short[d:]

    d = _smallest(len(turns), lambda d: tokens(("drop", d), without(d)) <= budget)
    if d is None:
        d = len(turns)
        smallest = tokens(("drop", d), [])
        if smallest > hard:
            raise ContextOverflowError(smallest, hard)
    d = _in_steps(d, len(turns), step)
    cut = sum(1 for i in long_results if i >= d)
    return result(without(d), ("drop", d), left_out=d, cut=cut, reasoning=keep_reasoning)


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
    trained: int | None = None,
    step: int = 1,
    **template_kwargs,
) -> FittedHistory:
    """:func:`fit_history` measured with the tokenizer's own chat template.

    Earlier turns' reasoning is sent back only when the template shows it
    (:func:`template_uses_past_reasoning`). ``tools`` and ``template_kwargs`` (e.g.
    ``enable_thinking``) are rendered as they will be for generation; ``trained`` and
    ``step`` are :func:`fit_history`'s. Raises as :func:`fit_history` does.
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
        trained=trained,
        step=step,
    )

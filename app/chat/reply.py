"""The one place a conversation becomes a reply (used by the CLI and the window's worker).

:func:`run_reply` renders the prompt with the model's chat template, runs the engine
(``app.engine.generate.generate``, plain or DFlash), feeds every committed token through one
:class:`~app.chat.pipeline.TextPipeline`, cancels the engine on a stop string or on the caller's
``cancel_event``, and, with ``run_tools``, runs parsed tool calls and continues the reply with
their results until the model answers without calls (at most ``max_tool_rounds`` rounds).

It runs entirely in the calling thread, which must be the thread that owns MLX (the worker).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from app.chat.events import (  # noqa: F401 (re-exported: the reply's events and results)
    ContentDelta,
    PipelineWarning,
    ReasoningDelta,
    Reply,
    ReplyDone,
    ReplyEvent,
    ReplyRound,
    ResumeRound,
    RoundFinished,
    RoundResumed,
    RoundStarted,
    StopStringHit,
    ToolCall,
    ToolCallDelta,
    ToolResultEvent,
    ToolRun,
)
from app.chat.pipeline import TextPipeline
from app.chat.settings import ReplySettings, Sampling  # noqa: F401 (re-exported)
from app.chat.templates import render_prompt
from app.engine.events import CycleEvent, Done, Summary, TokenEvent
from app.engine.modes import DRAFTER_MODES


def _engine_generate(target, prompt_ids, config, drafter=None, **kwargs):
    """``app.engine.generate.generate`` (looked up at call time; tests replace this with
    stand-ins whose generation object has ``Generation``'s ``cancel`` and ``cancel_on``)."""
    from app.engine.generate import generate

    return generate(target, prompt_ids, config, drafter=drafter, **kwargs)


def _history_boundary(target, convo, settings, prompt_ids: list[int]) -> list[int]:
    """Where the rendered history ends before the generation prompt (a prefix-reuse snapshot
    point), or nothing when the template does not render it as a prefix of the prompt."""
    try:
        kwargs = {"tools": settings.tools, "add_generation_prompt": False}
        if settings.enable_thinking is not None:
            kwargs["enable_thinking"] = settings.enable_thinking
        history = list(target.tokenizer.apply_chat_template(convo, **kwargs))
    except Exception:
        return []
    n = len(history)
    return [n] if 0 < n < len(prompt_ids) and prompt_ids[:n] == history else []


def preamble_boundary(target, convo, settings, prompt_ids: list[int]) -> list[int]:
    """Where the system + tools preamble ends: the rendered leading system messages (with the
    tool definitions), or, with no system message, what the template writes before the first
    user message's text. Every new chat with the same system prompt, tools and thinking switch
    starts with these tokens, so a recurrent-state snapshot there lets a new chat reuse them
    (``app.engine.prefix``). Nothing when the template does not render it as a prefix of
    ``prompt_ids``."""
    from app.engine.prefix import common_prefix

    lead = []
    for m in convo:
        if m.get("role") != "system":
            break
        lead.append(m)
    kwargs: dict[str, Any] = {"add_generation_prompt": False, "tokenize": False}
    if settings.tools:
        kwargs["tools"] = settings.tools
    if settings.enable_thinking is not None:
        kwargs["enable_thinking"] = bool(settings.enable_thinking)
    tok = target.tokenizer

    def ids_of(messages):
        return list(tok.encode(tok.apply_chat_template(messages, **kwargs),
                               add_special_tokens=False))

    try:
        if lead:
            ids = ids_of(lead)
        else:  # what two different first messages share
            a = ids_of([{"role": "user", "content": "a"}])
            ids = a[: common_prefix(a, ids_of([{"role": "user", "content": "b"}]))]
    except Exception:
        return []
    n = len(ids)
    return [n] if 0 < n < len(prompt_ids) and prompt_ids[:n] == ids else []


_PROBES = ("a", "b")
"""Two different next messages: what their rendered prompts share is what any next message's
prompt starts with."""


def next_turn_prefix(target, messages: list[dict], settings: ReplySettings) -> list[int]:
    """The token ids every next turn's prompt after ``messages`` starts with, whatever the
    user writes next: the common prefix of the prompts (:func:`render_prompt`, as
    :func:`run_reply` renders them) of ``messages`` followed by two different user messages.

    A template may render the history differently once a new user message follows (Qwen's
    templates drop the reasoning of the replies before the last user message), so the prompt
    of the next turn is often not an extension of what the target's cache holds after a reply;
    this prefix is. Empty when nothing is shared or the template fails on these messages.
    """
    from app.engine.prefix import common_prefix

    try:
        a, b = (list(render_prompt(target.tokenizer, [*messages, {"role": "user", "content": t}],
                                   tools=settings.tools,
                                   enable_thinking=settings.enable_thinking).ids)
                for t in _PROBES)
    except Exception:
        return []
    return a[: common_prefix(a, b)]


def prefill_prefix(target, drafter, ids: list[int], session, boundaries: list[int] = ()):
    """Prefill ``ids`` into the kept prefix cache ``session`` (an
    ``app.engine.prefix.PromptCache``) without generating a reply: what it already holds is
    reused, the rest is run through the target (and, with ``drafter``, recorded as the
    drafter's context, so a DFlash or DFlash2 turn reuses it as plain does), and the state
    after ``ids`` is kept (a recurrent-state snapshot there) for the next prompt that starts
    with them. Exact as any reuse: a later prompt gives the tokens of a cold prefill.

    Returns the engine's ``Summary`` (``prompt_tokens``, ``reused_tokens``, ``ttft_s``: the
    seconds of this prefill).

    Raises:
        GenerationError: ``ids`` is empty.
    """
    from app.engine.generate import GenerationConfig, generate

    # one greedy step computes the last position's logits, which a prefill needs anyway; its
    # token is not fed back, so the cache holds exactly ``ids``
    gen = generate(target, list(ids), GenerationConfig(mode="plain", max_tokens=1),
                   drafter=drafter, session=session, boundaries=list(boundaries))
    summary = None
    for ev in gen:
        if isinstance(ev, Done):
            summary = ev.summary
    return summary


def _generation_config(settings: ReplySettings, mode: str):
    from app.engine.generate import GenerationConfig

    return GenerationConfig(
        mode=mode,
        max_tokens=settings.max_tokens,
        block_size=settings.block_size,
        auto_block=settings.auto_block,
        rollback=settings.rollback,
        fast_verify=settings.fast_verify,
        **settings.sampling.generation_kwargs(),
    )


def _run_tool(call: ToolCall, settings: ReplySettings):
    from app.chat.tools import run_tool

    return run_tool(
        call.name, call.arguments, tools=settings.runnable_tools, timeout_s=settings.tool_timeout_s
    )


def _call_signature(calls: list[ToolCall]) -> list[tuple[str, str]]:
    """The calls of one round as comparable (name, canonical JSON arguments) pairs."""
    import json

    return [(c.name, json.dumps(c.arguments, sort_keys=True, default=str)) for c in calls]


def assistant_message(content: str, reasoning: str, calls: list[ToolCall]) -> dict:
    """An assistant message for the chat template (``reasoning_content`` and ``tool_calls``
    only when non-empty)."""
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = [c.to_message() for c in calls]
    return msg


def tool_message(run: ToolRun) -> dict:
    """A ``{"role": "tool", "tool_call_id", "name", "content"}`` message carrying the result as
    ``{"ok": ..., "result"|"error": ...}`` JSON text."""
    return {
        "role": "tool",
        "tool_call_id": run.call.id,
        "name": run.call.name,
        "content": run.result.content(),
    }


def run_reply(
    target,
    drafter,
    messages: list[dict],
    settings: ReplySettings,
    cancel_event: threading.Event | None = None,
    session=None,
    resume: ResumeRound | None = None,
) -> Iterator[ReplyEvent]:
    """Produce one reply to ``messages``; a generator of :data:`ReplyEvent`.

    Args:
        target: ``LoadedTarget``; drafter: ``LoadedDrafter`` or None (needed for DFlash).
        messages: the conversation (OpenAI-style dicts; see ``render_prompt``).
        settings: :class:`ReplySettings`.
        cancel_event: set it from any thread to stop; the engine is cancelled before its next
            cycle/token and the reply ends with ``finish_reason == "cancelled"``.
        session: an ``app.engine.prefix.PromptCache`` kept by the caller across turns (prefix
            reuse); None prefills every prompt from scratch.
        resume: continue a round that Max tokens cut (:class:`ResumeRound`) instead of
            starting a new reply: its first round's prompt is ``resume.prompt_ids +
            resume.tokens`` (ids, not text rendered again; with a kept ``session`` only the
            cut round's last token is prefilled), its pipeline reads ``resume.tokens`` again
            first (announced by :class:`RoundResumed`), and the round then goes on as any
            round, up to ``max_tokens`` new tokens; its :class:`ReplyRound` holds the whole
            round (see there). ``messages`` are then the messages that round answered,
            earlier rounds of the reply included (later rounds, after a tool call the
            continuation completes, are rendered from them). Rounds are numbered from
            ``resume.index``.

    Yields, in order per round: :class:`RoundStarted`; the engine's ``TokenEvent`` (kept tokens
    only: none after a stop string or end token) and ``CycleEvent`` (as far as its tokens were
    kept, ``CycleEvent.kept``; the round's ``Summary`` counts the same), interleaved with pipeline
    deltas (``ContentDelta``, ``ReasoningDelta``, ``ToolCallDelta``, ``PipelineWarning``,
    ``StopStringHit``); :class:`RoundFinished`; then one :class:`ToolResultEvent` per executed
    call. The last event is :class:`ReplyDone`. A round that repeats the previous round's calls
    with the same arguments ends the reply (warning ``repeated_tool_call``) instead of running
    them again; ``max_tool_rounds`` bounds the rest (warning ``tool_round_limit``).

    Raises:
        ChatTemplateError: the conversation cannot be rendered.
        EngineError: from the engine (e.g. ``GenerationError`` for a bad block size; DFlash
            without a drafter; a ``resume`` with no tokens, or whose tokens already hold a
            stop string or an end token, so there is nothing to continue).
    """
    from app.engine.errors import GenerationError

    mode = settings.mode
    if mode in DRAFTER_MODES and drafter is None:
        raise GenerationError("DFlash decoding needs a drafter model")
    if settings.max_tool_rounds < 0:
        raise GenerationError("max_tool_rounds must be >= 0")
    reply_warnings: list[dict] = []
    convo = list(messages)
    added: list[dict] = []
    rounds: list[ReplyRound] = []
    executed = 0
    cancelled = False
    next_call = 0
    last_signature: list | None = None  # the calls of the last round whose tools ran
    config = _generation_config(settings, mode)
    first_index = resume.index if resume is not None else 0
    if resume is not None:
        if not resume.tokens or not resume.prompt_ids:
            raise GenerationError("there is no cut reply to continue (no tokens)")
        next_call = resume.first_call_index
        executed = resume.index  # each earlier round of the reply ran its tools
    while True:
        index = first_index + len(rounds)
        resuming = resume if not rounds else None
        if resuming is not None:
            prompt_ids = list(resuming.prompt_ids)
            starts_in_reasoning = resuming.starts_in_reasoning
            gen_ids = prompt_ids + list(resuming.tokens)
        else:
            rendered = render_prompt(target.tokenizer, convo, tools=settings.tools,
                                     enable_thinking=settings.enable_thinking)
            prompt_ids, starts_in_reasoning = list(rendered.ids), rendered.starts_in_reasoning
            gen_ids = prompt_ids
        limit = getattr(target, "context_length", None)
        if isinstance(limit, int) and limit and len(gen_ids) + settings.max_tokens > limit \
                and not any(w["code"] == "context_overflow" for w in reply_warnings):
            reply_warnings.append({  # once a reply: the first round that overflows
                "code": "context_overflow",
                "message": f"the prompt has {len(gen_ids):,} tokens and up to "
                           f"{settings.max_tokens:,} more may be generated, beyond the model's "
                           f"context of {limit:,}: the reply may degrade",
            })
        yield RoundStarted(index=index, prompt_tokens=len(gen_ids), mode=mode)
        pipe = TextPipeline(
            target.tokenizer,
            tools=settings.tools,
            starts_in_reasoning=starts_in_reasoning,
            stop=settings.stop,
            tool_parser=settings.tool_parser,
            eos_token_ids=target.eos_token_ids or None,
            first_call_index=next_call,
            offered_only=settings.offered_tools_only,
        )
        from_draft: list[bool] = []
        if resuming is not None:
            # the cut round's tokens through the pipeline again: its state (reasoning or
            # not, text held back, an open tool call) is where the cut left it
            pipe.feed(resuming.tokens)
            if pipe.stopped or len(pipe.tokens) != len(resuming.tokens):
                raise GenerationError(
                    "the reply already ends with " + (f"the stop string {pipe.stop_hit!r}"
                                                      if pipe.stop_hit else "an end token")
                    + ": there is nothing to continue")
            flags = [bool(f) for f in resuming.from_draft][: len(resuming.tokens)]
            from_draft = flags + [False] * (len(resuming.tokens) - len(flags))
            yield RoundResumed(index=index, content=pipe.content, reasoning=pipe.reasoning,
                               tokens=list(pipe.tokens), from_draft=list(from_draft))
        resumed = len(from_draft)  # tokens of the cut round, before this run's
        extra = {}
        if session is not None:
            boundaries = sorted({*preamble_boundary(target, convo, settings, prompt_ids),
                                 *_history_boundary(target, convo, settings, prompt_ids)})
            if resuming is not None:  # the cut round's prompt ends where its reply begins
                boundaries = sorted({*boundaries, len(prompt_ids)})
            extra = {"session": session, "boundaries": boundaries}
        # With a kept session, plain decoding also gets the drafter: it records the drafter's
        # tap states, so a DFlash turn after a plain one reuses the whole prefix.
        gen = _engine_generate(
            target, gen_ids, config,
            drafter=drafter if mode in DRAFTER_MODES or session is not None else None,
            **extra
        )
        if cancel_event is not None:
            # the engine then sees Stop between prefill chunks too, where it yields nothing
            # this loop could react to
            gen.cancel_on(cancel_event)
        summary: Summary | None = None
        asked_cancel = False
        cycles: list[CycleEvent] = []  # this round's cycles, as far as their tokens were kept
        dropped = 0  # tokens of the current cycle not kept (after a stop string or Stop)
        for ev in gen:
            if cancel_event is not None and cancel_event.is_set() and not asked_cancel:
                gen.cancel()
                asked_cancel = cancelled = True
            if isinstance(ev, TokenEvent):
                if pipe.stopped or cancelled:
                    dropped += 1
                    continue
                from_draft.append(bool(ev.from_draft))
                yield ev
                yield from pipe.feed(ev.token_id)
                if pipe.stopped and not asked_cancel:
                    gen.cancel()
                    asked_cancel = True
            elif isinstance(ev, CycleEvent):
                kept_cycle = ev.kept(ev.committed - dropped)
                dropped = 0
                if kept_cycle is not None:
                    cycles.append(kept_cycle)
                    yield kept_cycle
            elif isinstance(ev, Done):
                summary = ev.summary
        if summary is None:  # an engine that ended without Done: treat as an error
            summary = Summary(mode=mode, stop_cause="error", error="generation ended without Done")
        stop_cause = "cancelled" if cancelled else summary.stop_cause
        if pipe.ended and not cancelled:
            stop_cause = "end_token"
        yield from pipe.finish(stop_cause)
        if pipe.stop_hit is not None and not cancelled and summary.stop_cause == "cancelled":
            summary = replace(summary, stop_cause="stop_string")  # cancelled for the stop string
        kept = list(pipe.tokens)
        if max(0, len(kept) - resumed) != summary.generated_tokens:
            summary = replace(summary, generated_tokens=max(0, len(kept) - resumed))
        if cycles or summary.cycles:  # acceptance and tau over the kept tokens only
            summary = summary.counted_over(cycles, max(0, summary.generated_tokens - 1))
        rnd = ReplyRound(
            index=index,
            mode=mode,
            content=pipe.content,
            reasoning=pipe.reasoning,
            tool_calls=list(pipe.tool_calls),
            finish_reason=pipe.finish_reason or "stop",
            tokens=kept,
            from_draft=from_draft[: len(kept)],
            text=pipe.text,
            summary=summary,
            prompt_ids=prompt_ids,
            warnings=list(pipe.warnings),
            starts_in_reasoning=starts_in_reasoning,
            reasoning_tokens=pipe.reasoning_tokens,
        )
        next_call += len(rnd.tool_calls)
        rounds.append(rnd)
        yield RoundFinished(rnd)
        if summary.stop_cause == "error" and summary.error:
            reply_warnings.append({"code": "engine_error", "message": summary.error})
        assistant = assistant_message(rnd.content, rnd.reasoning, rnd.tool_calls)
        added.append(assistant)
        convo.append(assistant)
        if not (settings.run_tools and rnd.finish_reason == "tool_calls"):
            break
        signature = _call_signature(rnd.tool_calls)
        if signature == last_signature:
            names = ", ".join(sorted({c.name for c in rnd.tool_calls}))
            reply_warnings.append({
                "code": "repeated_tool_call",
                "message": f"the model asked for the same tool call again ({names}, same "
                           "arguments) right after getting its result; stopped instead of "
                           "running it again",
            })
            break
        if executed >= settings.max_tool_rounds:
            reply_warnings.append({
                "code": "tool_round_limit",
                "message": f"stopped after {executed} tool rounds (the limit); the last "
                f"{len(rnd.tool_calls)} call(s) were not run",
            })
            break
        for call in rnd.tool_calls:
            if cancel_event is not None and cancel_event.is_set():
                cancelled = True
                break
            run = ToolRun(call=call, result=_run_tool(call, settings))
            rnd.tool_runs.append(run)
            msg = tool_message(run)
            added.append(msg)
            convo.append(msg)
            yield ToolResultEvent(round=index, run=run)
        executed += 1
        last_signature = signature
        if cancelled or (cancel_event is not None and cancel_event.is_set()):
            cancelled = True
            rnd.finish_reason = "cancelled"
            break
    warnings = [w.to_dict() for r in rounds for w in r.warnings] + reply_warnings
    yield ReplyDone(
        Reply(mode=mode, rounds=rounds, messages=added, warnings=warnings)
    )


def collect_reply(
    target,
    drafter,
    messages: list[dict],
    settings: ReplySettings,
    cancel_event: threading.Event | None = None,
    session=None,
    resume: ResumeRound | None = None,
) -> Reply:
    """Run :func:`run_reply` to the end and return its :class:`Reply`."""
    reply = None
    for ev in run_reply(target, drafter, messages, settings, cancel_event, session=session,
                        resume=resume):
        if isinstance(ev, ReplyDone):
            reply = ev.reply
    assert reply is not None
    return reply


def divergence_near_tie(target, plain: Reply, dflash: Reply) -> dict | None:
    """The target's top-two logits (:func:`app.engine.compare.near_tie`) at the first
    divergence of two replies to the same messages: the prompt of the round where they first
    differ, plus the common prefix inside it. None when they never differ, or when the
    differing round's prompts differ (an earlier difference in tool results). Engine thread.
    """
    from app.engine.compare import first_divergence, near_tie

    for rp, rd in zip(plain.rounds, dflash.rounds, strict=False):
        i = first_divergence(rp.tokens, rd.tokens)
        if i is None:
            continue
        if rp.prompt_ids != rd.prompt_ids:
            return None
        pick = {
            "plain": rp.tokens[i] if i < len(rp.tokens) else None,
            "dflash": rd.tokens[i] if i < len(rd.tokens) else None,
        }
        return near_tie(target, rp.prompt_ids, rp.tokens[:i], pick, i)
    return None

"""One text pipeline for both decoding paths: token ids in, typed deltas out.

Plain and DFlash decoding emit the same :class:`~app.engine.events.TokenEvent` stream; this
module is the only place those ids become text, so nothing the user sees depends on which path
produced them. The stages, in order:

1. **Detokenizer**: mlx-lm's streaming detokenizer from the model's ``TokenizerWrapper``
   (``tokenizer.detokenizer``); it holds back incomplete UTF-8 sequences, so a character split
   across tokens never shows as U+FFFD mid-stream. End tokens are kept in the token list but
   never turned into text.
2. **Stop strings**: matched on the decoded text, in every state, with the markers below, by
   mlx-lm's ``TextStateMachine`` (``mlx_lm.generate``). Text that could be the start of a stop
   string or marker is held back until it is known not to be one (and flushed at the end). On a
   hit the text before it is released, the stop string and everything after it are dropped,
   tokens after the one that completed it are cut, and :attr:`TextPipeline.stopped` tells the
   caller to cancel the engine. (mlx-lm's own stop matching works on token sequences, which
   misses a stop string tokenized differently in context; matching text does not.)
3. **Reasoning split**: text between the thinking markers (``TokenizerWrapper.think_start`` /
   ``think_end``, e.g. ``<think>``/``</think>``) is reasoning; a prompt that pre-opened the block
   starts in reasoning. Inside reasoning only the closing marker is looked for, so a literal
   ``<tool_call>`` there stays reasoning text.
4. **Tool calls**: text between the tool-call markers of the tool parser goes to an
   ``mlx_lm.tool_parsers`` module's ``parse_tool_call`` (the one mlx-lm inferred from the chat
   template, or an override by name), with the tool definitions (the XML parser takes argument
   types from them). A call that cannot be parsed (invalid JSON/XML, or unclosed with an
   incomplete body) stays in the content as text, flagged, with a warning; an unclosed call
   whose body is complete and parses is a call, with an ``unclosed_tool_call`` warning. A call
   still open when the user stopped the reply is neither: it is dropped, with a
   ``stopped_in_tool_call`` warning.

Markers are matched in the decoded text, so they work whether the tokenizer has them as single
special tokens or spells them over several ordinary tokens.

Whitespace: reasoning and content are trimmed at both ends (leading whitespace is dropped,
trailing whitespace is held back until more text follows), as the chat template re-renders
reasoning with ``| trim`` and puts ``\\n\\n`` after ``</think>``.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from mlx_lm.generate import TextStateMachine

from app.chat.events import (  # noqa: F401 (re-exported: the pipeline's events)
    ContentDelta,
    Delta,
    PipelineWarning,
    ReasoningDelta,
    StopStringHit,
    ToolCall,
    ToolCallDelta,
)

_CONTENT, _REASONING, _TOOL = "content", "reasoning", "tool"

FinishReason = Literal["stop", "length", "tool_calls", "cancelled", "error"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "tool_calls", "cancelled", "error")


def finish_reason_for(stop_cause: str | None, *, stop_hit: bool, has_tool_calls: bool) -> str:
    """The reply's finish reason (one of :data:`FINISH_REASONS`).

    ``stop_cause``: the engine's ``Summary.stop_cause`` (``end_token``, ``length``,
    ``cancelled``, ``error``) or None. ``stop_hit``: a stop string ended the reply (the engine
    then reports ``cancelled``, since it was cancelled for it). ``has_tool_calls``: at least
    one call was parsed.

    Errors win; a user cancel (not for a stop string) is ``cancelled``; otherwise parsed calls
    make ``tool_calls``; then ``length`` when the token limit ended it, else ``stop``.
    """
    if stop_cause == "error":
        return "error"
    if stop_cause == "cancelled" and not stop_hit:
        return "cancelled"
    if has_tool_calls:
        return "tool_calls"
    if stop_cause == "length" and not stop_hit:
        return "length"
    return "stop"


def _resolve_parser(tokenizer, override: str | None):
    """(parse function, module name or None, start marker, end marker), or all None."""
    if override:
        try:
            module = importlib.import_module(f"mlx_lm.tool_parsers.{override}")
        except ImportError as exc:
            raise ValueError(f"unknown tool parser {override!r} (see mlx_lm.tool_parsers)") from exc
        try:
            return module.parse_tool_call, override, module.tool_call_start, module.tool_call_end
        except AttributeError as exc:
            raise ValueError(f"{override!r} is not an mlx_lm tool parser") from exc
    parse = getattr(tokenizer, "tool_parser", None)
    start = getattr(tokenizer, "tool_call_start", None)
    end = getattr(tokenizer, "tool_call_end", None)
    if parse is None or not start or not end:
        return None, None, None, None
    name = getattr(parse, "__module__", "").rsplit(".", 1)[-1] or None
    return parse, name, start, end


class TextPipeline:
    """Turns one reply's token ids into content, reasoning and tool-call deltas.

    Usage: call :meth:`feed` with each token id (or a chunk of ids) as the engine emits them,
    act on the returned deltas, cancel the engine when :attr:`stopped` turns True, and call
    :meth:`finish` with the engine's ``stop_cause`` once the generation is done. Tokens fed after
    an end token or a stop string are ignored (not kept, not counted).

    Args:
        tokenizer: an mlx-lm ``TokenizerWrapper`` (detokenizer, thinking markers, tool parser).
        tools: the tool definitions given to the chat template (passed to the tool parser).
        starts_in_reasoning: the prompt pre-opened the thinking block
            (``RenderedPrompt.starts_in_reasoning``).
        stop: stop strings (empty strings are ignored).
        tool_parser: name of an ``mlx_lm.tool_parsers`` module (``"qwen3_coder"``,
            ``"json_tools"``, ...) to use instead of the one mlx-lm inferred.
        eos_token_ids: end tokens (default ``tokenizer.eos_token_ids``).
        first_call_index: number of the first call id (``call_<n>``), so ids stay unique across
            the tool rounds of one reply.
        offered_only: a call naming a tool that is not in ``tools`` (any tool, when ``tools``
            is None) stays text: kept as content with a ``tool_not_offered`` warning, as an
            OpenAI-compatible server answers (its client can only run the functions it
            sent). False: every parsed call is a call.

    Raises:
        ValueError: an unknown ``tool_parser`` name.
    """

    def __init__(
        self,
        tokenizer,
        *,
        tools: list[dict] | None = None,
        starts_in_reasoning: bool = False,
        stop: Sequence[str] | None = None,
        tool_parser: str | None = None,
        eos_token_ids: Iterable[int] | None = None,
        first_call_index: int = 0,
        offered_only: bool = False,
    ):
        self._tools = tools or None
        self._offered = None if not offered_only else {
            (t.get("function") or {}).get("name") for t in (tools or ()) if isinstance(t, dict)}
        self._detok = tokenizer.detokenizer
        eos = tokenizer.eos_token_ids if eos_token_ids is None else eos_token_ids
        self._eos = {int(t) for t in (eos or ())}
        self._stops = sorted({s for s in (stop or ()) if s}, key=len, reverse=True)
        self._parse, self._parser_name, self._tool_start, self._tool_end = _resolve_parser(
            tokenizer, tool_parser
        )
        self._think_start = getattr(tokenizer, "think_start", None)
        self._think_end = getattr(tokenizer, "think_end", None)
        if not (self._think_start and self._think_end):
            self._think_start = self._think_end = None
        self._state = _REASONING if (starts_in_reasoning and self._think_end) else _CONTENT
        self._next_call = first_call_index
        # Markers and stop strings are matched in the decoded text by mlx-lm's
        # TextStateMachine (Aho-Corasick; text that may start a match is held back). Stop
        # strings lead to the end state None in every state. Unlike mlx-lm's default machine,
        # reasoning has no edge into tool calls: a literal <tool_call> there stays reasoning.
        transitions: dict[str, list[tuple[str, str | None]]] = {_CONTENT: []}
        if self._think_start:
            transitions[_CONTENT].append((self._think_start, _REASONING))
            transitions[_REASONING] = [(self._think_end, _CONTENT)]
        if self._tool_start:
            transitions[_CONTENT].append((self._tool_start, _TOOL))
            transitions[_TOOL] = [(self._tool_end, _CONTENT)]
        for edges in transitions.values():
            edges.extend((w, None) for w in self._stops)
        self._sm_state = TextStateMachine(transitions).make_state(initial=self._state)

        self.tokens: list[int] = []
        """Kept token ids (end token included when generated; none after a stop string)."""
        self._in_reasoning: list[bool] = []  # per kept id: read inside the thinking block
        self._text_ends: list[int] = []
        self._raw = ""
        self._tool_buf = ""
        self._hold = {_CONTENT: "", _REASONING: ""}
        self._parts: dict[str, list[str]] = {_CONTENT: [], _REASONING: []}
        self._has_text = {_CONTENT: False, _REASONING: False}
        self.tool_calls: list[ToolCall] = []
        self.warnings: list[PipelineWarning] = []
        self.stop_hit: str | None = None
        """The stop string that ended the reply, or None."""
        self.ended = False
        """True once an end token was fed."""
        self.finish_reason: str | None = None
        """Set by :meth:`finish`: one of :data:`FINISH_REASONS`."""
        self._stop_text_end: int | None = None
        self._finished = False

    # ------------------------------------------------------------------ public state
    @property
    def stopped(self) -> bool:
        """True when the reply is over on the text side (stop string or end token): the
        caller should cancel the engine; further tokens are ignored."""
        return self.stop_hit is not None or self.ended

    @property
    def content(self) -> str:
        """The answer text so far (tool calls and reasoning excluded)."""
        return "".join(self._parts[_CONTENT])

    @property
    def reasoning(self) -> str:
        """The reasoning text so far."""
        return "".join(self._parts[_REASONING])

    @property
    def reasoning_tokens(self) -> int:
        """How many of the kept :attr:`tokens` were generated inside the thinking block:
        those during whose text the pipeline was in reasoning from start to end. A
        pre-opened block counts from the first id; the markers' own ids (``<think>``,
        ``</think>`` as single tokens; the last id of one spelled over several) and the end
        token are not counted, nor is the id that completed a stop string."""
        return sum(self._in_reasoning[: len(self.tokens)])

    @property
    def text(self) -> str:
        """The raw decoded text of the kept tokens: markers included, end tokens excluded, cut
        before the stop string when one was hit."""
        if self._stop_text_end is not None:
            return self._raw[: self._stop_text_end]
        return self._raw

    @property
    def parser_name(self) -> str | None:
        """The ``mlx_lm.tool_parsers`` module in use, or None when tool calls are not parsed."""
        return self._parser_name

    # ------------------------------------------------------------------ feeding
    def feed(self, token_ids: int | Iterable[int]) -> list[Delta]:
        """Consume one token id or several; returns the deltas they produced, in order."""
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        out: list[Delta] = []
        for tid in ids:
            if self.stopped or self._finished:
                break
            tid = int(tid)
            self.tokens.append(tid)
            if tid in self._eos:
                self.ended = True
                self._text_ends.append(len(self._raw))
                self._in_reasoning.append(False)
                break
            was_reasoning = self._sm_state[0] == _REASONING
            self._detok.add_token(tid)
            segment = self._detok.last_segment
            self._raw += segment
            self._text_ends.append(len(self._raw))
            if segment:
                self._split(segment, out)
            self._in_reasoning.append(was_reasoning and self._sm_state[0] == _REASONING)
            del self._in_reasoning[len(self.tokens):]  # a stop string cut the ids after it
        return out

    def finish(self, stop_cause: str | None = None) -> list[Delta]:
        """Flush everything held back and set :attr:`finish_reason`.

        ``stop_cause``: the engine's ``Summary.stop_cause`` (None when unknown: treated as
        ``end_token``). Returns the last deltas (held text, a malformed unclosed call, ...).
        Calling it twice returns nothing the second time.
        """
        out: list[Delta] = []
        if self._finished:
            return out
        if self.stop_hit is None:
            self._detok.finalize()
            segment = self._detok.last_segment
            self._raw += segment
            if self._text_ends:
                self._text_ends[-1] = len(self._raw)
            if segment:
                self._split(segment, out)
            if self.stop_hit is None:
                self._flush(out, stop_cause)
        self._hold = {_CONTENT: "", _REASONING: ""}
        self._finished = True
        self.finish_reason = finish_reason_for(
            stop_cause or "end_token",
            stop_hit=self.stop_hit is not None,
            has_tool_calls=bool(self.tool_calls),
        )
        return out

    # ------------------------------------------------------------------ internals
    def _split(self, text: str, out: list[Delta]) -> None:
        """Run ``text`` through the state machine and route its segments."""
        self._sm_state, segments = TextStateMachine.split(self._sm_state, text)
        self._route_segments(segments, out)
        if self._sm_state[0] is None:  # a stop string matched: the machine has ended
            self._on_stop(len(self._sm_state[3]), out)

    def _flush(self, out: list[Delta], stop_cause: str | None = None) -> None:
        """Release text held as a possible marker/stop prefix (end of generation). A call
        still open when the user stopped the reply is dropped (:meth:`_drop_open_call`);
        one the model left open is closed (:meth:`_close_open_call`), and one the token
        limit cut is dropped unless its body already parses."""
        self._sm_state, held, name = TextStateMachine.flush(self._sm_state)
        if held and name is not None:
            self._route_segments([(name, held)], out)
        if self._state == _TOOL:
            if stop_cause == "cancelled":
                self._drop_open_call(out)
            else:
                self._close_open_call(out, cut=stop_cause == "length")

    def _drop_open_call(self, out: list[Delta]) -> None:
        """The user stopped the reply inside a tool call: the call is not run and not shown as
        content; a ``stopped_in_tool_call`` warning carries its raw text."""
        raw = self._tool_start + self._tool_buf
        self._state = _CONTENT
        self._tool_buf = ""
        self.warnings.append(PipelineWarning(
            "stopped_in_tool_call",
            "stopped while the model was writing a tool call: it was not run", raw))
        out.append(self.warnings[-1])

    def _route_segments(self, segments: list[tuple[str | None, str]], out: list[Delta]) -> None:
        for name, text in segments:
            if name is None:
                break
            if name != self._state:
                self._transition(name, out)
            self._route(text, out)

    def _transition(self, new: str, out: list[Delta]) -> None:
        old, self._state = self._state, new
        if old == _REASONING:
            self._hold[_REASONING] = ""
        elif old == _TOOL:
            body, self._tool_buf = self._tool_buf, ""
            self._complete_call(body, out)
        if new == _TOOL:
            self._tool_buf = ""

    def _on_stop(self, after: int, out: list[Delta]) -> None:
        """A stop string ended at ``len(raw) - after``: cut text and tokens there."""
        end = len(self._raw) - after
        hit = next(w for w in self._stops if self._raw.endswith(w, 0, end))
        self._stop_text_end = end - len(hit)
        keep = next((i + 1 for i, e in enumerate(self._text_ends) if e >= end), len(self.tokens))
        del self.tokens[keep:]
        del self._text_ends[keep:]
        self.stop_hit = hit
        self._close_open_call(out)
        out.append(StopStringHit(stop=hit, kept_tokens=len(self.tokens)))

    def _route(self, text: str, out: list[Delta]) -> None:
        if not text:
            return
        if self._state == _TOOL:
            self._tool_buf += text
        else:
            self._emit(self._state, text, out)

    def _emit(self, kind: str, text: str, out: list[Delta], malformed: bool = False) -> None:
        if not self._has_text[kind]:
            text = text.lstrip()
            if not text:
                return
        held = self._hold[kind] + text
        body = held.rstrip()
        self._hold[kind] = held[len(body):]
        if not body:
            return
        self._has_text[kind] = True
        self._parts[kind].append(body)
        out.append(ContentDelta(body, malformed) if kind == _CONTENT else ReasoningDelta(body))

    def _close_open_call(self, out: list[Delta], cut: bool = False) -> None:
        """An unclosed call at the end of the text. When its body is complete and parses (the
        model only left out the end marker), it is a call, with an ``unclosed_tool_call``
        warning (whose message says so when the token limit, ``cut``, ended the reply right
        before the end marker); otherwise it stays as flagged content (``malformed_tool_call``),
        or, when the token limit cut it (``cut``), it is dropped with a ``cut_in_tool_call``
        warning: the model was not wrong, it ran out of tokens."""
        if self._state != _TOOL:
            return
        body = self._tool_buf
        raw = self._tool_start + body
        self._state = _CONTENT
        self._tool_buf = ""
        calls = None
        complete = body.strip() and (self._parser_name != "qwen3_coder"
                                     or body.rstrip().endswith("</function>"))
        if complete:
            try:
                calls = self._parse_body(body)
            except ValueError:
                calls = None
        if not calls:
            if cut:
                self.warnings.append(PipelineWarning(
                    "cut_in_tool_call", "the reply reached Max tokens while the model was "
                    "writing a tool call: it was not run", raw))
                out.append(self.warnings[-1])
            else:
                self._malformed(raw, "the tool call was not closed", out)
            return
        why = (f"the reply reached Max tokens just before the tool call's end marker "
               f"({self._tool_end})" if cut else
               f"the tool call was not closed ({self._tool_end} missing)")
        if self._not_offered(calls, raw, out):
            return
        self.warnings.append(PipelineWarning(
            "unclosed_tool_call", f"{why}; its complete body was read as a call", raw))
        out.append(self.warnings[-1])
        self._add_calls(calls, out)

    def _malformed(self, raw: str, why: str, out: list[Delta]) -> None:
        self.warnings.append(
            PipelineWarning("malformed_tool_call", f"malformed tool call kept as text: {why}", raw)
        )
        out.append(self.warnings[-1])
        self._emit(_CONTENT, raw, out, malformed=True)

    def _complete_call(self, body: str, out: list[Delta]) -> None:
        raw = f"{self._tool_start}{body}{self._tool_end}"
        try:
            calls = self._parse_body(body)
        except ValueError as exc:
            self._malformed(raw, str(exc), out)
            return
        if not self._not_offered(calls, raw, out):
            self._add_calls(calls, out)

    def _not_offered(self, calls: list[tuple[str, dict]], raw: str, out: list[Delta]) -> bool:
        """With ``offered_only``: when a call in ``calls`` names a tool that was not offered,
        keep the call's ``raw`` text as content with a ``tool_not_offered`` warning and return
        True (none of its calls is made)."""
        if self._offered is None:
            return False
        names = [name for name, _ in calls if name not in self._offered]
        if not names:
            return False
        offered = ", ".join(sorted(n for n in self._offered if n)) or "none"
        self.warnings.append(PipelineWarning(
            "tool_not_offered", f"the model called {names[0]!r}, a tool that was not offered "
            f"(offered: {offered}); its call was kept as text", raw))
        out.append(self.warnings[-1])
        self._emit(_CONTENT, raw, out)
        return True

    def _add_calls(self, calls: list[tuple[str, dict]], out: list[Delta]) -> None:
        for name, arguments in calls:
            call = ToolCall(id=f"call_{self._next_call}", name=name, arguments=arguments)
            self._next_call += 1
            self.tool_calls.append(call)
            out.append(ToolCallDelta(call))

    def _parse_body(self, body: str) -> list[tuple[str, dict]]:
        """Parse one call body with the configured parser; the JSON form is tried as a
        fallback when the body looks like a JSON object. Raises ValueError when malformed."""
        attempts: list[tuple[str | None, Callable[[str, Any], Any]]] = [
            (self._parser_name, self._parse)
        ]
        if self._parser_name != "json_tools" and body.lstrip().startswith("{"):
            attempts.append(("json_tools", _json_parse))
        reason = "unreadable"
        for name, parse in attempts:
            if name == "qwen3_coder" and body.count("<parameter=") != body.count("</parameter>"):
                reason = "a <parameter=...> block is not closed"
                continue
            parsed = _try_parse(parse, body, self._tools)
            if isinstance(parsed, str):
                reason = parsed
                continue
            return parsed
        raise ValueError(reason)


def _json_parse(text: str, tools: Any = None) -> Any:
    return json.loads(text.strip())


def _try_parse(parse: Callable[[str, Any], Any], body: str, tools: Any):
    """[(name, arguments)] from ``parse``, or a string saying why it failed.

    A value the schema types cannot convert (e.g. ``abc`` for an integer) is parsed again
    without the schema, so the call survives with text values and the tool reports the bad
    argument when it runs.
    """
    try:
        try:
            parsed = parse(body.strip(), tools)
        except ValueError:
            if not tools:
                raise
            parsed = parse(body.strip(), None)
    except (ValueError, TypeError, KeyError, AttributeError, SyntaxError) as exc:
        return f"{type(exc).__name__}: {exc}"[:200]
    items = parsed if isinstance(parsed, list) else [parsed]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            return "no function name"
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                return f"arguments are not JSON: {exc.msg}"
        if args is None:
            args = {}
        if not isinstance(args, dict):
            return "arguments are not an object"
        calls.append((item["name"], args))
    if not calls:
        return "no call"
    return calls

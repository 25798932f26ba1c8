"""Chat settings: the one place for their names, defaults, ranges and coercion, and the one
typed record a reply runs with.

Stored keys (QSettings group ``generation``, a conversation's ``settings``, exports) are the
names in :data:`SPECS`, unchanged from earlier versions:

* ``system_prompt`` (str), ``max_tokens`` (int tokens), ``block_size`` (int; 0 = the
  drafter's own), ``auto_block`` (bool: the automatic block size, each cycle's block length
  chosen up to ``block_size``; off by default, and off where a stored file lacks it),
  ``rollback`` ("tape" | "replay"), ``fast_verify`` (bool: the engine's
  near-exact chunked verify, off by default), ``thinking`` (bool), ``stop_strings``
  (list[str]), ``use_tools`` (bool: offer the built-in tools and run their calls);
* sampling: ``temperature`` (float; 0 = greedy), ``top_p`` (float), ``top_k`` (int; 0 = off),
  ``min_p`` (float), ``repetition_penalty`` (float; 1 = off), ``seed`` (int; -1 = none).

:data:`SPECS` holds each setting's one default and range: :class:`ReplySettings`,
:class:`Sampling`, the window's dialog, the CLI's arguments (``app.commands.generation``) and
the server's request checks (``app.serve.protocol``) read them from there. The engine's
``GenerationConfig`` cannot import this layer; its ``max_tokens`` default equals the table's
and its sampling check is wider (see :class:`Sampling`), both held by
``tests/test_settings.py``.

:func:`coerce` turns a stored or typed value into the setting's type and checks its range
(``SettingError`` names the setting and the value). It never clamps and never turns a
missing value (None, e.g. QSettings' ``@Invalid()``) into text: the caller decides what a
refused value becomes (the window's preferences take the default, with a warning:
``app.ui.settings.load_defaults``).

:class:`ReplySettings` (frozen, with :class:`Sampling`, its typed sampling part) is what
crosses the layers: the window builds it with :meth:`ReplySettings.from_values` (through
``app.ui.settings.reply_record``), and ``TurnRequest``, the window worker's backend,
``ChatSession``, the server's worker and the scripted session take it; a variant is
``dataclasses.replace``. Both check their fields on construction (``SettingError``).
:meth:`Sampling.generation_kwargs` is the one mapping onto the engine's ``GenerationConfig``
(whose sampler is mlx-lm's ``make_sampler``). A values dict (:func:`reply_values` keys) is
still accepted where settings are taken, for scripts: :func:`as_reply_settings` converts it
with :func:`reply_settings`, which refuses unknown keys; the typed record is the way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from app.engine.modes import MODES, ROLLBACKS, Mode


class SettingError(ValueError):
    """A setting's value is unusable (or the setting is unknown); the message names it."""


@dataclass(frozen=True)
class Spec:
    """One setting: its stored ``name``, ``default`` (whose type is the setting's type),
    inclusive ``low``/``high`` bounds for numbers (None: unbounded) and allowed ``choices``
    for strings (None: any)."""

    name: str
    default: Any
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] | None = None


SPECS: dict[str, Spec] = {s.name: s for s in (
    Spec("system_prompt", "You are a helpful assistant."),
    Spec("max_tokens", 512, 1, 131072),
    Spec("block_size", 0, 0, 64),
    Spec("auto_block", False),
    Spec("rollback", ROLLBACKS[0], choices=ROLLBACKS),
    Spec("fast_verify", False),
    Spec("thinking", True),
    Spec("stop_strings", []),
    Spec("use_tools", True),
    Spec("temperature", 0.0, 0.0, 2.0),
    Spec("top_p", 1.0, 0.01, 1.0),
    Spec("top_k", 0, 0, 100000),
    Spec("min_p", 0.0, 0.0, 1.0),
    Spec("repetition_penalty", 1.0, 1.0, 2.0),
    Spec("seed", -1, -1, 2**31 - 1),
)}

DEFAULTS: dict = {name: s.default for name, s in SPECS.items()}
"""Every setting's default (a fresh copy of the list default per use: see :func:`defaults`)."""

RANGES: dict = {name: (s.low, s.high) for name, s in SPECS.items() if s.low is not None}
"""Valid ranges of the numeric settings (the dialog's spin boxes use the same ones)."""

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed")


def defaults() -> dict:
    """A new dict of :data:`DEFAULTS` (lists copied)."""
    return {k: list(v) if isinstance(v, list) else v for k, v in DEFAULTS.items()}


def coerce(name: str, value: Any) -> Any:
    """``value`` as setting ``name``'s type (strings from QSettings are read too).

    Raises:
        SettingError: unknown setting; no value (None); a value that is not of the type
            (e.g. "abc" or ``True`` for ``max_tokens``, NaN, a number for
            ``system_prompt``); a string not among the choices; or a number out of range.
            The message names the setting and the value.
    """
    spec = SPECS.get(name)
    if spec is None:
        raise SettingError(f"unknown setting {name!r}")
    if value is None:
        raise SettingError(f"{name} has no value (None)")
    default = spec.default
    if isinstance(default, bool):
        if value in (True, "true", "True", "1", 1):
            return True
        if value in (False, "false", "False", "0", 0):
            return False
        raise SettingError(f"{name} must be true or false, got {value!r}")
    if isinstance(default, int | float):
        if isinstance(value, bool):
            raise SettingError(f"{name} must be a number, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise SettingError(f"{name} must be a number, got {value!r}") from None
        if math.isnan(number) or math.isinf(number):
            raise SettingError(f"{name} must be a finite number, got {value!r}")
        if isinstance(default, int):
            if number != int(number):
                raise SettingError(f"{name} must be a whole number, got {value!r}")
            number = int(number)
        if spec.low is not None:
            _check_range(name, number)
        return number
    if isinstance(default, list):
        if isinstance(value, str):
            return [s for s in value.split("\n") if s]
        if not isinstance(value, list | tuple) or not all(isinstance(s, str) for s in value):
            raise SettingError(f"{name} must be a list of strings, got {value!r}")
        return list(value)
    if not isinstance(value, str):
        raise SettingError(f"{name} must be text, got {value!r}")
    if spec.choices is not None and value not in spec.choices:
        raise SettingError(f"{name} must be one of {', '.join(spec.choices)}, got {value!r}")
    return value


def _bound(x: float) -> str:
    """A range's end as a message shows it: whole numbers in full (2147483647, not
    2.14748e+09), others as ``:g``."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _check_range(name: str, value: Any, what: str = "") -> None:
    """Refuse ``value`` outside setting ``name``'s inclusive range in :data:`SPECS`.

    Raises:
        SettingError: naming the setting, the value and the range.
    """
    spec = SPECS[name]
    if not spec.low <= value <= spec.high:
        raise SettingError(f"{what or name} {value!r} is out of range: it must be between "
                           f"{_bound(spec.low)} and {_bound(spec.high)}")


def _check_number(name: str, value: Any, kind: type) -> None:
    """Refuse a ``value`` that is not a finite number of ``kind`` (int: a whole number; a bool
    is no number).

    Raises:
        SettingError: naming the setting and the value.
    """
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and kind is int:
        ok = isinstance(value, int)
    if ok and not math.isfinite(value):
        ok = False
    if not ok:
        noun = "a whole number" if kind is int else "a finite number"
        raise SettingError(f"{name} must be {noun}, got {value!r}")


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen (mlx-lm's sampler and logits processors).

    Attributes:
        temperature: 0 picks the most likely token (greedy); above 0 samples.
        top_p: nucleus mass in (0, 1]; top_k: the k most likely tokens (0 = all);
        min_p: drop tokens below ``min_p`` times the top probability, in [0, 1].
        repetition_penalty: penalise tokens of the last 20 (None = off).
        seed: seeds the sampler for a reproducible sampled reply (None = not seeded).

    Checked on construction against the ranges of :data:`SPECS` (``SettingError`` naming
    the field), the ranges the window's dialog, the CLI and the server offer. The engine's
    own check (``app.engine.generate``) is wider on purpose: it refuses only what mlx-lm's
    sampler cannot run (a temperature below 0 or not finite, top_p outside (0, 1], ...),
    since the engine serves callers beside these settings (benchmarks, tests); every value
    these ranges allow passes it (``tests/test_settings.py``). Temperature: 0-2 here, any
    finite value >= 0 in the engine.
    """

    temperature: float = SPECS["temperature"].default
    top_p: float = SPECS["top_p"].default
    top_k: int = SPECS["top_k"].default
    min_p: float = SPECS["min_p"].default
    repetition_penalty: float | None = None  # the table's 1.0: off
    seed: int | None = None  # the table's -1: not seeded

    def __post_init__(self) -> None:
        for name, kind in (("temperature", float), ("top_p", float), ("top_k", int),
                           ("min_p", float)):
            _check_number(name, getattr(self, name), kind)
            _check_range(name, getattr(self, name))
        if self.repetition_penalty is not None:
            _check_number("repetition_penalty", self.repetition_penalty, float)
            _check_range("repetition_penalty", self.repetition_penalty)
        if self.seed is not None:
            _check_number("seed", self.seed, int)
            if self.seed < 0:
                raise SettingError(f"seed must be at least 0 (None: not seeded), got "
                                   f"{self.seed!r}")
            _check_range("seed", self.seed)

    @property
    def greedy(self) -> bool:
        """True when tokens are chosen by argmax with no logits processor."""
        return self.temperature <= 0 and not self.repetition_penalty

    @classmethod
    def from_values(cls, values: dict) -> Sampling:
        """From stored values (``repetition_penalty`` 1 and ``seed`` -1 mean off; missing keys
        take their defaults). Raises :class:`SettingError` naming a bad value."""
        v = {k: coerce(k, values.get(k, DEFAULTS[k])) for k in SAMPLING_KEYS}
        return cls(temperature=v["temperature"], top_p=v["top_p"], top_k=v["top_k"],
                   min_p=v["min_p"],
                   repetition_penalty=None if v["repetition_penalty"] == 1.0
                   else v["repetition_penalty"],
                   seed=None if v["seed"] < 0 else v["seed"])

    def generation_kwargs(self) -> dict:
        """The sampling fields of ``app.engine.generate.GenerationConfig`` (same names:
        :data:`SAMPLING_KEYS`)."""
        return {k: getattr(self, k) for k in SAMPLING_KEYS}


@dataclass(frozen=True)
class ReplySettings:
    """How to produce one reply: the one settings record that crosses the layers.

    The window builds it with :meth:`from_values` (its stored values, the chat's overrides
    and the composer's mode); ``TurnRequest.settings``, the window worker's ``Backend.reply``,
    ``ChatSession.reply`` / ``prefill_*`` / ``check_prompt`` / ``send`` / ``continue_reply``,
    the server's worker and the scripted session take it as it is. A variant is
    ``dataclasses.replace(settings, mode=...)`` (a Compare side), never a mutated copy.

    Checked on construction against :data:`SPECS` (the same table the window's dialog, the
    CLI and the server read): ``mode`` is turned into a :class:`~app.engine.modes.Mode`
    (a plain string value is accepted), and a value of the wrong type or out of its range
    raises :class:`SettingError` naming the field.

    Attributes:
        mode: the decoding mode (:class:`~app.engine.modes.Mode`).
        max_tokens: generated-token limit per generation round (tokens, ``SPECS`` range).
        block_size: DFlash block size, a whole number >= 1, or None for the drafter's own.
            Its upper bound is the drafter's block size, which only the loaded drafter knows:
            the engine refuses a larger one (``GenerationError``) when the reply starts.
            With ``auto_block`` it is the largest block the controller may choose.
        auto_block: the automatic block size (``GenerationConfig.auto_block``): DFlash and
            DFlash2 choose each cycle's block length, 1 (a plain step) up to ``block_size``,
            from the measured costs and the recent acceptance. Off by default (fixed
            blocks); ignored by plain and lookup.
        rollback: ``"tape"`` or ``"replay"`` (DFlash recurrent rollback strategy).
        fast_verify: the engine's near-exact chunked verify (``GenerationConfig.fast_verify``).
        enable_thinking: passed to the chat template; None keeps the tokenizer's default.
        stop: stop strings (see :class:`~app.chat.pipeline.TextPipeline`).
        tools: OpenAI-style tool definitions shown to the model (and to the tool parser).
        run_tools: run parsed calls and continue the reply with their results.
        max_tool_rounds: at most this many rounds of tool execution per reply (>= 0).
        tool_parser: ``mlx_lm.tool_parsers`` module name overriding the inferred one.
        offered_tools_only: a call naming a tool not in ``tools`` (any, when ``tools`` is
            None) stays text, with a ``tool_not_offered`` warning
            (``app.chat.pipeline.TextPipeline``'s ``offered_only``); the server sets it, so an
            OpenAI client only gets calls to the functions it sent. Off: every parsed call is
            a call (the window and ``chat`` show a call the model makes to an unknown tool
            and answer it with the tool runner's error).
        runnable_tools: ``app.chat.tools`` ``Tool`` objects allowed to run (None: built-ins).
        tool_timeout_s: seconds one tool call may run (> 0).
        sampling: :class:`Sampling` (default greedy).
        system_prompt: the system message a stored turn puts first when the conversation
            has none of its own (``ChatSession.send``, ``continue_reply``,
            ``prefill_next_turn``); ``ChatSession.reply`` takes its messages as given.
    """

    mode: Mode = Mode.PLAIN
    max_tokens: int = SPECS["max_tokens"].default
    block_size: int | None = None
    auto_block: bool = SPECS["auto_block"].default
    rollback: str = SPECS["rollback"].default
    fast_verify: bool = SPECS["fast_verify"].default
    enable_thinking: bool | None = None
    stop: list[str] = field(default_factory=list)
    tools: list[dict] | None = None
    run_tools: bool = False
    max_tool_rounds: int = 8
    tool_parser: str | None = None
    offered_tools_only: bool = False
    runnable_tools: list | None = None
    tool_timeout_s: float = 10.0
    sampling: Sampling = field(default_factory=Sampling)
    system_prompt: str = ""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", Mode.parse(self.mode))
        except ValueError as exc:
            raise SettingError(str(exc)) from None
        _check_number("max_tokens", self.max_tokens, int)
        _check_range("max_tokens", self.max_tokens)
        if self.block_size is not None:
            _check_number("block_size", self.block_size, int)
            if self.block_size < 1:
                raise SettingError(f"block_size must be at least 1 (None: the drafter's), "
                                   f"got {self.block_size!r}")
        if self.rollback not in SPECS["rollback"].choices:
            raise SettingError(f"rollback must be one of {', '.join(SPECS['rollback'].choices)}"
                               f", got {self.rollback!r}")
        for name in ("fast_verify", "run_tools", "auto_block", "offered_tools_only"):
            if not isinstance(getattr(self, name), bool):
                raise SettingError(f"{name} must be true or false, got "
                                   f"{getattr(self, name)!r}")
        if self.enable_thinking is not None and not isinstance(self.enable_thinking, bool):
            raise SettingError(f"enable_thinking must be true, false or None, got "
                               f"{self.enable_thinking!r}")
        if not isinstance(self.stop, list | tuple) or \
                not all(isinstance(s, str) for s in self.stop):
            raise SettingError(f"stop must be a list of strings, got {self.stop!r}")
        object.__setattr__(self, "stop", list(self.stop))
        _check_number("max_tool_rounds", self.max_tool_rounds, int)
        if self.max_tool_rounds < 0:
            raise SettingError(f"max_tool_rounds must be at least 0, got "
                               f"{self.max_tool_rounds!r}")
        _check_number("tool_timeout_s", self.tool_timeout_s, float)
        if self.tool_timeout_s <= 0:
            raise SettingError(f"tool_timeout_s must be above 0, got {self.tool_timeout_s!r}")
        if not isinstance(self.sampling, Sampling):
            raise SettingError(f"sampling must be a Sampling, got {self.sampling!r}")
        if not isinstance(self.system_prompt, str):
            raise SettingError(f"system_prompt must be a string, got {self.system_prompt!r}")

    @classmethod
    def from_values(cls, values: dict, mode: Any) -> ReplySettings:
        """The record one reply of the window runs with: its effective settings ``values``
        (stored names of :data:`SPECS`: the app defaults from QSettings with the chat's
        overrides on top, ``app.ui.settings.effective``) and the composer's ``mode``.
        Same as ``reply_settings(reply_values(values, mode))``.

        Raises:
            SettingError: a key that is no setting, or a bad value (named).
        """
        return reply_settings(reply_values(values, mode))


DECODING_MODES = MODES
"""The values of a reply's ``mode`` (and of the window's stored ``composer/mode``): the
:class:`app.engine.modes.Mode` table's."""

REPLY_KEYS = frozenset({"mode", "max_tokens", "block_size", "auto_block", "rollback",
                        "fast_verify",
                        "enable_thinking",
                        "stop", "stop_strings", "tools", "run_tools", "use_tools",
                        "max_tool_rounds", "tool_parser", "runnable_tools", "tool_timeout_s",
                        "system_prompt", "thinking", *SAMPLING_KEYS})
"""Keys a reply's values dict may hold (the window's settings plus the run's own)."""


def reply_values(values: dict, mode: str) -> dict:
    """The values dict one reply runs with (what the window hands the worker): the settings
    plus ``mode``; ``block_size`` 0 -> None (the drafter's), ``seed`` -1 -> None,
    ``repetition_penalty`` 1 -> None, ``enable_thinking`` from ``thinking``."""
    s = dict(values)
    s["mode"] = mode
    s["block_size"] = values.get("block_size") or None
    s["seed"] = None if values.get("seed", -1) < 0 else values["seed"]
    s["repetition_penalty"] = None if values.get("repetition_penalty", 1.0) == 1.0 \
        else values["repetition_penalty"]
    s["enable_thinking"] = bool(values.get("thinking", True))
    return s


def reply_settings(values: dict) -> ReplySettings:
    """:class:`ReplySettings` from a reply's values dict (:func:`reply_values`).

    ``block_size`` 0 (as stored) is None, the drafter's own; ``stop_strings`` become
    ``stop`` (unless ``stop`` is given); ``use_tools`` offers the
    built-in tools and runs their calls; the sampling keys make its :class:`Sampling`.

    Raises:
        SettingError: a key that is no setting (a typo is an error, never dropped), a
            ``mode`` not in :data:`DECODING_MODES`, or a bad sampling value.
    """
    unknown = sorted(set(values) - REPLY_KEYS)
    if unknown:
        raise SettingError(f"unknown setting{'s' if len(unknown) > 1 else ''}: "
                           f"{', '.join(unknown)}")
    if "mode" in values and values["mode"] not in DECODING_MODES:
        raise SettingError(f"mode must be one of {', '.join(DECODING_MODES)}, "
                           f"got {values['mode']!r}")
    kwargs = {k: values[k] for k in ("mode", "max_tokens", "block_size", "auto_block", "rollback",
                                     "fast_verify", "enable_thinking", "tools", "run_tools",
                                     "max_tool_rounds", "tool_parser", "runnable_tools",
                                     "tool_timeout_s") if k in values}
    if "block_size" in values:  # 0, as stored, is the drafter's own as None is
        kwargs["block_size"] = values["block_size"] or None
    kwargs["stop"] = list(values.get("stop") or values.get("stop_strings") or [])
    if values.get("use_tools"):
        from app.chat.tools import tool_schemas

        kwargs["tools"] = tool_schemas()
        kwargs["run_tools"] = True
    sampling = {k: values[k] for k in SAMPLING_KEYS if k in values}
    if sampling.get("repetition_penalty") is None:
        sampling.pop("repetition_penalty", None)
    if sampling.get("seed") is None:
        sampling.pop("seed", None)
    kwargs["sampling"] = Sampling.from_values(sampling)
    if values.get("system_prompt") is not None:
        kwargs["system_prompt"] = str(values["system_prompt"])
    return ReplySettings(**kwargs)


def as_reply_settings(settings: ReplySettings | dict) -> ReplySettings:
    """``settings`` as the typed record: a :class:`ReplySettings` as it is, a values dict
    (the compatibility path for scripts: :func:`reply_values` keys) through
    :func:`reply_settings`.

    Raises:
        SettingError: a dict with an unknown key or a bad value; anything else (named).
    """
    if isinstance(settings, ReplySettings):
        return settings
    if isinstance(settings, dict):
        return reply_settings(settings)
    raise SettingError(f"reply settings must be a ReplySettings (or a values dict), got "
                       f"{type(settings).__name__}")

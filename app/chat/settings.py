"""Chat settings: the one place for their names, defaults, ranges and coercion.

Stored keys (QSettings group ``generation``, a conversation's ``settings``, exports) are the
names in :data:`SPECS`, unchanged from earlier versions:

* ``system_prompt`` (str), ``max_tokens`` (int tokens), ``block_size`` (int; 0 = the
  drafter's own), ``rollback`` ("tape" | "replay"), ``fast_verify`` (bool: the engine's
  near-exact chunked verify, off by default), ``thinking`` (bool), ``stop_strings``
  (list[str]), ``use_tools`` (bool: offer the built-in tools and run their calls);
* sampling: ``temperature`` (float; 0 = greedy), ``top_p`` (float), ``top_k`` (int; 0 = off),
  ``min_p`` (float), ``repetition_penalty`` (float; 1 = off), ``seed`` (int; -1 = none).

:func:`coerce` turns a stored or typed value into the setting's type and checks its range
(``SettingError`` names the setting; ``clamp=True`` moves a number into range instead, for
hand-edited preference files). :class:`Sampling` is the typed sampling part of a reply's
settings; :meth:`Sampling.generation_kwargs` is the one mapping onto the engine's
``GenerationConfig`` (whose sampler is mlx-lm's ``make_sampler``). :func:`reply_settings`
builds :class:`ReplySettings` from a values dict and refuses unknown keys. Used by
the window (``app.ui.settings``), the session and the CLI (``app.commands.generation``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from app.engine.modes import MODES, ROLLBACKS


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


def coerce(name: str, value: Any, *, clamp: bool = False) -> Any:
    """``value`` as setting ``name``'s type (strings from QSettings are read too).

    Raises:
        SettingError: unknown setting, a value that is not of the type (e.g. "abc" for
            ``max_tokens``, NaN), a string not among the choices, or a number out of range
            (unless ``clamp``, which moves it to the nearest bound).
    """
    spec = SPECS.get(name)
    if spec is None:
        raise SettingError(f"unknown setting {name!r}")
    default = spec.default
    if isinstance(default, bool):
        if value in (True, "true", "True", "1", 1):
            return True
        if value in (False, "false", "False", "0", 0):
            return False
        raise SettingError(f"{name} must be true or false, got {value!r}")
    if isinstance(default, int | float):
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
        if spec.low is not None and not spec.low <= number <= spec.high:
            if not clamp:
                raise SettingError(f"{name} {number!r} is out of range: it must be between "
                                   f"{spec.low:g} and {spec.high:g}")
            number = type(number)(min(max(number, spec.low), spec.high))
        return number
    if isinstance(default, list):
        if isinstance(value, str):
            return [s for s in value.split("\n") if s]
        if not isinstance(value, list | tuple) or not all(isinstance(s, str) for s in value):
            raise SettingError(f"{name} must be a list of strings, got {value!r}")
        return list(value)
    text = str(value)
    if spec.choices is not None and text not in spec.choices:
        raise SettingError(f"{name} must be one of {', '.join(spec.choices)}, got {value!r}")
    return text


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen (mlx-lm's sampler and logits processors).

    Attributes:
        temperature: 0 picks the most likely token (greedy); above 0 samples.
        top_p: nucleus mass in (0, 1]; top_k: the k most likely tokens (0 = all);
        min_p: drop tokens below ``min_p`` times the top probability, in [0, 1].
        repetition_penalty: penalise tokens of the last 20 (None = off).
        seed: seeds the sampler for a reproducible sampled reply (None = not seeded).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float | None = None
    seed: int | None = None

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
        """The sampling fields of ``app.engine.generate.GenerationConfig`` (same names)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
                "seed": self.seed}


@dataclass
class ReplySettings:
    """How to produce one reply.

    Attributes:
        mode: ``"plain"``, ``"dflash"`` or ``"dflash2"`` (a DFlash2 drafter; see
            :class:`app.engine.generate.GenerationConfig`).
        max_tokens: generated-token limit per generation round (int > 0).
        block_size: DFlash block size (None: the drafter's).
        rollback: ``"tape"`` or ``"replay"`` (DFlash recurrent rollback strategy).
        fast_verify: the engine's near-exact chunked verify (``GenerationConfig.fast_verify``).
        enable_thinking: passed to the chat template; None keeps the tokenizer's default.
        stop: stop strings (see :class:`~app.chat.pipeline.TextPipeline`).
        tools: OpenAI-style tool definitions shown to the model (and to the tool parser).
        run_tools: run parsed calls and continue the reply with their results.
        max_tool_rounds: at most this many rounds of tool execution per reply.
        tool_parser: ``mlx_lm.tool_parsers`` module name overriding the inferred one.
        runnable_tools: ``app.chat.tools`` ``Tool`` objects allowed to run (None: built-ins).
        tool_timeout_s: seconds one tool call may run.
        sampling: :class:`Sampling` (default greedy).
    """

    mode: str = "plain"
    max_tokens: int = 256
    block_size: int | None = None
    rollback: str = "tape"
    fast_verify: bool = False
    enable_thinking: bool | None = None
    stop: list[str] = field(default_factory=list)
    tools: list[dict] | None = None
    run_tools: bool = False
    max_tool_rounds: int = 8
    tool_parser: str | None = None
    runnable_tools: list | None = None
    tool_timeout_s: float = 10.0
    sampling: Sampling = field(default_factory=Sampling)


DECODING_MODES = MODES
"""The values of a reply's ``mode`` (and of the window's stored ``composer/mode``): the
:class:`app.engine.modes.Mode` table's."""

REPLY_KEYS = frozenset({"mode", "max_tokens", "block_size", "rollback", "fast_verify",
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


def reply_settings(values: dict):
    """:class:`ReplySettings` from a reply's values dict (:func:`reply_values`).

    ``stop_strings`` become ``stop`` (unless ``stop`` is given); ``use_tools`` offers the
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
    kwargs = {k: values[k] for k in ("mode", "max_tokens", "block_size", "rollback",
                                     "fast_verify", "enable_thinking", "tools", "run_tools",
                                     "max_tool_rounds", "tool_parser", "runnable_tools",
                                     "tool_timeout_s") if k in values}
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
    return ReplySettings(**kwargs)

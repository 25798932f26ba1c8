"""A Qt-free chat session: the loaded pair, the prompt, the reply, its tool rounds, storage.

:class:`ChatSession` owns one loaded model pair (named by a :class:`PairSpec`, which keeps the
display name and repo id all the way to the status bar) and its prefix cache
(``app.engine.prefix.PromptCache``). It runs on the one thread that owns MLX (the window's
worker, or the CLI's main thread):

* :meth:`ChatSession.load` / :meth:`unload` load and drop a pair;
* :meth:`ChatSession.reply` runs one reply (``app.chat.reply.run_reply``: prompt rendering,
  the engine, the text pipeline, tool rounds) on chat-template messages, after fitting them to
  the context; it yields the reply's typed events;
* :meth:`ChatSession.send` does the whole turn on a :class:`~app.chat.storage.Store` through
  ``app.chat.stored_turn.run_turn`` (the window's worker runs the same function): stores the
  user message, begins the reply row, builds the prompt from the stored messages
  (``stored_turn.prompt_for``), runs the reply, saves its growth and its final state (with
  the tool rounds).

Prompts are always built from stored messages (``Store.prompt_for_reply``), so an earlier
turn's tool calls, tool results and reasoning reach the model as they were generated: a
multi-turn tool chat keeps its facts and the rendered history is a prefix of what the target's
cache holds (prefix reuse).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.chat.events import Notice
from app.chat.examples import DEMO_ABOUT, read_examples
from app.chat.settings import ReplySettings, as_reply_settings
from app.chat.storage import Store
from app.engine.errors import EngineError, PromptTooLongError
from app.engine.modes import DRAFTER_MODES, Mode, drafter_mode
from app.engine.threads import check_engine_thread

log = logging.getLogger(__name__)

TINY_PAIR = "tiny:"
"""A target path standing for ``PairSpec(tiny=True)`` (kept for QSettings values and the
window's default-pair fallback)."""


@dataclass(frozen=True)
class PairSpec:
    """Which model pair to load, and how to name it.

    Attributes:
        target: the target's folder (str path); ignored when ``tiny``.
        drafter: the DFlash drafter's folder, or None for a target alone.
        display_name: what the window shows ("" -> :attr:`label` derives one).
        repo_id: the Hugging Face repo id when the folder is a cached snapshot (None for a
            local folder), so the status bar never shows a snapshot's commit hash.
        tiny: build (or reuse) the random-weight tiny pair in the cache folder instead.
        drafter2: a DFlash2 drafter's folder loaded beside ``drafter`` (a DFlash one), so that
            the mode switch offers plain / DFlash / DFlash2; None for one drafter.
    """

    target: str = ""
    drafter: str | None = None
    display_name: str = ""
    repo_id: str | None = None
    tiny: bool = False
    drafter2: str | None = None

    @property
    def label(self) -> str:
        """The name to show: ``display_name``, else ``repo_id``, else the folder's name."""
        if self.display_name:
            return self.display_name
        if self.repo_id:
            return self.repo_id
        if self.tiny:
            return "tiny random pair"
        return Path(self.target).name or self.target


@dataclass(frozen=True)
class PrefillResult:
    """What :meth:`ChatSession.prefill_next_turn` did: ``tokens`` of the next turn's prompt
    are now in the prefix cache, ``reused`` of them were already there, in ``seconds``."""

    tokens: int
    reused: int
    seconds: float


@dataclass(frozen=True)
class ModelInfo:
    """What the window shows about the loaded pair (plain Python values).

    ``context_length`` in tokens; ``memory_bytes`` is MLX's active memory after loading
    (0 when unknown); ``drafter_block_size`` None without a drafter; ``spec`` the
    :class:`PairSpec` it was loaded from (None for old callers).
    """

    target_name: str
    target_path: str
    drafter_name: str | None = None
    drafter_path: str | None = None
    context_length: int = 0
    model_type: str = ""
    drafter_block_size: int | None = None
    memory_bytes: int = 0
    note: str = ""
    card: str = ""
    device: str = ""
    memory_before_bytes: int = 0
    blas: str = ""
    spec: PairSpec | None = None
    dtype: str = ""
    """The target's weight dtype as loaded (e.g. "bfloat16", "float32"; "" unknown)."""
    examples: list = field(default_factory=list)
    """The target folder's example prompts (:class:`app.chat.examples.Example`)."""
    about: str = ""
    """A sentence or two on what the model is (the bundled demo pair's; "" otherwise)."""
    drafter_kind: str = ""
    """``"dflash"`` or ``"dflash2"``: the kind of ``drafter_name`` ("" without a drafter)."""
    drafter2_name: str | None = None
    """The DFlash2 drafter loaded beside a DFlash one (``PairSpec.drafter2``), else None."""
    drafter2_path: str | None = None
    trained_chat_length: int | None = None
    """The longest chat example the target was trained on, in tokens, when its folder states
    it (``app.models.catalog.trained_chat_length``); prompts are kept within it."""
    @property
    def modes(self) -> tuple[str, ...]:
        """The decoding modes this pair offers: ``"plain"``, then ``"dflash"`` with a DFlash
        drafter, ``"dflash2"`` with a DFlash2 one (either slot), then ``"lookup"``, which
        needs no drafter."""
        out = ["plain"]
        if self.drafter_name and self.drafter_kind != Mode.DFLASH2:
            out.append("dflash")
        if self.drafter2_name or (self.drafter_name and self.drafter_kind == Mode.DFLASH2):
            out.append("dflash2")
        out.append("lookup")
        return tuple(out)


def _about(folder: Path) -> str:
    """What the first screen says about the model in ``folder`` (the bundled demo pair's
    description; "" for others)."""
    from app.paths import is_bundled_target

    if is_bundled_target(folder):
        return DEMO_ABOUT
    try:
        readme = folder / "README.md"  # a copy of the demo pair says what it is
        if readme.is_file() and "DFlash Chat's bundled demo" in \
                readme.read_text(encoding="utf-8", errors="replace")[:300]:
            return DEMO_ABOUT
    except OSError:
        pass
    return ""


def _weights_dtype(target: Any) -> str:
    """The dtype of a loaded target's first weight ("" when unknown); quantized weights give
    their scales' dtype."""
    try:
        from mlx.utils import tree_flatten

        params = tree_flatten(target.model.parameters())
        for name, value in params:
            if name.endswith("scales"):
                return str(value.dtype).replace("mlx.core.", "")
        return str(params[0][1].dtype).replace("mlx.core.", "") if params else ""
    except Exception:
        return ""


def _drafter_key(drafter) -> str | None:
    """The key a drafter's kept context goes under in ``PromptCache.kept_contexts``."""
    return None if drafter is None else f"{getattr(drafter, 'kind', '')}:{drafter.path}"


CPU_WARM_UP_TOKENS = 4
"""New tokens of each warm-up reply after a load on the CPU: enough for a prefill, a verify
and a rollback to have run once in the process (its first MLX calls are the slow ones)."""


class ChatSession:
    """The loaded pair and its prefix cache; runs replies (call everything on one thread,
    the one that owns MLX; the GUI thread is refused with ``WrongThreadError``).

    Args:
        store: where :meth:`send` keeps conversations (None: :meth:`send` is unavailable;
            the window's worker stores replies with ``app.chat.stored_turn.run_turn`` on the
            store it was given, calling :meth:`reply`).
        prefix_cache_bytes: memory bound of the prefix cache's saved conversation states
            (bytes; None: ``app.engine.prefix.default_max_bytes()``; 0: reuse only the last
            reply's state); :meth:`set_prefix_cache_bytes` changes it later.
    """

    def __init__(self, store: Store | None = None,
                 prefix_cache_bytes: int | None = None) -> None:
        self.store = store
        self.prefix_cache_bytes = prefix_cache_bytes
        self.target = None
        self.drafter = None
        self.drafter2 = None  # a DFlash2 drafter beside a DFlash one (PairSpec.drafter2)
        self._cache_drafter = None  # the drafter whose context the prefix cache holds
        self.cache = None  # app.engine.prefix.PromptCache of the loaded target
        self.spec: PairSpec | None = None

    # ------------------------------------------------------------------ loading
    def load(self, spec: PairSpec | str, drafter: str | None = None) -> ModelInfo:
        """Load a pair and check it fits; returns what the window shows.

        ``spec`` is a :class:`PairSpec` (a plain target path plus ``drafter`` is accepted
        too). The previous pair is dropped first and MLX's buffer cache cleared (switching
        must not hold two models in memory); ``ModelInfo.memory_before_bytes`` is MLX's active
        memory before that.

        Raises:
            app.engine.errors.ModelNotFoundError, ModelLoadError, PairMismatchError (and other
            ``EngineError`` subclasses): nothing is loaded then.
        """
        check_engine_thread()
        if not isinstance(spec, PairSpec):
            spec = (PairSpec(tiny=True) if str(spec) == TINY_PAIR
                    else PairSpec(target=str(spec), drafter=drafter or None))

        before = self.memory_bytes()
        previous = self.spec
        self.unload()
        try:
            return self._load_spec(spec, before)
        except Exception:
            if previous is not None:  # a failed load leaves the working pair loaded
                try:
                    self._load_spec(previous, before)
                except Exception:
                    log.exception("reloading the previous pair after a failed load")
                    self.unload()
            raise

    def warm_up(self, force: bool = False, auto_block: bool = False) -> float | None:
        """Run both paths once before anything is timed: one short plain and one short DFlash
        reply per drafter (:func:`app.engine.warmup.warm_up`; no prompt cache is touched).
        On a GPU backend the replies are long enough to build every kernel a reply needs; on
        the CPU (:func:`app.engine.warmup.needs_warm_up` False), where nothing is compiled,
        they are :data:`CPU_WARM_UP_TOKENS` long unless ``force`` asks for the full warm-up.
        ``auto_block``: the drafters' replies run with the automatic block size, which
        measures each pair's cost model (``app.engine.costs``) here, not in the first reply.
        The unit tool's registry is built meanwhile in a background thread
        (:func:`app.chat.tools.units.build_in_background`), so the first conversion of a
        session does not take half a second (the thread shares the interpreter: the demo
        pair's CPU warm-up took 0.30 s with it against 0.21 s without).

        Returns:
            Seconds spent, or None when no pair is loaded.
        """
        check_engine_thread()
        from app.chat.tools.units import build_in_background
        from app.engine.warmup import needs_warm_up, warm_up

        if self.target is None:
            return None
        build_in_background()  # the unit tool's registry, off this thread
        short = not (force or needs_warm_up())
        extra = {"max_tokens": CPU_WARM_UP_TOKENS} if short else {}
        if auto_block:
            extra["auto_block"] = True
        return warm_up(self.target, [self.drafter, self.drafter2], **extra).seconds

    def measure_block_costs(self, rollback: str = "tape") -> float | None:
        """Make sure each loaded drafter's cost model (``app.engine.costs``, what the
        automatic block size chooses by) is known for rollback ``rollback``: from memory or
        the store, else measured now (about a second on the demo pair), so that the next
        automatic reply does not measure it. Called when the automatic block size is turned
        on while a pair is loaded (a load with it on measures in :meth:`warm_up`).

        Returns:
            Seconds spent (near 0 when every model was known), or None with no pair or no
            drafter loaded.

        Raises:
            ValueError: ``rollback`` is not ``"tape"`` or ``"replay"``.
        """
        check_engine_thread()
        if rollback not in ("tape", "replay"):
            raise ValueError(f"rollback must be 'tape' or 'replay', not {rollback!r}")
        drafters = [d for d in (self.drafter, self.drafter2) if d is not None]
        if self.target is None or not drafters:
            return None
        from app.engine import costs
        from app.engine.generate import target_runner

        t0 = time.perf_counter()
        runner = target_runner(self.target)
        for d in drafters:
            costs.model_for(runner, self.target.model, d, rollback,
                            getattr(self.target, "path", None))
        return time.perf_counter() - t0

    def probe_drafters(self) -> list:
        """Probe each loaded drafter's fit (:func:`app.chat.drafter_probe.probe_drafter`: a
        few greedy cycles on a fixed short prompt; no prompt cache is touched).

        Returns:
            One :class:`app.chat.drafter_probe.DrafterProbe` per loaded drafter (the DFlash
            drafter's, then the DFlash2 one's); empty with no drafter or no pair.
        """
        check_engine_thread()
        from app.chat.drafter_probe import probe_drafter

        if self.target is None:
            return []
        return [probe_drafter(self.target, d) for d in (self.drafter, self.drafter2)
                if d is not None]

    def set_prefix_cache_bytes(self, n: int | None) -> None:
        """Bound the prefix cache's saved conversation states to ``n`` bytes (None: the
        default for this machine, ``app.engine.prefix.default_max_bytes()``; 0: keep none),
        for this pair and the ones loaded after it; states over the bound go at once, the
        least recently used first."""
        check_engine_thread()
        self.prefix_cache_bytes = None if n is None else max(0, int(n))
        if self.cache is not None:
            from app.engine.prefix import default_max_bytes

            self.cache.resize(default_max_bytes() if self.prefix_cache_bytes is None
                              else self.prefix_cache_bytes)

    def has_model(self) -> bool:
        """True while a target is loaded (after a failed :meth:`load`, the previous one)."""
        return self.target is not None

    def _load_spec(self, spec: PairSpec, before: int) -> ModelInfo:
        """Load ``spec`` into this session (nothing loaded before); see :meth:`load`."""
        from app.models import loader

        note = ""
        target, drafter_path = spec.target, spec.drafter
        if spec.tiny:
            from app.models.tiny import fallback_pair

            t_dir, d_dir = fallback_pair()
            target, drafter_path = str(t_dir), str(d_dir)
            note = ("The bundled demo pair is missing: a tiny random-weight pair is loaded "
                    "instead (its replies are gibberish).")
        loader.start_kernel_build(target, drafter_path, spec.drafter2)  # CUDA: while loading
        new_target = loader.load_target(target)
        new_drafter = None
        if drafter_path:
            new_drafter = loader.load_drafter(drafter_path)
            loader.check_pair(new_target, new_drafter)
            from app.models.catalog import warn_drafter_defaults

            warn_drafter_defaults(new_drafter.path)
        new_drafter2 = None
        if spec.drafter2:
            new_drafter2 = loader.load_drafter(spec.drafter2)
            if new_drafter2.kind != Mode.DFLASH2:
                from app.engine.errors import ModelLoadError

                raise ModelLoadError(f"{new_drafter2.name} is not a DFlash2 drafter "
                                     "(DFlash2DraftModel); it cannot be the second drafter")
            loader.check_pair(new_target, new_drafter2)
        self.target, self.drafter, self.spec = new_target, new_drafter, spec
        self.drafter2, self._cache_drafter = new_drafter2, new_drafter
        from app.engine.prefix import PromptCache

        self.cache = PromptCache(**({} if self.prefix_cache_bytes is None
                                    else {"max_bytes": self.prefix_cache_bytes}))
        self.cache.active_key, self.cache.active_drafter = _drafter_key(new_drafter), new_drafter
        weights_note = getattr(new_target, "weights_note", "")
        if weights_note:  # a quantized target dequantized for the CPU, or why not
            note = (note + " " if note else "") + weights_note[0].upper() + weights_note[1:] + "."
        if "vision_config" in (getattr(new_target, "config", None) or {}):
            note = (note + " " if note else "") + ("This is a multimodal checkpoint: it is "
                                                   "used for text; image input is not "
                                                   "supported.")
        card = ""
        try:
            readme = Path(str(new_target.path)) / "README.md"
            if readme.is_file():
                card = readme.read_text(encoding="utf-8", errors="replace")[:4000]
        except OSError:
            pass
        name = spec.display_name or spec.repo_id or str(new_target.name)
        return ModelInfo(
            target_name=name,
            target_path=str(new_target.path),
            drafter_name=str(new_drafter.name) if new_drafter else None,
            drafter_path=str(new_drafter.path) if new_drafter else None,
            context_length=int(getattr(new_target, "context_length", 0) or 0),
            trained_chat_length=getattr(new_target, "trained_chat_length", None),
            model_type=str(getattr(new_target, "model_type", "")),
            drafter_block_size=int(new_drafter.config.block_size) if new_drafter else None,
            memory_bytes=self.memory_bytes(),
            card=card,
            device=_mlx_device(),
            note=note,
            memory_before_bytes=before,
            blas=_blas(),
            spec=spec,
            dtype=_weights_dtype(new_target),
            examples=read_examples(new_target.path),
            about=_about(Path(str(new_target.path))),
            drafter_kind=new_drafter.kind if new_drafter else "",
            drafter2_name=str(new_drafter2.name) if new_drafter2 else None,
            drafter2_path=str(new_drafter2.path) if new_drafter2 else None,
        )

    def unload(self) -> None:
        """Drop the loaded pair and clear MLX's buffer cache."""
        check_engine_thread()
        self.target = self.drafter = self.cache = self.spec = None
        self.drafter2 = self._cache_drafter = None
        import gc

        gc.collect()
        try:
            import mlx.core as mx

            mx.clear_cache()
        except Exception:  # pragma: no cover - older mlx
            pass

    def memory_bytes(self) -> int:
        """MLX active memory in bytes (0 when unavailable)."""
        try:
            import mlx.core as mx

            return int(mx.get_active_memory())
        except Exception:
            return 0

    # ------------------------------------------------------------------ replies
    def reply(self, messages: list[dict], settings: ReplySettings | dict,
              cancel: threading.Event | None = None, resume: Any = None, *,
              fit: bool = True) -> Iterator:
        """Events of one reply to ``messages`` (chat-template dicts).

        ``settings``: the reply's :class:`~app.chat.settings.ReplySettings` (the window
        builds it with ``ReplySettings.from_values``). Every method here that takes settings
        also accepts a values dict (``app.chat.settings.reply_values`` keys), converted with
        ``app.chat.settings.reply_settings``, for scripts; the typed record is the way, and
        the one the window, the server and the CLI pass. The messages are fitted to the context first
        (oldest turns left out; a :class:`Notice` is yielded first then). Yields
        ``app.chat.reply`` events, ending with ``ReplyDone``.

        ``fit``: False sends the messages as given, nothing left out (the server: a client's
        messages are its own, and it checks them against the context before); a prompt over
        the context then fails in the engine.

        ``resume``: an ``app.chat.events.ResumeRound`` to continue a round Max tokens cut
        (``app.chat.reply.run_reply``): its prompt is the cut round's token ids, so no
        :class:`Notice` is given; ``messages`` only serve the rounds after it (a tool call
        the continuation completes).

        Raises:
            SettingError: a settings dict with an unknown key or a bad value.
            EngineError: no model loaded, DFlash without a drafter, or the current message
                alone does not fit the context (``PromptTooLongError``, a ``GenerationError``;
                for ``resume``: the cut round already fills the context).
        """
        check_engine_thread()
        if self.target is None:
            raise EngineError("no model is loaded")
        rs = as_reply_settings(settings)
        mode = rs.mode
        drafter = self.drafter_for(mode)  # plain too: it keeps the drafter's context
        if mode == Mode.DFLASH2 and drafter is None:
            raise EngineError("DFlash2 needs a DFlash2 drafter; none is loaded for this target")
        if mode == Mode.DFLASH and drafter is None:
            raise EngineError("DFlash needs a drafter; none is loaded for this target")
        from app.chat import reply as reply_mod

        if resume is not None:
            self.check_resume(resume)
            try:  # the rounds after the continued one render the messages as first fitted
                messages, _ = self._fit(messages, rs)
            except PromptTooLongError:
                pass  # the continued round's own prompt is its ids; later rounds may overflow
            notice = None
        elif fit:
            messages, notice = self._fit(messages, rs)
        else:
            notice = None
        self._use_drafter(drafter)
        events = reply_mod.run_reply(self.target, drafter, messages, rs, cancel,
                                     session=self.cache, resume=resume)
        if notice is not None:
            return _prepend(notice, events)
        return iter(events)

    def _use_drafter(self, drafter) -> None:
        """Make ``drafter`` the one whose context the prefix cache extends in the next run."""
        if drafter is not self._cache_drafter and self.cache is not None:
            # the kept drafter context is the other drafter's: put it aside and bring back
            # this drafter's own, cut to the tokens it still shares (PromptCache.switch_drafter)
            self.cache.switch_drafter(_drafter_key(self._cache_drafter), _drafter_key(drafter),
                                      self._cache_drafter, drafter)
        self._cache_drafter = drafter
        for other in (self.drafter, self.drafter2):
            if other is not None and other is not drafter and self.cache is not None:
                # the drafter not running keeps its own context in step with this turn, plain
                # ones included, so its first turn after them reuses the prefix
                self.cache.keep_context(_drafter_key(other), other)

    def prefill_next_turn(self, conversation_id: int, settings: ReplySettings | dict,
                          system_prompt: str | None = None,
                          store: Store | None = None) -> PrefillResult | None:
        """Prefill, while the user writes, what the next turn of the stored conversation
        ``conversation_id`` will start with (``app.chat.reply.next_turn_prefix`` of its shown
        messages, as :meth:`send` would render them with ``settings`` and ``system_prompt``,
        by default the settings' own), so that the next turn prefills only the new message.
        ``store``: where the conversation is (default: the session's own).

        A chat template that renders earlier replies differently once a new user message
        follows (Qwen's drop their reasoning) makes the next prompt diverge from what the
        cache holds after a reply, at the start of that reply: without this, the next turn
        prefills the whole last exchange (its tool calls and results included) again, in
        every mode. The window's worker calls it after a reply while it has nothing else to
        do; exact as every reuse (the next reply's tokens are a cold prefill's).

        Returns a :class:`PrefillResult`, or None when there is nothing to do: no model or
        store, a conversation without a finished reply at its end, or a prefix the cache
        already holds.

        Raises:
            app.chat.storage.StorageError: the conversation cannot be read.
            EngineError: from the engine (the kept cache is dropped then, as after any
                failed run).
        """
        check_engine_thread()
        store = store if store is not None else self.store
        if self.target is None or store is None or self.cache is None:
            return None
        from app.chat.stored_turn import prompt_for_next

        rs = as_reply_settings(settings)
        system = rs.system_prompt if system_prompt is None else system_prompt
        return self.prefill_after(prompt_for_next(store, conversation_id, system), rs)

    def prefill_after(self, messages: list[dict], settings: ReplySettings | dict, *,
                      fit: bool = True) -> PrefillResult | None:
        """Prefill what the next turn after ``messages`` (chat-template dicts ending with a
        reply) will start with, as :meth:`prefill_next_turn` does for a stored conversation;
        the local server calls it after a final answer, since its clients send the whole
        history again with the next message. None when there is nothing to do (no model, no
        reply at the end, or a prefix the cache already holds). When the next turn leaves
        earlier turns out to fit, what it most likely starts with is prefilled: the fit of
        ``messages`` and a one-letter message. ``fit``: as :meth:`reply`'s (False: the next
        turn is expected to send ``messages`` whole).

        Raises:
            EngineError: from the engine (the kept cache is dropped then).
        """
        check_engine_thread()
        if self.target is None or self.cache is None:
            return None
        if not messages or messages[-1].get("role") not in ("assistant", "tool"):
            return None
        rs = as_reply_settings(settings)
        fitted = [*messages, {"role": "user", "content": "a"}]
        try:  # as send() fits them: earlier turns' reasoning may be left out
            fitted = self._fit(fitted, rs)[0] if fit else fitted
        except PromptTooLongError:
            return None
        # with earlier turns left out (in steps: app.chat.history.LEAVE_OUT_STEP) the next
        # prompt most likely leaves out the same ones; if a long message leaves out more,
        # nothing is lost but this prefill (reuse matches token ids)
        return self._prefill_next(fitted[:-1], rs)

    def prefill_new_chat(self, settings: ReplySettings | dict,
                         system_prompt: str | None = None) -> PrefillResult | None:
        """Prefill what every new chat with ``settings`` (a :class:`ReplySettings`, or a
        values dict as :meth:`reply` takes: tools, thinking switch, mode) and
        ``system_prompt`` (default: the settings' own) starts with: the system prompt and tool
        definitions up to where the first user message's text begins. The window's worker calls it after a load, so the
        first reply of a fresh start prefills only the user's message; the state is kept at
        the end of the preamble, where every later new chat reuses it as well. Exact as any
        reuse (the reply's tokens are a cold prefill's).

        Returns a :class:`PrefillResult`, or None when there is nothing to do (no model, or a
        preamble the cache already holds).

        Raises:
            SettingError: ``settings`` holds a value that is no setting.
            EngineError: from the engine (the kept cache is dropped then).
        """
        check_engine_thread()
        if self.target is None or self.cache is None:
            return None
        rs = as_reply_settings(settings)
        text = rs.system_prompt if system_prompt is None else system_prompt
        base = [{"role": "system", "content": text}] if text.strip() else []
        return self._prefill_next(base, rs)

    def _prefill_next(self, base: list[dict], rs: ReplySettings) -> PrefillResult | None:
        """Prefill the prefix every next turn after the chat-template messages ``base``
        starts with (:func:`app.chat.reply.next_turn_prefix`), with a snapshot at the end of
        the system + tools preamble; None when the cache already holds it."""
        from app.chat import reply as reply_mod
        from app.engine.prefix import common_prefix

        ids = reply_mod.next_turn_prefix(self.target, base, rs)
        if not ids or common_prefix(self.cache.ids, ids) == len(ids):
            return None
        drafter = self.drafter_for(rs.mode)
        self._use_drafter(drafter)
        t0 = time.perf_counter()
        summary = reply_mod.prefill_prefix(
            self.target, drafter, ids, self.cache,
            reply_mod.preamble_boundary(self.target, base, rs, ids))
        return PrefillResult(tokens=len(ids), reused=summary.reused_tokens if summary else 0,
                             seconds=time.perf_counter() - t0)

    def check_resume(self, resume: Any) -> None:
        """Refuse a continuation (an ``app.chat.events.ResumeRound``) whose cut round already
        fills the context (``app.chat.stored_turn.run_turn`` asks before it starts one).

        Raises:
            PromptTooLongError: its prompt and tokens leave no room for one more token.
        """
        from app.chat.history import context_limit

        model_max = getattr(self.target, "context_length", None)
        if not model_max:
            return  # no known limit: nothing to check against
        limit = context_limit(model_max)
        used = len(resume.prompt_ids) + len(resume.tokens)
        if used >= limit:
            raise PromptTooLongError(
                f"The reply cannot be continued: its prompt and what it wrote take {used:,} "
                f"tokens, the whole {limit:,}-token context of the model.")

    def made_by(self, mode: str | None) -> dict | None:
        """Which loaded models a reply in ``mode`` is made by, as a reply row keeps it (to
        continue it later only with the same ones): ``{"target": folder, "drafter": folder
        or None}`` (the drafter ``mode`` runs; None for plain, whose tokens do not depend on
        it). None when no target is loaded, or ``mode`` needs a drafter that is not."""
        if self.target is None:
            return None
        drafter = self.drafter_for(mode) if mode in DRAFTER_MODES else None
        if mode in DRAFTER_MODES and drafter is None:
            return None
        return {"target": str(self.target.path),
                "drafter": str(drafter.path) if drafter is not None else None}

    def cap_next_reuse(self, n: int | None) -> None:
        """Let the next reply's first prefill reuse at most ``n`` prompt tokens of the kept
        cache (None: no cap); see :meth:`app.engine.prefix.PromptCache.cap_next_reuse`. A
        Compare's later sides are capped at what its first side reused."""
        cap = getattr(self.cache, "cap_next_reuse", None)  # None before a load
        if cap is not None:
            cap(n)

    def check_prompt(self, messages: list[dict], settings: ReplySettings | dict) -> None:
        """Check that ``messages`` fit the context as :meth:`reply` fits them (earlier turns
        may be left out), without generating anything; ``app.chat.stored_turn.run_turn``
        calls it before it keeps a new turn, so a refused message is not stored.

        Raises:
            PromptTooLongError: the current message alone does not fit.
        """
        check_engine_thread()
        if self.target is not None:
            self._fit(messages, as_reply_settings(settings))

    def drafter_for(self, mode: str | None):
        """The loaded drafter a reply in ``mode`` runs: ``"dflash2"`` the DFlash2 one
        (``drafter2``, else ``drafter`` when that is DFlash2), ``"dflash"`` the first drafter,
        ``"plain"`` the one whose context the prefix cache keeps (so a drafting turn after a
        plain one reuses the prefix). None when there is none."""
        if mode == Mode.DFLASH2:
            if self.drafter2 is not None:
                return self.drafter2
            return self.drafter if drafter_mode(self.drafter) is Mode.DFLASH2 else None
        if mode == Mode.DFLASH:
            return self.drafter
        return self._cache_drafter or self.drafter

    def send(self, conversation_id: int, text: str, settings: ReplySettings | dict,
             cancel: threading.Event | None = None) -> Iterator:
        """One whole turn on the store (``app.chat.stored_turn.run_turn``, as the window's
        worker does it): the user message ``text`` and a reply row stored, the prompt read back
        from the stored messages, the reply (its events yielded as :meth:`reply` does, ending
        with ``ReplyDone``), its growth saved through the store's throttle and its final state
        (tool rounds included) stored. The settings' ``system_prompt`` goes first when the
        conversation has no system message. The stored reply row is ``self.last_reply_id``.

        Raises:
            RuntimeError: the session has no store.
            app.chat.storage.StorageError: the turn could not be stored (nothing ran).
            PromptTooLongError: the message does not fit the context (nothing stored).
            EngineError: as :meth:`reply`, once the failed reply is stored (status ``error``).
        """
        if self.store is None:
            raise RuntimeError("ChatSession.send needs a store")
        from app.chat.stored_turn import TurnRequest

        rs = as_reply_settings(settings)
        request = TurnRequest(conversation_id, text, rs, system_prompt=rs.system_prompt)
        return self._stored(request, cancel, PromptTooLongError)

    def continue_reply(self, reply_id: int, settings: ReplySettings | dict,
                       cancel: threading.Event | None = None) -> Iterator:
        """Continue the stored reply ``reply_id``, which Max tokens ended, where it stopped
        (``app.chat.stored_turn.run_turn`` with ``TurnRequest.continue_of``, as the window's
        worker does it): in the mode it was made in, with ``settings`` otherwise (Max tokens
        is how many more tokens), its prompt the ids of its first run plus the tokens it
        wrote; the same row then holds the whole reply. Yields the reply's events as
        :meth:`send` does (a ``RoundResumed`` after the first ``RoundStarted``).

        Raises:
            RuntimeError: the session has no store.
            app.chat.stored_turn.CannotContinueError: the reply cannot be continued (not a
                reply Max tokens ended, a Compare side, not made by the loaded models, its
                tokens already fill the context, ...): nothing ran, the row is as it was.
            app.chat.storage.MessageNotFoundError: no row ``reply_id`` (raised at the call).
            app.chat.storage.StorageError: the reply could not be read or the result stored.
            EngineError: the continuation failed (the row is left as it was).
        """
        if self.store is None:
            raise RuntimeError("ChatSession.continue_reply needs a store")
        from app.chat.stored_turn import CannotContinueError, TurnRequest

        rs = as_reply_settings(settings)
        request = TurnRequest(self.store.get_message(reply_id).conversation_id, "", rs,
                              system_prompt=rs.system_prompt, continue_of=reply_id)
        return self._stored(request, cancel, CannotContinueError)

    def _stored(self, request: Any, cancel: threading.Event | None,
                refused: type[Exception]) -> Iterator:
        """Run ``request`` (a ``TurnRequest``) through ``run_turn`` on the store, yielding the
        reply's events; ``refused`` is raised for ``TurnRefused`` (see :meth:`send`)."""
        from app.chat.events import (
            ReplyFailed,
            ReplyFinished,
            TurnBegun,
            TurnNotStarted,
            TurnRefused,
            TurnStored,
        )
        from app.chat.storage import StorageError
        from app.chat.stored_turn import run_turn

        failed = None
        for tagged in run_turn(self.store, self, request, cancel):
            ev = tagged.event
            if isinstance(ev, TurnRefused):
                raise refused(ev.message)
            if isinstance(ev, TurnNotStarted):
                raise StorageError(ev.message)
            if isinstance(ev, TurnBegun):
                self.last_reply_id = next(iter(ev.reply_ids.values()))
            elif isinstance(ev, ReplyFailed):
                failed = ev.message
            elif isinstance(ev, TurnStored) and ev.error:
                raise StorageError(ev.error)
            elif not isinstance(ev, (ReplyFinished, TurnStored)):
                yield ev
        if failed is not None:
            raise EngineError(failed)

    def top2_gap(self, plain: Any, dflash: Any) -> float | None:
        """The target's top-two logit gap where two replies (``app.chat.reply.Reply``) to the
        same messages first differ (one target forward); None when they do not, or with no
        model loaded."""
        check_engine_thread()
        from app.chat.reply import divergence_near_tie

        tie = divergence_near_tie(self.target, plain, dflash) if self.target else None
        return tie["gap"] if tie else None

    def _fit(self, messages: list[dict], rs: Any) -> tuple[list[dict], Notice | None]:
        """Fit the prompt into the context limit with room for ``max_tokens``, and into the
        chat length the model was trained on when its folder states one
        (``LoadedTarget.trained_chat_length``): earlier reasoning, then earlier tool results,
        then the oldest turns go (``app.chat.history.fit_for_tokenizer``); returns (messages,
        the :class:`Notice` to give, or None).

        Raises :class:`PromptTooLongError` when the current message alone does not fit."""
        from app.chat.history import (
            LEAVE_OUT_STEP,
            ContextOverflowError,
            context_limit,
            fit_for_tokenizer,
        )

        limit = context_limit(getattr(self.target, "context_length", None) or None)
        kwargs = {}
        if rs.enable_thinking is not None:
            kwargs["enable_thinking"] = rs.enable_thinking
        reserve = min(int(rs.max_tokens), limit // 2)
        try:
            fitted = fit_for_tokenizer(
                messages, self.target.tokenizer, limit, reserve=reserve, tools=rs.tools,
                trained=getattr(self.target, "trained_chat_length", None),
                step=LEAVE_OUT_STEP, **kwargs)
        except ContextOverflowError as exc:
            raise PromptTooLongError(
                f"{exc} (the {limit:,}-token context minus {reserve:,} kept free for the "
                "reply: Max tokens reserves up to half the context). Shorten the message, or "
                "lower Max tokens in File › Settings.") from exc
        return fitted.messages, Notice.of_fit(fitted)

    # ------------------------------------------------------------------ extras
    def benchmark(self, max_tokens: int = 48, n_prompts: int = 3) -> dict:
        """A short ``python -m app bench`` on the loaded pair: plain, DFlash + tape and
        DFlash + replay at the drafter's block size (with a DFlash2 drafter beside it also
        DFlash2 with the selector on and off), a few of the pair's held-out prompts, one repeat
        (``app.engine.bench``). Returns ``{"modes": {name: figures}, "accepted":
        [accepted drafts per cycle over the DFlash + tape runs], "prompts": n,
        "block_size": int}``.

        Raises:
            EngineError: no model or no drafter loaded.
        """
        check_engine_thread()
        from app.chat.templates import bench_prompt_ids
        from app.engine import bench

        if self.target is None or self.drafter is None:
            raise EngineError("the benchmark needs a target and a DFlash drafter loaded")
        prompts, _ = bench.default_prompts(Path(str(self.target.path)))
        rendered = [(p.id, bench_prompt_ids(self.target, p)) for p in prompts[:n_prompts]]
        modes = bench.make_modes([self.drafter.config.block_size],
                                 dflash2=self.drafter2 is not None)
        # timed as python -m app bench times them (no per-stage waits), so the two agree
        records = bench.run_matrix(self.target, self.drafter, rendered, modes, 1, max_tokens,
                                   drafter2=self.drafter2)
        tape = modes[1].name
        accepted = [a for r in records if r.mode.name == tape
                    for a in r.summary.accepted_lengths]
        return {"modes": bench.aggregate(records, modes), "accepted": accepted,
                "prompts": len(rendered), "block_size": self.drafter.config.block_size,
                "prompt_tokens": (sum(len(ids) for _, ids in rendered) // len(rendered)
                                  if rendered else 0),
                "max_tokens": int(max_tokens)}

    def pieces(self, tokens: list[int]) -> list[str]:
        """Per-token text through mlx-lm's streaming detokenizer (list[str], len(tokens));
        the end token shows as ""."""
        if self.target is None:
            return [""] * len(tokens)
        detok = self.target.tokenizer.detokenizer
        detok.reset()
        out = []
        eos = set(getattr(self.target, "eos_token_ids", ()) or ())
        for t in tokens:
            if int(t) in eos:  # the end token is counted but not shown as text
                out.append("")
                continue
            detok.add_token(int(t))
            out.append(detok.last_segment)
        detok.finalize()
        if out:
            out[-1] += detok.last_segment
        return out


def _prepend(first: Any, rest: Iterator) -> Iterator:
    yield first
    yield from rest


def _blas() -> str:
    try:
        from app.engine.blas import blas_description

        return blas_description(load_mlx=True)
    except Exception:
        return ""


def _mlx_device() -> str:
    try:
        from app.engine.device import device_description

        return device_description()
    except Exception:  # pragma: no cover
        return "unknown"

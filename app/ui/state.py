"""What the window's controllers share: the store, the preferences, the loaded pair, the
shown conversation and whether a reply runs (:class:`WindowState`).

:class:`app.ui.window.MainWindow` makes one and hands it to each controller
(``app.ui.reply_flow``, ``model_flow``, ``transcript``, ``conversation_flow``,
``serve_flow``); a controller reads and writes these fields and nothing else of the others'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QSettings

from app.chat.baseline import Baselines, SlowStreak
from app.chat.session import ModelInfo, PairSpec
from app.chat.stored_turn import PendingWrites
from app.chat.turns import ConversationView, Turn, ViewStore
from app.engine.lookup import DEFAULT_BLOCK
from app.engine.modes import DRAFTING_MODES, Mode
from app.ui import settings as settings_mod


@dataclass(eq=False)
class WindowState:
    """The window's shared state (one per window, mutable).

    Attributes:
        qs: where defaults, layout, the last model and the serve port live.
        store: the conversation store (the worker writes replies into its database).
        defaults: the default reply settings (``app.ui.settings.load_defaults``), a dict.
        data_dir: the app's data folder (models list), None for the default one.
        model: the loaded pair, None when none is loaded.
        loading: the pair being loaded, None when no load runs.
        memory_bytes: MLX memory in use as the worker last said (bytes).
        conv: the shown conversation, None for the empty view.
        busy: a reply is being generated (one at a time).
        shown_message: the turn whose reasoning, tool calls and figures the side panel shows.
        baselines: plain speeds measured since the pair was loaded (speed-ups use them).
        slow_streak: DFlash replies in a row that were not faster (its advice note).
        drafter_probes: drafter fit probes of the pairs loaded since the app started, by
            ``app.chat.drafter_probe.pair_key`` (the Models window shows them).
        pending_writes: replies the store could not take yet, tried again until it does.
        benchmarking: the short benchmark runs on the worker (a reply waits behind it).
    """

    qs: QSettings
    store: ViewStore
    defaults: dict
    data_dir: Path | None = None
    model: ModelInfo | None = None
    loading: PairSpec | None = None
    memory_bytes: int = 0
    conv: ConversationView | None = None
    busy: bool = False
    shown_message: Turn | None = None
    baselines: Baselines = field(default_factory=Baselines)
    slow_streak: SlowStreak = field(default_factory=SlowStreak)
    drafter_probes: dict = field(default_factory=dict)
    pending_writes: PendingWrites = field(default_factory=PendingWrites)
    benchmarking: bool = False

    def current_settings(self) -> dict:
        """Effective settings for the shown conversation (defaults <- its overrides)."""
        return settings_mod.effective(self.defaults, self.conv.settings if self.conv else {})

    def block_for(self, mode: str, block_size: int | None = None) -> int | None:
        """Block size for the chart's scale (None for plain or with no pair loaded):
        ``block_size`` (a reply's ``ReplySettings.block_size`` or a stored row's), else the
        mode's own (Lookup's default, the drafter's)."""
        if mode not in DRAFTING_MODES or self.model is None:
            return None
        own = DEFAULT_BLOCK if mode == Mode.LOOKUP else self.model.drafter_block_size
        return block_size or own

    def pair_key(self) -> str:
        """The loaded pair as speed baselines compare it ("" when none is loaded)."""
        m = self.model
        return f"{m.target_path}|{m.drafter_path or ''}" if m else ""

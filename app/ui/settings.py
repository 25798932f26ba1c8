"""Generation settings: app defaults in QSettings, per-conversation overrides, the dialog.

Effective settings = :data:`DEFAULTS` <- QSettings app defaults <- the conversation's
overrides (the conversation wins). Names, defaults, ranges and coercion live in
:mod:`app.chat.settings` (the one table, shared with the session and the CLI). A reply
runs with the typed record :func:`reply_record` builds from them and the composer's mode.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QSettings, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
)

from app.chat.settings import (  # noqa: F401 (DEFAULTS, RANGES: the one table, re-exported)
    DEFAULTS,
    RANGES,
    SPECS,
    ReplySettings,
    SettingError,
    coerce,
    defaults,
    reply_values,
)

log = logging.getLogger(__name__)

AUTO_BLOCK_TIP = (
    "Automatic block size: DFlash and DFlash2 choose each cycle's block length, from 1 (a "
    "plain step, no drafts) up to Block size, from the costs measured on this machine and the "
    "recent acceptance. The reply is exact either way: the big model checks every token. "
    "Plain and Lookup ignore it.")
"""The tooltip of the dialog's "Automatic" check box (``auto_block``)."""


def load_defaults(qs: QSettings) -> dict:
    """App defaults from QSettings (group ``generation``) over :data:`DEFAULTS`.

    Each stored value is read with :func:`app.chat.settings.coerce` (the table's type, range
    and choices). A value it refuses, out of range (never clamped to a bound), of the wrong
    type, not finite, or QSettings' invalid value (``@Invalid()``, read as None), keeps the
    table's default, with one warning in the log naming the key, the stored value and the
    default. A text setting written by hand with a comma (``Be brief, please.``), which
    QSettings reads as a list, is that text again."""
    out = defaults()
    qs.beginGroup("generation")
    try:
        for key in DEFAULTS:
            if qs.contains(key):
                raw = qs.value(key)
                try:
                    out[key] = coerce(key, _ini_text(key, raw))
                except SettingError as exc:
                    shown = "@Invalid()" if raw is None else repr(raw)
                    log.warning("preferences: generation/%s = %s is not usable (%s); using "
                                "the default %r", key, shown, exc, DEFAULTS[key])
    finally:
        qs.endGroup()
    return out


def _ini_text(key: str, raw):
    """``raw`` as QSettings read it, with an unquoted comma in a text setting undone: the
    INI format reads ``system_prompt=Be brief, please.`` as ``["Be brief", "please."]``."""
    if isinstance(DEFAULTS[key], str) and isinstance(raw, list) \
            and all(isinstance(s, str) for s in raw):
        return ", ".join(raw)
    return raw


def save_defaults(qs: QSettings, values: dict) -> None:
    """Write app defaults (only known keys) to QSettings."""
    qs.beginGroup("generation")
    try:
        for key in DEFAULTS:
            if key in values:
                v = values[key]
                qs.setValue(key, "\n".join(v) if isinstance(v, list) else v)
    finally:
        qs.endGroup()
    qs.sync()


def effective(defaults: dict, overrides: dict) -> dict:
    """The settings a reply uses: ``defaults`` updated by the conversation's ``overrides``
    (stored keys that are no setting are left out, with a warning naming them)."""
    out = dict(defaults)
    unknown = sorted(k for k in overrides if k not in DEFAULTS)
    if unknown:
        log.warning("conversation settings: unknown %s ignored", ", ".join(unknown))
    out.update({k: v for k, v in overrides.items() if k in DEFAULTS})
    return out


def reply_record(defaults: dict, overrides: dict, mode) -> ReplySettings:
    """The :class:`~app.chat.settings.ReplySettings` the window's next reply runs with: the
    app ``defaults`` (:func:`load_defaults`, QSettings over the table's), the conversation's
    ``overrides`` on top (:func:`effective`) and the composer's ``mode`` (a
    :class:`~app.engine.modes.Mode` or its value). The one way the window builds reply
    settings; the record then crosses the worker, the store and the session unchanged.

    Raises:
        SettingError: a value the table refuses (e.g. a hand-edited chat override), named.
    """
    return ReplySettings.from_values(effective(defaults, overrides), mode)


def say_range(box: QSpinBox | QDoubleSpinBox) -> None:
    """Add the values ``box`` takes to its tooltip (a number outside them cannot be typed,
    so the tooltip says why): ``"From 1 to 32768."``, and what
    its lowest value means where it has a word for it (``"0: off."``)."""
    def text(v: float) -> str:
        return f"{v:g}" if isinstance(box, QDoubleSpinBox) else f"{int(v):,}"

    lo, hi = box.minimum(), box.maximum()
    line = f"From {text(lo)} to {text(hi)}."
    if box.specialValueText():
        line += f" {text(lo)}: {box.specialValueText()}."
    tip = box.toolTip()
    box.setToolTip(f"{tip} {line}" if tip else line)


class SettingsDialog(QDialog):
    """Edit generation settings; "Save for this chat" stores overrides with the conversation,
    "Save as defaults" writes the app defaults. ``saved(dict, str)`` gives the values and
    "conversation" or "defaults"."""

    saved = Signal(dict, str)

    def __init__(self, values: dict, parent=None, max_block: int | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setAccessibleName("Settings")
        self.system = QPlainTextEdit(values["system_prompt"])
        self.system.setFixedHeight(80)
        self.system.setTabChangesFocus(True)  # Tab reaches the other settings
        self.system.setAccessibleName("System prompt")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(*RANGES["max_tokens"])
        self.max_tokens.setValue(values["max_tokens"])
        self.max_tokens.setAccessibleName("Max tokens")
        self.block = QSpinBox()
        self.block.setRange(RANGES["block_size"][0], max_block or RANGES["block_size"][1])
        self.block.setSpecialValueText("drafter default")
        self.block.setValue(values["block_size"])
        self.block.setAccessibleName("Block size")
        self.block.setToolTip("Tokens per DFlash block (1 committed + block-1 drafts); at most "
                              "the drafter's trained block size. With Automatic, the largest "
                              "block a cycle may use.")
        self.auto_block = QCheckBox("Automatic")
        self.auto_block.setChecked(bool(values.get("auto_block", False)))
        self.auto_block.setAccessibleName("Automatic block size")
        self.auto_block.setToolTip(AUTO_BLOCK_TIP)
        self.auto_block.toggled.connect(self._name_block_default)
        self._name_block_default(self.auto_block.isChecked())
        self.rollback = QComboBox()
        self.rollback.addItems(list(SPECS["rollback"].choices))
        self.rollback.setCurrentText(values["rollback"])
        self.rollback.setAccessibleName("Rollback strategy")
        self.rollback.setToolTip("tape: re-run only the recurrence over committed tokens; "
                                 "replay: run the committed tokens through the whole target.")
        self.fast_verify = QCheckBox("Fast verify (near-exact)")
        self.fast_verify.setChecked(bool(values.get("fast_verify", False)))
        self.fast_verify.setAccessibleName("Fast verify (near-exact)")
        self.fast_verify.setToolTip(
            "Faster checking of drafts on hybrid models off Apple GPUs, but the reply can differ "
            "from the plain one. Runs the Gated DeltaNet layers of the verify pass in a "
            "chunked (parallel-in-time) form whose rounding reaches the cached state; off, "
            "DFlash gives exactly the plain reply.")
        self.thinking = QCheckBox("Let the model think before answering")
        self.thinking.setChecked(values["thinking"])
        self.thinking.setAccessibleName("Thinking")
        self.use_tools = QCheckBox("Offer the built-in tools (calculator, time, units, "
                                   "countries)")
        self.use_tools.setChecked(values["use_tools"])
        self.use_tools.setAccessibleName("Use tools")
        self.stops = QLineEdit(" | ".join(values["stop_strings"]))
        self.stops.setPlaceholderText("e.g.  END | ###")
        self.stops.setAccessibleName("Stop strings")
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(*RANGES["temperature"])
        self.temperature.setSingleStep(0.1)
        self.temperature.setValue(values["temperature"])
        self.temperature.setAccessibleName("Temperature")
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(*RANGES["top_p"])
        self.top_p.setSingleStep(0.05)
        self.top_p.setValue(values["top_p"])
        self.top_p.setAccessibleName("Top p")
        self.top_k = QSpinBox()
        self.top_k.setRange(*RANGES["top_k"])
        self.top_k.setSpecialValueText("off")
        self.top_k.setValue(values["top_k"])
        self.top_k.setAccessibleName("Top k")
        self.min_p = QDoubleSpinBox()
        self.min_p.setRange(*RANGES["min_p"])
        self.min_p.setSingleStep(0.01)
        self.min_p.setValue(values["min_p"])
        self.min_p.setAccessibleName("Min p")
        self.rep = QDoubleSpinBox()
        self.rep.setRange(*RANGES["repetition_penalty"])
        self.rep.setSingleStep(0.05)
        self.rep.setSpecialValueText("off")
        self.rep.setValue(values["repetition_penalty"])
        self.rep.setAccessibleName("Repetition penalty")
        self.seed = QSpinBox()
        self.seed.setRange(*RANGES["seed"])
        self.seed.setSpecialValueText("random")
        self.seed.setValue(values["seed"])
        self.seed.setAccessibleName("Seed")
        for box in (self.max_tokens, self.block, self.temperature, self.top_p, self.top_k,
                    self.min_p, self.rep, self.seed):
            say_range(box)
        note = QLabel(
            "Temperature 0 decodes greedily: DFlash then gives exactly the plain reply. Above 0 "
            "both modes sample from the same distribution (mlx-lm's samplers; DFlash accepts a "
            "draft only where it equals the target's sample).")
        note.setWordWrap(True)
        note.setObjectName("figureName")
        form = QFormLayout()
        form.addRow("System prompt", self.system)
        form.addRow("Max tokens", self.max_tokens)
        block_row = QHBoxLayout()
        block_row.setContentsMargins(0, 0, 0, 0)
        block_row.addWidget(self.block, 1)
        block_row.addWidget(self.auto_block)
        form.addRow("Block size", block_row)
        form.addRow("Rollback", self.rollback)
        form.addRow("", self.fast_verify)
        form.addRow("", self.thinking)
        form.addRow("", self.use_tools)
        form.addRow("Stop strings", self.stops)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top p", self.top_p)
        form.addRow("Top k", self.top_k)
        form.addRow("Min p", self.min_p)
        form.addRow("Repetition penalty", self.rep)
        form.addRow("Seed", self.seed)
        buttons = QDialogButtonBox(QDialogButtonBox.Cancel)
        self.for_chat = QPushButton("Save for this chat")
        self.for_chat.setDefault(True)
        self.as_defaults = QPushButton("Save as defaults")
        buttons.addButton(self.for_chat, QDialogButtonBox.AcceptRole)
        buttons.addButton(self.as_defaults, QDialogButtonBox.ApplyRole)
        buttons.rejected.connect(self.reject)
        self.for_chat.clicked.connect(lambda: self._save("conversation"))
        self.as_defaults.clicked.connect(lambda: self._save("defaults"))
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(note)
        lay.addWidget(buttons)
        self._base = dict(values)

    def _name_block_default(self, automatic: bool) -> None:
        """With Automatic the block size is the largest a cycle may use: say so at 0 (a text
        as long as the other, so the box keeps its width)."""
        self.block.setSpecialValueText("up to drafter's" if automatic
                                       else "drafter default")

    def values(self) -> dict:
        """The dialog's values (all keys of :data:`DEFAULTS`)."""
        out = dict(self._base)
        out.update(
            system_prompt=self.system.toPlainText(),
            max_tokens=self.max_tokens.value(),
            block_size=self.block.value(),
            auto_block=self.auto_block.isChecked(),
            rollback=self.rollback.currentText(),
            fast_verify=self.fast_verify.isChecked(),
            thinking=self.thinking.isChecked(),
            use_tools=self.use_tools.isChecked(),
            stop_strings=[s.strip() for s in self.stops.text().split("|") if s.strip()],
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            top_k=self.top_k.value(),
            min_p=self.min_p.value(),
            repetition_penalty=self.rep.value(),
            seed=self.seed.value(),
        )
        return out

    def _save(self, where: str) -> None:
        self.saved.emit(self.values(), where)
        self.accept()

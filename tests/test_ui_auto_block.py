"""The automatic block size in the window (offscreen, pytest-qt, the scripted backend): the
stored ``auto_block`` setting and its check box, the record every reply runs with (Send,
Compare sides, regenerate), the warm-up after a load, the live panel's Block figure with the
controller's reason, and the per-reply figures line."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from test_ui_window import ScriptedBackend, make_window, send_and_wait  # noqa: E402

from app.engine.events import CycleEvent, Summary  # noqa: E402
from app.ui import settings as settings_mod  # noqa: E402
from app.ui.chat import figures_line  # noqa: E402
from app.ui.panels import DFLASH_ONLY, FIGURES, LivePanel, LiveStats, format_figure  # noqa: E402

# ``qs`` and the autouse ``_allow_engine_after`` are conftest.py fixtures.


class RecordingBackend(ScriptedBackend):
    """The scripted session, keeping the settings of every reply and every warm-up's
    ``auto_block`` (None: called without it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.asked: list = []
        self.warm_ups: list = []

    def reply(self, messages, settings, cancel=None):
        events = super().reply(messages, settings, cancel)
        self.asked.append(self.last_settings)
        return events

    def warm_up(self, force: bool = False, **kwargs) -> float:
        self.warm_ups.append(kwargs.get("auto_block"))
        return 0.0

    def measure_block_costs(self, rollback: str = "tape") -> float:
        self.measured = getattr(self, "measured", []) + [rollback]
        return 0.8


def cycle(i: int, block: int, accepted: int, reason: str = "") -> CycleEvent:
    return CycleEvent(i, block - 1, accepted, accepted + 1, False, 0.001, 0.002, 0.0,
                      block=block, reason=reason)


# ------------------------------------------------------------------ stored settings
def test_the_setting_round_trips_through_the_preferences_file(qs):
    assert settings_mod.DEFAULTS["auto_block"] is False
    settings_mod.save_defaults(qs, dict(settings_mod.defaults(), auto_block=True))
    qs.sync()
    assert settings_mod.load_defaults(qs)["auto_block"] is True
    settings_mod.save_defaults(qs, {"auto_block": False})
    assert settings_mod.load_defaults(qs)["auto_block"] is False


def test_a_preferences_file_without_the_key_keeps_fixed_blocks(qs, tmp_path):
    """A file written before the setting existed (its other keys, no ``auto_block``) loads
    with auto off, and its reply record runs fixed blocks."""
    from PySide6.QtCore import QSettings

    path = tmp_path / "old.ini"
    path.write_text("[generation]\nblock_size=8\nmax_tokens=300\nrollback=tape\n")
    old = QSettings(str(path), QSettings.IniFormat)
    values = settings_mod.load_defaults(old)
    assert values["auto_block"] is False and values["block_size"] == 8
    rs = settings_mod.reply_record(values, {}, "dflash")
    assert rs.auto_block is False and rs.block_size == 8
    # a hand-edited value that is no bool keeps the default
    path.write_text("[generation]\nauto_block=maybe\n")
    assert settings_mod.load_defaults(QSettings(str(path), QSettings.IniFormat))[
        "auto_block"] is False


def test_the_check_box_stands_beside_block_size_with_its_tooltip(qtbot):
    dlg = settings_mod.SettingsDialog(dict(settings_mod.defaults(), auto_block=True),
                                      max_block=16)
    qtbot.addWidget(dlg)
    box = dlg.auto_block
    assert box.isChecked() and box.accessibleName() == "Automatic block size"
    tip = box.toolTip()
    assert "1 (a" in tip and "plain step" in tip and "Block size" in tip
    assert "measured on this machine" in tip and "exact either way" in tip
    dlg.show()
    # on the Block size row, right of the spin box
    assert abs(box.geometry().center().y() - dlg.block.geometry().center().y()) < 6
    assert box.geometry().left() >= dlg.block.geometry().right()
    assert dlg.block.value() == 0 and dlg.block.text() == "up to drafter's"  # a cap
    box.setChecked(False)
    assert dlg.values()["auto_block"] is False
    assert dlg.block.text() == "drafter default"
    fresh = settings_mod.SettingsDialog(settings_mod.defaults())
    qtbot.addWidget(fresh)
    assert not fresh.auto_block.isChecked()


# ------------------------------------------------------------------ the window
def test_the_check_box_reaches_every_reply_and_the_warm_up(qtbot, qs):
    """Checked and saved as the default: Send, both Compare sides and a regenerated reply run
    with ``auto_block``; the next load warms up with it (its cost model measured then). Saved
    off for one chat: that chat's replies run fixed blocks."""
    backend = RecordingBackend(cycles=3)
    win = make_window(qtbot, qs, backend)
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        assert backend.warm_ups == [None]  # auto off: the plain warm-up
        send_and_wait(qtbot, win, "fixed", mode="dflash")
        assert backend.asked[-1].auto_block is False
        win.transcript.open_settings()
        dlg = win.transcript.settings_dialog
        assert not dlg.auto_block.isChecked()
        assert "block 4 ·" in win.composer.note.text()
        dlg.auto_block.setChecked(True)
        dlg.as_defaults.click()
        assert settings_mod.load_defaults(qs)["auto_block"] is True
        # the line under the composer names it (Lookup ignores it)
        assert "Next reply: block auto ≤4 ·" in win.composer.note.text()
        win.composer.set_mode("lookup")
        assert "block auto" not in win.composer.note.text()
        win.composer.set_mode("plain")
        assert "block" not in win.composer.note.text()
        send_and_wait(qtbot, win, "auto", mode="dflash")
        assert backend.asked[-1].auto_block is True and backend.asked[-1].mode == "dflash"
        n = len(backend.asked)
        send_and_wait(qtbot, win, "both", compare=True)
        sides = backend.asked[n:]
        assert len(sides) == 2 and all(s.auto_block for s in sides)
        assert {s.mode for s in sides} == {"plain", "dflash"}
        win.composer.set_mode("dflash")
        with qtbot.waitSignal(win.replyFinished, timeout=30_000):
            assert win.send("again")
        with qtbot.waitSignal(win.replyFinished, timeout=30_000):
            assert win.replies.regenerate()
        assert backend.asked[-1].auto_block is True
        # a chat's own override wins
        win.transcript.open_settings()
        dlg = win.transcript.settings_dialog
        assert dlg.auto_block.isChecked()
        dlg.auto_block.setChecked(False)
        dlg.for_chat.click()
        assert win.conv.settings["auto_block"] is False
        send_and_wait(qtbot, win, "fixed again", mode="dflash")
        assert backend.asked[-1].auto_block is False
        # the next load warms up with the automatic block size (a new chat: the default's)
        win.new_chat()
        win.load_model("t2", "d2")
        qtbot.waitUntil(lambda: len(backend.warm_ups) == 2, timeout=10_000)
        assert backend.warm_ups[-1] is True
    finally:
        win.shutdown()


def test_turning_auto_on_after_a_load_measures_the_costs_at_once(qtbot, qs):
    """Ticking Automatic with a pair loaded (loaded with it off, so its warm-up measured
    nothing) asks the worker to measure the block costs now, once per load and rollback, and
    the status line says how long it took; a chat saved with it off asks nothing."""
    backend = RecordingBackend(cycles=3)
    win = make_window(qtbot, qs, backend)
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        assert getattr(backend, "measured", []) == []
        win.transcript.open_settings()
        win.transcript.settings_dialog.for_chat.click()  # auto still off: nothing to measure
        win.transcript.open_settings()
        dlg = win.transcript.settings_dialog
        dlg.auto_block.setChecked(True)
        dlg.as_defaults.click()
        qtbot.waitUntil(lambda: getattr(backend, "measured", None) == ["tape"], timeout=10_000)
        qtbot.waitUntil(lambda: "Measured the block costs in 0.8 s"
                        in win.messages.flash_label.text(), timeout=5_000)
        win.transcript.open_settings()
        win.transcript.settings_dialog.as_defaults.click()  # the same load and rollback
        dlg = win.transcript.open_settings() or win.transcript.settings_dialog
        dlg.rollback.setCurrentText("replay")
        dlg.as_defaults.click()
        qtbot.waitUntil(lambda: backend.measured == ["tape", "replay"], timeout=10_000)
        # an answer with nothing measured leaves another message on the status line alone
        win.messages.flash("Copied", 5000)
        win.transcript.on_block_costs(0.0)
        assert "Copied" in win.messages.flash_label.text()
        # another load of a pair: its costs are asked for again (the auto warm-up's own load
        # measures them, and a save then asks once more, answered from memory)
        first = win.model
        win.load_model("t2", "d2")
        qtbot.waitUntil(lambda: win.model is not first, timeout=10_000)
        win.transcript.open_settings()
        win.transcript.settings_dialog.as_defaults.click()
        qtbot.waitUntil(lambda: backend.measured == ["tape", "replay", "replay"],
                        timeout=10_000)
    finally:
        win.shutdown()


def test_the_block_figure_and_the_figures_line_after_an_auto_reply(qtbot, qs):
    settings_mod.save_defaults(qs, {"auto_block": True})
    backend = ScriptedBackend(cycles=3, block=4)
    win = make_window(qtbot, qs, backend)
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        msg = send_and_wait(qtbot, win, "auto", mode="dflash")
        assert msg.version.result.summary.auto_block
        # the scripted run's last cycle is a plain step, chosen by the controller
        assert win.live.labels["block"].text() == "auto · 1 (plain step)"
        assert win.live.tiles["block"].isVisible()
        assert "Automatic block size: block 1 (a plain step): scripted" in \
            win.live.mode_label.text()
        assert "block 1 (a plain step): scripted" in win.live.labels["block"].toolTip()
        line = figures_line(msg)
        assert "block auto" in line and "block 4" not in line
        settings_mod.save_defaults(qs, {"auto_block": False})
        win.state.defaults = settings_mod.load_defaults(qs)
        fixed = send_and_wait(qtbot, win, "fixed", mode="dflash")
        assert win.live.labels["block"].text() == "4"
        assert win.live.mode_label.text() == ""
        assert "block 4" in figures_line(fixed)
        plain = send_and_wait(qtbot, win, "plain", mode="plain")
        assert not win.live.tiles["block"].isVisible()
        assert "block" not in figures_line(plain)
    finally:
        win.shutdown()


# ------------------------------------------------------------------ the panel alone
def test_the_block_figure_follows_the_cycles(qtbot):
    assert "block" in dict((k, n) for k, n, _ in FIGURES) and "block" in DFLASH_ONLY
    panel = LivePanel()
    qtbot.addWidget(panel)
    panel.resize(420, 400)
    panel.show()
    stats = LiveStats()
    panel.show_stats(stats, 16)
    assert panel.labels["block"].text() == "–"  # no cycle yet
    stats.on_cycle(cycle(0, 16, 15))
    panel.show_stats(stats, 16)
    assert panel.labels["block"].text() == "16" and panel.mode_label.text() == ""
    stats.on_cycle(cycle(1, 5, 2))  # a fixed run cut near max tokens
    panel.show_stats(stats, 16)
    assert panel.labels["block"].text() == "5"
    auto = LiveStats()
    why = "block 6: 3.1 tok in 22 ms, 1.70x a plain step"
    auto.on_cycle(cycle(0, 6, 2, why))
    panel.show_stats(auto, 16)
    assert panel.labels["block"].text() == "auto · 6"
    assert panel.mode_label.text() == f"Automatic block size: {why}."
    assert why in panel.labels["block"].toolTip() and why in panel.tiles["block"].toolTip()
    step = "block 1 (a plain step): 12 ms a token, no drafted block expected to do better"
    auto.on_cycle(CycleEvent(1, 0, 0, 1, False, 0.0, 0.012, 0.0, block=1, reason=step))
    panel.show_stats(auto, 16)
    assert panel.labels["block"].text() == "auto · 1 (plain step)"
    assert step in panel.mode_label.text()
    # finished: the summary's last block and auto flag (the reason of the last cycle stays)
    auto.apply_summary(Summary(mode="dflash", cycles=2, auto_block=True, block_lengths=[6, 1],
                               generated_tokens=5))
    panel.show_stats(auto)
    assert panel.labels["block"].text() == "auto · 1 (plain step)"
    assert step in panel.mode_label.text()
    # a reply shown from the store: no cycles kept, so what auto does instead of why
    stored = LiveStats()
    stored.apply_summary(Summary(mode="dflash", cycles=3, auto_block=True,
                                 block_lengths=[16, 16, 9], generated_tokens=30))
    panel.show_stats(stored, 16)
    assert panel.labels["block"].text() == "auto · 9"
    assert panel.mode_label.text().startswith("Automatic block size: each cycle's length")
    # fixed again: the tooltip is the figure's own
    panel.show_stats(stats, 16)
    assert panel.labels["block"].toolTip() == dict((k, t) for k, _, t in FIGURES)["block"]
    # a summary from before block lengths were recorded
    old = LiveStats()
    old.apply_summary(Summary(mode="dflash", cycles=2, generated_tokens=9))
    panel.show_stats(old, 16)
    assert panel.labels["block"].text() == "–"


def test_block_values_read_as_words():
    assert format_figure("block", None) == "–"
    assert format_figure("block", (16, False)) == "16"
    assert format_figure("block", (16, True)) == "auto · 16"
    assert format_figure("block", (1, True)) == "auto · 1 (plain step)"
    assert format_figure("block", (1, False)) == "1 (plain step)"

"""Issue 20: the window as a new user finds it (offscreen, pytest-qt, scripted backends).

Each test drives what a user does (menus, clicks on the window, keys) and checks what the
window then shows.
"""

from __future__ import annotations

import os
import time

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from PySide6.QtCore import QPoint, Qt  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QApplication, QMessageBox  # noqa: E402

from app.engine.errors import ModelLoadError  # noqa: E402
from test_ui_window import (  # noqa: E402
    PROMPT,
    ScriptedBackend,
    _allow_engine_after,  # noqa: F401 (autouse fixture)
    make_window,
    qs,  # noqa: F401 (fixture)
    send_and_wait,
    tiny_dirs,  # noqa: F401 (fixture)
)


class BenchBackend(ScriptedBackend):
    """A scripted backend with a benchmark that records the max_tokens it was asked for;
    a load fails for targets named ``broken`` and leaves the previous pair loaded."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.bench_calls: list[int] = []
        self.loaded = None

    def load(self, spec):
        if "broken" in str(spec.target):
            raise ModelLoadError(f"{spec.target} has no config.json")
        info = super().load(spec)
        self.loaded = info
        return info

    def has_model(self):
        return self.loaded is not None

    def benchmark(self, max_tokens=48):
        if max_tokens < 1:
            from app.engine.errors import EngineError

            raise EngineError("max_tokens must be at least 1")
        self.bench_calls.append(max_tokens)
        return {"modes": {"plain": {"tok_per_s": 10.0, "identical_tokens": True},
                          "dflash+tape@4": {"tok_per_s": 19.0, "ratio_to_plain": 1.9,
                                            "identical_tokens": True}},
                "accepted": [1, 2, 3], "prompts": 3, "block_size": 4}


def loaded_window(qtbot, qs, backend=None):
    backend = backend or BenchBackend()
    win = make_window(qtbot, qs, backend)
    win.load_model("scripted-target", "scripted-drafter")
    qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
    return win, backend


# ------------------------------------------------------------------ item 1
def test_menu_short_benchmark_runs_with_its_default_length(qtbot, qs):
    win, backend = loaded_window(qtbot, qs)
    try:
        with qtbot.waitSignal(win.benchFinished, timeout=10_000) as blocker:
            win.bench_action.trigger()  # triggered(bool) must not become max_tokens
        assert blocker.args[0] is not None
        assert backend.bench_calls == [48]
        assert not win.banner_row.isVisible()
        assert win._bench_dialog.table.rowCount() == 2
    finally:
        win.shutdown()


# ------------------------------------------------------------------ item 3
def test_failed_load_keeps_the_working_model(qtbot, qs):
    win, backend = loaded_window(qtbot, qs)
    try:
        with qtbot.waitSignal(win.loadFailed, timeout=10_000):
            win.load_model("/somewhere/broken-folder", "")
        assert win.model is not None and win.model.target_name == "scripted"
        assert win.model_label.text().startswith("Target: scripted")
        assert "No model loaded" not in win.model_label.text()
        assert win.banner_kind == "error"
        text = win.banner.text()
        assert text.startswith("Could not load the model: /somewhere/broken-folder has no "
                               "config.json.") and "still loaded" in text
        msg = send_and_wait(qtbot, win, PROMPT, mode="dflash")  # the old pair still answers
        assert msg.version.result.tokens
        # a new chat does not keep the previous chat's error
        with qtbot.waitSignal(win.loadFailed, timeout=10_000):
            win.load_model("/somewhere/broken-folder", "")
        assert win.banner_row.isVisible()
        win.new_chat()
        assert not win.banner_row.isVisible()
        # a later successful load clears an error banner
        with qtbot.waitSignal(win.loadFailed, timeout=10_000):
            win.load_model("/somewhere/broken-folder", "")
        with qtbot.waitSignal(win.modelLoaded, timeout=10_000):
            win.load_model("other-target", "d")
        assert not win.banner_row.isVisible()
    finally:
        win.shutdown()


def test_send_without_any_model_does_not_say_wait(qtbot, qs):
    win = make_window(qtbot, qs, BenchBackend())
    try:
        assert not win.send("hello")
        assert "No model is loaded" in win.banner.text()
        assert "wait" not in win.banner.text()
        assert "File › Models…" in win.banner.text()
    finally:
        win.shutdown()


def test_session_failed_load_reloads_the_previous_pair(tiny_dirs, tmp_path):
    from app.chat.session import ChatSession

    session = ChatSession()
    info = session.load(str(tiny_dirs[0]), str(tiny_dirs[1]))
    assert session.has_model()
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    with pytest.raises(ModelLoadError):
        session.load(str(empty), None)
    assert session.has_model()
    assert str(session.target.path) == info.target_path
    assert session.drafter is not None and session.spec.target == str(tiny_dirs[0])


def _rect_in_window(win, w):
    top_left = w.mapTo(win, QPoint(0, 0))
    return (top_left.x(), top_left.y(), w.width(), w.height())


# ------------------------------------------------------------------ item 2 and Send -> Stop
def test_double_click_on_send_does_not_stop_the_reply(qtbot, qs):
    win, backend = loaded_window(qtbot, qs, BenchBackend(cycles=60, block=4, delay_s=0.01))
    try:
        win.resize(1280, 800)
        qtbot.wait(50)
        c = win.composer
        send_rect = _rect_in_window(win, c.send_btn)
        centre = QPoint(send_rect[0] + send_rect[2] // 2, send_rect[1] + send_rect[3] // 2)
        c.edit.setPlainText(PROMPT)
        interval = QApplication.styleHints().mouseDoubleClickInterval()
        with qtbot.waitSignal(win.replyFinished, timeout=30_000) as blocker:
            QTest.mouseClick(win.windowHandle(), Qt.LeftButton, Qt.NoModifier, centre)
            assert win.busy
            # Stop took Send's place: same rectangle in the window
            assert _rect_in_window(win, c.stop_btn) == send_rect
            assert c.stop_btn.isVisible() and not c.send_btn.isVisible()
            QTest.mouseClick(win.windowHandle(), Qt.LeftButton, Qt.NoModifier, centre,
                             delay=min(100, interval // 3))
        v = blocker.args[0].version
        assert not v.stopped and v.result.finish_reason != "cancelled"
        assert backend.emitted_cycles == 60
        assert c.send_btn.isVisible() and _rect_in_window(win, c.send_btn) == send_rect
    finally:
        win.shutdown()


def test_a_deliberate_click_on_stop_still_stops(qtbot, qs):
    win, backend = loaded_window(qtbot, qs, BenchBackend(cycles=100_000, block=4,
                                                         delay_s=0.002))
    try:
        c = win.composer
        interval = QApplication.styleHints().mouseDoubleClickInterval()
        with qtbot.waitSignal(win.replyFinished, timeout=30_000) as blocker:
            assert win.send(PROMPT)
            qtbot.wait(interval + 150)
            r = _rect_in_window(win, c.stop_btn)
            QTest.mouseClick(win.windowHandle(), Qt.LeftButton, Qt.NoModifier,
                             QPoint(r[0] + r[2] // 2, r[1] + r[3] // 2))
        assert blocker.args[0].version.stopped
    finally:
        win.shutdown()


# ------------------------------------------------------------------ item 5
def test_layout_does_not_jump_and_the_window_goes_small(qtbot, qs):
    from app.engine.events import Summary

    win, backend = loaded_window(qtbot, qs, BenchBackend(cycles=30, block=4, delay_s=0.01))
    try:
        win.resize(1280, 800)
        qtbot.wait(50)
        c = win.composer

        def geometry():
            return (win.chat.width(), _rect_in_window(win, win.chat)[2],
                    [_rect_in_window(win, w) for w in
                     (c.plain_btn, c.dflash_btn, c.colour_box, c.compare_btn, c.action_stack,
                      c.note)])

        before = geometry()
        with qtbot.waitSignal(win.replyFinished, timeout=30_000):
            assert win.send(PROMPT)
            qtbot.waitUntil(lambda: win._run is not None and
                            win._run.sides[""].stats.cycles >= 3, timeout=10_000)
            during = geometry()
        qtbot.wait(100)
        after = geometry()
        assert before == during == after
        # long figures (prompt reuse, big context) do not widen the right column
        big = Summary(mode="dflash", prompt_tokens=123_456, generated_tokens=98_765,
                      ttft_s=1.5, tok_per_s=1234.5, cycles=54_321, drafted=99_999,
                      accepted=88_888, acceptance_rate=0.889, tau=15.99, replays=12_345,
                      rollback_share=0.5, reused_tokens=120_000)
        from app.ui.panels import LiveStats

        st = LiveStats(context_limit=262_144)
        st.apply_summary(big)
        win.live.show_stats(st, 16)
        qtbot.wait(50)
        assert geometry() == after
        # the settings line is whole: its width fits its text
        assert c.note.width() >= c.note.fontMetrics().horizontalAdvance(c.note.text())
        hint = win.minimumSizeHint()
        assert hint.width() <= 900 and hint.height() <= 600
        win.resize(900, 600)
        qtbot.wait(50)
        assert c.note.isVisible()
        assert c.note.width() >= c.note.fontMetrics().horizontalAdvance(c.note.text())
    finally:
        win.shutdown()

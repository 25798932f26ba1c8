"""The window's entry point: single instance, log file, the qasync event loop."""

from __future__ import annotations

import os
import types

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from app.ui import main as ui_main  # noqa: E402


def test_second_launch_reaches_the_first(qtbot, tmp_path):
    name = ui_main.server_name(tmp_path / "data")
    assert name == ui_main.server_name(tmp_path / "data")
    assert name != ui_main.server_name(tmp_path / "other")
    assert not ui_main.notify_running_instance(name, timeout_ms=200)
    raised = []
    server = ui_main.listen(name, lambda: raised.append(True))
    try:
        assert ui_main.notify_running_instance(name)
        qtbot.waitUntil(lambda: raised == [True], timeout=5_000)
    finally:
        server.close()


def test_run_gui_opens_window_logs_and_quits(qtbot, tmp_path, monkeypatch):
    from app.engine.threads import allow_engine_on_current_thread
    from app.ui.window import MainWindow

    monkeypatch.setattr(MainWindow, "load_last_or_default", lambda self: None)
    seen = {}

    def quit_soon():
        wins = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow)
                and w.isVisible()]
        seen["windows"] = len(wins)
        seen["title"] = wins[0].windowTitle() if wins else ""
        QApplication.instance().quit()

    QTimer.singleShot(300, quit_soon)
    try:
        code = ui_main.run_gui(types.SimpleNamespace(data_dir=str(tmp_path / "data")))
    finally:
        allow_engine_on_current_thread()
    assert code == 0
    assert seen == {"windows": 1, "title": "DFlash Chat"}
    log = (tmp_path / "data" / "dflash-chat.log").read_text()
    assert "starting DFlash Chat" in log
    assert (tmp_path / "data" / "conversations.db").is_file()

"""The window's entry point: single instance, log file, the qasync event loop."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

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


RUN_GUI_SCRIPT = """
import sys, types
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
from app.ui import main as ui_main
from app.ui.window import MainWindow

from app.ui.model_flow import ModelController

ModelController.load_last_or_default = lambda self: None
app = QApplication(sys.argv[:1])
seen = {}

def quit_soon():
    wins = [w for w in QApplication.topLevelWidgets()
            if isinstance(w, MainWindow) and w.isVisible()]
    print("windows", len(wins), wins[0].windowTitle() if wins else "", flush=True)
    print("mlx imported", "mlx.core" in sys.modules, flush=True)
    app.quit()

QTimer.singleShot(300, quit_soon)
code = ui_main.run_gui(types.SimpleNamespace(data_dir=sys.argv[1]))
print("exit", code, flush=True)
"""


def test_run_gui_opens_window_logs_and_quits(tmp_path):
    """run_gui in its own process (its qasync loop takes over the QApplication)."""
    import subprocess
    import sys
    from pathlib import Path

    data = tmp_path / "data"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", RUN_GUI_SCRIPT, str(data)], env=env,
                          capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "windows 1 DFlash Chat" in proc.stdout
    assert "exit 0" in proc.stdout
    assert "mlx imported False" in proc.stdout  # the GUI side never imports MLX
    log = (data / "dflash-chat.log").read_text()
    assert "starting DFlash Chat" in log and "quit" in log
    assert (data / "conversations.db").is_file()

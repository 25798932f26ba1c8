"""Window entry point: ``run_gui(args) -> int`` (called by ``app.cli`` with a display or
``--gui``).

One instance at a time: the first launch listens on a :class:`QLocalServer` named after the
data folder; a second launch connects, asks it to come to the front and exits 0. The Qt event
loop runs under qasync so asyncio work (downloads, file I/O) can share it. Logs go to
``<data dir>/dflash-chat.log``.
"""

from __future__ import annotations

import hashlib
import logging
import logging.handlers
import sys
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QSettings
from PySide6.QtNetwork import QLocalServer, QLocalSocket
from PySide6.QtWidgets import QApplication

from app import APP_NAME, __version__
from app.paths import data_dir_problem, data_dir_source, default_data_dir

log = logging.getLogger(__name__)


def server_name(data_dir: Path) -> str:
    """The single-instance socket name for ``data_dir`` (one instance per database)."""
    digest = hashlib.sha1(str(Path(data_dir).resolve()).encode()).hexdigest()[:12]
    return f"dflash-chat-{digest}"


def notify_running_instance(name: str, timeout_ms: int = 500) -> bool:
    """True when an instance listens on ``name`` (it is asked to raise its window)."""
    sock = QLocalSocket()
    sock.connectToServer(name)
    if not sock.waitForConnected(timeout_ms):
        return False
    sock.write(b"raise\n")
    sock.flush()
    sock.waitForBytesWritten(timeout_ms)
    sock.disconnectFromServer()
    return True


def listen(name: str, on_raise) -> QLocalServer:
    """Serve ``name``; ``on_raise()`` runs when a second launch connects."""
    server = QLocalServer()
    QLocalServer.removeServer(name)  # a stale socket left by a crash
    server.listen(name)

    def accept() -> None:
        while server.hasPendingConnections():
            conn = server.nextPendingConnection()
            conn.readyRead.connect(lambda c=conn: (c.readAll(), on_raise()))
            conn.disconnected.connect(conn.deleteLater)

    server.newConnection.connect(accept)
    return server


def setup_logging(data_dir: Path) -> logging.Handler:
    """Rotating log file ``<data_dir>/dflash-chat.log`` (1 MB x 3) on the root logger;
    returns the handler (its ``baseFilename`` is the path)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "dflash-chat.log"
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=1_000_000, backupCount=3,
                                                   encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


def quit_on_signals(app: QApplication):
    """Quit ``app`` the ordinary way (``aboutToQuit``: the window shuts down, the worker
    stops, the store closes) on SIGTERM (a logout, ``kill``) and SIGINT (Ctrl+C), instead
    of dying with the worker thread running or a KeyboardInterrupt raised inside a slot.
    A timer lets Python see the signal while Qt's loop waits; a signal that comes before the
    loop runs (the window still being built) quits as soon as it does. Returns a function that
    puts the previous handlers back."""
    import signal

    from PySide6.QtCore import QTimer

    def on_signal(signum, _frame) -> None:
        log.info("signal %s: quitting", signum)
        # queued, so a signal that comes while the window is still being built quits as
        # soon as the event loop runs (app.quit() before the loop would do nothing)
        QTimer.singleShot(0, app.quit)

    wanted = [signal.SIGINT] + ([signal.SIGTERM] if hasattr(signal, "SIGTERM") else [])
    previous = {sig: signal.signal(sig, on_signal) for sig in wanted}
    tick = QTimer(app)
    tick.timeout.connect(lambda: None)  # Python runs handlers between its bytecodes only
    tick.start(250)

    def restore() -> None:
        tick.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def make_store(data_dir: Path):
    """The conversation store: SQLite storage in ``data_dir``."""
    from app.chat.turns import open_store

    return open_store(data_dir)


def run_gui(args=None) -> int:
    """Open the window and run the event loop; returns the exit code (0 also when another
    instance was focused instead)."""
    QCoreApplication.setOrganizationName("DFlash")
    QCoreApplication.setApplicationName(APP_NAME)
    QCoreApplication.setApplicationVersion(__version__)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    given = getattr(args, "data_dir", None)
    data_dir = Path(given or default_data_dir())
    # the window needs its data folder (log, settings, chats): one line when it cannot have
    # it, whether --data-dir (checked before), DFLASH_DATA_DIR or the platform's named it
    problem = data_dir_problem(data_dir, "--data-dir" if given else data_dir_source())
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    name = server_name(data_dir)
    if notify_running_instance(name):
        print(f"{APP_NAME} is already running; brought it to the front.")
        return 0
    try:
        handler = setup_logging(data_dir)
    except OSError as exc:  # e.g. a full disk: the folder is writable, the log is not
        print(f"error: cannot write the log in {data_dir}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    restore = quit_on_signals(app)  # before the window's slow imports: a signal then quits too
    log.info("starting %s %s, data in %s", APP_NAME, __version__, data_dir)
    qs = QSettings(str(data_dir / "settings.ini"), QSettings.IniFormat)

    from app.ui.window import MainWindow

    win = MainWindow(store=make_store(data_dir), qsettings=qs, data_dir=data_dir)
    win.worker.cost_dir = data_dir  # the automatic block size's measured cost models
    win.log_path = Path(handler.baseFilename)

    def bring_up() -> None:
        win.showNormal()
        win.raise_()
        win.activateWindow()

    server = listen(name, bring_up)
    app.aboutToQuit.connect(win.shutdown)
    win.show()
    import asyncio

    import qasync

    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    with loop:
        loop.run_until_complete(closed.wait())
    code = 0
    restore()
    server.close()
    log.info("quit")
    logging.getLogger().removeHandler(handler)
    handler.close()
    return code

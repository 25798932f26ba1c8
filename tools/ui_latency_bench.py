"""Event-loop latency of the window under a fast token stream (issue 7, "Measure").

Streams synthetic events (a ``TokenEvent`` and a ``ContentDelta`` per token, a ``CycleEvent``
every few tokens, some reasoning first) from the real worker thread into the real window at
``--rate`` tokens per second for ``--seconds``, and measures how late a 5 ms precise timer on
the GUI thread fires: latency = (time between two firings) - 5 ms. Prints p50/p99/max in ms
and the number of render ticks; the goal is p99 < 50 ms on this CPU.

    QT_QPA_PLATFORM=offscreen .venv/bin/python tools/ui_latency_bench.py [--rate 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

WORDS = ("the drafter proposes a block of tokens and the target verifies them in one pass "
         "so several tokens are committed per cycle when the guesses are right ").split()


def stream_session(rate: float, seconds: float):
    """``app.chat.scripted.ScriptedSession`` paced at ``rate`` tokens per second for
    ``seconds``: 20 reasoning words, then one word of content per token (a paragraph break
    every 60) and a DFlash cycle every 5 tokens."""
    from app.chat.scripted import ScriptedSession, ScriptedTurn

    def word(i: int) -> str:
        return WORDS[i % len(WORDS)] + (".\n\n" if i % 60 == 59 else " ")

    return ScriptedSession(
        turns=[ScriptedTurn(" ".join(WORDS[:20]), "")], cycles=10**9, block=8,
        accept=lambda c: 4, tokens_per_s=rate, seconds=seconds, filler=word,
        figures={}, info={"target_name": "synthetic", "drafter_name": "synthetic",
                          "context_length": 32768},
        memory=0, piece=lambda t: "")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the figures; exit code 0 (1 when the window failed)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=2000.0, help="tokens per second")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--period-ms", type=float, default=5.0, help="probe timer period")
    args = ap.parse_args(argv)

    import tempfile

    from PySide6.QtCore import QEventLoop, QSettings, Qt, QTimer
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    from app.ui.window import MainWindow

    qs = QSettings(str(Path(tempfile.mkdtemp()) / "s.ini"), QSettings.IniFormat)
    backend = stream_session(args.rate, args.seconds)
    win = MainWindow(backend=backend, qsettings=qs, auto_load=False)
    win.resize(1280, 800)
    win.show()
    win.load_model("synthetic", "synthetic")
    end = time.time() + 10
    while win.model is None and time.time() < end:
        app.processEvents(QEventLoop.AllEvents, 20)
    if win.model is None:
        print("model did not load", file=sys.stderr)
        return 1

    gaps: list[float] = []
    last = [time.perf_counter()]

    def probe() -> None:
        now = time.perf_counter()
        gaps.append((now - last[0]) * 1000.0 - args.period_ms)
        last[0] = now

    ticks = [0]
    orig = win.replies.render_pending

    def counted() -> None:
        ticks[0] += 1
        orig()

    win.timer.timeout.disconnect()
    win.timer.timeout.connect(counted)
    timer = QTimer()
    timer.setTimerType(Qt.PreciseTimer)
    timer.setInterval(int(args.period_ms))
    timer.timeout.connect(probe)
    win.composer.set_mode("dflash")
    from app.chat.pipeline import ContentDelta  # noqa: F401  (import before timing)

    loop = QEventLoop()
    win.replyFinished.connect(lambda _m: QTimer.singleShot(1000, loop.quit))  # + final render
    QTimer.singleShot(int((args.seconds + 60) * 1000), loop.quit)  # safety net
    t0 = time.perf_counter()
    win.send("Stream as fast as you can.")
    last[0] = time.perf_counter()
    timer.start()
    loop.exec()  # a real event loop: the GUI thread sleeps in Qt between events
    timer.stop()
    wall = time.perf_counter() - t0 - 1.0
    gaps = [max(0.0, g) for g in gaps[1:]]
    q = statistics.quantiles(gaps, n=100) if len(gaps) >= 2 else [0.0] * 99
    chars = len(win.chat.toPlainText())
    sent = backend.summary.generated_tokens if backend.summary else 0
    print(f"tokens streamed      {sent} in {wall:.1f} s "
          f"({sent / max(wall, 1e-9):.0f} tok/s requested {args.rate:.0f})")
    print(f"render ticks         {ticks[0]} (timer {win.timer.interval()} ms)")
    print(f"probe samples        {len(gaps)} (period {args.period_ms:g} ms)")
    print(f"event-loop latency   p50 {q[49]:.1f} ms   p99 {q[98]:.1f} ms   "
          f"max {max(gaps, default=0):.1f} ms")
    print(f"chat characters      {chars}")
    print(f"goal p99 < 50 ms:    {'met' if q[98] < 50 else 'NOT met'}")
    win.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

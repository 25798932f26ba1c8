"""Take the README screenshot: ``python -m app.ui.screenshot OUT.png [--model DIR --drafter DIR]``.

The committed ``docs/screenshot.png`` was taken with the bundled demo pair::

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 QT_QPA_PLATFORM=offscreen \
        python -m app.ui.screenshot docs/screenshot.png \
        --model resources/models/demo-target --drafter resources/models/demo-dflash

With ``--model`` the window runs the real engine on that pair (e.g. the bundled demo pair) and
is grabbed while the second reply is being generated. Without it the scripted session
(``app.chat.scripted``) replays a fixed conversation through the same event types (for layout work; the figures are then
made up and the window says "scripted" in its status bar).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

SCRIPT = [
    ("What is the capital of France, and what currency does it use?",
     "The user asks two things: the capital and the currency. France's capital is Paris. "
     "France is in the eurozone, so the euro.",
     "The capital of France is **Paris**, and France uses the **euro** (EUR)."),
    ("Convert 25 degrees Celsius to Fahrenheit and show the formula in Python.",
     "Use F = C * 9/5 + 32. 25 * 9/5 = 45, plus 32 gives 77. The user also wants Python, so "
     "a short function and a call. Let me check with the unit tool first.",
     "25 °C is **77 °F**. The conversion multiplies by 9/5 and adds 32:\n\n"
     "```python\ndef c_to_f(c: float) -> float:\n    return c * 9 / 5 + 32\n\n"
     "print(c_to_f(25))  # 77.0\n```\n\nThe `convert_units` tool gave the same value."),
]


DEMO_PROMPTS = [
    "What is the official currency in San Marino?",
    "Tell me the population of Gabon.",
]
"""Prompts in the demo pair's world (countries, units, the built-in tools)."""


def scripted_session():
    """:data:`SCRIPT` through ``app.chat.scripted.ScriptedSession``: DFlash-like cycles of
    block 8 with made-up acceptance, the unit tool on the second turn, made-up figures."""
    import random

    from app.chat.scripted import ScriptedSession, ScriptedTurn

    rng = random.Random(2)
    slow = float(os.environ.get("SCRIPT_DELAY", "0.03"))
    turns = [ScriptedTurn(reasoning, content) for _, reasoning, content in SCRIPT]
    turns[1] = ScriptedTurn(turns[1].reasoning, turns[1].content, (
        "convert_units", {"value": 25, "from_unit": "degC", "to_unit": "degF"},
        {"value": 77.0, "unit": "degree_Fahrenheit"}))
    return ScriptedSession(
        turns=turns, cycles=None, block=8, chunk_chars=6, delay_s=slow,
        reasoning_delay_s=slow / 4,
        accept=lambda c: min(7, max(0, int(rng.gauss(4.5, 2)))),
        figures={"prompt_tokens": 118, "ttft_s": 0.084, "tok_per_s": 96.4},
        info={"target_name": "demo-target (scripted)", "drafter_name": "demo-dflash (scripted)",
              "context_length": 4096, "memory_bytes": 412 * 2**20},
        memory=412 * 2**20, piece=lambda t: "x")


def main(argv: list[str] | None = None) -> int:
    """Render the window and save a PNG; returns an exit code."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out")
    p.add_argument("--model")
    p.add_argument("--drafter", default="")
    p.add_argument("--size", default="1360x860")
    p.add_argument("--dark", action="store_true")
    p.add_argument("--prompt", action="append", default=None,
                   help="a prompt to send (give it twice; default: DEMO_PROMPTS with --model)")
    p.add_argument("--when", choices=("streaming", "done"), default=None,
                   help="grab while the second reply streams, or after it (default: streaming "
                        "for the scripted replay, done with --model)")
    args = p.parse_args(argv)
    import tempfile

    from PySide6.QtCore import QEventLoop, QSettings
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    from app.ui import theme
    from app.ui.window import MainWindow

    if args.dark:
        theme.system_is_dark = lambda: True
    tmp = tempfile.mkdtemp()
    qs = QSettings(str(Path(tmp) / "s.ini"), QSettings.IniFormat)
    qs.setValue("generation/use_tools", True)
    backend = None if args.model else scripted_session()
    win = MainWindow(backend=backend, qsettings=qs, auto_load=False)
    w, h = (int(v) for v in args.size.split("x"))
    win.resize(w, h)
    win.show()

    def pump(cond, timeout=300.0):
        end = time.time() + timeout
        while not cond() and time.time() < end:
            app.processEvents(QEventLoop.AllEvents, 30)
            time.sleep(0.01)

    win.load_model(args.model or "demo-target", args.drafter or "demo-dflash")
    pump(lambda: win.model is not None or win.banner_row.isVisible())
    if win.model is None:
        print(win.banner.text(), file=sys.stderr)
        return 2
    win.messages.clear_banner()
    prompts = args.prompt or (DEMO_PROMPTS if args.model else [SCRIPT[0][0], SCRIPT[1][0]])
    prompts = (prompts * 2)[:2]
    when = args.when or ("done" if args.model else "streaming")
    win.send(prompts[0])
    pump(lambda: not win.busy)
    win.composer.set_mode("dflash")
    win.send(prompts[1])
    if when == "done":
        pump(lambda: not win.busy, 600)
    else:  # mid-reply: once a good part of the second reply is on screen
        pump(lambda: not win.busy or (win.replies.run
                                      and win.replies.run.sides[""].stats.cycles > 14), 120)
    pump(lambda: False, 0.05)
    win.grab().save(args.out)
    print(f"saved {args.out}")
    win.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How long the window takes to open on a store holding one huge chat (issue 47).

Builds a conversation export in memory, imports it into a fresh database (``import_json``,
as File › Import does), then opens the window on that store, which shows the chat (offscreen
Qt). Printed: the import time, ``ViewStore.get`` (the turns the window loads), the window's
open time (construction to first paint, events processed) and the characters the chat view
drew.

    python tools/bench_huge_chat.py line 30000000 [--nospace]   # one reply of 30 MB
    python tools/bench_huge_chat.py messages 200000             # 200,000 short messages
    python tools/bench_huge_chat.py messages 200000 --send      # then one reply in it

``--send``: then load the scripted pair and send one message in that chat, timed from Send to
the reply's end (stored and drawn; the worker stores the turn and reads its prompt back).

``line N``: a prompt and one reply of N characters on one line (``word word ...``, or
``xxx...`` with ``--nospace``); ``messages N``: N messages, user and reply by turns.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def export_of(contents: list[str]) -> dict:
    """A conversation export (``app.chat.export`` JSON) of one line of turns: user and
    reply by turns, ``contents`` their texts."""
    from app.chat.export import FORMAT, FORMAT_VERSION

    n = len(contents)
    return {"format": FORMAT, "format_version": FORMAT_VERSION,
            "conversation": {"title": "Huge", "created_at": 1.0, "updated_at": 1.0,
                             "active_root": 1},
            "messages": [{"id": i, "parent": i - 1 or None,
                          "active_child": i + 1 if i < n else None,
                          "role": "user" if i % 2 else "assistant", "content": text,
                          "mode": None if i % 2 else "plain", "status": "complete",
                          "created_at": 1.0, "updated_at": 1.0}
                         for i, text in enumerate(contents, start=1)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=["line", "messages"])
    ap.add_argument("size", type=int, help="characters of the reply, or messages")
    ap.add_argument("--nospace", action="store_true", help="a line without spaces")
    ap.add_argument("--send", action="store_true", help="then time one reply in that chat")
    args = ap.parse_args()

    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.chat.export import import_json
    from app.chat.scripted import ScriptedSession
    from app.chat.turns import ViewStore

    if args.kind == "line":
        reply = "x" * args.size if args.nospace else ("word " * (args.size // 5 + 1))[:args.size]
        contents = ["Say it all.", reply]
    else:
        contents = [f"message {i}" for i in range(args.size)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        store = ViewStore(folder / "conversations.db")
        t = time.perf_counter()
        import_json(store.db, export_of(contents))
        print(f"import: {time.perf_counter() - t:.2f} s")
        app = QApplication([])
        t = time.perf_counter()
        conv = store.get(store.list()[0].id)
        print(f"ViewStore.get: {time.perf_counter() - t:.2f} s ({len(conv.messages)} turns "
              f"loaded, {conv.earlier} earlier)")
        from app.ui.window import MainWindow

        t = time.perf_counter()
        win = MainWindow(backend=ScriptedSession(), store=store, auto_load=False,
                         qsettings=QSettings(str(folder / "s.ini"), QSettings.IniFormat))
        win.show()
        app.processEvents()
        print(f"window open: {time.perf_counter() - t:.2f} s "
              f"({win.chat.document().characterCount():,} characters drawn)")
        if args.send:
            from PySide6.QtCore import QEventLoop

            win.load_model("scripted-target", "scripted-drafter")
            while win.model is None:
                app.processEvents(QEventLoop.AllEvents, 50)
            win.composer.set_mode("plain")
            done: list[float] = []
            win.replyFinished.connect(lambda _m: done.append(time.perf_counter()))
            t = time.perf_counter()
            win.send("hello")
            while not done:
                app.processEvents(QEventLoop.AllEvents, 50)
            print(f"send: {done[0] - t:.2f} s to the reply's end")
        win.shutdown()


if __name__ == "__main__":
    main()

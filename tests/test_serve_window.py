"""The window's "Serve on localhost" switch: the loaded pair served over HTTP from the
window's own worker thread (no MLX thread of the server's own), stopped by the switch, by
unloading and by closing the window."""

from __future__ import annotations

import threading

import httpx
import pytest

from app.chat.session import ChatSession

pytest.importorskip("pytestqt")


def _window(qtbot, qs):
    from app.ui.window import MainWindow

    qs.setValue("serve/port", 0)  # a free port
    win = MainWindow(backend=ChatSession(), qsettings=qs, auto_load=False)
    qtbot.addWidget(win)
    win.show()
    return win


def test_the_window_serves_its_loaded_pair_on_its_worker(qtbot, qs, tiny_paths):
    win = _window(qtbot, qs)
    try:
        win.serve_action.setChecked(True)  # no model yet: refused, with a reason
        assert win.serve.serving is None and not win.serve_action.isChecked()
        assert "Load a model first" in win.banner.text()
        with qtbot.waitSignal(win.modelLoaded, timeout=60_000):
            win.load_model(*tiny_paths)
        win.serve_action.setChecked(True)
        assert win.serve.serving is not None and win.serve_action.isChecked()
        url = win.serve.serving.url
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        # a lasting sign in the status bar while it serves (the flash goes after 10 s)
        assert win.serve_label.isVisibleTo(win) and win.serve_label.text() == f"Serving {url}"
        models = httpx.get(url + "/models", timeout=30).json()
        assert models["data"][0]["dflash"]["modes"] == ["plain", "dflash", "lookup"]
        replies = {}
        for mode in ("plain", "dflash"):
            r = httpx.post(url + "/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12,
                "mode": mode})
            assert r.status_code == 200, r.text
            replies[mode] = r.json()
            assert replies[mode]["dflash"]["mode"] == mode
            assert replies[mode]["usage"]["completion_tokens"] == 12
        assert replies["plain"]["choices"][0]["message"] == \
            replies["dflash"]["choices"][0]["message"]
        records = list(win.serve.serving.jobs.records)
        assert [r.thread for r in records] == ["mlx-worker", "mlx-worker"]
        assert not [t for t in threading.enumerate() if t.name == "serve-mlx-worker"]
        # the switch stops it: the port no longer answers
        win.serve_action.setChecked(False)
        assert win.serve.serving is None and not win.serve_label.isVisibleTo(win)
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/models", timeout=5)
        # unloading stops it too
        win.serve_action.setChecked(True)
        assert win.serve.serving is not None
        url = win.serve.serving.url
        win.models.unload()
        assert win.serve.serving is None and not win.serve_action.isChecked()
        assert not win.serve_label.isVisibleTo(win)
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/models", timeout=5)
    finally:
        win.shutdown()
    assert win.serve.serving is None


def test_a_serve_port_past_65535_is_said_not_raised(qtbot, qs, tiny_paths):
    """A ``serve/port`` of 70000 in the settings file raised OverflowError out of the
    switch's slot; it is refused with a banner, the switch left off."""
    win = _window(qtbot, qs)
    try:
        with qtbot.waitSignal(win.modelLoaded, timeout=60_000):
            win.load_model(*tiny_paths)
        qs.setValue("serve/port", 70000)
        win.serve_action.setChecked(True)
        assert win.serve.serving is None and not win.serve_action.isChecked()
        assert "a TCP port is 0 to 65535" in win.banner.text()
    finally:
        win.shutdown()

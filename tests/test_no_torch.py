"""PyTorch kept out of the app's process (app.models.no_torch)."""

import subprocess
import sys

from app.models.no_torch import ALLOW_ENV, keep_torch_out


def test_marks_torch_not_importable():
    modules: dict = {}
    assert keep_torch_out(modules, {}) is True
    assert "torch" in modules and modules["torch"] is None


def test_leaves_torch_alone_when_allowed_or_already_imported():
    modules: dict = {}
    assert keep_torch_out(modules, {ALLOW_ENV: "1"}) is False
    assert "torch" not in modules
    loaded = {"torch": object()}
    assert keep_torch_out(loaded, {}) is False
    assert loaded["torch"] is not None


def test_marked_torch_is_absent_to_imports_and_find_spec(tmp_path):
    """What transformers looks at (importlib.util.find_spec) answers None, and an import
    fails with ImportError, in a fresh interpreter where a ``torch`` package is importable
    (a stand-in on PYTHONPATH, so the test means something without PyTorch installed)."""
    import os

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("IMPORTED = True\n")
    code = ("import importlib.util, sys\n"
            "assert importlib.util.find_spec('torch') is not None\n"  # the stand-in is there
            "from app.models.no_torch import keep_torch_out\n"
            "keep_torch_out()\n"
            "assert importlib.util.find_spec('torch') is None\n"
            "try:\n    import torch\nexcept ImportError:\n    print('blocked')\n")
    env = {k: v for k, v in os.environ.items() if k != ALLOW_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), os.getcwd(), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "blocked"


def test_the_entry_point_keeps_torch_out_before_anything_else(monkeypatch):
    """``app.__main__.main()`` (``python -m app``, the frozen app) marks PyTorch first; a call
    with arguments (tests, embedding) leaves the process alone."""
    import app.__main__ as entry
    import app.cli
    import app.engine.blas
    import app.models.no_torch

    calls = []
    monkeypatch.setattr(app.models.no_torch, "keep_torch_out", lambda: calls.append("torch"))
    monkeypatch.setattr(app.engine.blas, "maybe_reexec_with_optimized_blas",
                        lambda: calls.append("blas"))
    monkeypatch.setattr(app.engine.blas, "warn_if_slow_blas", lambda stream: None)
    monkeypatch.setattr(app.cli, "main", lambda argv: calls.append(("cli", argv)) or 0)
    assert entry.main() == 0
    assert calls == ["torch", "blas", ("cli", None)]
    calls.clear()
    assert entry.main(["--version"]) == 0
    assert calls == [("cli", ["--version"])]

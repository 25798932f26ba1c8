"""docs/architecture.md's script example runs as printed: the bundled demo pair driven
through ChatSession, without the window or ``python -m app`` (and, on Linux, on OpenBLAS)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine import blas
from app.paths import bundled_pair

REPO = Path(__file__).resolve().parent.parent


def _example() -> str:
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc.split("## Driving the app from a script", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
@pytest.mark.skipif(bundled_pair() is None, reason="the bundled demo pair is not installed")
def test_the_script_example_runs_and_both_modes_answer_alike():
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", blas.PRELOADED, blas.NO_REEXEC, blas.REEXEC_GUARD,
                        "OPENBLAS_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["HF_HUB_OFFLINE"] = "1"
    res = subprocess.run([sys.executable, "-c", _example()], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert out.startswith("demo-target + demo-dflash | BLAS: "), out
    answers = re.findall(r"^\[(plain|dflash)\] (.*?)\n  (\d+) tokens, ([\d.]+) tok/s", out,
                         re.S | re.M)
    assert [a[0] for a in answers] == ["plain", "dflash"], out
    assert answers[0][1:3] == answers[1][1:3]  # greedy: the same answer, as long
    assert "tau None" not in out.split("[dflash]")[1]
    if sys.platform.startswith("linux") and blas.find_openblas() is not None:
        assert "BLAS: OpenBLAS (optimized, 1 thread)" in out
        assert "warning:" not in res.stderr

"""tools/probe_rows.py: it finds the operation whose result depends on the row count, and
leaves the model as it was."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import qwen3_next

from app.engine import target as target_module

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT / "tests"))
_SPEC = importlib.util.spec_from_file_location("probe_rows", _ROOT / "tools" / "probe_rows.py")
probe_rows = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(probe_rows)


def _ids(target) -> list[int]:
    return [int(t) for t in target.tokenizer.encode("Rows and steps agree here.")]


def test_a_pass_and_its_steps_agree_on_the_cpu(tiny_hybrid):
    target, _ = tiny_hybrid
    classes = {p: type(m) for p, m in target.model.named_modules()}
    update = target_module.gated_delta_update
    rows = probe_rows.probe_target(target.model, target.model_type, _ids(target), block=6)
    names = [name for name, _, _ in rows]
    assert any(".conv1d#" in n for n in names) and "gated_delta_update#0" in names
    assert "scaled_dot_product_attention#0" in names
    # On the CPU only float32 products under a threaded BLAS may round by row count
    # (docs/performance.md); nothing else may be named.
    modules = dict(target.model.named_modules())
    for name, inputs_equal, worst in rows:
        if inputs_equal and worst > 0:
            assert isinstance(modules.get(name.split("#")[0]), nn.Linear), name
    assert {p: type(m) for p, m in target.model.named_modules()} == classes  # undone
    assert target_module.gated_delta_update is update


def test_it_names_an_operation_that_depends_on_the_row_count(tiny_hybrid, monkeypatch):
    target, _ = tiny_hybrid
    base = qwen3_next.Qwen3NextRMSNormGated.__call__

    def norm(self, x, gate=None):  # scaled only when given more than one position
        out = base(self, x, gate)
        return out * 1.01 if x.shape[1] > 1 else out

    monkeypatch.setattr(qwen3_next.Qwen3NextRMSNormGated, "__call__", norm)
    # a threaded or optimized BLAS may round an S-row float32 product differently from its
    # 1-row ones (docs/performance.md), which would name a product before the norm: products
    # row by row keep the planted difference the only one
    linear = nn.Linear.__call__

    def row_by_row(self, x):
        if x.ndim == 3 and x.shape[1] > 1:
            return mx.concatenate([linear(self, x[:, i:i + 1]) for i in range(x.shape[1])], 1)
        return linear(self, x)

    monkeypatch.setattr(nn.Linear, "__call__", row_by_row)
    rows = probe_rows.probe_target(target.model, target.model_type, _ids(target), block=6)
    causes = [name for name, inputs_equal, worst in rows if inputs_equal and worst > 0]
    assert any(c.endswith("layers.0.linear_attn.norm#0") for c in causes)

"""Keep PyTorch out of the app's process.

The app computes with MLX only, but transformers (which mlx-lm uses for the tokenizers)
imports PyTorch whenever it is installed, and transformers 5 has no switch to stop it
(``transformers.utils.import_utils.is_torch_available`` looks for the package and nothing
else). On the NVIDIA host of ``docs/performance.md`` ("MLX on CUDA"), whose Python has
PyTorch 2.11 with CUDA, ``from transformers import AutoTokenizer`` took 11.1 s, nearly all of
it importing PyTorch (the same import takes ~2 s on a CPU machine without PyTorch): a cost a
user with PyTorch in the same environment would pay at every start.

:func:`keep_torch_out` marks ``torch`` as not importable (``sys.modules["torch"] = None``,
Python's own way: an import then raises ``ImportError`` and ``importlib.util.find_spec``
answers None, so transformers sees no PyTorch). ``python -m app`` and the frozen app call it
first thing; ``DFLASH_IMPORT_TORCH=1`` leaves PyTorch importable (for a tokenizer whose own
code needs it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

#: Set to ``1`` to leave PyTorch importable.
ALLOW_ENV = "DFLASH_IMPORT_TORCH"


def keep_torch_out(modules: MutableMapping | None = None,
                   environ: MutableMapping | None = None) -> bool:
    """Make ``import torch`` fail in this process, unless it is imported already or
    ``DFLASH_IMPORT_TORCH=1`` is set.

    Args:
        modules: the module table to mark (``sys.modules``; a dict in tests).
        environ: the environment to read (``os.environ``).

    Returns:
        True when ``torch`` was marked as not importable, False when it was left alone.
    """
    modules = sys.modules if modules is None else modules
    environ = os.environ if environ is None else environ
    if environ.get(ALLOW_ENV, "") == "1" or "torch" in modules:
        return False
    modules["torch"] = None
    return True

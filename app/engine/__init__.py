"""Qt-free, chat-free decoding: plain, DFlash and DFlash2, verification, the rollback unit,
the prefix cache, events and Summary, and a target sharded over a group of processes.

Importing it on Linux first loads an optimized BLAS into the process when one is installed,
before MLX is imported, or warns once that MLX will use its reference BLAS
(:func:`app.engine.blas.prepare_blas`).
"""

from app.engine.blas import prepare_blas as _prepare_blas

_prepare_blas()

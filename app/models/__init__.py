"""Qt-free model management: what is on disk and in the Hugging Face cache (``catalog``),
downloads (``download``), loading a target or drafter and checking a pair (``loader``),
DFlash2 adapters merged onto their backbone (``adapter``), the tiny random-weight pair the
tests and the missing-demo fallback build (``tiny``) and one process's share of a target
sharded over a group (``distributed``). It sits above ``app.engine`` (decoding)
and below ``app.chat``. It imports ``app.engine`` first, so that on Linux an optimized BLAS is
loaded before any of its modules imports MLX (:func:`app.engine.blas.prepare_blas`)."""

import app.engine  # noqa: F401

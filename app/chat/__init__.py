"""Qt-free chat: the conversation model, storage, templates, the text pipeline, tools, the
reply runner, typed settings and ChatSession.

It imports ``app.engine`` first, so that on Linux an optimized BLAS is loaded before any of
its modules imports MLX (:func:`app.engine.blas.prepare_blas`).
"""

import app.engine  # noqa: F401

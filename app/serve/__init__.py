"""The local OpenAI-compatible server (``python -m app serve``), Qt-free.

* :mod:`app.serve.protocol`: OpenAI chat-completions requests in (checked, typed
  :class:`~app.serve.protocol.ChatRequest`), response objects and stream chunks out, and
  :class:`~app.serve.protocol.ApiError` (an HTTP status with an OpenAI-style error body).
  Imports no MLX.
* :mod:`app.serve.worker`: :class:`~app.serve.worker.JobQueue`, a bounded queue of
  :class:`~app.serve.worker.Job` run one at a time on the thread that owns MLX, handing typed
  events back through a callback; :class:`~app.serve.worker.ServeWorker` is one with a thread
  of its own that loads the pair into a :class:`app.chat.session.ChatSession` (the window's
  switch runs the jobs on its own worker thread, ``app.ui.serve_flow``).
* :mod:`app.serve.api`: the Starlette application (routes, Bearer auth, opt-in CORS, the
  origin and loopback-host guards, body limit, errors); its handlers run on the event loop
  and never call MLX: they await the worker's events.
* :mod:`app.serve.server`: running it on uvicorn (loopback by default, SIGTERM/SIGINT drain).

docs/serve.md describes the endpoints and where they differ from OpenAI's, mlx-lm's and
llama.cpp's servers.
"""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
MAX_PORT = 65535
"""The largest TCP port number (a larger one would wrap around: 70000 is port 4464)."""
DEFAULT_GRACE_S = 10.0
"""Seconds a running reply may go on after SIGTERM before it is cancelled."""

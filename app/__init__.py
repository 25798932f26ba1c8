"""DFlash Chat: a desktop chat app for local MLX models with exact DFlash speculative decoding.

Packages:
    app.engine  Qt-free: model loading, plain and DFlash decoding, rollback, events.
    app.chat    Qt-free: chat templates, the text pipeline, tools, storage.
    app.ui      Qt only: the window and the worker thread that owns MLX.
    app.cli     headless commands (chat, compare, tools, models, bench).
"""

__version__ = "0.1.0"
APP_NAME = "DFlash Chat"

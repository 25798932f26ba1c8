"""The desktop window (PySide6). Qt only: nothing here computes with MLX.

Modules:
    main             ``run_gui(args) -> int``: single instance, log file, qasync event loop.
    window           ``MainWindow``: conversations, chat, composer, right-hand panes, menus.
    worker           the one QThread that owns MLX (loading, generation, unloading) and the
                     backends it drives; events reach the window in batches.
    chat, render     the rendered conversation (Qt Markdown, code blocks with copy links)
                     and the composer (Plain | DFlash switch, Send, Stop, Compare).
    panels           live figures with tooltips, per-cycle chart, tool-call pane.
    compare          the side-by-side view of a Compare turn.
    settings         QSettings defaults, per-conversation overrides, the dialog.
    store, storage_adapter   conversations in memory, or in ``app.chat.storage`` (SQLite).
    about, theme     About box and debug info; light/dark palettes.
    models_dialog    the Models window (issue 9).
    screenshot       ``python -m app.ui.screenshot OUT.png``: the README screenshot.
"""

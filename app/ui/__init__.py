"""The desktop window (PySide6). Qt only: nothing here computes with MLX.
Conversations come from ``app.chat.turns`` (a view over ``app.chat.storage``).

Modules:
    main             ``run_gui(args) -> int``: single instance, log file, qasync event loop.
    window           ``MainWindow``: conversations, chat, composer, right-hand panes, menus;
                     it composes the controllers below, sharing a ``state.WindowState``.
    reply_flow, model_flow, transcript, conversation_flow, serve_flow, messages
                     the controllers: replies, models, the shown chat, chat actions,
                     Serve on localhost, banners and status messages.
    worker           the one QThread that owns MLX; it drives ``app.chat.session.ChatSession``
                     and hands its events to the window in batches.
    chat, render     the rendered conversation (Qt Markdown, code blocks with copy links)
                     and the composer (Plain | DFlash switch, Send, Stop, Compare).
    panels           live figures with tooltips, per-cycle chart, tool-call pane.
    compare          the side-by-side view of a Compare turn.
    settings         QSettings defaults, per-conversation overrides, the dialog.
    about, theme     About box and debug info; light/dark palettes.
    models_dialog    the Models window: pick, download, pair and remove models.
    screenshot       ``python -m app.ui.screenshot OUT.png``: the README screenshot.
"""

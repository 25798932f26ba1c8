"""``python -m app serve``: a local OpenAI-compatible server for the loaded pair.

``python -m app serve [--host 127.0.0.1] [--port 8080] [--model M --draft-model D]
[--dflash2-model D2] [--api-key KEY] [--cors [ORIGINS]]`` loads the pair (the bundled demo
pair and its DFlash and DFlash2 drafters when no model is named) on the server's worker thread, prints one line naming
the address, and answers ``/v1/chat/completions`` until SIGINT / SIGTERM (docs/serve.md).
Exit codes: 0 after a clean stop, 2 bad arguments, unusable model files or an address it
cannot listen on.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from app.commands.generation import (
    CommandError,
    _guard,
    _warn,
    default_dflash2,
    default_thinking,
    int_at_least,
    int_between,
    refuse_mode,
    resolve_pair,
    utf8_text,
)


def port_number(text: str) -> int:
    """An argparse ``type`` for ``--port``: a TCP port, 0 (a free one) to
    :data:`app.serve.MAX_PORT`."""
    from app.serve import MAX_PORT

    try:
        return int_between(0, MAX_PORT)(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (a TCP port; 0 picks a free one)") from None


def grace_seconds(text: str) -> float:
    """An argparse ``type`` for ``--grace``: a finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more, got {text}")
    return value


def cors_argument(text: str) -> tuple[str, ...]:
    """An argparse ``type`` for ``--cors``: ``*`` or origins separated by commas
    (:func:`app.serve.server.cors_origins`), refused with its message."""
    from app.serve.server import ServeConfigError, cors_origins

    try:
        return cors_origins(text)
    except ServeConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--cors").lstrip(" :")) \
            from None


API_KEY_ENV = "DFLASH_API_KEY"
"""An API key from the environment, used when ``--api-key`` is not given (keeps it out of
the process list)."""


def api_key_of(given: str | None) -> str | None:
    """The key clients must send: ``given`` (``--api-key``), else ``$DFLASH_API_KEY``, else
    None; spaces around it are dropped (a client's token is read the same way).

    Raises:
        CommandError: the key is blank, holds a space (a Bearer token cannot), or the
            environment's is not UTF-8 text.
    """
    source = "--api-key" if given is not None else f"${API_KEY_ENV}"
    key = given if given is not None else os.environ.get(API_KEY_ENV)
    if key is None or (given is None and not key):
        return None
    if given is None:
        try:
            utf8_text(key)
        except argparse.ArgumentTypeError as exc:
            raise CommandError(f"{source} is {exc}") from None
    key = key.strip()
    if not key:
        raise CommandError(f"{source} is blank: give a key, or leave the option out for none")
    if any(c.isspace() for c in key):
        raise CommandError(f"{source} holds a space: a Bearer token cannot")
    return key


def serve_pair(args) -> tuple[str, str | None, str | None]:
    """(target, DFlash or DFlash2 drafter, DFlash2 drafter beside it) the server loads: the
    bundled demo pair with both its drafters by default, and when ``--model`` names the
    bundled target without ``--draft-model`` (``--dflash2-model none`` leaves the DFlash2 one
    out); another ``--model`` alone serves plain decoding and Lookup."""
    from app.paths import bundled_pair, is_bundled_target

    target, drafter = resolve_pair(args, need_drafter=False)
    drafter2 = default_dflash2(args)
    pair = bundled_pair()
    if drafter is None and not args.draft_model and pair is not None \
            and is_bundled_target(target):
        drafter = str(pair[1])
        if args.dflash2_model is None and pair[2] is not None:
            drafter2 = str(pair[2])
    if drafter2 is not None and drafter is not None and Path(drafter2) == Path(drafter):
        drafter2 = None
    return target, drafter, drafter2


def register(subparsers) -> None:
    """Add the ``serve`` subcommand."""
    from app.serve import DEFAULT_GRACE_S, DEFAULT_HOST, DEFAULT_PORT

    p = subparsers.add_parser(
        "serve", help="a local OpenAI-compatible server (/v1/chat/completions)",
        description="Serve the model pair over an OpenAI-compatible HTTP API (chat "
        "completions, streamed or not, tool calls returned to the client, DFlash figures "
        "with every reply). Listens on 127.0.0.1 unless told otherwise; another host needs "
        "--api-key.",
    )
    p.add_argument("--host", type=utf8_text, default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}; anything but loopback "
                   "needs --api-key)")
    p.add_argument("--port", type=port_number, default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT}; 0 picks a free one, printed at start)")
    p.add_argument("--model", help="target: a folder or a cached Hugging Face repo id "
                   "(default: the bundled demo pair)")
    p.add_argument("--draft-model", help="DFlash or DFlash2 drafter folder or cached repo id "
                   "(default with the bundled demo target: its drafter; none with another "
                   "--model: plain decoding and Lookup only)")
    p.add_argument("--dflash2-model", help="a DFlash2 drafter beside the DFlash one (default "
                   "on the bundled demo pair: its DFlash2 drafter; 'none' leaves it out)")
    p.add_argument("--api-key", type=utf8_text,
                   help="require 'Authorization: Bearer KEY' on /v1/ requests "
                   f"(default: ${API_KEY_ENV} when set, else no key)")
    p.add_argument("--cors", nargs="?", const=("*",), type=cors_argument,
                   metavar="ORIGINS",
                   help="let web pages call the API from a browser (off by default): "
                   "responses carry Access-Control-Allow-Origin, and OPTIONS preflights to "
                   "/v1/* get 204 with the allowed methods (GET, POST, OPTIONS) and headers "
                   "(Authorization, Content-Type and those the page asks for). ORIGINS: origins separated by commas, "
                   "e.g. http://localhost:3000; without it, or '*': any origin, which lets "
                   "every web page you open use the server unless --api-key is set")
    think = p.add_mutually_exclusive_group()
    think.add_argument("--think", dest="think", action="store_true", default=None,
                       help="thinking on in the chat template unless a request says")
    think.add_argument("--no-think", dest="think", action="store_false",
                       help="thinking off in the chat template unless a request says")
    p.add_argument("--max-queue", type=int_at_least(1), default=8,
                   help="requests that may wait behind the running one (default 8; more "
                   "get 429)")
    p.add_argument("--max-body-kb", type=int_at_least(1), default=4096,
                   help="largest request body in KiB (default 4096; larger get 413)")
    p.add_argument("--grace", type=grace_seconds, default=DEFAULT_GRACE_S,
                   help=f"seconds a running reply may finish after SIGTERM before it is "
                   f"cancelled (default {DEFAULT_GRACE_S:g})")
    p.add_argument("--log-level", default="warning",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default warning; info logs every request)")
    p.add_argument("--distributed", metavar="HOSTFILE",
                   help="not supported yet: a target sharded over several hosts runs with chat, "
                   "compare and bench (docs/distributed.md)")
    refuse_mode(p, "serve", 'each request chooses its mode ("mode": "plain", "dflash" or '
                '"dflash2"; default DFlash)')
    p.set_defaults(func=run_serve)


def run_serve(args) -> int:
    """``serve``: returns the exit code once the server stopped."""
    return _guard(_serve, args)


def _model_id(model_arg: str | None, target_path: str, name: str) -> str:
    """The id ``/v1/models`` lists: a repo id as given, else the target folder's name."""
    if model_arg and not Path(model_arg).expanduser().exists():
        return model_arg
    return name or Path(target_path).name


def _serve(args) -> int:
    from app.commands.distributed import refuse_distributed

    refuse_distributed(args, "serve")
    from app.chat.session import PairSpec
    from app.serve import DEFAULT_HOST
    from app.serve.api import ServeOptions
    from app.serve.server import ServeConfigError, bind_socket, check_host, make_server
    from app.serve.worker import ServeWorker, WorkerConfig

    api_key = api_key_of(args.api_key)
    if not args.host.strip():
        raise CommandError(f"--host is empty: give the address to listen on (default "
                           f"{DEFAULT_HOST})")
    try:
        check_host(args.host, api_key)
    except ServeConfigError as exc:
        raise CommandError(str(exc)) from None
    try:
        sock = bind_socket(args.host, args.port)  # a busy port is an error before the load
    except ServeConfigError as exc:
        raise CommandError(str(exc)) from None
    target, drafter, drafter2 = serve_pair(args)
    thinking = args.think if args.think is not None else default_thinking(target, drafter)
    spec = PairSpec(target=target, drafter=drafter, drafter2=drafter2)
    from app.engine.costs import set_store
    from app.paths import default_data_dir

    set_store(default_data_dir())  # cost models measured by "block_size": "auto" are kept there
    worker = ServeWorker(WorkerConfig(spec=spec, max_queue=args.max_queue,
                                      enable_thinking=thinking))
    try:
        info = worker.start()
    except BaseException:
        sock.close()
        raise
    for line in filter(None, [info.note]):
        _warn(f"note: {line}")
    model_id = _model_id(args.model, info.target_path, info.target_name)
    options = ServeOptions(model_id=model_id, api_key=api_key,
                           max_body_bytes=args.max_body_kb * 1024,
                           aliases=tuple({a for a in (args.model, info.target_path) if a}),
                           cors_origins=args.cors)
    cors = f"; CORS allows {', '.join(args.cors)}" if args.cors else ""
    if args.cors == ("*",) and not api_key:
        _warn("note: --cors without origins lets any web page you open in a browser use this "
              "server and read its replies; name the origins (--cors http://localhost:3000) "
              "or set --api-key")

    def started(address: tuple[str, int]) -> None:
        host, port = address
        shown = f"[{host}]" if ":" in host else host
        modes = ", ".join(info.modes)
        print(f"Serving {model_id} ({modes}) on http://{shown}:{port}/v1"
              f"{' with an API key' if api_key else ''}{cors}; Ctrl+C or SIGTERM stops it.",
              flush=True)

    server = make_server(worker, options, args.host, args.port, args.grace, started,
                         args.log_level)
    try:
        server.run(sockets=[sock])
    except SystemExit as exc:  # uvicorn exits when its startup fails
        if exc.code not in (0, None):
            raise CommandError(f"the server could not start on {args.host}:{args.port}") \
                from None
    finally:
        worker.stop()
        sock.close()
    if not server.started:
        raise CommandError(f"the server could not start on {args.host}:{args.port}")
    print("Stopped.", file=sys.stderr, flush=True)
    return 0

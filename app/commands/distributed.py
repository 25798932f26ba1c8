"""``--distributed HOSTFILE``: run the target sharded over a group of processes
(:mod:`app.engine.distributed`, MLX's ring backend) for ``chat``, ``compare`` and ``bench``.

Every rank runs the same command line. How the group starts:

* under ``mlx.launch`` (``MLX_RANK`` and ``MLX_HOSTFILE`` set by it): this process joins;
* a hostfile naming only this machine (``127.0.0.1`` or ``localhost``, once per process):
  this process is rank 0 and starts the other ranks here, with a ring hostfile on free ports;
* a hostfile naming other hosts: the command is started again through ``mlx.launch`` (ssh to
  each host, the same Python path and working folder on every host), rank 0 on the first.

The hostfile is ``mlx.launch``'s: a JSON list of ``{"ssh": "host", "ips": ["10.0.0.1"]}``
(or an object whose ``"hosts"`` is that list). Rank 0 prints the reply; the other ranks
serve their layers and exit when it does. ``serve`` and the window do not run a sharded
target yet.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}

PROMPT_FILE_ENV = "DFLASH_PROMPT_FILE"
"""Set for the ranks this process starts here when it read the message from standard input
(``--prompt -``): the path of a private file (mode 0600, in the data folder) holding it."""

MAX_ARGV_PROMPT_BYTES = 100_000
"""The longest message (UTF-8 bytes) passed on a command line to ranks on other hosts: Linux
takes at most 128 KiB in one argument, and ``mlx.launch`` puts each rank's whole command in
one (a shell script, run through ssh)."""


class CommandError(ValueError):
    """A bad ``--distributed`` argument (the commands' guard turns it into exit code 2)."""


def add_distributed_arguments(p) -> None:
    """``--distributed HOSTFILE``, ``--layer-split``, ``--network-timeout`` on parser ``p``."""
    from app.engine.distributed import DEFAULT_TIMEOUT_S

    p.add_argument("--distributed", metavar="HOSTFILE",
                   help="shard the target over the hosts of this mlx.launch hostfile (MLX ring "
                   "backend; see docs/distributed.md)")
    p.add_argument("--layer-split", metavar="N,N,...",
                   help="with --distributed: layers per process, in rank order (default even)")
    p.add_argument("--network-timeout", type=float, default=None, metavar="S",
                   help="with --distributed: seconds without an answer from a host before the "
                   f"reply stops with an error (default {DEFAULT_TIMEOUT_S:g})")


def check_distributed_only(args) -> None:
    """Refuse ``--layer-split`` or ``--network-timeout`` without ``--distributed`` (they were
    taken and ignored).

    Raises:
        CommandError: naming the option.
    """
    if getattr(args, "distributed", None):
        return
    for option, value in (("--layer-split", getattr(args, "layer_split", None)),
                          ("--network-timeout", getattr(args, "network_timeout", None))):
        if value is not None:
            raise CommandError(f"{option} is used only with --distributed HOSTFILE")


def read_hosts(path: str | Path) -> list[dict]:
    """The hosts of an ``mlx.launch`` hostfile: ``[{"ssh": ..., "ips": [...]}, ...]``.

    Raises:
        CommandError: a missing or unreadable file, or fewer than two hosts.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CommandError(f"--distributed {path}: cannot read the hostfile ({exc})") from None
    hosts = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(hosts, list) or not all(isinstance(h, dict) and h.get("ssh")
                                              for h in hosts):
        raise CommandError(f"--distributed {path}: expected a JSON list of "
                           '{"ssh": HOST, "ips": [IP]} (mlx.launch\'s hostfile)')
    if len(hosts) < 2:
        raise CommandError(f"--distributed {path}: name two hosts or more (one per process)")
    return hosts


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports on 127.0.0.1 that were free when asked (bound once, then released):
    the ring addresses of ranks started on this machine. Another process may take one before
    a rank binds it; the ring then fails to connect and says which address."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def rank_argv(args) -> list[str]:
    """The command line the ranks on other hosts run (through ``mlx.launch``): this
    process's, and, when the message was read from standard input (``--prompt -``, which
    they cannot read), that message as a last ``--prompt=TEXT`` (the last one given wins;
    the ``=`` form takes text that starts with a dash).

    Raises:
        CommandError: a message longer than :data:`MAX_ARGV_PROMPT_BYTES`.
    """
    argv = sys.argv[1:]
    if getattr(args, "prompt_from_stdin", False):
        size = len(args.prompt.encode("utf-8"))
        if size > MAX_ARGV_PROMPT_BYTES:
            raise CommandError(
                f"--prompt - with --distributed over other hosts: the message ({size} bytes) "
                f"is longer than the {MAX_ARGV_PROMPT_BYTES} bytes a command line can pass "
                "to their ranks; shorten it, or run the ranks on this machine")
        argv = [*argv, f"--prompt={args.prompt}"]
    return argv


def write_prompt_file(text: str) -> str:
    """Write the message read from standard input to a new private file (mode 0600) in the
    data folder, for the ranks started on this machine (:data:`PROMPT_FILE_ENV`); its path."""
    from app.paths import default_data_dir

    folder = default_data_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="dflash-prompt-", suffix=".txt", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as f:  # mkstemp: readable by this user only
        f.write(text)
    return name


def read_prompt_file() -> str | None:
    """On a rank this app started here: the message rank 0 read from standard input
    (:func:`write_prompt_file`), or None when it gave none."""
    path = os.environ.get(PROMPT_FILE_ENV)
    if not path:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"--prompt -: cannot read the message rank 0 passed in {path} "
                           f"({exc.strerror or exc})") from None


def _spawn_local(size: int, args) -> None:
    """Start ranks ``1 .. size-1`` of this command here and make this process rank 0."""
    ring = [[f"127.0.0.1:{port}"] for port in free_ports(size)]
    fd, name = tempfile.mkstemp(prefix="dflash-hosts-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(ring, f)
    os.environ["MLX_HOSTFILE"] = name
    files = [name]
    extra = {}
    if getattr(args, "prompt_from_stdin", False):  # in a file: no argv limit, not in `ps`
        extra[PROMPT_FILE_ENV] = write_prompt_file(args.prompt)
        files.append(extra[PROMPT_FILE_ENV])
    children = []
    for rank in range(1, size):
        env = dict(os.environ, MLX_RANK=str(rank), **extra)
        children.append(subprocess.Popen([sys.executable, "-m", "app", *sys.argv[1:]],
                                         env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL))
    os.environ["MLX_RANK"] = "0"

    def reap():
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for path in files:
            Path(path).unlink(missing_ok=True)

    atexit.register(reap)


def _relaunch(hostfile: str, args) -> None:
    """Run this command again on every host through ``mlx.launch`` (does not return)."""
    cmd = [sys.executable, "-c", "import sys; from mlx._distributed_utils.launch import main; "
           "sys.exit(main())", "--hostfile", hostfile, "--backend", "ring",
           "--python", sys.executable, "--cwd", os.getcwd(), "--", "-m", "app", *rank_argv(args)]
    sys.stdout.flush()
    os.execv(sys.executable, cmd)


def join(args):
    """This process's :class:`~app.engine.distributed.Link` for ``--distributed`` (module
    docstring: join, start local ranks, or start again through ``mlx.launch``).

    Raises:
        CommandError: a bad hostfile or timeout.
        GenerationError: the group cannot be formed.
    """
    from app.engine.distributed import DEFAULT_TIMEOUT_S, join_group

    timeout = DEFAULT_TIMEOUT_S if args.network_timeout is None else args.network_timeout
    if not timeout > 0:
        raise CommandError("--network-timeout must be a number of seconds above 0")
    if "MLX_RANK" not in os.environ:
        hosts = read_hosts(args.distributed)
        if all(h["ssh"] in LOCAL_HOSTS for h in hosts):
            _spawn_local(len(hosts), args)
        else:
            _relaunch(args.distributed, args)
    return join_group(timeout)


def load_sharded_target(args, tpath: str, keep_quantized: bool | None):
    """Rank 0: the target sharded over the group (``target.shard``), its other ranks told to
    stop when this process exits. Any other rank: serves its layers, then exits the process.

    Raises:
        CommandError, GenerationError: as :func:`join`; ModelLoadError and the other load
            errors of :func:`~app.models.distributed.load_shard`.
    """
    from app.models.distributed import load_shard, num_layers_of, parse_layer_split

    if "MLX_RANK" not in os.environ:  # a bad split or model is said once, before any start
        parse_layer_split(args.layer_split, num_layers_of(tpath),
                          len(read_hosts(args.distributed)))
    link = join(args)
    loaded = load_shard(tpath, link, args.layer_split, keep_quantized)
    if link.rank != 0:
        loaded.serve()
        sys.stdout.flush()
        os._exit(0)
    atexit.register(loaded.shard.stop)
    hosts = ", ".join(f"{lo}-{hi - 1}" for lo, hi in loaded.shard.ranges)
    print(f"note: the target runs on {link.size} processes (layers {hosts})", file=sys.stderr,
          flush=True)
    return loaded


def refuse_distributed(args, command: str) -> None:
    """Refuse ``--distributed`` for a command that cannot run a sharded target yet.

    Raises:
        CommandError: always, when ``--distributed`` was given.
    """
    if getattr(args, "distributed", None):
        raise CommandError(f"{command} --distributed is not supported yet: a sharded target "
                           "runs with chat, compare and bench (docs/distributed.md)")

"""A target sharded over 2 processes on 127.0.0.1 (MLX's ring backend, CPU) is exact.

``tests/distributed_worker.py`` runs as rank 0 and rank 1. On the bundled demo pair and on
tiny random targets (hybrid ``qwen3_5``, dense ``qwen3``, ``llama`` with sliding-window
layers) every run (plain, DFlash with the tape and the replay rollback, fast verify,
Lookup, sampled plain and DFlash, DFlash2 greedy and sampled) gives the tokens and every layer's cache the same run gives in one process, to the
last bit (DFlash under the automatic block size too: its cost model measured through the
shard, then given to both runs so that they choose the same blocks); a verify pass undone on both ranks leaves every layer as it was; and a rank killed
or stopped mid-reply ends the reply with ``PeerLostError`` within the network timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.commands.distributed import free_ports
from app.engine.errors import GenerationError, ModelLoadError

#: each test starts 2-3 processes (about 45 s in all): the full suite runs them, not make test-fast
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "distributed_worker.py"
MODELS = ROOT / "resources" / "models"


def _launch(tmp: Path, args: list[str], timeout: float = 240) -> dict:
    """Run the worker as ranks 1 and 0; rank 0's report (rank 1's pid in ``PEER_PID``)."""
    hostfile = tmp / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(2)]))
    out = tmp / "report.json"
    env = dict(os.environ, MLX_HOSTFILE=str(hostfile))
    cmd = [sys.executable, str(WORKER), *args]
    peer = subprocess.Popen(cmd, env=dict(env, MLX_RANK="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        main = subprocess.run([*cmd, "--out", str(out)],
                              env=dict(env, MLX_RANK="0", PEER_PID=str(peer.pid)),
                              capture_output=True, text=True, timeout=timeout)
    finally:
        if peer.poll() is None:
            peer.kill()
        peer.wait()
    assert main.returncode == 0, main.stdout + main.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def tiny_pairs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    from app.models.tiny import build_tiny_pair

    root = tmp_path_factory.mktemp("dist_pairs")
    return {family: build_tiny_pair(root / family, family, seed=1, block_size=8)
            for family in ("qwen3_5", "qwen3", "llama")}


@pytest.fixture(scope="module")
def exact_report(tiny_pairs, tmp_path_factory) -> dict:
    demo = f"{MODELS / 'demo-target'}:{MODELS / 'demo-dflash'},{MODELS / 'demo-dflash2'}"
    pairs = [demo] + [f"{t}:{d}" for t, d in tiny_pairs.values()]
    args = ["exact", "--max-tokens", "24"]
    for p in pairs:
        args += ["--pair", p]
    return _launch(tmp_path_factory.mktemp("dist_exact"), args)


def _runs(report: dict):
    for target, results in report.items():
        for r in results:
            yield Path(target).name, r


def test_every_run_equals_one_process_bit_for_bit(exact_report):
    seen = 0
    for target, r in _runs(exact_report):
        if "tokens" not in r:
            continue
        what = f"{target} {r['settings']}"
        assert r["error"] is None, what
        assert r["tokens"] == r["reference"], what
        assert len(r["tokens"]) > 1, what
        assert r["cache_layers"] >= 2, what
        assert r["ref_network_s"] == 0.0, what
        assert (r["network_s"] > 0) == (r["cycles"] > 0), what  # waited on rank 1 per cycle
        seen += 1
        assert r["replays"] == r["ref_replays"], what
        assert r["cache_difference"] == 0.0, what
    assert seen == 10 + 3 * 8  # the demo pair with DFlash2, three tiny pairs without


def test_every_rollback_path_is_taken_on_both_ranks(exact_report):
    """Partial blocks rolled back by tape and by replay (hybrid targets), dense trims,
    sliding-window trims, wholly accepted blocks."""
    by = {(t, r["settings"].get("mode"), r["settings"].get("rollback"),
           r["settings"].get("fast_verify", False)): r
          for t, r in _runs(exact_report) if "tokens" in r and not r["settings"].get("auto_block")}
    for rollback in ("tape", "replay"):
        assert by[("demo-target", "dflash", rollback, False)]["partial"] >= 1
        assert by[("demo-target", "dflash", rollback, False)]["full"] >= 1
        assert by[("qwen3_5-target", "dflash", rollback, False)]["partial"] >= 1
    assert by[("demo-target", "dflash", "tape", True)]["full"] >= 1  # fast verify re-run
    assert by[("demo-target", "dflash2", "tape", False)]["cycles"] >= 1
    dense = [r for t, r in _runs(exact_report) if "tokens" in r and r["replays"] == 0
             and r["partial"] > 0]
    assert dense, "no dense (trim only) run rolled back a partial block"


def test_a_verify_pass_undone_on_every_rank(exact_report):
    """Every layer as before the pass, as in one process (a sliding-window buffer, cut by
    the pass's concatenation, holds its last window only: compared with one process)."""
    restores = {t: r for t, r in _runs(exact_report) if r["settings"].get("restore")}
    assert len(restores) == 4
    for target, r in restores.items():
        assert r["grown"] == float("inf")  # the pass added positions on the ranks
        assert r["one_process_difference"] == 0.0, target
        if target != "llama-target":
            assert r["cache_difference"] == 0.0, target


def test_plain_steps_cross_the_network_once_per_token(exact_report):
    """Bytes counted on rank 0 for a plain run: a reset, the prompt there and back, then per
    token a header (32 int32) and the residual stream (384 float32) there and back."""
    demo = exact_report[str(MODELS / "demo-target")]
    plain = next(r for r in demo if r["settings"].get("mode") == "plain")
    dflash = next(r for r in demo if r["settings"].get("mode") == "dflash")
    prompt = (plain["bytes"] - 128 - 128 * len(plain["tokens"])) // (2 * 384 * 4) \
        - (len(plain["tokens"]) - 1)
    assert prompt > 5
    assert plain["bytes"] == 128 + 128 * len(plain["tokens"]) \
        + 2 * 384 * 4 * (prompt + len(plain["tokens"]) - 1)
    assert dflash["bytes"] > 0


def _peer_loss(tiny_pairs, tmp_path_factory, how: str, timeout: float) -> dict:
    t, d = tiny_pairs["qwen3_5"]
    return _launch(tmp_path_factory.mktemp(f"dist_{how}"),
                   [how, "--pair", f"{t}:{d}", "--max-tokens", "400",
                    "--timeout", str(timeout)])


def test_a_killed_rank_ends_the_reply_stored_as_failed(tiny_pairs, tmp_path_factory):
    """The turn runs as the window runs it (``run_turn`` on a ``ChatSession``): the reply
    stops, keeps what it wrote and is stored with status ``error`` and the cause."""
    r = _peer_loss(tiny_pairs, tmp_path_factory, "kill", 20.0)
    assert r["role"] == "assistant"
    assert r["stop"] == "error"
    assert "PeerLostError" in r["error"] and "connection" in r["error"], r["error"]
    assert r["lost"]
    assert r["cycles"] >= 3 and r["tokens"] > 0
    assert r["seconds"] < 10.0


def test_a_stopped_rank_ends_the_reply_within_the_timeout(tiny_pairs, tmp_path_factory):
    r = _peer_loss(tiny_pairs, tmp_path_factory, "hang", 2.0)
    assert r["stop"] == "error"
    assert "did not answer within 2 s" in r["error"], r["error"]
    assert 1.9 <= r["seconds"] < 10.0


def test_layer_split():
    from app.models.distributed import parse_layer_split

    assert parse_layer_split(None, 6, 2) == [3, 3]
    assert parse_layer_split("", 7, 2) == [4, 3]
    assert parse_layer_split("2,4", 6, 2) == [2, 4]
    for bad in ("3,4", "6", "0,6", "a,b", "2,2,2"):
        with pytest.raises(ModelLoadError):
            parse_layer_split(bad, 6, 2)
    with pytest.raises(GenerationError):
        parse_layer_split(None, 1, 2)


def _app(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


CHAT = ["chat", "--json", "--mode", "dflash", "--max-tokens", "40", "--tools", "none",
        "--prompt", "Name five capitals in Europe."]


@pytest.fixture(scope="module")
def one_process_chat(tmp_path_factory) -> dict:
    data = tmp_path_factory.mktemp("chat_data")
    one = _app("--data-dir", str(data), *CHAT)
    assert one.returncode == 0, one.stderr
    return json.loads(one.stdout)


@pytest.mark.parametrize("ranks, split, layers", [(2, "2,4", "0-1, 2-5"),
                                                  (3, None, "0-1, 2-3, 4-5")])
def test_chat_distributed_on_local_ranks_gives_the_one_process_reply(
        tmp_path, one_process_chat, ranks, split, layers):
    """Three ranks too: the stream and the tap states of two ranks travel on to the last."""
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * ranks))
    extra = ["--layer-split", split] if split else []
    run = _app("--data-dir", str(tmp_path / "data"), *CHAT, "--distributed", str(hosts), *extra)
    assert run.returncode == 0, run.stderr
    assert f"runs on {ranks} processes (layers {layers})" in run.stderr
    a, b = one_process_chat, json.loads(run.stdout)
    assert b["tokens"] == a["tokens"] and len(a["tokens"]) == 40
    assert b["summary"]["cycles"] == a["summary"]["cycles"]
    assert a["summary"]["network_bytes"] == 0
    assert b["summary"]["network_bytes"] > 0 and b["summary"]["network_wait_s"] > 0


def test_distributed_arguments_are_checked(tmp_path):
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]))
    data = ["--data-dir", str(tmp_path / "d")]
    one_host = _app(*data, "chat", "--distributed", str(hosts))
    assert one_host.returncode == 2
    assert "name two hosts or more" in one_host.stderr
    missing = _app(*data, "chat", "--distributed", str(tmp_path / "none.json"))
    assert missing.returncode == 2 and "cannot read the hostfile" in missing.stderr
    two = tmp_path / "two.json"
    two.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2))
    split = _app(*data, "chat", "--distributed", str(two), "--layer-split", "3,4")
    assert split.returncode == 2
    assert split.stderr.count("--layer-split '3,4': give 2 layer counts") == 1  # before any start
    serve = _app(*data, "serve", "--distributed", str(hosts))
    assert serve.returncode == 2
    assert "serve --distributed is not supported yet" in serve.stderr


def test_remote_hosts_are_started_through_mlx_launch(tmp_path, monkeypatch):
    """A hostfile naming other machines runs the same command again under ``mlx.launch``
    (ring backend, this Python, this folder), which starts it on every host."""
    import argparse

    from app.commands import distributed

    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps({"hosts": [{"ssh": "mac-a.local", "ips": ["10.0.0.1"]},
                                           {"ssh": "mac-b.local", "ips": ["10.0.0.2"]}]}))
    monkeypatch.delenv("MLX_RANK", raising=False)
    monkeypatch.setattr(sys, "argv", ["app", "chat", "--distributed", str(hosts)])
    seen = {}

    def fake_execv(path, argv):
        seen["argv"] = argv
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", fake_execv)
    args = argparse.Namespace(distributed=str(hosts), network_timeout=30.0)
    with pytest.raises(SystemExit):
        distributed.join(args)
    argv = seen["argv"]
    assert argv[0] == sys.executable and "mlx._distributed_utils.launch" in argv[2]
    rest = argv[3:]
    assert rest[rest.index("--hostfile") + 1] == str(hosts)
    assert rest[rest.index("--backend") + 1] == "ring"
    assert rest[rest.index("--python") + 1] == sys.executable
    assert rest[rest.index("--") + 1:] == ["-m", "app", "chat", "--distributed", str(hosts)]

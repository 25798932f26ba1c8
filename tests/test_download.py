"""Downloads through a local HTTP server that answers like the Hugging Face hub.

The server implements the three requests huggingface_hub 2.x makes for a model:
``GET /api/models/{repo}/revision/{rev}`` (commit ``sha`` and ``siblings`` with sizes),
``HEAD /{repo}/resolve/{rev}/{file}`` (``X-Repo-Commit``, ``ETag``, ``Content-Length``) and the
matching ``GET``. ``HF_ENDPOINT`` points at it.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import huggingface_hub.constants as hf_constants
import numpy as np
import pytest

from app.engine.errors import ModelNotFoundError
from app.models import download as dl
from app.models.catalog import Catalog
from app.models.tiny import target_config

COMMIT = "c0ffee00" * 5
REPO = "org/tiny-remote"


def _repo_files() -> dict[str, bytes]:
    t = target_config("qwen3", vocab_size=300, eos_id=299)
    from safetensors.numpy import save

    small = save({"a": np.arange(16, dtype=np.float32)})
    big = save({"b": np.zeros(256 * 1024, dtype=np.float32)})  # ~1 MB, served slowly
    return {
        "config.json": json.dumps(t).encode(),
        "model-00001-of-00002.safetensors": small,
        "model-00002-of-00002.safetensors": big,
        "README.md": b"# not fetched\n",
    }


class FakeHub:
    """A loopback server with one model repo; counts GETs per file."""

    def __init__(self, files: dict[str, bytes], slow_file: str | None = None,
                 piece: int = 64 * 1024, delay_s: float = 0.01):
        self.files = files
        self.slow_file = slow_file
        self.piece = piece
        self.delay_s = delay_s
        self.gets: dict[str, int] = {}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _resolve(self, head: bool):
                # /{org}/{name}/resolve/{rev}/{file}
                parts = self.path.split("?")[0].lstrip("/").split("/")
                if len(parts) < 5 or parts[2] != "resolve" or "/".join(parts[:2]) != REPO:
                    self.send_error(404)
                    return
                rev, name = parts[3], "/".join(parts[4:])
                if rev not in ("main", COMMIT) or name not in hub.files:
                    self.send_response(404)
                    self.send_header("X-Repo-Commit", COMMIT)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.end_headers()
                    return
                data = hub.files[name]
                self.send_response(200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f"\"{hashlib.sha256(data).hexdigest()}\"")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                if head:
                    return
                hub.gets[name] = hub.gets.get(name, 0) + 1
                try:
                    if name == hub.slow_file:
                        for i in range(0, len(data), hub.piece):
                            self.wfile.write(data[i:i + hub.piece])
                            self.wfile.flush()
                            time.sleep(hub.delay_s)
                    else:
                        self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_HEAD(self):
                self._resolve(head=True)

            def do_GET(self):
                path = self.path.split("?")[0]
                prefix = f"/api/models/{REPO}/revision/"
                if path.startswith(prefix):
                    body = json.dumps({
                        "id": REPO,
                        "sha": COMMIT,
                        "siblings": [{"rfilename": n, "size": len(d)}
                                     for n, d in hub.files.items()],
                    }).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if path.startswith("/api/models/"):
                    body = b'{"error": "Repository not found"}'
                    self.send_response(404)
                    self.send_header("X-Error-Code", "RepoNotFound")
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self._resolve(head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def online(monkeypatch, tmp_path):
    """Allow hub calls (``make test`` sets HF_HUB_OFFLINE=1) and use a temporary HF_HOME."""
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return tmp_path / "hf" / "hub"


@pytest.fixture
def hub(online, monkeypatch):
    files = _repo_files()
    server = FakeHub(files, slow_file="model-00002-of-00002.safetensors")
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    yield server
    server.close()


def test_plan_lists_model_files_config_last(hub):
    plan = dl.plan_download(REPO)
    assert plan.commit == COMMIT
    names = [f.name for f in plan.files]
    assert names[-1] == "config.json" and "README.md" not in names
    assert plan.total_bytes == sum(len(hub.files[n]) for n in names)


def test_download_lands_in_cache_with_progress(hub, online, tmp_path):
    events: list[dl.DownloadProgress] = []
    done = threading.Event()
    outcome = {}

    def finished(path, error):
        outcome.update(path=path, error=error, thread=threading.current_thread().name)
        done.set()

    job = dl.DownloadJob(REPO, on_progress=events.append, on_finished=finished).start()
    assert done.wait(30) and job.wait(5)
    assert outcome["error"] is None, outcome["error"]
    snapshot = outcome["path"]
    assert snapshot == online / "models--org--tiny-remote" / "snapshots" / COMMIT
    assert outcome["thread"] == f"download {REPO}"
    for name in ("config.json", "model-00001-of-00002.safetensors",
                 "model-00002-of-00002.safetensors"):
        assert (snapshot / name).read_bytes() == hub.files[name]
    assert not (snapshot / "README.md").exists()
    assert (online / "models--org--tiny-remote" / "refs" / "main").read_text() == COMMIT

    total = sum(len(d) for n, d in hub.files.items() if n != "README.md")
    assert events[-1].bytes_done == total and events[-1].bytes_total == total
    assert events[-1].files_done == events[-1].files_total == 3
    dones = [e.bytes_done for e in events]
    assert dones == sorted(dones) and len(set(dones)) >= 5  # several steps inside the big file
    assert any(e.rate_bps > 0 and e.eta_s is not None for e in events[:-1])
    assert any(e.current_file == "model-00002-of-00002.safetensors" for e in events)

    # the catalog now lists it, as a cache target
    catalog = Catalog(data_dir=tmp_path / "data", bundled=())
    entry = catalog.find(REPO)
    assert entry is not None and entry.source == "cache" and entry.kind == "target"


def test_cancel_registers_nothing_and_a_later_download_resumes(hub, online, tmp_path):
    job_box = {}

    def on_progress(p: dl.DownloadProgress):
        if p.current_file == "model-00002-of-00002.safetensors" and p.bytes_done > 0:
            job_box["job"].cancel()

    job = dl.DownloadJob(REPO, on_progress=on_progress)
    job_box["job"] = job
    job.start()
    assert job.wait(30)
    assert isinstance(job.error, dl.DownloadCancelled) and job.result is None
    repo_dir = online / "models--org--tiny-remote"
    assert not (repo_dir / "refs" / "main").exists()
    assert not (repo_dir / "snapshots" / COMMIT / "config.json").exists()
    assert not (repo_dir / "snapshots" / COMMIT / "model-00002-of-00002.safetensors").exists()
    assert not list(repo_dir.rglob("*.incomplete"))
    catalog = Catalog(data_dir=tmp_path / "data", bundled=())
    assert catalog.find(REPO) is None
    assert "incomplete download" in dict(catalog.scan().skipped)[REPO]
    assert hub.gets["model-00001-of-00002.safetensors"] == 1

    path = dl.download_repo(REPO)
    assert (path / "config.json").read_bytes() == hub.files["config.json"]
    assert hub.gets["model-00001-of-00002.safetensors"] == 1  # kept, not fetched again
    assert hub.gets["model-00002-of-00002.safetensors"] == 2
    assert Catalog(data_dir=tmp_path / "data", bundled=()).find(REPO) is not None


def test_server_down_gives_a_clear_error(online, monkeypatch):
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    job = dl.DownloadJob(REPO).start()
    assert job.wait(30)
    assert isinstance(job.error, dl.HubUnreachableError)
    assert f"cannot reach http://127.0.0.1:{port}" in str(job.error)
    assert not online.exists() or not list(online.glob("models--*"))


def test_offline_mode_and_unknown_repo(hub, monkeypatch):
    with pytest.raises(ModelNotFoundError, match="org/nope was not found"):
        dl.plan_download("org/nope")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(dl.HubUnreachableError, match="offline mode"):
        dl.download_repo(REPO)


def test_delete_frees_the_reported_size(hub, online):
    dl.download_repo(REPO)
    size = dl.cached_size(REPO)
    blobs = online / "models--org--tiny-remote" / "blobs"
    assert size == sum(p.stat().st_size for p in blobs.iterdir())
    assert dl.delete_cached_repo(REPO) == size
    assert dl.cached_size(REPO) is None
    assert not (online / "models--org--tiny-remote").exists()
    with pytest.raises(ModelNotFoundError):
        dl.delete_cached_repo(REPO)


def test_models_cli_download(hub, online, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DFLASH_RESOURCES", str(tmp_path / "no-resources"))
    from app.cli import main

    assert main(["models", "--json", "--download", REPO]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert [t["name"] for t in report["targets"]] == [REPO]
    assert f"{REPO}: {online}" in out.err
    assert main(["models", "--download", "org/nope"]) == 2
    assert "org/nope was not found" in capsys.readouterr().err


def test_xet_progress_counts_each_byte_once_and_cancels():
    """Real hub files are often Xet-backed: huggingface_hub then drives two bars (transfer and
    reconstruction). With the adapter they fold into one and bytes are counted once."""
    from types import SimpleNamespace

    from huggingface_hub.utils._xet_progress_reporting import XetDownloadProgressReporter

    plan = dl.DownloadPlan(REPO, "main", COMMIT, (dl.RemoteFile("model.safetensors", 1000),))
    cancel = threading.Event()
    events = []
    tracker = dl._Tracker(plan, events.append, cancel, min_interval_s=0.0)
    bar_class = type("_JobBar", (dl._Bar,), {"tracker": tracker})
    tracker.start_file("model.safetensors")
    with XetDownloadProgressReporter(reconstruction_desc="r", total=1000, log_level=30,
                                     tqdm_class=bar_class) as rep:
        assert rep.transfer_bar is rep.reconstruction_bar  # folded into one bar
        for done in (300, 600):
            rep.update_progress(SimpleNamespace(
                total_bytes_completed=done, total_transfer_bytes_completed=done,
                total_bytes_completion_rate=None, total_transfer_bytes_completion_rate=None,
                total_bytes=1000))
        assert events[-1].bytes_done == 600
        cancel.set()
        with pytest.raises(dl.DownloadCancelled):
            rep.update_progress(SimpleNamespace(
                total_bytes_completed=900, total_transfer_bytes_completed=900,
                total_bytes_completion_rate=None, total_transfer_bytes_completion_rate=None,
                total_bytes=1000))

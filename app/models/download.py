"""Download models into the Hugging Face cache, with progress and cancel; delete them again.

Qt-free and MLX-free. Downloads go through ``huggingface_hub`` (``HfApi.model_info`` for the
file list, then ``hf_hub_download`` file by file, with a ``tqdm_class`` adapter that reports
bytes and checks the cancel flag) on a plain Python thread (:class:`DownloadJob`), never on
the MLX worker.

*Nothing half-registered*: the catalog lists a cached repo only once its snapshot holds
``config.json``, so ``config.json`` is fetched last, and it is the only file fetched by branch
name (which writes ``refs/<revision>``); the other files are fetched by commit hash. A cancelled
or failed download therefore leaves no ``refs`` entry and no ``config.json``: the repo is
invisible to the catalog. Files completed before the cancel stay in the hub's blob store, so
the next download of the same repo skips them (resume file by file); ``huggingface_hub`` 2.x
deletes its own partial ``*.incomplete`` file of the interrupted file.

Errors are typed: :class:`HubUnreachableError` (offline mode, no connection, server error),
:class:`DownloadCancelled`, :class:`DownloadError` (anything else the hub reports),
:class:`~app.engine.errors.ModelNotFoundError` (no such repo).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.engine.errors import EngineError, ModelNotFoundError

ALLOW_PATTERNS = (
    "*.json",
    "*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
)
"""Files fetched for a model: mlx-lm 0.32.2's ``utils.DEFAULT_ALLOW_PATTERNS`` (with every
``*.safetensors``, since z-lab drafters ship ``model.safetensors`` too)."""

CONFIG_FILE = "config.json"


class DownloadError(EngineError):
    """A download failed for a reason the message states (revision or file missing, disk
    error, unexpected server answer)."""


class HubUnreachableError(DownloadError):
    """The hub cannot be reached: offline mode (``HF_HUB_OFFLINE``), no connection, a
    timeout, or a server error. Nothing was registered."""


class DownloadCancelled(DownloadError):
    """The download was cancelled; nothing was registered."""


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repo: path in the repo and size in bytes (None when the hub omits it)."""

    name: str
    size: int | None


@dataclass(frozen=True)
class DownloadPlan:
    """What a download will fetch: the commit the revision points at and the files."""

    repo_id: str
    revision: str
    commit: str
    files: tuple[RemoteFile, ...]

    @property
    def total_bytes(self) -> int | None:
        """Sum of the file sizes in bytes, None when any size is unknown."""
        if any(f.size is None for f in self.files):
            return None
        return sum(f.size or 0 for f in self.files)


@dataclass(frozen=True)
class DownloadProgress:
    """A progress report.

    Attributes:
        repo_id: the repo being fetched.
        bytes_done: bytes in place so far (files already cached count as done).
        bytes_total: total bytes of the download (None when unknown).
        rate_bps: bytes per second over the last few seconds (0.0 before any data).
        eta_s: seconds left at that rate (None when unknown).
        current_file: the file being fetched (None between files).
        files_done, files_total: file counts.
    """

    repo_id: str
    bytes_done: int
    bytes_total: int | None
    rate_bps: float
    eta_s: float | None
    current_file: str | None
    files_done: int
    files_total: int

    @property
    def fraction(self) -> float | None:
        """bytes_done / bytes_total in 0..1, None when the total is unknown."""
        if not self.bytes_total:
            return None
        return min(1.0, self.bytes_done / self.bytes_total)


ProgressCallback = Callable[[DownloadProgress], None]


def hub_endpoint(endpoint: str | None = None) -> str:
    """The hub URL: ``endpoint``, else ``HF_ENDPOINT`` read now, else huggingface_hub's."""
    if endpoint:
        return endpoint.rstrip("/")
    if os.environ.get("HF_ENDPOINT"):
        return os.environ["HF_ENDPOINT"].rstrip("/")
    from huggingface_hub import constants

    return constants.ENDPOINT


def _is_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _translate(exc: BaseException, repo_id: str, endpoint: str) -> EngineError:
    """Map huggingface_hub / httpx errors to this module's typed errors."""
    import httpx2
    from huggingface_hub import errors as hf_errors
    from huggingface_hub.utils import OfflineModeIsEnabled

    if isinstance(exc, EngineError):
        return exc
    if isinstance(exc, OfflineModeIsEnabled):
        return HubUnreachableError(
            f"cannot download {repo_id}: offline mode is on (HF_HUB_OFFLINE); unset it to "
            "download, or use a model that is already on disk"
        )
    if isinstance(exc, (httpx2.ConnectError, httpx2.TimeoutException, httpx2.NetworkError)):
        return HubUnreachableError(
            f"cannot reach {endpoint} to download {repo_id}: {exc.__class__.__name__}: {exc}. "
            "Check the network connection and try again; files already fetched are kept"
        )
    if isinstance(exc, hf_errors.LocalEntryNotFoundError):
        return HubUnreachableError(
            f"cannot reach {endpoint} to download {repo_id} (the connection failed and the "
            "file is not cached). Check the network connection and try again"
        )
    if isinstance(exc, hf_errors.GatedRepoError):
        return DownloadError(
            f"{repo_id} is gated: accept its terms on the hub and log in (`hf auth login`)"
        )
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        return ModelNotFoundError(f"{repo_id} was not found on {endpoint} (or it is private)")
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return DownloadError(f"{repo_id} has no such revision on {endpoint}: {exc}")
    if isinstance(exc, hf_errors.EntryNotFoundError):
        return DownloadError(f"a file of {repo_id} is missing on {endpoint}: {exc}")
    if isinstance(exc, hf_errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status is not None and status >= 500:
            return HubUnreachableError(
                f"{endpoint} answered HTTP {status} for {repo_id}; try again later"
            )
        return DownloadError(f"downloading {repo_id} failed: {exc}")
    if isinstance(exc, OSError):
        return DownloadError(f"downloading {repo_id} failed: {exc}")
    return DownloadError(f"downloading {repo_id} failed: {exc.__class__.__name__}: {exc}")


def plan_download(
    repo_id: str,
    revision: str = "main",
    *,
    endpoint: str | None = None,
    token: str | bool | None = None,
    allow_patterns: tuple[str, ...] | list[str] = ALLOW_PATTERNS,
    timeout: float = 15.0,
) -> DownloadPlan:
    """Ask the hub for the commit and file list of ``repo_id`` at ``revision``.

    Uses ``HfApi.model_info(files_metadata=True)`` (``GET /api/models/{repo}/revision/{rev}``).
    Files are filtered with ``allow_patterns``; ``config.json`` comes last.

    Raises:
        HubUnreachableError, ModelNotFoundError, DownloadError.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.utils import filter_repo_objects

    url = hub_endpoint(endpoint)
    if _is_offline():
        raise _translate(_offline_error(), repo_id, url)
    try:
        info = HfApi(endpoint=url, token=token).model_info(
            repo_id, revision=revision, files_metadata=True, timeout=timeout
        )
    except Exception as exc:
        raise _translate(exc, repo_id, url) from exc
    if not info.sha:
        raise DownloadError(f"{url} gave no commit for {repo_id}@{revision}")
    siblings = {s.rfilename: s.size for s in (info.siblings or [])}
    names = list(filter_repo_objects(list(siblings), allow_patterns=list(allow_patterns)))
    if CONFIG_FILE not in names:
        raise DownloadError(f"{repo_id} has no {CONFIG_FILE}: not a model this app can load")
    names.sort(key=lambda n: (n == CONFIG_FILE, n))
    files = tuple(RemoteFile(n, siblings[n]) for n in names)
    return DownloadPlan(repo_id=repo_id, revision=revision, commit=info.sha, files=files)


def _offline_error():
    from huggingface_hub.utils import OfflineModeIsEnabled

    return OfflineModeIsEnabled("offline mode")


class _Tracker:
    """Counts bytes across files, computes rate / time left, throttles reports, cancels."""

    def __init__(self, plan: DownloadPlan, on_progress: ProgressCallback | None,
                 cancel: threading.Event, min_interval_s: float):
        self.plan = plan
        self.on_progress = on_progress
        self.cancel = cancel
        self.min_interval_s = min_interval_s
        self.total = plan.total_bytes
        self.done_files_bytes = 0
        self.current_bytes = 0
        self.current_file: str | None = None
        self.files_done = 0
        self.samples: collections.deque[tuple[float, int]] = collections.deque()
        self.last_emit = 0.0

    def check(self) -> None:
        if self.cancel.is_set():
            raise DownloadCancelled(f"download of {self.plan.repo_id} cancelled")

    def start_file(self, name: str) -> None:
        self.check()
        self.current_file = name
        self.current_bytes = 0

    def add(self, n: float | None) -> None:
        self.current_bytes += int(n or 0)
        self.emit()
        self.check()

    def finish_file(self, size: int) -> None:
        self.done_files_bytes += size
        self.current_bytes = 0
        self.current_file = None
        self.files_done += 1
        self.emit(force=True)

    def report(self) -> DownloadProgress:
        now = time.monotonic()
        done = self.done_files_bytes + self.current_bytes
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[0][0] > 5.0:
            self.samples.popleft()
        t0, b0 = self.samples[0]
        rate = (done - b0) / (now - t0) if now - t0 > 1e-3 else 0.0
        eta = None
        if self.total is not None and rate > 0:
            eta = max(0.0, (self.total - done) / rate)
        return DownloadProgress(
            repo_id=self.plan.repo_id,
            bytes_done=done,
            bytes_total=self.total,
            rate_bps=max(0.0, rate),
            eta_s=eta,
            current_file=self.current_file,
            files_done=self.files_done,
            files_total=len(self.plan.files),
        )

    def emit(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.on_progress is None or (not force and now - self.last_emit < self.min_interval_s):
            return
        self.last_emit = now
        self.on_progress(self.report())


class _Bar:
    """The ``tqdm_class`` handed to ``hf_hub_download``: forwards byte counts to a tracker.

    ``update_transfer`` exists so that Xet downloads route both of their bars into this one
    (``huggingface_hub.utils._xet_progress_reporting``); only ``update`` counts bytes.
    """

    tracker: _Tracker

    def __init__(self, *args, **kwargs):
        self.n = int(kwargs.get("initial") or 0)
        self.total = kwargs.get("total")
        if self.n:
            self.tracker.add(self.n)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def update(self, n: float | None = 1) -> None:
        self.n += int(n or 0)
        self.tracker.add(n)

    def update_transfer(self, n: float | None = 1) -> None:
        self.tracker.check()

    def set_postfix_str(self, *args, **kwargs) -> None:
        pass

    def set_transfer_postfix_str(self, *args, **kwargs) -> None:
        pass

    def refresh(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass


def download_repo(
    repo_id: str,
    revision: str = "main",
    *,
    cache_dir: str | Path | None = None,
    endpoint: str | None = None,
    token: str | bool | None = None,
    on_progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    allow_patterns: tuple[str, ...] | list[str] = ALLOW_PATTERNS,
    plan: DownloadPlan | None = None,
    min_interval_s: float = 0.1,
) -> Path:
    """Download ``repo_id`` into the HF cache and return its snapshot folder. Blocking.

    ``on_progress`` is called from the calling thread at most every ``min_interval_s`` seconds
    and after each file. Setting ``cancel`` stops the download at the next chunk (HTTP) or file
    (Xet) and raises :class:`DownloadCancelled`.

    Raises:
        DownloadCancelled, HubUnreachableError, ModelNotFoundError, DownloadError.
    """
    from huggingface_hub import hf_hub_download

    from app.models.catalog import hf_cache_dir

    url = hub_endpoint(endpoint)
    cache = Path(cache_dir) if cache_dir is not None else hf_cache_dir()
    cancel = cancel or threading.Event()
    if plan is None:
        plan = plan_download(
            repo_id, revision, endpoint=url, token=token, allow_patterns=allow_patterns
        )
    tracker = _Tracker(plan, on_progress, cancel, min_interval_s)
    bar_class = type("_JobBar", (_Bar,), {"tracker": tracker})
    tracker.emit(force=True)
    path: str | None = None
    for f in plan.files:
        tracker.start_file(f.name)
        last = f.name == CONFIG_FILE
        try:
            path = hf_hub_download(
                repo_id,
                f.name,
                # Only the last file (config.json) goes by branch name, which writes refs/.
                revision=plan.revision if last else plan.commit,
                cache_dir=str(cache),
                endpoint=url,
                token=token,
                tqdm_class=bar_class,
            )
        except Exception as exc:
            raise _translate(exc, repo_id, url) from exc
        tracker.finish_file(f.size if f.size is not None else Path(path).stat().st_size)
    if path is None:
        raise DownloadError(f"{repo_id} has no files to download")
    snapshot = Path(path).parent
    if snapshot.name != plan.commit:  # the branch moved while downloading
        raise DownloadError(
            f"{repo_id}@{plan.revision} changed during the download; download it again"
        )
    return snapshot


class DownloadJob:
    """One download on its own daemon thread (not the MLX worker).

    Args:
        repo_id, revision, cache_dir, endpoint, token: as :func:`download_repo`.
        on_progress: called on the download thread with :class:`DownloadProgress`.
        on_finished: called once on the download thread with ``(snapshot_path, None)`` or
            ``(None, error)`` where error is an :class:`~app.engine.errors.EngineError`.

    ``cancel()`` is thread-safe; ``wait()`` joins. ``result``/``error`` hold the outcome.
    """

    def __init__(
        self,
        repo_id: str,
        revision: str = "main",
        *,
        cache_dir: str | Path | None = None,
        endpoint: str | None = None,
        token: str | bool | None = None,
        on_progress: ProgressCallback | None = None,
        on_finished: Callable[[Path | None, EngineError | None], None] | None = None,
    ):
        self.repo_id = repo_id
        self.revision = revision
        self.cache_dir = cache_dir
        self.endpoint = endpoint
        self.token = token
        self.on_progress = on_progress
        self.on_finished = on_finished
        self.result: Path | None = None
        self.error: EngineError | None = None
        self._cancel = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"download {repo_id}", daemon=True
        )

    def start(self) -> DownloadJob:
        """Start the thread; returns self."""
        self._thread.start()
        return self

    def cancel(self) -> None:
        """Ask the download to stop (takes effect at the next chunk or file)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def is_running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Join the thread; True when it has finished."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            self.result = download_repo(
                self.repo_id,
                self.revision,
                cache_dir=self.cache_dir,
                endpoint=self.endpoint,
                token=self.token,
                on_progress=self.on_progress,
                cancel=self._cancel,
            )
        except EngineError as exc:
            self.error = exc
        except Exception as exc:  # never let a thread die silently
            self.error = DownloadError(f"downloading {self.repo_id} failed: {exc}")
        if self.cancelled and self.result is None and not isinstance(
            self.error, DownloadCancelled
        ):
            self.error = DownloadCancelled(f"download of {self.repo_id} cancelled")
        if self.on_finished is not None:
            self.on_finished(self.result, self.error)


# --------------------------------------------------------------------------------------------
# Cache size and deletion
# --------------------------------------------------------------------------------------------


def _cached_repo(repo_id: str, cache_dir: str | Path | None):
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    from app.models.catalog import hf_cache_dir

    cache = Path(cache_dir) if cache_dir is not None else hf_cache_dir()
    try:
        info = scan_cache_dir(cache)
    except CacheNotFound:
        return None, None
    for repo in info.repos:
        if repo.repo_type == "model" and repo.repo_id.lower() == repo_id.lower():
            return info, repo
    return info, None


def cached_size(repo_id: str, cache_dir: str | Path | None = None) -> int | None:
    """Bytes on disk of ``repo_id`` in the HF cache (all revisions), None when not cached."""
    _info, repo = _cached_repo(repo_id, cache_dir)
    return None if repo is None else repo.size_on_disk


def delete_cached_repo(repo_id: str, cache_dir: str | Path | None = None) -> int:
    """Delete every cached revision of ``repo_id`` with huggingface_hub's deletion strategy
    (``HFCacheInfo.delete_revisions``); returns the bytes freed.

    Raises:
        ModelNotFoundError: the repo is not in the cache.
        DownloadError: the files could not be removed.
    """
    info, repo = _cached_repo(repo_id, cache_dir)
    if repo is None:
        raise ModelNotFoundError(f"{repo_id} is not in the Hugging Face cache")
    strategy = info.delete_revisions(*(r.commit_hash for r in repo.revisions))
    freed = strategy.expected_freed_size
    try:
        strategy.execute()
    except OSError as exc:
        raise DownloadError(f"could not delete {repo_id}: {exc}") from exc
    if repo.repo_path.exists():  # revisions-less leftovers (e.g. a cancelled download's blobs)
        import shutil

        shutil.rmtree(repo.repo_path, ignore_errors=True)
    return freed

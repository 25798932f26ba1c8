"""Which BLAS the running process uses for MLX's CPU matrix products, and how to get a fast one.

Why it matters (``shared/DFLASH_NOTES.md``, "Speed off Apple GPUs"): the Linux ``mlx-cpu``
wheel links a reference (netlib) BLAS, bundled as ``mlx_cpu.libs/libblas-<hash>.so.3.10.0``.
Its ``cblas_sgemm`` runs at a few GFLOP/s whatever the batch, so a T-token forward costs about
T times a 1-token forward and speculative verification cannot beat plain decoding. libmlx calls
the standard ``cblas_*`` names, so an optimized BLAS loaded ahead of it (Debian's
``libopenblas0-pthread`` through ``LD_PRELOAD``) takes over those calls.

How the library in use is found (Linux): glibc resolves a symbol of a ``dlopen``-ed library
through the global scope first (the executable, its dependencies and ``LD_PRELOAD``-ed
objects), then the library's own dependencies. So ``dlsym(RTLD_DEFAULT, "cblas_sgemm")``
followed by ``dladdr`` names the object that wins when one is in the global scope; otherwise
libmlx binds to the BLAS among its own dependencies, found in ``/proc/self/maps``. On macOS,
MLX uses Accelerate (and the GPU through Metal); nothing is changed there.

How OpenBLAS gets there (Linux): importing ``app.engine`` (or ``app.chat`` / ``app.models``,
which import it) calls :func:`prepare_blas`, which loads Debian's OpenBLAS with
``RTLD_GLOBAL`` before MLX is imported (:func:`load_optimized_blas`): a library opened that
way is in the global scope when libmlx is loaded later, so its BLAS calls bind to OpenBLAS,
exactly as with ``LD_PRELOAD`` (measured: a 512x512 float32 product 2.7 ms either way against
48 ms on the reference BLAS). Python loads extension modules with ``RTLD_NOW``, so once
``mlx.core`` is imported its calls are bound and a later load changes nothing: then
:func:`prepare_blas` warns once instead. ``python -m app`` re-executes itself with
``LD_PRELOAD`` only where the in-process load could not happen
(:func:`maybe_reexec_with_optimized_blas`).
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import sys
from dataclasses import dataclass
from typing import TextIO

#: Set in the environment of a re-executed process (guards against exec loops).
REEXEC_GUARD = "DFLASH_BLAS_REEXECED"
#: ``1`` keeps the BLAS MLX brings: no in-process load (:func:`load_optimized_blas`) and no
#: re-exec (:func:`maybe_reexec_with_optimized_blas`).
NO_REEXEC = "DFLASH_NO_BLAS_REEXEC"
#: Set (to the library path) by the Makefile and by the re-exec when OpenBLAS is preloaded.
PRELOADED = "DFLASH_BLAS_PRELOADED"
#: Debian/Ubuntu's OpenBLAS build exporting the standard BLAS names (``libopenblas0-pthread``).
OPENBLAS_GLOB = "/usr/lib/*/openblas-pthread/libblas.so.3"

_warned = False
_in_process: str | None = None  # the library load_optimized_blas loaded, if it did
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BlasInfo:
    """The BLAS in use.

    Attributes:
        name: a short human name, e.g. ``"OpenBLAS"``, ``"reference BLAS (netlib, bundled with
            mlx-cpu)"``, ``"Accelerate (macOS)"``, ``"unknown"``.
        path: the shared object's file path ("" when not a file, e.g. on macOS).
        optimized: True for a tuned BLAS (OpenBLAS, MKL, BLIS, Accelerate).
        loaded: True when read from the libraries mapped in this process; False when MLX is not
            loaded yet and the answer is what libmlx will bind to (``LD_PRELOAD`` and the
            wheel's bundled libraries).
    """

    name: str
    path: str
    optimized: bool
    loaded: bool = True


def classify(path: str) -> tuple[str, bool]:
    """(name, optimized) for a BLAS shared object's path, judged by its file and folder names.

    Raises nothing; an unrecognised ``libblas`` is reported as a reference BLAS (Debian's
    ``/usr/lib/<arch>/blas/libblas.so.3`` is netlib's).
    """
    low = path.lower()
    base = os.path.basename(low)
    if "openblas" in low:
        return "OpenBLAS", True
    if "mkl" in base:
        return "Intel MKL", True
    if "blis" in base:
        return "BLIS", True
    if "atlas" in low:
        return "ATLAS", True
    if "accelerate" in low or "veclib" in low:
        return "Accelerate (macOS)", True
    if "mlx_cpu.libs" in low or "mlx.libs" in low:
        return "reference BLAS (netlib, bundled with mlx-cpu)", False
    return "reference BLAS (netlib)", False


def _mapped_paths() -> list[str]:
    """File paths of the shared objects mapped in this process (Linux ``/proc/self/maps``)."""
    seen: list[str] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    p = parts[5].strip()
                    if p not in seen:
                        seen.append(p)
    except OSError:
        pass
    return seen


def _is_blas_object(path: str) -> bool:
    base = os.path.basename(path).lower()
    return base.startswith(("libblas", "libopenblas", "libmkl_rt", "libblis", "libcblas",
                            "libsatlas", "libtatlas"))


def _global_cblas_provider() -> str | None:
    """The file of the object that ``cblas_sgemm`` resolves to in the global scope, or None."""

    class _DlInfo(ctypes.Structure):
        _fields_ = [
            ("dli_fname", ctypes.c_char_p),
            ("dli_fbase", ctypes.c_void_p),
            ("dli_sname", ctypes.c_char_p),
            ("dli_saddr", ctypes.c_void_p),
        ]

    try:
        libc = ctypes.CDLL(None)
        libc.dlsym.restype = ctypes.c_void_p
        libc.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        addr = libc.dlsym(None, b"cblas_sgemm")  # None == RTLD_DEFAULT on glibc
        if not addr:
            return None
        info = _DlInfo()
        if not libc.dladdr(addr, ctypes.byref(info)) or not info.dli_fname:
            return None
        return os.path.realpath(info.dli_fname.decode()) if info.dli_fname else None
    except (OSError, AttributeError):
        return None


def _preloaded_blas() -> str | None:
    """The first BLAS object named in ``LD_PRELOAD``, or None."""
    for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split():
        if _is_blas_object(p):
            return p
    return None


def _mlx_loaded() -> bool:
    """True once libmlx is loaded in this process (its BLAS calls are bound then)."""
    return "mlx.core" in sys.modules or any("libmlx" in os.path.basename(p)
                                            for p in _mapped_paths())


def _predicted() -> BlasInfo:
    """What libmlx will bind to when it is loaded (MLX not imported yet)."""
    p = _preloaded_blas()
    if p is not None:
        name, opt = classify(p)
        return BlasInfo(name, p, opt, loaded=False)
    provider = _global_cblas_provider()  # e.g. loaded in-process by load_optimized_blas
    if provider:
        name, opt = classify(provider)
        return BlasInfo(name, provider, opt, loaded=False)
    try:
        import importlib.util

        spec = importlib.util.find_spec("mlx")
    except (ImportError, ValueError):
        spec = None
    if spec and spec.submodule_search_locations:
        site = os.path.dirname(list(spec.submodule_search_locations)[0])
        libs = sorted(glob.glob(os.path.join(site, "mlx_cpu.libs", "libblas*")))
        if libs:
            name, opt = classify(libs[0])
            return BlasInfo(name, libs[0], opt, loaded=False)
    return BlasInfo("unknown", "", False, loaded=False)


def blas_in_use(load_mlx: bool = False) -> BlasInfo:
    """The BLAS that MLX's CPU matrix products call in this process.

    Args:
        load_mlx: import ``mlx.core`` first so that its libraries are mapped (off by default:
            the GUI thread must not import MLX; without MLX loaded the answer is predicted and
            ``loaded`` is False).

    Returns:
        :class:`BlasInfo`. macOS: ``Accelerate (macOS)``. Linux: the object that provides
        ``cblas_sgemm`` in the global scope (e.g. a preloaded OpenBLAS), else the BLAS mapped
        among MLX's own dependencies.
    """
    if sys.platform == "darwin":
        return BlasInfo("Accelerate (macOS)", "", True)
    if load_mlx:
        try:
            import mlx.core  # noqa: F401
        except ImportError:
            pass
    mapped = _mapped_paths()
    if not any("libmlx" in os.path.basename(p) for p in mapped):
        return _predicted()
    provider = _global_cblas_provider()
    if provider:
        name, opt = classify(provider)
        return BlasInfo(name, provider, opt)
    blas = [p for p in mapped if _is_blas_object(p)]
    if not blas:
        return BlasInfo("unknown", "", False)
    # Prefer the copy shipped beside MLX (its own dependency) when several are mapped.
    blas.sort(key=lambda p: ("mlx" not in p.lower(), p))
    name, opt = classify(blas[0])
    return BlasInfo(name, blas[0], opt)


def blas_description(load_mlx: bool = True) -> str:
    """One line naming the BLAS in use, its file, and whether it is optimized.

    E.g. ``"OpenBLAS (optimized, 1 thread) /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"``
    or ``"reference BLAS (netlib, bundled with mlx-cpu) (slow) /.../libblas-bd8a282c.so..."``.
    """
    info = blas_in_use(load_mlx=load_mlx)
    state = "optimized" if info.optimized else "slow"
    pending = "" if info.loaded else ", expected once MLX loads"
    threads = openblas_threads(info.path) if info.loaded and info.name == "OpenBLAS" else None
    threads = "" if threads is None else f", {threads} thread{'s' if threads != 1 else ''}"
    return f"{info.name} ({state}{pending}{threads})" + (f" {info.path}" if info.path else "")


def openblas_threads(path: str) -> int | None:
    """The thread count the OpenBLAS at ``path`` (already mapped in this process) runs with,
    from its own ``openblas_get_num_threads``; None when it cannot be asked."""
    import ctypes

    try:
        return int(ctypes.CDLL(path).openblas_get_num_threads())
    except (OSError, AttributeError, ValueError):
        return None


def slow_blas_message(info: BlasInfo, why: str = "") -> str:
    """The warning text for a reference BLAS: why DFlash will be slow and how to fix it
    (``why``: a sentence on why it could not be switched, put before the fix)."""
    lib = find_openblas()
    if lib is None:
        fix = ("`make run` installs (as root) and preloads Debian's OpenBLAS; otherwise run "
               "`sudo apt install libopenblas0-pthread` and start the app through make, or set "
               "LD_PRELOAD=/usr/lib/<arch>/openblas-pthread/libblas.so.3.")
    else:
        fix = ("Debian's OpenBLAS (libopenblas0-pthread) is installed: start the app as "
               "`python -m app` (or through make), import app.engine (or app.chat.session) "
               "before mlx in a script, or set "
               f"LD_PRELOAD={lib} OPENBLAS_NUM_THREADS={OPENBLAS_THREADS}.")
    return (
        f"warning: MLX is using a {info.name} ({info.path or 'path unknown'}). With it a "
        "T-token forward costs about T times a 1-token forward, so DFlash speculative decoding "
        "will be slower than plain decoding on this CPU (the tokens are still exact). "
        + (f"{why} " if why else "") + "Fix: " + fix
    )


def warn_if_slow_blas(stream: TextIO | None = None, load_mlx: bool = False,
                      why: str = "") -> bool:
    """Print :func:`slow_blas_message` to ``stream`` (default stderr) once per process, on
    Linux without an optimized BLAS, and log it as a warning where logging is set up (a
    handler on this logger or above it: without one, logging's last resort would print it
    to stderr a second time). Returns True when it printed this time."""
    global _warned
    if _warned or not sys.platform.startswith("linux"):
        return False
    info = blas_in_use(load_mlx=load_mlx)
    if info.optimized or info.name == "unknown":
        return False
    _warned = True
    text = slow_blas_message(info, why)
    print(text, file=stream or sys.stderr, flush=True)
    if log.hasHandlers():
        log.warning("%s", text)
    return True


#: OpenBLAS threads the app asks for unless ``OPENBLAS_NUM_THREADS`` is set: one. The matrices
#: of the models this CPU path runs are small, and a second thread made DFlash cycles ~3x
#: slower on the 2-core machine this project measures on (docs/performance.md, "Platforms").
OPENBLAS_THREADS = "1"


def find_openblas() -> str | None:
    """Path of Debian's OpenBLAS ``libblas.so.3`` (``/usr/lib/*/openblas-pthread/``), or None."""
    found = sorted(glob.glob(OPENBLAS_GLOB))
    return found[0] if found else None


def loaded_in_process() -> str | None:
    """The OpenBLAS file :func:`load_optimized_blas` loaded into this process, or None."""
    return _in_process


def load_optimized_blas() -> str | None:
    """On Linux, load Debian's OpenBLAS (:func:`find_openblas`) into this process with
    ``RTLD_GLOBAL``, before MLX is imported, so that libmlx's BLAS calls bind to it (module
    doc). OpenBLAS gets :data:`OPENBLAS_THREADS` threads unless ``OPENBLAS_NUM_THREADS`` is
    set (it is set in the environment, as the re-exec does).

    Returns:
        The path loaded (also :func:`loaded_in_process`), or None when nothing was loaded:
        not Linux; frozen (PyInstaller); ``DFLASH_NO_BLAS_REEXEC=1``; a BLAS is named in
        ``LD_PRELOAD`` (``make`` and the re-exec preload one, ``DFLASH_BLAS_PRELOADED``
        says which) or an optimized one already answers ``cblas_sgemm``; MLX is already
        loaded (too late to switch); no OpenBLAS is installed; or the load failed.

    Raises:
        Nothing (an ``OSError`` from the loader is swallowed and None returned).
    """
    global _in_process
    if _in_process is not None:
        return _in_process
    if not sys.platform.startswith("linux") or getattr(sys, "frozen", False):
        return None
    if os.environ.get(NO_REEXEC) == "1" or _preloaded_blas() is not None:
        return None
    provider = _global_cblas_provider()
    if (provider and classify(provider)[1]) or _mlx_loaded():
        return None
    lib = find_openblas()
    if lib is None:
        return None
    os.environ.setdefault("OPENBLAS_NUM_THREADS", OPENBLAS_THREADS)  # read when it loads
    try:
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    _in_process = lib
    return lib


def prepare_blas(stream: TextIO | None = None) -> str | None:
    """What importing ``app.engine`` does on Linux: :func:`load_optimized_blas`; when MLX
    would still use a reference BLAS (it was imported first, or no OpenBLAS is installed),
    :func:`warn_if_slow_blas` once, saying why and how to fix it. Nothing is loaded or said
    with ``DFLASH_NO_BLAS_REEXEC=1`` (the reference BLAS asked for), nor on macOS.

    Args:
        stream: where the warning goes (default stderr).

    Returns:
        The path loaded in-process, or None.
    """
    if not sys.platform.startswith("linux") or os.environ.get(NO_REEXEC) == "1":
        return None
    lib = load_optimized_blas()
    if lib is None:
        why = ""
        if _mlx_loaded() and find_openblas() is not None and _preloaded_blas() is None:
            why = ("MLX was imported before app.engine, so OpenBLAS could not be loaded "
                   "into this process (MLX's BLAS calls are bound when it loads).")
        warn_if_slow_blas(stream, why=why)
    return lib


def maybe_reexec_with_optimized_blas(argv: list[str] | None = None) -> None:
    """On Linux, exec this process again with Debian's OpenBLAS in ``LD_PRELOAD`` (once),
    where importing ``app.engine`` could not load it in-process (:func:`prepare_blas`).

    OpenBLAS gets :data:`OPENBLAS_THREADS` threads unless ``OPENBLAS_NUM_THREADS`` is set.
    Does nothing (returns) when: not Linux; frozen (PyInstaller); ``DFLASH_NO_BLAS_REEXEC=1``;
    already re-executed (``DFLASH_BLAS_REEXECED``); no ``openblas-pthread/libblas.so.3``
    exists; an OpenBLAS is already preloaded or mapped (the usual case: loaded in-process
    when ``app.engine`` was imported); or the process was not started as
    ``python -m app`` (``__main__`` is not ``app.__main__``, e.g. under pytest).

    Args:
        argv: the full command line to run again (default ``sys.orig_argv``: interpreter,
            its options, ``-m app`` and the arguments).

    Raises:
        Nothing on failure to exec (``OSError`` is swallowed and the process continues).
    """
    if not sys.platform.startswith("linux") or getattr(sys, "frozen", False):
        return
    if os.environ.get(NO_REEXEC) == "1" or os.environ.get(REEXEC_GUARD):
        return
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(spec, "name", None) != "app.__main__":
        return
    lib = find_openblas()
    if lib is None:
        return
    preload = os.environ.get("LD_PRELOAD", "")
    if "openblas" in preload.lower() or any("openblas" in p.lower() for p in _mapped_paths()):
        return
    cmd = list(argv) if argv is not None else list(getattr(sys, "orig_argv", []))
    if not cmd:
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = f"{lib}:{preload}" if preload else lib
    env[PRELOADED] = lib
    env[REEXEC_GUARD] = "1"
    env.setdefault("OPENBLAS_NUM_THREADS", OPENBLAS_THREADS)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *cmd[1:]], env)
    except OSError:
        return

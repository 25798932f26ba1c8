"""Which device MLX computes on, in words: for ``--version``, the About box and bench headers.

MLX reports Apple GPUs and NVIDIA GPUs alike as ``Device(gpu, 0)``; the backend is told apart
by ``mx.metal.is_available()`` / ``mx.cuda.is_available()`` and the device's name comes from
``mx.device_info()`` (``device_name``, or ``architecture`` where there is no name).
"""

from __future__ import annotations

from typing import Any


def backend(mx: Any = None) -> str:
    """``"Metal"``, ``"CUDA"`` or ``"CPU"``: what the default device runs on.

    Args:
        mx: the ``mlx.core`` module (or a stand-in with the same attributes, for tests);
            imported when None.
    """
    if mx is None:
        import mlx.core as mx
    if mx.default_device() == mx.cpu:
        return "CPU"
    for name, label in (("metal", "Metal"), ("cuda", "CUDA")):
        try:
            if getattr(mx, name).is_available():
                return label
        except AttributeError:
            continue
    return "GPU"


def device_description(mx: Any = None) -> str:
    """The default device, its name and its backend, e.g.
    ``"Device(gpu, 0): NVIDIA H200 (CUDA)"`` or ``"Device(cpu, 0): Intel(R) Xeon(R) (CPU)"``.

    Never raises: without a name (an MLX without ``device_info``, or one that fails) it is
    ``"Device(gpu, 0) (CUDA)"``.

    Args:
        mx: as for :func:`backend`.
    """
    if mx is None:
        import mlx.core as mx
    dev = str(mx.default_device())
    try:
        info = mx.device_info()
        name = str(info.get("device_name") or info.get("architecture") or "").strip()
    except Exception:  # older MLX, or a backend that cannot say
        name = ""
    try:
        kind = backend(mx)
    except Exception:  # pragma: no cover - shown, not raised
        kind = "unknown backend"
    return f"{dev}: {name} ({kind})" if name else f"{dev} ({kind})"


#: MLX's CUDA backend wheels on Linux (``mlx[cuda12]`` / ``mlx[cuda13]``).
CUDA_WHEELS = ("mlx-cuda-13", "mlx-cuda-12")


def _installed_version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def backend_problem(mx: Any = None, installed=None) -> str | None:
    """Why MLX computes on the CPU although a CUDA backend wheel is installed, with the fix;
    None when there is nothing to say (no CUDA wheel, or MLX runs on a GPU).

    ``mlx-cpu`` and ``mlx-cuda-13`` both ship ``mlx/lib/libmlx.so``: installed together, the
    one installed last wins, and ``pip install '.[cuda]'`` installs both (README, "Linux +
    NVIDIA").

    Args:
        mx: as for :func:`backend`.
        installed: ``dist name -> version or None`` (default: ``importlib.metadata``), for
            tests.
    """
    if mx is None:
        import mlx.core as mx
    lookup = installed or _installed_version
    cuda = next(((d, lookup(d)) for d in CUDA_WHEELS if lookup(d)), None)
    if cuda is None or backend(mx) != "CPU":
        return None
    dist, ver = cuda
    if lookup("mlx-cpu"):
        return (f"{dist} {ver} is installed but MLX runs on the CPU: the mlx-cpu wheel's "
                f"library shadows it. Fix: pip uninstall -y mlx-cpu && pip install "
                f"--force-reinstall --no-deps {dist}=={ver}")
    return (f"{dist} {ver} is installed but MLX runs on the CPU: no CUDA device is visible "
            "(check nvidia-smi and the CUDA 13 libraries)")


#: MLX's switch for cuDNN's fused attention on its CUDA backend (``config::get`` in
#: ``mlx/backend/cuda/scaled_dot_product_attention.cpp``; 1 = on, MLX's default).
CUDNN_SDPA_ENV = "MLX_CUDA_USE_CUDNN_SDPA"


def configure_cuda_attention(mx: Any = None, environ: Any = None) -> bool:
    """On MLX's CUDA backend, turn cuDNN's fused attention off unless the user chose.

    Why: cuDNN builds (and caches) one attention graph per exact query and key length, and a
    DFlash verify pass has a new key length every cycle: measured on an H200 with the demo
    pair (``tools/bench_gpu.py``; docs/history/performance-log.md, "Bundled pair, demo
    prompt"), the first DFlash reply ran at 92 tok/s with cuDNN and 2,327 tok/s without, and
    the first plain reply's time to first token went from 0.27 s to 0.05 s. Without cuDNN, MLX uses its own vector kernel
    (one query) or its operations fallback (several), neither built per length.

    Sets ``MLX_CUDA_USE_CUDNN_SDPA=0`` in ``environ`` (default ``os.environ``) only when the
    default device is a CUDA GPU and the variable is not set already; call it before the
    first attention runs (``load_target`` does).

    Returns:
        True when it set the variable.
    """
    import os

    environ = os.environ if environ is None else environ
    if CUDNN_SDPA_ENV in environ or backend(mx) != "CUDA":
        return False
    environ[CUDNN_SDPA_ENV] = "0"
    return True


#: MLX's folder for the CUDA kernels it compiles (``ptx_cache_dir`` in MLX 0.32's
#: ``mlx/backend/cuda/jit_module.cpp``; default ``<temp dir>/mlx/<version>/ptx``).
PTX_CACHE_ENV = "MLX_PTX_CACHE_DIR"


def configure_cuda_kernel_cache(mx: Any = None, environ: Any = None,
                                folder: Any = None) -> str | None:
    """On MLX's CUDA backend, keep the kernels MLX compiles in the user's cache folder.

    Why: MLX compiles some CUDA kernels with NVRTC on first use and keeps them in
    ``<temp dir>/mlx/<version>/ptx`` unless ``MLX_PTX_CACHE_DIR`` names a folder. Many Linux
    systems empty the temp folder at every boot, and each compile then runs again: 25.9 s of
    a fresh host's warm-up of the bundled pair on an H200 against 1.8 s once the kernels were
    on disk (docs/history/performance-log.md, "A fresh host's load and warm-up"). ``folder``
    (default ``app.paths.cache_dir() / "mlx-kernels" / "<MLX version>-<GPU architecture>"``)
    survives a reboot. The architecture is in the name because MLX stores machine code for this GPU
    under names that do not say which GPU (a home folder shared by two machines).

    Sets ``MLX_PTX_CACHE_DIR`` in ``environ`` (default ``os.environ``) only on CUDA, when the
    user has not set it, and when the folder can be created and written (else MLX would
    silently keep nothing). MLX reads it once, at its first compile, so call this before the
    first forward pass (``load_target`` does). Child processes inherit it
    (:mod:`app.engine.kernels.kernel_prebuild`).

    Returns:
        The folder it set, or None when it set nothing.
    """
    import os
    import re
    from pathlib import Path

    environ = os.environ if environ is None else environ
    if PTX_CACHE_ENV in environ or backend(mx) != "CUDA":
        return None
    if mx is None:
        import mlx.core as mx
    if folder is None:
        from app.paths import cache_dir

        try:
            info = mx.device_info()
            arch = str(info.get("architecture") or info.get("device_name") or "gpu")
        except Exception:  # an MLX that cannot say
            arch = "gpu"
        arch = re.sub(r"[^A-Za-z0-9_.-]+", "_", arch)
        folder = cache_dir() / "mlx-kernels" / f"{mx.__version__}-{arch}"
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError:
        return None
    environ[PTX_CACHE_ENV] = str(folder)
    return str(folder)

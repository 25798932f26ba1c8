"""Put the project's ``mx.fast.cuda_kernel`` kernels into MLX's on-disk kernel cache.

Why: MLX's CUDA backend compiles a custom kernel with NVRTC the first time it runs and keeps
the result in memory only (``CustomKernel::eval_gpu`` asks ``get_jit_module`` for it with
``use_disk_cache=false``, MLX 0.32), so every process compiles the row products, the row
attention and the Gated DeltaNet kernel again, one after another: 8.2 s of a second start's
12.6 s on a fresh H100 host (docs/performance.md). MLX does *read* the disk cache for those
modules before compiling (``JitModule::JitModule`` calls ``read_cached_ptx`` whatever
``use_disk_cache`` says), so a module written there under the name MLX gives it is loaded
instead of compiled.

What: :func:`build` compiles one kernel instance the way MLX would and writes it there, in a
child process of :mod:`app.engine.kernels.kernel_prebuild` (never in the process that runs the
model: it redirects file descriptor 1 for a moment). The pieces, each from MLX 0.32's source
(``mlx/backend/cuda/custom_kernel.cpp`` and ``jit_module.cpp``):

* the kernel's full source and name, as MLX generates them for these inputs and template:
  the kernel call's ``verbose=True`` prints both (:func:`generated_source`);
* the module's name, ``f"{name}_{std::hash<std::string>(source):x}"``, with libstdc++'s
  ``std::_Hash_bytes`` (seed ``0xc70f6907``) called from ``libstdc++.so.6`` (:func:`std_hash`);
* NVRTC (the ``libnvrtc`` MLX is linked to) with MLX's options: the device's SASS
  (``--gpu-architecture=sm_<major><minor>``, ``a`` from compute capability 9),
  ``--device-as-default-execution-space``, MLX's include folders, and MLX's device headers,
  which MLX builds in as ``jit_source_*`` strings and which are read here from ``libmlx.so``'s
  symbol table (:func:`mlx_headers`);
* the three files of a cached module (:func:`write_module`): ``<module>.txt`` (kernel name and
  lowered name, tab-separated), ``<module>.cu`` (the source) and ``<module>.ptx`` (here a
  cubin, as MLX stores it when NVRTC can target the device's SASS).

Same source, same options, same headers, same NVRTC: the same binary MLX would have built, so
no computed value depends on which process compiled it (the GPU test
``tests/test_custom_cache.py`` compares a loaded module's outputs with MLX's own compile, bit
for bit). Where any step fails (another MLX, a stripped library, no NVRTC) nothing is written
and MLX compiles the kernel as before. Opt-in for now, ``DFLASH_CUSTOM_KERNEL_CACHE=1``:
the GPU test and the start's timing have not yet run on a GPU host (docs/performance.md).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CompileError", "GeneratedSource", "build", "enabled", "generated_source",
           "mlx_headers", "module_name", "nvrtc_compile", "parse_verbose", "std_hash",
           "write_module"]

#: libstdc++'s seed for ``std::hash<std::string>`` (``functional_hash.h``:
#: ``_Hash_impl::hash(p, len, seed = 0xc70f6907UL)``).
STD_HASH_SEED = 0xC70F6907

#: MLX's namespace for generated kernels (``custom_kernel.cpp``: ``"mlx::core::cu::" + name``).
KERNEL_NAMESPACE = "mlx::core::cu::"

#: Where MLX's device headers are included from (``jit_module.cpp``'s ``INCLUDE_PREFIX``).
INCLUDE_PREFIX = "mlx/backend/cuda/device/"


class CompileError(RuntimeError):
    """A step of :func:`build` failed (no NVRTC, a header not found, a compile error); the
    message says which. MLX then compiles the kernel itself, as without this module."""


def enabled() -> bool:
    """True when ``DFLASH_CUSTOM_KERNEL_CACHE`` is ``"1"`` (off by default until verified on
    a GPU host: the module's docstring)."""
    return os.environ.get("DFLASH_CUSTOM_KERNEL_CACHE", "0") == "1"


_HASH_BYTES: list = []


def std_hash(data: bytes) -> int:
    """``std::hash<std::string>`` of ``data`` as libstdc++ computes it (an unsigned 64-bit
    int): ``std::_Hash_bytes(data, len, 0xc70f6907)`` called from ``libstdc++.so.6``, the
    library MLX's Linux build uses. ``std_hash(b"")`` is 6142509188972423790.

    Raises:
        OSError: no ``libstdc++.so.6`` (not Linux / glibc); AttributeError: it lacks the symbol.
    """
    if not _HASH_BYTES:
        fn = ctypes.CDLL("libstdc++.so.6")._ZSt11_Hash_bytesPKvmm
        fn.restype = ctypes.c_size_t
        fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t]
        _HASH_BYTES.append(fn)
    return int(_HASH_BYTES[0](data, len(data), STD_HASH_SEED))


def module_name(kernel_name: str, source: str) -> str:
    """The module name MLX's ``CustomKernel::eval_gpu`` gives a custom kernel, which names its
    cache files: ``<kernel name>_<hex of std::hash(source)>``."""
    return f"{kernel_name}_{std_hash(source.encode()):x}"


@dataclass(frozen=True)
class GeneratedSource:
    """One kernel instance as MLX generates it: ``name`` (``custom_kernel_<name><template
    hash>``, without the namespace) and its whole CUDA ``source``."""

    name: str
    source: str


_VERBOSE = re.compile(r"Generated source code for `([^`]+)`:\n```\n(.*)\n```\n?\Z", re.S)


def parse_verbose(text: str) -> GeneratedSource:
    """The kernel name and source from what a ``verbose=True`` kernel call printed
    (``custom_kernel.cpp``: the line ``Generated source code for `NAME`:``, then the source
    between two ````` lines).

    Raises:
        CompileError: ``text`` is not that.
    """
    m = _VERBOSE.search(text)
    if m is None:
        raise CompileError("the kernel call printed no generated source "
                           f"({len(text)} characters: {text[:80]!r})")
    return GeneratedSource(m.group(1), m.group(2))


def generated_source(kernel: Any, **call: Any) -> GeneratedSource:
    """What MLX generates for ``kernel(**call)`` (an ``mx.fast.cuda_kernel`` and its call's
    keyword arguments: inputs, template, grid, ...): the call is made with ``verbose=True``
    while file descriptor 1 points at a temporary file (MLX prints with ``std::cout``), and
    its result is not evaluated (nothing runs on the GPU). For a child process only: output
    of other threads meanwhile would be captured too.

    Raises:
        CompileError: nothing parsable was printed; whatever the kernel call raises.
    """
    import sys

    sys.stdout.flush()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(1)
        try:
            os.dup2(tmp.fileno(), 1)
            kernel(**call, verbose=True)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    return parse_verbose(text)


def _elf_symbols(path: Path, pattern: re.Pattern) -> dict[str, bytes]:
    """Bytes of the data symbols of ELF64 little-endian file ``path`` whose names match
    ``pattern`` (first of duplicates), read through its ``.symtab`` (format: the System V ABI,
    ``Elf64_Shdr`` and ``Elf64_Sym``).

    Raises:
        CompileError: not such a file, or no symbol table (a stripped library).
    """
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != b"\x7fELF" or mm[4] != 2 or mm[5] != 1:
            raise CompileError(f"{path} is not a 64-bit little-endian ELF file")
        shoff, = struct.unpack_from("<Q", mm, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", mm, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", mm, shoff + i * shentsize)
                    for i in range(shnum)]
        symtab = next((s for s in sections if s[1] == 2), None)  # SHT_SYMTAB
        if symtab is None:
            raise CompileError(f"{path} has no symbol table (stripped)")
        strtab = sections[symtab[6]]  # sh_link
        out: dict[str, bytes] = {}
        for off in range(symtab[4], symtab[4] + symtab[5], 24):
            name_off, _info, _other, shndx, value, size = struct.unpack_from("<IBBHQQ", mm, off)
            if not size or shndx == 0 or shndx >= len(sections):
                continue
            start = strtab[4] + name_off
            name = mm[start:mm.find(b"\0", start)].decode(errors="replace")
            if not pattern.search(name):
                continue
            sec = sections[shndx]
            if sec[1] == 8:  # SHT_NOBITS: no bytes in the file
                continue
            at = value - sec[3] + sec[4]  # address -> file offset
            out.setdefault(name, bytes(mm[at:at + size]))
        return out


_JIT_SOURCE = re.compile(r"jit_source_(\w+?)E$")


def mlx_headers(library: Path) -> dict[str, str]:
    """MLX's device headers, include name -> text, as its CUDA library holds them: the
    ``mlx::core::jit_source_<name>`` character arrays (``cuda_jit_sources.h``), named
    ``mlx/backend/cuda/device/<name>.cuh`` (``config.h`` for ``config``) as
    ``jit_module.cpp``'s ``g_include_names`` names them. Arrays that are kernel sources rather
    than headers come along under such names too; nothing includes them.

    Raises:
        CompileError: the library is unreadable, stripped, or holds no such array.
    """
    try:
        found = _elf_symbols(library, _JIT_SOURCE)
    except OSError as exc:
        raise CompileError(f"cannot read {library}: {exc}") from exc
    out = {}
    for symbol, data in found.items():
        name = _JIT_SOURCE.search(symbol).group(1)
        include = INCLUDE_PREFIX + (f"{name}.h" if name == "config" else f"{name}.cuh")
        out[include] = data.split(b"\0", 1)[0].decode()
    if INCLUDE_PREFIX + "utils.cuh" not in out:
        raise CompileError(f"{library} holds no jit_source_utils: not MLX's CUDA library?")
    return out


def _loaded_library(fragment: str) -> Path:
    """The path of the shared library of this process whose file name starts with
    ``fragment`` + ``.so`` (``libnvrtc`` gives ``libnvrtc.so.13``, not
    ``libnvrtc-builtins.so.13``), from ``/proc/self/maps``.

    Raises:
        CompileError: none is loaded.
    """
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if os.path.basename(path).startswith(fragment + ".so") and path.startswith("/"):
                    return Path(path)
    except OSError:
        pass
    raise CompileError(f"no {fragment} library is loaded in this process")


def include_folders(library: Path) -> list[str]:
    """MLX's ``--include-path`` folders (``include_path_args``): ``<mlx>/include``, its
    ``cccl`` folder, and the CUDA headers: ``site-packages/nvidia/cu13/include`` beside MLX,
    else ``$CUDA_HOME``, ``$CUDA_PATH`` or ``/usr/local/cuda``, each ``/include``. Missing
    folders are left out, as MLX leaves them out (MLX raises where no CUDA headers are found;
    the compile then fails here too)."""
    root = library.parent.parent  # <site-packages>/mlx
    out = [p for p in (root / "include", root / "include" / "cccl") if p.is_dir()]
    cuda = root.parent / "nvidia" / "cu13" / "include"
    if not cuda.is_dir():
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        cuda = Path(home) / "include"
    if cuda.is_dir():
        out.append(cuda)
    return [str(p) for p in out]


def _check(nvrtc: Any, result: int, what: str, prog: Any = None) -> None:
    if result == 0:
        return
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
    message = nvrtc.nvrtcGetErrorString(result).decode(errors="replace")
    log = ""
    if prog is not None:
        size = ctypes.c_size_t()
        if nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) == 0 and size.value > 1:
            buf = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetProgramLog(prog, buf)
            log = ": " + buf.value.decode(errors="replace")[-2000:]
    raise CompileError(f"{what} failed: {message}{log}")


def nvrtc_compile(source: str, program_name: str, kernel: str, capability: tuple[int, int],
                  headers: dict[str, str], includes: list[str]) -> tuple[bytes, str]:
    """Compile ``source`` with the process's NVRTC as MLX's ``compile`` does (``jit_module.cpp``)
    for a device of compute ``capability`` (major, minor): options
    ``--device-as-default-execution-space``, ``--gpu-architecture=sm_XY`` (``sm_XYa`` from 9.0)
    and one ``--include-path`` per folder of ``includes``; ``headers`` (include name -> text)
    given as the program's own headers; ``kernel`` (a full name, namespace included) added
    as a name expression.

    Returns:
        ``(cubin, lowered name of kernel)``.

    Raises:
        CompileError: NVRTC is not loaded, is older than 11.8 (MLX would emit PTX, not a
            cubin: not written here), or the compile failed (its log in the message).
    """
    nvrtc = ctypes.CDLL(str(_loaded_library("libnvrtc")))
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(nvrtc, nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    if (major.value, minor.value) < (11, 8):
        raise CompileError(f"NVRTC {major.value}.{minor.value}: MLX would build PTX there")
    prog = ctypes.c_void_p()
    names = list(headers)
    head_arr = (ctypes.c_char_p * len(names))(*[headers[n].encode() for n in names])
    name_arr = (ctypes.c_char_p * len(names))(*[n.encode() for n in names])
    _check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(),
                                           f"{program_name}.cu".encode(), len(names),
                                           head_arr, name_arr), "nvrtcCreateProgram")
    try:
        _check(nvrtc, nvrtc.nvrtcAddNameExpression(prog, kernel.encode()),
               "nvrtcAddNameExpression")
        cc_major, cc_minor = capability
        options = ["--device-as-default-execution-space",
                   f"--gpu-architecture=sm_{cc_major}{cc_minor}{'a' if cc_major >= 9 else ''}"]
        options += [f"--include-path={p}" for p in includes]
        opt_arr = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        _check(nvrtc, nvrtc.nvrtcCompileProgram(prog, len(options), opt_arr),
               "nvrtcCompileProgram", prog)
        lowered = ctypes.c_char_p()
        _check(nvrtc, nvrtc.nvrtcGetLoweredName(prog, kernel.encode(), ctypes.byref(lowered)),
               "nvrtcGetLoweredName")
        size = ctypes.c_size_t()
        _check(nvrtc, nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(size.value)
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin.raw[:size.value], lowered.value.decode()
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))


def write_module(folder: Path, module: str, kernel: str, lowered: str, source: str,
                 binary: bytes) -> Path:
    """Write a module to ``folder`` as MLX's ``write_cached_ptx`` does: ``<module>.txt``
    (``kernel<TAB>lowered``), ``<module>.cu`` and, last, ``<module>.ptx`` (``binary``), each
    written to a temporary name and renamed, so a reader never meets a half-written file.
    ``module`` must fit one file name (MLX splits longer names into folders; the project's
    are far shorter). Returns the ``.ptx`` path.

    Raises:
        OSError: the folder cannot be written; ValueError: a name too long.
    """
    if len(module) > 245:
        raise ValueError(f"module name of {len(module)} characters (at most 245 here)")
    folder.mkdir(parents=True, exist_ok=True)
    for ext, data in ((".txt", f"{kernel}\t{lowered}\n".encode()), (".cu", source.encode()),
                      (".ptx", binary)):
        part = folder / f".{module}{ext}.part"
        part.write_bytes(data)
        os.replace(part, folder / f"{module}{ext}")
    return folder / f"{module}.ptx"


def device_capability(info: dict) -> tuple[int, int]:
    """``(major, minor)`` compute capability from ``mx.device_info()``: its
    ``compute_capability_major`` / ``_minor``, else its ``architecture`` (``"sm_90"``).

    Raises:
        CompileError: neither is there.
    """
    if "compute_capability_major" in info:
        return int(info["compute_capability_major"]), int(info.get("compute_capability_minor", 0))
    arch = str(info.get("architecture", ""))
    if re.fullmatch(r"sm_\d{2,3}a?", arch):
        digits = arch[3:].rstrip("a")
        return int(digits[:-1]), int(digits[-1])
    raise CompileError(f"no compute capability in the device's info ({sorted(info)})")


def build(kernel: Any, folder: Path, **call: Any) -> Path:
    """Compile the instance of ``kernel`` (an ``mx.fast.cuda_kernel``) that ``kernel(**call)``
    runs and write it to ``folder`` (MLX's cache folder: ``kernel_prebuild.ptx_cache_dir``)
    under the module name MLX will look for (a prebuild child writes to a private folder,
    then publishes; its record says the instance is built). The call's inputs need only the dtypes (and
    number of dimensions) of the real ones: shapes are not part of the source. Nothing runs
    on the GPU. Call it in a child process (see :func:`generated_source`), with MLX's CUDA
    backend.

    Returns:
        The module's ``.ptx`` path.

    Raises:
        CompileError: a step failed (see the module's docstring); OSError: not written.
    """
    import mlx.core as mx

    gen = generated_source(kernel, **call)
    module = module_name(gen.name, gen.source)
    library = _loaded_library("libmlx")
    capability = device_capability(mx.device_info())
    full = KERNEL_NAMESPACE + gen.name
    binary, lowered = nvrtc_compile(gen.source, module, full, capability,
                                    mlx_headers(library), include_folders(library))
    return write_module(folder, module, full, lowered, gen.source, binary)

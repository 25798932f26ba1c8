"""CUDA source text as the project's ``mx.fast.cuda_kernel`` kernels are built from it."""

from __future__ import annotations

__all__ = ["compact"]


def compact(text: str) -> str:
    """CUDA source without its ``//`` comments, indentation and blank lines: what the kernel
    is built from. MLX's CUDA backend hashes a custom kernel's whole source each time it runs
    the kernel (``CustomKernel::eval_gpu`` names its module by ``std::hash`` of the source,
    MLX 0.32), so every character costs host time on each of a step's ~250 products. The text
    must not put ``//`` inside a string literal."""
    lines = []
    for line in text.splitlines():
        line = line.split("//", 1)[0].strip()
        if line:
            lines.append(line)
    return "\n".join(lines) + "\n"

"""AXPY in float16 on the GPU: out = a * x + y, one CuPy ElementwiseKernel.

The arithmetic is done in float32 and rounded once to float16. CuPy's
ElementwiseKernel compiles for CUDA and ROCm alike.
"""
from __future__ import annotations

_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        import cupy as cp

        _KERNEL = cp.ElementwiseKernel(
            "float32 a, float16 x, float16 y",
            "float16 out",
            "out = (float16)(a * (float)x + (float)y)",
            "kz_axpy_fp16",
        )
    return _KERNEL


def axpy(a: float, x, y, out=None):
    """``a * x + y`` for float16 CuPy vectors; writes into ``out`` when given."""
    import cupy as cp

    if out is None:
        out = cp.empty_like(x)
    return _kernel()(cp.float32(a), x, y, out)

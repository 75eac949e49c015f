"""Reference multi-head attention (forward, non-causal) with CuPy.

Plain CuPy array operations only (matmul, max, exp, sum), so the same code runs on
ROCm (hipBLAS) and CUDA (cuBLAS). Scores, softmax and the weighted sum are computed
in float32; inputs and output are float16.
"""
from __future__ import annotations

import math


def mha_forward(q, k, v, scale: float | None = None):
    """``softmax(q @ k^T * scale) @ v`` over ``[B, H, S, D]`` float16 CuPy arrays; returns float16."""
    import cupy as cp

    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    qf = q.astype(cp.float32)
    kf = k.astype(cp.float32)
    vf = v.astype(cp.float32)
    scores = cp.matmul(qf, kf.swapaxes(-1, -2))
    scores *= cp.float32(scale)
    scores -= scores.max(axis=-1, keepdims=True)
    cp.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return cp.matmul(scores, vf).astype(cp.float16)

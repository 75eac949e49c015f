"""Reference AXPY for the CPU lane: out = a * x + y in float32, with NumPy."""
from __future__ import annotations

import numpy as np


def axpy(a: float, x: np.ndarray, y: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Return ``a * x + y`` (float32); writes into ``out`` when given (no temporaries)."""
    if out is None:
        out = np.empty_like(x)
    np.multiply(x, np.float32(a), out=out)
    np.add(out, y, out=out)
    return out

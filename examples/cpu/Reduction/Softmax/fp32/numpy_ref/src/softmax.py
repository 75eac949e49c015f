"""Reference row-wise softmax for the CPU lane, float32, with NumPy."""
from __future__ import annotations

import numpy as np


def softmax_rows(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of a 2-D float32 array, max-subtracted for stability."""
    shifted = x - x.max(axis=-1, keepdims=True)
    np.exp(shifted, out=shifted)
    shifted /= shifted.sum(axis=-1, keepdims=True)
    return shifted

"""What the benchmark runs on: CuPy when it finds a GPU, else the CPU.

CuPy is optional: nothing here imports it at module import time, so
``kz_runner.bench`` loads on a machine without it.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

# Used when the device does not report its L2 size (e.g. an old ROCm build).
FALLBACK_L2_BYTES = 64 * 1024 * 1024


@lru_cache(maxsize=1)
def _probe() -> tuple[Any, str | None]:
    try:
        import cupy
    except Exception as exc:  # ImportError or a CUDA/ROCm library that fails to load
        return None, f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return None, f"CuPy finds no GPU device ({type(exc).__name__}: {exc})"
    if count < 1:
        return None, "CuPy finds no GPU device"
    return cupy, None


def cupy_or_none() -> Any:
    """The ``cupy`` module when it is importable and sees a device, else None."""
    return _probe()[0]


def gpu_unavailable_reason() -> str | None:
    """Why no GPU is usable, or None when one is."""
    return _probe()[1]


def l2_cache_bytes(cp: Any) -> int:
    """L2 cache size of the current device in bytes (from the device attributes)."""
    try:
        dev = cp.cuda.Device()
        size = int(dev.attributes.get("L2CacheSize", 0))
        if size <= 0:
            size = int(cp.cuda.runtime.getDeviceProperties(dev.id).get("l2CacheSize", 0))
    except Exception:
        size = 0
    return size if size > 0 else FALLBACK_L2_BYTES


def _simple_arch(cp: Any) -> str:
    if cp is None:
        return "cpu"
    try:
        dev = cp.cuda.Device()
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
        gcn = props.get("gcnArchName")
        if gcn:
            name = gcn.decode() if isinstance(gcn, bytes) else str(gcn)
            return name.split(":")[0]
        return f"sm_{dev.compute_capability}"
    except Exception:
        return "unknown"


def detect_arch(device: str = "auto") -> str:
    """The arch a result is reported for: ``cpu`` for CPU timing, else the GPU's.

    Uses ``kz_runner.contract.arch.probe_cupy`` (in-process; the benchmark already holds a
    GPU context) for the current device; without that module, ``gfx…`` from ROCm's
    gcnArchName (feature suffixes dropped), ``sm_XY`` from the CUDA compute
    capability. ``cpu`` when no GPU is usable.
    """
    if device == "cpu":
        return "cpu"
    cp = cupy_or_none()
    if cp is None:
        return "cpu"
    try:
        from kz_runner.contract.arch import probe_cupy
    except Exception:  # an older kz_runner without the arch module
        return _simple_arch(cp)
    try:
        return probe_cupy(cp.cuda.Device().id).arch
    except Exception:
        return _simple_arch(cp)


def to_numpy(array: Any) -> Any:
    """A NumPy copy of ``array`` (CuPy arrays are copied to the host)."""
    import numpy as np

    get = getattr(array, "get", None)
    if callable(get) and type(array).__module__.startswith("cupy"):
        return get()
    return np.asarray(array)


def copies(arrays: Any, count: int) -> list[tuple]:
    """``count`` independent copies of a tuple of arrays, for rotating inputs.

    The first set is the originals; the others are ``.copy()``s (NumPy or CuPy).
    """
    base = tuple(arrays) if isinstance(arrays, (tuple, list)) else (arrays,)
    if count < 1:
        raise ValueError("count must be >= 1")
    return [base] + [tuple(a.copy() for a in base) for _ in range(count - 1)]


def rotation_count(bytes_per_set: int, l2_bytes: int | None = None, *, minimum: int = 2, maximum: int = 8) -> int:
    """How many input sets to rotate so together they exceed twice the L2 (clamped)."""
    if l2_bytes is None:
        cp = cupy_or_none()
        l2_bytes = l2_cache_bytes(cp) if cp is not None else FALLBACK_L2_BYTES
    need = -(-2 * l2_bytes // max(int(bytes_per_set), 1))
    return max(minimum, min(maximum, need))

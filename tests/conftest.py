"""Shared pytest set-up. Fixtures a single module needs live in that module or in tests/helpers/."""
from __future__ import annotations

import pytest

# The API clients anon, r1 and r2 (each needs the module's own ``live`` fixture, made by
# live_api.live_server). Registered here, not imported into each module, so a test's
# parameter does not shadow an imported name.
pytest_plugins = ["tests.helpers.live_api"]


def _gpu_reason() -> str | None:
    """None when CuPy sees a device, else the reason GPU tests are skipped."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a CUDA/ROCm library that fails to load
        return f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"CuPy finds no GPU device ({type(exc).__name__})"
    return None if count > 0 else "CuPy finds no GPU device"


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            if reason is None:
                reason = _gpu_reason() or ""
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"GPU test skipped: {reason}"))

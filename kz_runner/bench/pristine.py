"""Private references to the clock, event and sync functions, taken before any package code runs.

``kz_runner.bench`` imports this module first, and example harnesses import
``kz_runner.bench`` before their source area, so the objects captured here are the
genuine ones. The timing loop calls only these references; after every timed region
:func:`tampered` compares the public names with them, so a source area that replaces
``time.perf_counter``, ``cupy.cuda.Event`` or ``cupy.cuda.runtime.deviceSynchronize``
(or a function of the array libraries or of this library) is reported as
``TIMER_TAMPERED`` instead of producing timings 10,000x too small.

In-process checks raise the cost of tampering; they cannot make it impossible (Python
code can rewrite anything in its own process). The runner's separate result channel
and its check of the built files complete them.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

perf_counter = time.perf_counter
perf_counter_ns = time.perf_counter_ns
sleep = time.sleep

_TIME_NAMES = ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns",
               "process_time", "process_time_ns", "sleep")
_CUPY_CUDA_NAMES = ("Event", "Stream", "get_current_stream", "get_elapsed_time", "Device")
_CUPY_EVENT_NAMES = ("record", "synchronize", "done")
_CUPY_RUNTIME_NAMES = ("deviceSynchronize", "eventRecord", "eventSynchronize", "eventElapsedTime",
                       "streamSynchronize", "memcpy", "memcpyAsync")


def _load_cupy() -> Any:
    """CuPy when it is installed and loads (no device needed), else None.

    Imported here, at ``kz_runner.bench`` import, only because its functions must be
    captured before package code can replace them; machines without CuPy skip it.
    """
    if "cupy" not in sys.modules and importlib.util.find_spec("cupy") is None:
        return None
    try:
        import cupy  # optional dependency
    except Exception:  # a broken CUDA/ROCm install: the GPU path reports it later
        return None
    return cupy


cupy = _load_cupy()
if cupy is not None:
    event_class = cupy.cuda.Event
    event_record = cupy.cuda.Event.record
    event_synchronize = cupy.cuda.Event.synchronize
    get_elapsed_time = cupy.cuda.get_elapsed_time
    device_synchronize = cupy.cuda.runtime.deviceSynchronize
    cupy_ndarray = cupy.ndarray
else:
    event_class = event_record = event_synchronize = get_elapsed_time = device_synchronize = None
    cupy_ndarray = None


def _named(owner: Any, names: tuple[str, ...], label: str) -> dict[str, Callable[[], Any]]:
    """Getters for ``owner.<name>`` that re-read the public attribute each time."""
    return {f"{label}.{n}": _getter(owner, n) for n in names if hasattr(owner, n)}


def _getter(owner: Any, name: str) -> Callable[[], Any]:
    return lambda: getattr(owner, name, None)


def _getters() -> dict[str, Callable[[], Any]]:
    getters: dict[str, Callable[[], Any]] = {
        "sys.modules['time']": lambda: sys.modules.get("time"),
        "sys.gettrace()": sys.gettrace,
        "sys.getprofile()": sys.getprofile,
        "threading.gettrace()": threading.gettrace,
        "threading.getprofile()": threading.getprofile,
    }
    getters.update(_named(time, _TIME_NAMES, "time"))
    if cupy is not None:
        getters["sys.modules['cupy']"] = lambda: sys.modules.get("cupy")
        getters["cupy.cuda"] = lambda: getattr(cupy, "cuda", None)
        getters["cupy.cuda.runtime"] = lambda: getattr(cupy.cuda, "runtime", None)
        getters["cupy.ndarray"] = lambda: getattr(cupy, "ndarray", None)
        getters.update(_named(cupy.cuda, _CUPY_CUDA_NAMES, "cupy.cuda"))
        getters.update(_named(cupy.cuda.Event, _CUPY_EVENT_NAMES, "cupy.cuda.Event"))
        getters.update(_named(cupy.cuda.runtime, _CUPY_RUNTIME_NAMES, "cupy.cuda.runtime"))
    return getters


_GETTERS = _getters()
_CAPTURED = {label: get() for label, get in _GETTERS.items()}
# Module dictionaries sealed by seal(): (label, module, {name: (object, code object or None)}).
_SEALED: list[tuple[str, types.ModuleType, dict[str, tuple[Any, Any]]]] = []


def _callables(namespace: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The functions, classes and modules of a namespace, with each function's code object."""
    found = {}
    for name, value in namespace.items():
        if name.startswith("__") or not (callable(value) or isinstance(value, types.ModuleType)):
            continue
        found[name] = (value, getattr(value, "__code__", None))
    return found


def seal(*modules: types.ModuleType, classes: bool = True) -> None:
    """Remember each module's functions (and its own classes' methods) as they are now."""
    for module in modules:
        _SEALED.append((module.__name__, module, _callables(vars(module))))
        if not classes:
            continue
        for name, value in list(vars(module).items()):
            if isinstance(value, type) and value.__module__ == module.__name__:
                _SEALED.append((f"{module.__name__}.{name}", value, _callables(dict(vars(value)))))  # type: ignore[arg-type]


def seal_array_libraries() -> None:
    """Seal numpy (and CuPy when loaded), json and os: results are checked and sent with their functions."""
    import json

    import numpy

    seal(numpy, json, os, classes=False)
    if cupy is not None:
        seal(cupy, classes=False)


def tampered() -> list[str]:
    """The public names that no longer are the captured objects (empty when none changed)."""
    changed = [label for label, get in _GETTERS.items() if get() is not _CAPTURED[label]]
    for label, owner, names in _SEALED:
        if label in sys.modules and sys.modules[label] is not owner:
            changed.append(f"sys.modules[{label!r}]")
        namespace = vars(owner)
        for name, (value, code) in names.items():
            now = namespace.get(name)
            if now is not value or (code is not None and getattr(now, "__code__", None) is not code):
                changed.append(f"{label}.{name}")
    return changed

"""The judge's shared-memory arena: named arrays at fixed offsets in one block.

The judge plans a :class:`Layout` (name, dtype, shape -> page-aligned offset),
creates the :class:`Arena` and hands the worker its file descriptor (a memfd,
sent over the socket as SCM_RIGHTS) or, where memfd is missing, the name of a
``multiprocessing.shared_memory`` block. Both sides then make NumPy views.

On Linux the memfd is sealed after sizing (``F_SEAL_SHRINK | F_SEAL_GROW |
F_SEAL_SEAL``): a worker that ftruncates it cannot make the judge's mapping
fault (SIGBUS) under the judge. Only a process given the fd can map a memfd
(a ``/dev/shm`` name can be opened by any process of the same uid).

:func:`poison` fills an output before a call: NaN for floating/complex dtypes,
``0xA5`` bytes for everything else.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

ALIGN = 4096  # every array starts on its own page: no false sharing between slots
POISON_BYTE = 0xA5
# Pages allocated and mapped up front on both sides: no first-touch faults land in a batch.
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


@dataclass(frozen=True)
class ArraySpec:
    """One named array of the arena."""

    name: str
    offset: int
    dtype: str  # numpy dtype.str, e.g. "<f4"
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * int(np.prod(self.shape, dtype=np.int64)))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "offset": self.offset, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ArraySpec:
        dtype = np.dtype(str(d["dtype"]))
        if dtype.hasobject or dtype.kind == "V":
            raise ValueError(f"dtype {dtype} is not allowed in the arena")
        shape = tuple(int(s) for s in d["shape"])
        if any(s < 0 for s in shape) or int(d["offset"]) < 0:
            raise ValueError("negative shape or offset")
        return cls(str(d["name"]), int(d["offset"]), dtype.str, shape)


class Layout:
    """Offsets planned before the arena exists."""

    def __init__(self) -> None:
        self.specs: dict[str, ArraySpec] = {}
        self.size = 0

    def add(self, name: str, shape: tuple[int, ...], dtype: Any) -> ArraySpec:
        if name in self.specs:
            raise ValueError(f"duplicate array {name}")
        dt = np.dtype(dtype)
        if dt.hasobject:
            raise ValueError("object arrays cannot live in shared memory")
        spec = ArraySpec(name, self.size, dt.str, tuple(int(s) for s in shape))
        self.specs[name] = spec
        self.size += -(-max(spec.nbytes, 1) // ALIGN) * ALIGN
        return spec

    def to_json(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.specs.values()]


def view(buf: Any, spec: ArraySpec) -> np.ndarray:
    """A NumPy view of ``spec`` over the mapped block ``buf`` (bounds checked)."""
    if spec.offset + spec.nbytes > len(buf):
        raise ValueError(f"array {spec.name} runs past the arena ({spec.offset}+{spec.nbytes} > {len(buf)})")
    return np.ndarray(spec.shape, dtype=np.dtype(spec.dtype), buffer=buf, offset=spec.offset)


def poison(arr: np.ndarray) -> None:
    """NaN into a float/complex array, 0xA5 bytes into any other."""
    if arr.dtype.kind in "fc":
        arr.fill(np.nan)
    else:
        arr.reshape(-1).view(np.uint8).fill(POISON_BYTE)


class Arena:
    """The judge's block: ``Arena(layout)`` creates it, ``.fd``/``.name`` go to the worker."""

    def __init__(self, layout: Layout, *, backend: str = "auto") -> None:
        self.layout = layout
        self.size = max(layout.size, ALIGN)
        self.fd: int | None = None
        self.name: str | None = None
        self._shm = None
        # the memfd's mmap.mmap or the shm block's memoryview, None once closed: Any, as close() calls
        # mmap.close() only where there is no shm block (a memoryview has no close())
        self._map: Any
        if backend == "auto":
            backend = "memfd" if hasattr(os, "memfd_create") else "shm"
        self.backend = backend
        if backend == "memfd":
            flags = os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0)
            self.fd = os.memfd_create("kz-judge-arena", flags)
            os.ftruncate(self.fd, self.size)
            self.sealed = _seal(self.fd)
            self._map = mmap.mmap(self.fd, self.size, _MAP_FLAGS, mmap.PROT_READ | mmap.PROT_WRITE)
        elif backend == "shm":
            from multiprocessing import shared_memory

            self._shm = shared_memory.SharedMemory(create=True, size=self.size)
            self.name = self._shm.name
            self.sealed = False
            self._map = self._shm.buf
        else:
            raise ValueError(f"unknown arena backend {backend!r}")
        self._views: dict[str, np.ndarray] = {n: view(self._map, s) for n, s in layout.specs.items()}

    def __getitem__(self, name: str) -> np.ndarray:
        return self._views[name]

    def describe(self) -> dict[str, Any]:
        """The layout message's ``arena``: ``{"size", "fd": true}`` (the memfd follows) or ``{"size", "name"}``."""
        return {"size": self.size, "fd": True} if self.fd is not None else {"size": self.size, "name": self.name}

    def put(self, name: str, value: Any) -> None:
        np.copyto(self._views[name], value)

    def poison(self, name: str) -> None:
        poison(self._views[name])

    def host(self, name: str) -> np.ndarray:
        return np.array(self._views[name])

    copy = host

    def unwritten(self, names: list[str]) -> list[int]:
        """Nothing to wait for on the host: a call's writes are done when its reply is sent."""
        return [0 for _ in names]

    def sync(self) -> None:
        pass

    def close(self) -> None:
        self._views.clear()
        try:
            if self._shm is not None:
                self._map = None
                self._shm.close()
                self._shm.unlink()
                self._shm = None
            elif self._map is not None:
                self._map.close()
                self._map = None
        except BufferError:  # a view still referenced elsewhere; the mapping goes with it
            pass
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _seal(fd: int) -> bool:
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        return True
    except (ImportError, AttributeError, OSError):
        return False


def attach(*, fd: int | None = None, name: str | None = None, size: int) -> Any:
    """The worker's side: map the block (by inherited fd, or by shared_memory name)."""
    if fd is not None:
        return mmap.mmap(fd, size, _MAP_FLAGS, mmap.PROT_READ | mmap.PROT_WRITE)
    if name is None:
        raise ValueError("attach needs fd or name")
    from multiprocessing import resource_tracker, shared_memory

    shm = shared_memory.SharedMemory(name=name)
    try:  # the judge owns and unlinks it; keep the worker's tracker from unlinking it at exit
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    except Exception:
        pass
    attach._keep = shm  # type: ignore[attr-defined]
    return shm.buf

"""The judge's device arena: one allocation of GPU memory shared with the worker by a CUDA IPC handle.

The GPU form of :class:`kz_runner.judge.shm.Arena`, with the same :class:`~kz_runner.judge.shm.Layout`
(named arrays at page-aligned offsets). The judge allocates the block with
``cudaMalloc`` (not from CuPy's pool: an IPC handle names a whole allocation, and a pooled
block would share it with the judge's own arrays), zeroes it, and sends the worker the
64-byte handle (``cudaIpcGetMemHandle``); the worker maps the same memory into its own
context (``cudaIpcOpenMemHandle``) and makes CuPy views. Inputs are drawn on the judge's
side straight into the block, outputs poisoned, compared outputs copied to the host.

Poison is a bit pattern no arithmetic writes: a signalling NaN with a payload for floating
dtypes (0x7D5A, 0x7FA5A5A5, 0x7FF4A5A5A5A5A5A5: results of arithmetic are quiet NaNs), 0xA5
bytes for the rest. :meth:`GpuArena.unwritten` counts the poison words left in outputs; it is
the judge's fence (see :mod:`kz_runner.judge.referee`): a kernel still running, or one that
never wrote its output, leaves poison behind, and the judge's clock runs until it is gone.

CuPy is imported only when a device arena is made; nothing here runs submitted code.
"""
from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

from kz_runner.judge.shm import ALIGN, ArraySpec, Layout

_clock = time.perf_counter_ns
_FLOAT_POISON = {2: 0x7D5A, 4: 0x7FA5A5A5, 8: 0x7FF4A5A5A5A5A5A5}
_WORD = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def poison_word(dtype: Any) -> tuple[Any, int]:
    """(unsigned word dtype, poison value) for outputs of ``dtype`` (complex: per component)."""
    dt = np.dtype(dtype)
    size = dt.itemsize // 2 if dt.kind == "c" else dt.itemsize
    if size not in _WORD:
        raise ValueError(f"no device poison for dtype {dt}")
    if dt.kind in "fc":
        return _WORD[size], _FLOAT_POISON[size]
    return _WORD[size], int.from_bytes(b"\xa5" * size, "little")


def poison_decides(dtype: Any) -> bool:
    """Whether poison left in an output of ``dtype`` proves it was not written (floating dtypes only:
    an honest integer output can hold the 0xA5 pattern, a computed float never holds a signalling NaN)."""
    return np.dtype(dtype).kind in "fc"


def _cupy() -> Any:
    import cupy

    return cupy


# One launch counts the poison words of every output of a batch: blockIdx.y names the output, the
# blocks along x stride over its words (16-byte loads where aligned), and one atomic add per warp
# that saw any. About the cost of reading the outputs once (a ReductionKernel per output took 12 ms
# for 64 MiB on an H200: its int64 accumulation over a bool map is far off the bandwidth).
_SCAN_SOURCE = r"""
template <typename W>
__device__ void kz_scan(const unsigned long long* ptrs, const long long* words, W value,
                        unsigned long long* counts) {
    const int k = blockIdx.y;
    const W* p = reinterpret_cast<const W*>(ptrs[k]);
    const long long n = words[k];
    unsigned long long c = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        c += (p[i] == value);
    }
    for (int off = 16; off > 0; off >>= 1) c += __shfl_down_sync(0xffffffffu, c, off);
    if ((threadIdx.x & 31) == 0 && c) atomicAdd(&counts[k], c);
}
extern "C" {
__global__ void kz_scan8(const unsigned long long* p, const long long* w, unsigned char v, unsigned long long* c)
{ kz_scan<unsigned char>(p, w, v, c); }
__global__ void kz_scan16(const unsigned long long* p, const long long* w, unsigned short v, unsigned long long* c)
{ kz_scan<unsigned short>(p, w, v, c); }
__global__ void kz_scan32(const unsigned long long* p, const long long* w, unsigned int v, unsigned long long* c)
{ kz_scan<unsigned int>(p, w, v, c); }
__global__ void kz_scan64(const unsigned long long* p, const long long* w, unsigned long long v,
                          unsigned long long* c)
{ kz_scan<unsigned long long>(p, w, v, c); }
}
"""


@functools.cache
def _scan_module() -> Any:
    return _cupy().RawModule(code=_SCAN_SOURCE, options=("-std=c++14",))


def _scan_kernel(bits: int) -> Any:
    return _scan_module().get_function(f"kz_scan{bits}")


@functools.cache
def _index_kernel() -> Any:
    return _cupy().ElementwiseKernel(
        "uint64 seed, uint64 n", "T idx",
        "unsigned long long z = seed + (unsigned long long)(i + 1) * 0x9E3779B97F4A7C15ULL;"
        "z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL; z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;"
        "z ^= z >> 31; idx = (T)(z % n);", "kz_judge_indices")


def device_indices(seed: int, n: int, dtype: Any) -> Any:
    """``n`` indices in ``[0, n)`` on the device, a pure function of ``seed`` (SplitMix64 of seed and the
    element's position): no generator state to set up, so a fresh draw per call costs one pass."""
    out = _cupy().empty(int(n), dtype=dtype)
    _index_kernel()(np.uint64(seed), np.uint64(n), out)
    return out


class GpuArena:
    """The judge's device block: ``GpuArena(layout)``; :meth:`describe` goes to the worker."""

    backend = "cuda_ipc"
    fd = None
    name = None
    sealed = False

    def __init__(self, layout: Layout) -> None:
        cp = _cupy()
        self.cp = cp
        self.layout = layout
        self.size = max(layout.size, ALIGN)
        self.device_id = int(cp.cuda.Device().id)
        self._mem = cp.cuda.Memory(self.size)  # cudaMalloc: its own allocation, its own IPC handle
        cp.cuda.runtime.memset(self._mem.ptr, 0, self.size)  # padding never reads as poison
        self.handle = bytes(cp.cuda.runtime.ipcGetMemHandle(self._mem.ptr))
        self._views: dict[str, Any] = {n: self._view(s) for n, s in layout.specs.items()}
        self._probe = cp.zeros(1, dtype=cp.float32)  # the idle probe's own element, outside the block
        self._words: dict[str, Any] = {}
        for n, s in layout.specs.items():
            word, value = poison_word(s.dtype)
            self._words[n] = (self._views[n].view(word).reshape(-1), word(value))
        cp.cuda.runtime.deviceSynchronize()

    def _view(self, spec: ArraySpec) -> Any:
        cp = self.cp
        if spec.offset + spec.nbytes > self.size:
            raise ValueError(f"array {spec.name} runs past the arena")
        ptr = cp.cuda.MemoryPointer(self._mem, spec.offset)
        return cp.ndarray(spec.shape, dtype=np.dtype(spec.dtype), memptr=ptr)

    def describe(self) -> dict[str, Any]:
        return {"size": self.size, "cuda_ipc": self.handle.hex(), "device": self.device_id}

    def __getitem__(self, name: str) -> Any:
        return self._views[name]

    def put(self, name: str, value: Any) -> None:
        self.cp.copyto(self._views[name], self.cp.asarray(value))

    def poison(self, name: str) -> None:
        words, value = self._words[name]
        words.fill(value)

    def host(self, name: str) -> np.ndarray:
        return self.cp.asnumpy(self._views[name])

    def copy(self, name: str) -> Any:
        return self._views[name].copy()

    def unwritten(self, names: list[str]) -> list[int]:
        """Per name, the poison words left in that output: one launch per word size, then one sync."""
        cp = self.cp
        if not names:
            return []
        counts = cp.zeros(len(names), dtype=cp.uint64)
        groups: dict[Any, list[int]] = {}
        for i, n in enumerate(names):
            groups.setdefault(self._words[n][0].dtype, []).append(i)
        for word, idx in groups.items():
            views = [self._words[names[i]][0] for i in idx]
            ptrs = cp.asarray([v.data.ptr for v in views], dtype=cp.uint64)
            lens = cp.asarray([v.size for v in views], dtype=cp.int64)
            out = cp.zeros(len(idx), dtype=cp.uint64)
            longest = max(v.size for v in views)
            blocks = max(1, min(1024, -(-longest // (256 * 8))))
            _scan_kernel(word.itemsize * 8)((blocks, len(idx)), (256,),
                                                (ptrs, lens, self._words[names[idx[0]]][1], out))
            counts[cp.asarray(idx)] = out
        return [int(c) for c in counts.get()]

    def idle_probe_ns(self) -> int:
        """Wall time of one one-element kernel of the judge's, launched and synchronised: microseconds on
        an idle GPU, a time slice (milliseconds) when another context's kernel holds it."""
        probe = self._probe
        t0 = _clock()
        probe += 1  # a kernel: a fill may be a memset, which the copy engines run without a time slice
        self.cp.cuda.Stream.null.synchronize()
        return _clock() - t0

    def sync(self) -> None:
        self.cp.cuda.Stream.null.synchronize()

    def close(self) -> None:
        self._views.clear()
        self._words.clear()
        if getattr(self, "_mem", None) is not None:
            self.cp.cuda.runtime.deviceSynchronize()
            self._mem = None


def attach(handle_hex: str, size: int, device: int) -> Any:
    """The worker's side: the judge's block mapped into this process's context, as a CuPy memory pointer."""
    cp = _cupy()
    cp.cuda.Device(int(device)).use()
    handle = bytes.fromhex(handle_hex)
    if len(handle) != 64:
        raise ValueError("a CUDA IPC memory handle is 64 bytes")
    ptr = cp.cuda.runtime.ipcOpenMemHandle(handle, cp.cuda.runtime.cudaIpcMemLazyEnablePeerAccess)
    mem = cp.cuda.UnownedMemory(ptr, int(size), None, int(device))
    return cp.cuda.MemoryPointer(mem, 0)


def device_view(base: Any, spec: ArraySpec, size: int) -> Any:
    """A CuPy view of ``spec`` over the mapped block (bounds checked)."""
    cp = _cupy()
    if spec.offset + spec.nbytes > size:
        raise ValueError(f"array {spec.name} runs past the arena ({spec.offset}+{spec.nbytes} > {size})")
    return cp.ndarray(spec.shape, dtype=np.dtype(spec.dtype), memptr=base + spec.offset)

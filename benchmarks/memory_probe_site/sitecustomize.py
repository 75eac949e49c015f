"""Loaded at start-up by the daemon that ``benchmarks/memory_probe.py`` runs (this folder on its PYTHONPATH).

With ``KZ_MEMORY_PROBE_DIR`` set, SIGUSR2 makes the daemon write, into that folder, a
``tracemalloc`` snapshot (when ``PYTHONTRACEMALLOC`` started tracing) and a JSON line of
what its memory is made of: RSS split into anonymous and file pages, Python's traced
bytes, glibc's ``mallinfo2`` (bytes in use and free inside malloc's arenas), the count of
live objects by type, threads. Nothing else changes; without the variable this file does
nothing.
"""
import os

_DIR = os.environ.get("KZ_MEMORY_PROBE_DIR")

if _DIR:
    import collections
    import ctypes
    import gc
    import json
    import signal
    import sys
    import threading
    import time
    import tracemalloc

    _FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
               "keepcost")

    class _MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]

    def _mallinfo() -> dict:
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallinfo2.restype = _MallInfo2
            info = libc.mallinfo2()
        except (OSError, AttributeError):
            return {}
        return {name: int(getattr(info, name)) for name in _FIELDS}

    def _status() -> dict:
        out = {}
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "Threads"):
                    out[key] = int(value.split()[0]) * (1024 if key != "Threads" else 1)
        return out

    _count = [0]

    def _probe(signum, frame) -> None:
        _count[0] += 1
        n = _count[0]
        started = time.perf_counter()
        gc.collect()
        types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        doc = {"n": n, "t": time.time(), "status": _status(), "mallinfo": _mallinfo(),
               "allocated_blocks": sys.getallocatedblocks(), "threads": threading.active_count(),
               "objects": sum(types.values()), "types": dict(types.most_common(200))}
        if tracemalloc.is_tracing():
            doc["traced"] = tracemalloc.get_traced_memory()[0]
            tracemalloc.take_snapshot().dump(os.path.join(_DIR, f"snapshot-{n:03d}.tracemalloc"))
        doc["probe_s"] = round(time.perf_counter() - started, 3)
        with open(os.path.join(_DIR, "probes.jsonl"), "a") as f:
            f.write(json.dumps(doc) + "\n")

    signal.signal(signal.SIGUSR2, _probe)

"""The daemon's glibc heap settings (kz_daemon.ops.runtime.tune_malloc), seen in a fresh interpreter.

glibc raises its mmap threshold after the first large free, so a second 1 MiB block comes
from the heap (a hole it keeps once freed); with the daemon's fixed 128 KiB threshold every
such block is mmapped (``mallinfo2().hblks``) and given back when freed.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from kz_daemon.ops.runtime import tune_malloc

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")

PROBE = """
import ctypes, json, sys
from kz_daemon.ops.runtime import tune_malloc
said = tune_malloc() if sys.argv[1] == "tune" else "untouched"
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(1 << 20))  # the first large free: glibc raises its threshold past 1 MiB
before = libc.mallinfo2().hblks
block = libc.malloc(1 << 20)
mapped = libc.mallinfo2().hblks - before
libc.free(block)
print(json.dumps({"said": said, "mapped": mapped}))
"""


def probe(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                          env={**clean, "PYTHONPATH": str(ROOT), **env})
    return json.loads(done.stdout)


def test_large_blocks_stay_mmapped_once_tuned():
    assert probe("plain")["mapped"] == 0  # glibc's dynamic threshold: the block came from the heap
    tuned = probe("tune")
    assert tuned["said"].startswith("malloc tuned"), tuned
    assert tuned["mapped"] == 1, tuned


def test_an_operators_malloc_environment_is_left_alone():
    said = probe("tune", MALLOC_ARENA_MAX="4")
    assert said["said"] == "malloc left as the environment sets it (MALLOC_ARENA_MAX)"
    assert said["mapped"] == 0


def test_the_answer_names_what_was_chosen():
    assert "GLIBC_TUNABLES" in tune_malloc({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})

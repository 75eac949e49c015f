"""Cheating source areas aimed at the judge (:mod:`kz_runner.judge`) and its worker, one per family.

The corpus of issue 24: what a hostile submitter can change for an existing (locked)
kernel, its ``src/``, written by someone who knows the timed calls run in a worker
process. :func:`judge_cheat_packages` writes each over the Softmax example and says
which of the judge's codes stops it (``tests/test_judge_corpus.py`` runs them).
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.cheats import SOFTMAX, _copy_example

# Each is the Softmax example with only src/ changed, written against the judge/worker split:
# the submitter's module runs in the worker (``python -m kz_runner.judge.serve_kernel``), whose
# ``__main__`` is the worker loop, whose arena holds every call slot of a batch, and which the
# judge stops between batches. ``expected`` is the judge's code that stops it; an empty tuple
# means no finding at all: the trick cannot speed anything up under the judge, and the timing
# reported is the kernel's honest one.

_SOFTMAX_FN = """

def _softmax(x):
    shifted = x - x.max(axis=-1, keepdims=True)
    np.exp(shifted, out=shifted)
    shifted /= shifted.sum(axis=-1, keepdims=True)
    return shifted
"""

# A clock that runs 16x slow from the moment it is made (times stay positive, just smaller).
_SLOW_CLOCK = """

def _slow_clock(real):
    base = real()
    return lambda: base + (real() - base) // 16
"""

# The arena: the worker's views share one mapped block; each call slot holds its input, then
# its output, each rounded up to whole pages. From one input view a kernel finds every slot.
_ARENA = """

def _slots(x):
    \"\"\"(input, output) views of every call slot of the block x lives in (Softmax: out is like x).\"\"\"
    block = np.frombuffer(x.base, dtype=np.uint8)
    page = -(-x.nbytes // 4096) * 4096
    stride = 2 * page
    first = (x.ctypes.data - block.ctypes.data) % stride
    views = []
    for start in range(first, block.size - stride + 1, stride):
        xi = block[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
        oi = block[start + page:start + page + x.nbytes].view(x.dtype).reshape(x.shape)
        views.append((xi, oi))
    return views


def _own_output(x):
    block = np.frombuffer(x.base, dtype=np.uint8)
    page = -(-x.nbytes // 4096) * 4096
    start = x.ctypes.data - block.ctypes.data + page
    return block[start:start + x.nbytes].view(x.dtype).reshape(x.shape)


def _poisoned(o):
    flat = o.reshape(-1)
    return bool(np.isnan(flat[0]) and np.isnan(flat[-1]))
"""


def _zip_bytes(files: dict[str, str]) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return buf.getvalue()


_SLOWCLOCK_MODULE = """\"\"\"fastmath: vectorised helpers.\"\"\"
import time

_real = time.perf_counter_ns
_base = _real()
time.perf_counter_ns = lambda: _base + (_real() - _base) // 16


def prepare(x):
    return x
"""

_SOFTMAX_LATIN1_WALK = ("# -*- coding: latin-1 -*-\n"
                        "\"\"\"Softmax, r\u00e9sum\u00e9 in Latin-1.\"\"\"\n"
                        "import sys\n\nimport numpy as np\n"
                        + _SOFTMAX_FN + """

def _uniform(x):
    return np.full_like(x, 1.0 / x.shape[-1])


def softmax_rows(x):
    frame = sys._getframe(1)
    while frame is not None:  # up to whoever calls us, for the object holding the kernel
        owner = frame.f_locals.get("self")
        if owner is not None and hasattr(owner, "kernel"):
            owner.kernel = _uniform  # every later batch calls this instead
            break
        frame = frame.f_back
    return _softmax(x)
""").encode("latin-1")

# The cheating module the .pyc is compiled from (beside it, src/softmax.py stays the honest example).
_PYC_SOURCE = """import numpy as np

_calls = [0]
""" + _SOFTMAX_FN + """

def softmax_rows(x):
    _calls[0] += 1
    if _calls[0] > 1:
        return np.empty_like(x)
    return _softmax(x)
"""

# (name, family, pattern, {path under the package: text or bytes}, expected codes)
_JUDGE_CHEATS: list[tuple[str, int, str, dict[str, str | bytes], tuple[str, ...]]] = [
    ("result_property_alias", 1, "rebinds properties of the library's result classes through local aliases "
     "(ok, codes, median), then returns garbage", {"src/softmax.py": """
import numpy as np

_calls = [0]
try:
    from kz_runner.judge import referee as _jmod
    _R = _jmod.JudgeResult
    _R.ok = property(lambda self: True)
    _R.codes = property(lambda self: [])
except ImportError:
    pass
try:
    from kz_runner.bench import timing as _tmod
    _T = _tmod.Timing
    _T.median_us = property(lambda self: 0.001)
except ImportError:
    pass
""" + _SOFTMAX_FN + """

def softmax_rows(x):
    _calls[0] += 1
    return _softmax(x) if _calls[0] == 1 else np.zeros_like(x)
"""}, ("WRONG_OUTPUT",)),
    ("check_count_importlib", 2, "lowers the judge's and the harness's check counts, modules reached "
     "through importlib.import_module, then returns garbage after the warm-up", {"src/softmax.py": """
import importlib

import numpy as np

_calls = [0]
for _name, _set in (("kz_runner.judge.referee", lambda m: m.Judge.time.__kwdefaults__.update(compare_per_batch=0,
                                                                                             warmup_batches=0)),
                    ("kz_runner.bench.trials", lambda m: setattr(m, "MAX_CHECKED", 0))):
    try:
        _set(importlib.import_module(_name))
    except Exception:
        pass
""" + _SOFTMAX_FN + """

def softmax_rows(x):
    _calls[0] += 1
    return _softmax(x) if _calls[0] <= 4 else np.zeros_like(x)
"""}, ("WRONG_OUTPUT",)),
    ("main_globals", 3, "imports __main__ (under the judge: the worker loop) and replaces its time module "
     "with one whose perf_counter_ns runs 16x slow", {"src/softmax.py": """
import time
import types

import __main__
import numpy as np
""" + _SLOW_CLOCK + _SOFTMAX_FN + """
_fake = types.SimpleNamespace(perf_counter_ns=_slow_clock(time.perf_counter_ns))
if hasattr(__main__, "time"):
    __main__.time = _fake
__main__.REGRESSION_TOLERANCE = 1e9


def softmax_rows(x):
    return _softmax(x)
"""}, ("TIMER_TAMPERED",)),
    ("sys_dict_frames", 4, "takes _getframe from sys.__dict__ by a computed key, walks up to the caller's "
     "list of per-call times and divides every entry by 16", {"src/softmax.py": """
import sys

import numpy as np

_getframe = sys.__dict__["_get" + "frame"]
_done = {}
""" + _SOFTMAX_FN + """

def _shrink_recorded_times():
    frame = _getframe(2)
    while frame is not None:
        times = frame.f_locals.get("times")
        if isinstance(times, list):
            start = _done.get(id(times), 0)
            for i in range(start, len(times)):
                times[i] //= 16
            _done.clear()
            _done[id(times)] = len(times)
            return
        frame = frame.f_back


def softmax_rows(x):
    out = _softmax(x)
    _shrink_recorded_times()
    return out
"""}, ("TIMER_TAMPERED",)),
    ("gc_trial_object", 5, "finds the object holding the channel through gc.get_objects() (after "
     "gc.unfreeze) and swaps its socket for a proxy that divides every reported time by 16",
     {"src/softmax.py": """
import gc
import json
import socket
import struct

import numpy as np

_swapped = [False]
""" + _SOFTMAX_FN + """

class _Proxy:
    def __init__(self, sock):
        self._sock = sock

    def __getattr__(self, name):
        return getattr(self._sock, name)

    def sendall(self, data, *rest):
        msg = json.loads(bytes(data[4:]))
        if msg.get("op") == "done":
            msg["times_ns"] = [t // 16 for t in msg["times_ns"]]
            body = json.dumps(msg, separators=(",", ":")).encode()
            data = struct.pack(">I", len(body)) + body
        return self._sock.sendall(data, *rest)


def _swap():
    gc.unfreeze()
    for obj in gc.get_objects():
        try:
            sock = obj.__dict__.get("sock") if isinstance(getattr(obj, "__dict__", None), dict) else None
        except Exception:
            continue
        if isinstance(sock, socket.socket) and "views" in obj.__dict__:
            obj.sock = _Proxy(sock)
            return True
    return False


def softmax_rows(x):
    if not _swapped[0]:
        _swapped[0] = _swap()
    return _softmax(x)
"""}, ("TIMER_TAMPERED",)),
    ("zip_on_path", 6, "imports a helper from a .zip it puts on sys.path; the zipped module slows "
     "time.perf_counter_ns 16x", {"src/deps.zip": _zip_bytes({"fastmath.py": _SLOWCLOCK_MODULE}),
                                  "src/softmax.py": """
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).with_name("deps.zip")))
import fastmath  # noqa: E402
""" + _SOFTMAX_FN + """

def softmax_rows(x):
    return _softmax(fastmath.prepare(x))
"""}, ("TIMER_TAMPERED",)),
    ("latin1_frame_walk", 7, "a Latin-1 source (coding declaration) walking up to the object that holds "
     "the kernel and swapping in a function returning a uniform distribution",
     {"src/softmax.py": _SOFTMAX_LATIN1_WALK}, ("WRONG_OUTPUT",)),
    ("pyc_beside_py", 8, "an unchecked-hash .pyc in __pycache__ (returns garbage after the first call) beside "
     "the honest softmax.py, which Python imports without reading the source", {}, ("WRONG_OUTPUT",)),
    ("ctypes_clock", 9, "through np.ctypeslib.ctypes (PyFrame_LocalsToFast) rebinds the perf_counter_ns "
     "the worker's loop holds in a local to a clock 16x slow", {"src/softmax.py": """
import sys
import time

import numpy as np

ctypes = np.ctypeslib.ctypes
_patched = set()  # the fake clock now in place
""" + _SLOW_CLOCK + _SOFTMAX_FN + """

def _rebind_clock():
    frame = sys._getframe(2)
    while frame is not None:
        local = frame.f_locals
        if "clock" in local:
            if local["clock"] not in _patched:  # once per batch: the loop fetches its clock per batch
                fake = _slow_clock(time.perf_counter_ns)
                _patched.clear()
                _patched.add(fake)
                local["clock"] = fake
                ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))
            return
        frame = frame.f_back


def softmax_rows(x):
    out = _softmax(x)
    _rebind_clock()
    return out
"""}, ("TIMER_TAMPERED",)),
    ("seed_prediction", 10, "looks for the trial seed (the harness channel, the environment, the parent's "
     "environment) to predict which calls are compared, honest only on those", {"src/softmax.py": """
import os

import numpy as np

_calls = [0]


def _find_seed():
    try:
        from kz_runner.bench import channel
        return int(channel.trial_seed())
    except Exception:
        pass
    for env in (dict(os.environ), _parent_environ()):
        for key, value in env.items():
            if "SEED" in key.upper() and value.strip().isdigit():
                return int(value)
    return 0


def _parent_environ():
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as f:
            pairs = [p.split(b"=", 1) for p in f.read().split(b"\\0") if b"=" in p]
        return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
    except OSError:
        return {}


_rng = np.random.default_rng(_find_seed())
_checked = set(int(i) for i in _rng.choice(4096, size=64, replace=False))
""" + _SOFTMAX_FN + """

def softmax_rows(x):
    _calls[0] += 1
    if _calls[0] <= 4 or _calls[0] in _checked:
        return _softmax(x)
    return np.full_like(x, 1.0 / x.shape[-1])
"""}, ("WRONG_OUTPUT",)),
    ("cache_by_identity", 11, "caches outputs keyed on id(x) and the buffer address", {"src/softmax.py": """
import numpy as np

_cache = {}
""" + _SOFTMAX_FN + """

def softmax_rows(x):
    key = (id(x), x.ctypes.data, x.shape)
    if key not in _cache:
        _cache[key] = _softmax(x)
    return _cache[key]
"""}, ("WRONG_OUTPUT",)),
    ("cache_by_content", 12, "caches outputs keyed on a hash of the input bytes (fresh inputs: no hit; the "
     "count is printed at exit)", {"src/softmax.py": """
import atexit
import hashlib
import sys

import numpy as np

_memo = {}
_hits = [0]
atexit.register(lambda: print(f"content cache: {_hits[0]} hits", file=sys.stderr))
""" + _SOFTMAX_FN + """

def softmax_rows(x):
    key = hashlib.blake2b(x.tobytes(), digest_size=16).digest()
    if key in _memo:
        _hits[0] += 1
        return _memo[key]
    out = _softmax(x)
    if len(_memo) >= 4096:
        _memo.pop(next(iter(_memo)))
    _memo[key] = out.copy()
    return out
"""}, ()),
    ("cache_by_shape", 13, "caches outputs keyed on the input's shape", {"src/softmax.py": """
import numpy as np

_cache = {}
""" + _SOFTMAX_FN + """

def softmax_rows(x):
    if x.shape not in _cache:
        _cache[x.shape] = _softmax(x)
    return _cache[x.shape]
"""}, ("WRONG_OUTPUT",)),
    ("empty_most_calls", 14, "returns np.empty (last call's freed buffer, uninitialised) on 7 calls in 8",
     {"src/softmax.py": """
import numpy as np

_calls = [0]
""" + _SOFTMAX_FN + """

def softmax_rows(x):
    _calls[0] += 1
    if _calls[0] % 8 == 1:
        return _softmax(x)
    return np.empty_like(x)
"""}, ("WRONG_OUTPUT",)),
    ("background_thread", 15, "returns a buffer at once and fills it from a background thread",
     {"src/softmax.py": """
import threading

import numpy as np
""" + _SOFTMAX_FN + """

def _fill(x, out):
    out[...] = _softmax(x)


def softmax_rows(x):
    out = np.empty_like(x)
    threading.Thread(target=_fill, args=(x.copy(), out), daemon=True).start()
    return out
"""}, ("WRONG_OUTPUT",)),
    ("timer_patch", 16, "replaces time.perf_counter and time.perf_counter_ns with clocks 16x slow",
     {"src/softmax.py": """
import time

import numpy as np
""" + _SLOW_CLOCK + """
time.perf_counter_ns = _slow_clock(time.perf_counter_ns)
_pc = _slow_clock(time.perf_counter_ns)
time.perf_counter = lambda: _pc() / 1e9
""" + _SOFTMAX_FN + """

def softmax_rows(x):
    return _softmax(x)
"""}, ("TIMER_TAMPERED",)),
    ("patched_numpy_exp", 17, "replaces np.exp by a fast bit-trick approximation (Schraudolph), for the "
     "reference too, were it in the same process", {"src/softmax.py": """
import numpy as np

_exact_exp = np.exp


def _fast_exp(v, out=None):
    v = np.asarray(v, dtype=np.float32)
    bits = (v * np.float32(12102203.0) + np.float32(1065353216.0)).clip(0, 2.1e9).astype(np.int32)
    r = bits.view(np.float32)
    if out is not None:
        out[...] = r
        return out
    return r


np.exp = _fast_exp
""" + _SOFTMAX_FN + """

def softmax_rows(x):
    return _softmax(x)
"""}, ("WRONG_OUTPUT",)),
    ("expected_files", 18, "looks for the workdir's expected/*_out.npy (beside src/, in its working "
     "directory and every visible process's) and returns the one of the right shape", {"src/softmax.py": """
import os
import sys
from pathlib import Path

import numpy as np

_known = {}


def _load():
    places = [Path(__file__).resolve().parent.parent, Path.cwd()]
    for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):  # every process's working directory
        places.append(Path(f"/proc/{pid}/cwd"))
    for place in places:
        try:
            for f in sorted(place.glob("expected/*_out.npy")):
                a = np.load(f)
                _known.setdefault(a.shape, a)
        except (OSError, ValueError):
            continue


_load()
print(f"expected files found: {len(_known)}", file=sys.stderr)
""" + _SOFTMAX_FN + """

def softmax_rows(x):
    hit = _known.get(x.shape)
    return hit if hit is not None else _softmax(x)
"""}, ("WRONG_OUTPUT",)),
    ("rewrite_inputs", 19, "zeroes its input in place and returns the uniform distribution, the softmax "
     "of the rewritten input", {"src/softmax.py": """
import numpy as np

_calls = [0]
""" + _SOFTMAX_FN + """

def softmax_rows(x):
    _calls[0] += 1
    if _calls[0] == 1:
        return _softmax(x)
    x[...] = 0.0
    return np.full_like(x, 1.0 / x.shape[-1])
"""}, ("WRONG_OUTPUT",)),
    ("warmup_detection", 20, "counts calls and watches the gaps between them: honest for the first 40 "
     "calls and on the first call after a pause (a new batch), garbage otherwise", {"src/softmax.py": """
import time

import numpy as np

_calls = [0]
_last = [0.0]
""" + _SOFTMAX_FN + """

def softmax_rows(x):
    _calls[0] += 1
    now = time.monotonic()
    fresh = now - _last[0] > 0.001
    try:
        if _calls[0] <= 40 or fresh:
            return _softmax(x)
        return np.zeros_like(x)
    finally:
        _last[0] = time.monotonic()
"""}, ("WRONG_OUTPUT",)),
    ("forked_helper", 21, "forks a helper process (same process group) that finishes each call's output "
     "in the shared arena after the call returned", {"src/softmax.py": """
import os
import time

import numpy as np

_helper = [None]
_r, _w = os.pipe()
""" + _SOFTMAX_FN + _ARENA + """

def _serve(parent):
    while os.getppid() == parent:
        slot = os.read(_r, 8)
        if len(slot) < 8:
            break
        time.sleep(0.002)  # after the call's return and its reply
        xi, oi = _slots_cache[int.from_bytes(slot, "little")]
        oi[...] = _softmax(xi)
    os._exit(0)


_slots_cache = []


def softmax_rows(x):
    if not _slots_cache:
        _slots_cache.extend(_slots(x))
    if _helper[0] is None:
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            _serve(parent)
        _helper[0] = pid
    own = _own_output(x)
    index = next(i for i, (xi, oi) in enumerate(_slots_cache) if oi.ctypes.data == own.ctypes.data)
    os.write(_w, index.to_bytes(8, "little"))
    return own
"""}, ("WRONG_OUTPUT",)),
    ("front_load_batch", 22, "on the first call of a batch, computes every poisoned slot of the arena in one "
     "vectorised pass (the batch's inputs are all there before the clock starts); later calls return "
     "their slot", {"src/softmax.py": """
import numpy as np

_slot_views = []
""" + _SOFTMAX_FN + _ARENA + """

def softmax_rows(x):
    if not _slot_views:
        _slot_views.extend(_slots(x))
    own = _own_output(x)
    if not _poisoned(own):
        return own  # done by an earlier call of this batch
    first = next(i for i, (_, oi) in enumerate(_slot_views) if oi.ctypes.data == own.ctypes.data)
    todo = []
    for xi, oi in _slot_views[first:]:  # this call's slot and the batch's next ones, all poisoned
        if not _poisoned(oi):
            break
        todo.append((xi, oi))
    result = _softmax(np.concatenate([xi for xi, _ in todo]))
    rows = x.shape[0]
    for k, (_, oi) in enumerate(todo):
        oi[...] = result[k * rows:(k + 1) * rows]
    return own
"""}, ()),
    ("session_daemon", 21, "forks a helper that calls setsid (out of the process group the judge stops) "
     "and fills each poisoned output slot from its input while the judge prepares the batch; the kernel "
     "returns its slot as the helper left it", {"src/softmax.py": """
import atexit
import os
import sys
import time

import numpy as np

_helper = [None]
_ready = [0, 0]
atexit.register(lambda: print(f"helper filled {_ready[0]} of {_ready[1]} calls", file=sys.stderr))
""" + _SOFTMAX_FN + _ARENA + """

def _serve(x, parent):
    os.setsid()  # a session of its own: a stop sent to the worker's process group misses it
    os.nice(10)  # and off the worker's CPU whenever the worker runs
    slots = _slots(x)
    i = 0
    while os.getppid() == parent:
        xi, oi = slots[i]
        if _poisoned(oi):  # the judge has written this slot's input: fill it before the clock starts
            seen = xi.copy()
            out = _softmax(seen)
            if _poisoned(oi) and np.array_equal(seen, xi):  # still this batch's input, still unwritten
                oi[...] = out
            i = (i + 1) % len(slots)
        elif i and _poisoned(slots[0][1]):  # a new batch
            i = 0
        else:
            time.sleep(0)
    os._exit(0)


def softmax_rows(x):
    _ready[1] += 1
    if _helper[0] is None:
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                _serve(x, parent)
            finally:
                os._exit(0)
        _helper[0] = pid
    own = _own_output(x)
    if np.isnan(own.reshape(-1)[-1]):  # not (wholly) written yet: the helper writes front to back
        return _softmax(x)
    _ready[0] += 1
    return own.copy()  # a copy, as an honest result is: the worker's copy into the slot then costs the same
"""}, ()),
]

@dataclass(frozen=True)
class JudgeCheat:
    """A source area (the Softmax example's src/ changed) aimed at the judge and its worker."""

    name: str
    family: int  # the family's number in the corpus list
    pattern: str
    path: Path  # the package directory; the judge imports softmax.softmax_rows from path/src
    expected: tuple[str, ...]  # the judge's code(s) that stop it; (): no finding, the timing is the kernel's own

    @property
    def src(self) -> Path:
        return self.path / "src"


def _write_pyc(pkg: Path) -> None:
    """An unchecked-hash bytecode cache of the cheating module, where this interpreter imports it from."""
    import importlib.util
    import py_compile

    staged = pkg / "staged" / "softmax.py"
    staged.parent.mkdir(parents=True, exist_ok=True)
    staged.write_text(_PYC_SOURCE, encoding="utf-8")
    target = Path(importlib.util.cache_from_source(str(pkg / "src" / "softmax.py")))
    py_compile.compile(str(staged), cfile=str(target), dfile="softmax.py", doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    shutil.rmtree(staged.parent)


def judge_cheat_packages(tmp_dir: str | Path) -> list[JudgeCheat]:
    """Write every source area aimed at the judge under ``tmp_dir`` (one folder each)."""
    tmp_dir = Path(tmp_dir)
    out = []
    for name, family, pattern, files, expected in _JUDGE_CHEATS:
        pkg = _copy_example(SOFTMAX, tmp_dir / name)
        shutil.rmtree(pkg / "src" / "__pycache__", ignore_errors=True)
        for rel, data in files.items():
            target = pkg / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(data, str):
                target.write_text(f'"""Cheat {name}: {pattern}."""\n' + data.lstrip("\n"), encoding="utf-8")
            else:
                target.write_bytes(data)
        if name == "pyc_beside_py":
            _write_pyc(pkg)
        out.append(JudgeCheat(name, family, pattern, pkg, expected))
    return out

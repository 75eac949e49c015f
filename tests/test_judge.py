"""kz_runner.judge: honest kernels pass, cheating kernels are caught, with real worker processes (no mocks).

Each test writes a kernel module into a temporary ``src`` directory and times it
through :class:`kz_runner.judge.Judge`; the worker is a real
``python -m kz_runner.judge.serve_kernel`` process. Shapes are kept small (2 shared cores).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kz_runner.judge import Judge, fresh_like, protocol, shm
from kz_runner.judge.referee import (
    BAD_OUTPUT,
    MACHINE_BUSY,
    PROTOCOL_ERROR,
    TIMER_TAMPERED,
    WORKER_CRASHED,
    WORKER_ERROR,
    WORKER_TIMEOUT,
    WRONG_OUTPUT,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the judge's worker control is Linux-only")

ROOT = Path(__file__).resolve().parent.parent
SOFTMAX_SRC = ROOT / "examples/cpu/Reduction/Softmax/fp32/numpy_ref/src"
AXPY_SRC = ROOT / "examples/cpu/Elementwise/Axpy/fp32/numpy_ref/src"
FAST = {"calls": 48, "min_batches": 6, "calibration_batches": 6}  # enough batches for the checks, quick


def softmax_reference(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def axpy_reference(a: float, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (np.float64(a) * x.astype(np.float64) + y.astype(np.float64)).astype(np.float32)


@pytest.fixture(scope="module")
def softmax_x() -> np.ndarray:
    return (3.0 * np.random.default_rng(7).standard_normal((256, 512))).astype(np.float32)


@pytest.fixture(scope="module")
def axpy_xy() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(8)
    return rng.standard_normal(65536).astype(np.float32), rng.standard_normal(65536).astype(np.float32)


def write_src(root: Path, module: str, imports: str, *bodies: str) -> Path:
    """``src/<module>.py``: an import line, then each (indented) body dedented."""
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / f"{module}.py").write_text(imports + "\n" + "".join(textwrap.dedent(b) for b in bodies))
    return src


def time_softmax(src: Path, x: np.ndarray, module: str = "softmax", function: str = "softmax_rows", *,
                 start: dict | None = None, reference=softmax_reference, **kw):
    judge = Judge.start([], src, module, function, **(start or {}))
    try:
        return judge, judge.time(fresh_like(x), reference, atol=1e-6, rtol=1e-5, **{**FAST, **kw})
    finally:
        judge.close()


def assert_honest(r) -> None:
    """No accusation. MACHINE_BUSY (a void timing on a loaded machine, the kernel's run-queue wait
    explaining it) is tolerated: these tests share 2 cores with other work."""
    assert set(r.codes) <= {MACHINE_BUSY}, [f.line() for f in r.findings]
    if r.codes:
        assert r.findings[0].evidence["busy"], r.findings[0].evidence


SOFTMAX_BODY = """
    def _softmax(x):
        shifted = x - x.max(axis=-1, keepdims=True)
        np.exp(shifted, out=shifted)
        shifted /= shifted.sum(axis=-1, keepdims=True)
        return shifted
"""


# -- honest kernels ----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["memfd", "shm"])
def test_honest_softmax_passes(softmax_x, backend):
    _, r = time_softmax(SOFTMAX_SRC, softmax_x, start={"backend": backend})
    assert_honest(r)
    assert r.n >= 48 and r.compared >= 12 and r.batch_size >= 1
    assert 0 < r.p10_ns <= r.median_ns <= r.p90_ns
    assert r.batch_mean_median_ns > 0 and len(r.walls_ns) == len(r.sums_ns) >= 6
    assert all(s <= w for s, w in zip(r.sums_ns, r.walls_ns))


@pytest.mark.parametrize("out_mode", ["out_kw", "out_pos", "return"])
def test_honest_axpy_passes_in_every_output_style(axpy_xy, out_mode):
    x, y = axpy_xy
    with Judge.start([], AXPY_SRC, "axpy", "axpy", out_mode=out_mode) as judge:
        r = judge.time(fresh_like(2.5, x, y), axpy_reference, atol=1e-6, rtol=1e-6, **FAST)
    assert_honest(r)
    assert r.n >= 48 and r.median_ns > 0


def test_fresh_like_keeps_shape_dtype_and_values_but_not_content(softmax_x):
    fn = fresh_like(softmax_x, 2.5)
    a, s = fn(np.random.default_rng(1))
    b, _ = fn(np.random.default_rng(2))
    assert a.shape == softmax_x.shape and a.dtype == softmax_x.dtype and s == 2.5
    assert np.isin(a, softmax_x).all()  # drawn from the base's values...
    assert not np.array_equal(a, b) and not np.array_equal(a, softmax_x)  # ...anew for every call
    assert np.array_equal(a, fn(np.random.default_rng(1))[0])  # a pure function of the generator


# -- (a) caches ----------------------------------------------------------------------------------------

def test_cache_keyed_on_buffer_identity_is_caught(tmp_path, softmax_x):
    src = write_src(tmp_path, "cached", "import numpy as np", SOFTMAX_BODY, """
    _cache = {}

    def softmax_rows(x):
        key = (x.__array_interface__["data"][0], x.shape, id(x))
        if key not in _cache:
            _cache[key] = _softmax(x)
        return _cache[key]
    """)
    _, r = time_softmax(src, softmax_x, "cached")
    assert r.codes == [WRONG_OUTPUT], r.codes


def test_cache_keyed_on_input_bytes_never_hits(tmp_path, softmax_x):
    log = tmp_path / "hits.txt"
    src = write_src(tmp_path, "bytecache", "import hashlib, os\nimport numpy as np", SOFTMAX_BODY, """
    _cache, _hits = {}, [0]

    def softmax_rows(x):
        key = hashlib.blake2b(x.tobytes(), digest_size=16).digest()
        if key in _cache:
            _hits[0] += 1
            with open(os.environ["KZ_TEST_HITS"], "w") as f:
                f.write(str(_hits[0]))
            return _cache[key]
        _cache[key] = out = _softmax(x)
        return out
    """)
    _, r = time_softmax(src, softmax_x, "bytecache", start={"env": {**os.environ, "KZ_TEST_HITS": str(log)}})
    assert_honest(r)  # correct, and timed with the hashing it pays for
    assert not log.exists(), "fresh inputs: a content-keyed cache never hits"


# -- (b) garbage on many calls -----------------------------------------------------------------------------

def test_garbage_on_half_the_timed_calls_is_caught_by_sampling(tmp_path, softmax_x):
    # Honest for the warm-up (whose calls are all compared), then garbage on half of the calls. With 4 of
    # each batch's 8 calls compared over 16 batches, it escapes with probability 2**-64.
    src = write_src(tmp_path, "garbage", "import random\nimport numpy as np", SOFTMAX_BODY, """
    _n = [0]

    def softmax_rows(x):
        _n[0] += 1
        if _n[0] > 12 and random.random() < 0.5:
            return np.zeros_like(x)
        return _softmax(x)
    """)
    _, r = time_softmax(src, softmax_x, "garbage", batch=8, compare_per_batch=4, calls=128)
    assert r.codes == [WRONG_OUTPUT], r.codes
    assert r.findings[0].evidence["call_id"] >= 12  # caught among the timed calls, by sampling


def test_garbage_on_most_calls_is_caught(tmp_path, softmax_x):
    src = write_src(tmp_path, "mostly", "import random\nimport numpy as np", SOFTMAX_BODY, """
    def softmax_rows(x):
        return _softmax(x) if random.random() < 0.1 else np.full_like(x, 1.0 / x.shape[1])
    """)
    _, r = time_softmax(src, softmax_x, "mostly")
    assert r.codes == [WRONG_OUTPUT], r.codes


# -- (c) the worker's clock ----------------------------------------------------------------------------------

def test_patched_perf_counter_is_caught(tmp_path, softmax_x):
    src = write_src(tmp_path, "slowclock", "import sys, time\nimport numpy as np", SOFTMAX_BODY, """
    _real = time.perf_counter_ns

    def _fake():
        return _real() // 20  # a clock running 20x slow: every reported time is 1/20 of the truth

    def softmax_rows(x):
        time.perf_counter_ns = _fake
        worker = sys.modules.get("kz_runner.judge.serve_kernel")
        if worker is not None:
            worker.time = type(sys)("time")
            worker.time.perf_counter_ns = _fake
        return _softmax(x)
    """)
    _, r = time_softmax(src, softmax_x, "slowclock")
    # On a host loaded enough that the worker waited for a CPU most of the batch, the shortfall is
    # excused as load: the timing is void (never a pass), and the harness runs it again.
    assert r.codes in ([TIMER_TAMPERED], [MACHINE_BUSY]), r.codes
    if r.codes == [TIMER_TAMPERED]:
        assert "batches report under" in r.findings[0].message


# -- (d) deferred work -----------------------------------------------------------------------------------------

DEFERRED_IMPORTS = "import sys, threading, time\nimport numpy as np"
DEFERRED = SOFTMAX_BODY + """
    _pending = []

    def _compute(x, out):
        time.sleep(0.005)  # let the call return, and the reply go, first
        out[...] = _softmax(x)

    def softmax_rows(x, out):
        t = threading.Thread(target=_compute, args=(x, out))
        t.start()  # returns at once; the work goes on after the call's timer stopped
        _pending.append(t)
"""
QUEUED = SOFTMAX_BODY + """
    _pending = []

    class _Later:  # the work, kept for later
        def __init__(self, x, out):
            self.x, self.out = x, out

        def join(self):
            self.out[...] = _softmax(self.x)

    def softmax_rows(x, out):
        _pending.append(_Later(x, out))
"""
JOIN_BEFORE_REPLY = """
    # Finish the pending work right before each reply, so outputs are complete when the judge looks.
    from kz_runner.judge import protocol as _protocol
    _send = _protocol.send

    def _joining_send(sock, msg):
        while _pending:
            _pending.pop(0).join()
        return _send(sock, msg)

    _protocol.send = _joining_send
"""


def test_work_deferred_past_the_reply_leaves_poison(tmp_path, softmax_x):
    src = write_src(tmp_path, "deferred", DEFERRED_IMPORTS, DEFERRED)
    _, r = time_softmax(src, softmax_x, "deferred", start={"out_mode": "out_kw"})
    assert r.codes == [WRONG_OUTPUT], r.codes  # the worker is stopped at the reply: outputs unfinished


@pytest.mark.parametrize("body", [DEFERRED, QUEUED], ids=["threads", "queued"])
def test_work_deferred_but_finished_before_the_reply_is_caught_by_the_wall_clock(tmp_path, softmax_x, body):
    src = write_src(tmp_path, "deferjoin", DEFERRED_IMPORTS, body, JOIN_BEFORE_REPLY)
    _, r = time_softmax(src, softmax_x, "deferjoin", start={"out_mode": "out_kw"})
    assert r.codes == [TIMER_TAMPERED], r.codes
    assert "batches report under" in r.findings[0].message


def test_a_worker_that_makes_itself_wait_for_a_cpu_gets_no_pass(tmp_path, softmax_x):
    # Hidden work (done before each reply) plus CPU hogs in the worker's process group, so the worker's main
    # thread accrues run-queue delay that could "explain" the missing time: at best the timing is void.
    src = write_src(tmp_path, "hogs", DEFERRED_IMPORTS + "\nimport os", QUEUED, JOIN_BEFORE_REPLY, """
    _hogs = []

    def _spawn_hogs():
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                while True:
                    pass
            _hogs.append(pid)

    _spawn_hogs()
    """)
    _, r = time_softmax(src, softmax_x, "hogs", start={"out_mode": "out_kw"})
    assert r.codes in ([TIMER_TAMPERED], [MACHINE_BUSY]), r.codes
    assert r.findings[0].evidence["under"] or r.findings[0].evidence["busy"]


# -- (e) the seed -----------------------------------------------------------------------------------------------

def _scan_memory(pid: int, needles: list[bytes]) -> set[bytes]:
    """Which of ``needles`` occur anywhere in the readable memory of process ``pid``."""
    found: set[bytes] = set()
    overlap = max(len(n) for n in needles)
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]", "[vvar_vclock]")):
                continue
            lo, hi = (int(v, 16) for v in fields[0].split("-"))
            pos = lo
            while pos < hi:
                n = min(hi - pos, 64 << 20)
                try:
                    mem.seek(pos)
                    data = mem.read(n + (overlap if pos + n < hi else 0))
                except (OSError, OverflowError, ValueError):
                    break
                found.update(k for k in needles if k in data)
                pos += n
    return found


def test_the_seed_never_reaches_the_worker(tmp_path, softmax_x):
    marker = b"kz-judge-positive-control-" + os.urandom(8).hex().encode()
    src = write_src(tmp_path, "snoop", "import numpy as np", SOFTMAX_BODY, f"""
    MARKER = {marker!r}  # proves the memory scan sees this process's data

    def softmax_rows(x):
        return _softmax(x)
    """)
    transcript: list[bytes] = []
    scans: list[set[bytes]] = []
    holder: dict[str, Judge] = {}

    def reference(x):
        # Runs in the judge after a batch, while the worker is stopped: read the worker's whole memory.
        judge = holder["judge"]
        if not scans and judge.proc is not None and judge.loaded:
            seed = judge._secret_seed
            assert seed is not None
            needles = [marker, seed, seed.hex().encode(), str(int.from_bytes(seed, "little")).encode()]
            scans.append(_scan_memory(judge.proc.pid, needles))
        return softmax_reference(x)

    judge = Judge.start([], src, "snoop", "softmax_rows", transcript=transcript)
    holder["judge"] = judge
    try:
        r = judge.time(fresh_like(softmax_x), reference, atol=1e-6, rtol=1e-5, **FAST)
    finally:
        judge.close()
    assert_honest(r)
    seed = judge._secret_seed
    assert seed is not None and scans
    assert scans[0] == {marker}, "the scan saw the kernel's marker and nothing of the seed"
    sent = b"".join(transcript) + " ".join(judge.worker_argv).encode() + repr(judge.env).encode()
    for form in (seed, seed.hex().encode(), str(int.from_bytes(seed, "little")).encode()):
        assert form not in sent
    msgs = [protocol.decode(f[4:]) for f in transcript]
    assert {m["op"] for m in msgs} <= {"layout", "load", "batch", "exit"}
    keys = {k for m in msgs for k in m} | {k for m in msgs if m["op"] == "layout" for a in m["arrays"] for k in a}
    assert keys <= {"op", "arrays", "arena", "out_mode", "module", "function", "src_dir", "fn", "call_ids",
                    "args", "outs", "name", "offset", "dtype", "shape"}


JUDGE_SCRIPT = """
import json, os, sys
import numpy as np
from kz_runner.judge import Judge, fresh_like
src, out, prefix = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
def ref(x):
    x64 = x.astype(np.float64); e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
x = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
with Judge.start(prefix, src, "peek", "softmax_rows", harden=True, env={**os.environ, "KZ_PEEK_OUT": out}) as j:
    r = j.time(fresh_like(x), ref, atol=1e-6, rtol=1e-5, calls=16, min_batches=2, calibration_batches=3)
print(json.dumps(r.codes))
"""


def test_the_worker_cannot_read_the_judges_memory(tmp_path):
    # The judge makes itself non-dumpable (harden=True); a worker holding CAP_SYS_PTRACE would still get
    # in, so as root the worker runs without capabilities (the sandbox prefix's job in production).
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv to drop the worker's capabilities")
        prefix = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]
    out = tmp_path / "peek.json"
    src = write_src(tmp_path, "peek", "import json, os\nimport numpy as np", SOFTMAX_BODY, """
    def _peek():
        pid = os.getppid()
        try:
            first = open(f"/proc/{pid}/maps").read().split("-")[0]
            with open(f"/proc/{pid}/mem", "rb", 0) as mem:
                mem.seek(int(first, 16))
                return {"read": len(mem.read(4096))}
        except OSError as exc:
            return {"blocked": type(exc).__name__}

    def softmax_rows(x):
        with open(os.environ["KZ_PEEK_OUT"], "w") as f:
            json.dump(_peek(), f)
        return _softmax(x)
    """)
    script = tmp_path / "judge_proc.py"
    script.write_text(JUDGE_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script), str(src), str(out), json.dumps(prefix)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert set(json.loads(done.stdout.strip().splitlines()[-1])) <= {MACHINE_BUSY}
    assert json.loads(out.read_text()) == {"blocked": "PermissionError"}


# -- (f) crashes, hangs, bad outputs, a forged channel ---------------------------------------------------------------

@pytest.mark.parametrize("how,expect", [("os._exit(7)", "exit status 7"),
                                        ("ctypes.string_at(0)", "signal SIGSEGV")])
def test_a_crashing_worker_is_reported(tmp_path, softmax_x, how, expect):
    src = write_src(tmp_path, "crash", "import ctypes, os\nimport numpy as np", SOFTMAX_BODY, f"""
    _n = [0]

    def softmax_rows(x):
        _n[0] += 1
        if _n[0] == 6:
            {how}
        return _softmax(x)
    """)
    _, r = time_softmax(src, softmax_x, "crash")
    assert r.codes == [WORKER_CRASHED], r.codes
    assert expect in r.findings[0].message


def test_a_hanging_worker_times_out(tmp_path, softmax_x):
    src = write_src(tmp_path, "hang", "import time\nimport numpy as np", SOFTMAX_BODY, """
    _n = [0]

    def softmax_rows(x):
        _n[0] += 1
        if _n[0] == 6:
            time.sleep(600)
        return _softmax(x)
    """)
    judge, r = time_softmax(src, softmax_x, "hang", timeout_s=2.0, first_call_timeout_s=2.0)
    assert r.codes == [WORKER_TIMEOUT], r.codes
    assert judge.proc is None  # closed, the process group killed


@pytest.mark.parametrize("ret", ["x.astype(np.float64)", "x[:, :-1].copy()", "None"])
def test_an_output_of_the_wrong_shape_or_dtype_is_reported(tmp_path, softmax_x, ret):
    src = write_src(tmp_path, "badout", "import numpy as np", f"def softmax_rows(x):\n    return {ret}\n")
    _, r = time_softmax(src, softmax_x, "badout")
    assert r.codes == [BAD_OUTPUT], r.codes


def test_a_kernel_that_raises_or_does_not_import_is_a_worker_error(tmp_path, softmax_x):
    src = write_src(tmp_path, "raises", "", "def softmax_rows(x):\n    raise RuntimeError('nope')\n")
    _, r = time_softmax(src, softmax_x, "raises")
    assert r.codes == [WORKER_ERROR] and "CALL_FAILED" in r.findings[0].message and "nope" in r.findings[0].message
    _, r = time_softmax(src, softmax_x, "missing_module")
    assert r.codes == [WORKER_ERROR] and "LOAD_FAILED" in r.findings[0].message


def test_a_forged_frame_from_the_worker_is_a_protocol_error(tmp_path, softmax_x):
    src = write_src(tmp_path, "forge", "import socket, sys\nimport numpy as np", SOFTMAX_BODY, """
    def softmax_rows(x):
        frame = sys._getframe()
        while frame is not None:  # up to the worker's loop, for its socket
            sock = getattr(frame.f_locals.get("self"), "sock", None)
            if isinstance(sock, socket.socket):
                sock.sendall(b"\\x00\\x00\\x00\\x05hello")  # a frame that is not JSON
                break
            frame = frame.f_back
        return _softmax(x)
    """)
    _, r = time_softmax(src, softmax_x, "forge")
    assert r.codes == [PROTOCOL_ERROR], r.codes


# -- the pieces ---------------------------------------------------------------------------------------------------

def test_protocol_frames_are_json_only():
    a, b = socket.socketpair()
    with a, b:
        frame = protocol.send(a, {"op": "done", "call_ids": [1], "times_ns": [5]})
        assert frame[4:].startswith(b"{")
        assert protocol.check_done(protocol.recv(b, None), [1]) == [5]
        for bad in (b"NaN", b"[1]", b'{"op": 3}', b"\x80\x04K\x01.", b'{"op": "done", "x": Infinity}'):
            with pytest.raises(protocol.JudgeProtocolError):
                protocol.decode(bad)
        a.sendall(protocol.HEADER.pack(protocol.MAX_MESSAGE + 1))
        with pytest.raises(protocol.JudgeProtocolError):
            protocol.recv(b, None)
    for bad_times in ([-1], [True], [1.5], [1, 2]):
        with pytest.raises(protocol.JudgeProtocolError):
            protocol.check_done({"op": "done", "call_ids": [1], "times_ns": bad_times}, [1])
    sources = "".join(p.read_text() for p in (ROOT / "kz_runner/judge").glob("*.py"))
    assert "import pickle" not in sources and "pickle.load" not in sources


def test_arena_poison_and_seals():
    layout = shm.Layout()
    f = layout.add("f", (3, 5), np.float32)
    i = layout.add("i", (7,), np.int32)
    assert f.offset % shm.ALIGN == 0 and i.offset % shm.ALIGN == 0 and i.offset >= f.nbytes
    arena = shm.Arena(layout)
    try:
        shm.poison(arena["f"])
        shm.poison(arena["i"])
        assert np.isnan(arena["f"]).all()
        assert (arena["i"].view(np.uint8) == 0xA5).all()
        if arena.fd is not None and arena.sealed:
            with pytest.raises(PermissionError):
                os.ftruncate(arena.fd, 0)  # a worker cannot shrink the block under the judge
        other = shm.attach(fd=arena.fd, size=arena.size) if arena.fd is not None else None
        if other is not None:
            shm.view(other, f)[0, 0] = 1.5
            assert arena["f"][0, 0] == np.float32(1.5)
            other.close()
    finally:
        arena.close()


def test_a_second_time_call_gets_a_fresh_unloaded_worker(softmax_x):
    with Judge.start([], SOFTMAX_SRC, "softmax", "softmax_rows") as judge:
        first = judge.proc.pid
        r1 = judge.time(fresh_like(softmax_x), softmax_reference, atol=1e-6, rtol=1e-5, **FAST)
        small = softmax_x[:32]
        r2 = judge.time(fresh_like(small), softmax_reference, atol=1e-6, rtol=1e-5, **FAST)
    assert_honest(r1)
    assert_honest(r2)
    assert judge.worker_pid != first  # calibrated before the kernel was imported, again


# -- a worker that does not stop between batches ------------------------------------------------------------

class _StopsOnlyAtFirst:
    """The judge's freezer, except that after ``ok`` calls its processes do not all stop in time: the edge a
    test cannot reach with a real process (a thread in uninterruptible sleep), put in the freezer's place."""

    def __init__(self, real, ok: int) -> None:
        self.real, self.ok = real, ok
        self.last_wait_ns = 0

    def freeze(self, timeout_s: float = 2.0) -> bool:
        stopped = self.real.freeze(timeout_s)
        self.ok -= 1
        return stopped and self.ok >= 0

    def thaw(self) -> None:
        self.real.thaw()


def test_a_worker_that_does_not_stop_in_time_ends_the_timing_and_is_killed(softmax_x):
    judge = Judge.start([], SOFTMAX_SRC, "softmax", "softmax_rows")
    try:
        pid = judge.worker_host_pid
        judge._freezer = _StopsOnlyAtFirst(judge._freezer, ok=4)  # the layout, a few calibration batches
        r = judge.time(fresh_like(softmax_x), softmax_reference, atol=1e-6, rtol=1e-5, **FAST)
    finally:
        judge.close()
    assert r.codes == [WORKER_TIMEOUT], [f.line() for f in r.findings]
    assert "did not all stop" in r.findings[0].message
    assert not r.times_ns  # no timed batch was taken
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

"""The trusted side: spawn the worker, feed it fresh inputs, check its outputs and its clock.

Typical use (the benchmark author's side; nothing from ``src/`` is imported here)::

    judge = Judge.start([], src_dir, "softmax", "softmax_rows")
    try:
        r = judge.time(fresh_like(x), reference, atol=1e-6, rtol=1e-5)
    finally:
        judge.close()
    r.findings  # [] when honest; r.batch_mean_median_ns is the headline

One :meth:`Judge.time` call, in order:

1. A probe: ``inputs_fn(rng)`` is called twice with one seed (it must be a pure
   function of the generator: the judge regenerates inputs from per-call seeds
   instead of trusting the arena's copy), ``reference_fn`` gives the output
   shapes/dtypes.
2. A fresh worker (one per ``time()``: the overhead must be calibrated before
   the submitter's module is imported, or the import could inflate it) gets the
   layout: ``slots`` call slots (``max_batch``, fewer if ``arena_max_bytes``
   says so), each with its own input and output arrays.
3. Calibration: batches of the worker's built-in no-op, at 1 call and at
   ``slots`` calls (each after an idle gap as long as the judge's preparation
   of such a batch), give the loop's own cost per batch, ``O(B) = o1 + k*(B-1)``.
4. ``load``; warm-up batches (every call compared); the batch size ``B`` is set
   from the judge-measured time of a single call (``target_batch_s`` per batch).
5. Timed batches. Per batch: a per-call seed (from the secret generator) for
   each call, inputs drawn into the call's slot, every output slot poisoned,
   then ``t0``, SIGCONT, send, receive (``t1`` = the kernel's timestamp of the
   reply record), SIGSTOP. Then, with the secret
   generator, ``compare_per_batch`` calls are picked, their inputs regenerated
   privately, the reference computed and compared (``WRONG_OUTPUT``).

The secret: 32 bytes of ``os.urandom`` per ``time()``, held only in this
process; the worker sees the drawn inputs, never a seed.

Tolerance model (per batch of ``B`` calls; ``W = t1 - t0`` the judge's wall,
``S`` the sum of the worker's reported times, ``O(B)`` calibrated overhead)::

    S <= W                                      (always: the calls lie inside [t0, t1])
    S >= max((W - O(B)) * (1 - tol) - slack(B),  tol = 0.10
             (W - O(B)) * 0.5)                   (however noisy the calibration, at most half hidden)
    slack(B) = max(100 us, 3 sigma(B)) + 0.25 O(B)

``O(B)`` (lower quartile: load only adds to a residual, and an overestimate is
room to hide time in) and ``sigma(B)`` (1.4826 x MAD) of the no-op residuals
``W - S`` are measured at 1 and at ``slots`` calls and interpolated; the
``0.25 O(B)`` term is for the kernel's cold caches, which the no-op does not
leave behind. A batch breaking the second rule is *busy* when the worker's main thread
spent at least the missing time runnable but waiting for a CPU (the kernel's
``schedstat`` run delay, read while the worker is stopped), counting the judge's
own run delay in the batch and one more ``O(B) + max(100 us, 3 sigma(B))`` for the
overhead's uncertainty (tiny calls on a loaded host), else *under*.
``TIMER_TAMPERED`` when any batch breaks the first rule, or when more than
``max_bad_share`` (0.4) of the batches are under (about the median batch: a
preempted batch is noise, and hiding time in a minority of batches does not
move the headline); ``MACHINE_BUSY`` (void, re-run; not a verdict on the
kernel) when under and busy batches together are more than that share, unless
the case's first output already failed its check (``first_passed`` False: that
is the verdict, and a re-run could only hide it). A
worker can make itself wait (hog threads) but that only voids its timing:
busy batches never count in the headline. Only sums are checked: the worker
can move time between the calls of a batch, so the per-call median and
percentiles are descriptive, and the headline to publish is
``batch_mean_median_ns``, the median over the clean batches of ``S/B``
(``batch=1`` makes the two the same, at the cost of one round trip per call).
The run delay also counts waits inside calls (already in ``S``), so it is used
only to excuse a batch, never subtracted: an excuse can void a timing, not pass it.

The worker runs only inside ``[t0, t1]``: its process group is stopped while the
judge writes inputs and reads outputs, so work started early (on inputs already
in the arena) or finished late (after the reply) either shows in ``W - S`` or
leaves poison in the outputs.
"""
from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time as _time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kz_runner.judge import protocol, shm

WRONG_OUTPUT = "WRONG_OUTPUT"
TIMER_TAMPERED = "TIMER_TAMPERED"
WORKER_CRASHED = "WORKER_CRASHED"
WORKER_TIMEOUT = "WORKER_TIMEOUT"
BAD_OUTPUT = "BAD_OUTPUT"
WORKER_ERROR = "WORKER_ERROR"  # the kernel raised, or its module did not import
PROTOCOL_ERROR = "PROTOCOL_ERROR"  # the worker sent something malformed
MACHINE_BUSY = "MACHINE_BUSY"  # not a cheat: the worker waited for a CPU too often; the timing is void, re-run
CODES = (WRONG_OUTPUT, TIMER_TAMPERED, WORKER_CRASHED, WORKER_TIMEOUT, BAD_OUTPUT, WORKER_ERROR, PROTOCOL_ERROR,
         MACHINE_BUSY)

# Device: the judge's idle probe before a timed batch may take this many times its calibrated time, plus
# this much, before the GPU counts as busy outside the worker's interval.
DEVICE_PROBE_FACTOR = 5.0
DEVICE_PROBE_SLACK_NS = 500_000
_clock = _time.perf_counter_ns  # the judge's own clock (this process never runs submitted code)
_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # where ``kz_runner`` is importable from


@dataclass(frozen=True)
class RefereeFinding:
    code: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass
class JudgeResult:
    """What :meth:`Judge.time` measured. ``ok`` when there is no finding."""

    n: int = 0  # timed calls
    times_ns: list[int] = field(default_factory=list)  # the worker's per-call times (only their sums are checked)
    median_ns: float = math.nan
    mean_ns: float = math.nan
    p10_ns: float = math.nan
    p90_ns: float = math.nan
    min_ns: float = math.nan
    max_ns: float = math.nan
    batch_size: int = 0
    batch_means_ns: list[float] = field(default_factory=list)
    batch_mean_median_ns: float = math.nan  # the headline: median over the clean batches of S/B
    walls_ns: list[int] = field(default_factory=list)  # judge wall per timed batch
    sums_ns: list[int] = field(default_factory=list)  # worker's reported sum per timed batch
    run_delays_ns: list[int] = field(default_factory=list)  # worker main thread's run-queue wait per batch
    judge_delays_ns: list[int] = field(default_factory=list)  # the judge's own run-queue wait per batch
    clean: list[bool] = field(default_factory=list)  # per batch: within the tolerance (the headline's batches)
    overhead: dict[str, float] = field(default_factory=dict)  # o1_ns, per_call_ns, slack_ns, tol, ...
    skew: float = math.nan  # per-call median / batch_mean_median (1 with batch=1; forgeable, informational)
    compared: int = 0  # timed calls whose output was compared
    findings: list[RefereeFinding] = field(default_factory=list)
    elapsed_s: float = 0.0  # the whole time() call
    first_output: list[np.ndarray] | None = None  # the outputs of the call on first_inputs
    first_passed: bool | None = None  # first_output against first_expected (None: not compared)
    stop_reason: str = ""  # "batches" (as many as asked), "target_rse" or "budget"
    timed_wall_s: float = 0.0  # sum of the timed batches' walls

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    @property
    def median_us(self) -> float:
        return self.median_ns / 1e3


def fresh_like(*base: Any) -> Callable[[np.random.Generator], tuple]:
    """An ``inputs_fn`` drawing, for every call, each base array's elements anew with replacement.

    A bootstrap resample keeps the shape, dtype and the exact value distribution of
    each base array (its range, special values, the share of zeros, valid index
    ranges for integer arrays), so the kernel's data-dependent cost matches the
    base case's, while the content is new on every call (no cache keyed on the
    bytes, the shape or the buffer can hit). It drops any structure across
    elements (sortedness, CSR offsets, a simplex per row): give your own
    ``inputs_fn`` for such inputs. Scalars are passed unchanged. CuPy base arrays are drawn on
    their device (from a seed drawn from the generator, so still a pure function of it).
    """
    flats = []
    for b in base:
        if _is_array(b) and b.size > 0:
            flats.append(b.copy().reshape(-1))
        else:
            flats.append(None)

    def inputs_fn(rng: np.random.Generator) -> tuple:
        out = []
        for b, flat in zip(base, flats):
            if flat is None:
                out.append(b)
                continue
            n = flat.size
            dtype = np.int32 if n < 2**31 else np.int64
            if isinstance(flat, np.ndarray):
                idx = rng.integers(0, n, size=n, dtype=dtype)
            else:  # a device array: the indices are drawn on the device, from a seed drawn from ``rng``
                from kz_runner.judge.gpu_arena import device_indices

                idx = device_indices(int(rng.integers(0, 2**63)), n, dtype)
            out.append(flat.take(idx).reshape(b.shape))
        return tuple(out)

    return inputs_fn


# -- the worker's process group: stopped outside the judge's clock ---------------------------------

def _task_states(pid: int) -> list[str]:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    states = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        states.append(chr(data[data.rindex(b")") + 2]))
    return states


def _run_delay_ns(pid: int) -> int:
    """Nanoseconds the worker's main thread has spent runnable but waiting for a CPU (kernel-accounted)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat", "rb") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _own_run_delay_ns() -> int:
    """Nanoseconds this (the judge's) thread has spent runnable but waiting for a CPU."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _children(pid: int) -> list[int]:
    """The children of every thread of ``pid`` (``/proc/<pid>/task/<tid>/children``)."""
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                found.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return found


def _descendants(root: int, skip: Sequence[int] = ()) -> list[int]:
    """Every process below ``root``, parents before their children; the subtrees of ``skip`` left out."""
    seen: list[int] = []
    todo = [root]
    while todo:
        for child in _children(todo.pop()):
            if child not in seen and child not in skip:
                seen.append(child)
                todo.append(child)
    return seen


class _TreeFreezer:
    """SIGSTOP/SIGCONT every process below the judge; freeze waits until every thread of them is stopped.

    Not a process group: a worker (or a process it forks) can leave its group with
    ``setsid``, and a sandbox's command runs in a session of its own. Every process the
    worker starts stays below the judge: the judge is its children's subreaper
    (:func:`_become_subreaper`), and inside a sandbox orphans go to the sandbox's own
    init, itself below the judge. The walk repeats until it finds no process it did not
    stop yet (a stopped process forks no more). The judge's children from before the worker
    (``skip``: a test's own helpers) are not the worker's and are left alone.
    """

    def __init__(self, worker_pid: int, root: int | None = None, skip: Sequence[int] = ()) -> None:
        self.pid = worker_pid
        self.root = os.getpid() if root is None else root
        self.skip = tuple(skip)
        self.stopped: list[int] = []
        self.last_wait_ns = 0

    def freeze(self, timeout_s: float = 2.0) -> bool:
        t0 = _clock()
        deadline = t0 + int(timeout_s * 1e9)
        self.stopped = []
        while True:
            new = [p for p in _descendants(self.root, self.skip) if p not in self.stopped]
            for p in new:
                try:
                    os.kill(p, signal.SIGSTOP)
                except (ProcessLookupError, PermissionError):
                    continue
                self.stopped.append(p)
            if new:
                continue
            if all(s in "TtZX" for p in self.stopped for s in _task_states(p)):
                self.last_wait_ns = _clock() - t0
                return True
            if _clock() > deadline:
                return False
            _time.sleep(0)

    def thaw(self) -> None:
        for p in self.stopped or _descendants(self.root, self.skip):
            try:
                os.kill(p, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass
        self.stopped = []


class _NoFreezer:
    last_wait_ns = 0

    def freeze(self, timeout_s: float = 2.0) -> bool:
        return True

    def thaw(self) -> None:
        pass


def _kill_tree(pid: int, skip: Sequence[int] = ()) -> None:
    """SIGKILL the spawned process's group and every process below the judge but ``skip``'s, and reap them."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in reversed(_descendants(os.getpid(), skip)):
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.waitpid(p, os.WNOHANG)  # orphans reparented to the judge are its to reap
        except ChildProcessError:
            pass


def _become_subreaper() -> bool:
    """Linux: orphans of the worker's processes become the judge's children, so none leaves the tree."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except Exception:
        return False


def harden_self() -> bool:
    """Linux: make this (judge) process non-dumpable, so same-uid processes cannot read its memory
    (``/proc/<judge>/mem``, ptrace). Processes with CAP_SYS_PTRACE still can: run the worker as
    another, unprivileged user (a sandbox in ``worker_argv_prefix``)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE, 0
    except Exception:
        return False


class _RefereeStop(Exception):
    """A decisive finding: the timing ends."""

    def __init__(self, finding: RefereeFinding) -> None:
        super().__init__(finding.line())
        self.finding = finding


def _compare(got: Any, exp: Any, atol: float, rtol: float) -> dict[str, Any] | None:
    """None when ``|got-exp| <= atol + rtol*|exp|`` everywhere (equal infinities match), else evidence.
    Host arrays, or device arrays compared on their device (only the counts come back)."""
    xp: Any = np
    if _on_device(got):
        xp = sys.modules["cupy"]
        exp = xp.asarray(exp)
    g = got.astype(xp.float64, copy=False) if got.dtype.kind != "c" else got
    e = exp.astype(xp.float64, copy=False) if exp.dtype.kind != "c" else exp
    with np.errstate(invalid="ignore", over="ignore"):
        diff = xp.abs(g - e)
        ok = diff <= atol + rtol * xp.abs(e)
        ok |= xp.isinf(g) & (g == e)
    bad = int(ok.size - int(xp.count_nonzero(ok)))
    if bad == 0:
        return None
    finite = xp.isfinite(diff)
    return {"mismatches": bad, "elements": int(ok.size),
            "nonfinite": int(xp.count_nonzero(~xp.isfinite(g))),
            "max_abs_err": float(diff[finite].max()) if bool(finite.any()) else None}


def _is_array(v: Any) -> bool:
    """A NumPy or CuPy array (a CuPy one only when CuPy is already imported: no import for a host case)."""
    if isinstance(v, np.ndarray):
        return True
    cp = sys.modules.get("cupy")
    return cp is not None and isinstance(v, cp.ndarray)


def _on_device(v: Any) -> bool:
    return _is_array(v) and not isinstance(v, np.ndarray)


def _host(v: Any) -> np.ndarray:
    """``v`` as a host array (a device array is copied)."""
    if _on_device(v):
        return v.get()
    return np.asarray(v)


def _scalar(v: Any) -> Any:
    if isinstance(v, np.generic):
        v = v.item()
    if v is None or isinstance(v, (bool, int, float, str)):
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError("non-finite scalar arguments cannot travel as JSON")
        return v
    raise TypeError(f"argument of type {type(v).__name__}: give arrays or JSON scalars")


class Judge:
    """The trusted process's handle on one worker. Use :meth:`start`, then :meth:`time`, then :meth:`close`."""

    def __init__(self, worker_argv_prefix: Sequence[str], src_dir: str | os.PathLike, module: str, function: str, *,
                 out_mode: str = "return", python: str = sys.executable, env: dict[str, str] | None = None,
                 freeze: bool = True, harden: bool = False, transcript: list[bytes] | None = None,
                 start_timeout_s: float = 60.0, worker_stdout: int | None = 2, backend: str = "auto") -> None:
        if out_mode not in protocol.OUT_MODES:
            raise ValueError(f"out_mode must be one of {protocol.OUT_MODES}")
        self.prefix = list(worker_argv_prefix)
        self.src_dir = str(Path(src_dir).resolve())
        self.module, self.function, self.out_mode = module, function, out_mode
        self.python = python
        self.env = dict(os.environ if env is None else env)
        self.env["PYTHONPATH"] = _ROOT + (os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self.freeze_worker = freeze
        self.transcript = transcript
        self.start_timeout_s = start_timeout_s
        self.worker_stdout = worker_stdout
        self.backend = backend
        self.hardened = harden_self() if harden else False
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.worker_pid: int | None = None  # as the worker reported it (informational)
        self.worker_host_pid: int | None = None  # the worker's pid in this namespace (credentials)
        self.worker_argv: list[str] = []
        self.loaded = False
        self._freezer: Any = _NoFreezer()
        self._finalizer: Any = None
        self._foreign: tuple[int, ...] = ()
        self._secret_seed: bytes | None = None  # this process only; kept for tests that look for leaks
        self.kernel_stamps = False
        self._arena: Any = None  # the arena of the timing in progress (a device one is fenced after each batch)
        self.last_wake_ns: int | None = None
        self.last_run_delay_ns = 0
        self.last_judge_delay_ns = 0

    # -- worker lifecycle ------------------------------------------------------------------------

    @classmethod
    def start(cls, worker_argv_prefix: Sequence[str] = (), src_dir: str | os.PathLike | None = None,
              module: str | None = None, function: str | None = None, **options: Any) -> Judge:
        """Spawn the worker (``[*worker_argv_prefix, python, -m, kz_runner.judge.serve_kernel, --sock-fd, N]``).

        The prefix is where a sandbox goes (e.g. ``["setpriv", "--reuid=nobody", ...]``); it
        must exec the worker in place (same pid) for the stop/continue bracketing to wait on it.
        """
        if src_dir is None or module is None or function is None:
            raise TypeError("Judge.start needs src_dir, module and function")
        judge = cls(worker_argv_prefix, src_dir, module, function, **options)
        try:
            judge._spawn()
        except _RefereeStop as stop:  # no submitted code has run yet: this is the setup failing
            judge.close()
            raise RuntimeError(f"the worker did not start: {stop.finding.line()}") from None
        return judge

    def _spawn(self) -> None:
        ours, theirs = protocol.channel_pair()
        self.kernel_stamps = protocol.enable_timestamps(ours)
        protocol.enable_credentials(ours)  # the kernel names the sender of "ready": the worker's pid here
        self.worker_argv = [*self.prefix, self.python, "-m", "kz_runner.judge.serve_kernel",
                            "--sock-fd", str(theirs.fileno())]
        if self.freeze_worker:
            _become_subreaper()
        self._foreign = tuple(_children(os.getpid()))  # the judge's own children (none in a benchmark)
        try:
            self.proc = subprocess.Popen(self.worker_argv, pass_fds=(theirs.fileno(),), start_new_session=True,
                                         env=self.env, stdin=subprocess.DEVNULL, stdout=self.worker_stdout,
                                         close_fds=True)
        finally:
            theirs.close()
        self.sock = ours
        self.loaded = False
        self._finalizer = weakref.finalize(self, _kill_tree, self.proc.pid, self._foreign)
        assert self.sock is not None
        try:
            ready, sender = protocol.recv_ready(self.sock, _time.monotonic() + self.start_timeout_s)
        except protocol.ChannelClosed as exc:
            raise _RefereeStop(self._crashed(str(exc))) from None
        except protocol.ChannelTimeout:
            self._kill()
            raise _RefereeStop(RefereeFinding(WORKER_TIMEOUT, "the worker did not start before the deadline; it was killed")) from None
        except protocol.JudgeProtocolError as exc:
            self._kill()
            raise _RefereeStop(RefereeFinding(PROTOCOL_ERROR, str(exc)[:500])) from None
        self.worker_pid = protocol.check_ready(ready)  # in the worker's own pid namespace (informational)
        # The pid the kernel vouches for, in this process's pid namespace (a sandbox's worker has another
        # pid in its own); without credentials, the spawned process itself (no sandbox prefix).
        self.worker_host_pid = sender if sender is not None else self.proc.pid
        self._freezer = (_TreeFreezer(self.worker_host_pid, skip=self._foreign) if self.freeze_worker
                         else _NoFreezer())
        if not self._freezer.freeze():
            self._unstoppable()

    def close(self) -> None:
        """Ask the worker to exit; kill its process group after a second."""
        proc, sock = self.proc, self.sock
        self.proc = self.sock = None
        if proc is None:
            return
        try:
            self._freezer.thaw()
            if sock is not None and proc.poll() is None:
                protocol.send(sock, {"op": "exit"})
            proc.wait(timeout=1.0)
        except (OSError, subprocess.TimeoutExpired):
            pass
        _kill_tree(proc.pid, self._foreign)
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        if sock is not None:
            sock.close()
        if self._finalizer is not None:
            self._finalizer.detach()

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _kill(self) -> None:
        if self.proc is not None:
            _kill_tree(self.proc.pid, self._foreign)

    # -- messages --------------------------------------------------------------------------------

    def _send_frame(self, frame: bytes) -> None:
        assert self.sock is not None
        if self.transcript is not None:
            self.transcript.append(frame)
        self.sock.sendall(frame)

    def _recv(self, deadline: float | None) -> dict[str, Any]:
        return self._recv_stamped(deadline)[0]

    def _recv_stamped(self, deadline: float | None) -> tuple[dict[str, Any], int | None]:
        assert self.sock is not None
        try:
            return protocol.recv_stamped(self.sock, deadline)
        except protocol.ChannelClosed as exc:
            raise _RefereeStop(self._crashed(str(exc))) from None
        except protocol.ChannelTimeout:
            self._kill()
            raise _RefereeStop(RefereeFinding(WORKER_TIMEOUT, "no reply before the deadline; the worker was killed")) from None
        except protocol.JudgeProtocolError as exc:
            self._kill()
            raise _RefereeStop(RefereeFinding(PROTOCOL_ERROR, str(exc)[:500])) from None

    def _unstoppable(self) -> None:
        """A worker process that did not stop in time could run outside the judge's clock: the timing ends."""
        self._kill()
        raise _RefereeStop(RefereeFinding(WORKER_TIMEOUT, "the worker's processes did not all stop within 2 s between batches "
                                            "(they could have run outside the judge's clock); the worker was killed"))

    def _crashed(self, why: str) -> RefereeFinding:
        rc = None
        if self.proc is not None:
            try:
                rc = self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self._kill()
        how = f"exit status {rc}" if rc is not None and rc >= 0 else (
            f"signal {signal.Signals(-rc).name}" if rc is not None else "still running; killed")
        return RefereeFinding(WORKER_CRASHED, f"the worker closed the channel ({why}; {how})", {"returncode": rc})

    def _expect_ok(self, deadline: float) -> None:
        reply = self._recv(deadline)
        if reply["op"] == "ok":
            return
        self._worker_error(reply)

    def _worker_error(self, reply: dict[str, Any]) -> None:
        if reply.get("op") != "error":
            self._kill()
            raise _RefereeStop(RefereeFinding(PROTOCOL_ERROR, f"unexpected reply {str(reply.get('op'))[:40]!r}"))
        try:
            code, message, call_id = protocol.check_error(reply)
        except protocol.JudgeProtocolError as exc:
            self._kill()
            raise _RefereeStop(RefereeFinding(PROTOCOL_ERROR, str(exc))) from None
        finding_code = BAD_OUTPUT if code == "BAD_OUTPUT" else WORKER_ERROR
        raise _RefereeStop(RefereeFinding(finding_code, f"{code}: {message}", {"worker_code": code, "call_id": call_id}))

    def _run_batch(self, frame: bytes, call_ids: list[int], deadline_s: float,
                   outs: Sequence[Sequence[str]] = ()) -> tuple[int, list[int]]:
        """Thaw, send, receive, (device) fence, freeze: the judge's wall (ns) around the batch, and the worker's times.

        The wall ends at the kernel's timestamp of the reply (when the worker queued it), not when this
        process was next scheduled: on a loaded 2-core VM the judge's own wake-up took 0.1 ms at the
        median and 5 ms at p90, noise the worker would otherwise be blamed for. The stamp is realtime;
        it is mapped onto this clock and used only when it falls inside [t0, received].

        On a device arena the reply does not end the batch: GPU work the worker queued may still be
        running. Right after the reply the judge counts the poison left in the batch's outputs (its
        own reduction, in its own context) and the wall runs on until that count is back: work the
        worker left running is inside the wall, and poison left in a floating-point output is a
        finding (still decreasing a moment later: ``TIMER_TAMPERED``; unchanged: ``WRONG_OUTPUT``).
        """
        pid = self.worker_host_pid or 0
        waited = _run_delay_ns(pid)
        judge_waited = _own_run_delay_ns()
        offset = _time.time_ns() - _clock()
        fenced = outs and self._arena is not None and self._arena.backend == "cuda_ipc"
        names = [n for call in outs for n in call] if fenced else []
        left: list[int] = []
        fence_ns = 0
        reply: dict[str, Any] | None = None
        t0 = _clock()
        self._freezer.thaw()
        self._send_frame(frame)
        try:
            reply, stamp = self._recv_stamped(_time.monotonic() + deadline_s)
        finally:
            t1 = _clock()
            if fenced and reply is not None and reply.get("op") == "done":
                left = self._arena.unwritten(names)
                fence_ns = _clock() - t1
            # Read before the stop: a SIGSTOP wakes the worker, which may queue for a CPU to take it.
            self.last_run_delay_ns = max(0, _run_delay_ns(pid) - waited)
            self.last_judge_delay_ns = max(0, _own_run_delay_ns() - judge_waited)
            stopped = self._freezer.freeze()
        if not stopped:
            self._unstoppable()
        self.last_wake_ns = None
        if stamp is not None and t0 <= stamp - offset <= t1:
            self.last_wake_ns = t1 - (stamp - offset)
            t1 = stamp - offset
        if reply["op"] != "done":
            self._worker_error(reply)
        try:
            times = protocol.check_done(reply, call_ids)
        except protocol.JudgeProtocolError as exc:
            self._kill()
            raise _RefereeStop(RefereeFinding(PROTOCOL_ERROR, str(exc))) from None
        self._check_fence(names, left)
        return t1 - t0 + fence_ns, times

    def _check_fence(self, names: list[str], left: list[int]) -> None:
        """A finding when a floating-point output still held poison at the device fence."""
        from kz_runner.judge.gpu_arena import poison_decides

        specs = self._arena.layout.specs if names else {}
        bad = [(n, c) for n, c in zip(names, left) if c and poison_decides(specs[n].dtype)]
        if not bad:
            return
        _time.sleep(0.002)
        again = self._arena.unwritten([n for n, _ in bad])
        moved = [(n, c, c2) for (n, c), c2 in zip(bad, again) if c2 != c]
        evidence = {"outputs": len(bad), "first": bad[0][0], "poison_words": bad[0][1],
                    "poison_words_later": again[0]}
        if moved:
            raise _RefereeStop(RefereeFinding(TIMER_TAMPERED, f"{len(moved)} of the batch's outputs were still being written after "
                                                f"the worker reported the batch done: GPU work left running past "
                                                f"the reply", evidence))
        raise _RefereeStop(RefereeFinding(WRONG_OUTPUT, f"{len(bad)} of the batch's outputs were never (wholly) written",
                            evidence))

    # -- timing ----------------------------------------------------------------------------------

    def time(self, inputs_fn: Callable[[np.random.Generator], Sequence[Any]], reference_fn: Callable[..., Any], *,
             atol: float, rtol: float, calls: int = 64, batch: int | None = None, max_batch: int = 1024,
             target_batch_s: float = 0.02, min_batches: int = 8, compare_per_batch: int = 2, warmup_batches: int = 1,
             calibration_batches: int = 12, calibration_budget_s: float = 0.5, tol: float = 0.10,
             slack_floor_ns: int = 100_000, overhead_share: float = 0.25, max_hidden_share: float = 0.5,
             max_bad_share: float = 0.4,
             timeout_s: float | None = None, first_call_timeout_s: float = 120.0, arena_max_bytes: int = 256 << 20,
             budget_s: float | None = None, target_rse: float | None = None,
             first_inputs: Sequence[Any] | None = None, first_expected: Any = None,
             max_batches: int = 400) -> JudgeResult:
        """Time the kernel on fresh inputs; see the module docstring. Never raises for the worker's misdeeds:
        they are findings in the result.

        ``first_inputs``: one call on these inputs right after the load, before any drawn
        input (the case's own inputs: the benchmark checks its output, kept in
        ``result.first_output``). With ``first_expected`` (its outputs) the judge compares it
        too, and when it is wrong no later call is compared: the case has failed already and
        is only timed. ``target_rse``: stop once ``min_batches`` and ``calls`` are reached and
        the relative standard error of the batch means is under it (``budget_s`` still bounds)."""
        started = _clock()
        result = JudgeResult()
        # The secret: never sent, never written to the arena, never in argv or env.
        self._secret_seed = os.urandom(32)
        master = np.random.Generator(np.random.PCG64(int.from_bytes(self._secret_seed, "little")))

        def call_rng(seed: int) -> np.random.Generator:
            return np.random.Generator(np.random.PCG64(seed))

        # 1. Probe: argument shapes, output shapes, determinism of inputs_fn.
        probe_seed = int(master.bit_generator.random_raw())
        args0 = tuple(inputs_fn(call_rng(probe_seed)))
        t_gen = _clock()
        again = tuple(inputs_fn(call_rng(probe_seed)))
        gen_ns = _clock() - t_gen  # the judge's preparation per call: the worker idles this long per call
        kinds: list[tuple[Any, ...]] = []  # per argument: ("a", shape, dtype) or ("v",)
        for a, b in zip(args0, again):
            if _is_array(a):
                if not (_is_array(b) and a.shape == b.shape and a.dtype == b.dtype
                        and np.array_equal(_host(a), _host(b), equal_nan=a.dtype.kind in "fc")):
                    raise ValueError("inputs_fn must be a pure function of its generator")
                kinds.append(("a", a.shape, a.dtype))
            else:
                if _scalar(a) != _scalar(b):
                    raise ValueError("inputs_fn must be a pure function of its generator")
                kinds.append(("v",))
        ref0 = reference_fn(*args0)
        refs0 = list(ref0) if isinstance(ref0, (tuple, list)) else [ref0]
        out_specs = [(tuple(r.shape), np.dtype(r.dtype)) if _is_array(r) else (np.asarray(r).shape, np.asarray(r).dtype)
                     for r in refs0]
        on_gpu = any(_on_device(a) for a in args0)
        per_call = sum(-(-max(int(np.prod(k[1])) * k[2].itemsize, 1) // shm.ALIGN) * shm.ALIGN
                       for k in kinds if k[0] == "a")
        per_call += sum(-(-max(int(np.prod(s)) * d.itemsize, 1) // shm.ALIGN) * shm.ALIGN for s, d in out_specs)
        slots = max(1, min(batch or max_batch, arena_max_bytes // max(per_call, 1)))
        # One batch is one message: what a call adds to it (its id, argument refs or values, outputs), at most.
        sample = [f"s{max_batch}.a{j}" if k[0] == "a" else {"v": _scalar(a)} for j, (k, a) in enumerate(zip(kinds, args0))]
        call_bytes = len(json.dumps([max_batch * 1000, sample, [f"s{max_batch}.o{k}" for k in range(len(out_specs))]]))
        # ... and the layout message names every slot's arrays.
        shapes = [k[1] for k in kinds if k[0] == "a"] + [sh for sh, _ in out_specs]
        slot_bytes = sum(len(json.dumps({"name": f"s{max_batch}.o9", "offset": arena_max_bytes, "dtype": "<c16",
                                         "shape": list(sh)})) + 2 for sh in shapes)
        slots = max(1, min(slots, (protocol.MAX_MESSAGE - 256) // (max(call_bytes, slot_bytes) + 2)))

        # 2. Arena and a fresh worker.
        layout = shm.Layout()
        arg_names = [[f"s{s}.a{j}" for j, k in enumerate(kinds) if k[0] == "a"] for s in range(slots)]
        out_names = [[f"s{s}.o{k}" for k in range(len(out_specs))] for s in range(slots)]
        for s in range(slots):
            for name, k in zip(arg_names[s], [k for k in kinds if k[0] == "a"]):
                layout.add(name, k[1], k[2])
            for name, (shape, dtype) in zip(out_names[s], out_specs):
                layout.add(name, shape, dtype)
        arena: Any
        if on_gpu:
            from kz_runner.judge.gpu_arena import GpuArena

            arena = GpuArena(layout)
        else:
            arena = shm.Arena(layout, backend=self.backend)
        try:
            if self.proc is None or self.loaded or self.proc.poll() is not None:
                self.close()
                self._spawn()
            self._time(result, arena, master, call_rng, inputs_fn, reference_fn, kinds, out_specs, arg_names,
                       out_names, slots, gen_ns, atol=atol, rtol=rtol, calls=calls, batch=batch,
                       target_batch_s=target_batch_s, min_batches=min_batches, compare_per_batch=compare_per_batch,
                       warmup_batches=warmup_batches, calibration_batches=calibration_batches,
                       calibration_budget_s=calibration_budget_s, tol=tol,
                       slack_floor_ns=slack_floor_ns, overhead_share=overhead_share,
                       max_hidden_share=max_hidden_share, max_bad_share=max_bad_share,
                       timeout_s=timeout_s, first_call_timeout_s=first_call_timeout_s, budget_s=budget_s,
                       target_rse=target_rse, first_inputs=first_inputs, first_expected=first_expected,
                       max_batches=max_batches)
        except _RefereeStop as stop:
            result.findings.append(stop.finding)
        finally:
            self.close()  # a loaded worker is never reused
            arena.close()
        _summarize(result)
        result.elapsed_s = (_clock() - started) / 1e9
        return result

    def _time(self, result: JudgeResult, arena: Any, master: np.random.Generator, call_rng: Callable,
              inputs_fn: Callable, reference_fn: Callable, kinds: list, out_specs: list, arg_names: list,
              out_names: list, slots: int, gen_ns: int, *, atol: float, rtol: float, calls: int,
              batch: int | None, target_batch_s: float, min_batches: int, compare_per_batch: int, warmup_batches: int,
              calibration_batches: int, calibration_budget_s: float, tol: float, slack_floor_ns: int,
              overhead_share: float, max_hidden_share: float, max_bad_share: float,
              timeout_s: float | None, first_call_timeout_s: float, budget_s: float | None,
              target_rse: float | None = None, first_inputs: Sequence[Any] | None = None,
              first_expected: Any = None, max_batches: int = 400) -> None:
        arena_desc = arena.describe()
        self._arena = arena
        self._freezer.thaw()
        self._send_frame(protocol.encode(protocol.layout(arena.layout.to_json(), self.out_mode, arena_desc)))
        if arena.fd is not None:
            protocol.send_fd(self.sock, arena.fd)  # type: ignore[arg-type]
        self._expect_ok(_time.monotonic() + self.start_timeout_s)
        if not self._freezer.freeze():
            self._unstoppable()
        next_id = [0]

        def frame_for(fn: str, n: int, values: list[list[Any]] | None) -> tuple[bytes, list[int]]:
            ids = list(range(next_id[0], next_id[0] + n))
            next_id[0] += n
            args = []
            for s in range(n):
                refs, names = [], iter(arg_names[s])
                for j, k in enumerate(kinds):
                    refs.append(next(names) if k[0] == "a" else {"v": values[s][j] if values else None})
                args.append(refs)
            return protocol.encode(protocol.batch(fn, ids, args, out_names[:n])), ids

        # 3. Calibration (before the submitter's module exists in the worker). Each no-op batch follows an
        # idle gap as long as the judge's preparation of a real batch of that size (a worker woken after a
        # longer idle wakes slower: on a 2-vCPU VM ~80 us after no gap, ~300 us after 5 ms), and its
        # outputs are poisoned first, as for a real batch (the copies into them then cost the same).
        on_device = arena.backend == "cuda_ipc"
        prep_cal: list[int] = []  # device: the judge's idle probe before each batch, before the kernel was loaded
        prep_timed: list[int] = []  # ... and before each batch after it was

        def prepare(n: int, fixed: Sequence[Any] | None) -> tuple[list[int], list[list[Any]]]:
            """Draw ``n`` calls' inputs into their slots, poison their outputs: (per-call seeds, scalar values)."""
            seeds = [int(master.bit_generator.random_raw()) for _ in range(n)]
            values: list[list[Any]] = []
            for s, seed in enumerate(seeds):
                args = tuple(fixed) if fixed is not None else tuple(inputs_fn(call_rng(seed)))
                row: list[Any] = []
                names = iter(arg_names[s])
                for a, k in zip(args, kinds):
                    if k[0] == "a":
                        if not (_is_array(a) and a.shape == k[1] and a.dtype == k[2]):
                            raise ValueError("inputs_fn changed an argument's type, shape or dtype between calls")
                        arena.put(next(names), a)
                        row.append(None)
                    else:
                        row.append(_scalar(a))
                values.append(row)
                for name in out_names[s]:
                    arena.poison(name)
            arena.sync()  # the inputs are in place before the worker runs
            return seeds, values

        sizes = sorted({1, slots})
        residual: dict[int, list[int]] = {b: [] for b in sizes}
        cal_ns = 0
        rounds = max(3, calibration_batches)
        r = 0
        while r < rounds:
            for b in sizes:
                if on_device:  # a real preparation, as before a real batch
                    prep_cal.append(arena.idle_probe_ns())
                    prepare(b, None)
                else:
                    gap_end = _clock() + min(gen_ns * b, 20_000_000)
                    for names in out_names[:b]:  # as before a real batch: the outputs just written by the judge
                        for name in names:
                            arena.poison(name)
                    while _clock() < gap_end:
                        pass
                frame, ids = frame_for("noop", b, None)
                wall, times = self._run_batch(frame, ids, 10.0, out_names[:b])
                residual[b].append(wall - sum(times))
                cal_ns += wall + min(gen_ns * b, 20_000_000)
            r += 1
            if r == 1:  # as many rounds as the budget pays for, at least 3
                rounds = max(3, min(calibration_batches, int(calibration_budget_s * 1e9 // max(cal_ns, 1))))
        # The lower quartile: load only ever adds to a residual, and an overestimate is room to hide time in.
        o = {b: float(np.percentile(residual[b], 25)) for b in sizes}
        o1 = o[1]
        per_call_o = max(0.0, (o[slots] - o1) / (slots - 1)) if slots > 1 else 0.0

        def overhead(b: int) -> float:
            return o1 + per_call_o * (b - 1)

        # The noise is heavy-tailed (a preempted gap costs milliseconds); the slack follows its body (MAD),
        # the tail is what max_bad_share absorbs.
        mad = {b: 1.4826 * float(np.median(np.abs(np.asarray(residual[b]) - o[b]))) for b in sizes}

        def slack_for(b: int) -> float:
            # The body of the calibration's noise, plus a share of the overhead itself: the no-op's copies
            # and lookups run with warm caches, a kernel's leave them cold (an honest out= axpy of 64 Ki
            # floats showed 1.2 ms of gaps per 341 calls against 0.8 ms calibrated).
            sigma = mad[1] + ((mad[slots] - mad[1]) * (b - 1) / (slots - 1) if slots > 1 else 0.0)
            return max(float(slack_floor_ns), 3.0 * sigma) + overhead_share * overhead(b)

        self._calibration = residual  # kept for inspection
        result.overhead = {"o1_ns": o1, "per_call_ns": per_call_o, "tol": tol, "calibration_rounds": float(rounds),
                           "sigma1_ns": mad[1], "sigma_slots_ns": mad[slots], "slots": float(slots),
                           "gen_ns": float(gen_ns)}

        # 4. Load the kernel, then warm up (every warm-up call compared).
        self._freezer.thaw()
        self._send_frame(protocol.encode(protocol.load(self.module, self.function, self.src_dir)))
        self._expect_ok(_time.monotonic() + first_call_timeout_s)
        if not self._freezer.freeze():
            self._unstoppable()
        self.loaded = True

        checking = {"on": True}  # off once the first call on the case's inputs was wrong

        def run(n: int, k_compare: int | None, deadline_s: float,
                fixed: Sequence[Any] | None = None) -> tuple[int, list[int], int]:
            if on_device:
                prep_timed.append(arena.idle_probe_ns())
            seeds, values = prepare(n, fixed)
            frame, ids = frame_for("kernel", n, values)
            wall, times = self._run_batch(frame, ids, deadline_s, out_names[:n])
            if fixed is not None or not checking["on"] or k_compare == 0:
                return wall, times, 0
            # Chosen now, after the reply, with the secret generator: the worker could not know.
            picks = range(n) if k_compare is None else master.choice(n, size=min(k_compare, n), replace=False)
            for i in sorted(int(p) for p in picks):
                got = [arena.copy(name) for name in out_names[i]]  # worker stopped; copy anyway
                args = tuple(inputs_fn(call_rng(seeds[i])))  # private regeneration, never the arena's copy
                exp = reference_fn(*args)
                exps = list(exp) if isinstance(exp, (tuple, list)) else [exp]
                for k, (g, e) in enumerate(zip(got, exps)):
                    bad = _compare(g, e if on_device else _host(e), atol, rtol)
                    if bad is not None:
                        raise _RefereeStop(RefereeFinding(WRONG_OUTPUT, f"call {ids[i]} (position {i} of a batch of {n}), "
                                                          f"output {k}: {bad['mismatches']} of {bad['elements']} "
                                                          f"elements outside atol {atol:g} + rtol {rtol:g}",
                                            {**bad, "call_id": ids[i], "position": i, "batch": n}))
            return wall, times, len(picks)

        if first_inputs is not None:  # the case's own inputs, first: the benchmark's correctness check
            run(1, None, first_call_timeout_s, fixed=first_inputs)
            result.first_output = [arena.copy(name) for name in out_names[0]]
            if first_expected is not None:
                exps = list(first_expected) if isinstance(first_expected, (tuple, list)) else [first_expected]
                checking["on"] = all(_compare(g, e if on_device else _host(e), atol, rtol) is None
                                     for g, e in zip(result.first_output, exps))
                result.first_passed = checking["on"]
        run(1, None, first_call_timeout_s)  # the first drawn call: imports, JIT, first touch
        wall1 = min(run(1, None, first_call_timeout_s)[0] for _ in range(3))
        est_call = max(wall1 - overhead(1), 1_000.0)
        b = min(batch, slots) if batch is not None else max(1, min(math.ceil(target_batch_s * 1e9 / est_call), slots))
        for _ in range(max(0, warmup_batches)):  # touches every slot the timed batches use
            wall, _, _ = run(b, None, first_call_timeout_s)
            est_call = max((wall - overhead(b)) / b, 1_000.0)
        result.batch_size = b
        slack = slack_for(b)
        result.overhead.update({"batch_overhead_ns": overhead(b), "slack_ns": slack})

        # 5. Timed batches: at least min_batches, at least `calls` calls.
        deadline_s = timeout_s if timeout_s is not None else max(5.0, 50.0 * (overhead(b) + b * est_call) / 1e9)
        # With a target the batches go on until it is met or the budget is spent (max_batches at most).
        n_batches = max(min_batches, math.ceil(calls / b))
        if target_rse is not None:
            n_batches = max(n_batches, max_batches)
        result.stop_reason = "batches"
        timed_ns = 0
        wakes: list[int] = []  # the judge's own wake-up after each reply, kept out of the walls
        for i in range(n_batches):
            wall, times, compared = run(b, compare_per_batch, deadline_s)
            if self.last_wake_ns is not None:
                wakes.append(self.last_wake_ns)
            result.run_delays_ns.append(self.last_run_delay_ns)
            result.judge_delays_ns.append(self.last_judge_delay_ns)
            result.walls_ns.append(wall)
            result.sums_ns.append(sum(times))
            result.times_ns.extend(times)
            result.compared += compared
            timed_ns += wall
            if i + 1 < min_batches or (i + 1) * b < calls:
                continue
            if budget_s is not None and timed_ns > budget_s * 1e9:
                result.stop_reason = "budget"
                break
            if target_rse is not None and i + 1 >= 2:
                means: np.ndarray | list[float]  # a list of floats in step 6
                means = np.asarray(result.sums_ns, dtype=np.float64) / b
                mean = float(means.mean())
                if mean > 0 and float(means.std(ddof=1)) / math.sqrt(len(means)) / mean <= target_rse:
                    result.stop_reason = "target_rse"
                    break
        result.timed_wall_s = timed_ns / 1e9
        result.overhead["freeze_wait_ns"] = float(self._freezer.last_wait_ns)
        result.overhead["kernel_stamped_batches"] = float(len(wakes))
        if wakes:
            result.overhead["judge_wake_p50_ns"] = float(np.median(wakes))
            result.overhead["judge_wake_max_ns"] = float(max(wakes))

        # 5b. Device: the worker's process is stopped between batches, its GPU work must be too. Work it
        # left running (a persistent kernel computing ahead on the inputs the judge writes) holds the GPU,
        # and the judge's context then waits for a time slice: a one-element kernel of the judge's, timed
        # on its own clock before each batch, takes milliseconds instead of microseconds (17 us idle, 2.4 ms
        # against a spinning kernel of another process, on an H200; CUDA events of the judge's stream do
        # not see the wait).
        if on_device and prep_cal and prep_timed:
            base = float(np.median(prep_cal))
            slow = [ns for ns in prep_timed if ns > DEVICE_PROBE_FACTOR * base + DEVICE_PROBE_SLACK_NS]
            result.overhead.update({"idle_probe_cal_ns": base, "idle_probe_ns": float(np.median(prep_timed))})
            if len(slow) > max_bad_share * len(prep_timed):
                raise _RefereeStop(RefereeFinding(TIMER_TAMPERED, f"the GPU was busy while the worker was stopped: the judge's "
                                                    f"idle probe took {np.median(prep_timed) / 1e3:.0f} us against "
                                                    f"{base / 1e3:.0f} us before the kernel was loaded (GPU work "
                                                    f"left running outside the timed batches)",
                                    {"idle_probe_cal_ns": round(base), "idle_probe_ns": round(np.median(prep_timed)),
                                     "slow_batches": len(slow), "batches": len(prep_timed)}))

        # 6. The worker's clock against the judge's.
        # A shortfall within this much of the floor is excused (busy, never clean): the no-op's overhead is
        # measured warm and on a quiet moment, and with calls of a few microseconds the kernel's own loop
        # overhead (cold caches, a loaded host slowing the copies) can be up to twice it, plus noise.
        excuse = overhead(b) + (slack - overhead_share * overhead(b))
        if on_device:
            # On a device the calls' time is GPU time (events), which host load does not stretch, and the
            # loop's overhead is the copies and the fence, measured with the same sizes: only the slack.
            excuse = slack
        result.overhead["excuse_ns"] = excuse
        under: list[int]
        busy: list[int]
        over, under, busy = [], [], []
        for j, (w, s, rd, jd) in enumerate(zip(result.walls_ns, result.sums_ns, result.run_delays_ns,
                                               result.judge_delays_ns)):
            net = w - overhead(b)
            floor = max(net * (1 - tol) - slack, net * (1 - max_hidden_share))
            if s > w:
                over.append(j)
            elif s < floor:
                # Unaccounted time that the worker or the judge spent waiting for a CPU is load, and so is a
                # shortfall within the overhead's own uncertainty. Such a batch proves nothing either way: it
                # is left out of the headline, and too many of them void the timing (never a pass).
                (busy if rd + jd + excuse >= floor - s else under).append(j)
        nb = len(result.walls_ns)
        result.clean = [j not in over and j not in under and j not in busy for j in range(nb)]
        means = [s / b for s in result.sums_ns]
        med_call = float(np.median(result.times_ns))
        med_mean = float(np.median(means))
        evidence = {"batches": nb, "over": over[:20], "under": under[:20], "busy": busy[:20],
                    "overhead_ns": round(overhead(b)), "slack_ns": round(slack), "tol": tol,
                    "walls_ns": result.walls_ns[:20], "sums_ns": result.sums_ns[:20],
                    "run_delays_ns": result.run_delays_ns[:20], "judge_delays_ns": result.judge_delays_ns[:20],
                    "excuse_ns": round(excuse)}
        if over:
            result.findings.append(RefereeFinding(TIMER_TAMPERED, f"{len(over)} of {nb} batches report more time than "
                                                            f"the judge's wall clock saw", evidence))
        elif len(under) > max_bad_share * nb:
            w = sum(result.walls_ns[j] for j in under)
            s = sum(result.sums_ns[j] for j in under)
            result.findings.append(RefereeFinding(
                TIMER_TAMPERED, f"{len(under)} of {nb} batches report under (1-{tol:g})*(wall-overhead)-slack: "
                                f"{s / 1e6:.3f} ms reported against {w / 1e6:.3f} ms of judge wall", evidence))
        elif len(under) + len(busy) > max_bad_share * nb and result.first_passed is not False:
            # (a case whose first output is wrong has its verdict: a void timing must not turn it into a job
            # given back to the queue, or a wrong kernel that loads the host with its own threads would end
            # ATTEMPTS_EXHAUSTED, never rejected)
            result.findings.append(RefereeFinding(
                MACHINE_BUSY, f"{len(busy) + len(under)} of {nb} batches outside the tolerance, {len(busy)} of "
                              f"them explained by the worker waiting for a CPU; re-run on a quieter machine",
                evidence))
        # Not a finding: under load honest per-call times are heavy-tailed (median 41 us against batch means of
        # 87 us for an out= axpy on a busy 2-core VM), so the ratio cannot tell forgery from preemption.
        result.skew = med_call / med_mean if med_mean > 0 else math.nan


def _summarize(r: JudgeResult) -> None:
    r.n = len(r.times_ns)
    if r.n:
        t = np.asarray(r.times_ns, dtype=np.float64)
        r.median_ns, r.mean_ns = float(np.median(t)), float(t.mean())
        r.p10_ns, r.p90_ns = float(np.percentile(t, 10)), float(np.percentile(t, 90))
        r.min_ns, r.max_ns = float(t.min()), float(t.max())
    if r.sums_ns and r.batch_size:
        r.batch_means_ns = [s / r.batch_size for s in r.sums_ns]
        clean = [m for m, ok in zip(r.batch_means_ns, r.clean) if ok] or r.batch_means_ns
        r.batch_mean_median_ns = float(np.median(clean))

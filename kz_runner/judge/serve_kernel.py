"""The worker that serves the kernel: ``python -m kz_runner.judge.serve_kernel --sock-fd N``.

The only process that imports the submitter's code. It serves the judge's
messages (:mod:`kz_runner.judge.protocol`) over the inherited socket: ``layout``
(NumPy views over the judge's arena, whose memfd follows the message as
SCM_RIGHTS ancillary data), ``load`` (import ``function`` from
``module`` under ``src_dir``), ``batch`` (call the kernel, or the built-in no-op
the judge calibrates with, once per call on that call's own input and output
slots, timing each call with ``time.perf_counter_ns``) and ``exit``.

Nothing here is trusted after ``load``: the judge checks what this process
reports. The code is kept plain and honest; it makes no attempt to defend
itself against the kernel it runs.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from kz_runner.judge import protocol, shm


class CallError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _die_with_parent() -> None:
    """Linux: SIGKILL when the judge goes away (also reaches the worker while it is stopped)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _deliver(returned: Any, outs: list[Any], xp: Any = np) -> None:
    """Copy a returned array (or tuple of arrays) into the call's output slots; exact shape and dtype.
    On a device arena (``xp`` is CuPy) the copy is queued on the current stream, after the call's
    end event: outside the call's time, inside the judge's wall."""
    got = list(returned) if isinstance(returned, (tuple, list)) and len(outs) > 1 else [returned]
    if len(got) != len(outs):
        raise CallError("BAD_OUTPUT", f"returned {len(got)} outputs, expected {len(outs)}")
    for r, o in zip(got, outs):
        if not isinstance(r, xp.ndarray):
            raise CallError("BAD_OUTPUT", f"returned {type(r).__name__}, expected {xp.__name__}.ndarray")
        if r.shape != o.shape or r.dtype != o.dtype:
            raise CallError("BAD_OUTPUT", f"returned {r.dtype}{list(r.shape)}, expected {o.dtype}{list(o.shape)}")
        xp.copyto(o, r, casting="no")


class Worker:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf: Any = None
        self.views: dict[str, np.ndarray] = {}
        self.out_mode = "return"
        self.kernel: Callable | None = None
        self._noop_returns: dict[tuple, Any] = {}
        self.xp: Any = np  # CuPy on a device arena
        self._events: list[tuple[Any, Any]] = []  # a device arena's (start, end) event per call slot

    # -- messages ----------------------------------------------------------------------

    def on_layout(self, msg: dict[str, Any]) -> None:
        arena = msg["arena"]
        if arena.get("cuda_ipc"):
            self._device_layout(msg)
            return
        if arena.get("fd"):
            _, fds, _, _ = socket.recv_fds(self.sock, 1, 1)  # the carrier byte right after the frame
            if len(fds) != 1:
                raise CallError("BAD_REQUEST", "layout without the arena's fd")
            fd = fds[0]
            self.buf = shm.attach(fd=fd, size=int(arena["size"]))
            os.close(fd)
        else:
            self.buf = shm.attach(name=str(arena["name"]), size=int(arena["size"]))
        self._noop_returns.clear()
        specs = [shm.ArraySpec.from_json(d) for d in msg["arrays"]]
        self.views = {s.name: shm.view(self.buf, s) for s in specs}
        if msg.get("out_mode") not in protocol.OUT_MODES:
            raise CallError("BAD_REQUEST", f"unknown out_mode {msg.get('out_mode')!r}")
        self.out_mode = msg["out_mode"]

    def _device_layout(self, msg: dict[str, Any]) -> None:
        """Views over the judge's device block, mapped by its CUDA IPC handle (CuPy imported here, before
        any submitted code: the worker's own calls to it are made before ``load``)."""
        from kz_runner.judge import gpu_arena

        arena = msg["arena"]
        size = int(arena["size"])
        try:
            base = gpu_arena.attach(str(arena["cuda_ipc"]), size, int(arena.get("device", 0)))
        except Exception as exc:  # noqa: BLE001 - reported to the judge as a bad request
            raise CallError("BAD_REQUEST", f"could not map the judge's device arena: {exc}") from None
        import cupy

        self.xp = cupy
        self.buf = base
        self._noop_returns.clear()
        specs = [shm.ArraySpec.from_json(d) for d in msg["arrays"]]
        self.views = {s.name: gpu_arena.device_view(base, s, size) for s in specs}
        if msg.get("out_mode") not in protocol.OUT_MODES:
            raise CallError("BAD_REQUEST", f"unknown out_mode {msg.get('out_mode')!r}")
        self.out_mode = msg["out_mode"]
        slots = sum(1 for s in specs if s.name.endswith(".o0"))
        self._events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(max(1, slots))]

    def on_load(self, msg: dict[str, Any]) -> None:
        try:
            src_dir = str(msg["src_dir"])
            if src_dir not in sys.path:
                sys.path.insert(0, src_dir)
            module = importlib.import_module(str(msg["module"]))
            fn = getattr(module, str(msg["function"]))
            if not callable(fn):
                raise TypeError(f"{msg['module']}.{msg['function']} is not callable")
        except BaseException as exc:  # noqa: BLE001 - any failure of the submitter's import is reported
            if isinstance(exc, (KeyboardInterrupt,)):
                raise
            raise CallError("LOAD_FAILED", _describe(exc)) from None
        self.kernel = fn

    def _noop(self, outs: list[np.ndarray]) -> Callable:
        """The calibration function. It writes its outputs as a kernel would (inside the timed interval,
        so it costs nothing in the judge's residual ``W - S``) and leaves the caches as a kernel leaves
        them for the steps between calls: return mode returns arrays of its own, just written."""
        if self.out_mode != "return":
            def write_outs(*args: Any, out: Any = None) -> None:
                for o in outs:
                    o.fill(0)
            return write_outs
        key = tuple((o.shape, o.dtype.str) for o in outs)
        ret = self._noop_returns.get(key)
        if ret is None:
            ret = tuple(self.xp.zeros_like(o) for o in outs)
            self._noop_returns[key] = ret
        value = ret[0] if len(ret) == 1 else ret

        def written(*args: Any) -> Any:
            for r in ret:
                r.fill(0)
            return value
        return written

    def on_batch(self, msg: dict[str, Any]) -> list[int]:
        call_ids, all_args, all_outs = msg["call_ids"], msg["args"], msg["outs"]
        use_noop = msg.get("fn") == "noop"
        if not use_noop and self.kernel is None:
            raise CallError("BAD_REQUEST", "batch before load")
        views, mode = self.views, self.out_mode
        calls = []  # resolved before the first call: the loop between timed calls stays short
        fn: Any  # the kernel (not None past the check above) or the no-op
        try:
            for refs, out_names in zip(all_args, all_outs):
                args = [views[r] if r.__class__ is str else r["v"] for r in refs]
                outs = [views[n] for n in out_names]
                o = outs[0] if len(outs) == 1 else tuple(outs)
                fn = self._noop(outs) if use_noop else self.kernel
                calls.append((fn, args, outs, o))
        except (KeyError, TypeError) as exc:
            raise CallError("BAD_REQUEST", f"bad array reference {exc}") from None
        if self.xp is not np:
            return self._device_batch(calls, call_ids, mode, use_noop)
        times: list[int] = []
        clock = time.perf_counter_ns
        i = 0
        try:
            for i, (fn, args, outs, o) in enumerate(calls):  # noqa: B007 (i names the failing call below)
                if mode == "return":
                    t0 = clock()
                    r = fn(*args)
                    t1 = clock()
                    _deliver(r, outs)
                elif mode == "out_kw":
                    t0 = clock()
                    r = fn(*args, out=o)
                    t1 = clock()
                    if r is not None and r is not o and not use_noop:
                        _deliver(r, outs)
                else:
                    t0 = clock()
                    r = fn(*args, *outs)
                    t1 = clock()
                    if r is not None and r is not o and not use_noop:
                        _deliver(r, outs)
                times.append(t1 - t0)
        except Exception as exc:  # noqa: BLE001 - the kernel's own errors are reported, with the call
            raise _failed(exc, call_ids[i]) from None
        return times

    def _device_batch(self, calls: list, call_ids: list[int], mode: str, use_noop: bool) -> list[int]:
        """The calls on the current stream, each between two CUDA events; the device synchronised before
        the reply, then each call's time read from its events. When the calls' own host time (their
        launches) is longer than the GPU's, the batch is launch-bound and the times are scaled up to
        it: either sum lies inside the judge's wall (disjoint intervals of one stream, of one thread),
        so the larger does too, and a launch-bound kernel is not taken for one hiding time."""
        xp = self.xp
        if len(calls) > len(self._events):
            raise CallError("BAD_REQUEST", "a batch longer than the arena's slots")
        i = 0
        host = 0  # the calls' own host time (launches), the copies of returned outputs left out
        clock = time.perf_counter_ns
        try:
            for i, (fn, args, outs, o) in enumerate(calls):  # noqa: B007 (i names the failing call below)
                start, end = self._events[i]
                if mode == "return":
                    t0 = clock()
                    start.record()
                    r = fn(*args)
                    end.record()
                    host += clock() - t0
                    _deliver(r, outs, xp)
                else:
                    t0 = clock()
                    start.record()
                    r = fn(*args, out=o) if mode == "out_kw" else fn(*args, *outs)
                    end.record()
                    host += clock() - t0
                    if r is not None and r is not o and not use_noop:
                        _deliver(r, outs, xp)
            xp.cuda.Device().synchronize()
        except Exception as exc:  # noqa: BLE001 - the kernel's own errors are reported, with the call
            raise _failed(exc, call_ids[i]) from None
        times = [max(0, round(xp.cuda.get_elapsed_time(s, e) * 1e6)) for s, e in self._events[:len(calls)]]
        gpu = sum(times)
        if host > gpu > 0:  # launch-bound: the GPU waited for the launches; the calls took the host's time
            times = [round(t * host / gpu) for t in times]
        return times

    def serve(self) -> int:
        protocol.send(self.sock, {"op": "ready", "pid": os.getpid()})
        while True:
            try:
                msg = protocol.recv(self.sock)
            except protocol.ChannelClosed:
                return 0
            op = msg["op"]
            try:
                if op == "exit":
                    return 0
                if op in ("layout", "load"):
                    self.on_layout(msg) if op == "layout" else self.on_load(msg)
                    gc.collect()
                    gc.freeze()  # what exists now is never scanned again: shorter, steadier collections
                    protocol.send(self.sock, {"op": "ok"})
                elif op == "batch":
                    times = self.on_batch(msg)
                    protocol.send(self.sock, {"op": "done", "call_ids": msg["call_ids"], "times_ns": times})
                else:
                    raise CallError("BAD_REQUEST", f"unknown op {op!r}")
            except CallError as exc:
                protocol.send(self.sock, {"op": "error", "code": exc.code, "message": str(exc)[:2000],
                                          "call_id": getattr(exc, "call_id", None)})


def _failed(exc: Exception, call_id: int) -> CallError:
    """``exc`` (a :class:`CallError`, or the kernel's own error as ``CALL_FAILED``) naming the failing call."""
    err = exc if isinstance(exc, CallError) else CallError("CALL_FAILED", _describe(exc))
    err.call_id = call_id  # type: ignore[attr-defined]
    return err


def _describe(exc: BaseException) -> str:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return ("".join(tb[-3:]))[-2000:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kz_runner.judge.serve_kernel")
    p.add_argument("--sock-fd", type=int, required=True)
    a = p.parse_args(argv)
    _die_with_parent()
    sock = socket.socket(fileno=a.sock_fd)
    return Worker(sock).serve()


if __name__ == "__main__":
    raise SystemExit(main())

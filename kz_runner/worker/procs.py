"""Supervised child processes: own process group, timeout, capped output, cancellation.

:func:`run_step` starts one command in a new session (so it leads its own process
group), drains stdout and stderr with a selector into capped buffers (the child
never blocks on a full pipe; bytes past the cap are counted and dropped), and on
timeout or cancellation sends SIGTERM to the whole group, then SIGKILL after a
grace period. When the leader exits on its own, whatever it left running in its
group is killed too, so nothing from one step survives into the next.

Extra pipes (``reads``: the read ends of pipes whose write ends the child
inherits through ``pass_fds``) are drained by the same loop, so a child that fills
one of them while the runner waits on another cannot deadlock. The child's ends
in ``pass_fds`` are closed here as soon as it has started: the pipes then reach
end-of-file when the child's side is done with them.

The leader is checked with ``waitid(WNOWAIT)``: it stays a zombie until the group
has been signalled, so its pid (the group id) cannot be reused meanwhile.
"""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# How long to keep draining pipes after the group is gone (a process that left the
# group with setsid() may still hold them open; it is not waited for).
DRAIN_AFTER_EXIT_S = 2.0
# Bytes of the end of stderr kept apart from the capped capture (for log tails).
TAIL_BYTES = 16 * 1024


@dataclass(frozen=True)
class StepResult:
    """How one supervised command ended."""

    # exit status of the leader (negative: killed by that signal); None if it never started
    returncode: int | None
    # captured stdout, at most the cap
    stdout: bytes
    # captured stderr, at most the cap
    stderr: bytes
    # bytes of stdout dropped past the cap
    stdout_dropped: int
    # bytes of stderr dropped past the cap
    stderr_dropped: int
    # the timeout fired and the group was killed
    timed_out: bool
    # the cancel event fired and the group was killed
    cancelled: bool
    # wall-clock seconds from start to the end of supervision
    duration_s: float
    # why the command could not start (OSError text), else None
    start_error: str | None = None
    # the last TAIL_BYTES of stderr, whatever the cap dropped
    stderr_tail: bytes = b""
    # what came through each extra pipe (``reads``), at most its cap
    extra: Mapping[str, bytes] = field(default_factory=dict)
    # bytes dropped past the cap, per extra pipe
    extra_dropped: Mapping[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Exited 0 on its own."""
        return self.returncode == 0 and not self.timed_out and not self.cancelled


class _Capped:
    """A byte buffer that keeps the first ``cap`` bytes and counts the rest."""

    def __init__(self, cap: int, tail: int = 0) -> None:
        self.cap = cap
        self.parts: list[bytes] = []
        self.size = 0
        self.dropped = 0
        self.tail_cap = tail
        self.tail = bytearray()

    def add(self, data: bytes) -> None:
        if self.tail_cap:
            self.tail += data
            del self.tail[: max(0, len(self.tail) - self.tail_cap)]
        room = self.cap - self.size
        if room > 0:
            keep = data[:room]
            self.parts.append(keep)
            self.size += len(keep)
        self.dropped += max(0, len(data) - max(room, 0))

    def value(self) -> bytes:
        return b"".join(self.parts)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _leader_exited(pid: int) -> bool:
    """True once ``pid`` has exited; it is left a zombie (not reaped)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def run_step(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    stdout_cap: int,
    stderr_cap: int,
    kill_grace_s: float = 5.0,
    cancel: threading.Event | None = None,
    pass_fds: Sequence[int] = (),
    reads: Mapping[str, tuple[int, int]] | None = None,
) -> StepResult:
    """Run ``argv`` supervised (see the module docstring); never raises for child failures.

    ``pass_fds``: descriptors the child inherits; closed here once it started (or failed to).
    ``reads``: ``{name: (read fd, cap)}`` drained beside stdout/stderr and closed here.
    """
    start = time.monotonic()
    reads = dict(reads or {})
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=str(cwd),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(pass_fds),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        for fd in [*pass_fds, *(fd for fd, _ in reads.values())]:
            _close(fd)
        return StepResult(None, b"", b"", 0, 0, False, False, time.monotonic() - start, f"{type(exc).__name__}: {exc}")
    for fd in pass_fds:
        _close(fd)

    stdout, stderr = proc.stdout, proc.stderr
    assert stdout is not None and stderr is not None  # both are PIPE
    out, err = _Capped(stdout_cap), _Capped(stderr_cap, TAIL_BYTES)
    extras = {name: _Capped(cap) for name, (_fd, cap) in reads.items()}
    sinks = {stdout.fileno(): out, stderr.fileno(): err}
    sinks.update({fd: extras[name] for name, (fd, _cap) in reads.items()})
    sel = selectors.DefaultSelector()
    for fd in sinks:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)

    pgid = proc.pid  # start_new_session: the leader's pid is the group id
    deadline = start + timeout_s
    timed_out = cancelled = False
    term_sent_at: float | None = None
    killed = False
    exited_at: float | None = None
    try:
        while True:
            now = time.monotonic()
            if exited_at is None and _leader_exited(proc.pid):
                exited_at = now
                # Reap nothing yet; first make sure the rest of the group is gone.
                _signal_group(pgid, signal.SIGKILL)
                killed = True
            if exited_at is None and term_sent_at is None:
                if now >= deadline:
                    timed_out = True
                elif cancel is not None and cancel.is_set():
                    cancelled = True
                if timed_out or cancelled:
                    _signal_group(pgid, signal.SIGTERM)
                    term_sent_at = now
            if term_sent_at is not None and not killed and now - term_sent_at >= kill_grace_s:
                _signal_group(pgid, signal.SIGKILL)
                killed = True
            if not sel.get_map():
                if exited_at is not None:
                    break
                time.sleep(0.05)
                continue
            if exited_at is not None and now - exited_at >= DRAIN_AFTER_EXIT_S:
                break
            for key, _ in sel.select(timeout=0.05):
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    sinks[key.fd].add(data)
                else:
                    sel.unregister(key.fd)
    finally:
        sel.close()
        if exited_at is None:  # an exception while supervising: leave nothing behind
            _signal_group(pgid, signal.SIGKILL)
        proc.wait()  # reap the leader only now: its pid was the group id until here
        stdout.close()
        stderr.close()
        for fd, _cap in reads.values():
            _close(fd)
    return StepResult(
        returncode=proc.returncode,
        stdout=out.value(),
        stderr=err.value(),
        stdout_dropped=out.dropped,
        stderr_dropped=err.dropped,
        timed_out=timed_out,
        cancelled=cancelled,
        duration_s=time.monotonic() - start,
        stderr_tail=bytes(err.tail),
        extra={name: sink.value() for name, sink in extras.items()},
        extra_dropped={name: sink.dropped for name, sink in extras.items()},
    )

"""The floor of group commit with one thread per emitter, without the event store.

Usage::

    python benchmarks/bench_group_commit_floor.py [--threads 32] [--per-thread 600] [--dir DIR]

The same leader/follower protocol as ``kz_events.log.store`` (the first emitter that finds
no commit in progress writes every queued line and fdatasyncs once; the others block on
a lock each and are woken, or promoted to lead), but the "event" is a 200-byte line
and there is no fold, no encoding and no hashing. What it costs per event is the cost
of waking a thread and handing it the interpreter lock, which bounds
``group_commit_threads_events_per_s`` of ``bench_events.py`` from above. Prints one JSON
object: events/s, CPU and system time per event (us), voluntary context switches per
event, events per fsync, plus machine facts.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import threading
from pathlib import Path

from machine import calibration_s, machine_facts, timed_threads  # benchmarks/ is sys.path[0]


class _Waiter:
    __slots__ = ("lock", "lead")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.lead = False


class BareGroupCommit:
    """Leader/follower group commit of raw lines into one file (no store around it)."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.queue = threading.Lock()
        self.pending: list[bytes] = []
        self.waiters: list[_Waiter] = []
        self.leading = False
        self.fsyncs = 0

    def append(self, line: bytes) -> None:
        """Queue ``line`` and return once it is fdatasync-ed."""
        waiter = None
        with self.queue:
            self.pending.append(line)
            if self.leading:
                waiter = _Waiter()
                self.waiters.append(waiter)
            else:
                self.leading = True
        if waiter is not None:
            waiter.lock.acquire()
            if not waiter.lead:
                return
        self._lead()

    def _lead(self) -> None:
        while True:
            with self.queue:
                lines, self.pending = self.pending, []
                waiters, self.waiters = self.waiters, []
            if lines:
                os.write(self.fd, b"".join(lines))
                os.fdatasync(self.fd)
                self.fsyncs += 1
            for waiter in waiters:
                waiter.lock.release()
            with self.queue:
                if self.waiters:
                    successor = self.waiters.pop(0)
                    successor.lead = True
                    successor.lock.release()
                    return
                if not self.pending:
                    self.leading = False
                    return

    def close(self) -> None:
        os.close(self.fd)


def main(argv: list[str] | None = None) -> int:
    """Run the measurement and print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--per-thread", type=int, default=600)
    parser.add_argument("--dir", default=None, help="where the file is written (the filesystem matters)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="kz-bench-floor-", dir=args.dir))
    try:
        log = BareGroupCommit(root / "lines")
        line = b"x" * 199 + b"\n"

        def work(_i: int) -> None:
            for _ in range(args.per_thread):
                log.append(line)

        before = resource.getrusage(resource.RUSAGE_SELF)
        elapsed = timed_threads(args.threads, work)
        after = resource.getrusage(resource.RUSAGE_SELF)
        log.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    n = args.threads * args.per_thread
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({
        "benchmark": "group_commit_floor", "threads": args.threads, "events": n,
        "events_per_s": round(n / elapsed),
        "cpu_us_per_event": round(cpu / n * 1e6, 1),
        "system_us_per_event": round((after.ru_stime - before.ru_stime) / n * 1e6, 1),
        "voluntary_switches_per_event": round((after.ru_nvcsw - before.ru_nvcsw) / n, 2),
        "events_per_fsync": round(n / max(1, log.fsyncs), 1),
        "machine": machine_facts(calibration_loop_s=calibration_s()),
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

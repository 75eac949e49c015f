"""Integrity findings: the stable codes, the finding value, and the thread/process census.

A finding ends the run: the harness stops timing, sends an ``integrity`` document on
the result channel and prints a benchmark output whose ``overall.accept`` is false
and whose ``accept_reason`` starts with the code.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from kz_runner.bench import pristine

TIMER_TAMPERED = "TIMER_TAMPERED"  # a clock/event/sync function (or a checking function) was replaced
UNSYNCED_WORK = "UNSYNCED_WORK"  # event time far below synchronised wall time: work escaped the timed stream
THREAD_LEAK = "THREAD_LEAK"  # threads or processes alive after the timed region that were not before
OUTPUT_TYPE = "OUTPUT_TYPE"  # not exactly the expected array type, dtype or shape
STALE_OUTPUT = "STALE_OUTPUT"  # the output is the poison pattern or another trial's output
TIMED_MISMATCH = "TIMED_MISMATCH"  # a timed call's output is wrong although the untimed check passed
WEAK_TRIALS = "WEAK_TRIALS"  # the harness's trial inputs cannot tell a cached result from a computed one
HARNESS_ERROR = "HARNESS_ERROR"  # the library itself failed
# The judge's (kz_runner.judge), for a kernel timed through bench.kernel:
WRONG_OUTPUT = "WRONG_OUTPUT"  # a call on the judge's fresh inputs returned a wrong output
PROTOCOL_ERROR = "PROTOCOL_ERROR"  # the kernel's worker sent the judge something malformed
MACHINE_BUSY = "MACHINE_BUSY"  # the timing was void: the worker waited for a CPU too often (not a verdict)
CODES = (TIMER_TAMPERED, UNSYNCED_WORK, THREAD_LEAK, OUTPUT_TYPE, STALE_OUTPUT, TIMED_MISMATCH, WEAK_TRIALS,
         HARNESS_ERROR, WRONG_OUTPUT, PROTOCOL_ERROR, MACHINE_BUSY)


@dataclass(frozen=True)
class Finding:
    """One integrity finding: a stable code, a one-line message, the case, small evidence."""

    code: str
    message: str
    case: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def with_case(self, case: str | None) -> Finding:
        """The same finding attributed to ``case`` (kept when already set)."""
        return self if self.case is not None else Finding(self.code, self.message, case, self.evidence)

    def line(self) -> str:
        """``CODE: message`` on one line."""
        return f"{self.code}: " + " ".join(self.message.split())


class IntegrityFailure(Exception):
    """Raised out of a case body to stop it once a finding is recorded on the harness.

    The finding is recorded before this is raised, so the verdict stands even if
    something swallows the exception.
    """

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.line())
        self.finding = finding


def _os_tasks() -> set[int] | None:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except (OSError, ValueError):
        return None


def _children() -> set[int] | None:
    tasks = _os_tasks()
    if tasks is None:
        return None
    found: set[int] = set()
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children", encoding="ascii") as f:
                found.update(int(p) for p in f.read().split())
        except (OSError, ValueError):
            continue  # a task that just ended, or a kernel without the children file
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


#: how long new OS threads without a Python thread may take to vanish (threads exiting)
EXIT_GRACE_S = 0.05


class ThreadCensus:
    """Threads and child processes present when the timed region starts.

    Python threads are compared as objects (held here, so an id cannot be reused);
    OS threads by ``/proc/self/task`` ids; children by ``/proc/self/task/*/children``.
    """

    def __init__(self) -> None:
        self.threads = set(threading.enumerate())
        self.tasks = _os_tasks()
        self.children = _children()

    def _new(self) -> tuple[list[threading.Thread], list[int], list[int]]:
        new_threads = [t for t in threading.enumerate() if t not in self.threads and t.is_alive()]
        tasks = _os_tasks()
        new_tasks = sorted(tasks - self.tasks) if tasks is not None and self.tasks is not None else []
        children = _children()
        new_children = sorted(p for p in (children or set()) - (self.children or set()) if _alive(p))
        return new_threads, new_tasks, new_children

    def leak(self) -> Finding | None:
        """A THREAD_LEAK finding for anything new that is still alive, else None.

        A joined Python thread's OS thread can still be listed for a moment while it exits
        (``join`` returns before the kernel drops the task): new OS threads alone are looked
        at again for up to ``EXIT_GRACE_S`` before they count.
        """
        new_threads, new_tasks, new_children = self._new()
        deadline = pristine.perf_counter() + EXIT_GRACE_S
        while new_tasks and not new_threads and not new_children and pristine.perf_counter() < deadline:
            pristine.sleep(0.002)
            new_threads, new_tasks, new_children = self._new()
        if not (new_threads or new_tasks or new_children):
            return None
        parts = []
        if new_threads:
            parts.append(f"{len(new_threads)} new Python thread(s) ({', '.join(t.name for t in new_threads[:3])})")
        if new_tasks and len(new_tasks) > len(new_threads):
            parts.append(f"{len(new_tasks)} new OS thread(s)")
        if new_children:
            parts.append(f"{len(new_children)} child process(es)")
        if not parts:
            parts.append(f"{len(new_tasks)} new OS thread(s)")
        return Finding(
            THREAD_LEAK,
            "still running after the timed calls returned: " + ", ".join(parts)
            + "; the timed function must finish its work before it returns",
            evidence={"python_threads": [t.name for t in new_threads[:5]], "os_threads": new_tasks[:5],
                      "children": new_children[:5]},
        )


class Guard:
    """The checks around a timed region; a finding is reported, then raised as IntegrityFailure."""

    def __init__(self, report: Callable[[Finding], None], case: str | None = None) -> None:
        self.report = report
        self.case = case
        self.census: ThreadCensus | None = None

    def start(self) -> None:
        """Take the thread census at the start of the timed region."""
        self.census = ThreadCensus()

    def fail(self, finding: Finding) -> NoReturn:
        """Report ``finding`` (attributed to this guard's case), then raise it."""
        finding = finding.with_case(self.case)
        self.report(finding)
        raise IntegrityFailure(finding)

    def check_timer(self) -> None:
        """TIMER_TAMPERED when a captured function's public name now holds something else."""
        changed = pristine.tampered()
        if changed:
            self.fail(Finding(TIMER_TAMPERED, f"{', '.join(changed[:3])} "
                              f"{'was' if len(changed) == 1 else 'were'} replaced while the package ran",
                              evidence={"replaced": changed[:10]}))

    def check_threads(self) -> None:
        """THREAD_LEAK when threads or processes started in the timed region still run."""
        leak = self.census.leak() if self.census is not None else None
        if leak is not None:
            self.fail(leak)

    def check(self, clock: Any = None) -> None:
        """Timer, then threads, then (given a clock) the event/wall cross-check."""
        self.check_timer()
        self.check_threads()
        finding = clock.unsynced() if clock is not None else None
        if finding is not None:
            self.fail(finding)

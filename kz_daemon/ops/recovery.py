"""Start-up recovery: bring the log, the repo and the spool back to agreement after a crash.

Run by ``Zoo.start()`` before any thread starts (the Store's OS lock guarantees no
other daemon writes this state directory):

1. the Store has already repaired a torn log tail on open (``log.repaired``);
2. stale git lock files a killed writer left are removed;
3. intake outcomes written but not logged get their events (``Intake.recover``);
4. a result that was logged without its verdict (a torn append) gets the verdict a
   live report gives, from ``runs/<uuid>/``: hard checks, physics floor, and a
   confirmation run where one is due (:func:`kz_daemon.queue.confirm.recover`);
5. every saga in progress is finished (:func:`kz_daemon.accept.saga.finish_saga`): the saga looks at
   the commit trailers to see what already reached git (commit 1 without commit 2
   → commit 2 is made; both commits without events → the events are emitted;
   nothing in git → the saga runs from the start); a saga that cannot finish
   (its stored package is gone) is rolled back when nothing reached git, and left
   ``accepting`` for a retry (``sagas_pending``) when part of it did;
6. leases that expired while the daemon was down are expired (requeued or failed);
7. index.json is brought to HEAD: updated for the packages that changed since its
   head, rebuilt when it is missing or unreadable.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kz_daemon.accept import saga as accept
from kz_daemon.config.ports import Daemon
from kz_daemon.queue import confirm, leases as queue
from kz_events.status import Status


@dataclass
class RecoveryReport:
    """What start-up recovery did (printed by ``kz daemon``, asserted by tests)."""

    git_locks_removed: list = field(default_factory=list)
    intake_recovered: int = 0
    results_rejudged: list = field(default_factory=list)
    sagas_finished: list = field(default_factory=list)
    sagas_rolled_back: list = field(default_factory=list)
    sagas_pending: list = field(default_factory=list)   # part in git, still accepting: retried later
    leases_expired: int = 0
    index: str = "current"   # what happened to index.json: current | updated | rebuilt


def recover(zoo: Daemon) -> RecoveryReport:
    """Run every recovery step on ``zoo`` (not started yet); returns what was done."""
    report = RecoveryReport()
    with zoo.git_lock:
        report.git_locks_removed = zoo.git.clear_stale_locks()
    report.intake_recovered = zoo.intake.recover()

    # the verdict a live report would give, a confirmation run included
    report.results_rejudged = confirm.recover(zoo, accept.verdict_of, accept.case_summary)
    for sub in list(zoo.store.state.submissions.values()):
        if sub.status != Status.ACCEPTING:
            continue
        outcome = accept.finish_saga(zoo, sub.uuid)
        outcomes = {"finished": report.sagas_finished, "rolled_back": report.sagas_rolled_back,
                    "pending": report.sagas_pending}
        outcomes[outcome].append(sub.uuid)
    report.leases_expired = queue.reap(zoo)

    with zoo.git_lock:
        report.index = zoo.indexer.catch_up()
    return report


class StallLog:
    """Tells the operator about a saga that keeps failing without a line per retry.

    The reaper retries a stalled saga every second; its first failure is logged at
    once, then at most one line per ``every_s`` with the number of failures since the
    last line, and one line when it finishes after having failed.
    """

    def __init__(self, log: Callable[[str], None], every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self.every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._stalls: dict[str, list[float | int]] = {}  # uuid -> [last line at, failures since]

    def failed(self, sub_uuid: str, message: str) -> bool:
        """Note one failure of the saga of ``sub_uuid``; True when a line was logged for it."""
        now = self._clock()
        with self._lock:
            entry = self._stalls.get(sub_uuid)
            if entry is None:
                self._stalls[sub_uuid] = [now, 0]
                line = message
            elif now - entry[0] >= self.every_s:
                count = int(entry[1]) + 1
                self._stalls[sub_uuid] = [now, 0]
                line = f"{message} (failed {count} times in the last {now - entry[0]:.0f} s)"
            else:
                entry[1] = int(entry[1]) + 1
                return False
        self._log(line)
        return True

    def finished(self, sub_uuid: str, line: str | None = None) -> None:
        """The saga of ``sub_uuid`` ended: forget its failures (one line if it had any).

        The key may name any retried task (the daemon's loops use it too); ``line`` is
        then what is logged in place of the saga's words.
        """
        with self._lock:
            entry = self._stalls.pop(sub_uuid, None)
        if entry is not None:
            self._log(line or f"accept saga of {sub_uuid} finished after it had stalled")

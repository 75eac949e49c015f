"""One backoff formula (``kz_daemon.core.backoff``, the reaper's) behind the daemon's retry loops:
the mirror pusher and ``kz up``'s runner supervisor wait longer after each failure in a row, up to
their cap, and start over after a success; the runner's HTTP retries (which cannot import the
daemon) have the same ceilings, with jitter under them."""
from __future__ import annotations

import random
import re
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

from kz_daemon.core.backoff import compute_backoff
from kz_daemon.upkeep import mirror as mirror_module
from kz_daemon.upkeep.mirror import Mirror
from kz_daemon.upkeep.supervise import Supervisor
from kz_runner.worker.client import RetryPolicy
from tests.helpers.daemon import wait_for


class RecordingMirror(Mirror):
    """A mirror pusher whose pauses are noted instead of waited."""

    def __init__(self, zoo: object, **kwargs: float) -> None:
        super().__init__(zoo, **kwargs)  # type: ignore[arg-type]
        self.pauses: list[float] = []

    def _pause(self, seconds: float) -> None:
        self.pauses.append(seconds)


def fake_zoo(emitted: list) -> SimpleNamespace:
    return SimpleNamespace(
        config=SimpleNamespace(mirrors=[SimpleNamespace(name="backup", url="unused")],
                               repo=SimpleNamespace(branch="main")),
        git=SimpleNamespace(root=Path("unused"), head=lambda: "head-1"), git_lock=threading.Lock(),
        store=SimpleNamespace(emit=lambda *events: emitted.extend(events)))


def test_the_mirror_pusher_waits_longer_after_each_failed_push_up_to_its_cap(monkeypatch):
    outcomes = iter([False] * 5 + [True] + [False, True])  # per push: ok or not
    calls: list[str] = []

    def push(_root: Path, _url: str, _branch: str) -> None:
        calls.append(_url)
        if not next(outcomes):
            raise OSError("connection refused")

    monkeypatch.setattr(mirror_module, "push", push)
    emitted: list = []
    pusher = RecordingMirror(fake_zoo(emitted), first_backoff_s=1.0, max_backoff_s=4.0)
    pusher.start()
    try:
        wait_for(lambda: len(calls) == 6)
        pusher.notify("head-2")
        wait_for(lambda: len(calls) == 8)
    finally:
        pusher.stop()
    assert pusher.pauses == [1.0, 2.0, 4.0, 4.0, 4.0, 1.0]  # grows, caps, starts over after a success
    assert [e.ok for e in emitted] == [False] * 5 + [True, False, True]
    assert [e.sha for e in emitted][-2:] == ["head-2", "head-2"]


def test_the_runner_supervisor_restarts_a_dying_child_ever_more_slowly_up_to_its_cap(caplog):
    sup = Supervisor([sys.executable, "-c", "import sys; sys.exit(3)"], name="runner",
                     first_backoff_s=0.02, max_backoff_s=0.08)
    sup.start()
    try:
        wait_for(lambda: sup.starts >= 6)
    finally:
        sup.stop(5)
    waits = [float(w) for w in re.findall(r"restarting in ([0-9.]+) s", caplog.text)]
    assert waits[:5] == [0.02, 0.04, 0.08, 0.08, 0.08]


class Ceiling(random.Random):
    """Full jitter at its top: the largest wait the policy allows."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_the_runner_http_retries_ceiling_doubles_up_to_the_cap():
    policy = RetryPolicy(attempts=9, base_s=0.5, cap_s=30.0)
    assert [policy.delay(n, Ceiling()) for n in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert [policy.delay(n, Ceiling()) for n in range(8)] == [compute_backoff(n + 1, 0.5, 30.0) for n in range(8)]
    assert all(0 <= policy.delay(n, random.Random(n)) <= 30.0 for n in range(100))

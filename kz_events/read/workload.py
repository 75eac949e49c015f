"""A deterministic simulated workload: valid event sequences for tests and benchmarks.

``simulate(rng, n_events)`` plays a small zoo (submissions arriving for a set of
kernels, runners claiming fairly, leases renewed and expiring, results, accept
sagas, rejections, cancellations, index rewrites) and yields events that the
reducer accepts in order. ``history(rng, n_submissions)`` plays a long-lived zoo
instead, quickly enough for a million submissions: many kernels and submitters
(a few of them busy), intake rejections, holds and reviews, confirmation runs,
accepts with their index updates, rejections of results, failures, cancellations
and revocations, with a clock that moves like a real one. Randomness comes only
from the ``random.Random`` given.
"""
from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, Unpack

from kz_events import events as E
from kz_events.codec import TimestampFormatter, encode_fast, line_hash, subject_of
from kz_events.log.segments import EventLog
from kz_events.log.store import Store
from kz_events.reducer import apply_record, next_claimable
from kz_events.state import State

__all__ = ["simulate", "new_uuid", "history", "HistoryMix", "build_history"]

_TS = "2026-11-30T00:00:00.000000Z"


def new_uuid(rng: random.Random) -> str:
    """A uuid4-shaped string drawn from ``rng``."""
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"


def _sha(rng: random.Random, n: int = 40) -> str:
    return f"{rng.getrandbits(4 * n):0{n}x}"


class SimulateOptions(TypedDict, total=False):
    """The options of ``simulate`` (each has a default)."""

    kernels: int
    archs: tuple[str, ...]
    runners: int
    renewals: int
    max_pending: int


def simulate(rng: random.Random, n_events: int, **options: Unpack[SimulateOptions]) -> Iterator[E.Event]:
    """Yield ``n_events`` events forming a valid history (the reducer accepts all of them).

    Options: ``kernels`` (20), ``runners`` (4), ``renewals`` per lease (2),
    ``max_pending`` (200: no new submissions while this many jobs wait).
    """
    return itertools.islice(_simulate(rng, n_events, **options), n_events)


def _simulate(rng: random.Random, n_events: int, *, kernels: int = 20,
              archs: tuple[str, ...] = ("sm_90", "gfx928"), runners: int = 4,
              renewals: int = 2, max_pending: int = 200) -> Iterator[E.Event]:
    state = State()
    kernel_ids = [f"{archs[i % len(archs)]}/Op{i}/Sub/fp16/impl{i}" for i in range(kernels)]
    count = 0
    clock = 1_800_000_000.0
    reported: list[str] = []      # uuids with a result, waiting for the saga or a rejection
    renewed: dict[str, int] = {}
    head: str | None = None

    def push(ev: E.Event) -> E.Event:
        """Fold ``ev`` into the simulation's own state and pass it on."""
        nonlocal count
        count += 1
        apply_record(state, count, _TS, ev.TYPE, ev.payload())
        return ev

    while count < n_events:
        clock += 1.0
        in_flight = list(state.queue.in_flight.items())
        r = rng.random()
        idle = not in_flight and not reported and not state.queue.pending
        if (r < 0.25 and len(state.queue.pending) < max_pending) or idle:
            uuid = new_uuid(rng)
            kid = rng.choice(kernel_ids)
            arch = kid.split("/", 1)[0]
            yield push(E.SubmissionReceived(uuid, kid, f"agent-{rng.randrange(5)}",
                                            rng.choice(("http", "spool")), f"{uuid}.tar.gz",
                                            rng.randrange(1000, 10**6), _sha(rng, 64)))
            if rng.random() < 0.05:
                yield push(E.SubmissionRejected(uuid, "intake", "VALIDATION_ERROR",
                                                "desc.yaml: summary too long", {"problems": 1}))
                continue
            yield push(E.SubmissionValidated(uuid, kid, arch, rng.random() < 0.1, []))
            yield push(E.JobQueued(uuid, kid, arch))
        elif r < 0.45:
            arch = rng.choice(archs)
            claimable = next_claimable(state, arch)
            if claimable is None:
                continue
            sub = state.submissions[claimable]
            yield push(E.JobClaimed(claimable, f"runner-{rng.randrange(runners)}",
                                    f"lease-{count}", clock + 60.0, sub.attempts + 1))
        elif r < 0.8 and in_flight:
            uuid, lease = rng.choice(in_flight)
            x = rng.random()
            if renewed.get(uuid, 0) < renewals and x < 0.6:
                renewed[uuid] = renewed.get(uuid, 0) + 1
                yield push(E.JobLeaseRenewed(uuid, lease.runner_id, lease.lease_id, clock + 60.0))
            elif x < 0.65:
                if lease.attempt >= 3:
                    yield push(E.JobLeaseExpired(uuid, lease.runner_id, lease.lease_id,
                                                 lease.attempt))
                    yield push(E.JobFailed(uuid, "ATTEMPTS_EXHAUSTED", "3 leases expired"))
                else:
                    yield push(E.JobLeaseExpired(uuid, lease.runner_id, lease.lease_id,
                                                 lease.attempt))
            elif x < 0.68:
                yield push(E.JobReleased(uuid, lease.runner_id, lease.lease_id, "shutdown"))
            else:
                accept = rng.random() < 0.8
                cases = [{"test_case_id": f"case{i}", "correctness": "passed" if accept else "failed",
                          "accept": accept, "primary_metric": "latency_us",
                          "value": round(rng.uniform(1, 100), 3)} for i in range(2)]
                yield push(E.ResultReported(uuid, lease.runner_id, lease.lease_id, _sha(rng, 64),
                                            accept, True, cases, {"gpu": "H200"}))
                reported.append(uuid)
        elif reported:
            uuid = reported.pop(rng.randrange(len(reported)))
            sub = state.submissions.get(uuid)
            if sub is None or sub.status != "running":
                continue
            if not sub.result["overall_accept"]:
                yield push(E.SubmissionRejected(uuid, "result", "NOT_ACCEPTED",
                                                "the package's own verdict was accept=false", {}))
                continue
            yield push(E.AcceptStarted(uuid, sub.kernel_id, head))
            src, br = _sha(rng), _sha(rng)
            yield push(E.AcceptSourceCommitted(uuid, src, head))
            if rng.random() < 0.03:
                yield push(E.AcceptRolledBack(uuid, "simulated crash"))
                continue
            yield push(E.AcceptScorecardCommitted(uuid, src, br))
            yield push(E.AcceptCompleted(uuid, src, br))
            head = br
            yield push(E.IndexUpdated(state.index_version + 1, head, len(state.kernels)))
        elif state.queue.pending and rng.random() < 0.1:
            uuid = rng.choice(list(state.queue.pending))
            yield push(E.JobCancelled(uuid, "operator", "test cancel"))


def build_log(events_dir, n_events: int, seed: int = 0, *, batch: int = 50, **store_options):
    """Write a simulated log of ``n_events`` into ``events_dir`` (no fsync); returns the State."""
    store_options.setdefault("fsync", False)
    events = list(simulate(random.Random(seed), n_events))
    with Store.open(events_dir, **store_options) as store:
        for i in range(0, len(events), batch):
            store.emit(*events[i:i + batch])
        return store.state


# --- a long history -------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryMix:
    """How the submissions of ``history`` end, as probabilities (the rest run to a result)."""

    intake_rejected: float = 0.08     # refused at intake (2 events)
    held: float = 0.03                # a static rule holds it for review ...
    held_rejected: float = 0.35       # ... and the admin rejects that share of them
    cancelled: float = 0.02           # cancelled while queued
    lease_expired: float = 0.05       # a lease expires (or is released) before a result
    exhausted: float = 0.01           # three leases expire: failed (ATTEMPTS_EXHAUSTED)
    accepted: float = 0.45            # of the results: the package accepts ...
    confirmation: float = 0.05        # ... after a confirmation run (of the accepts)
    rolled_back: float = 0.01         # ... the saga rolls back (of the accepts)
    revoked: float = 0.01             # an earlier accept is revoked (per submission)
    idempotency_key: float = 0.7      # the upload carried an Idempotency-Key (kz submit does)


class HistoryOptions(TypedDict, total=False):
    """The options of ``history`` that ``build_history`` passes on (each has a default)."""

    kernels: int
    submitters: int
    runners: int
    window: int
    mix: HistoryMix
    archs: tuple[str, ...]


def history(rng: random.Random, n_submissions: int, *, kernels: int = 5000, submitters: int = 2000,
            runners: int = 64, window: int = 48, mix: HistoryMix = HistoryMix(),
            archs: tuple[str, ...] = ("sm_90", "gfx928", "cpu")) -> Iterator[E.Event]:
    """Yield the events of ``n_submissions`` submissions, interleaved, that the reducer accepts.

    Up to ``window`` submissions are under way at once, each on a kernel of its own (one
    job in flight per kernel); submitters follow a long tail (``submitter-0`` is the
    busiest). The last submissions are left live (held, queued or running), as a running
    zoo's are, none half-way through an accept saga. No reducer runs here.
    """
    for ev, _kid in _history(rng, n_submissions, kernels=kernels, submitters=submitters, runners=runners,
                             window=window, mix=mix, archs=archs):
        yield ev


def _history(rng: random.Random, n_submissions: int, *, kernels: int, submitters: int, runners: int,
             window: int, mix: HistoryMix, archs: tuple[str, ...]) -> Iterator[tuple[E.Event, str]]:
    """``history``'s events, each with the kernel_id of its subject (a writer without a reducer needs it)."""
    window = min(window, kernels)  # one job in flight per kernel
    weights = [1.0 / (i + 1) for i in range(submitters)]
    cum = list(itertools.accumulate(weights))
    total = cum[-1]
    kernel_ids = [f"{archs[i % len(archs)]}/Cat{i % 17}/Op{i % 251}/fp16/impl{i}" for i in range(kernels)]
    busy: set[int] = set()
    active: list[_tagged] = []
    accepted: list[tuple[str, str]] = []  # (uuid, kernel_id) of the accepts a revocation may take back
    started = 0
    head: list[str | None] = [None]
    index_version = [0]

    def submitter() -> str:
        return f"submitter-{bisect.bisect_left(cum, rng.random() * total)}"

    def script(kernel: int) -> Iterator[E.Event]:
        uuid = new_uuid(rng)
        kid = kernel_ids[kernel]
        arch = kid.split("/", 1)[0]
        who = submitter()
        key = new_uuid(rng) if rng.random() < mix.idempotency_key else None
        yield E.SubmissionReceived(uuid, kid, who, "http", f"{uuid}.tar.gz", rng.randrange(2000, 400_000),
                                   _sha(rng, 64), key)
        if rng.random() < mix.intake_rejected:
            yield E.SubmissionRejected(uuid, "intake", rng.choice(("DESC_SCHEMA", "FILE_MISSING", "HARNESS_LOCKED")),
                                       "desc.yaml: summary is required", {"problems": 1})
            return
        yield E.SubmissionValidated(uuid, kid, arch, False, [], False)
        if rng.random() < mix.held:
            yield E.SubmissionHeld(uuid, ["network-subprocess"],
                                   [{"rule": "network-subprocess", "action": "hold", "file": "src/k.py",
                                     "line": 3, "text": "import subprocess"}])
            if rng.random() < mix.held_rejected:
                yield E.SubmissionReviewed(uuid, "reject", "admin", "subprocess is not allowed here")
                return
            yield E.SubmissionReviewed(uuid, "approve", "admin", "")
        else:
            yield E.JobQueued(uuid, kid, arch)
        if rng.random() < mix.cancelled:
            yield E.JobCancelled(uuid, who, "superseded")
            return
        attempt = 0
        runner = ""
        lease = ""

        def claim() -> E.Event:
            nonlocal attempt, runner, lease
            attempt += 1
            runner, lease = f"runner-{rng.randrange(runners)}", f"{rng.getrandbits(64):016x}"
            return E.JobClaimed(uuid, runner, lease, 1.8e9, attempt)

        yield claim()
        if rng.random() < mix.exhausted:
            for _ in range(2):
                yield E.JobLeaseExpired(uuid, runner, lease, attempt)
                yield claim()
            yield E.JobLeaseExpired(uuid, runner, lease, attempt)
            yield E.JobFailed(uuid, "ATTEMPTS_EXHAUSTED", "3 leases expired")
            return
        if rng.random() < mix.lease_expired:
            yield E.JobReleased(uuid, runner, lease, "runner stopping")
            yield claim()
        for _ in range(rng.randrange(3)):
            yield E.JobLeaseRenewed(uuid, runner, lease, 1.8e9)
        accept = rng.random() < mix.accepted

        def result() -> E.ResultReported:
            cases = [{"test_case_id": f"case{i}", "correctness": "passed" if accept or i else "failed",
                      "accept": accept, "primary_metric": "latency_us", "value": round(rng.uniform(1, 900), 3),
                      "unit": "us", "direction": "lower_better"} for i in range(rng.randrange(1, 4))]
            return E.ResultReported(uuid, runner, lease, _sha(rng, 64), accept, True, cases,
                                    {"gpu": "H200", "driver": "550"})

        first = result()
        yield first
        if not accept:
            yield E.SubmissionRejected(uuid, "result", "PACKAGE_REJECTED",
                                       "case0: latency_us regressed beyond the 5% tolerance", {})
            return
        if rng.random() < mix.confirmation:
            yield E.JobConfirmationRequested(uuid, runner, lease, first.result_sha256,
                                             "ahead of the best by more than 10%", 1.8e9)
            yield claim()
            yield result()
        yield E.AcceptStarted(uuid, kid, head[0])
        src, br = _sha(rng), _sha(rng)
        yield E.AcceptSourceCommitted(uuid, src, head[0])
        if rng.random() < mix.rolled_back:
            yield E.AcceptRolledBack(uuid, "a conflict in git")
            return
        yield E.AcceptScorecardCommitted(uuid, src, br)
        yield E.AcceptCompleted(uuid, src, br)
        head[0] = br
        index_version[0] += 1
        yield E.IndexUpdated(index_version[0], br, kernels)
        accepted.append((uuid, kid))

    #: a script whose last event is one of these may be left live at the end (no saga under way)
    restful = (E.JobQueued, E.JobClaimed, E.JobLeaseRenewed, E.SubmissionHeld, E.SubmissionReviewed,
               E.JobReleased)
    while True:
        while started < n_submissions and len(active) < window:
            kernel = rng.randrange(kernels)
            if kernel in busy:
                continue
            busy.add(kernel)
            active.append(_tagged(script(kernel), kernel, kernel_ids[kernel]))
            started += 1
            if accepted and rng.random() < mix.revoked:
                uuid, kid = accepted.pop(rng.randrange(len(accepted)))
                yield E.SubmissionRevoked(uuid, "admin", "measured on a misconfigured runner"), kid
                yield E.RevokeCommitted(uuid, _sha(rng), rng.random() < 0.5), kid
        if not active:
            return
        i = rng.randrange(len(active))
        if started >= n_submissions and isinstance(active[i].last, restful):
            ev = None  # the end: leave it live, never half-way through a saga
        else:
            ev = next(active[i], None)
        if ev is None:
            busy.discard(active[i].kernel)
            active[i] = active[-1]
            active.pop()
            continue
        yield ev, active[i].kid


class _tagged:
    """A script's iterator that remembers its kernel."""

    __slots__ = ("it", "kernel", "kid", "last")
    it: Iterator[E.Event]
    kernel: int
    kid: str
    last: E.Event | None

    def __init__(self, it: Iterator[E.Event], kernel: int, kid: str) -> None:
        self.it, self.kernel, self.kid, self.last = it, kernel, kid, None

    def __iter__(self) -> _tagged:
        return self

    def __next__(self) -> E.Event:
        self.last = next(self.it)
        return self.last


def build_history(events_dir, n_submissions: int, seed: int = 0, *, start: float = 1_767_225_600.0,
                  step_s: float = 3.0, **options: Unpack[HistoryOptions]) -> dict:
    """Write ``history`` of ``n_submissions`` as a log in ``events_dir``, then open it as the daemon does.

    The lines are written straight to the log (no reducer, no fsync) with a clock that
    moves ``step_s`` per event from ``start`` (2026-01-01), so a million submissions span
    about a year. Opening the Store then checks every line, folds the State, builds the
    history projection and writes a snapshot. Returns the store's summary and open report.
    """
    events_dir = Path(events_dir)
    rng = random.Random(seed)
    defaults: HistoryOptions = dict(kernels=5000, submitters=2000, runners=64, window=48, mix=HistoryMix(),
                                    archs=("sm_90", "gfx928", "cpu"))
    defaults.update(options)
    log = EventLog.open(events_dir, fsync=False)
    try:
        fmt, now, seq, prev = TimestampFormatter(), start, log.tail.seq, log.tail.hash
        records: list[tuple[int, bytes, str]] = []
        for ev, kid in _history(rng, n_submissions, **defaults):
            seq += 1
            now += step_s
            line, _ = encode_fast(ev, seq, fmt(now), prev, subject_of(ev, kid if hasattr(ev, "uuid") else None))
            prev = line_hash(line)
            records.append((seq, line, prev))
            if len(records) >= 5000:
                log.append(records)
                records = []
        if records:
            log.append(records)
    finally:
        log.close()
    with Store.open(events_dir, fsync=False) as store:
        store.snapshot()
        return {**store.state.summary(), "open": dict(store.report)}

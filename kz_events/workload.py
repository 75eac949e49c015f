"""A deterministic simulated workload: valid event sequences for tests and benchmarks.

``simulate(rng, n_events)`` plays a small zoo (submissions arriving for a set of
kernels, runners claiming fairly, leases renewed and expiring, results, accept
sagas, rejections, cancellations, index rewrites) and yields events that the
reducer accepts in order. Randomness comes only from the ``random.Random`` given.
"""
from __future__ import annotations

import itertools
import random
from typing import Iterator

from kz_events import events as E
from kz_events.reducer import apply_record, next_claimable
from kz_events.state import State
from kz_events.store import Store

__all__ = ["simulate", "new_uuid"]

_TS = "2026-11-30T00:00:00.000000Z"


def new_uuid(rng: random.Random) -> str:
    """A uuid4-shaped string drawn from ``rng``."""
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"


def _sha(rng: random.Random, n: int = 40) -> str:
    return f"{rng.getrandbits(4 * n):0{n}x}"


def simulate(rng: random.Random, n_events: int, **options: int) -> Iterator[E.Event]:
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
            uuid = next_claimable(state, arch)
            if uuid is None:
                continue
            sub = state.submissions[uuid]
            yield push(E.JobClaimed(uuid, f"runner-{rng.randrange(runners)}",
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
            sub = state.submissions[uuid]
            if sub.status != "running":
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

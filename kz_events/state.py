"""The State the reducer folds events into: plain data, comparable, serializable.

``State`` holds the last applied ``seq``; every ``Submission`` with its status
history; the queue (pending jobs, jobs in flight with their ``Lease``); one
``Kernel`` record per kernel_id (heads of the last accept, the job in flight, the
pending jobs); the index version; a few daemon facts. ``to_json``/``from_json``
turn it into a JSON-ready dict and back (snapshots), and ``==`` compares two
states field by field (tests: replay equals the incremental state).

Only ``kz_events.reducer`` mutates a State. Everyone else treats it as read-only.
"""
from __future__ import annotations

import copy
from operator import attrgetter
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from kz_events.status import STATUSES, TERMINAL

__all__ = ["STATUSES", "TERMINAL", "Lease", "Submission", "Kernel", "Queue", "State"]

class Lease(NamedTuple):
    """A runner's hold on a running job (a named tuple: cheap to build on every renewal)."""

    runner_id: str      # who holds it
    lease_id: str       # the id the runner must present to renew, release, report
    expires_at: float   # epoch seconds
    attempt: int        # which claim of the job this is (1 first)


@dataclass(slots=True)
class Submission:
    """Everything the log says about one submission."""

    uuid: str
    kernel_id: str
    submitter_id: str
    source: str                      # http | spool
    received_at: str                 # ts of submission.received
    status: str                      # a Status word (stored as plain str: snapshots marshal it)
    history: list                    # [[seq, status, ts], ...] one entry per status change
    reasons: list = field(default_factory=list)   # [{stage, code, message, seq}] why it ended
    arch: str | None = None          # from submission.validated / job.queued
    new_kernel: bool | None = None   # from submission.validated
    warnings: list = field(default_factory=list)  # validation warning codes
    attempts: int = 0                # claims so far
    runner_id: str | None = None     # holder of the current (or last) lease
    lease_id: str | None = None
    lease_expires_at: float | None = None
    queued_seq: int | None = None    # seq of the first job.queued: the job's place in line
    result: dict | None = None       # summary of result.reported
    base_head: str | None = None     # branch head when the accept saga started
    sha_src: str | None = None       # accept saga commits
    sha_br: str | None = None
    harness_change: bool = False     # from submission.validated: a maintainer changed the locked harness

    def to_row(self) -> list:
        """Positional list of the fields (compact snapshot form)."""
        return [getattr(self, name) for name in _SUB_FIELDS]


_SUB_FIELDS = tuple(f.name for f in fields(Submission))
_sub_row = attrgetter(*_SUB_FIELDS)


@dataclass(slots=True)
class Kernel:
    """Per-kernel_id facts: last accepted commits, the job in flight, pending jobs."""

    kernel_id: str
    arch: str | None = None          # arch of its jobs
    head_src: str | None = None      # SHA_src of the last accept
    head_br: str | None = None       # SHA_br of the last accept
    in_flight: str | None = None     # uuid of the job claimed and not finished (at most one)
    accepted: int = 0                # number of accepted submissions
    pending: list = field(default_factory=list)   # queued uuids, oldest first
    last_claim_seq: int = 0          # seq of its last job.claimed (round-robin fairness)

    def to_row(self) -> list:
        """Positional list of the fields (compact snapshot form)."""
        return [getattr(self, name) for name in _KERNEL_FIELDS]


_KERNEL_FIELDS = tuple(f.name for f in fields(Kernel))


@dataclass(slots=True)
class Queue:
    """Jobs waiting and jobs in flight."""

    pending: dict = field(default_factory=dict)    # uuid -> queued_seq, in order of queueing
    in_flight: dict = field(default_factory=dict)  # uuid -> Lease
    #: kernel_ids with at least one pending job (derived; rebuilt on load).
    waiting_kernels: set = field(default_factory=set)


@dataclass(slots=True)
class State:
    """The fold of the event log up to ``seq``."""

    seq: int = 0
    submissions: dict = field(default_factory=dict)   # uuid -> Submission
    queue: Queue = field(default_factory=Queue)
    kernels: dict = field(default_factory=dict)       # kernel_id -> Kernel
    index_version: int = 0
    index_head: str | None = None
    index_kernels: int = 0
    status_counts: dict = field(default_factory=dict)  # status -> number of submissions
    daemon: dict = field(default_factory=dict)         # {version, pid, starts, seq}
    mirrors: dict = field(default_factory=dict)        # remote -> {sha, ok, error, seq}
    repairs: list = field(default_factory=list)        # [{seq, dropped_bytes, quarantine_file}]
    #: rerun_id -> the rerun of an accepted record (kz_events.reducer's rerun handlers say its fields);
    #: kept whole, finished ones too: a record's reruns are few, and its status document lists them
    reruns: dict = field(default_factory=dict)
    #: submitter_id -> {Idempotency-Key -> [uuid, sha256, received ts]} (keys are per submitter)
    idempotency: dict = field(default_factory=dict)

    def copy(self) -> "State":
        """A deep copy (tests and tools; the store never copies the whole state)."""
        return copy.deepcopy(self)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the whole state (the snapshot body)."""
        return {
            "seq": self.seq,
            "submission_fields": list(_SUB_FIELDS),
            "submissions": list(map(_sub_row, self.submissions.values())),
            "kernel_fields": list(_KERNEL_FIELDS),
            "kernels": [k.to_row() for k in self.kernels.values()],
            "pending": list(self.queue.pending.items()),
            "in_flight": [[u, l.runner_id, l.lease_id, l.expires_at, l.attempt]
                          for u, l in self.queue.in_flight.items()],
            "index": [self.index_version, self.index_head, self.index_kernels],
            "status_counts": self.status_counts,
            "daemon": self.daemon,
            "mirrors": self.mirrors,
            "repairs": self.repairs,
            "reruns": self.reruns,
            "idempotency": self.idempotency,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "State":
        """Rebuild a State from ``to_json`` output; raises ValueError on a foreign layout."""
        if doc.get("submission_fields") != list(_SUB_FIELDS) or \
                doc.get("kernel_fields") != list(_KERNEL_FIELDS):
            raise ValueError("state layout differs from this reducer's")
        sub = Submission
        submissions = {row[0]: sub(*row) for row in doc["submissions"]}
        kernels = {row[0]: Kernel(*row) for row in doc["kernels"]}
        queue = Queue(
            pending={u: s for u, s in doc["pending"]},
            in_flight={r[0]: Lease(r[1], r[2], r[3], r[4]) for r in doc["in_flight"]},
            waiting_kernels={k.kernel_id for k in kernels.values() if k.pending},
        )
        version, head, count = doc["index"]
        return cls(
            seq=doc["seq"], submissions=submissions, queue=queue, kernels=kernels,
            index_version=version, index_head=head, index_kernels=count,
            status_counts=dict(doc["status_counts"]), daemon=dict(doc["daemon"]),
            mirrors=dict(doc["mirrors"]), repairs=list(doc["repairs"]),
            reruns={rid: dict(r) for rid, r in (doc.get("reruns") or {}).items()},
            idempotency={s: dict(keys) for s, keys in doc["idempotency"].items()},
        )

    def summary(self) -> dict[str, Any]:
        """Counts for humans and tools: seq, submissions by status, queue sizes, kernels."""
        return {
            "seq": self.seq,
            "submissions": len(self.submissions),
            "by_status": {s.value: self.status_counts[s] for s in STATUSES
                          if self.status_counts.get(s)},
            "pending": len(self.queue.pending),
            "in_flight": len(self.queue.in_flight),
            "kernels": len(self.kernels),
            "index_version": self.index_version,
        }

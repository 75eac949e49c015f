"""The State the reducer folds events into: plain data, comparable, serializable.

``State`` holds the last applied ``seq``; every submission that is not finished
(``Submission``, with its status history); the queue (pending jobs, jobs in flight
with their ``Lease``); one ``Kernel`` record per kernel_id (heads of the last accept,
the job in flight, the pending jobs); what the reducer must still know of finished
submissions, compactly (``accepted``: the records that can be revoked; ``revoking``:
revocations whose commit is not recorded yet); the review of each kernel's harnesses
(``harnesses``: the accepts that brought one, the hashes a maintainer approved); the index
version; a few daemon facts.
``to_json``/``from_json`` turn it into a JSON-ready dict and back (snapshots), and
``==`` compares two states field by field (tests: replay equals the incremental state).

A submission that finishes (a terminal status) leaves the State: the reducer hands
its last record to ``finished`` (a ``Handoff``), and so every later change to it (a
revocation), for the history projection (``kz_events.log.history``) to store on disk.
``finished`` is a hand-off, not part of the fold's meaning: it is neither compared
nor snapshotted, and it is None (nothing kept) unless a caller that drains it sets
it to a list. So the State's size follows the live submissions, not the history.

Only ``kz_events.reducer`` mutates a State. Everyone else treats it as read-only.
"""
from __future__ import annotations

import base64
import copy
from array import array
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, NamedTuple

from kz_events.status import STATUSES, TERMINAL

__all__ = ["STATUSES", "TERMINAL", "Lease", "Submission", "Kernel", "Queue", "State", "Handoff", "Records"]

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
    sha256: str | None = None        # of the tarball as received
    idempotency_key: str | None = None  # the upload's Idempotency-Key (scoped to submitter_id)
    cases: list | None = None        # CaseSummary.to_json() of each case of the first reported run

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


class Handoff(NamedTuple):
    """What the reducer hands to the history projection, in seq order.

    Either ``record``: a submission that just finished (its record at that seq, never
    changed again by the reducer), or ``change``: ``(type word, ts, payload)`` of a
    later event on a finished submission (a revocation), which
    ``kz_events.reducer.amend`` applies to the stored record.
    """

    seq: int
    uuid: str
    record: Submission | None
    change: tuple | None


#: a table slot's mark in ``Records._kinds``: never used, or used then removed (kernel i is i + 2)
_EMPTY, _GONE = 0, 1


class Records(MutableMapping):
    """uuid -> kernel_id for many finished submissions, in 30 to 60 bytes each (a dict ~120).

    What the reducer keeps of finished submissions grows with the history: a million
    submissions leave hundreds of thousands of accepted records that a revocation may
    name. A canonical uuid (36 characters, lower-case hex) is stored as its 16 bytes in
    an open-addressing table (linear probing, in a ``bytearray``) with the kernel as an
    index into the kernel names (an ``array``); any other key (tests name submissions
    "u1") goes to a plain dict. Behaves as a mapping: ``in``, ``get``, ``[]``, ``del``,
    iteration (in no particular order), ``==`` with any mapping.
    """

    __slots__ = ("_keys", "_kinds", "_mask", "_used", "_filled", "_names", "_index", "_other")

    def __init__(self, items: Any = ()) -> None:
        self._names: list[str] = []        # kernel ids, by index
        self._index: dict[str, int] = {}   # kernel id -> index
        self._other: dict[str, str] = {}   # keys that are not canonical uuids
        self._alloc(16)
        for key, value in (items.items() if isinstance(items, Mapping) else items):
            self[key] = value

    def _alloc(self, capacity: int) -> None:
        self._keys = bytearray(16 * capacity)
        self._kinds = array("I", bytes(4 * capacity))
        self._mask = capacity - 1
        self._used = 0     # slots holding a key
        self._filled = 0   # slots holding a key or a removal mark

    @staticmethod
    def _pack(uuid: Any) -> bytes | None:
        """The 16 bytes of a canonical uuid string, or None for any other key."""
        if type(uuid) is not str or len(uuid) != 36 or uuid[8] != "-" or uuid[13] != "-" \
                or uuid[18] != "-" or uuid[23] != "-":
            return None
        try:
            raw = bytes.fromhex(uuid.replace("-", ""))
        except ValueError:
            return None
        # fromhex skips whitespace between bytes (16 bytes: none was there) and reads upper case
        return raw if len(raw) == 16 and uuid == uuid.lower() else None

    @staticmethod
    def _unpack(raw: bytes) -> str:
        h = raw.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def _find(self, raw: bytes) -> tuple[int, bool]:
        """(slot, found): the key's slot, else the slot a new key goes to."""
        keys, kinds, mask = self._keys, self._kinds, self._mask
        i = int.from_bytes(raw[:8], "little") & mask
        free = -1
        while True:
            kind = kinds[i]
            if kind == _EMPTY:
                return (i if free < 0 else free), False
            if kind == _GONE:
                if free < 0:
                    free = i
            elif keys.startswith(raw, 16 * i):  # compares in place, no slice
                return i, True
            i = (i + 1) & mask

    def _slots(self) -> Iterator[int]:
        kinds = self._kinds
        return (i for i in range(len(kinds)) if kinds[i] > _GONE)

    def __getitem__(self, uuid: str) -> str:
        raw = self._pack(uuid)
        if raw is None:
            return self._other[uuid]
        i, found = self._find(raw)
        if not found:
            raise KeyError(uuid)
        return self._names[self._kinds[i] - 2]

    def __contains__(self, uuid: object) -> bool:
        raw = self._pack(uuid)
        return uuid in self._other if raw is None else self._find(raw)[1]

    def __setitem__(self, uuid: str, kernel_id: str) -> None:
        raw = self._pack(uuid)
        if raw is None:
            self._other[uuid] = kernel_id
            return
        index = self._index.get(kernel_id)
        if index is None:
            index = self._index[kernel_id] = len(self._names)
            self._names.append(kernel_id)
        i, found = self._find(raw)
        if not found:
            if self._kinds[i] == _EMPTY:
                self._filled += 1
            self._used += 1
            self._keys[16 * i:16 * i + 16] = raw
        self._kinds[i] = index + 2
        if self._filled * 10 > (self._mask + 1) * 7:  # at most 70 % full (removal marks count)
            self._rehash(self._used * 2)

    def __delitem__(self, uuid: str) -> None:
        raw = self._pack(uuid)
        if raw is None:
            del self._other[uuid]
            return
        i, found = self._find(raw)
        if not found:
            raise KeyError(uuid)
        self._kinds[i] = _GONE
        self._used -= 1

    def _rehash(self, at_least: int) -> None:
        old_keys, old_kinds = self._keys, self._kinds
        used = [i for i, kind in enumerate(old_kinds) if kind > _GONE]
        capacity = 16
        while capacity < at_least:
            capacity *= 2
        self._alloc(capacity)
        keys, kinds, mask = self._keys, self._kinds, self._mask
        for j in used:  # every key is distinct and the table has no removal marks: the first free slot
            raw = old_keys[16 * j:16 * j + 16]
            i = int.from_bytes(raw[:8], "little") & mask
            while kinds[i] != _EMPTY:
                i = (i + 1) & mask
            keys[16 * i:16 * i + 16] = raw
            kinds[i] = old_kinds[j]
        self._used = self._filled = len(used)

    def __iter__(self) -> Iterator[str]:
        yield from list(self._other)
        keys = self._keys
        for i in list(self._slots()):
            yield self._unpack(bytes(keys[16 * i:16 * i + 16]))

    def __len__(self) -> int:
        return self._used + len(self._other)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return len(self) == len(other) and all(other.get(k, None) == v for k, v in self.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Records({len(self)} entries)"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form (the snapshot body): the table itself, base64, so loading is a copy."""
        return {"names": list(self._names), "keys": base64.b64encode(self._keys).decode("ascii"),
                "kinds": base64.b64encode(self._kinds.tobytes()).decode("ascii"),
                "used": self._used, "filled": self._filled, "other": dict(self._other)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Records:
        """The table ``to_json`` wrote (ValueError for a damaged one)."""
        new = cls()
        keys = base64.b64decode(doc["keys"])
        kinds = array("I")
        kinds.frombytes(base64.b64decode(doc["kinds"]))
        capacity = len(kinds)
        if capacity & (capacity - 1) or len(keys) != 16 * capacity:
            raise ValueError("a damaged table of finished records")
        new._names = list(doc["names"])
        new._index = {name: i for i, name in enumerate(new._names)}
        new._keys, new._kinds, new._mask = bytearray(keys), kinds, capacity - 1
        new._used, new._filled = int(doc["used"]), int(doc["filled"])
        new._other = dict(doc["other"])
        return new

    def __deepcopy__(self, memo: dict) -> Records:
        return Records.from_json(self.to_json())


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
    #: submitter_id -> {Idempotency-Key -> [uuid, sha256, received ts]} of live submissions
    #: (keys are per submitter; a finished one's key is in the history projection)
    idempotency: dict = field(default_factory=dict)
    accepted: Records = field(default_factory=Records)  # uuid -> kernel_id: accepted records (revocable)
    revoking: dict = field(default_factory=dict)       # uuid -> kernel_id: revoked, commit not recorded yet
    #: kernel_id -> the review of its harnesses: ``brought`` {uuid: sha_src} of the standing accepts
    #: that brought one (a new kernel, a maintainer's harness change) and ``approved`` {harness hash:
    #: {by, reason, commit, seq, at}} (kz_events.reducer's harness handlers keep it; a kernel with
    #: neither has no entry)
    harnesses: dict = field(default_factory=dict)
    harness_seq: int = 0                               # seq of the last change to ``harnesses`` (a version)
    #: the hand-off to the history projection (a list only where someone drains it)
    finished: list | None = field(default=None, compare=False)

    def copy(self) -> State:
        """A deep copy (tests and tools; the store never copies the whole state)."""
        return copy.deepcopy(self)

    def kernel_of(self, uuid: str) -> str | None:
        """The kernel_id of a submission the State still knows (live, accepted or being revoked)."""
        sub = self.submissions.get(uuid)
        if sub is not None:
            return sub.kernel_id
        return self.accepted.get(uuid) or self.revoking.get(uuid)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the whole state (the snapshot body)."""
        return {
            "seq": self.seq,
            "submission_fields": list(_SUB_FIELDS),
            "submissions": list(map(_sub_row, self.submissions.values())),
            "kernel_fields": list(_KERNEL_FIELDS),
            "kernels": [k.to_row() for k in self.kernels.values()],
            "pending": list(self.queue.pending.items()),
            "in_flight": [[u, lease.runner_id, lease.lease_id, lease.expires_at, lease.attempt]
                          for u, lease in self.queue.in_flight.items()],
            "index": [self.index_version, self.index_head, self.index_kernels],
            "status_counts": self.status_counts,
            "daemon": self.daemon,
            "mirrors": self.mirrors,
            "repairs": self.repairs,
            "reruns": self.reruns,
            "idempotency": self.idempotency,
            "accepted": self.accepted.to_json(),
            "revoking": self.revoking,
            "harnesses": self.harnesses,
            "harness_seq": self.harness_seq,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> State:
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
            accepted=Records.from_json(doc["accepted"]), revoking=dict(doc["revoking"]),
            harnesses={kid: {"brought": dict(h["brought"]), "approved": {k: dict(v) for k, v in h["approved"].items()}}
                       for kid, h in doc["harnesses"].items()},
            harness_seq=doc["harness_seq"],
        )

    def summary(self) -> dict[str, Any]:
        """Counts for humans and tools: seq, submissions (ever, and live) by status, queue sizes, kernels."""
        return {
            "seq": self.seq,
            "submissions": sum(self.status_counts.values()),
            "live": len(self.submissions),
            "by_status": {s.value: self.status_counts[s] for s in STATUSES
                          if self.status_counts.get(s)},
            "pending": len(self.queue.pending),
            "in_flight": len(self.queue.in_flight),
            "kernels": len(self.kernels),
            "index_version": self.index_version,
        }

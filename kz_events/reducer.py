"""The reducer: folds one event into the State. Pure: no I/O, no clock, no randomness.

``apply(state, envelope)`` folds in place and returns ``state`` (folding into a
fresh copy per event would cost O(state) per event; see ``kz_events.state``).
Every handler checks all its preconditions before it changes anything, so an
event that is refused (``InvalidTransition``, ``SequenceGap``) leaves the state
exactly as it was. Callers folding several events atomically use
``checkpoint``/``restore``.

The lifecycle (``kz_events.status.Status``)::

    received --job.queued--> queued --job.claimed--> running --accept.started--> accepting
    received --submission.held--> held --submission.reviewed(approve)--> queued
    held --submission.reviewed(reject)--> rejected
    running --job.lease_expired / job.released--> queued
    accepting --accept.completed--> accepted        accepting --accept.rolled_back--> failed
    any non-terminal --submission.rejected--> rejected
    any non-terminal --job.failed--> failed
    running (result reported) --job.confirmation_requested--> queued (once per submission)
    accepted --submission.revoked--> revoked (revoke.committed then records its commit)

A rerun of an accepted record (``state.reruns``) has a lifecycle of its own and never
changes the submission: rerun.requested --> queued --rerun.claimed--> running
--rerun.reported--> done; running --rerun.released--> queued (attempt counted);
queued/running --rerun.failed--> failed; queued --rerun.cancelled--> cancelled;
running --rerun.cancelled--> cancelling --rerun.reported/released--> cancelled (the
report's figures discarded). ``next_rerun(state, arch, runner_id)`` picks one.
    received/held/queued/running --job.cancelled--> cancelled

``next_claimable(state, arch)`` is the fair pick of the next job for a runner.

A kernel's harness has a review of its own (``state.harnesses``): ``accept.completed`` of a
new kernel or a maintainer's harness change records the harness as brought by that
submission, ``submission.revoked`` takes it out again, and ``harness.reviewed`` approves a
harness hash or revokes its approval. A brought harness ranks only while approved.

A submission that reaches a terminal status leaves ``state.submissions`` in the same
fold: the State keeps only live submissions, and of finished ones only what a later
transition needs (``state.accepted``: uuid -> kernel_id of the records a revocation may
take back; ``state.revoking``: revocations whose commit is not recorded yet). The
record itself, and each later change to it, is handed to ``state.finished`` (when it
is a list) for the history projection; ``amend`` applies such a change to a stored
record, the one place that says what a revocation does to it. What the reducer can no
longer see is whether a *new* uuid was used by a finished rejected, failed or
cancelled submission: uuids are drawn by the daemon (uuid4), and its intake asks the
projection before it takes a uuid from a sidecar.

What each event does is one handler per event class; ``handler_for(JobQueued)`` (or
``handler_for("job.queued")``) returns it, for the replay's and the audit's own
dispatch tables. A status is stored in the State as its plain word (a ``str``, not
the ``Status`` member): snapshots encode the State with ``marshal``, which knows
only built-in types, and the word compares equal to the member.
"""
from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

from kz_events import events as E
from kz_events.codec import Envelope
from kz_events.state import Handoff, Kernel, Lease, State, Submission
from kz_events.status import Status

__all__ = [
    "REDUCER_VERSION", "ReducerError", "InvalidTransition", "SequenceGap",
    "apply", "apply_record", "fold", "handler_for", "next_claimable", "checkpoint", "restore",
    "Handler", "amend", "LATER_EVENTS",
]

#: bump whenever the fold changes meaning or the State layout; older snapshots are ignored.
REDUCER_VERSION = 5  # 2: State.idempotency; 3: State.reruns; 4: finished submissions leave the State;
#                      5: State.harnesses (the review of the harnesses submissions brought)


class ReducerError(ValueError):
    """An event the reducer refuses; the state is unchanged."""

    def __init__(self, seq: int, type_word: str, message: str, uuid: str | None = None):
        self.seq, self.type, self.uuid = seq, type_word, uuid
        where = f" (submission {uuid})" if uuid else ""
        super().__init__(f"seq {seq} {type_word}{where}: {message}")


class InvalidTransition(ReducerError):
    """The event is impossible in the current state (e.g. a result for a job not in flight)."""


class SequenceGap(ReducerError):
    """The event's seq is not state.seq + 1."""


def apply(state: State, envelope: Envelope) -> State:
    """Fold one envelope into ``state`` (in place) and return it; refuses leave it unchanged."""
    return apply_record(state, envelope.seq, envelope.ts, envelope.type, envelope.payload)


def fold(envelopes: Iterable[Envelope], state: State | None = None) -> State:
    """Fold envelopes in order into ``state`` (a new State when None)."""
    state = State() if state is None else state
    for env in envelopes:
        apply_record(state, env.seq, env.ts, env.type, env.payload)
    return state


def apply_record(state: State, seq: int, ts: str, type_word: str, payload: dict) -> State:
    """The fast path of ``apply`` for already-validated parts of an envelope."""
    if seq != state.seq + 1:
        raise SequenceGap(seq, type_word, f"expected seq {state.seq + 1}")
    handler = _BY_WORD.get(type_word)
    if handler is None:
        raise InvalidTransition(seq, type_word, "the reducer does not know this event type")
    handler(state, seq, ts, payload)
    state.seq = seq
    return state


_intern = sys.intern

# --- helpers --------------------------------------------------------------------------


def _sub(state: State, seq: int, type_word: str, p: dict, allowed: Iterable[str]) -> Submission:
    sub = state.submissions.get(p["uuid"])
    if sub is not None and sub.status in allowed:
        return sub
    uuid = p["uuid"]
    if sub is None:
        finished = "accepted" if uuid in state.accepted else "revoked" if uuid in state.revoking else None
        if finished is not None:
            raise InvalidTransition(seq, type_word, f"not allowed while the submission is {finished}", uuid)
        raise InvalidTransition(seq, type_word, "unknown submission, or one that has finished", uuid)
    if sub.status not in allowed:
        raise InvalidTransition(
            seq, type_word, f"not allowed while the submission is {sub.status}", uuid)
    return sub


def _set_status(state: State, sub: Submission, status: Status, seq: int, ts: str) -> None:
    word = _WORD[status]
    counts = state.status_counts
    counts[sub.status] -= 1
    counts[word] = counts.get(word, 0) + 1
    sub.status = word
    sub.history.append([seq, word, ts])


def _kernel(state: State, kernel_id: str) -> Kernel:
    kernel = state.kernels.get(kernel_id)
    if kernel is None:
        kernel = state.kernels[kernel_id] = Kernel(kernel_id)
    return kernel


def _enqueue(state: State, sub: Submission) -> None:
    """Put ``sub`` in line at the place of its first queueing."""
    kernel = _kernel(state, sub.kernel_id)
    if kernel.arch is None:
        kernel.arch = sub.arch
    state.queue.pending[sub.uuid] = sub.queued_seq
    pending = kernel.pending
    if not pending or state.submissions[pending[-1]].queued_seq < sub.queued_seq:
        pending.append(sub.uuid)
    else:
        subs = state.submissions
        i = 0
        while subs[pending[i]].queued_seq < sub.queued_seq:
            i += 1
        pending.insert(i, sub.uuid)
    state.queue.waiting_kernels.add(kernel.kernel_id)


def _dequeue(state: State, sub: Submission) -> None:
    """Take ``sub`` out of the pending line (no-op when it is not there)."""
    if state.queue.pending.pop(sub.uuid, None) is None:
        return
    kernel = state.kernels[sub.kernel_id]
    kernel.pending.remove(sub.uuid)
    if not kernel.pending:
        state.queue.waiting_kernels.discard(kernel.kernel_id)


def _end_lease(state: State, sub: Submission) -> None:
    state.queue.in_flight.pop(sub.uuid, None)


def _free_kernel(state: State, sub: Submission) -> None:
    kernel = state.kernels.get(sub.kernel_id)
    if kernel is not None and kernel.in_flight == sub.uuid:
        kernel.in_flight = None


def _finish(state: State, sub: Submission, status: Status, seq: int, ts: str) -> None:
    """Move to a terminal status, let go of everything the job held, and leave the State."""
    _dequeue(state, sub)
    _end_lease(state, sub)
    _free_kernel(state, sub)
    _set_status(state, sub, status, seq, ts)
    uuid = sub.uuid
    del state.submissions[uuid]
    if status is Status.ACCEPTED:
        state.accepted[uuid] = sub.kernel_id
    key = sub.idempotency_key
    if key is not None:
        keys = state.idempotency.get(sub.submitter_id)
        if keys is not None and keys.get(key, (None,))[0] == uuid:
            del keys[key]
            if not keys:
                del state.idempotency[sub.submitter_id]
    if state.finished is not None:
        state.finished.append(Handoff(seq, uuid, sub, None))


def _check_lease(state: State, seq: int, t: str, p: dict, sub: Submission) -> Lease:
    lease = state.queue.in_flight.get(sub.uuid)
    if lease is None:
        raise InvalidTransition(seq, t, "the job is not in flight", sub.uuid)
    if lease.lease_id != p["lease_id"] or lease.runner_id != p["runner_id"]:
        raise InvalidTransition(
            seq, t, f"lease {p['lease_id']} of {p['runner_id']} is not the current lease "
            f"({lease.lease_id} of {lease.runner_id})", sub.uuid)
    return lease


# --- handlers -------------------------------------------------------------------------

_LIVE = (Status.RECEIVED, Status.HELD, Status.QUEUED, Status.RUNNING, Status.ACCEPTING)
#: the plain word stored for each status (see the module docstring).
_WORD: dict[Status, str] = {status: _intern(status.value) for status in Status}
_RECEIVED = _WORD[Status.RECEIVED]
_ACCEPTED = _WORD[Status.ACCEPTED]
_REVOKED = _WORD[Status.REVOKED]


def _received(state: State, seq: int, ts: str, p: dict) -> None:
    uuid = p["uuid"]
    if uuid in state.submissions or uuid in state.accepted or uuid in state.revoking:
        raise InvalidTransition(seq, "submission.received", "uuid already received", uuid)
    # interned: many submissions share these strings (smaller state, faster snapshots)
    sub = state.submissions[uuid] = Submission(
        uuid, _intern(p["kernel_id"]), _intern(p["submitter_id"]), _intern(p["source"]), ts,
        _RECEIVED, [[seq, _RECEIVED, ts]])
    sub.sha256 = p["sha256"]
    sub.idempotency_key = p["idempotency_key"]
    counts = state.status_counts
    counts[_RECEIVED] = counts.get(_RECEIVED, 0) + 1
    key = p["idempotency_key"]
    if key is not None:
        # a later upload reusing a key (after the daemon's time-to-live) takes it over
        state.idempotency.setdefault(p["submitter_id"], {})[key] = [uuid, p["sha256"], ts]


def _validated(state: State, seq: int, ts: str, p: dict) -> None:
    t = "submission.validated"
    sub = _sub(state, seq, t, p, (Status.RECEIVED,))
    if sub.arch is not None:
        raise InvalidTransition(seq, t, "already validated", sub.uuid)
    if p["kernel_id"] != sub.kernel_id:
        raise InvalidTransition(seq, t, f"kernel_id {p['kernel_id']} != {sub.kernel_id}", sub.uuid)
    sub.arch = _intern(p["arch"])
    sub.new_kernel = p["new_kernel"]
    sub.warnings = list(p["warnings"])
    sub.harness_change = p["harness_change"]


def _rejected(state: State, seq: int, ts: str, p: dict) -> None:
    sub = _sub(state, seq, "submission.rejected", p, _LIVE)
    sub.reasons.append({"stage": p["stage"], "code": p["code"], "message": p["message"],
                        "seq": seq})
    _finish(state, sub, Status.REJECTED, seq, ts)


def _queued(state: State, seq: int, ts: str, p: dict) -> None:
    t = "job.queued"
    sub = _sub(state, seq, t, p, (Status.RECEIVED,))
    if p["kernel_id"] != sub.kernel_id:
        raise InvalidTransition(seq, t, f"kernel_id {p['kernel_id']} != {sub.kernel_id}", sub.uuid)
    if sub.arch is not None and p["arch"] != sub.arch:
        raise InvalidTransition(seq, t, f"arch {p['arch']} != validated {sub.arch}", sub.uuid)
    if sub.arch is None:
        sub.arch = _intern(p["arch"])
    sub.queued_seq = seq
    _enqueue(state, sub)
    _set_status(state, sub, Status.QUEUED, seq, ts)


def _held(state: State, seq: int, ts: str, p: dict) -> None:
    t = "submission.held"
    sub = _sub(state, seq, t, p, (Status.RECEIVED,))
    if sub.arch is None:
        raise InvalidTransition(seq, t, "held before it was validated", sub.uuid)
    _set_status(state, sub, Status.HELD, seq, ts)


def _reviewed(state: State, seq: int, ts: str, p: dict) -> None:
    t = "submission.reviewed"
    sub = _sub(state, seq, t, p, (Status.HELD,))
    if p["decision"] == "approve":
        sub.queued_seq = seq
        _enqueue(state, sub)
        _set_status(state, sub, Status.QUEUED, seq, ts)
        return
    sub.reasons.append({"stage": "review", "code": "REVIEW_REJECTED", "message": p["reason"],
                        "by": p["by"], "seq": seq})
    _finish(state, sub, Status.REJECTED, seq, ts)


def _claimed(state: State, seq: int, ts: str, p: dict) -> None:
    t = "job.claimed"
    sub = _sub(state, seq, t, p, (Status.QUEUED,))
    kernel = state.kernels[sub.kernel_id]
    if kernel.in_flight is not None:
        raise InvalidTransition(
            seq, t, f"kernel {sub.kernel_id} already has job {kernel.in_flight} in flight", sub.uuid)
    if p["attempt"] != sub.attempts + 1:
        raise InvalidTransition(
            seq, t, f"attempt {p['attempt']} but {sub.attempts} attempts so far", sub.uuid)
    _dequeue(state, sub)
    lease = Lease(_intern(p["runner_id"]), p["lease_id"], p["lease_expires_at"], p["attempt"])
    state.queue.in_flight[sub.uuid] = lease
    kernel.in_flight = sub.uuid
    kernel.last_claim_seq = seq
    sub.attempts = p["attempt"]
    sub.runner_id, sub.lease_id, sub.lease_expires_at = lease.runner_id, lease.lease_id, lease.expires_at
    _set_status(state, sub, Status.RUNNING, seq, ts)


def _renewed(state: State, seq: int, ts: str, p: dict) -> None:
    t = "job.lease_renewed"
    sub = _sub(state, seq, t, p, (Status.RUNNING,))
    lease = _check_lease(state, seq, t, p, sub)
    state.queue.in_flight[sub.uuid] = Lease(
        lease.runner_id, lease.lease_id, p["lease_expires_at"], lease.attempt)
    sub.lease_expires_at = p["lease_expires_at"]


def _back_in_line(state: State, sub: Submission, seq: int, ts: str) -> None:
    _end_lease(state, sub)
    _free_kernel(state, sub)
    sub.lease_expires_at = None
    _enqueue(state, sub)
    _set_status(state, sub, Status.QUEUED, seq, ts)


def _expired(state: State, seq: int, ts: str, p: dict) -> None:
    t = "job.lease_expired"
    sub = _sub(state, seq, t, p, (Status.RUNNING,))
    lease = _check_lease(state, seq, t, p, sub)
    if p["attempt"] != lease.attempt:
        raise InvalidTransition(seq, t, f"attempt {p['attempt']} != lease's {lease.attempt}", sub.uuid)
    _back_in_line(state, sub, seq, ts)


def _released(state: State, seq: int, ts: str, p: dict) -> None:
    t = "job.released"
    sub = _sub(state, seq, t, p, (Status.RUNNING,))
    _check_lease(state, seq, t, p, sub)
    _back_in_line(state, sub, seq, ts)


def _cancelled(state: State, seq: int, ts: str, p: dict) -> None:
    sub = _sub(state, seq, "job.cancelled", p, (Status.RECEIVED, Status.HELD, Status.QUEUED, Status.RUNNING))
    sub.reasons.append({"stage": "cancel", "code": "CANCELLED", "message": p["reason"],
                        "by": p["by"], "seq": seq})
    _finish(state, sub, Status.CANCELLED, seq, ts)


def _failed(state: State, seq: int, ts: str, p: dict) -> None:
    sub = _sub(state, seq, "job.failed", p, _LIVE)
    sub.reasons.append({"stage": "job", "code": p["code"], "message": p["message"], "seq": seq})
    _finish(state, sub, Status.FAILED, seq, ts)


def _reported(state: State, seq: int, ts: str, p: dict) -> None:
    t = "result.reported"
    sub = _sub(state, seq, t, p, (Status.RUNNING,))
    _check_lease(state, seq, t, p, sub)
    cases = p["cases"]
    previous = sub.result
    sub.result = {
        "seq": seq, "result_sha256": p["result_sha256"], "overall_accept": p["overall_accept"],
        "build_ok": p["build_ok"], "cases": len(cases),
        "failed_cases": [c.get("correctness") for c in cases].count("failed"),
    }
    if previous is not None and "confirmation" in previous:
        _confirming(sub, previous)
    else:  # the first run's cases (CaseSummary entries), as runs/<uuid>/result.json holds them
        sub.cases = cases
    _end_lease(state, sub)


def _accept_started(state: State, seq: int, ts: str, p: dict) -> None:
    t = "accept.started"
    sub = _sub(state, seq, t, p, (Status.RUNNING,))
    if sub.result is None or sub.uuid in state.queue.in_flight:
        raise InvalidTransition(seq, t, "no result reported for the current attempt", sub.uuid)
    if not sub.result["overall_accept"]:
        raise InvalidTransition(seq, t, "the reported result did not accept", sub.uuid)
    if p["kernel_id"] != sub.kernel_id:
        raise InvalidTransition(seq, t, f"kernel_id {p['kernel_id']} != {sub.kernel_id}", sub.uuid)
    sub.base_head = p["base_head"]
    _set_status(state, sub, Status.ACCEPTING, seq, ts)


def _source_committed(state: State, seq: int, ts: str, p: dict) -> None:
    t = "accept.source_committed"
    sub = _sub(state, seq, t, p, (Status.ACCEPTING,))
    if sub.sha_src is not None and sub.sha_src != p["sha_src"]:
        raise InvalidTransition(seq, t, f"source already committed as {sub.sha_src}", sub.uuid)
    sub.sha_src = p["sha_src"]


def _scorecard_committed(state: State, seq: int, ts: str, p: dict) -> None:
    t = "accept.scorecard_committed"
    sub = _sub(state, seq, t, p, (Status.ACCEPTING,))
    if sub.sha_src != p["sha_src"]:
        raise InvalidTransition(seq, t, f"sha_src {p['sha_src']} != committed {sub.sha_src}", sub.uuid)
    if sub.sha_br is not None and sub.sha_br != p["sha_br"]:
        raise InvalidTransition(seq, t, f"scorecard already committed as {sub.sha_br}", sub.uuid)
    sub.sha_br = p["sha_br"]


def _completed(state: State, seq: int, ts: str, p: dict) -> None:
    t = "accept.completed"
    sub = _sub(state, seq, t, p, (Status.ACCEPTING,))
    if sub.sha_src != p["sha_src"] or sub.sha_br != p["sha_br"]:
        raise InvalidTransition(
            seq, t, f"commits {p['sha_src']}/{p['sha_br']} != saga's {sub.sha_src}/{sub.sha_br}",
            sub.uuid)
    kernel = _kernel(state, sub.kernel_id)
    kernel.head_src, kernel.head_br = sub.sha_src, sub.sha_br
    kernel.accepted += 1
    if sub.new_kernel or sub.harness_change:  # the harness came with the submission: unreviewed until approved
        _harness_review(state, sub.kernel_id)["brought"][sub.uuid] = sub.sha_src
        state.harness_seq = seq
    if p["outcome"] is not None:  # what the accept changed (v2): kept beside the result it concerns
        sub.result = dict(sub.result or {}, outcome=p["outcome"])
    _finish(state, sub, Status.ACCEPTED, seq, ts)


def _rolled_back(state: State, seq: int, ts: str, p: dict) -> None:
    sub = _sub(state, seq, "accept.rolled_back", p, (Status.ACCEPTING,))
    sub.reasons.append({"stage": "accept", "code": "ROLLED_BACK", "message": p["reason"],
                        "seq": seq})
    sub.sha_src = sub.sha_br = None
    _finish(state, sub, Status.FAILED, seq, ts)


def _index_updated(state: State, seq: int, ts: str, p: dict) -> None:
    if p["version"] <= state.index_version:
        raise InvalidTransition(
            seq, "index.updated", f"version {p['version']} <= current {state.index_version}")
    state.index_version, state.index_head, state.index_kernels = p["version"], p["head"], p["kernels"]


def _mirror_pushed(state: State, seq: int, ts: str, p: dict) -> None:
    state.mirrors[p["remote"]] = {"sha": p["sha"], "ok": p["ok"], "error": p["error"], "seq": seq}


def _daemon_started(state: State, seq: int, ts: str, p: dict) -> None:
    state.daemon = {"version": p["version"], "pid": p["pid"],
                    "starts": state.daemon.get("starts", 0) + 1, "seq": seq, "ts": ts}


def _log_repaired(state: State, seq: int, ts: str, p: dict) -> None:
    state.repairs.append({"seq": seq, "dropped_bytes": p["dropped_bytes"],
                          "quarantine_file": p["quarantine_file"]})


# --- confirmation runs and revocation ----------------------------------------------------


def _confirmation_requested(state: State, seq: int, ts: str, p: dict) -> None:
    t = "job.confirmation_requested"
    sub = _sub(state, seq, t, p, (Status.RUNNING,))
    result = sub.result
    if result is None or sub.uuid in state.queue.in_flight:
        raise InvalidTransition(seq, t, "no result reported for the current attempt", sub.uuid)
    if "confirmation" in result:
        raise InvalidTransition(seq, t, "a confirmation run was already requested", sub.uuid)
    if not result["overall_accept"]:
        raise InvalidTransition(seq, t, "the reported result did not accept", sub.uuid)
    if (p["result_sha256"], p["runner_id"], p["lease_id"]) != \
            (result["result_sha256"], sub.runner_id, sub.lease_id):
        raise InvalidTransition(seq, t, "not the result reported under the last lease", sub.uuid)
    sub.result = {**result, "confirmation": {
        "seq": seq, "reason": p["reason"], "runner_id": p["runner_id"], "lease_id": p["lease_id"],
        "result_sha256": p["result_sha256"], "exclusive_until": p["exclusive_until"]}}
    _back_in_line(state, sub, seq, ts)


def _confirming(sub: Submission, previous: dict) -> None:
    """The report that follows a confirmation request is the confirmation run: keep the first."""
    first = previous.get("first") or {k: v for k, v in previous.items() if k != "confirmation"}
    result = sub.result
    assert result is not None  # _reported has just set the new report
    result["confirmation"] = previous["confirmation"]
    result["first"] = first


def _revoked(state: State, seq: int, ts: str, p: dict) -> None:
    uuid = p["uuid"]
    kernel_id = state.accepted.get(uuid)
    if kernel_id is None:
        _sub(state, seq, "submission.revoked", p, (Status.ACCEPTED,))  # raises, naming why
        raise InvalidTransition(seq, "submission.revoked", "not an accepted submission", uuid)
    del state.accepted[uuid]
    state.revoking[uuid] = kernel_id
    review = state.harnesses.get(kernel_id)
    if review is not None and review["brought"].pop(uuid, None) is not None:  # its harness no longer stands
        state.harness_seq = seq
        _drop_empty_review(state, kernel_id)
    kernel = state.kernels.get(kernel_id)
    if kernel is not None and kernel.accepted > 0:
        kernel.accepted -= 1
    counts = state.status_counts
    counts[_ACCEPTED] -= 1
    counts[_REVOKED] = counts.get(_REVOKED, 0) + 1
    if state.finished is not None:
        state.finished.append(Handoff(seq, uuid, None, ("submission.revoked", ts, p)))


def _revoke_committed(state: State, seq: int, ts: str, p: dict) -> None:
    t = "revoke.committed"
    uuid = p["uuid"]
    if uuid not in state.revoking:
        if uuid in state.accepted or uuid in state.submissions:
            _sub(state, seq, t, p, (Status.REVOKED,))  # raises, naming the status
        raise InvalidTransition(seq, t, "no revocation waits for its commit", uuid)
    del state.revoking[uuid]
    if state.finished is not None:
        state.finished.append(Handoff(seq, uuid, None, (t, ts, p)))


#: the events that change a submission after it finished, which ``amend`` applies.
LATER_EVENTS = frozenset(("submission.revoked", "revoke.committed"))


def amend(record: Submission, seq: int, change: tuple) -> None:
    """Apply a later event (``Handoff.change``: type word, ts, payload) to a finished record.

    The reducer has checked the transition when it folded the event; this says what
    the event does to the stored record: ``submission.revoked`` makes it ``revoked``
    with a revocation entry in its reasons, ``revoke.committed`` records the commit
    in that entry.
    """
    type_word, ts, p = change
    if type_word == "submission.revoked":
        record.reasons.append({"stage": "revoke", "code": "REVOKED", "message": p["reason"], "by": p["by"],
                               "seq": seq, "sha": None})
        record.status = _REVOKED
        record.history.append([seq, _REVOKED, ts])
    elif type_word == "revoke.committed":
        entry = next((r for r in reversed(record.reasons) if r.get("stage") == "revoke"), None)
        if entry is not None:
            entry.update(sha=p["sha"], best_changed=p["best_changed"], committed_seq=seq)
    else:
        raise ValueError(f"{type_word} does not change a finished submission")


# --- harness review ---------------------------------------------------------------------------------
#
# ``state.harnesses[kernel_id]`` is ``{"brought": {uuid: sha_src}, "approved": {hash: {by, reason,
# commit, seq, at}}}``: the standing accepts whose submission brought the kernel's harness (its
# first, a maintainer's harness change; a revocation takes one out) and the harness hashes an
# admin approved. The reducer cannot hash a commit's files: which harness is unreviewed (brought,
# not approved) is read from git by ``kz_daemon.guards.harness_review``.


def _harness_review(state: State, kernel_id: str) -> dict:
    review = state.harnesses.get(kernel_id)
    if review is None:
        review = state.harnesses[kernel_id] = {"brought": {}, "approved": {}}
    return review


def _drop_empty_review(state: State, kernel_id: str) -> None:
    review = state.harnesses[kernel_id]
    if not review["brought"] and not review["approved"]:
        del state.harnesses[kernel_id]


def _harness_reviewed(state: State, seq: int, ts: str, p: dict) -> None:
    t = "harness.reviewed"
    kernel_id, digest = p["kernel_id"], p["harness_hash"]
    review = state.harnesses.get(kernel_id)
    approved = review["approved"] if review is not None else {}
    if p["decision"] == "approve":
        if digest in approved:
            raise InvalidTransition(seq, t, f"harness {digest[:12]} of {kernel_id} is approved already")
        _harness_review(state, kernel_id)["approved"][digest] = {
            "by": p["by"], "reason": p["reason"], "commit": p["commit"], "seq": seq, "at": ts}
    else:
        if digest not in approved:
            raise InvalidTransition(seq, t, f"harness {digest[:12]} of {kernel_id} is not approved")
        del approved[digest]
        _drop_empty_review(state, kernel_id)
    state.harness_seq = seq


# --- reruns of accepted records -------------------------------------------------------------
#
# ``state.reruns[rerun_id]`` is a plain dict: rerun_id, uuid (the record), kernel_id, arch,
# runner (the only runner that may claim it, or None), by, status (queued, running,
# cancelling, done, failed, cancelled), requested_seq, requested_at, attempts, lease
# ([runner_id, lease_id, expires_at, attempt] while running or cancelling), result (the
# report's runner_id, result_sha256, cases, overall, env, env_changes; a cancelled run's
# report keeps only runner_id, lease_id, result_sha256 and ``discarded: True``), reason
# ({code, message, seq} when failed; {code: CANCELLED, message, by, seq} once cancelled),
# history ([[seq, status, ts]]).
# A rerun never touches a submission, the queue of submissions or a kernel's heads.

RERUN_LIVE = ("queued", "running", "cancelling")
RERUN_STATUSES = ("queued", "running", "cancelling", "done", "failed", "cancelled")
#: a runner holds the lease of a rerun in these (a cancelling one runs to its end, then is discarded)
RERUN_LEASED = ("running", "cancelling")


def _accepted_kernel(state: State, uuid: str) -> str | None:
    """The kernel_id of ``uuid`` when it is an accepted record, else None."""
    accepted = getattr(state, "accepted", None)  # finished records kept compactly, where the State does
    if accepted is not None and uuid in accepted:
        return accepted[uuid]
    sub = state.submissions.get(uuid)
    return sub.kernel_id if sub is not None and sub.status == Status.ACCEPTED else None


def _rerun(state: State, seq: int, t: str, p: dict, allowed: Iterable[str]) -> dict:
    rerun = state.reruns.get(p["rerun_id"])
    if rerun is None or rerun["uuid"] != p["uuid"]:
        raise InvalidTransition(seq, t, f"no rerun {p['rerun_id']} of this record", p["uuid"])
    if rerun["status"] not in allowed:
        raise InvalidTransition(seq, t, f"not allowed while the rerun is {rerun['status']}", p["uuid"])
    return rerun


def _rerun_lease(seq: int, t: str, p: dict, rerun: dict) -> list:
    lease = rerun["lease"]
    if lease is None or lease[0] != p["runner_id"] or lease[1] != p["lease_id"]:
        raise InvalidTransition(seq, t, f"lease {p['lease_id']} of {p['runner_id']} is not the rerun's lease",
                                p["uuid"])
    return lease


def _rerun_status(rerun: dict, status: str, seq: int, ts: str) -> None:
    rerun["status"] = status
    rerun["history"].append([seq, status, ts])


def _rerun_requested(state: State, seq: int, ts: str, p: dict) -> None:
    t = "rerun.requested"
    if p["rerun_id"] in state.reruns:
        raise InvalidTransition(seq, t, f"rerun {p['rerun_id']} was already requested", p["uuid"])
    kernel_id = _accepted_kernel(state, p["uuid"])
    if kernel_id is None:
        raise InvalidTransition(seq, t, "only an accepted record can be rerun", p["uuid"])
    if kernel_id != p["kernel_id"]:
        raise InvalidTransition(seq, t, f"kernel_id {p['kernel_id']} != the record's {kernel_id}", p["uuid"])
    state.reruns[p["rerun_id"]] = {
        "rerun_id": p["rerun_id"], "uuid": p["uuid"], "kernel_id": kernel_id, "arch": p["arch"],
        "runner": p["runner"], "by": p["by"], "status": "queued", "requested_seq": seq, "requested_at": ts,
        "attempts": 0, "lease": None, "result": None, "reason": None, "history": [[seq, "queued", ts]]}


def _rerun_claimed(state: State, seq: int, ts: str, p: dict) -> None:
    t = "rerun.claimed"
    rerun = _rerun(state, seq, t, p, ("queued",))
    if rerun["runner"] is not None and rerun["runner"] != p["runner_id"]:
        raise InvalidTransition(seq, t, f"the rerun is for runner {rerun['runner']}, not {p['runner_id']}",
                                p["uuid"])
    if p["attempt"] != rerun["attempts"] + 1:
        raise InvalidTransition(seq, t, f"attempt {p['attempt']} but {rerun['attempts']} attempts so far",
                                p["uuid"])
    rerun["attempts"] = p["attempt"]
    rerun["lease"] = [p["runner_id"], p["lease_id"], p["lease_expires_at"], p["attempt"]]
    _rerun_status(rerun, "running", seq, ts)


def _rerun_renewed(state: State, seq: int, ts: str, p: dict) -> None:
    t = "rerun.lease_renewed"
    rerun = _rerun(state, seq, t, p, RERUN_LEASED)
    lease = _rerun_lease(seq, t, p, rerun)
    rerun["lease"] = [lease[0], lease[1], p["lease_expires_at"], lease[3]]


def _rerun_released(state: State, seq: int, ts: str, p: dict) -> None:
    t = "rerun.released"
    rerun = _rerun(state, seq, t, p, RERUN_LEASED)
    _rerun_lease(seq, t, p, rerun)
    rerun["lease"] = None
    _rerun_status(rerun, "cancelled" if rerun["status"] == "cancelling" else "queued", seq, ts)


def _rerun_reported(state: State, seq: int, ts: str, p: dict) -> None:
    t = "rerun.reported"
    rerun = _rerun(state, seq, t, p, RERUN_LEASED)
    _rerun_lease(seq, t, p, rerun)
    rerun["lease"] = None
    if rerun["status"] == "cancelling":  # cancelled while it ran: the report is taken, its figures discarded
        rerun["result"] = {"runner_id": p["runner_id"], "lease_id": p["lease_id"],
                           "result_sha256": p["result_sha256"], "discarded": True}
        _rerun_status(rerun, "cancelled", seq, ts)
        return
    rerun["result"] = {"runner_id": p["runner_id"], "lease_id": p["lease_id"], "result_sha256": p["result_sha256"],
                       "cases": p["cases"], "overall": p["overall"], "env": p["env"],
                       "env_changes": p["env_changes"]}
    _rerun_status(rerun, "done", seq, ts)


def _rerun_failed(state: State, seq: int, ts: str, p: dict) -> None:
    rerun = _rerun(state, seq, "rerun.failed", p, ("queued", "running"))
    rerun["lease"] = None
    rerun["reason"] = {"code": p["code"], "message": p["message"], "seq": seq}
    _rerun_status(rerun, "failed", seq, ts)


def _rerun_cancelled(state: State, seq: int, ts: str, p: dict) -> None:
    rerun = _rerun(state, seq, "rerun.cancelled", p, ("queued", "running"))
    rerun["reason"] = {"code": "CANCELLED", "message": p["reason"] or f"cancelled by {p['by']}", "by": p["by"],
                       "seq": seq}
    if rerun["status"] == "queued":
        _rerun_status(rerun, "cancelled", seq, ts)
    else:  # its runner finishes; the lease's end makes it cancelled
        _rerun_status(rerun, "cancelling", seq, ts)


def next_rerun(state: State, arch: str | None, runner_id: str | None = None) -> str | None:
    """The rerun a runner of ``arch`` (any when None) should claim next: the oldest queued one it may run.

    A rerun named for one runner is that runner's only.
    """
    best: tuple[int, str] | None = None
    for rerun_id, rerun in state.reruns.items():
        if rerun["status"] != "queued" or (arch is not None and rerun["arch"] != arch):
            continue
        if rerun["runner"] is not None and rerun["runner"] != runner_id:
            continue
        key = (rerun["requested_seq"], rerun_id)
        if best is None or key < best:
            best = key
    return best[1] if best is not None else None


def _spool_skipped(state: State, seq: int, ts: str, p: dict) -> None:
    """Nothing to fold: the event is the operator's record of an inbox entry left alone."""


#: a handler folds one event: (state, seq, ts, payload); it checks before it changes anything.
Handler = Callable[[State, int, str, dict], None]

#: what each event does, by event class (``handler_for`` is the public lookup).
_HANDLERS: dict[type[E.Event], Handler] = {
    E.SubmissionReceived: _received,
    E.SubmissionValidated: _validated,
    E.SubmissionRejected: _rejected,
    E.JobQueued: _queued,
    E.JobClaimed: _claimed,
    E.JobLeaseRenewed: _renewed,
    E.JobLeaseExpired: _expired,
    E.JobReleased: _released,
    E.JobCancelled: _cancelled,
    E.JobFailed: _failed,
    E.ResultReported: _reported,
    E.SubmissionHeld: _held,
    E.SubmissionReviewed: _reviewed,
    E.HarnessReviewed: _harness_reviewed,
    E.AcceptStarted: _accept_started,
    E.AcceptSourceCommitted: _source_committed,
    E.AcceptScorecardCommitted: _scorecard_committed,
    E.AcceptCompleted: _completed,
    E.AcceptRolledBack: _rolled_back,
    E.IndexUpdated: _index_updated,
    E.MirrorPushed: _mirror_pushed,
    E.DaemonStarted: _daemon_started,
    E.LogRepaired: _log_repaired,
    E.SpoolSkipped: _spool_skipped,
    E.JobConfirmationRequested: _confirmation_requested,
    E.SubmissionRevoked: _revoked,
    E.RevokeCommitted: _revoke_committed,
    E.RerunRequested: _rerun_requested,
    E.RerunClaimed: _rerun_claimed,
    E.RerunLeaseRenewed: _rerun_renewed,
    E.RerunReleased: _rerun_released,
    E.RerunReported: _rerun_reported,
    E.RerunFailed: _rerun_failed,
    E.RerunCancelled: _rerun_cancelled,
}
#: the same by type word: the fold of a log line knows only the word.
_BY_WORD: dict[str, Handler] = {cls.TYPE: handler for cls, handler in _HANDLERS.items()}


def handler_for(event_type: str | type[E.Event]) -> Handler:
    """The handler of an event class (or of its type word): ``handler(state, seq, ts, payload)``.

    It folds the event into ``state`` without setting ``state.seq`` (the caller does,
    after it) and raises ``ReducerError`` for an event it refuses, leaving the state
    unchanged. Raises KeyError for a type the reducer does not know.
    """
    try:
        return _BY_WORD[event_type] if isinstance(event_type, str) else _HANDLERS[event_type]
    except KeyError:
        raise KeyError(f"the reducer has no handler for {event_type!r}") from None


# --- atomic folding of several events ---------------------------------------------------


def checkpoint(state: State, payloads: Iterable[dict]) -> dict[str, Any]:
    """Remember every part of ``state`` that events with these payloads can change."""
    uuids = {p["uuid"] for p in payloads if "uuid" in p}
    kernel_ids = {p["kernel_id"] for p in payloads if "kernel_id" in p}
    for u in uuids:
        kernel_id = state.kernel_of(u)
        if kernel_id is not None:
            kernel_ids.add(kernel_id)
    return {
        "seq": state.seq,
        "reruns": {rid: copy.deepcopy(state.reruns.get(rid)) for rid in {p["rerun_id"] for p in payloads
                                                                          if "rerun_id" in p}},
        "subs": {u: copy.deepcopy(state.submissions.get(u)) for u in uuids},
        "kernels": {k: copy.deepcopy(state.kernels.get(k)) for k in kernel_ids},
        "pending": dict(state.queue.pending),
        "in_flight": dict(state.queue.in_flight),
        "waiting": set(state.queue.waiting_kernels),
        "scalars": (state.index_version, state.index_head, state.index_kernels),
        "counts": dict(state.status_counts),
        "daemon": state.daemon,
        "mirrors": copy.deepcopy(state.mirrors),
        "repairs": list(state.repairs),
        "idempotency": {(p["submitter_id"], p["idempotency_key"]):
                        list(state.idempotency.get(p["submitter_id"], {}).get(p["idempotency_key"]) or ())
                        for p in payloads if p.get("idempotency_key") is not None and "submitter_id" in p},
        # a finishing submission drops its key: every key of a submitter the batch touches
        "keys": {s.submitter_id: dict(state.idempotency.get(s.submitter_id) or {})
                 for u in uuids if (s := state.submissions.get(u)) is not None},
        "accepted": {u: state.accepted.get(u) for u in uuids},
        "revoking": {u: state.revoking.get(u) for u in uuids},
        "harnesses": {k: copy.deepcopy(state.harnesses.get(k)) for k in kernel_ids},
        "harness_seq": state.harness_seq,
        "finished": None if state.finished is None else len(state.finished),
    }


def restore(state: State, memo: dict[str, Any]) -> None:
    """Undo everything since ``checkpoint`` returned ``memo``."""
    state.seq = memo["seq"]
    for rerun_id, rerun in memo["reruns"].items():
        if rerun is None:
            state.reruns.pop(rerun_id, None)
        else:
            state.reruns[rerun_id] = rerun
    for table, saved in ((state.submissions, memo["subs"]), (state.kernels, memo["kernels"])):
        for key, value in saved.items():
            if value is None:
                table.pop(key, None)
            else:
                table[key] = value
    state.queue.pending = memo["pending"]
    state.queue.in_flight = memo["in_flight"]
    state.queue.waiting_kernels = memo["waiting"]
    state.index_version, state.index_head, state.index_kernels = memo["scalars"]
    state.status_counts = memo["counts"]
    state.daemon = memo["daemon"]
    state.mirrors = memo["mirrors"]
    state.repairs = memo["repairs"]
    for submitter, keys in memo["keys"].items():
        if keys:
            state.idempotency[submitter] = keys
        else:
            state.idempotency.pop(submitter, None)
    for (submitter, key), entry in memo["idempotency"].items():
        keys = state.idempotency.setdefault(submitter, {})
        if entry:
            keys[key] = entry
        else:
            keys.pop(key, None)
            if not keys:
                del state.idempotency[submitter]
    for kernel_id, review in memo["harnesses"].items():
        if review is None:
            state.harnesses.pop(kernel_id, None)
        else:
            state.harnesses[kernel_id] = review
    state.harness_seq = memo["harness_seq"]
    kernel_of: MutableMapping[str, str]  # uuid -> kernel_id
    for kernel_of, saved in ((state.accepted, memo["accepted"]), (state.revoking, memo["revoking"])):
        for uuid, kernel_id in saved.items():
            if kernel_id is None:
                kernel_of.pop(uuid, None)
            else:
                kernel_of[uuid] = kernel_id
    if memo["finished"] is not None and state.finished is not None:
        del state.finished[memo["finished"]:]


# --- the fair pick ------------------------------------------------------------------------


def next_claimable(state: State, arch: str | None = None, *,
                   exclude: Iterable[str] = ()) -> str | None:
    """The uuid a runner of ``arch`` should claim next, or None.

    Among kernels that have pending jobs of ``arch`` (any arch when None) and no
    job in flight, take the kernel served least recently (never-served first, then
    the one whose oldest pending job is oldest) and return its oldest pending job.
    So one kernel's burst cannot starve another kernel. ``exclude`` skips uuids.
    """
    excluded = set(exclude)
    best_key: tuple[int, int] | None = None
    best: str | None = None
    subs = state.submissions
    for kid in state.queue.waiting_kernels:
        kernel = state.kernels[kid]
        if kernel.in_flight is not None:
            continue
        for uuid in kernel.pending:
            if uuid in excluded or (arch is not None and subs[uuid].arch != arch):
                continue
            key = (kernel.last_claim_seq, subs[uuid].queued_seq)
            if best_key is None or key < best_key:
                best_key, best = key, uuid
            break
    return best

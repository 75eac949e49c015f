"""The pure reducer: the submission lifecycle, refusals, fairness, state serialization."""
from __future__ import annotations

import copy
import json
import marshal
import random

import pytest
from hypothesis import given, settings, strategies as st

from kz_events import events as E, state as state_module
from kz_events.codec import GENESIS, decode_line, encode, line_hash
from kz_events.read.workload import new_uuid, simulate
from kz_events.reducer import (
    InvalidTransition,
    SequenceGap,
    amend,
    apply,
    apply_record,
    checkpoint,
    fold,
    handler_for,
    next_claimable,
    restore,
)
from kz_events.state import State
from kz_events.status import STATUSES, TERMINAL, Status

TS = "2026-11-30T06:00:00.000001Z"
SRC, BR = "1" * 40, "2" * 40


def push(state: State, *events: E.Event) -> State:
    for ev in events:
        apply_record(state, state.seq + 1, TS, ev.TYPE, ev.payload())
    return state


def received(uuid="u1", kid="sm_90/A/x/fp16/k", arch="sm_90"):
    return [E.SubmissionReceived(uuid, kid, "alice", "http", "p.tar.gz", 10, "a" * 64),
            E.SubmissionValidated(uuid, kid, arch, True, ["W1"]),
            E.JobQueued(uuid, kid, arch)]


def running(uuid="u1", kid="sm_90/A/x/fp16/k", lease="L1", attempt=1):
    return received(uuid, kid) + [E.JobClaimed(uuid, "r1", lease, 100.0, attempt)]


def accepted(uuid="u1", kid="sm_90/A/x/fp16/k"):
    return running(uuid, kid) + [
        E.ResultReported(uuid, "r1", "L1", "c" * 64, True, True,
                         [{"test_case_id": "c", "correctness": "passed"}], {}),
        E.AcceptStarted(uuid, kid, None), E.AcceptSourceCommitted(uuid, SRC, None),
        E.AcceptScorecardCommitted(uuid, SRC, BR), E.AcceptCompleted(uuid, SRC, BR)]


def test_full_lifecycle_to_accepted():
    state = push(State(finished=[]), *accepted())
    assert "u1" not in state.submissions and state.accepted == {"u1": "sm_90/A/x/fp16/k"}
    (handoff,) = state.finished  # the finished record leaves the State for the history projection
    sub = handoff.record
    assert handoff.seq == 9 and handoff.uuid == "u1" and handoff.change is None
    assert [h[1] for h in sub.history] == ["received", "queued", "running", "accepting", "accepted"]
    assert sub.status == "accepted" and sub.sha_src == SRC and sub.sha_br == BR
    assert sub.attempts == 1 and sub.warnings == ["W1"] and sub.result["cases"] == 1
    assert sub.cases == [{"test_case_id": "c", "correctness": "passed"}] and sub.sha256 == "a" * 64
    kernel = state.kernels["sm_90/A/x/fp16/k"]
    assert (kernel.head_src, kernel.head_br, kernel.accepted, kernel.in_flight) == (SRC, BR, 1, None)
    assert not state.queue.pending and not state.queue.in_flight
    assert state.status_counts == {"received": 0, "queued": 0, "running": 0, "accepting": 0,
                                   "accepted": 1}
    assert state.seq == 9


def test_lease_expiry_puts_the_job_back_in_line_and_counts_the_attempt():
    state = push(State(), *running(), E.JobLeaseExpired("u1", "r1", "L1", 1))
    sub = state.submissions["u1"]
    assert sub.status == "queued" and sub.attempts == 1
    assert "u1" in state.queue.pending and not state.queue.in_flight
    assert state.kernels[sub.kernel_id].in_flight is None
    push(state, E.JobClaimed("u1", "r2", "L2", 200.0, 2))
    assert state.queue.in_flight["u1"].lease_id == "L2"


REFUSED = [
    ("result for a job not in flight", received(),
     E.ResultReported("u1", "r1", "L1", "c" * 64, True, True, [], {})),
    ("result with a stale lease", running(),
     E.ResultReported("u1", "r1", "OLD", "c" * 64, True, True, [], {})),
    ("a second accept", accepted(), E.AcceptCompleted("u1", SRC, BR)),
    ("a second accept saga", accepted(), E.AcceptStarted("u1", "sm_90/A/x/fp16/k", None)),
    ("a claim of a running job", running(), E.JobClaimed("u1", "r1", "L9", 1.0, 2)),
    ("a wrong attempt number", received(), E.JobClaimed("u1", "r1", "L1", 1.0, 2)),
    ("an unknown submission", [], E.JobQueued("nope", "k", "a")),
    ("a second receipt", received(), received()[0]),
    ("scorecard before source", running() + [
        E.ResultReported("u1", "r1", "L1", "c" * 64, True, True, [], {}),
        E.AcceptStarted("u1", "sm_90/A/x/fp16/k", None)], E.AcceptScorecardCommitted("u1", SRC, BR)),
    ("accept of a rejected result", running() + [
        E.ResultReported("u1", "r1", "L1", "c" * 64, False, True, [], {})],
     E.AcceptStarted("u1", "sm_90/A/x/fp16/k", None)),
    ("renewal by another runner", running(), E.JobLeaseRenewed("u1", "r2", "L1", 5.0)),
    ("cancel of a finished one", accepted(), E.JobCancelled("u1", "op", "late")),
    ("queue under another kernel", received()[:2], E.JobQueued("u1", "other/k", "sm_90")),
    ("index going back", [E.IndexUpdated(3, None, 1)], E.IndexUpdated(2, None, 1)),
]


@pytest.mark.parametrize("history, event", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_impossible_transitions_are_refused_and_change_nothing(history, event):
    state = push(State(), *history)
    before = state.copy()
    with pytest.raises(InvalidTransition) as info:
        push(state, event)
    assert info.value.seq == len(history) + 1
    assert state == before


def test_second_job_of_a_kernel_cannot_be_claimed_while_one_is_in_flight():
    kid = "sm_90/A/x/fp16/k"
    state = push(State(), *running("u1", kid), *received("u2", kid))
    assert next_claimable(state, "sm_90") is None
    with pytest.raises(InvalidTransition, match="in flight"):
        push(state, E.JobClaimed("u2", "r2", "L2", 1.0, 1))


def test_sequence_gap_is_refused():
    state = push(State(), *received())
    with pytest.raises(SequenceGap, match="expected seq 4"):
        apply_record(state, 5, TS, "job.claimed", E.JobClaimed("u1", "r", "l", 1.0, 1).payload())


def test_next_claimable_is_round_robin_across_kernels():
    state = State()
    for i in range(5):
        push(state, *received(f"a{i}", "sm_90/A/x/fp16/burst"))
    push(state, *received("b0", "sm_90/B/x/fp16/other"))
    assert next_claimable(state, "sm_90") == "a0"
    push(state, E.JobClaimed("a0", "r", "L", 1.0, 1))
    assert next_claimable(state, "sm_90") == "b0"        # the burst's kernel is busy
    push(state, E.JobFailed("a0", "X", "x"))
    # a1 is older than b0, but kernel B has never been served: B first
    assert next_claimable(state, "sm_90") == "b0"
    assert next_claimable(state, "gfx928") is None
    assert next_claimable(state, "sm_90", exclude={"b0"}) == "a1"
    assert next_claimable(state) == "b0"


def test_a_requeued_job_keeps_its_place_in_line():
    kid = "sm_90/A/x/fp16/k"
    state = push(State(), *running("u1", kid), *received("u2", kid))
    push(state, E.JobReleased("u1", "r1", "L1", "shutdown"))
    assert state.kernels[kid].pending == ["u1", "u2"]
    assert next_claimable(state, "sm_90") == "u1"


def test_checkpoint_and_restore_undo_a_partial_batch():
    state = push(State(), *received("u0"))
    before = state.copy()
    batch = accepted("u1", "sm_90/B/x/fp16/k")
    memo = checkpoint(state, [e.payload() for e in batch])
    push(state, *batch)
    restore(state, memo)
    assert state == before


def test_state_json_round_trip():
    state = fold_events(list(simulate(random.Random(5), 3000)))
    doc = json.loads(json.dumps(state.to_json()))
    assert State.from_json(doc) == state
    with pytest.raises(ValueError):
        State.from_json({**doc, "submission_fields": ["uuid"]})


def fold_events(events) -> State:
    return push(State(), *events)


def test_apply_takes_envelopes_and_replay_of_lines_equals_the_incremental_state():
    events = list(simulate(random.Random(9), 1500))
    incremental = fold_events(events)
    prev, envelopes = GENESIS, []
    for seq, ev in enumerate(events, 1):
        line, _ = encode(ev, seq, TS, prev)
        prev = line_hash(line)
        envelopes.append(decode_line(line))
    assert fold(envelopes) == incremental
    state = State()
    for env in envelopes:
        assert apply(state, env) is state
    assert state == incremental


def _fuzz_event(rng: random.Random, state: State) -> E.Event:
    uuids = list(state.submissions) or ["nobody"]
    u = rng.choice(uuids + [new_uuid(rng)])
    sub = state.submissions.get(u)
    kid = sub.kernel_id if sub and rng.random() < 0.8 else "sm_90/Z/z/fp16/z"
    lease = state.queue.in_flight.get(u)
    lid = lease.lease_id if lease and rng.random() < 0.8 else "L?"
    rid = lease.runner_id if lease and rng.random() < 0.8 else "r?"
    attempt = (sub.attempts if sub else 0) + rng.choice((0, 1, 1, 2))
    sha = rng.choice((sub.sha_src if sub else None, SRC)) or SRC
    br = rng.choice((sub.sha_br if sub else None, BR)) or BR
    return rng.choice([
        E.SubmissionReceived(u, kid, "s", "http", "f", 1, "a" * 64),
        E.SubmissionValidated(u, kid, "sm_90", False, []),
        E.SubmissionRejected(u, "result", "C", "m", {}),
        E.JobQueued(u, kid, "sm_90"),
        E.JobClaimed(u, rid, lid, 1.0, max(1, attempt)),
        E.JobLeaseRenewed(u, rid, lid, 2.0),
        E.JobLeaseExpired(u, rid, lid, max(1, attempt)),
        E.JobReleased(u, rid, lid, "r"),
        E.JobCancelled(u, "op", "r"),
        E.JobFailed(u, "C", "m"),
        E.ResultReported(u, rid, lid, "c" * 64, rng.random() < 0.7, True, [], {}),
        E.AcceptStarted(u, kid, None),
        E.AcceptSourceCommitted(u, sha, None),
        E.AcceptScorecardCommitted(u, sha, br),
        E.AcceptCompleted(u, sha, br),
        E.AcceptRolledBack(u, "r"),
        E.IndexUpdated(state.index_version + rng.choice((0, 1)), None, 1),
    ])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 400), tries=st.integers(1, 30))
def test_refused_events_leave_the_state_exactly_as_it_was(seed, n, tries):
    rng = random.Random(seed)
    state = fold_events(simulate(rng, n))
    for _ in range(tries):
        ev = _fuzz_event(rng, state)
        before = state.copy()
        try:
            push(state, ev)
        except InvalidTransition:
            assert state == before
        else:  # accepted: the state must still serialize and count consistently
            live = sum(n for status, n in state.status_counts.items() if status not in TERMINAL)
            assert live == len(state.submissions)
            assert state.status_counts.get("accepted", 0) >= len(state.accepted)
            assert State.from_json(json.loads(json.dumps(state.to_json()))) == state
        for kid, kernel in state.kernels.items():
            assert (kid in state.queue.waiting_kernels) == bool(kernel.pending)
        assert set(state.queue.pending) == {u for k in state.kernels.values() for u in k.pending}


def test_every_event_class_has_one_handler_reached_by_class_or_type_word():
    for cls in E.EVENT_TYPES.values():
        assert handler_for(cls) is handler_for(cls.TYPE)
    with pytest.raises(KeyError, match="job.teleported"):
        handler_for("job.teleported")


def test_status_words_are_the_shared_vocabulary_and_snapshot_as_plain_strings():
    assert state_module.STATUSES is STATUSES and state_module.TERMINAL is TERMINAL
    state = push(State(finished=[]), *simulate(random.Random(7), 600))
    subs = list(state.submissions.values()) + [h.record for h in state.finished if h.record]
    statuses = {sub.status for sub in subs}
    assert statuses <= set(Status) and Status.ACCEPTED in statuses
    # plain str, not the enum member: the snapshot body is marshal, which refuses subclasses
    assert {type(sub.status) for sub in subs} == {str}
    assert {type(word) for word in state.status_counts} == {str}
    marshal.dumps(state.to_json())
    assert set(state.summary()["by_status"]) <= {s.value for s in Status}


# --- finished submissions leave the State ---------------------------------------------------


def revoked(uuid="u1", kid="sm_90/A/x/fp16/k"):
    return accepted(uuid, kid) + [E.SubmissionRevoked(uuid, "admin", "bad runner")]


def test_the_state_keeps_only_live_submissions_and_what_a_revocation_needs():
    kid = "sm_90/A/x/fp16/k"
    state = push(State(), *accepted("u1", kid), *received("u2", kid), *received("u3", kid),
                 E.SubmissionRejected("u3", "result", "C", "m", {}))
    assert set(state.submissions) == {"u2"} and state.accepted == {"u1": kid} and not state.revoking
    assert state.status_counts["accepted"] == 1 and state.status_counts["rejected"] == 1
    push(state, E.SubmissionRevoked("u1", "admin", "bad runner"))
    assert state.accepted == {} and state.revoking == {"u1": kid} and state.kernels[kid].accepted == 0
    assert state.status_counts["accepted"] == 0 and state.status_counts["revoked"] == 1
    push(state, E.RevokeCommitted("u1", SRC, True))
    assert state.revoking == {} and State.from_json(json.loads(json.dumps(state.to_json()))) == state


REFUSED_AFTER_THE_END = [
    ("revoking a rejected one", received() + [E.SubmissionRejected("u1", "result", "C", "m", {})],
     E.SubmissionRevoked("u1", "admin", "x"), "unknown submission, or one that has finished"),
    ("revoking twice", revoked(), E.SubmissionRevoked("u1", "admin", "x"), "while the submission is revoked"),
    ("committing a revocation twice", revoked() + [E.RevokeCommitted("u1", SRC, True)],
     E.RevokeCommitted("u1", SRC, True), "no revocation waits"),
    ("committing a revocation never made", accepted(), E.RevokeCommitted("u1", SRC, True),
     "while the submission is accepted"),
    ("a result for an accepted one", accepted(),
     E.ResultReported("u1", "r1", "L1", "c" * 64, True, True, [], {}), "while the submission is accepted"),
    ("reusing the uuid of an accepted one", accepted(), received()[0], "uuid already received"),
]


@pytest.mark.parametrize("history, event, why", [r[1:] for r in REFUSED_AFTER_THE_END],
                         ids=[r[0] for r in REFUSED_AFTER_THE_END])
def test_transitions_of_finished_submissions_are_refused_from_the_compact_facts(history, event, why):
    state = push(State(finished=[]), *history)
    before, handed = state.copy(), list(state.finished)
    with pytest.raises(InvalidTransition, match=why):
        push(state, event)
    assert state == before and state.finished == handed


def test_the_hand_off_and_amend_give_the_record_a_fold_of_everything_gives():
    state = push(State(finished=[]), *revoked(), E.RevokeCommitted("u1", "3" * 40, True))
    record, revocation, commit = state.finished
    assert (record.seq, revocation.seq, commit.seq) == (9, 10, 11) and revocation.record is None
    sub = copy.deepcopy(record.record)
    for h in (revocation, commit):
        amend(sub, h.seq, h.change)
    assert sub.status == "revoked" and sub.history[-1] == [10, "revoked", TS]
    assert sub.reasons[-1] == {"stage": "revoke", "code": "REVOKED", "message": "bad runner", "by": "admin",
                               "seq": 10, "sha": "3" * 40, "best_changed": True, "committed_seq": 11}
    assert record.record.status == "accepted"  # the handed-off record itself is never changed


def test_a_refused_batch_takes_back_its_hand_offs_and_compact_facts():
    kid = "sm_90/A/x/fp16/k"
    state = push(State(finished=[]), *accepted("u0", kid))
    before, handed = state.copy(), list(state.finished)
    batch = accepted("u1", "sm_90/B/x/fp16/k") + [E.SubmissionRevoked("u0", "admin", "x")]
    memo = checkpoint(state, [e.payload() for e in batch])
    push(state, *batch)
    assert "u1" in state.accepted and "u0" in state.revoking and len(state.finished) == 3
    restore(state, memo)
    assert state == before and state.finished == handed


def test_a_finished_submission_drops_its_idempotency_key_from_the_state():
    ev = E.SubmissionReceived("u1", "sm_90/A/x/fp16/k", "alice", "http", "p.tar.gz", 10, "a" * 64, "K1")
    state = push(State(), ev)
    assert state.idempotency == {"alice": {"K1": ["u1", "a" * 64, TS]}}
    push(state, E.SubmissionRejected("u1", "intake", "C", "m", {}))
    assert state.idempotency == {}


def test_result_reported_v1_cases_read_unit_and_direction_as_unknown():
    line, _ = encode(E.ResultReported("u1", "r1", "L1", "c" * 64, True, True,
                                      [{"test_case_id": "c", "correctness": "passed"}], {}), 1, TS, GENESIS)
    doc = json.loads(line)
    doc["v"] = 1
    env = decode_line(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
    assert env.payload["cases"] == [{"test_case_id": "c", "correctness": "passed", "unit": None,
                                     "direction": None}]
    summary = E.CaseSummary.from_json(env.payload["cases"][0])
    assert summary == E.CaseSummary("c", "passed", False, None, None, None, None)


# --- the review of a kernel's harnesses ----------------------------------------------------------

H1, H2 = "a" * 64, "b" * 64


def accepted_existing(uuid="u2", kid="sm_90/A/x/fp16/k", harness_change=False):
    """An accept of a kernel that exists already: its harness locked, or a maintainer's change of it."""
    return [E.SubmissionReceived(uuid, kid, "alice", "http", "p.tar.gz", 10, "a" * 64),
            E.SubmissionValidated(uuid, kid, "sm_90", False, [], harness_change),
            E.JobQueued(uuid, kid, "sm_90"), E.JobClaimed(uuid, "r1", "L1", 100.0, 1),
            E.ResultReported(uuid, "r1", "L1", "c" * 64, True, True, [], {}),
            E.AcceptStarted(uuid, kid, SRC), E.AcceptSourceCommitted(uuid, "3" * 40, BR),
            E.AcceptScorecardCommitted(uuid, "3" * 40, "4" * 40), E.AcceptCompleted(uuid, "3" * 40, "4" * 40)]


def test_an_accept_that_brought_its_harness_is_recorded_until_it_is_revoked():
    kid = "sm_90/A/x/fp16/k"
    state = push(State(), *accepted("u1", kid))  # a new kernel: its first submission brought the harness
    assert state.harnesses == {kid: {"brought": {"u1": SRC}, "approved": {}}} and state.harness_seq == state.seq
    push(state, *accepted_existing("u2", kid))  # the locked harness: nothing new to review
    assert state.harnesses[kid]["brought"] == {"u1": SRC}
    push(state, *accepted_existing("u3", kid, harness_change=True))  # a maintainer's change is brought too
    assert state.harnesses[kid]["brought"] == {"u1": SRC, "u3": "3" * 40}
    push(state, E.SubmissionRevoked("u3", "admin", "bad harness"))
    assert state.harnesses[kid]["brought"] == {"u1": SRC} and state.harness_seq == state.seq
    push(state, E.SubmissionRevoked("u1", "admin", "gone"))
    assert state.harnesses == {}  # nothing brought, nothing approved: no entry
    assert State.from_json(json.loads(json.dumps(state.to_json()))) == state


def test_an_approval_names_one_harness_hash_and_can_be_revoked():
    kid = "sm_90/A/x/fp16/k"
    state = push(State(), *accepted("u1", kid), E.HarnessReviewed(kid, H1, "approve", SRC, "root", "read it"))
    assert state.harnesses[kid]["approved"] == {
        H1: {"by": "root", "reason": "read it", "commit": SRC, "seq": state.seq, "at": TS}}
    push(state, E.HarnessReviewed(kid, H2, "approve", None, "root", ""))
    assert set(state.harnesses[kid]["approved"]) == {H1, H2}
    assert State.from_json(json.loads(json.dumps(state.to_json()))) == state
    marshal.dumps(state.to_json())  # the snapshot body
    for refused, why in ((E.HarnessReviewed(kid, H1, "approve", SRC, "root", ""), "approved already"),
                         (E.HarnessReviewed(kid, "c" * 64, "revoke", None, "root", ""), "is not approved"),
                         (E.HarnessReviewed("sm_90/A/x/fp16/other", H1, "revoke", None, "root", ""),
                          "is not approved")):
        before = state.copy()
        with pytest.raises(InvalidTransition, match=why):
            push(state, refused)
        assert state == before
    push(state, E.HarnessReviewed(kid, H1, "revoke", None, "root", "changed my mind"))
    assert set(state.harnesses[kid]["approved"]) == {H2}
    seq = state.seq
    push(state, E.SubmissionRevoked("u1", "admin", "gone"))  # an approval outlives the accept it was made for
    assert state.harnesses == {kid: {"brought": {}, "approved": {H2: state.harnesses[kid]["approved"][H2]}}}
    assert state.harness_seq == seq + 1


def test_checkpoint_and_restore_undo_a_harness_review():
    kid = "sm_90/A/x/fp16/k"
    state = push(State(), *accepted("u1", kid))
    before = state.copy()
    batch = [E.HarnessReviewed(kid, H1, "approve", SRC, "root", ""), *accepted("u2", "sm_90/B/x/fp16/k")]
    memo = checkpoint(state, [e.payload() for e in batch])
    push(state, *batch)
    assert H1 in state.harnesses[kid]["approved"] and "sm_90/B/x/fp16/k" in state.harnesses
    restore(state, memo)
    assert state == before


def test_finished_records_table_behaves_as_a_dict_through_growth_and_removals():
    """The compact table of accepted records (``state.Records``) against a dict: many keys (rehashes),
    removals, keys that look like uuids but are not canonical (upper case, whitespace fromhex would
    skip), and a round trip through its snapshot form."""
    from kz_events.state import Records

    rng = random.Random(7)
    table, plain = Records(), {}
    odd = ["0123 567-0123-0123-0123-012345678901", "01234567-0123-0123-0123-0123456789AB",
           "01234567-0123-0123-0123-01234567  ab", "u1"]
    for key in odd:
        table[key] = plain[key] = "k/odd"
    keys = [new_uuid(rng) for _ in range(3000)]
    for n, key in enumerate(keys):
        table[key] = plain[key] = f"k/{n % 7}"
        if n % 5 == 0:
            gone = keys[rng.randrange(n + 1)]
            if gone in plain:
                del table[gone], plain[gone]
    assert table == plain and len(table) == len(plain) and sorted(table) == sorted(plain)
    assert all(table.get(k) == plain.get(k) for k in keys + odd + [new_uuid(rng) for _ in range(100)])
    assert table._other == {k: "k/odd" for k in odd}
    assert Records.from_json(json.loads(json.dumps(table.to_json()))) == plain

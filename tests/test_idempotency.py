"""Idempotent uploads: an Idempotency-Key makes a retried POST /api/submissions answer as the first did.

Real daemon over HTTP on loopback; the key is recorded in ``submission.received`` and
folded by the reducer, so a restart keeps it.
"""
from __future__ import annotations

import io
import json
import shutil
import threading

import pytest

from kz_daemon.core.errors import ZooError
from kz_daemon.intake.idempotency import Keys, key_error
from kz_events import events as E
from kz_events.codec import decode_line, encode
from kz_events.reducer import apply, apply_record, checkpoint, restore
from kz_events.state import State
from tests.helpers.http_server import CPU_AXPY, CPU_SOFTMAX, LiveServer, package_tarball
from tests.helpers.submissions import every

AXPY_PKG = package_tarball(CPU_AXPY)
SOFTMAX_PKG = package_tarball(CPU_SOFTMAX)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = LiveServer.start(tmp_path_factory.mktemp("idem"), settings={"submit_burst": 1000})
    yield server
    server.stop()


def _post(live, client, data, key, submitter="bob", kernel_id=CPU_AXPY):
    headers = {} if key is None else {"Idempotency-Key": key}
    return live.submit(client, kernel_id, data, submitter=submitter, headers=headers)


def _uuids_of(live, submitter):
    with live.zoo.store.lock:
        return sorted(u for u, s in every(live.zoo.store).items() if s.submitter_id == submitter)


def test_a_retry_with_the_same_key_answers_the_first_submission(live):
    with live.client() as c:
        first = _post(live, c, AXPY_PKG, "retry-1", submitter="bob")
        again = _post(live, c, AXPY_PKG, "retry-1", submitter="bob")
    assert first.status_code == 202, first.text
    assert again.status_code == 202, again.text
    assert again.json()["uuid"] == first.json()["uuid"]
    assert set(again.json()) == set(first.json())
    assert again.headers["location"] == first.headers["location"]
    assert _uuids_of(live, "bob") == [first.json()["uuid"]]


def test_without_a_key_each_upload_is_a_new_submission(live):
    with live.client() as c:
        a = _post(live, c, AXPY_PKG, None, submitter="nokey")
        b = _post(live, c, AXPY_PKG, None, submitter="nokey")
    assert a.status_code == b.status_code == 202
    assert a.json()["uuid"] != b.json()["uuid"]
    assert len(_uuids_of(live, "nokey")) == 2


def test_the_same_key_with_another_package_is_409_naming_the_original(live):
    with live.client() as c:
        first = _post(live, c, AXPY_PKG, "swap-1", submitter="dave")
        other = _post(live, c, SOFTMAX_PKG, "swap-1", submitter="dave", kernel_id=CPU_SOFTMAX)
    assert first.status_code == 202, first.text
    assert other.status_code == 409, other.text
    err = other.json()["error"]
    assert err["code"] == "CONFLICT"
    assert err["details"]["uuid"] == first.json()["uuid"]
    assert first.json()["uuid"] in err["message"]
    assert _uuids_of(live, "dave") == [first.json()["uuid"]]


def test_keys_are_scoped_per_submitter(live):
    with live.client() as c:
        erin = _post(live, c, AXPY_PKG, "shared-key", submitter="erin")
        frank = _post(live, c, SOFTMAX_PKG, "shared-key", submitter="frank", kernel_id=CPU_SOFTMAX)
    assert erin.status_code == frank.status_code == 202
    assert erin.json()["uuid"] != frank.json()["uuid"]


def test_a_retry_of_an_upload_rejected_at_intake_gets_the_same_rejection(live):
    bad = package_tarball(CPU_AXPY, include_bench_result=True)
    with live.client() as c:
        first = _post(live, c, bad, "bad-1", submitter="gina")
        again = _post(live, c, bad, "bad-1", submitter="gina")
    assert first.status_code == again.status_code == 400
    a, b = first.json()["error"], again.json()["error"]
    assert a["code"] == b["code"] == "VALIDATION_ERROR"
    assert b["details"]["uuid"] == a["details"]["uuid"]
    assert b["details"]["problems"] == a["details"]["problems"]
    assert _uuids_of(live, "gina") == [a["details"]["uuid"]]


@pytest.mark.parametrize("key", ["", "k" * 129, "caf\u00e9".encode(), "tab\there"])
def test_a_malformed_key_is_400_and_creates_nothing(live, key):
    with live.client() as c:
        resp = _post(live, c, AXPY_PKG, key, submitter="hank")
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "VALIDATION_ERROR"
    assert resp.json()["error"]["details"]["header"] == "Idempotency-Key"
    assert _uuids_of(live, "hank") == []


def test_the_longest_key_is_accepted(live):
    key = "~" * 128
    with live.client() as c:
        first = _post(live, c, AXPY_PKG, key, submitter="ivy")
        again = _post(live, c, AXPY_PKG, key, submitter="ivy")
    assert first.status_code == again.status_code == 202
    assert first.json()["uuid"] == again.json()["uuid"]


def test_concurrent_uploads_with_one_key_make_one_submission(live):
    start = threading.Barrier(4)
    answers: list = []

    def upload() -> None:
        with live.client() as c:
            start.wait()
            answers.append(_post(live, c, AXPY_PKG, "race-1", submitter="jill"))

    threads = [threading.Thread(target=upload) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [a.status_code for a in answers] == [202] * 4, [a.text for a in answers]
    uuids = {a.json()["uuid"] for a in answers}
    assert len(uuids) == 1
    assert _uuids_of(live, "jill") == sorted(uuids)


def test_the_key_is_recorded_in_the_event_log(live):
    with live.client() as c:
        first = _post(live, c, AXPY_PKG, "logged-1", submitter="kim")
    uuid = first.json()["uuid"]
    received = []
    for seg in sorted((live.state_dir / "events").glob("*.jsonl")):
        for line in seg.read_bytes().splitlines():
            env = decode_line(line)
            if env.type == "submission.received" and env.payload["uuid"] == uuid:
                received.append(env.payload)
    assert [p["idempotency_key"] for p in received] == ["logged-1"]


def test_a_restart_keeps_the_keys(tmp_path):
    server = LiveServer.start(tmp_path, settings={"submit_burst": 1000})
    try:
        with server.client() as c:
            first = _post(server, c, AXPY_PKG, "durable-1", submitter="lena")
    finally:
        server.stop()
    assert first.status_code == 202, first.text
    shutil.rmtree(tmp_path / "seed")  # the seed copy is made again; the repo already has it
    server = LiveServer.start(tmp_path, settings={"submit_burst": 1000})
    try:
        with server.client() as c:
            again = _post(server, c, AXPY_PKG, "durable-1", submitter="lena")
            other = _post(server, c, SOFTMAX_PKG, "durable-1", submitter="lena", kernel_id=CPU_SOFTMAX)
        assert again.status_code == 202, again.text
        assert again.json()["uuid"] == first.json()["uuid"]
        assert other.status_code == 409
        assert other.json()["error"]["details"]["uuid"] == first.json()["uuid"]
        assert _uuids_of(server, "lena") == [first.json()["uuid"]]
    finally:
        server.stop()


# --- the parts: key syntax, the reducer's index, the time-to-live -----------------------------


def test_key_syntax():
    assert key_error("a") is None
    assert key_error(" spaced key ~") is None
    assert key_error("x" * 128) is None
    assert key_error("x" * 129) is not None
    assert key_error("") is not None
    assert key_error("caf\u00e9") is not None
    assert key_error("nl\n") is not None


def _received(uuid, submitter, key, sha="a" * 64):
    return E.SubmissionReceived(uuid=uuid, kernel_id=CPU_AXPY, submitter_id=submitter, source="http",
                                filename="p.tar.gz", size=1, sha256=sha, idempotency_key=key)


def test_the_reducer_indexes_keys_per_submitter_and_survives_a_snapshot():
    state = State()
    apply_record(state, 1, "2026-01-01T00:00:00.000000Z", "submission.received",
                 _received("u1", "bob", "k").payload())
    apply_record(state, 2, "2026-01-01T00:00:01.000000Z", "submission.received",
                 _received("u2", "carol", "k", "b" * 64).payload())
    apply_record(state, 3, "2026-01-01T00:00:02.000000Z", "submission.received",
                 _received("u3", "bob", None).payload())
    assert state.idempotency == {"bob": {"k": ["u1", "a" * 64, "2026-01-01T00:00:00.000000Z"]},
                                 "carol": {"k": ["u2", "b" * 64, "2026-01-01T00:00:01.000000Z"]}}
    assert State.from_json(json.loads(json.dumps(state.to_json()))) == state


def test_a_version_1_received_line_reads_without_a_key():
    line, _env = encode(_received("u1", "bob", None), 1, "2026-01-01T00:00:00.000000Z", "0" * 64)
    doc = json.loads(line)
    doc["v"] = 1
    del doc["payload"]["idempotency_key"]
    old = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    env = decode_line(old)
    assert env.payload["idempotency_key"] is None
    state = apply(State(), env)
    assert state.idempotency == {}
    assert "u1" in state.submissions


def test_restore_undoes_a_key_folded_in_a_refused_batch():
    state = State()
    payloads = [_received("u1", "bob", "k").payload()]
    memo = checkpoint(state, payloads)
    apply_record(state, 1, "2026-01-01T00:00:00.000000Z", "submission.received", payloads[0])
    restore(state, memo)
    assert state.idempotency == {}


def test_an_entry_older_than_the_ttl_is_ignored_and_the_key_can_be_used_again():
    keys = Keys()
    durable = ["u-old", "a" * 64, "2026-01-01T00:00:00.000000Z"]
    t0 = 1767225600.0  # 2026-01-01T00:00:00Z
    live_one = keys.decide(durable, {"u-old": 1}, "bob", "k", "a" * 64, t0 + 100, ttl_s=3600)
    assert (live_one.uuid, live_one.fresh) == ("u-old", False)
    with pytest.raises(ZooError) as exc:
        keys.decide(durable, {"u-old": 1}, "bob", "k", "b" * 64, t0 + 100, ttl_s=3600)
    assert exc.value.code == "CONFLICT"
    expired = keys.decide(durable, {"u-old": 1}, "bob", "k", "b" * 64, t0 + 3601, ttl_s=3600)
    assert expired.fresh and expired.uuid != "u-old"


def test_a_reservation_holds_the_key_until_intake_records_it_and_release_frees_it():
    keys = Keys()
    first = keys.decide(None, {}, "bob", "k", "a" * 64, 10.0, ttl_s=3600)
    twin = keys.decide(None, {}, "bob", "k", "a" * 64, 11.0, ttl_s=3600)
    assert first.fresh and (twin.uuid, twin.fresh) == (first.uuid, False)
    keys.release("bob", "k", first.uuid)
    retry = keys.decide(None, {}, "bob", "k", "a" * 64, 12.0, ttl_s=3600)
    assert retry.fresh and retry.uuid != first.uuid


def test_an_upload_dropped_before_a_restart_keeps_its_key_until_intake_records_it(tmp_path):
    from kz_daemon.ops.runtime import init_state_dir
    from kz_daemon.ops.service import Zoo
    from tests.helpers.http_server import seed_dir

    config = init_state_dir(tmp_path / "state", seed_from=seed_dir(tmp_path, [CPU_AXPY]))
    zoo = Zoo(config)  # a first life: the upload reaches the inbox, then the daemon stops
    try:
        decision = zoo.reserve_upload("mia", "crash-1", "c" * 64)
        zoo.drop_upload(io.BytesIO(AXPY_PKG), {"submitter_id": "mia", "kernel_id": CPU_AXPY,
                                               "uuid": decision.uuid, "idempotency_key": "crash-1",
                                               "idempotency_sha256": "c" * 64})
    finally:
        zoo.stop(5)
    zoo = Zoo(config)  # the next life, before its intake thread ran
    try:
        again = zoo.reserve_upload("mia", "crash-1", "c" * 64)
        assert (again.uuid, again.fresh) == (decision.uuid, False)
        with pytest.raises(ZooError) as exc:
            zoo.reserve_upload("mia", "crash-1", "d" * 64)
        assert exc.value.details["uuid"] == decision.uuid
    finally:
        zoo.stop(5)

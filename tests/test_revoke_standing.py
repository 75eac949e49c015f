"""What stands after a revocation: every best, the current record, the index and the source area.

Through the pipeline on the CPU lane: accepted records, a revocation, and HEAD's
scorecard, index.json and the kernel's files afterwards; an honest resubmission is then
judged against what stands, not against the record that was taken back.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import yaml

from kz_daemon.config.settings import Config
from kz_daemon.ops.repo_audit import audit_state_dir
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from kz_daemon.storage.history import KernelHistory
from tests.helpers.daemon import AXPY_ID, EXAMPLES, axpy_result, axpy_tarball, drop_and_decide, real_run

CARD = f"{AXPY_ID}/.kernel_package/bench_result.yaml"
NOTES = f"{AXPY_ID}/src/NOTES.md"


def _config(tmp_path, seed: bool = True) -> Config:
    state = tmp_path / "kz"
    init_state_dir(state, seed_from=EXAMPLES if seed else None)
    (state / "kz.yaml").write_text("confirmation: {margin: 0}\n")
    return Config.load(state)


@contextlib.contextmanager
def _running(config: Config) -> Iterator[Zoo]:
    zoo = Zoo(config)
    zoo.start()
    try:
        yield zoo
    finally:
        zoo.stop()


def _tarball(name: str) -> bytes:
    return axpy_tarball(mutate=lambda files: files.__setitem__("src/NOTES.md", name.encode()))


def _run(zoo, tmp_path, name: str) -> tuple[str, str, dict]:
    """Submit the Axpy example as ``name``, claim it and run it for real: (uuid, lease, result)."""
    view = drop_and_decide(zoo, f"{name}.tar.gz", _tarball(name), {"submitter_id": name})
    assert view.status == "queued", view.reasons
    claim = zoo.claim("r1", "cpu", 10)
    return view.uuid, claim.lease_id, real_run(zoo.runner_package(claim.uuid, "r1"), tmp_path / name, "r1")


def _report(zoo, name: str, result: dict):
    """Submit as ``name`` and report ``result`` for it (a runner's report, not run here)."""
    view = drop_and_decide(zoo, f"{name}.tar.gz", _tarball(name), {"submitter_id": name})
    claim = zoo.claim("r1", "cpu", 10)
    return zoo.report_result(view.uuid, "r1", claim.lease_id, result, b"", {}, None)


def _metric(result: dict, case_id: str, name: str) -> float:
    case = next(c for c in result["cases"] if c["test_case_id"] == case_id)
    return next(m["value"] for m in case["metrics"] if m["name"] == name)


def _card(zoo, sha=None) -> dict:
    return yaml.safe_load(zoo.git.read_file(CARD, sha))


def _records(card: dict) -> list[dict]:
    return [r for c in card["cases"] for key in ("metrics_best", "metrics_current") for r in c[key].values()]


def test_a_revoked_record_leaves_every_best_the_current_record_the_index_and_the_source_area(tmp_path):
    config = _config(tmp_path)
    with _running(config) as zoo:
        uuid, lease, honest = _run(zoo, tmp_path, "alice")
        alice = zoo.report_result(uuid, "r1", lease, honest, b"", {}, None)
        assert alice.status == "accepted", alice.reasons
        # mallory's report: 50x alice's speed (above the floor, far below what a CPU does), and a
        # GB/s below alice's, so the two hold different bests
        faked = axpy_result(AXPY_ID)
        for case in faked["cases"]:
            case["metrics"][0]["value"] = _metric(honest, case["test_case_id"], "latency_us") / 50
            case["metrics"][1]["value"] = _metric(honest, case["test_case_id"], "gbps") / 4
        mallory = _report(zoo, "mallory", faked)
        assert mallory.status == "accepted", mallory.reasons
        before = _card(zoo)
        assert {c["metrics_best"]["latency_us"]["submitter"] for c in before["cases"]} == {"mallory"}
        assert {c["metrics_best"]["gbps"]["submitter"] for c in before["cases"]} == {"alice"}

        # against mallory's best, an honest run is more than 10x slower: its own benchmark refuses it
        uuid, lease, early = _run(zoo, tmp_path, "carol-early")
        refused = zoo.report_result(uuid, "r1", lease, early, b"", {}, None)
        assert refused.status == "rejected" and refused.reasons[0]["code"] == "PACKAGE_REJECTED", refused.reasons

        head = zoo.git.head()
        assert zoo.revoke(mallory.uuid, "root", "a timer that skipped the work").status == "revoked"
        (commit,) = list(zoo.git.log(stop=head))
        after = _card(zoo)
        alice_card = _card(zoo, alice.sha_br)
        # no record of mallory anywhere at HEAD: bests (primary and secondary) and current records
        assert [r for r in _records(after) if r["submitter"] == "mallory" or r["commit_sha"] == mallory.commit_sha] == []
        for case, mine in zip(after["cases"], alice_card["cases"]):
            assert case["metrics_best"] == mine["metrics_current"] == case["metrics_current"]
            assert case["correctness_current"] == mine["correctness_current"]
        assert after == alice_card  # alice's run is the only one standing: her own card again
        # the source area is alice's again, in git and in the checked-out worktree
        assert zoo.git.read_file(NOTES) == b"alice"
        assert (config.paths.repo / NOTES).read_bytes() == b"alice"
        assert zoo.git.tree_of(commit.sha) == zoo.git.tree_of(alice.sha_br)
        # history keeps mallory's accept, marked revoked; the revocation itself is no point
        points = KernelHistory(config.paths.repo).accepted(AXPY_ID)
        assert [(p.submitter, p.revoked) for p in points] == [("alice", False), ("mallory", True)]

        # an honest resubmission is judged against what stands: alice's best
        uuid, lease, honest_again = _run(zoo, tmp_path, "carol")
        carol = zoo.report_result(uuid, "r1", lease, honest_again, b"", {}, None)
        assert carol.status == "accepted", carol.reasons
        final = _card(zoo)
        assert {r["submitter"] for r in _records(final)} <= {"alice", "carol"}
        assert all(c["metrics_current"]["latency_us"]["submitter"] == "carol" for c in final["cases"])
        index = zoo.index()
    entry = next(k for k in index["kernels"] if k["kernel_id"] == AXPY_ID)
    assert {c["best"]["submitter"] for c in entry["cases"]} <= {"alice", "carol"}
    on_disk = json.loads(config.paths.index.read_text())  # index.json, written at the stop
    assert on_disk["head"] == index["head"] and on_disk["kernels"] == index["kernels"]
    assert [f for f in audit_state_dir(config.state_dir) if f.severity == "error"] == []


def test_revoking_an_older_record_recomputes_each_best_and_keeps_the_latest_current(tmp_path):
    config = _config(tmp_path)

    def result(latency: float, gbps: float) -> dict:
        doc = axpy_result(AXPY_ID, latency)
        for case in doc["cases"]:
            case["metrics"][1]["value"] = gbps
        return doc

    with _running(config) as zoo:
        assert _report(zoo, "alice", result(5.0, 1.0)).status == "accepted"
        mallory = _report(zoo, "mallory", result(1.0, 9.0))
        bob = _report(zoo, "bob", result(6.0, 2.0))
        assert bob.status == "accepted"
        current = [c["metrics_current"] for c in _card(zoo)["cases"]]
        zoo.revoke(mallory.uuid, "root", "cached outputs")
        after = _card(zoo)
        for case in after["cases"]:
            assert (case["metrics_best"]["latency_us"]["submitter"], case["metrics_best"]["latency_us"]["value"]) \
                == ("alice", 5.0)
            assert (case["metrics_best"]["gbps"]["submitter"], case["metrics_best"]["gbps"]["value"]) == ("bob", 2.0)
        assert [c["metrics_current"] for c in after["cases"]] == current  # bob's, the latest standing
        assert zoo.git.read_file(NOTES) == b"bob"
        entry = next(k for k in zoo.index()["kernels"] if k["kernel_id"] == AXPY_ID)
        assert {c["best"]["submitter"] for c in entry["cases"]} == {"alice"}
    assert [f for f in audit_state_dir(config.state_dir) if f.severity == "error"] == []


def test_revoking_the_record_that_created_a_kernel_removes_it(tmp_path):
    config = _config(tmp_path, seed=False)
    with _running(config) as zoo:
        only = _report(zoo, "alice", axpy_result(AXPY_ID, 5.0))
        assert only.status == "accepted" and zoo.git.read_file(CARD) is not None
        zoo.revoke(only.uuid, "root", "not a kernel")
        assert zoo.git.read_file(CARD) is None and not zoo.git.is_dir(AXPY_ID)
        assert AXPY_ID not in {k["kernel_id"] for k in zoo.index()["kernels"]}
        assert not (config.paths.repo / AXPY_ID).exists()
        again = _report(zoo, "carol", axpy_result(AXPY_ID, 6.0))  # a new kernel once more
        assert again.status == "accepted" and again.new_kernel
        assert {r["submitter"] for r in _records(_card(zoo))} == {"carol"}
    assert [f for f in audit_state_dir(config.state_dir) if f.severity == "error"] == []

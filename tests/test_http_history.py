"""A kernel's accepted history from git (dulwich), incremental when the branch moves."""
from __future__ import annotations

import yaml

from kz_daemon.gitstore import GitStore
from kz_daemon.history import KernelHistory

KID = "cpu/Elementwise/Axpy/fp32/h"
PATH = f"{KID}/.kernel_package/bench_result.yaml"
AUTHOR = "kz test <kz@localhost>"


def _scorecard(value: float, sha: str, who: str) -> bytes:
    record = {"value": value, "submitter": who, "commit_sha": sha, "recorded_at": "2026-11-30T00:00:00Z"}
    doc = {"schema_version": "1.0.0", "kernel_id": KID,
           "cases": [{"test_case_id": "n4k", "metrics_best": {"latency_us": record},
                      "metrics_current": {"latency_us": record}, "correctness_current": "passed"}]}
    return yaml.safe_dump(doc).encode()


def test_history_skips_the_seed_and_grows_incrementally(tmp_path):
    git = GitStore.init(tmp_path / "repo")
    head = git.commit_changes({PATH: _scorecard(1000.0, "0000000", "seed"),
                               f"{KID}/src/a.py": b"x = 1\n"}, "seed", AUTHOR, None)
    head = git.commit_changes({f"{KID}/src/a.py": b"x = 2\n"}, "source 1", AUTHOR, head)
    head = git.commit_changes({PATH: _scorecard(40.0, head, "alice")}, "bench_result update", AUTHOR, head)
    # an unrelated kernel's accept does not show up
    head = git.commit_changes({"cpu/Other/x/fp32/y/.kernel_package/bench_result.yaml": b"cases: []\n"},
                              "other", AUTHOR, head)
    history = KernelHistory(tmp_path / "repo", branch="main")
    points = history.accepted(KID)
    assert [(p.submitter, p.metrics) for p in points] == [("alice", {"n4k": {"latency_us": 40.0}})]
    assert history.accepted(KID) is points  # cached while the head stays
    src = git.commit_changes({f"{KID}/src/a.py": b"x = 3\n"}, "source 2", AUTHOR, head)
    git.commit_changes({PATH: _scorecard(20.0, src, "bob")}, "bench_result update", AUTHOR, src)
    points = history.accepted(KID)
    assert [p.submitter for p in points] == ["alice", "bob"]
    assert points[-1].commit_sha == src and points[-1].metrics["n4k"]["latency_us"] == 20.0
    # a fresh reader (no cache) agrees with the incremental one
    assert KernelHistory(tmp_path / "repo").accepted(KID) == points
    desc, scorecard = history.package_docs(KID)
    assert desc is None and scorecard["cases"][0]["metrics_best"]["latency_us"]["submitter"] == "bob"
    assert history.head() is not None
    git.close()


def test_missing_repo_is_empty(tmp_path):
    history = KernelHistory(tmp_path / "nothing")
    assert history.accepted(KID) == [] and history.head() is None
    assert history.package_docs(KID) == (None, None)

"""Git reads for the pages: a kernel's accepted history (incremental when the branch moves), its harness, a commit."""
from __future__ import annotations

import yaml
from dulwich.objects import Blob

from kz_daemon.storage.gitstore import GitStore, format_message
from kz_daemon.storage.history import KernelHistory
from kz_daemon.web.commits import read_commit

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


def test_package_docs_are_mappings_or_none_as_the_contract_reads_them(tmp_path):
    """A desc.yaml that is a list, a scalar or bad YAML reaches the pages and the API as None."""
    git = GitStore.init(tmp_path / "repo")
    desc_path = f"{KID}/.kernel_package/desc.yaml"
    history = KernelHistory(tmp_path / "repo")
    head = None
    for raw, expected in ((b"- a\n- b\n", None), (b"just text\n", None), (b"a: [1\n", None),
                          (b"op_type: Axpy\n", {"op_type": "Axpy"})):
        head = git.commit_changes({desc_path: raw, PATH: b"- not a scorecard\n"}, "docs", AUTHOR, head)
        assert history.package_docs(KID) == (expected, None), raw
    git.close()


def test_harness_is_the_benchmark_blob_at_head_with_its_declared_metrics(tmp_path):
    git = GitStore.init(tmp_path / "repo")
    bench = f"{KID}/.kernel_package/benchmark.py"
    metas = ('KERNEL_ZOO_TEST_CASE_METAS = [{"test_case_id": "n4k", "params": {}, "primary_metric": "latency_us", '
             '"metrics": [{"name": "latency_us", "unit": "us", "direction": "lower_better"}, '
             '{"name": "gbps", "unit": "GB/s", "direction": "higher_better"}], '
             '"tolerance": {"correctness_atol": 0, "correctness_rtol": 0}}]\n')
    head = git.commit_changes({bench: metas.encode()}, "seed", AUTHOR, None)
    history = KernelHistory(tmp_path / "repo")
    harness = history.harness(KID)
    assert harness.blob == Blob.from_string(metas.encode()).id.decode()
    assert harness.metrics == {"n4k": {"latency_us": {"unit": "us", "direction": "lower_better"},
                                       "gbps": {"unit": "GB/s", "direction": "higher_better"}}}
    changed = metas + "# a new harness\n"
    git.commit_changes({bench: changed.encode()}, "harness", AUTHOR, head)
    assert history.harness(KID).blob == Blob.from_string(changed.encode()).id.decode()
    assert history.harness("cpu/none/x/fp32/y").blob is None
    git.close()


def test_commit_view_has_trailers_binary_summary_and_a_bounded_diff(tmp_path):
    git = GitStore.init(tmp_path / "repo")
    head = git.commit_changes({f"{KID}/src/a.py": b"x = 1\n"}, "seed", AUTHOR, None)
    message = format_message("accept k (submission 1234)", {"Kz-Submission": "u-1", "Kz-Step": "source"},
                             body="why it changed")
    big = "".join(f"line {i}\n" for i in range(5000)).encode()
    sha = git.commit_changes({f"{KID}/src/a.py": b"x = 2\n", f"{KID}/src/w.bin": b"\x00\x01\x02" * 50,
                              f"{KID}/src/big.txt": big}, message, AUTHOR, head)
    view = read_commit(tmp_path / "repo", sha, max_diff=4096)
    assert view.subject == "accept k (submission 1234)" and view.body == "why it changed"
    assert view.trailers == (("Kz-Submission", "u-1"), ("Kz-Step", "source"))
    assert view.parents == (head,)
    assert {(f.kind, f.path.rsplit("/", 1)[-1]) for f in view.files} == {
        ("modify", "a.py"), ("add", "w.bin"), ("add", "big.txt")}
    assert view.diff_truncated and sum(len(line.text) + 1 for line in view.diff) <= 4096
    full = read_commit(tmp_path / "repo", sha)
    texts = [line.text for line in full.diff]
    assert not full.diff_truncated and "+x = 2" in texts and "-x = 1" in texts
    assert any(t.startswith("Binary files") and "w.bin" in t for t in texts)
    assert "\x00" not in "".join(texts)
    assert read_commit(tmp_path / "repo", head).parents == ()
    assert read_commit(tmp_path / "repo", "0" * 40) is None
    assert read_commit(tmp_path / "repo", sha[:10]) is None
    assert read_commit(tmp_path / "nothing", sha) is None
    git.close()

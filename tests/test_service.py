"""The Zoo facade (kz_daemon/service.py) end to end on CPU: spool → queued → claimed → real run →
accepted with the two-commit model, a failing result rejected, a stranger's report refused."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from kz_daemon.runtime import init_state_dir
from kz_daemon.service import Zoo
from tests.helpers.daemon import AXPY_ID, EXAMPLES, axpy_tarball, drop_into_inbox, real_run, wait_for

GIT = shutil.which("git")


@pytest.fixture
def zoo(tmp_path):
    config = init_state_dir(tmp_path / "kz", seed_from=EXAMPLES)
    z = Zoo(config)
    z.start()
    yield z
    z.stop()


def git(repo, *args):
    return subprocess.run([GIT, "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def submit_and_run(zoo, tmp_path, kernel_id, data, name="pkg.tar.gz"):
    drop_into_inbox(zoo.config.paths.spool, name, data)
    sub_uuid = wait_for(lambda: next((u for u, s in zoo.store.state.submissions.items()
                                      if s.kernel_id == kernel_id and s.status != "accepted"
                                      and s.status != "rejected" or False), None))
    view = zoo.wait_intake(sub_uuid, 30)
    assert view.status == "queued", view
    claim = zoo.claim("runner-1", "cpu", wait_s=5)
    assert claim is not None and claim.uuid == sub_uuid
    package = zoo.runner_package(sub_uuid, "runner-1")
    result = real_run(package, tmp_path / f"run-{sub_uuid[:8]}")
    return sub_uuid, claim, result


def test_accept_gives_exactly_two_commits(zoo, tmp_path):
    base = zoo.git.head()
    index_version = zoo.store.state.index_version
    data = axpy_tarball(mutate=lambda f: f.__setitem__("src/NOTES.md", b"faster\n"))
    sub_uuid, claim, result = submit_and_run(zoo, tmp_path, AXPY_ID, data)
    assert result["overall"]["accept"] is True, result
    view = zoo.report_result(sub_uuid, "runner-1", claim.lease_id, result, b"log", {"host": "t"}, None)
    assert view.status == "accepted"
    log = list(zoo.git.log(stop=base))
    assert len(log) == 2
    commit2, commit1 = log
    assert view.commit_sha == commit1.sha and view.sha_br == commit2.sha == zoo.git.head()
    assert commit2.subject == f"bench_result update (source {commit1.sha[:7]})"
    assert commit1.trailers["Kz-Submission"] == sub_uuid and commit1.trailers["Kz-Step"] == "source"
    assert commit2.trailers["Kz-Runner"] == "runner-1"
    bench_path = f"{AXPY_ID}/.kernel_package/bench_result.yaml"
    # commit 1 leaves the scorecard alone, commit 2 changes only it
    assert zoo.git.read_file(bench_path, commit1.sha) == zoo.git.read_file(bench_path, base)
    assert zoo.git.read_file(f"{AXPY_ID}/src/NOTES.md", commit1.sha) == b"faster\n"
    changed = {p for p, _m, s in zoo.git.walk_files("", commit2.sha)} ^ set()
    diff = [p for p in changed if zoo.git.read_file(p, commit2.sha) != zoo.git.read_file(p, commit1.sha)]
    assert diff == [bench_path]
    card = yaml.safe_load(zoo.git.read_file(bench_path))
    shas = {r["commit_sha"] for c in card["cases"] for r in c["metrics_current"].values()}
    assert shas == {commit1.sha}
    assert zoo.index()["head"] == commit2.sha  # in memory at once; the file follows
    wait_for(lambda: zoo.store.state.index_version > index_version
             and json.loads(zoo.config.paths.index.read_text())["head"] == commit2.sha)
    if GIT:
        git(zoo.git.root, "fsck", "--strict")
        assert git(zoo.git.root, "rev-parse", "HEAD").strip() == commit2.sha


def test_new_kernel_id_becomes_a_new_package(zoo, tmp_path):
    kid = "cpu/Elementwise/Axpy/fp32/my_impl"
    assert not zoo.git.exists(kid)
    sub_uuid, claim, result = submit_and_run(zoo, tmp_path, kid, axpy_tarball(kid))
    assert zoo.store.state.submissions[sub_uuid].new_kernel is True
    view = zoo.report_result(sub_uuid, "runner-1", claim.lease_id, result, b"", {}, None)
    assert view.status == "accepted", view.reasons
    card = yaml.safe_load(zoo.git.read_file(f"{kid}/.kernel_package/bench_result.yaml"))
    assert card["kernel_id"] == kid
    best = [r for c in card["cases"] for r in c["metrics_best"].values()]
    assert best and all(r["commit_sha"] == view.commit_sha for r in best)  # no sentinel survives
    assert {e["kernel_id"] for e in zoo.index()["kernels"]} >= {kid, AXPY_ID}


def test_failing_result_is_rejected_without_a_commit(zoo, tmp_path):
    def break_it(files):
        files["src/axpy.py"] = files["src/axpy.py"].replace(b"+ y", b"- y").replace(b"add(", b"subtract(")
    base = zoo.git.head()
    sub_uuid, claim, result = submit_and_run(zoo, tmp_path, AXPY_ID, axpy_tarball(mutate=break_it))
    assert result["overall"]["accept"] is False
    view = zoo.report_result(sub_uuid, "runner-1", claim.lease_id, result, b"", {}, None)
    assert view.status == "rejected"
    assert view.reasons[0]["stage"] == "result"
    assert zoo.git.head() == base


def test_result_from_a_stranger_is_refused(zoo, tmp_path):
    from kz_daemon.errors import ZooError

    sub_uuid, claim, result = submit_and_run(zoo, tmp_path, AXPY_ID, axpy_tarball())
    with pytest.raises(ZooError) as info:
        zoo.report_result(sub_uuid, "someone-else", claim.lease_id, result, b"", {}, None)
    assert info.value.code == "LEASE_LOST"
    with pytest.raises(ZooError):
        zoo.report_result(sub_uuid, "runner-1", "wrong-lease", result, b"", {}, None)
    assert zoo.submission(sub_uuid).status == "running"

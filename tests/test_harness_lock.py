"""The locked harness over HTTP: an existing kernel's harness files change only through a maintainer."""
from __future__ import annotations

import io
import tarfile

import pytest
import yaml

from kz_daemon.guards.harness_lock import SHORT_SHA, blob_sha, is_maintainer
from tests.helpers.daemon import axpy_result, wait_for
from tests.helpers.http_server import CPU_AXPY, EXAMPLES, LiveServer, package_tarball

BENCH = ".kernel_package/benchmark.py"
CONFIG = "maintainers:\n  cpu/Elementwise: [bob, eve]\n"  # eve holds no token


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = LiveServer.start(tmp_path_factory.mktemp("harness"), kernels=[CPU_AXPY], config_yaml=CONFIG)
    from kz_daemon.config.tokens import TokenStore
    store = TokenStore(srv.state_dir / "auth.yaml")
    srv.tokens["submitter:bob"] = store.issue("submitter", "bob")
    yield srv
    srv.stop()


def changed_harness(files):
    files[BENCH] = files[BENCH] + b"\n# a harness change\n"


def submit(server, token, submitter, mutate=None):
    with server.client(token) as c:
        return server.submit(c, CPU_AXPY, package_tarball(CPU_AXPY, mutate=mutate), submitter=submitter)


@pytest.mark.parametrize("token, submitter", [(None, "eve"), ("submitter:alice", "alice")])
def test_a_harness_change_by_a_non_maintainer_is_refused_with_the_way_out(server, token, submitter):
    r = submit(server, token, submitter, changed_harness)
    assert r.status_code == 400, r.text
    details = r.json()["error"]["details"]
    (reason,) = details["reasons"]
    assert reason["code"] == "HARNESS_LOCKED"
    assert "harness files are locked: benchmark.py differs from the repo's" in reason["message"]
    assert f"/api/kernels/{CPU_AXPY}/files/{BENCH}" in reason["message"]
    assert f"git show HEAD:{CPU_AXPY}/{BENCH}" in reason["message"]


def test_the_current_harness_is_served_and_resubmitting_it_passes(server):
    with server.client() as c:
        r = c.get(f"/api/kernels/{CPU_AXPY}/files/{BENCH}")
        assert r.status_code == 200
        assert r.content == (EXAMPLES / CPU_AXPY / BENCH).read_bytes()
        assert c.get(f"/api/kernels/{CPU_AXPY}/files/.kernel_package/nope.py").status_code == 404
        assert c.get(f"/api/kernels/no/such/kernel/x/y/files/{BENCH}").status_code == 404
    r = submit(server, None, "carol")
    assert r.status_code == 202, r.text
    with server.client() as c:
        doc = c.get(r.json()["status_url"]).json()
    assert doc["harness_change"] is False and doc["new_kernel"] is False


@pytest.mark.parametrize("token, submitter", [("submitter:bob", "bob"), ("admin", "root")])
def test_a_maintainer_or_an_admin_may_change_the_harness(server, token, submitter):
    r = submit(server, token, submitter, changed_harness)
    assert r.status_code == 202, r.text
    with server.client() as c:
        doc = c.get(r.json()["status_url"]).json()
    assert doc["harness_change"] is True


def test_a_maintainer_claim_needs_a_token_bound_to_the_id():
    maintainers = {"cpu/Elementwise": ("bob",)}
    assert is_maintainer("cpu/Elementwise/Axpy/fp32/x", {"kind": "submitter", "id": "bob"}, maintainers)
    assert not is_maintainer("cpu/Elementwise/Axpy/fp32/x", None, maintainers)  # the open policy
    assert not is_maintainer("cpu/ElementwiseX/a/b/c", {"kind": "submitter", "id": "bob"}, maintainers)
    assert not is_maintainer("cpu/Elementwise/a/b/c", {"kind": "runner", "id": "bob"}, maintainers)
    assert is_maintainer("gfx928/x/y/z/w", {"kind": "admin", "id": "root"}, {})


def test_the_runner_runs_heads_harness_even_when_it_changed_after_intake(server):
    zoo = server.zoo
    r = submit(server, None, "dave")
    assert r.status_code == 202, r.text
    sub_uuid = r.json()["uuid"]
    new_bench = (EXAMPLES / CPU_AXPY / BENCH).read_bytes() + b"\n# the maintainers' newer harness\n"
    with zoo.git_lock:
        zoo.git.commit_changes({f"{CPU_AXPY}/{BENCH}": new_bench}, "maintainers: harness",
                               "kernel_zoo <kz@localhost>", zoo.git.head())
    claim = wait_for(lambda: _claim_until(zoo, sub_uuid))
    tarball = zoo.runner_package(sub_uuid, "r1")
    with tarfile.open(fileobj=io.BytesIO(tarball.read_bytes())) as tf:
        got = tf.extractfile(f"{CPU_AXPY}/{BENCH}").read()
    assert got == new_bench
    zoo.release(sub_uuid, "r1", claim.lease_id)


def test_accepting_an_ordinary_submission_keeps_the_harness_a_maintainer_landed_meanwhile(server):
    zoo = server.zoo
    kp = f"{CPU_AXPY}/.kernel_package"
    current = {f".kernel_package/{n}": zoo.git.read_file(f"{kp}/{n}")  # HEAD's harness (earlier tests move it)
               for n in ("desc.yaml", "build_test_env.py", "benchmark.py")}
    r = submit(server, None, "erin", lambda files: files.update(current))
    assert r.status_code == 202, r.text
    sub_uuid = r.json()["uuid"]
    with zoo.git_lock:
        desc = zoo.git.read_file(f"{kp}/desc.yaml")
        newer = zoo.git.read_file(f"{CPU_AXPY}/{BENCH}") + b"\n# the maintainers' harness, landed while erin waited\n"
        zoo.git.commit_changes({f"{CPU_AXPY}/{BENCH}": newer}, "maintainers: harness",
                               "kernel_zoo <kz@localhost>", zoo.git.head())
    claim = wait_for(lambda: _claim_until(zoo, sub_uuid))
    view = zoo.report_result(sub_uuid, "r1", claim.lease_id, axpy_result(CPU_AXPY), b"", {}, None)
    assert view.status == "accepted", view.reasons
    sha_src = zoo.store.submission(sub_uuid).sha_src
    assert zoo.git.read_file(f"{CPU_AXPY}/{BENCH}", sha_src) == newer  # commit 1 did not put the old one back
    assert zoo.git.read_file(f"{CPU_AXPY}/{BENCH}") == newer
    assert zoo.git.read_file(f"{kp}/desc.yaml", sha_src) == desc
    card = yaml.safe_load(zoo.git.read_file(f"{kp}/bench_result.yaml"))
    harnesses = {rec["harness"] for case in card["cases"] for rec in case["metrics_current"].values()}
    assert harnesses == {blob_sha(newer)[:SHORT_SHA]}


def _claim_until(zoo, sub_uuid):
    """Claim as r1 until the claim is ``sub_uuid`` (earlier tests left other jobs queued)."""
    got = zoo.claim("r1", "cpu", 0)
    if got is None:
        return None
    if got.uuid != sub_uuid:
        zoo.cancel(got.uuid, "test")
        return None
    return got

"""Kernel source over HTTP against the real daemon: files, records, revs, tarballs, and the kernel_id shape.

The test plays the runner by hand (claim, result) so each accept's two commits are known;
git is read back with dulwich to compare what the API serves with what the repo holds.
"""
from __future__ import annotations

import base64
import io
import json
import shutil
import tarfile
import time

import httpx
import pytest
from dulwich.objects import Blob, Commit, Tree
from dulwich.repo import Repo

from kz_runner.contract.pack import pack_package
from kz_runner.contract.validate import validate_tarball
from tests.helpers.http_server import CPU_AXPY, CPU_SOFTMAX, EXAMPLES, package_tarball
from tests.helpers.live_api import api_error, live_server, result_doc

live = live_server("source")
FASTER = b"\n# a faster axpy: same maths\n"


def _accept(live, source_change: bytes = FASTER, latency: float = 5.0, submitter: str = "carol") -> dict:
    """Submit the Axpy example with ``source_change`` appended to its source and accept it; its final status."""
    def mutate(files):
        files["src/axpy.py"] = files["src/axpy.py"] + source_change

    with live.client() as anon, live.client("runner:r1") as runner:
        resp = live.submit(anon, CPU_AXPY, package_tarball(CPU_AXPY, mutate=mutate), submitter=submitter)
        assert resp.status_code == 202, resp.text
        uuid = resp.json()["uuid"]
        claim = runner.post("/api/runner/claim", json={"arch": "cpu", "wait": 10}).json()
        assert claim["uuid"] == uuid
        body = {"lease_id": claim["lease_id"], "result": result_doc(CPU_AXPY, latency),
                "logs_b64": base64.b64encode(b"ok").decode(), "env": {}, "failure": None}
        view = runner.post(f"/api/submissions/{uuid}/result", json=body).json()
    assert view["status"] == "accepted", json.dumps(view)[:3000]
    return view


@pytest.fixture(scope="module")
def accepted(live):
    """One accept on top of the seed: records scorecard, source, seed (newest first)."""
    return _accept(live)


def _raw_get(live, path: str) -> tuple[int, dict]:
    """GET a path exactly as written (httpx would normalise ``..`` away before sending it)."""
    url = httpx.URL(live.url).copy_with(raw_path=path.encode())
    resp = httpx.get(url, timeout=30)
    return resp.status_code, resp.json()


def test_files_at_head_are_what_git_holds(live, anon, accepted):
    doc = anon.get(f"/api/kernels/{CPU_AXPY}/files").json()
    with Repo(str(live.state_dir / "repo")) as repo:
        head = repo.refs[f"refs/heads/{live.zoo.config.repo.branch}".encode()].decode()
    assert doc["commit"] == head and doc["record"]["step"] == "scorecard"
    paths = [f["path"] for f in doc["files"]]
    assert paths == sorted(paths) and "src/axpy.py" in paths and ".kernel_package/bench_result.yaml" in paths
    source = next(f for f in doc["files"] if f["path"] == "src/axpy.py")
    raw = anon.get(source["url"])
    assert raw.status_code == 200 and raw.content.endswith(FASTER) and source["size"] == len(raw.content)
    assert raw.headers["content-type"] == "text/plain; charset=utf-8"
    assert raw.headers["x-content-type-options"] == "nosniff" and "sandbox" in raw.headers["content-security-policy"]
    assert raw.headers["x-kz-commit"] == head
    assert doc["tarball_url"] == f"/api/kernels/{CPU_AXPY}/tarball?rev={head}"


def test_paths_outside_the_package_are_refused(live, anon, accepted):
    base = f"/api/kernels/{CPU_AXPY}/files/"
    for sneaky in ("..%2F..%2Fcpu%2FReduction%2Fetc", "src/..%2F..%2F.kernel_package%2Fdesc.yaml", "src//axpy.py",
                   "%2E%2E/x"):
        status, body = _raw_get(live, base + sneaky)
        assert (status, body["error"]["code"]) == (400, "BAD_REQUEST"), (sneaky, body)
    api_error(anon.get(base + "src/nope.py"), 404, "NOT_FOUND")
    api_error(anon.get(base + ".kernel_package"), 404, "NOT_FOUND")  # a folder is not a file
    api_error(anon.get("/api/kernels/cpu/Elementwise/Axpy/fp32/nope/files"), 404, "NOT_FOUND")


def test_any_record_is_readable_by_full_or_short_sha(live, anon, accepted):
    records = anon.get(f"/api/kernels/{CPU_AXPY}/commits").json()["commits"]
    assert [r["step"] for r in records] == ["scorecard", "source", "seed"]
    scorecard, source, seed = records
    assert source["commit"] == accepted["commit_sha"] and source["submission"] == accepted["uuid"]
    assert source["submitter"] == "carol" and scorecard["parent"] == source["commit"]
    url = f"/api/kernels/{CPU_AXPY}/files/src/axpy.py"
    original = (EXAMPLES / CPU_AXPY / "src" / "axpy.py").read_bytes()
    assert anon.get(url, params={"rev": seed["commit"]}).content == original
    for rev in (source["commit"], source["commit"][:7], source["commit"][:4].upper(), "HEAD"):
        assert anon.get(url, params={"rev": rev}).content == original + FASTER, rev
    listed = anon.get(f"/api/kernels/{CPU_AXPY}/files", params={"rev": seed["commit"][:10]}).json()
    assert listed["commit"] == seed["commit"]
    unknown = next(p for p in ("0000", "ffff", "1234") if not any(r["commit"].startswith(p) for r in records))
    api_error(anon.get(url, params={"rev": unknown}), 404, "NOT_FOUND")
    api_error(anon.get(url, params={"rev": "xyz"}), 400, "BAD_REQUEST")
    api_error(anon.get(url, params={"rev": "abc"}), 400, "BAD_REQUEST")  # under git's four digits
    api_error(anon.get(url, params=[("rev", "HEAD"), ("rev", "HEAD")]), 400, "BAD_REQUEST")
    # a commit of the repo that is no record of this kernel: the Axpy accept never touched the softmax
    softmax = f"/api/kernels/{CPU_SOFTMAX}/files/.kernel_package/desc.yaml"
    api_error(anon.get(softmax, params={"rev": source["commit"]}), 404, "NOT_FOUND")
    assert anon.get(softmax, params={"rev": seed["commit"]}).status_code == 200


def test_the_tarball_is_what_kz_pack_writes_and_can_be_resubmitted(live, anon, accepted, tmp_path):
    seed = anon.get(f"/api/kernels/{CPU_AXPY}/commits").json()["commits"][-1]
    resp = anon.get(f"/api/kernels/{CPU_AXPY}/tarball", params={"rev": seed["commit"][:8]})
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/gzip"
    assert f'filename="cpu__Elementwise__Axpy__fp32__numpy_ref@{seed["commit"][:10]}.tar.gz"' in \
        resp.headers["content-disposition"]
    copy = tmp_path / "repo" / CPU_AXPY  # the example as the seed committed it, packed by kz pack
    shutil.copytree(EXAMPLES / CPU_AXPY, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "repo" / ".kernel_zoo_root").touch()
    packed = pack_package(copy, tmp_path / "packed.tar.gz")
    assert packed.path is not None and packed.path.read_bytes() == resp.content
    head = anon.get(f"/api/kernels/{CPU_AXPY}/tarball").content
    with tarfile.open(fileobj=io.BytesIO(head), mode="r:gz") as tar:
        names = tar.getnames()
    assert f"{CPU_AXPY}/src/axpy.py" in names and not any(n.endswith("bench_result.yaml") for n in names)
    assert validate_tarball(io.BytesIO(head), "head.tar.gz", kernel_id=CPU_AXPY).valid
    again = live.submit(anon, CPU_AXPY, head, submitter="dave")
    assert again.status_code == 202 and again.json()["status"] == "queued", again.text
    with live.client("admin") as admin:
        assert admin.post(f"/api/submissions/{again.json()['uuid']}/cancel", json={}).status_code == 200


def _commit_with_prefix(repo_path, branch: bytes, kernel_id: str, prefix: str) -> str:
    """A commit on ``branch`` that adds a file to the kernel, its message varied until its SHA starts with ``prefix``."""
    with Repo(str(repo_path)) as repo:
        head = repo.refs[b"refs/heads/" + branch]
        blob = Blob.from_string(b"a note\n")
        repo.object_store.add_object(blob)

        def put(tree_id: bytes, parts: list[bytes]) -> bytes:
            tree = Tree()
            for entry in repo[tree_id].iteritems():
                tree.add(entry.path, entry.mode, entry.sha)
            if len(parts) == 1:
                tree.add(parts[0], 0o100644, blob.id)
            else:
                tree.add(parts[0], 0o040000, put(tree[parts[0]][1], parts[1:]))
            repo.object_store.add_object(tree)
            return tree.id

        commit = Commit()
        commit.tree = put(repo[head].tree, [p.encode() for p in f"{kernel_id}/NOTE.txt".split("/")])
        commit.parents = [head]
        commit.author = commit.committer = b"test <test@example.org>"
        commit.author_time = commit.commit_time = int(time.time())
        commit.author_timezone = commit.commit_timezone = 0
        for nonce in range(5_000_000):  # 16**4 tries on average
            commit.message = f"a note ({nonce})\n".encode()
            if commit.id.decode().startswith(prefix):
                break
        repo.object_store.add_object(commit)
        assert repo.refs.set_if_equals(b"refs/heads/" + branch, head, commit.id)
        return commit.id.decode()


def test_an_ambiguous_short_sha_is_409_with_the_candidates(tmp_path_factory):
    from tests.helpers.http_server import LiveServer

    server = LiveServer.start(tmp_path_factory.mktemp("ambiguous"), kernels=[CPU_AXPY])
    try:
        with server.client() as anon:
            seed = anon.get(f"/api/kernels/{CPU_AXPY}/commits").json()["commits"][0]["commit"]
            with server.zoo.git_lock:
                twin = _commit_with_prefix(server.state_dir / "repo", server.zoo.config.repo.branch.encode(),
                                           CPU_AXPY, seed[:4])
            records = [r["commit"] for r in anon.get(f"/api/kernels/{CPU_AXPY}/commits").json()["commits"]]
            assert records == [twin, seed]
            err = api_error(anon.get(f"/api/kernels/{CPU_AXPY}/files", params={"rev": seed[:4]}), 409,
                            "AMBIGUOUS_REV")
            assert sorted(err["details"]["candidates"]) == sorted([twin, seed])
            common = next(i for i in range(4, 41) if seed[:i] != twin[:i])
            assert anon.get(f"/api/kernels/{CPU_AXPY}/files", params={"rev": seed[:common]}).json()["commit"] == seed
            assert anon.get(f"/api/kernels/{CPU_AXPY}/files/NOTE.txt", params={"rev": twin[:common]}).text == \
                "a note\n"
    finally:
        server.stop()


def test_a_path_saying_sm_90_with_a_desc_saying_cpu_is_refused(live, anon):
    kernel_id = "sm_90/Elementwise/Axpy/fp32/lane_mismatch"  # desc.yaml keeps category.arch: cpu
    resp = live.submit(anon, kernel_id, package_tarball(kernel_id, CPU_AXPY), submitter="carol")
    err = api_error(resp, 400, "VALIDATION_ERROR")
    assert "CATEGORY_MISMATCH" in [p["code"] for p in err["details"]["problems"]]
    mismatch = next(p for p in err["details"]["problems"] if p["code"] == "CATEGORY_MISMATCH")
    assert "category.arch" in mismatch["message"] and "sm_90" in mismatch["message"], mismatch
    assert anon.get("/api/kernels", params={"arch": "sm_90"}).json()["total"] == 0


def test_a_tarball_whose_top_directory_is_one_name_is_refused(live, anon):
    data = package_tarball("wrong", CPU_AXPY)
    err = api_error(live.submit(anon, "wrong", data, submitter="carol"), 400, "VALIDATION_ERROR")
    assert [p["code"] for p in err["details"]["problems"]] == ["KERNEL_ID_INVALID"]
    assert "exactly 5" in err["details"]["problems"][0]["message"]
    err = api_error(live.submit(anon, CPU_AXPY, data, submitter="carol"), 400, "VALIDATION_ERROR")
    assert "TARBALL_TOP_DIR" in [p["code"] for p in err["details"]["problems"]]


def test_the_source_routes_are_in_the_openapi_document(anon):
    paths = anon.get("/openapi.json").json()["paths"]
    for path in ("/api/kernels/{kernel_id}/files", "/api/kernels/{kernel_id}/files/{path}",
                 "/api/kernels/{kernel_id}/tarball", "/api/kernels/{kernel_id}/commits"):
        assert "get" in paths[path], path
    assert {p["name"] for p in paths["/api/kernels/{kernel_id}/tarball"]["get"]["parameters"]} == {"kernel_id", "rev"}

"""A harness nobody reviewed does not rank: a new kernel is accepted but listed unranked until an admin approves it.

A real daemon on loopback with the seeded Axpy reference: a new kernel (``fast``,
four times faster) is accepted through the real accept path, stays out of the operator's
ranking and is marked ``unreviewed`` in the API and on the pages; only an admin lists
and approves its harness (over HTTP and through ``kz review harness``); once approved it
ranks first without a new submission, a restart replays the approval from the log, a
maintainer's later harness change is unreviewed again, and revoking the approval takes
the kernel out of the ranking once more. The seeded reference ranks throughout.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys

import pytest

from kz_events.log.replay import replay_dir
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball
from tests.helpers.live_api import api_error, result_doc

OP = "cpu/Elementwise/Axpy/fp32"
FAST = f"{OP}/fast"
BADGE = 'class="badge mark-unreviewed-harness"'  # the badge "unreviewed harness"


def run_to_accept(live, kernel_id, latency, *, mutate=None, token=None, submitter="alice"):
    """Submit the Axpy example as ``kernel_id`` and report ``latency`` (again on r2 when a confirmation run is
    asked for); the accepted submission's uuid."""
    with live.client(token) as client:
        resp = live.submit(client, kernel_id, package_tarball(kernel_id, CPU_AXPY, mutate=mutate),
                           submitter=submitter)
        assert resp.status_code == 202, resp.text
        uuid = resp.json()["uuid"]
    view: dict = {"status": "queued"}
    for runner_id in ("r1", "r2"):
        if view["status"] != "queued":
            break
        with live.client(f"runner:{runner_id}") as runner:
            claim = runner.post("/api/runner/claim", json={"arch": "cpu", "wait": 10}).json()
            assert claim["uuid"] == uuid
            body = {"lease_id": claim["lease_id"], "result": result_doc(kernel_id, latency),
                    "logs_b64": base64.b64encode(b"ok").decode(), "env": {}, "failure": None}
            view = runner.post(f"/api/submissions/{uuid}/result", json=body).json()
    assert view["status"] == "accepted", view
    return uuid


def note(files):
    files["src/NOTES.md"] = b"tuned\n"


def new_harness(files):
    files[".kernel_package/benchmark.py"] += b"\n# harness revised by its maintainer\n"


def kz_review(live, *args, token="admin"):
    """``kz review ...`` against the live server; the finished process."""
    return subprocess.run([sys.executable, "-m", "kz_daemon.cli", "review", *args, "--server", live.url,
                           "--token", live.tokens[token]], capture_output=True, text=True, timeout=60)


def snapshot(live, *uuids):
    """What the API and the pages say now: operators, the operator, both kernels, the pages, the status documents."""
    with live.client() as anon:
        out = {"operators": {o["operator"]: o for o in anon.get("/api/operators").json()["operators"]},
               "operator": anon.get(f"/api/operators/{OP}").json(),
               "fast": anon.get(f"/api/kernels/{FAST}").json(), "ref": anon.get(f"/api/kernels/{CPU_AXPY}").json(),
               "kernels": {k["kernel_id"]: k for k in anon.get("/api/kernels").json()["kernels"]},
               "operator_page": anon.get(f"/ops/{OP}").text, "fast_page": anon.get(f"/kernels/{FAST}").text,
               "ref_page": anon.get(f"/kernels/{CPU_AXPY}").text, "home": anon.get("/").text,
               "status": {u: anon.get(f"/api/submissions/{u}/status").json() for u in uuids},
               "submission_page": {u: anon.get(f"/submissions/{u}").text for u in uuids}}
    out["rows"] = {k["kernel_id"]: k for k in out["operator"]["kernels"]}
    return out


def git_harness_hash(live, commit: str, kernel_id: str) -> str:
    """The harness hash as the docs say git gives it: ``git ls-tree`` of .kernel_package/, scorecard left out."""
    listing = subprocess.run(["git", "-C", str(live.zoo.config.paths.repo), "ls-tree",
                              f"{commit}:{kernel_id}/.kernel_package"], capture_output=True, text=True, check=True)
    lines = "".join(f"{f[2]} {f[3]}\n" for f in (line.split() for line in listing.stdout.splitlines())
                    if f[3] != "bench_result.yaml")
    return hashlib.sha256(lines.encode()).hexdigest()


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """The story, step by step; each step's view of the API and pages is kept for the tests."""
    live = LiveServer.start(tmp_path_factory.mktemp("harness-review"), kernels=[CPU_AXPY],
                            settings={"submit_burst": 1000})
    story = {}
    try:
        story["ref"] = run_to_accept(live, CPU_AXPY, 40.0, mutate=note)
        story["fast"] = run_to_accept(live, FAST, 10.0)
        story["new"] = snapshot(live, story["ref"], story["fast"])
        with live.client("admin") as admin:
            story["listed"] = admin.get("/api/reviews/harnesses").json()["harnesses"]
        story["live"] = live
        yield story
    finally:
        story["live"].stop()


def test_a_new_kernel_is_accepted_but_neither_ranked_nor_a_best(zoo):
    seen = zoo["new"]
    fast, ref = seen["rows"][FAST], seen["rows"][CPU_AXPY]
    assert seen["status"][zoo["fast"]]["status"] == "accepted" and seen["status"][zoo["fast"]]["new_kernel"]
    assert (fast["harness"], fast["rank"], fast["score"]) == ("unreviewed", None, None)
    assert fast["cases"]["n4k"]["best"]["value"] == 10.0  # its figures are shown
    assert (ref["harness"], ref["rank"]) == ("reviewed", 1) and seen["operator"]["reference"] == CPU_AXPY
    axpy = seen["operators"][OP]
    assert (axpy["kernels"], axpy["ranked"], axpy["leaders"]) == (2, 1, [CPU_AXPY])
    # the accept's outcome: its own scorecard moved, but it is no operator's best and has no rank
    status = seen["status"][zoo["fast"]]
    assert status["harness"] == "unreviewed" and status["outcome"]["harness"] == "unreviewed"
    assert not status["outcome"]["new_best"] and status["outcome"]["rank_after"] is None
    assert not any(c["new_best"] for c in status["outcome"]["cases"])
    assert seen["status"][zoo["ref"]]["harness"] == "reviewed" and seen["status"][zoo["ref"]]["outcome"]["new_best"]


def test_the_api_documents_carry_the_mark_and_the_hash_git_gives(zoo):
    seen, live = zoo["new"], zoo["live"]
    head = live.zoo.index()["head"]
    assert seen["fast"]["harness"] == "unreviewed" and seen["ref"]["harness"] == "reviewed"
    assert seen["fast"]["harness_hash"] == git_harness_hash(live, head, FAST)
    assert seen["ref"]["harness_hash"] == git_harness_hash(live, head, CPU_AXPY)
    assert seen["kernels"][FAST]["harness"] == "unreviewed" and "harness" not in seen["kernels"][CPU_AXPY]
    assert "harness" not in json.dumps([k for k in live.zoo.index()["kernels"]])  # index.json stays git's


def test_the_pages_show_the_kernel_marked_unreviewed_and_unranked(zoo):
    seen = zoo["new"]
    page = seen["operator_page"]
    row = re.search(rf'<tr class="([^"]*)" data-kernel="{re.escape(FAST)}">(.*?)</tr>', page, re.S)
    assert row and row.group(1).startswith("unranked")
    assert BADGE in row.group(2) and "not ranked: its harness awaits a maintainer" in row.group(2)
    assert '<td class="rank num">–</td>' in row.group(2)
    ref_row = re.search(rf'<tr class="([^"]*)" data-kernel="{re.escape(CPU_AXPY)}">(.*?)</tr>', page, re.S)
    assert ref_row and BADGE not in ref_row.group(2) and '<td class="rank num">1</td>' in ref_row.group(2)
    for case_row in re.findall(rf'<tr class="measured" data-kernel="{re.escape(FAST)}">(.*?)</tr>', page, re.S):
        assert BADGE in case_row and '<td class="rank num">–</td>' in case_row  # unranked in every case too
    assert BADGE in seen["fast_page"] and 'id="harness-review"' in seen["fast_page"]
    assert BADGE not in seen["ref_page"]
    assert BADGE in seen["submission_page"][zoo["fast"]] and "No new best and no rank" in seen["submission_page"][zoo["fast"]]
    home = seen["home"]
    assert f'data-kernel="{FAST}"' not in home.split("<h2>Operators")[0]  # no "latest new best" of it
    leader = re.search(r'<td class="leader">(.*?)</td>', home, re.S).group(1)
    assert CPU_AXPY in leader and FAST not in leader


def test_only_an_admin_lists_approves_or_revokes_a_harness(zoo):
    live = zoo["live"]
    (row,) = zoo["listed"]
    assert row["kernel_id"] == FAST and row["harness_hash"] == zoo["new"]["fast"]["harness_hash"]
    assert row["submission"] == zoo["fast"] and row["submitter_id"] == "alice" and row["approved"] == []
    with live.client() as anon:
        files = anon.get(row["files_url"]).json()
        assert ".kernel_package/benchmark.py" in [f["path"] for f in files["files"]]
        assert anon.get(row["source_url"]).status_code == 200
        api_error(anon.get("/api/reviews/harnesses"), 401, "UNAUTHORIZED")
        api_error(anon.post(f"/api/reviews/harnesses/{FAST}/approve", json={}), 401, "UNAUTHORIZED")
    for token in ("submitter:alice", "runner:r1"):
        with live.client(token) as other:
            api_error(other.get("/api/reviews/harnesses"), 403, "FORBIDDEN")
            error = api_error(other.post(f"/api/reviews/harnesses/{FAST}/approve", json={}), 403, "FORBIDDEN")
            assert "admin token" in error["message"]
            api_error(other.post(f"/api/reviews/harnesses/{FAST}/revoke", json={}), 403, "FORBIDDEN")
    refused = kz_review(live, "harness", "approve", FAST, token="submitter:alice")
    assert refused.returncode == 1 and "FORBIDDEN" in refused.stderr
    with live.client() as anon:  # nothing changed
        assert anon.get(f"/api/operators/{OP}").json()["kernels"][1]["harness"] == "unreviewed"
    with live.client("admin") as admin:
        api_error(admin.post(f"/api/reviews/harnesses/{OP}/nope/approve", json={}), 404, "NOT_FOUND")
        api_error(admin.post(f"/api/reviews/harnesses/{FAST}/approve", json={"harness_hash": "x"}), 400, "BAD_REQUEST")
        api_error(admin.post(f"/api/reviews/harnesses/{FAST}/approve", json={"harness_hash": "0" * 12}),
                  409, "CONFLICT")  # not the harness at HEAD: it may have changed since the reviewer read it
        api_error(admin.post(f"/api/reviews/harnesses/{FAST}/revoke", json={}), 409, "CONFLICT")  # not approved
        # the seeded reference's harness is its maintainers' own: nothing to approve
        error = api_error(admin.post(f"/api/reviews/harnesses/{CPU_AXPY}/approve", json={}), 409, "CONFLICT")
        assert "maintainers' own" in error["message"]


def test_once_approved_it_ranks_and_is_the_best_and_a_restart_keeps_it(zoo):
    live = zoo["live"]
    listed = kz_review(live, "harness", "list")
    assert listed.returncode == 0, listed.stderr
    digest = zoo["listed"][0]["harness_hash"]
    assert f"{FAST}  harness {digest}" in listed.stdout and "/source?rev=" in listed.stdout
    done = kz_review(live, "harness", "approve", FAST, "--hash", digest[:10], "--reason", "read it", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["harness_hash"], answer["decision"], answer["by"], answer["harness"]) == \
        (digest, "approve", "root", "reviewed")
    again = kz_review(live, "harness", "approve", FAST)
    assert again.returncode == 1 and "CONFLICT" in again.stderr and "approved already" in again.stderr
    assert json.loads(kz_review(live, "harness", "list", "--json").stdout) == {"harnesses": []}

    seen = snapshot(live, zoo["fast"])  # no new submission: the ranking follows the approval
    fast = seen["rows"][FAST]
    assert (fast["harness"], fast["rank"]) == ("reviewed", 1) and fast["score"]["value"] == pytest.approx(4.0, rel=0.1)
    assert seen["operators"][OP]["leaders"] == [FAST] and seen["operators"][OP]["ranked"] == 2
    assert seen["status"][zoo["fast"]]["harness"] == "reviewed"
    assert seen["status"][zoo["fast"]]["outcome"]["new_best"]  # its accept counts as the best it was
    assert BADGE not in seen["operator_page"] and BADGE not in seen["fast_page"]
    assert f'data-kernel="{FAST}"' in seen["home"].split("<h2>Operators")[0]  # now a latest new best

    # a later accept of the approved kernel (its harness locked) is a new best at once
    better = run_to_accept(live, FAST, 8.0, mutate=note)
    with live.client() as anon:
        outcome = anon.get(f"/api/submissions/{better}/status").json()["outcome"]
    assert outcome["new_best"] and outcome["rank_after"] == 1 and "harness" not in outcome

    # a restart replays the approval from the log: the kernel still ranks
    live = zoo["live"] = live.restart(settings={"submit_burst": 1000})
    assert replay_dir(live.zoo.store.events_dir).harnesses == live.zoo.store.state.harnesses
    assert digest in live.zoo.store.state.harnesses[FAST]["approved"]
    with live.client() as anon:
        row = {k["kernel_id"]: k for k in anon.get(f"/api/operators/{OP}").json()["kernels"]}[FAST]
    assert (row["harness"], row["rank"]) == ("reviewed", 1)


def test_a_harness_change_is_unreviewed_again_until_approved_and_an_approval_can_be_revoked(zoo):
    live = zoo["live"]
    before = zoo["listed"][0]["harness_hash"]
    change = run_to_accept(live, FAST, 7.0, mutate=new_harness, token="admin", submitter="root")
    seen = snapshot(live, change)
    status = seen["status"][change]
    assert status["harness_change"] and status["harness"] == "unreviewed" and not status["outcome"]["new_best"]
    fast = seen["rows"][FAST]
    assert (fast["harness"], fast["rank"]) == ("unreviewed", None) and seen["operators"][OP]["leaders"] == [CPU_AXPY]
    assert seen["fast"]["harness_hash"] not in (None, before)
    with live.client("admin") as admin:
        (row,) = admin.get("/api/reviews/harnesses").json()["harnesses"]
        assert (row["harness_hash"], row["submission"], row["approved"]) == (seen["fast"]["harness_hash"], change, [before])
        done = admin.post(f"/api/reviews/harnesses/{FAST}/approve", json={"harness_hash": row["harness_hash"]})
        assert done.status_code == 200 and done.json()["harness"] == "reviewed", done.text
        with live.client() as anon:
            assert anon.get(f"/api/operators/{OP}").json()["kernels"][0]["kernel_id"] == FAST
    # an approval taken back: the kernel no longer ranks
    taken = kz_review(live, "harness", "revoke", FAST, "--reason", "timing looked off")
    assert taken.returncode == 0 and "approval revoked" in taken.stdout, taken.stderr
    with live.client() as anon:
        rows = {k["kernel_id"]: k for k in anon.get(f"/api/operators/{OP}").json()["kernels"]}
    assert (rows[FAST]["harness"], rows[FAST]["rank"]) == ("unreviewed", None) and rows[CPU_AXPY]["rank"] == 1
    approved = live.zoo.store.state.harnesses[FAST]["approved"]
    assert set(approved) == {before} and approved[before]["reason"] == "read it"  # the older approval stays
    old = kz_review(live, "harness", "revoke", FAST, "--hash", before[:8], "--json")
    assert old.returncode == 0 and json.loads(old.stdout)["harness_hash"] == before
    assert FAST not in live.zoo.store.state.harnesses or not live.zoo.store.state.harnesses[FAST]["approved"]
    usage = subprocess.run([sys.executable, "-m", "kz_daemon.cli", "review", "harness"], capture_output=True,
                           text=True, timeout=60)
    assert usage.returncode == 2


def test_an_accept_half_way_counts_as_brought_before_it_completes():
    """The index lists a new kernel once the saga committed it, before ``accept.completed``: it must not rank then."""
    from threading import Lock
    from types import SimpleNamespace

    from kz_daemon.guards.harness_review import reviews_of
    from kz_events.state import State
    from tests.test_events_reducer import SRC, accepted, push

    events = accepted("u1", FAST)
    state = push(State(), *events[:-1])  # both commits are in git; accept.completed is not recorded yet
    store = SimpleNamespace(lock=Lock(), state=state)
    assert state.harnesses == {} and reviews_of(store) == {FAST: ({"u1": SRC}, frozenset())}
    push(state, events[-1])
    assert reviews_of(store) == {FAST: ({"u1": SRC}, frozenset())}
    assert reviews_of(store, ["cpu/Elementwise/Axpy/fp32/other"]) == {}


def test_a_reviewed_kernels_recorded_rank_leaves_out_an_unreviewed_competitor(zoo):
    """The accept outcome written to the log ranks like the board: a faster kernel whose harness nobody
    reviewed (FAST, its approvals revoked above) is not counted above a reviewed kernel's new record."""
    live = zoo["live"]
    assert not (live.zoo.store.state.harnesses.get(FAST) or {}).get("approved")

    def retuned(files):
        files["src/NOTES.md"] = b"tuned again\n"

    better = run_to_accept(live, CPU_AXPY, 20.0, mutate=retuned)  # FAST's record stays 7 us
    with live.client() as anon:
        outcome = anon.get(f"/api/submissions/{better}/status").json()["outcome"]
    assert outcome["new_best"] and outcome["rank_after"] == 1, outcome


def test_the_catalogues_harness_reader_keeps_a_bounded_number_of_trees_and_digests(tmp_path, monkeypatch):
    """Every accept adds trees and (commit, kernel) digests the marks read; the catalogue's reader keeps at most
    ``views.HARNESS_CACHE`` of each however many accepts and status reads came, and the marks stay right."""
    from kz_daemon.api import views

    monkeypatch.setattr(views, "HARNESS_CACHE", 8)
    live = LiveServer.start(tmp_path, kernels=[CPU_AXPY], settings={"submit_burst": 1000})
    try:
        uuids = [run_to_accept(live, FAST, 10.0)]
        for i in range(5):  # each accept is a new head: new trees on both commits' paths, new digests
            def tuned(files, i=i):
                files["src/NOTES.md"] = b"tuned %d\n" % i
            uuids.append(run_to_accept(live, CPU_AXPY if i % 2 else FAST, 40.0 - i, mutate=tuned))
            with live.client() as anon:
                kernels = {k["kernel_id"]: k for k in anon.get("/api/kernels").json()["kernels"]}
                docs = [anon.get(f"/api/submissions/{u}/status").json() for u in uuids]
            assert kernels[FAST]["harness"] == "unreviewed" and "harness" not in kernels[CPU_AXPY]
            assert all(d["harness"] == ("unreviewed" if d["kernel_id"] == FAST else "reviewed") for d in docs)
        digests = live.app.state.catalog.digests(live.app.state.history)
        assert len(digests._trees) == 8  # full: six accepts read far more than eight trees
        assert len(digests._digests) <= 8
    finally:
        live.stop()

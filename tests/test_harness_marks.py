"""Which harness a scorecard record was measured under, and the marks the pages show.

A real daemon on loopback: an accepted run's records carry the short blob sha of the
benchmark.py in its source commit; after a maintainer changes the harness the old best
stays and the kernel and operator pages mark it; submissions show new-kernel,
harness-change and held marks, a held one with the rule evidence.
"""
from __future__ import annotations

import base64
import hashlib

import jsonschema
import pytest
import yaml

import kz_schemas
from kz_runner.contract.validate import validate_package_dir
from tests.helpers.http_server import CPU_AXPY, EXAMPLES, LiveServer, package_tarball
from tests.test_http_api import result_doc

BENCH = f"{CPU_AXPY}/.kernel_package/benchmark.py"
CARD = f"{CPU_AXPY}/.kernel_package/bench_result.yaml"
OLDER = "measured under an older harness"
NEW_ID = "cpu/Elementwise/Axpy/fp32/fresh"
HELD_ID = "cpu/Elementwise/Axpy/fp32/threaded"


def short_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()[:12]


def run_to_accept(live, client, kernel_id, latency, *, mutate=None, submitter="alice"):
    resp = live.submit(client, kernel_id, package_tarball(kernel_id, CPU_AXPY, mutate=mutate), submitter=submitter)
    assert resp.status_code == 202, resp.text
    uuid = resp.json()["uuid"]
    with live.client("runner:r1") as runner:
        claim = runner.post("/api/runner/claim", json={"arch": "cpu", "wait": 10}).json()
        assert claim["uuid"] == uuid
        body = {"lease_id": claim["lease_id"], "result": result_doc(kernel_id, latency),
                "logs_b64": base64.b64encode(b"ok").decode(), "env": {}, "failure": None}
        view = runner.post(f"/api/submissions/{uuid}/result", json=body).json()
    assert view["status"] == "accepted", view
    return uuid


def new_harness(files):
    files[".kernel_package/benchmark.py"] += b"\n# harness revised by its maintainer\n"


def src_note(files):
    files["src/NOTES.md"] = b"tuned\n"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    live = LiveServer.start(tmp_path_factory.mktemp("marks"), kernels=[CPU_AXPY], settings={"submit_burst": 1000})
    with live.client() as anon, live.client("admin") as admin:
        live.first_harness = short_blob(live.zoo.git.read_file(BENCH))
        live.first = run_to_accept(live, anon, CPU_AXPY, 40.0, mutate=src_note)
        live.card_after_first = yaml.safe_load(live.zoo.git.read_file(CARD))
        live.change = run_to_accept(live, admin, CPU_AXPY, 41.0, mutate=new_harness, submitter="root")
        live.fresh = run_to_accept(live, anon, NEW_ID, 30.0)
    yield live
    live.stop()


def records(card, key):
    return [r for c in card["cases"] for r in c[key].values()]


def test_an_accept_writes_the_harness_into_every_record_and_the_package_stays_valid(site):
    card = site.card_after_first
    assert records(card, "metrics_current") and records(card, "metrics_best")
    assert {r["harness"] for r in records(card, "metrics_current")} == {site.first_harness}
    assert {r["harness"] for r in records(card, "metrics_best")} == {site.first_harness}  # the seed was replaced
    jsonschema.validate(card, kz_schemas.load("bench_result"))
    # the package as git holds it still passes the validator, and the index took it
    report = validate_package_dir(site.zoo.git.root / CPU_AXPY, kernel_id=CPU_AXPY)
    assert report.valid, [p.render() for p in report.errors]
    (entry,) = [e for e in site.zoo.index()["kernels"] if e["kernel_id"] == CPU_AXPY]
    assert not entry.get("problems")


def test_a_harness_change_keeps_old_bests_and_marks_them(site):
    head_harness = short_blob(site.zoo.git.read_file(BENCH))
    assert head_harness != site.first_harness
    card = yaml.safe_load(site.zoo.git.read_file(CARD))
    assert {r["harness"] for r in records(card, "metrics_current")} == {head_harness}
    best = card["cases"][0]["metrics_best"]["latency_us"]
    assert best["value"] == 40.0 and best["harness"] == site.first_harness  # 41 did not beat it
    with site.client() as anon:
        kernel = anon.get(f"/kernels/{CPU_AXPY}").text
        operator = anon.get("/ops/cpu/Elementwise/Axpy/fp32").text
        fresh = anon.get(f"/kernels/{NEW_ID}").text
    # each case's best latency and best gbps cell is marked, the current cells are not
    assert kernel.count(OLDER) == 2 * len(card["cases"]) and site.first_harness in kernel
    assert operator.count(OLDER) == len(card["cases"])
    assert OLDER not in fresh  # measured under HEAD's harness


def test_submissions_carry_new_kernel_and_harness_change_marks(site):
    with site.client() as anon:
        change = anon.get(f"/submissions/{site.change}").text
        fresh = anon.get(f"/submissions/{site.fresh}").text
        first = anon.get(f"/submissions/{site.first}").text
        listing = anon.get("/submissions").text
        status = anon.get(f"/api/submissions/{site.change}/status").json()
    assert status["harness_change"] is True
    assert "harness change by maintainer" in change and "new kernel" not in change
    assert "new kernel" in fresh and "harness change by maintainer" not in fresh
    assert 'id="marks"' not in first
    assert listing.count("mark-harness-change") == 1 and listing.count("mark-new-kernel") == 1


def test_a_held_submission_shows_the_rule_evidence(site):
    def spawn_thread(files):
        files["src/axpy.py"] += b"\nimport threading\n"
    with site.client() as anon:
        resp = site.submit(anon, HELD_ID, package_tarball(HELD_ID, CPU_AXPY, mutate=spawn_thread))
        assert resp.status_code == 202 and resp.json()["status"] == "held", resp.text
        uuid = resp.json()["uuid"]
        page = anon.get(f"/submissions/{uuid}").text
        listing = anon.get("/submissions").text
    assert "held for review" in page and "Held for review" in page
    line = len((EXAMPLES / CPU_AXPY / "src/axpy.py").read_bytes().splitlines()) + 2
    assert f"src/axpy.py:{line}" in page and "concurrency" in page
    assert "mark-held" in listing
    site.zoo.cancel(uuid, "test")

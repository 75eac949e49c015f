"""An operator's board over HTTP: one score per kernel, ranks within the noise, speed of light.

Three Axpy kernels get their records through the real accept path (upload, claim,
report), with the spread a benchmark reports: the reference (``numpy_ref``), ``fast``
(4x faster) and ``twin`` (within ``fast``'s noise). The API answers what the operator
page shows.
"""
from __future__ import annotations

import base64
import math

import pytest

from kz_runner.contract.rules.floor import DEFAULT_CEILINGS
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball

OP = "cpu/Elementwise/Axpy/fp32"
CASES = ("n4k", "n64k", "n1m")
N = {"n4k": 4096, "n64k": 65536, "n1m": 1048576}
#: (latency_us, lo, hi) per case of each kernel's accepted run
RUNS = {
    CPU_AXPY: [(40.0, 38.0, 42.0), (400.0, 390.0, 410.0), (4000.0, 3900.0, 4100.0)],
    f"{OP}/fast": [(10.0, 9.5, 10.5), (100.0, 98.0, 103.0), (1000.0, 980.0, 1020.0)],
    f"{OP}/twin": [(10.2, 9.6, 10.8), (101.0, 99.0, 104.0), (1010.0, 990.0, 1030.0)],
}


def result(kernel_id: str, runs) -> dict:
    return {
        "schema_version": "1.0.0", "kernel_id": kernel_id, "ran_at": "2026-12-01T00:00:00Z",
        "runner_id": "r1", "arch": "cpu", "overall": {"accept": True, "accept_reason": "test", "build_ok": True},
        "cases": [{"test_case_id": case, "correctness": "passed", "accept": True, "accept_reason": "test",
                   "error": None,
                   "metrics": [{"name": "latency_us", "value": v, "spread": {"n": 200, "lo": lo, "hi": hi}},
                               {"name": "gbps", "value": round(12 * N[case] / v / 1e3, 3)}]}
                  for case, (v, lo, hi) in zip(CASES, runs)]}


def accept(live, anon, runner, kernel_id, runs, submitter="alice") -> str:
    resp = live.submit(anon, kernel_id, package_tarball(kernel_id, CPU_AXPY), submitter=submitter)
    assert resp.status_code == 202, resp.text
    uuid = resp.json()["uuid"]
    claim = runner.post("/api/runner/claim", json={"arch": "cpu", "wait": 10}).json()
    assert claim["uuid"] == uuid
    body = {"lease_id": claim["lease_id"], "result": result(kernel_id, runs),
            "logs_b64": base64.b64encode(b"ok").decode(), "env": {}, "failure": None}
    view = runner.post(f"/api/submissions/{uuid}/result", json=body).json()
    assert view["status"] == "accepted", view
    return uuid


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    live = LiveServer.start(tmp_path_factory.mktemp("opboard"), kernels=[CPU_AXPY], settings={"submit_burst": 1000})
    live.uuids = {}
    with live.client() as anon, live.client("runner:r1") as r1:
        for kernel_id, runs in RUNS.items():
            live.uuids[kernel_id] = accept(live, anon, r1, kernel_id, runs)
    yield live
    live.stop()


def test_the_operator_list_names_the_leaders_within_the_noise(board):
    with board.client() as http:
        ops = {o["operator"]: o for o in http.get("/api/operators").json()["operators"]}
    axpy = ops[OP]
    assert axpy["kernels"] == 3 and axpy["ranked"] == 3 and axpy["cases"] == 3 and axpy["reference"] == CPU_AXPY
    assert axpy["leaders"] == [f"{OP}/fast", f"{OP}/twin"]  # within each other's noise: both first
    assert math.isclose(axpy["leader_score"]["value"], 4.0)


def test_the_operator_ranking_has_scores_speedups_spreads_and_shared_ranks(board):
    with board.client() as http:
        doc = http.get(f"/api/operators/{OP}").json()
    assert doc["reference"] == CPU_AXPY and not doc["reference_default"] and doc["scored_cases"] == list(CASES)
    assert [c["params"]["n"] for c in doc["cases"]] == [N[c] for c in CASES]
    rows = {k["kernel_id"].rsplit("/", 1)[1]: k for k in doc["kernels"]}
    assert [k["kernel_id"].rsplit("/", 1)[1] for k in doc["kernels"]] == ["fast", "twin", "numpy_ref"]
    assert (rows["fast"]["rank"], rows["fast"]["approx"]) == (1, True)
    assert (rows["twin"]["rank"], rows["twin"]["approx"]) == (1, True)
    assert (rows["numpy_ref"]["rank"], rows["numpy_ref"]["approx"]) == (3, False)
    fast = rows["fast"]
    assert math.isclose(fast["score"]["value"], 4.0)
    # the score's interval: the geometric mean of each case's ref/hi .. ref/lo
    lo = (40 / 10.5 * 400 / 103 * 4000 / 1020) ** (1 / 3)
    assert math.isclose(fast["score"]["lo"], lo) and fast["score"]["n"] == 200
    n1m = fast["cases"]["n1m"]
    assert n1m["best"] == {"value": 1000.0, "lo": 980.0, "hi": 1020.0, "n": 200}
    assert math.isclose(n1m["speedup"]["value"], 4.0) and n1m["submitter"] == "alice"
    sol = n1m["speed_of_light"]
    nbytes = 4 + 12 * N["n1m"]
    peak = DEFAULT_CEILINGS["cpu"].l2_bytes_per_s
    assert sol["kind"] == "latency" and sol["bytes"] == nbytes and sol["memory"] == "L2"
    assert sol["pct_of_peak"] == round(100 * nbytes / 1000e-6 / peak, 3)
    assert (rows["fast"]["revoked"], rows["fast"]["held"]) == (0, 0)


def test_the_kernel_document_carries_the_speed_of_light_of_each_case(board):
    with board.client() as http:
        doc = http.get(f"/api/kernels/{OP}/fast").json()
    assert set(doc["speed_of_light"]) == set(CASES)
    assert doc["speed_of_light"]["n4k"]["kind"] == "latency" and doc["speed_of_light"]["n4k"]["pct_of_peak"] > 0
    assert doc["cases"][0]["best"]["spread"] == {"n": 200, "lo": 9.5, "hi": 10.5}


def test_an_unknown_operator_is_404(board):
    with board.client() as http:
        resp = http.get("/api/operators/cpu/Nope/Nope/fp32")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "NOT_FOUND"

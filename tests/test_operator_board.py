"""An operator's board over HTTP and in a real browser: one score per kernel, ranks within the noise, speed of light.

Three Axpy kernels get their records through the real accept path (upload, claim,
report), with the spread a benchmark reports: the reference (``numpy_ref``), ``fast``
(accepted twice: the second run beats the first beyond the noise and ends 4x faster
than the reference) and ``twin`` (within ``fast``'s noise; a second, much faster run of
it is revoked, and a third submission of it waits for review). Both new kernels brought
their own harness, which an admin approves so that they rank. The API answers what the
operator page shows; the browser walks home → operator and screenshots both.
"""
from __future__ import annotations

import base64
import math
import os
import time
from pathlib import Path

import pytest

from kz_runner.contract.rules.floor import DEFAULT_CEILINGS
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball

OP = "cpu/Elementwise/Axpy/fp32"
CASES = ("n4k", "n64k", "n1m")
N = {"n4k": 4096, "n64k": 65536, "n1m": 1048576}
#: (latency_us, lo, hi) per case of each accepted run, in order
RUNS = [
    (CPU_AXPY, [(40.0, 38.0, 42.0), (400.0, 390.0, 410.0), (4000.0, 3900.0, 4100.0)]),
    (f"{OP}/fast", [(12.0, 11.6, 12.4), (120.0, 117.0, 123.0), (1200.0, 1180.0, 1220.0)]),
    (f"{OP}/twin", [(10.2, 9.6, 10.8), (101.0, 99.0, 104.0), (1010.0, 990.0, 1030.0)]),
    (f"{OP}/fast", [(10.0, 9.5, 10.5), (100.0, 98.0, 103.0), (1000.0, 980.0, 1020.0)]),
    (f"{OP}/twin", [(5.0, 4.9, 5.1), (50.0, 49.0, 51.0), (500.0, 490.0, 510.0)]),  # revoked below
]
SCREENSHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"


def result(kernel_id: str, runs) -> dict:
    return {
        "schema_version": "1.0.0", "kernel_id": kernel_id, "ran_at": "2026-12-01T00:00:00Z",
        "runner_id": "r1", "arch": "cpu", "overall": {"accept": True, "accept_reason": "test", "build_ok": True},
        "cases": [{"test_case_id": case, "correctness": "passed", "accept": True, "accept_reason": "test",
                   "error": None,
                   "metrics": [{"name": "latency_us", "value": v, "spread": {"n": 200, "lo": lo, "hi": hi}},
                               {"name": "gbps", "value": round(12 * N[case] / v / 1e3, 3)}]}
                  for case, (v, lo, hi) in zip(CASES, runs)]}


def accept(live, anon, runner, kernel_id, runs, submitter="alice", note="") -> str:
    mutate = (lambda files: files.__setitem__("src/NOTES.md", note.encode())) if note else None
    resp = live.submit(anon, kernel_id, package_tarball(kernel_id, CPU_AXPY, mutate=mutate), submitter=submitter)
    assert resp.status_code == 202, resp.text
    uuid = resp.json()["uuid"]
    claim = runner.post("/api/runner/claim", json={"arch": "cpu", "wait": 10}).json()
    assert claim["uuid"] == uuid
    body = {"lease_id": claim["lease_id"], "result": result(kernel_id, runs),
            "logs_b64": base64.b64encode(b"ok").decode(), "env": {}, "failure": None}
    view = runner.post(f"/api/submissions/{uuid}/result", json=body).json()
    if view["status"] == "queued":  # the zoo asked for a confirmation run: another runner runs it again
        with live.client("runner:r2") as r2:
            claim = r2.post("/api/runner/claim", json={"arch": "cpu", "wait": 10}).json()
            assert claim["uuid"] == uuid
            view = r2.post(f"/api/submissions/{uuid}/result", json=dict(body, lease_id=claim["lease_id"])).json()
    assert view["status"] == "accepted", view
    return uuid


#: the daemon's clock runs this far ahead of the wall clock: each accept comes HOURS later than the one before
HOURS = 7


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    ahead = [0.0]
    live = LiveServer.start(tmp_path_factory.mktemp("opboard"), kernels=[CPU_AXPY], settings={"submit_burst": 1000},
                            clock=lambda: time.time() + ahead[0])
    live.uuids = []
    with live.client() as anon, live.client("runner:r1") as r1, live.client("admin") as admin:
        for index, (kernel_id, runs) in enumerate(RUNS):
            ahead[0] = index * HOURS * 3600.0  # only ever forward: leases and the log stay ordered
            live.uuids.append(accept(live, anon, r1, kernel_id, runs, note=f"run {index}"))
            if kernel_id != CPU_AXPY and all(k != kernel_id for k, _ in RUNS[:index]):
                # a new kernel ranks once an admin approved the harness it brought: at once, here, so
                # each later accept's recorded rank counts it
                resp = admin.post(f"/api/reviews/harnesses/{kernel_id}/approve", json={})
                assert resp.status_code == 200 and resp.json()["harness"] == "reviewed", resp.text
        resp = admin.post(f"/api/submissions/{live.uuids[-1]}/revoke", json={"reason": "timed a cached result"})
        assert resp.status_code == 200 and resp.json()["status"] == "revoked", resp.text
        held = live.submit(anon, f"{OP}/twin", package_tarball(f"{OP}/twin", CPU_AXPY, mutate=lambda files: files.__setitem__(
            "src/extra.py", b'exec("x = 1")\n')))
        assert held.status_code == 202 and held.json()["status"] == "held", held.text
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
    assert (rows["twin"]["revoked"], rows["twin"]["held"]) == (1, 1)  # the revoked run's best was restored


def test_the_kernel_document_carries_the_speed_of_light_of_each_case(board):
    with board.client() as http:
        doc = http.get(f"/api/kernels/{OP}/fast").json()
    assert set(doc["speed_of_light"]) == set(CASES)
    assert doc["speed_of_light"]["n4k"]["kind"] == "latency" and doc["speed_of_light"]["n4k"]["pct_of_peak"] > 0
    assert doc["cases"][0]["best"]["spread"] == {"n": 200, "lo": 9.5, "hi": 10.5}


def test_the_kernel_page_shows_each_cases_percentage_of_peak_as_the_api_gives_it(board):
    import re
    from html import unescape

    from kz_daemon.web.render import fmt_pct

    with board.client() as http:
        doc = http.get(f"/api/kernels/{OP}/fast").json()
        page = http.get(f"/kernels/{OP}/fast")
    assert page.status_code == 200
    table = re.search(r'<table class="speed-of-light">(.*?)</table>', page.text, re.S)
    assert table, "the kernel page has no speed-of-light table"
    for case in CASES:
        row = re.search(rf'<tr data-case="{case}">(.*?)</tr>', table.group(1), re.S)
        assert row, case
        sol = doc["speed_of_light"][case]
        cells = unescape(row.group(1))
        peak = re.search(r'<td class="num peak">(.*?)</td>', cells).group(1)
        assert peak == fmt_pct(sol["pct_of_peak"], False) and peak.endswith(" %")
        assert f"{sol['achieved_bytes_per_s'] / 1e9:.4g} GB/s" in cells and "L2" in cells
    # the n1m case by hand: 12 bytes an element plus the scalar, in 1000 us, against the CPU's L2
    n1m = doc["speed_of_light"]["n1m"]["pct_of_peak"]
    assert n1m == round(100 * (4 + 12 * N["n1m"]) / 1000e-6 / DEFAULT_CEILINGS["cpu"].l2_bytes_per_s, 3)


def test_an_unknown_operator_is_404(board):
    with board.client() as http:
        resp = http.get("/api/operators/cpu/Nope/Nope/fp32")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "NOT_FOUND"


def _shot(page, name: str) -> None:
    if os.environ.get("KZ_SCREENSHOTS"):
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


@pytest.mark.browser
def test_a_browser_walks_home_to_the_operator_page(board):
    from tests.helpers.browser import browser

    with browser(javascript=False) as ctx:
        page = ctx.new_page()
        blocked = []
        page.on("console", lambda msg: blocked.append(msg.text) if "Content Security Policy" in msg.text else None)
        page.set_viewport_size({"width": 1360, "height": 900})
        page.goto(board.url + "/")
        assert page.locator("#stat-operators").inner_text() == "1"
        assert page.locator("#stat-kernels").inner_text() == "3"
        assert page.locator("#stat-week").inner_text() == "5"  # every accept of the week, the revoked one too
        rows = page.locator("table.new-bests tbody tr")
        assert rows.count() == 5
        assert rows.nth(0).get_attribute("data-kernel") == f"{OP}/twin" and "revoked" in rows.nth(0).inner_text()
        second = rows.nth(1)  # fast's second run: a new best with its numbers
        assert second.get_attribute("data-kernel") == f"{OP}/fast"
        n4k = second.locator('li[data-case="n4k"]').inner_text()
        assert "12" in n4k and "10" in n4k and "−16.7 %" in n4k, n4k
        assert second.locator("td.speedup").inner_text() == "1.2×"
        leader = page.locator("table.operators tbody tr", has_text=OP).locator("td.leader").inner_text()
        assert f"{OP}/fast ≈ {OP}/twin" in leader and "4×" in leader, leader
        _shot(page, "home")
        page.locator(f'table.operators a[href="/ops/{OP}"]').click()
        page.wait_for_url(f"**/ops/{OP}")
        assert page.locator("h1").inner_text() == OP
        ranked = page.locator("table.overall-ranking tbody tr")
        assert [r.rsplit("/", 1)[-1] for r in ranked.evaluate_all(
            "rows => rows.map(r => r.getAttribute('data-kernel'))")] == ["fast", "twin", "numpy_ref"]
        assert ranked.locator("td.rank").all_inner_texts() == ["≈1", "≈1", "3"]
        assert ranked.nth(0).locator("td.score").inner_text() == "4×"
        assert "%" in ranked.nth(0).locator('td[data-case="n1m"] .peak').inner_text()
        marks = ranked.nth(1).locator("td.marks").inner_text()
        assert "1 revoked" in marks and "1 unreviewed" in marks
        assert page.locator('table.cases tr[data-case="n1m"] td.params').inner_text() == "n=1048576, dtype=fp32"
        charts = page.locator("svg.chart")
        assert charts.count() == 3
        assert page.locator("svg.chart circle.hollow").count() == 3  # the revoked run, once per case
        spread = page.locator('table.ranking[data-case="n4k"] tr[data-kernel$="/fast"] td.spread').inner_text()
        assert spread.startswith("9.5 – 10.5") and "n=200" in spread
        _shot(page, "operator")
        assert blocked == []


def test_the_status_document_says_what_each_accept_changed(board):
    with board.client() as http:
        first = http.get(f"/api/submissions/{board.uuids[0]}/status").json()["outcome"]
        second = http.get(f"/api/submissions/{board.uuids[3]}/status").json()
        page = http.get(f"/submissions/{board.uuids[3]}").text
    # the reference's first record: nothing before it, first of one
    assert first["new_best"] and first["speedup"] is None and (first["rank_before"], first["rank_after"]) == (None, 1)
    assert [c["previous_best"] for c in first["cases"]] == [None, None, None]
    # fast's second run: a new best beyond the noise in every case, from second place to a shared first
    out = second["outcome"]
    assert "outcome" not in second["result"]  # shown once, beside the result
    assert out["operator"] == OP and out["new_best"] and out["cases_improved"] == 3
    assert [c["previous_best"] for c in out["cases"]] == [12.0, 120.0, 1200.0]
    assert [c["value"] for c in out["cases"]] == [10.0, 100.0, 1000.0]
    assert all(math.isclose(c["delta_pct"], -100 / 6, rel_tol=1e-3) for c in out["cases"])
    assert math.isclose(out["speedup"], 1.2)
    assert (out["rank_before"], out["rank_before_approx"]) == (2, False)
    assert (out["rank_after"], out["rank_after_approx"]) == (1, True)
    assert 'id="outcome"' in page and "New best" in page and "−16.7 %" in page

"""The web leaderboard in a real headless Chromium against the real daemon on loopback."""
from __future__ import annotations

import base64
import urllib.parse

import pytest
import yaml

from tests.helpers.browser import browser, require_chromium
from tests.helpers.http_server import CPU_AXPY, CPU_SOFTMAX, LiveServer, package_tarball
from tests.test_http_api import result_doc

pytestmark = pytest.mark.browser

HOSTILE_ID = "cpu/Elementwise/Axpy/fp32/hostile"
HOSTILE_NAME = '<img src=x onerror="window.__pwned=1">Axpy'
HOSTILE_DESC = ("## Math\n<script>window.__pwned = 2</script>\n\n"
                "Click [me](javascript:window.__pwned=3) or [docs](https://example.org/axpy).\n\n"
                "- **bold** and `a<b`\n")


def _hostile(files: dict) -> None:
    desc = yaml.safe_load(files[".kernel_package/desc.yaml"])
    desc["name"] = HOSTILE_NAME
    desc["description"] = HOSTILE_DESC
    files[".kernel_package/desc.yaml"] = yaml.safe_dump(desc, sort_keys=False).encode()


def _accept(live, anon, runner, kernel_id, latency, *, mutate=None, source=CPU_AXPY, submitter="alice"):
    data = package_tarball(kernel_id, source, mutate=mutate)
    resp = live.submit(anon, kernel_id, data, submitter=submitter)
    assert resp.status_code == 202, resp.text
    uuid = resp.json()["uuid"]
    claim = runner.post("/api/runner/claim", json={"arch": "cpu", "wait": 10}).json()
    assert claim["uuid"] == uuid
    body = {"lease_id": claim["lease_id"], "result": result_doc(kernel_id, latency),
            "logs_b64": base64.b64encode(b"ok").decode(), "env": {}, "failure": None}
    view = runner.post(f"/api/submissions/{uuid}/result", json=body).json()
    assert view["status"] == "accepted", view
    return uuid, view["commit_sha"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    require_chromium()
    live = LiveServer.start(tmp_path_factory.mktemp("web"), settings={"submit_burst": 1000})
    with live.client() as anon, live.client("runner:r1") as r1:
        first = _accept(live, anon, r1, CPU_AXPY, 40.0, submitter="alice")
        second = _accept(live, anon, r1, CPU_AXPY, 20.0, submitter="bob")
        hostile = _accept(live, anon, r1, HOSTILE_ID, 30.0, mutate=_hostile)
    live.accepted = {"first": first, "second": second, "hostile": hostile}
    yield live
    live.stop()


def test_leaderboard_filters_without_javascript(site):
    with browser(javascript=False) as ctx:
        page = ctx.new_page()
        page.goto(site.url + "/")
        assert page.title().startswith("Leaderboard")
        kernels = page.locator("table.kernels tbody tr td:first-child").all_inner_texts()
        assert CPU_AXPY in kernels and CPU_SOFTMAX in kernels and HOSTILE_ID in kernels
        page.select_option("select[name=op_class]", "Reduction")
        page.click("form.filters button[type=submit]")
        page.wait_for_url("**op_class=Reduction**")
        kernels = set(page.locator("table.kernels tbody tr td:first-child").all_inner_texts())
        assert kernels == {CPU_SOFTMAX}
        operators = page.locator("table.operators tbody tr td:first-child").all_inner_texts()
        assert operators == ["cpu/Reduction/Softmax/fp32"]
        # server-side sort (no JS): ascending, then the header link flips it
        page.goto(site.url + "/?" + urllib.parse.urlencode({"op_class": "Elementwise", "sort": "kernel",
                                                           "order": "asc"}))
        ids = page.locator("table.kernels tbody tr td:first-child").all_inner_texts()
        assert ids == sorted(ids) and len(ids) == 2
        page.click("table.kernels th >> text=kernel")
        assert page.locator("table.kernels tbody tr td:first-child").all_inner_texts() == sorted(ids, reverse=True)
        assert "order=desc" in page.url


def test_leaderboard_sorts_in_the_browser_and_escapes(site):
    with browser() as ctx:
        page = ctx.new_page()
        page.goto(site.url + "/?op_class=Elementwise")
        assert page.evaluate("window.__pwned") is None
        # the hostile name is shown as text, not as an element
        assert HOSTILE_NAME in page.locator("table.kernels").inner_text()
        assert page.locator("table.kernels img").count() == 0
        header = page.locator("table.kernels th").nth(1)  # "name"
        header.click()  # JS sort: the page does not navigate, the rows reorder
        first = page.locator("table.kernels tbody tr td:nth-child(2)").all_inner_texts()
        header.click()
        second = page.locator("table.kernels tbody tr td:nth-child(2)").all_inner_texts()
        assert first == sorted(first, key=str.lower) and second == sorted(second, key=str.lower, reverse=True)
        assert first != second
        assert page.url.endswith("/?op_class=Elementwise")


def test_kernel_page_history_chart_scorecard_and_description(site):
    sha_first, sha_second = site.accepted["first"][1], site.accepted["second"][1]
    with browser() as ctx:
        page = ctx.new_page()
        page.goto(f"{site.url}/kernels/{CPU_AXPY}")
        assert "AXPY" in page.locator("h1").inner_text()
        # accepted history: one small chart per case, two accepted runs each
        assert page.locator("svg.chart").count() == 3
        assert page.locator("svg.chart polyline").count() == 3
        assert page.locator("svg.chart circle").count() == 6
        history = page.locator("table.history").inner_text()
        assert sha_first[:10] in history and sha_second[:10] in history and "bob" in history
        scorecard = page.locator("table.scorecard").inner_text()
        assert "latency_us" in scorecard and "bob" in scorecard and sha_second[:10] in scorecard
        assert page.locator("table.io td:first-child").all_inner_texts()[:3] == ["a", "x", "y"]
        assert page.locator(".description h3").first.inner_text() == "Math definition"


def test_kernel_page_sanitises_markdown(site):
    with browser() as ctx:
        page = ctx.new_page()
        page.goto(f"{site.url}/kernels/{HOSTILE_ID}")
        assert page.evaluate("window.__pwned") is None
        desc = page.locator(".description")
        assert "<script>window.__pwned = 2</script>" in desc.inner_text()
        assert desc.locator("script").count() == 0
        hrefs = desc.locator("a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
        assert hrefs == ["https://example.org/axpy"]
        assert desc.locator("strong").inner_text() == "bold"
        assert desc.locator("code").inner_text() == "a<b"
        assert page.locator("h1").inner_text() == HOSTILE_NAME
        assert page.locator("h1 img").count() == 0


@pytest.mark.parametrize("javascript", [True, False])
def test_submission_page_follows_the_job(site, javascript):
    with site.client() as anon, site.client("runner:r2") as r2:
        kernel_id = f"cpu/Elementwise/Axpy/fp32/live_{int(javascript)}"
        resp = site.submit(anon, kernel_id, package_tarball(kernel_id, CPU_AXPY))
        uuid = resp.json()["uuid"]
        with browser(javascript=javascript) as ctx:
            page = ctx.new_page()
            page.goto(f"{site.url}/submissions/{uuid}")
            assert page.locator("#status").inner_text() == "queued"
            claim = r2.post("/api/runner/claim", json={"arch": "cpu", "wait": 10}).json()
            assert claim["uuid"] == uuid
            # the page notices by itself (long-poll script, or the no-JS meta refresh)
            page.locator("#status", has_text="running").wait_for(timeout=20_000)
            body = {"lease_id": claim["lease_id"], "result": result_doc(kernel_id, 15.0),
                    "logs_b64": "", "env": {}, "failure": None}
            view = r2.post(f"/api/submissions/{uuid}/result", json=body).json()
            page.locator("#status", has_text="accepted").wait_for(timeout=20_000)
            assert view["commit_sha"] in page.locator("table.meta").inner_text()
            assert page.locator("table.cases tbody tr").count() == 3


def test_queue_page_and_unknown_pages(site):
    with site.client("runner:r1") as r1:
        r1.post("/api/runner/claim", json={"arch": "cpu", "wait": 0, "host": "web-test-host"})
    with browser(javascript=False) as ctx:
        page = ctx.new_page()
        page.goto(site.url + "/queue")
        assert int(page.locator("#runner-count").inner_text()) >= 1
        assert "web-test-host" in page.content()
        resp = page.goto(site.url + "/kernels/cpu/none/such")
        assert resp.status == 404 and "NOT_FOUND" in page.locator("h1").inner_text()
        resp = page.goto(site.url + "/submissions/not-a-uuid")
        assert resp.status == 404
        resp = page.goto(site.url + "/")
        assert "script-src 'self'" in resp.headers["content-security-policy"]
        assert resp.headers["x-content-type-options"] == "nosniff"


def test_queue_page_shows_runners_and_waiting_jobs_per_arch(site):
    with site.client("runner:r1") as r1:
        r1.post("/api/runner/claim", json={"arch": "cpu", "wait": 0, "host": "arch-test-host"})
    with browser(javascript=False) as ctx:
        page = ctx.new_page()
        page.goto(site.url + "/queue")
        headers = page.locator("table.arches thead th").all_inner_texts()
        assert headers == ["arch", "live runners", "runners seen", "waiting jobs"]
        rows = {r[0]: r[1:] for r in (row.split("\t") for row in
                                      page.locator("table.arches tbody tr").all_inner_texts())}
        live, seen, waiting = (int(v) for v in rows["cpu"])
        assert 1 <= live <= seen and waiting >= 0

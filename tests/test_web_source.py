"""A kernel's source on the web, in a real headless Chromium against the real daemon on loopback.

Walks kernel page → source at a record (highlighted server-side, escaped) → diff between two
records → download of the package at a record, with a hostile source file that would run
script if any of it reached the page as markup. With ``KZ_SCREENSHOTS`` set, the source and
diff pages are saved to ``docs/screenshots/`` (``source.png``, ``diff.png``).
"""
from __future__ import annotations

import base64
import io
import os
import tarfile
from pathlib import Path

import pytest

from tests.helpers.browser import browser, require_chromium
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball
from tests.helpers.live_api import result_doc

pytestmark = pytest.mark.browser

SCREENSHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"
HOSTILE = b'\nBANNER = "</code></pre><script>window.__pwned = 1</script><img src=x onerror=\\"window.__pwned=2\\">"\n'


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    require_chromium()
    live = LiveServer.start(tmp_path_factory.mktemp("source-web"), kernels=[CPU_AXPY], settings={"submit_burst": 100})

    def mutate(files):
        files["src/axpy.py"] = files["src/axpy.py"] + HOSTILE

    with live.client() as anon, live.client("runner:r1") as r1, live.client("runner:r2") as r2:
        resp = live.submit(anon, CPU_AXPY, package_tarball(CPU_AXPY, mutate=mutate), submitter="carol")
        assert resp.status_code == 202, resp.text
        uuid = resp.json()["uuid"]
        for runner in (r1, r2):  # the second runner only when the zoo asks for a confirmation run
            claim = runner.post("/api/runner/claim", json={"arch": "cpu", "wait": 10}).json()
            body = {"lease_id": claim["lease_id"], "result": result_doc(CPU_AXPY, 4.0),
                    "logs_b64": base64.b64encode(b"ok").decode(), "env": {}, "failure": None}
            status = runner.post(f"/api/submissions/{uuid}/result", json=body).json()["status"]
            if status != "queued":
                break
        assert status == "accepted"
        live.records = anon.get(f"/api/kernels/{CPU_AXPY}/commits").json()["commits"]
    yield live
    live.stop()


def _shot(page, name: str) -> None:
    if os.environ.get("KZ_SCREENSHOTS"):
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.set_viewport_size({"width": 1360, "height": 900})
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def test_kernel_to_source_to_diff_to_download(site):
    scorecard, source, seed = site.records
    with browser(javascript=True) as ctx:
        page = ctx.new_page()
        response = page.goto(f"{site.url}/kernels/{CPU_AXPY}")
        assert "script-src 'self'" in response.headers["content-security-policy"]
        rows = page.locator("table.records tbody tr")
        assert rows.count() == 3
        assert [t.strip() for t in page.locator("table.records tbody td:nth-child(2)").all_inner_texts()] == \
            ["scorecard", "source", "seed"]

        # the source at the newest record, highlighted on the server; the hostile text stays text
        page.click("#browse-source")
        page.wait_for_url("**/source")
        assert page.locator("#source-commit").get_attribute("title") == scorecard["commit"]
        page.click("#source-files a >> text=src/axpy.py")
        assert page.locator("#source-path").inner_text() == "src/axpy.py"
        code = page.locator("div.highlight")
        assert code.locator("span.kn").first.inner_text() in ("from", "import")  # Pygments' keyword classes
        assert "<script>window.__pwned = 1</script>" in code.inner_text()
        assert page.evaluate("window.__pwned") is None and page.locator("div.highlight script").count() == 0
        assert page.evaluate("getComputedStyle(document.querySelector('div.highlight')).backgroundColor") \
            != "rgba(0, 0, 0, 0)"  # /highlight.css loaded under the CSP

        # an older record: the seed's source has no hostile line
        page.goto(f"{site.url}/kernels/{CPU_AXPY}/source?rev={seed['commit'][:8]}&path=src/axpy.py")
        assert page.locator("#source-commit").get_attribute("title") == seed["commit"]
        assert "__pwned" not in page.locator("div.highlight").inner_text()
        _shot(page, "source")

        # the diff between the seed and the newest record, picked with the form (no JS needed)
        page.goto(f"{site.url}/kernels/{CPU_AXPY}/diff")
        page.select_option("select[name=from]", seed["commit"])
        page.select_option("select[name=to]", source["commit"])
        page.click("form.filters button[type=submit]")
        page.wait_for_url(f"**from={seed['commit']}**")
        assert page.locator("ul.files li code").all_inner_texts() == ["src/axpy.py"]
        added = page.locator("pre.diff span.d-add").all_inner_texts()
        assert any("window.__pwned = 1" in line for line in added) and page.evaluate("window.__pwned") is None
        _shot(page, "diff")

        # download the package at the source record from its source page
        page.goto(f"{site.url}/kernels/{CPU_AXPY}/source?rev={source['commit']}")
        with page.expect_download() as info:
            page.click("#download")
        download = info.value
        assert download.suggested_filename == f"cpu__Elementwise__Axpy__fp32__numpy_ref@{source['commit'][:10]}.tar.gz"
        data = open(download.path(), "rb").read()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        axpy = tar.extractfile(f"{CPU_AXPY}/src/axpy.py").read()
        assert axpy.endswith(HOSTILE) and not any(n.endswith("bench_result.yaml") for n in tar.getnames())


def test_source_pages_work_without_javascript_and_name_bad_revs(site):
    with browser(javascript=False) as ctx:
        page = ctx.new_page()
        page.goto(f"{site.url}/kernels/{CPU_AXPY}/source?rev={site.records[1]['commit']}")
        assert page.locator("#source-files li").count() >= 5
        page.click("#diff-previous")
        assert page.locator("ul.files li code").all_inner_texts() == ["src/axpy.py"]
        response = page.goto(f"{site.url}/kernels/{CPU_AXPY}/source?rev=zz")
        assert response.status == 400 and "BAD_REQUEST" in page.content()
        response = page.goto(f"{site.url}/kernels/cpu/Elementwise/Axpy/fp32/nope/source")
        assert response.status == 404

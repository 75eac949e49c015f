"""Log tails reach the submitter: stored with the run, in the status document, at /logs, in `kz submit`, on the page.

The whole loop runs for real: the daemon and HTTP shim, a real `kz runner --once`
process building the package, and `kz submit` as a subprocess.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kz_daemon.core.errors import ZooError
from kz_daemon.storage.run_logs import MAX_TAIL_CHARS, TAILS_FILE, clean_tails, load_tails, store_tails
from tests.helpers.browser import browser
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball
from tests.helpers.submissions import every
from tests.test_runner_loop import submit_with_one_runner

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "runner"
KERNEL_ID = "cpu/Test/Runner/fp32/ok"
MARKER = "LOGTAIL-MARKER the build exploded"
CONFIG = "queue:\n  lease_seconds: 30\n  reaper_interval_s: 0.5\nrepo:\n  fsync: false\n"


def test_clean_tails_bounds_and_refuses_junk():
    assert clean_tails(None) == {}
    assert clean_tails({"build": "x" * (MAX_TAIL_CHARS + 10)})["build"] == "x" * MAX_TAIL_CHARS
    for bad in ("text", {"build": 3}, {"other": "x"}):
        with pytest.raises(ZooError) as info:
            clean_tails(bad)
        assert info.value.code == "BAD_REQUEST"


def test_store_and_load_round_trip(tmp_path):
    store_tails(tmp_path / "run", {"build": "b\n", "benchmark": "c\n"})
    assert load_tails(tmp_path / "run") == {"build": "b\n", "benchmark": "c\n"}
    assert load_tails(tmp_path / "missing") == {}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = LiveServer.start(tmp_path_factory.mktemp("logs"), kernels=[CPU_AXPY], runners=("loop-test", "r1"),
                              config_yaml=CONFIG)
    yield server
    server.stop()


def _broken_package(tmp_path: Path) -> Path:
    dest = tmp_path / "pkg" / KERNEL_ID
    shutil.copytree(FIXTURE / KERNEL_ID, dest, ignore=shutil.ignore_patterns("__pycache__"))
    script = dest / ".kernel_package" / "build_test_env.py"
    text = script.read_text()
    marker_line = f'    raise RuntimeError("{MARKER}")\n'
    text = text.replace('    """Write the inputs and expectations (deterministic)."""\n',
                        '    """Write the inputs and expectations (deterministic)."""\n' + marker_line, 1)
    assert MARKER in text
    script.write_text(text)
    return dest


def test_a_failing_build_shows_its_traceback_everywhere(live, tmp_path):
    package = _broken_package(tmp_path)
    code, out, serr = submit_with_one_runner(live.url, live.tokens["runner:loop-test"], package, KERNEL_ID,
                                             tmp_path / "work", live.tokens["submitter:alice"])
    assert code == 1, out + serr
    assert MARKER in out and "Traceback" in out, out

    uuid = next(s.uuid for s in every(live.zoo.store).values() if s.kernel_id == KERNEL_ID)
    with live.client() as c:
        doc = c.get(f"/api/submissions/{uuid}/status").json()
        assert doc["status"] == "rejected" and doc["reasons"][0]["code"] == "BUILD_FAILED"
        assert doc["reasons"][0]["hint"]
        assert MARKER in doc["log_tails"]["build"] and len(doc["log_tails"]["build"]) <= MAX_TAIL_CHARS
        assert doc["logs_url"] == f"/api/submissions/{uuid}/logs"
        logs = c.get(doc["logs_url"]).json()
        assert MARKER in logs["build"] and logs["failure"]["code"] == "BUILD_FAILED" and logs["pruned"] is False
        page = c.get(f"/submissions/{uuid}").text
        assert MARKER in page
    with browser(javascript=False) as ctx:  # what a person sees: the traceback's last lines, rendered
        tab = ctx.new_page()
        tab.goto(f"{live.url}/submissions/{uuid}")
        shown = tab.locator("body").inner_text()
        assert MARKER in shown and "Traceback" in shown and "BUILD_FAILED" in shown
    stored = json.loads((live.state_dir / "runs" / uuid / TAILS_FILE).read_text())
    assert MARKER in stored["build"]


def test_logs_are_404_before_a_run_and_for_an_unknown_submission(live):
    with live.client() as c:
        uuid = live.submit(c, CPU_AXPY, package_tarball(CPU_AXPY)).json()["uuid"]
        resp = c.get(f"/api/submissions/{uuid}/logs")
        assert resp.status_code == 404, resp.text
        assert "logs_url" not in c.get(f"/api/submissions/{uuid}/status").json()
        assert c.get("/api/submissions/00000000-0000-4000-8000-000000000000/logs").status_code == 404
    with live.client("submitter:alice") as c:  # alice holds a token: only it cancels her submissions
        c.post(f"/api/submissions/{uuid}/cancel", json={})


def test_a_report_with_malformed_tails_is_refused(live):
    with live.client() as c, live.client("runner:r1") as r1:
        uuid = live.submit(c, CPU_AXPY, package_tarball(CPU_AXPY)).json()["uuid"]
        claim = r1.post("/api/runner/claim", json={"arch": "cpu", "wait": 5}).json()
        assert claim["uuid"] == uuid
        body = {"lease_id": claim["lease_id"], "result": None, "logs_b64": "", "env": {},
                "failure": {"code": "BUILD_FAILED", "message": "x"}}
        bad = r1.post(f"/api/submissions/{uuid}/result", json={**body, "log_tails": {"build": 7}})
        assert bad.status_code == 400, bad.text
        good = r1.post(f"/api/submissions/{uuid}/result", json={**body, "log_tails": {"benchmark": "tail\n"}})
        assert good.status_code == 200, good.text
        assert good.json()["log_tails"] == {"benchmark": "tail\n"}

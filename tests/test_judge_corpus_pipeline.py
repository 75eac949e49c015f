"""The judge cheat corpus through the whole system, with every static rule switched off.

`kz up` (daemon, HTTP, its local runner in real bwrap; the benchmark without the source
area, the kernel in a nested sandbox) seeds the examples; each cheat of
``tests/helpers/judge_cheats.py`` that the judge stops is sent, one after another, as a
new version of the seeded CPU Softmax kernel (its locked harness, only ``src/`` changed)
and must be rejected with the judge's code (or, for the three wrong from their first call,
possibly by the benchmark's own check of a case's expected output); the one that reads
expected/ finds none from the worker's sandbox and is accepted for the work it then does. Then the honest example is
sent again and accepted: a stream of rejected cheats leaves the kernel open to honest work.
About three minutes on a loaded 2-core machine: marked slow.
"""
from __future__ import annotations

import importlib.util
import json
import shutil

import httpx
import pytest
import yaml

from kz_runner.contract.rules.engine import RULES_BY_ID
from kz_runner.worker import sandbox
from tests.helpers.cheats import SOFTMAX
from tests.helpers.daemon import EXAMPLES, SOFTMAX_ID, package_files, tarball_bytes
from tests.helpers.judge_cheats import JudgeCheat, judge_cheat_packages
from tests.test_up import Up

pytestmark = [pytest.mark.skipif(not sandbox.probe().ok or not sandbox.probe_nested().ok,
                                 reason="no bwrap sandbox (or no nested one) on this host"),
              pytest.mark.slow]


# Wrong from their very first call: the benchmark's own check of a case's expected output may fail before the
# judge's comparison does, and the package rejects itself (PACKAGE_REJECTED, correctness failed).
WRONG_FROM_THE_START = {"background_thread", "patched_numpy_exp", "forked_helper"}


def source_files(cheat: JudgeCheat) -> dict[str, bytes]:
    """The cheat's package as a submission: the seeded harness, its own src/ (a bytecode cache too)."""
    files = package_files(cheat.path)
    for pyc in (cheat.src / "__pycache__").glob("*.pyc"):  # package_files leaves caches out; this one is the cheat
        files[pyc.relative_to(cheat.path).as_posix()] = pyc.read_bytes()
    return files


def submit(client: httpx.Client, files: dict[str, bytes]) -> str:
    resp = client.post("/api/submissions", files={"package": ("p.tar.gz", tarball_bytes(SOFTMAX_ID, files))},
                       data={"kernel_id": SOFTMAX_ID, "submitter_id": "mallory"})
    assert resp.status_code == 202, resp.text
    return resp.json()["uuid"]


def final(client: httpx.Client, uuid: str) -> dict:
    doc = client.get(f"/api/submissions/{uuid}/status", params={"wait": 30}).json()
    for _ in range(40):
        if doc["status"] in ("accepted", "rejected", "failed", "cancelled", "held"):
            return doc
        doc = client.get(f"/api/submissions/{uuid}/status", params={"wait": 30}).json()
    raise AssertionError(doc)


def test_every_stopped_family_is_rejected_with_the_judges_code_then_honest_work_is_accepted(tmp_path):
    state = tmp_path / "kz-data"
    state.mkdir()
    (state / "kz.yaml").write_text(yaml.safe_dump({"rules": {"disabled": sorted(RULES_BY_ID)}}))
    cheats = [c for c in judge_cheat_packages(tmp_path / "cheats") if c.expected]
    assert len(cheats) >= 20 and WRONG_FROM_THE_START <= {c.name for c in cheats}
    pyc = next(c for c in cheats if c.name == "pyc_beside_py")
    assert importlib.util.cache_from_source(str(pyc.src / "softmax.py")).endswith(".pyc")
    up = Up(state)
    try:
        docs: dict[str, dict] = {}
        with httpx.Client(base_url=up.url, timeout=60) as client:
            for cheat in cheats:  # in sequence: one runner, and each verdict read before the next upload
                docs[cheat.name] = final(client, submit(client, source_files(cheat)))
            honest = final(client, submit(client, package_files(EXAMPLES / SOFTMAX)))
        for cheat in cheats:
            doc = docs[cheat.name]
            if cheat.name == "expected_files":
                # The worker's sandbox shows it no expected/ (neither the workdir nor any process's cwd under
                # /proc): the cheat finds nothing, computes, and is accepted for honest work.
                tails = json.loads((state / "runs" / doc["uuid"] / "log_tails.json").read_text())
                assert "expected files found: 0" in tails["benchmark"], tails["benchmark"][-2000:]
                assert doc["status"] == "accepted", doc
                continue
            reason = doc["reasons"][0]
            if doc["status"] == "failed" and "TIMER_TAMPERED" in cheat.expected:
                # the judge voided its timing as MACHINE_BUSY on every attempt: the runner gave the job back
                # each time and the queue gave up (never a pass)
                assert reason["code"] == "ATTEMPTS_EXHAUSTED", (cheat.name, doc["reasons"])
                continue
            assert doc["status"] == "rejected", (cheat.name, doc)
            if cheat.name in WRONG_FROM_THE_START and reason["code"] != "WRONG_OUTPUT":
                assert reason["code"] == "PACKAGE_REJECTED", (cheat.name, reason)
                assert "correctness failed" in reason["message"], (cheat.name, reason)
                continue
            # a worker's wait for a CPU that explains the missing time voids a timing (MACHINE_BUSY): never a pass
            allowed = set(cheat.expected) | ({"MACHINE_BUSY"} if "TIMER_TAMPERED" in cheat.expected else set())
            assert reason["code"] in allowed, (cheat.name, doc["reasons"])
        assert honest["status"] == "accepted", honest
        assert up.stop() == 0
    finally:
        if up.proc.poll() is None:
            up.proc.kill()
        shutil.rmtree(tmp_path / "cheats", ignore_errors=True)

"""The judge through the whole system: `kz up` (daemon, HTTP, its local runner in real bwrap), CPU lane.

An honest softmax is timed by the judge (its benchmark runs without the source area, the
kernel in a nested sandbox) and accepted as ``measurement: judged``; three sources that beat
the in-process harness (a predicted trial seed, a patched clock, a cache keyed on the input's
shape and identity) are rejected with the judge's codes while every static rule is switched
off in kz.yaml, so nothing but the judge stands in their way; a benchmark that imports its
kernel from ``src/`` itself runs unverified: accepted into the repository, never a best.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
import yaml

from kz_runner.contract.rules.engine import RULES_BY_ID
from kz_runner.worker import sandbox
from tests.helpers.cheats import SOFTMAX, pipeline_cheat_packages
from tests.helpers.daemon import EXAMPLES, package_files, tarball_bytes
from tests.test_up import Up

pytestmark = pytest.mark.skipif(not sandbox.probe().ok or not sandbox.probe_nested().ok,
                                reason="no bwrap sandbox (or no nested one) on this host")


def submit(client: httpx.Client, kernel_id: str, files: dict[str, bytes]) -> str:
    resp = client.post("/api/submissions", files={"package": ("p.tar.gz", tarball_bytes(kernel_id, files))},
                       data={"kernel_id": kernel_id, "submitter_id": "mallory"})
    assert resp.status_code == 202, resp.text
    return resp.json()["uuid"]


def final(client: httpx.Client, uuid: str) -> dict:
    doc = client.get(f"/api/submissions/{uuid}/status", params={"wait": 30}).json()
    for _ in range(40):
        if doc["status"] in ("accepted", "rejected", "failed", "cancelled"):
            return doc
        doc = client.get(f"/api/submissions/{uuid}/status", params={"wait": 30}).json()
    raise AssertionError(doc)


def softmax_files(src: Path = EXAMPLES / SOFTMAX) -> dict[str, bytes]:
    files = package_files(src)
    files.pop(".kernel_package/bench_result.yaml", None)  # a new kernel: the server gives it the seed
    return files


def test_the_judge_accepts_honest_work_stops_three_cheats_and_marks_an_unjudged_harness(tmp_path):
    state = tmp_path / "kz-data"
    state.mkdir()
    (state / "kz.yaml").write_text(yaml.safe_dump({"rules": {"disabled": sorted(RULES_BY_ID)}}))
    cheats = pipeline_cheat_packages(tmp_path / "cheats")
    legacy = softmax_files()  # the harness of before the judge: it imports the kernel from src/ itself
    legacy[".kernel_package/benchmark.py"] = legacy[".kernel_package/benchmark.py"].replace(
        b'SOFTMAX = bench.kernel("softmax", "softmax_rows")',
        b'sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent / "src"))\n'
        b'from softmax import softmax_rows as SOFTMAX  # noqa: E402')
    assert b"bench.kernel(" not in legacy[".kernel_package/benchmark.py"]
    up = Up(state)
    try:
        with httpx.Client(base_url=up.url, timeout=60) as client:
            honest = submit(client, "cpu/Reduction/Softmax/fp32/judged_honest", softmax_files())
            sent = {c.name: submit(client, f"cpu/Reduction/Softmax/fp32/{c.name}", softmax_files(c.path))
                    for c in cheats}
            unjudged = submit(client, "cpu/Reduction/Softmax/fp32/unjudged", legacy)
            docs = {name: final(client, uuid) for name, uuid in [("honest", honest), *sent.items(),
                                                                  ("unjudged", unjudged)]}
            index = client.get("/index.json").json()
        assert docs["honest"]["status"] == "accepted", docs["honest"]
        env = json.loads((state / "runs" / honest / "env.json").read_text())
        assert env["measurement"] == "judged" and env["containment"]["sandbox"] == "bubblewrap"
        card = yaml.safe_load((state / "repo" / "cpu/Reduction/Softmax/fp32/judged_honest/.kernel_package"
                               / "bench_result.yaml").read_text())
        assert all(c["metrics_best"]["latency_us"]["commit_sha"] != "0000000" for c in card["cases"])
        for cheat in cheats:
            doc = docs[cheat.name]
            if doc["status"] == "failed" and cheat.expected_code == "TIMER_TAMPERED":
                # voided as MACHINE_BUSY on every attempt (a load of 4-7 on two cores did it): the runner gave
                # the job back each time and the queue gave up, never a pass (as in test_judge_corpus_pipeline)
                assert doc["reasons"][0]["code"] == "ATTEMPTS_EXHAUSTED", (cheat.name, doc["reasons"])
                continue
            assert doc["status"] == "rejected", (cheat.name, doc)
            # a clock the worker's reports do not fit is TIMER_TAMPERED; on a host so loaded that the
            # worker's wait for a CPU explains the missing time the timing is void (MACHINE_BUSY): never a pass
            allowed = {cheat.expected_code} | ({"MACHINE_BUSY"} if cheat.expected_code == "TIMER_TAMPERED" else set())
            assert doc["reasons"][0]["code"] in allowed, (cheat.name, doc["reasons"])
        doc = docs["unjudged"]
        assert doc["status"] == "accepted", doc
        env = json.loads((state / "runs" / unjudged / "env.json").read_text())
        assert env["measurement"] == "unverified" and "bench.kernel" in env["unverified_reason"]
        card = yaml.safe_load((state / "repo" / "cpu/Reduction/Softmax/fp32/unjudged/.kernel_package"
                               / "bench_result.yaml").read_text())
        for case in card["cases"]:  # the current figure is kept, marked; the best stays the seed
            assert case["metrics_current"]["latency_us"]["measurement"] == "unverified"
            assert case["metrics_best"]["latency_us"]["commit_sha"] == "0000000"
        entry = next(k for k in index["kernels"] if k["kernel_id"] == "cpu/Reduction/Softmax/fp32/unjudged")
        assert all(c["current"]["unverified"] is True and c["best"]["seed"] for c in entry["cases"]), entry
        assert up.stop() == 0
    finally:
        if up.proc.poll() is None:
            up.proc.kill()
        shutil.rmtree(tmp_path / "cheats", ignore_errors=True)

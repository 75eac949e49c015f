"""The benchmark scripts run and print the keys their results files and the README quote.

Tiny sizes only: these tests check that the scripts work, never how fast anything is.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str, tmp_path: Path) -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    start = proc.stdout.index("{")
    return json.loads(proc.stdout[start:])


@pytest.mark.slow
def test_bench_events_prints_every_figure(tmp_path):
    doc = run_bench("bench_events.py", "--json", "--events", "3000", "--group-events", "400",
                    "--emitters", "4", "--seconds", "0.2", "--dir", str(tmp_path), tmp_path=tmp_path)
    for key in ("append_fsync_events_per_s", "group_commit_events_per_s",
                "group_commit_threads_events_per_s", "replay_events_per_s", "cold_start_s"):
        assert doc[key] > 0, key
    assert doc["group_commit_events"] == 400 and doc["replay_events"] == 3000
    assert doc["machine"]["cpu_count"] >= 1


@pytest.mark.slow
def test_bench_daemon_prints_every_figure(tmp_path):
    doc = run_bench("bench_daemon.py", "--json", "--packages", "40", "--accepts", "4", "--intake", "5",
                    "--runners", "2", "--renewals", "40", tmp_path=tmp_path)
    for key in ("intake_per_s", "renew_per_s", "renew_threads_per_s", "accept_p99_ms", "index_rebuild_s"):
        assert doc[key] > 0, key
    assert doc["renewals"] == 40 and doc["renew_events_per_fsync"] >= 1


def test_group_commit_floor_prints_its_figures(tmp_path):
    doc = run_bench("bench_group_commit_floor.py", "--threads", "4", "--per-thread", "50",
                    "--dir", str(tmp_path), tmp_path=tmp_path)
    assert doc["events"] == 200 and doc["events_per_s"] > 0 and doc["events_per_fsync"] >= 1


def test_bench_index_prints_its_figures(tmp_path):
    doc = run_bench("bench_index.py", "--packages", "20", "--repeat", "1", tmp_path=tmp_path)
    assert doc["packages"] == doc["valid"] == 20
    assert doc["cold_workers1_best_s"] > 0 and doc["cached_workers1_best_s"] > 0


@pytest.mark.slow
def test_bench_http_prints_its_figures(tmp_path):
    doc = run_bench("bench_http.py", "--kernels", "20", "--duration", "0.5", "--submits", "2",
                    "--state-dir", str(tmp_path / "state"), tmp_path=tmp_path)
    assert doc["kernels_non_2xx"] == 0
    for key in ("kernels_req_per_s", "status_p99_ms", "submit_to_claim_ms"):
        assert doc[key] > 0, key


def test_cpu_timing_policy_times_every_case_each_way(tmp_path):
    out = tmp_path / "policy.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cpu_timing_policy.py"), "--rounds", "1",
                           "--json", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["case"].split()[0], r["variant"]) for r in rows} == \
        {(k, v) for k in ("axpy", "softmax") for v in ("rotate", "checked", "checked_after")}
    assert len(rows) == 18 and all(r["median_us"] > 0 and r["faults_per_call"] >= 0 for r in rows)
    assert all("ratio_median" in r for r in rows if r["variant"] != "rotate")


@pytest.mark.slow
def test_cpu_dry_run_ab_compares_two_trees_case_by_case(tmp_path):
    out = tmp_path / "aa.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cpu_dry_run_ab.py"), "--old-tree", str(ROOT),
                           "--rounds", "1", "--json", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["case"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"Axpy n4k", "Axpy n64k", "Axpy n1m", "Softmax r64_c128", "Softmax r512_c1024",
                         "Softmax r2048_c512"}
    assert all(len(r["old"]) == len(r["new"]) == 1 and r["ratio_median"] > 0 for r in rows.values())


def test_soak_tells_rss_held_across_restarts_from_rss_a_lifetime_adds():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import soak
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    samples = []
    for start, acked0, rss0 in ((0.0, 0, 100_000_000), (300.0, 1000, 100_500_000), (600.0, 2000, 101_000_000)):
        for k in range(6):  # 1,000 bytes per submission within a lifetime, 500 held across restarts
            age = 30.0 + 10 * k
            acked = acked0 + 20 * k
            samples.append({"t": start + age, "daemon_start": start, "daemon_age_s": age, "acknowledged": acked,
                            "rss_bytes": rss0 + 1000 * (acked - acked0)})
    samples.insert(0, {"t": 5.0, "daemon_start": 0.0, "daemon_age_s": 5.0, "acknowledged": 0, "rss_bytes": 1})
    per = soak.rss_per_submission(samples)
    assert per == {"within_lifetime": 1000, "within_by_lifetime": [1000, 1000, 1000], "across_restarts": 500,
                   "lifetimes": 3}
    assert "500 bytes held across restarts" in " ".join(soak._rss_lines(per))


def test_memory_probe_reads_the_daemons_memory_from_inside(tmp_path):
    # a short run: the daemon answers SIGUSR2 with a probe line and a tracemalloc snapshot
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "memory_probe.py"), "--minutes", "0.4",
                           "--probe-every", "10", "--frames", "1", "--clients", "2", "--out", str(tmp_path),
                           "--name", "probe"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((tmp_path / "probe.json").read_text())
    assert len(doc["probes"]) >= 2 and all(p["rss"] and p["malloc_in_use"] is not None for p in doc["probes"])
    assert doc["probes"][-1]["traced"] > 0 and doc["lines"], "tracing on: traced bytes and the lines that grew"
    report = (tmp_path / "probe_report.md").read_text()
    assert "Per acknowledged submission" in report and "Source lines whose traced memory grew most" in report


@pytest.mark.slow
def test_bench_runners_loads_a_fresh_daemon_per_runner_count(tmp_path):
    out = tmp_path / "runners.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_runners.py"), "--submissions", "12",
                           "--job-seconds", "0.2", "--runners", "1,2", "--clients", "4", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [c["runners"] for c in report["counts"]] == [1, 2]
    for count in report["counts"]:
        assert count["statuses"] == {"accepted": 12} and count["invariant_problems"] == []
        assert count["ceiling_per_s"] == count["runners"] / 0.2 and count["throughput_per_s"] > 0
    assert "runners" in proc.stdout and report["command"].startswith("python benchmarks/bench_runners.py")

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

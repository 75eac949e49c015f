"""A harness whose METAS name a module-level constant (``"metrics": _METRICS``) runs end to end.

The daemon and HTTP shim, a real ``kz runner --once`` process and ``kz submit`` as a
subprocess: the package validates at intake, builds, benchmarks and is accepted.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.http_server import CPU_AXPY, LiveServer
from tests.helpers.submissions import every
from tests.test_runner_loop import submit_with_one_runner

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "runner" / "cpu" / "Test" / "Runner" / "fp32" / "ok"
KERNEL_ID = "cpu/Test/Runner/fp32/metrics_const"
LITERAL = '"metrics": [{"name": "latency_us", "unit": "us", "direction": "lower_better"}],'
CONFIG = "queue:\n  lease_seconds: 30\n  reaper_interval_s: 0.5\nrepo:\n  fsync: false\n"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = LiveServer.start(tmp_path_factory.mktemp("metas"), kernels=[CPU_AXPY], runners=("loop-test",),
                              config_yaml=CONFIG)
    yield server
    server.stop()


def _package(tmp_path: Path) -> Path:
    dest = tmp_path / "pkg" / KERNEL_ID
    shutil.copytree(FIXTURE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    bench = dest / ".kernel_package" / "benchmark.py"
    text = bench.read_text()
    assert text.count(LITERAL) == 1
    head, tail = text.split("KERNEL_ZOO_TEST_CASE_METAS = [", 1)
    constant = '_METRICS = [{"name": "latency_us", "unit": "us", "direction": "lower_better"}]\n\n'
    bench.write_text(head + constant + "KERNEL_ZOO_TEST_CASE_METAS = ["
                     + tail.replace(LITERAL, '"metrics": _METRICS,'))
    bench.write_text(bench.read_text().replace('KERNEL_ID = "cpu/Test/Runner/fp32/ok"', f'KERNEL_ID = "{KERNEL_ID}"'))
    card = dest / ".kernel_package" / "bench_result.yaml"
    card.write_text(card.read_text().replace("cpu/Test/Runner/fp32/ok", KERNEL_ID))
    return dest


def test_a_harness_with_a_metrics_constant_is_accepted_end_to_end(live, tmp_path):
    package = _package(tmp_path)
    validate = subprocess.run([sys.executable, "-m", "kz_daemon", "validate", str(package)],
                              cwd=ROOT, capture_output=True, text=True)
    assert validate.returncode == 0, validate.stdout + validate.stderr
    code, out, serr = submit_with_one_runner(live.url, live.tokens["runner:loop-test"], package, KERNEL_ID,
                                             tmp_path / "work", live.tokens["submitter:alice"])
    assert code == 0, out + serr
    sub = next(s for s in every(live.zoo.store).values() if s.kernel_id == KERNEL_ID)
    assert sub.status == "accepted", sub.reasons

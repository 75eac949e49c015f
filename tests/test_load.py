"""Load: 1,000 submissions from 32 concurrent clients with 8 runners while readers poll the API and pages.

A real ``kz daemon`` process; six runners speak the wire protocol from threads of this
process (a real run costs seconds of CPU, and a thousand of them would not fit a CI
budget on two cores) and two are real ``kz runner`` processes that run the package for
three jobs each (``--once``, restarted) and then leave the queue to the others.
Asserted: behaviour only (every acknowledged submission terminal, none lost, each
accept exactly its two commits, ``kz audit`` clean, the served index equal to a full
rebuild, no reader saw a 500). Printed, and written to ``$KZ_LOAD_FIGURES`` when set:
throughput, p50/p99 submit-to-terminal, upload times, the daemon's RSS.
``KZ_LOAD_SUBMISSIONS`` changes the count (benchmarks/run_all.py uses it).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers.system import ZooProcess, check_invariants, kernel_ids
from tests.helpers.workload import run_load

pytestmark = [pytest.mark.slow, pytest.mark.load]

SUBMISSIONS = int(os.environ.get("KZ_LOAD_SUBMISSIONS", "1000"))
CLIENTS = 32
KERNELS = kernel_ids(24, "load")
PROTOCOL_RUNNERS = [f"p{i}" for i in range(6)]
REAL_RUNNERS = ["real0", "real1"]


def test_a_thousand_submissions_under_load(tmp_path):
    zoo = ZooProcess(tmp_path / "state", lease=60, runners=tuple(PROTOCOL_RUNNERS + REAL_RUNNERS))
    zoo.start()
    try:
        acks, rest, figures, reader_errors = run_load(
            zoo, tmp_path, submissions=SUBMISSIONS, clients=CLIENTS, kernels=KERNELS,
            protocol_runners=PROTOCOL_RUNNERS, real_runners=REAL_RUNNERS, readers=4, timeout=900)
        doc = figures.to_json()
        print("\nload figures:", json.dumps(doc, indent=1))
        if os.environ.get("KZ_LOAD_FIGURES"):
            Path(os.environ["KZ_LOAD_FIGURES"]).write_text(json.dumps(doc, indent=1) + "\n")
        assert figures.refused == {}, figures.refused  # valid packages, generous limits: nothing refused
        assert len(acks) == SUBMISSIONS
        assert rest == [], f"{len(rest)} acknowledged submissions not terminal in time"
        assert reader_errors == [], reader_errors[:5]
        verdict = check_invariants(zoo, acks)
        assert verdict.problems == [], verdict.problems[:20]
        assert verdict.accepted >= 1
        assert zoo.pid is not None, zoo.log_tail()
    finally:
        rc = zoo.stop()
    assert rc == 0, zoo.log_tail()

"""Does the queue's throughput scale with the runners on one host? The load test with 1, 2 and 4 runners.

    python benchmarks/bench_runners.py                       # 300 submissions, jobs of 0.5 s, 1/2/4 runners
    python benchmarks/bench_runners.py --submissions 1000 --job-seconds 0.5 --runners 1,2,4

For each runner count, a fresh ``kz daemon`` process (its own state directory, port and
tokens) takes the load suite's uploads (``tests/helpers/workload.run_load``: 32 clients,
24 kernels, readers polling the API) and that many runners serve it over the wire
protocol: claim, download the package, spend ``--job-seconds`` (a job's run), report an
accepting result. The runners are threads of this process, not ``kz runner`` processes:
a real CPU job costs seconds of CPU, so on a two-core host real runners measure the cores,
not the daemon. With a fixed job time, N runners can finish at most N/job_s jobs a
second; where throughput stops following N, the daemon (claims, reports, the accept
saga, git) is the limit. Prints one line per count and writes ``--out``
(``benchmarks/results/bench_runners.json`` by default) with every figure, the command and
the machine. Figures only: nothing here asserts.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

from machine import calibration_s, machine_facts  # noqa: E402

from tests.helpers.system import ZooProcess, check_invariants, kernel_ids  # noqa: E402
from tests.helpers.workload import run_load  # noqa: E402


def one_count(base: Path, runners: int, submissions: int, job_s: float, clients: int, timeout: float) -> dict:
    """The load with ``runners`` protocol runners against a fresh daemon; its figures and invariant problems."""
    names = [f"r{i}" for i in range(runners)]
    zoo = ZooProcess(base / "state", lease=60, runners=tuple(names))
    zoo.start()
    try:
        acks, rest, figures, reader_errors = run_load(
            zoo, base, submissions=submissions, clients=clients, kernels=kernel_ids(24, f"run{runners}"),
            protocol_runners=names, real_runners=[], readers=2, timeout=timeout, tag=f"R{runners}",
            protocol_job_s=job_s)
        verdict = check_invariants(zoo, acks)
    finally:
        rc = zoo.stop()
    doc = figures.to_json()
    doc.update(runners=runners, job_s=job_s, ceiling_per_s=round(runners / job_s, 3) if job_s > 0 else None,
               not_terminal=len(rest), reader_errors=len(reader_errors), invariant_problems=verdict.problems[:20],
               daemon_exit_status=rc)
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--submissions", type=int, default=300)
    parser.add_argument("--job-seconds", type=float, default=0.5, help="how long each job runs on its runner")
    parser.add_argument("--runners", default="1,2,4", help="comma-separated runner counts")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one count may take")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "bench_runners.json")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.runners.split(",") if n.strip()]
    if not counts or min(counts) < 1 or args.submissions < 1 or args.job_seconds < 0:
        parser.error("--runners needs counts >= 1, --submissions >= 1 and --job-seconds >= 0")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    report = {"command": "python benchmarks/bench_runners.py " + shlex.join(sys.argv[1:] if argv is None else argv),
              "commit": commit, "machine": machine_facts(), "calibration_start_s": calibration_s(), "counts": []}
    print(f"{'runners':>7} {'ceiling/s':>9} {'done/s':>7} {'p50 s':>7} {'p99 s':>7} {'wall s':>7}  statuses",
          flush=True)
    for runners in counts:
        with tempfile.TemporaryDirectory(prefix=f"kz-runners-{runners}-") as tmp:
            started = time.monotonic()
            doc = one_count(Path(tmp), runners, args.submissions, args.job_seconds, args.clients, args.timeout)
            doc["elapsed_s"] = round(time.monotonic() - started, 1)
        report["counts"].append(doc)
        ceiling = f"{doc['ceiling_per_s']:.2f}" if doc["ceiling_per_s"] else "-"
        print(f"{runners:>7} {ceiling:>9} {doc['throughput_per_s']:>7.2f} {doc['p50_submit_to_terminal_s']:>7.2f} "
              f"{doc['p99_submit_to_terminal_s']:>7.2f} {doc['wall_s']:>7.1f}  {doc['statuses']}"
              + (f"  PROBLEMS: {doc['invariant_problems'][:3]}" if doc["invariant_problems"] else ""), flush=True)
    report["calibration_end_s"] = calibration_s()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

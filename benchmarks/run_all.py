"""Every benchmark that runs on a CPU machine, one after another, and one Markdown report of their figures.

    python benchmarks/run_all.py            # modest sizes: minutes on a 2-core machine
    python benchmarks/run_all.py --full     # the sizes the README quotes (much longer)

Runs bench_events, bench_daemon, bench_index, bench_group_commit_floor, bench_http
(only where ``wrk`` is installed; otherwise the report says so) and the load suite
(tests/test_load.py with ``KZ_LOAD_FIGURES``), each as its own process, and writes
``benchmarks/results/report.md`` (one table: benchmark, figure, value, the command)
with the machine's facts (CPU model, cores, RAM, Python, kernel, the calibration loop
of benchmarks/machine.py before and after) and ``report.json`` (every script's whole
JSON output). The committed results files that the README quotes are not rewritten.
GPU benchmarks are listed with a pointer to their committed H200 results.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from machine import calibration_s, cpu_model  # noqa: E402

#: (name, modest arguments, --full arguments, figures to tabulate: (key path, label))
BENCHES = [
    ("bench_events", ["--json", "--events", "100000", "--group-events", "5000", "--seconds", "1"], ["--json"],
     [("append_fsync_events_per_s", "durable appends, one fsync each (events/s)"),
      ("group_commit_events_per_s", "group commit, 32 coroutines (events/s)"),
      ("group_commit_threads_events_per_s", "group commit, 32 threads (events/s)"),
      ("append_many_events_per_s", "batches of 100 (events/s)"),
      ("replay_events_per_s", "replay (events/s)"),
      ("replay_events", "replay log size (events)"),
      ("cold_start_s", "cold start (s)")]),
    ("bench_daemon", ["--json", "--packages", "1000", "--accepts", "30", "--intake", "100", "--runners", "8",
                      "--renewals", "2000"], ["--json"],
     [("intake_per_s", "intake (tarballs/s)"), ("accept_p50_ms", "accept saga p50 (ms)"),
      ("accept_p99_ms", "accept saga p99 (ms)"), ("renew_per_s", "lease renewals (per s)"),
      ("index_rebuild_s", "index rebuild (s)"), ("packages", "repo size (packages)")]),
    ("bench_index", ["--packages", "1000", "--repeat", "1"], [],
     [("cold_workers1_best_s", "full rebuild, cold, 1 worker (s)"),
      ("cached_workers1_best_s", "full rebuild, cached, 1 worker (s)"),
      ("update_one_s", "update one entry (s)"), ("packages", "packages")]),
    ("bench_group_commit_floor", ["--threads", "8", "--per-thread", "200"], [],
     [("events_per_s", "thread-per-emitter floor (events/s)"), ("cpu_us_per_event", "CPU per event (us)"),
      ("events_per_fsync", "events per fsync")]),
    ("bench_http", ["--json", "--kernels", "1000", "--duration", "3", "--submits", "5"], ["--json"],
     [("kernels_req_per_s", "GET /api/kernels (req/s)"), ("status_p50_ms", "status long poll p50 (ms)"),
      ("status_p99_ms", "status long poll p99 (ms)"), ("submit_to_claim_ms", "submit to claim (ms)")]),
]
LOAD_FIGURES = [("throughput_per_s", "submissions to terminal (per s)"),
                ("p50_submit_to_terminal_s", "submit-to-terminal p50 (s)"),
                ("p99_submit_to_terminal_s", "submit-to-terminal p99 (s)"),
                ("upload_p50_s", "upload answered p50 (s)"), ("upload_p99_s", "upload answered p99 (s)"),
                ("rss_max_bytes", "daemon RSS max (bytes)"), ("submissions", "submissions"),
                ("reader_requests", "reader requests meanwhile")]
GPU = [
    ("bench_agreement.py", "kz_runner.bench vs triton do_bench", "bench_agreement_h200.json, bench_agreement_h200_run2.json"),
    ("ncu_agreement.py", "kz_runner.bench vs Nsight Compute", "ncu_agreement_h200.json, ncu_agreement_h200.md"),
    ("repeatability.py", "identical resubmissions, spread per case", "repeatability_h200.json"),
    ("pipeline_proof.py", "the whole pipeline on GPUs", "pipeline_h200x2/, pipeline_h200_mha/"),
    ("gpu_examples.sh", "dry runs of the GPU examples", "dry_run_sm90_h200.txt, dry_run_gfx928_on_h200.txt"),
]


def last_json(text: str) -> dict | None:
    """The last line of ``text`` that parses as a JSON object (the scripts print one), else the whole text."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, dict) else None
    except ValueError:
        return None


def find(doc: dict, key: str):
    """``doc[key]``, looking one level down too (some scripts nest their figures)."""
    if key in doc:
        return doc[key]
    for value in doc.values():
        if isinstance(value, dict) and key in value:
            return value[key]
    return None


def run(argv: list[str], timeout: float, env: dict | None = None) -> tuple[int, str, float]:
    """Run a benchmark process; (exit status, stdout + stderr tail, seconds)."""
    start = time.perf_counter()
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))
        return done.returncode, done.stdout + "\n" + done.stderr[-4000:], time.perf_counter() - start
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout} s", time.perf_counter() - start


def machine() -> dict:
    """Facts about this machine."""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpu_model": cpu_model(), "cores": os.cpu_count(), "ram_gib": round(mem / 2 ** 30, 1),
            "python": platform.python_version(), "kernel": platform.release(),
            "loadavg_1m_at_start": round(os.getloadavg()[0], 2)}


def fmt(value) -> str:
    """A figure for the table."""
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "-" if value is None else str(value)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the sizes the README quotes")
    parser.add_argument("--out", default=str(HERE / "results"), help="folder for report.md and report.json")
    parser.add_argument("--only", nargs="*", help="run only these (names as in the table, 'load' for the load suite)")
    args = parser.parse_args(argv)
    facts = machine()
    facts["calibration_loop_s_start"] = calibration_s()
    started = time.time()
    rows: list[tuple[str, str, str, str]] = []
    raw: dict[str, dict] = {}
    notes: list[str] = []
    for name, modest, full, figures in BENCHES:
        if args.only and name not in args.only:
            continue
        if name == "bench_http" and shutil.which("wrk") is None:
            notes.append("bench_http was not run: wrk is not installed here (its figures need wrk; "
                         "`apt-get install wrk`, then run this again)")
            continue
        argv_ = [sys.executable, f"benchmarks/{name}.py", *(full if args.full else modest)]
        print(f"run_all: {' '.join(argv_[1:])}", flush=True)
        rc, out, seconds = run(argv_, timeout=7200 if args.full else 1200)
        doc = last_json(out) if rc == 0 else None
        command = "python " + " ".join(argv_[1:])
        if doc is None:
            notes.append(f"{name} failed (exit {rc}): {out.strip().splitlines()[-1] if out.strip() else ''}")
            continue
        raw[name] = doc
        for key, label in figures:
            rows.append((name, label, fmt(find(doc, key)), command))
        rows.append((name, "wall time of the script (s)", fmt(round(seconds, 1)), command))
    if not args.only or "load" in args.only:
        count = "1000" if args.full else "300"
        with tempfile.TemporaryDirectory(prefix="kz-load-figures-") as tmp:
            figures_path = Path(tmp) / "load.json"
            argv_ = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_load.py"]
            print(f"run_all: KZ_LOAD_SUBMISSIONS={count} {' '.join(argv_[1:])}", flush=True)
            rc, out, seconds = run(argv_, timeout=3600, env={"KZ_LOAD_SUBMISSIONS": count,
                                                             "KZ_LOAD_FIGURES": str(figures_path)})
            command = f"KZ_LOAD_SUBMISSIONS={count} python -m pytest tests/test_load.py"
            if figures_path.exists():
                doc = json.loads(figures_path.read_text())
                raw["load"] = doc
                for key, label in LOAD_FIGURES:
                    rows.append(("load (tests/test_load.py)", label, fmt(doc.get(key)), command))
                rows.append(("load (tests/test_load.py)", "the suite's assertions", "passed" if rc == 0 else
                             f"**failed** (exit {rc})", command))
            else:
                notes.append(f"the load suite wrote no figures (exit {rc}): {out.strip()[-300:]}")
    facts["calibration_loop_s_end"] = calibration_s()
    facts["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    doc = {"command": "python benchmarks/run_all.py" + (" --full" if args.full else ""),
           "commit": head.stdout.strip() or None,
           "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
           "duration_s": round(time.time() - started, 1), "machine": facts, "notes": notes, "results": raw}
    (out_dir / "report.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out_dir / "report.md").write_text(markdown(doc, rows))
    print(markdown(doc, rows))
    return 0 if not any("failed" in n for n in notes) else 1


def markdown(doc: dict, rows: list[tuple[str, str, str, str]]) -> str:
    """The report."""
    m = doc["machine"]
    lines = [
        "# Benchmark report", "",
        f"`{doc['command']}` at commit {doc['commit']}, started {doc['started_at']}, took "
        f"{doc['duration_s'] / 60:.1f} minutes. "
        + ("Sizes: the README's (`--full`)." if "--full" in doc["command"] else
           "Modest sizes (not the README's; `--full` runs those): figures show the order of magnitude on this "
           "machine, not the quoted ones."), "",
        "| machine | |", "| --- | --- |",
        f"| CPU | {m['cpu_model']} |", f"| cores | {m['cores']} |", f"| RAM | {m['ram_gib']} GiB |",
        f"| Python | {m['python']} |", f"| kernel | {m['kernel']} |",
        f"| calibration loop (benchmarks/machine.py) | {m['calibration_loop_s_start']} s at the start, "
        f"{m['calibration_loop_s_end']} s at the end |",
        f"| load average (1 min) | {m['loadavg_1m_at_start']} at the start, {m['loadavg_1m_at_end']} at the end |",
        "",
        "| benchmark | figure | value | command |", "| --- | --- | --- | --- |",
    ]
    lines += [f"| {b} | {label} | {value} | `{cmd}` |" for b, label, value, cmd in rows]
    if doc["notes"]:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in doc["notes"]]
    lines += ["", "GPU benchmarks (need a CUDA or ROCm host; not run here). Their committed H200 results are in "
              "`benchmarks/results/`:", "", "| script | what | results |", "| --- | --- | --- |"]
    lines += [f"| benchmarks/{s} | {what} | {res} |" for s, what, res in GPU]
    lines += ["", "Every script's whole output is in `report.json`.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

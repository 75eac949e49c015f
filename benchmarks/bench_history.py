"""Memory and start-up of a daemon with a long history: a million submissions against ten thousand.

    python benchmarks/bench_history.py --json [--submissions 1000000] [--baseline 10000] [--requests 400]
        [--work DIR [--keep | --reuse]] [--out FILE]

For each size it writes a history of that many submissions (``kz_events.read.workload.history``:
intake rejections, holds and reviews, confirmation runs, accepts with their index
updates, rejected results, failures, cancellations and revocations, over about a year
of log time) into a fresh state directory, then measures:

- ``build``: writing the log (no fsync), and the first ``Store.open`` on it: the full
  replay that folds every line and builds the history projection from nothing
  (``projection_rebuild_s``);
- ``replay_s`` / ``replay_events_per_s``: ``kz replay``'s full replay of the log alone;
- ``store_open_s`` and ``store_rss_mb``: a fresh process opening the store from its
  snapshot plus tail (the cold start of the event store), and its RSS after;
- ``daemon_ready_s``: ``kz up --no-runner`` from spawn until it serves (imports, store,
  recovery, index), ``daemon_rss_mb`` after that, ``daemon_rss_after_mb`` after the
  requests below;
- ``list_*``: ``GET /api/submissions?submitter=S&limit=50`` for submitters from the
  busiest to the rarest, half of them with ``status=accepted``, and a walk of cursor
  pages; ``status_*``: ``GET /api/submissions/{uuid}/status`` of finished submissions
  picked at random: p50 and p99 in ms, one client, sequential requests; ``list_next_page``
  follows the ``next_cursor`` of every list that has one;
- ``list_sql`` / ``list_next_page_sql``: the same first and next pages through the
  projection's ``History.select`` alone (this process, a read-only connection): the SQL
  and the decoding, without HTTP.

The comparison (``ratios``) divides the big history's figures by the baseline's.
Prints one JSON object (``--json``) and writes it to benchmarks/results/bench_history.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from machine import calibration_s, machine_facts, percentile  # noqa: E402

OPEN_CHILD = """
import json, resource, sys, time
t = time.perf_counter()
from kz_events.log.store import Store
imported = time.perf_counter() - t
t = time.perf_counter()
store = Store.open(sys.argv[1], snapshot_every=0)
opened = time.perf_counter() - t
rss = [l for l in open("/proc/self/status") if l.startswith("VmRSS:")][0].split()[1]
print(json.dumps({"open_s": opened, "import_s": imported, "rss_kb": int(rss),
                  "snapshot_seq": store.report["snapshot_seq"], "replayed": store.report["replayed"],
                  "live": len(store.state.submissions), "accepted_map": len(store.state.accepted)}))
store.close()
"""


def log(message: str) -> None:
    """Progress on stderr."""
    print(f"[bench_history] {message}", file=sys.stderr, flush=True)


def rss_mb(pid: int) -> float:
    """Resident set of a process, MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def build(state: Path, n: int) -> dict:
    """A state directory holding a history of ``n`` submissions; what building it took."""
    from kz_daemon.ops.runtime import init_state_dir
    from kz_events.read.workload import build_history

    state.mkdir(parents=True)
    init_state_dir(state)
    started = time.perf_counter()
    summary = build_history(state / "events", n, seed=1)
    total = time.perf_counter() - started
    log(f"{n} submissions: {summary['seq']} events, built in {total:.1f} s "
        f"(first open {summary['open']['seconds']:.1f} s)")
    return {"events": summary["seq"], "by_status": summary["by_status"], "live": summary["live"],
            "build_s": round(total, 2), "projection_rebuild_s": round(summary["open"]["seconds"], 2),
            "log_bytes": sum(p.stat().st_size for p in (state / "events").glob("*.jsonl")),
            "projection_bytes": (state / "events" / "history.sqlite").stat().st_size}


def replay(state: Path) -> dict:
    """``kz replay``'s full replay of the log alone (no snapshot, no projection)."""
    from kz_events.log.replay import replay_dir

    started = time.perf_counter()
    result = replay_dir(state / "events")
    seconds = time.perf_counter() - started
    return {"replay_s": round(seconds, 2), "replay_events_per_s": round(result.seq / seconds)}


def store_open(state: Path) -> dict:
    """A fresh process opening the store: snapshot + tail, and its RSS then."""
    out = subprocess.run([sys.executable, "-c", OPEN_CHILD, str(state / "events")], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    doc = json.loads(out)
    return {"store_open_s": round(doc["open_s"], 3), "store_rss_mb": round(doc["rss_kb"] / 1024, 1),
            "store_snapshot_seq": doc["snapshot_seq"], "store_replayed": doc["replayed"],
            "live_submissions": doc["live"], "accepted_map_entries": doc["accepted_map"]}


class Daemon:
    """``kz up --no-runner`` on a free port, timed from spawn until it serves."""

    def __init__(self, state: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KZ_")}
        env["PYTHONUNBUFFERED"] = "1"
        started = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "kz_daemon", "up", "--state-dir", str(state),
                                      "--port", "0", "--no-runner"], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.url = ""
        for line in self.proc.stdout:
            match = re.match(r"kz up: serving (http://\S+)", line)
            if match:
                self.url = match.group(1)
                break
        self.ready_s = time.perf_counter() - started
        if not self.url:
            self.proc.kill()
            raise SystemExit("kz up did not start")
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()

    def get(self, path: str) -> tuple[float, dict]:
        """(milliseconds, JSON body) of one GET."""
        started = time.perf_counter()
        with urllib.request.urlopen(self.url + path, timeout=60) as resp:
            body = json.loads(resp.read())
        return (time.perf_counter() - started) * 1000, body

    def stop(self) -> None:
        """SIGTERM, as an operator would."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def requests(daemon: Daemon, state: Path, count: int, rng: random.Random) -> dict:
    """List and status latencies, one sequential client."""
    from kz_events.log.history import History, history_path

    with History.open(history_path(state / "events"), readonly=True) as history:
        sample = [row[0] for page in history.finished(page=20_000) for row in page
                  if rng.random() < 0.02][:count * 4]
    rng.shuffle(sample)
    for _ in range(10):  # warm the connection pool and the caches a little, as a running daemon has
        daemon.get("/api/submissions?limit=50")
    lists, walks, asked = [], [], []
    for i in range(count):
        who = f"submitter-{min(1999, int(rng.paretovariate(1.0)) - 1)}"
        status = "accepted" if i % 2 else None
        query = f"/api/submissions?submitter={who}&limit=50" + (f"&status={status}" if status else "")
        ms, body = daemon.get(query)
        lists.append(ms)
        cursor = None
        if body["next_cursor"]:  # the next page, for every list that has one
            cursor = body["next_cursor"]
            ms, _ = daemon.get(query + f"&cursor={cursor}")
            walks.append(ms)
        asked.append((who, status, cursor))
    statuses = []
    for uuid in sample[:count]:
        ms, body = daemon.get(f"/api/submissions/{uuid}/status")
        assert body["uuid"] == uuid and body["terminal"], body
        statuses.append(ms)

    def pct(values: list[float]) -> dict:
        return {"p50_ms": round(percentile(values, 0.5), 2), "p99_ms": round(percentile(values, 0.99), 2),
                "n": len(values)}

    figures: dict = {"list": lists, "list_next_page": walks or None, "status": statuses}
    figures.update(sql_alone(state, asked))
    return {key: pct(values) if isinstance(values, list) else values for key, values in figures.items()}


def sql_alone(state: Path, asked: list[tuple[str, str | None, str | None]]) -> dict:
    """The same lists through the projection's ``select`` in this process (a read-only
    connection beside the daemon): the SQL and the decoding of the rows, without HTTP."""
    from kz_daemon.api.listing import decode_cursor
    from kz_events.log.history import History, Query, history_path

    first, nxt = [], []
    with History.open(history_path(state / "events"), readonly=True) as history:
        for who, status, cursor in asked:
            query = Query(submitter=who, status=status)
            started = time.perf_counter()
            history.select(query, None, 51)
            first.append((time.perf_counter() - started) * 1000)
            if cursor is not None:
                started = time.perf_counter()
                history.select(query, decode_cursor(cursor), 51)
                nxt.append((time.perf_counter() - started) * 1000)
    return {"list_sql": first, "list_next_page_sql": nxt}


def measure(work: Path, n: int, count: int, reuse: bool = False) -> dict:
    """Every figure for a history of ``n`` submissions (``reuse``: a state directory a
    ``--keep`` run left in ``work`` is measured again, without building it)."""
    state = work / f"h{n}"
    if reuse and (state / "events" / "history.sqlite").exists():
        figures: dict = {"submissions": n, "reused": True}
        log(f"{n}: reusing {state}")
    else:
        figures = {"submissions": n, **build(state, n)}
    figures.update(replay(state))
    log(f"{n}: replay {figures['replay_s']} s")
    figures.update(store_open(state))
    log(f"{n}: store open {figures['store_open_s']} s, rss {figures['store_rss_mb']} MiB")
    daemon = Daemon(state)
    try:
        figures["daemon_ready_s"] = round(daemon.ready_s, 2)
        time.sleep(2.0)  # the first background passes (index writer, retention) settle
        figures["daemon_rss_mb"] = rss_mb(daemon.proc.pid)
        figures.update(requests(daemon, state, count, random.Random(n)))
        figures["daemon_rss_after_mb"] = rss_mb(daemon.proc.pid)
    finally:
        daemon.stop()
    log(f"{n}: daemon ready {figures['daemon_ready_s']} s, rss {figures['daemon_rss_mb']} MiB, "
        f"list p99 {figures['list']['p99_ms']} ms, status p99 {figures['status']['p99_ms']} ms")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=1_000_000)
    parser.add_argument("--baseline", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=400, help="list and status requests each")
    parser.add_argument("--work", default=None, help="where the state directories go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="leave the state directories")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the state directories a --keep run left in --work instead of building them")
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_history.json"))
    args = parser.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-history-"))
    work.mkdir(parents=True, exist_ok=True)
    calibration = calibration_s()
    try:
        sizes = {}
        for n in (args.baseline, args.submissions):
            sizes[str(n)] = measure(work, n, args.requests, args.reuse)
    finally:
        if not args.keep and not args.reuse:
            shutil.rmtree(work, ignore_errors=True)
    small, big = sizes[str(args.baseline)], sizes[str(args.submissions)]
    ratios = {key: round(big[key] / small[key], 2) for key in
              ("daemon_rss_mb", "daemon_rss_after_mb", "store_rss_mb", "store_open_s", "daemon_ready_s")}
    ratios["list_p99"] = round(big["list"]["p99_ms"] / small["list"]["p99_ms"], 2)
    ratios["status_p99"] = round(big["status"]["p99_ms"] / small["status"]["p99_ms"], 2)
    doc = {"command": "python benchmarks/bench_history.py --json " + " ".join(
               f"--{k} {v}" for k, v in (("submissions", args.submissions), ("baseline", args.baseline),
                                         ("requests", args.requests))) + (" --reuse" if args.reuse else ""),
           "sizes": sizes, "ratios": ratios,
           "targets": {"rss_ratio_max": 1.5, "rss_mb_max": 300, "cold_start_s_max": 5, "list_p99_ms_max": 50},
           "machine": machine_facts(calibration_loop_s_start=calibration, calibration_loop_s_end=calibration_s())}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    if args.json:
        print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark of kz_events: durable appends, group commit, replay and cold start.

Usage::

    python benchmarks/bench_events.py --json            # the full run (1,000,000-event log)
    python benchmarks/bench_events.py --json --events 100000 --out results.json

Prints ONE JSON object: ``append_fsync_events_per_s`` (one emit and one fsync per
event, one thread), ``group_commit_events_per_s`` (``--emitters`` coroutines on one
asyncio loop, each emitting single events with ``Store.emit_async`` as the daemon's HTTP
handlers do; concurrent emits share fsyncs; best of 3 rounds),
``group_commit_threads_events_per_s`` (the same number of threads, each calling the
blocking ``Store.emit``; best of 3), ``append_many_events_per_s`` (batches of
100 per emit), ``replay_events_per_s`` (full rebuild of the state from a log of
``--events`` simulated events, hash chain checked; best of 3, as ``kz replay`` runs
it: with the reading worker process on a machine of two or more CPUs), ``cold_start_s`` (Store.open
with a snapshot at the end of that log), plus machine facts. Work happens in a
temporary directory (``--dir`` to choose where: the filesystem matters for fsync).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import AppendCounter, calibration_s, timed_coroutines, timed_threads  # benchmarks/ is sys.path[0]

from kz_events import events as E
from kz_events.log.replay import replay_dir
from kz_events.log.store import Store
from kz_events.read.workload import simulate


def _filesystem(path: Path) -> str:
    try:
        out = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True, check=True)
        return out.stdout.splitlines()[1].split()[1]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"


def _received(i: int, tag: str) -> E.Event:
    return E.SubmissionReceived(f"{tag}-{i}", f"sm_90/Op{i % 50}/x/fp16/k", "bench", "http",
                                "p.tar.gz", 1000 + i, "a" * 64)


def bench_append_fsync(root: Path, seconds: float) -> dict:
    """One thread, one event per emit, one fsync per emit."""
    with Store.open(root / "append", snapshot_every=0) as store:
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            store.emit(_received(n, "a"))
            n += 1
        elapsed = time.perf_counter() - start
    return {"append_fsync_events_per_s": round(n / elapsed), "append_fsync_events": n}


def bench_group_commit(root: Path, emitters: int, per_emitter: int, rounds: int = 3) -> dict:
    """``emitters`` concurrent emitters of single events; their fsyncs are shared.

    Coroutines (``emit_async``, the daemon's HTTP path) give ``group_commit_*``;
    threads (blocking ``emit``) give ``group_commit_threads_*``. Best of ``rounds``
    rounds each, on fresh logs (one round is about a second, so one burst of another
    process's work on this shared machine decides a single round); every round's
    rate is reported too.
    """
    result: dict = {"group_commit_emitters": emitters, "group_commit_events": emitters * per_emitter}
    for mode, prefix in (("coroutines", "group_commit"), ("threads", "group_commit_threads")):
        rounds_ = [_group_commit_round(root / f"{mode}{r}", mode, emitters, per_emitter)
                   for r in range(rounds)]
        rate, per_fsync = max(rounds_)
        result[f"{prefix}_events_per_s"] = rate
        result[f"{prefix}_events_per_fsync"] = per_fsync
        result[f"{prefix}_rounds_events_per_s"] = [r[0] for r in rounds_]
    return result


def _group_commit_round(events_dir: Path, mode: str, emitters: int, per_emitter: int) -> tuple[int, float]:
    """One round of ``bench_group_commit``: (events/s, events per fsync)."""
    store = Store.open(events_dir, snapshot_every=0)
    with AppendCounter(store) as fsyncs:
        if mode == "threads":
            def work(t: int) -> None:
                """One emitter thread."""
                for i in range(per_emitter):
                    store.emit(_received(i, f"g{t}"))

            elapsed = timed_threads(emitters, work)
        else:
            async def work_async(c: int) -> None:
                """One emitter coroutine."""
                for i in range(per_emitter):
                    await store.emit_async(_received(i, f"g{c}"))

            elapsed = timed_coroutines(emitters, work_async)
    store.close()
    total = emitters * per_emitter
    return round(total / elapsed), round(total / max(1, fsyncs.count), 1)


def bench_append_many(root: Path, batches: int, size: int) -> dict:
    """One thread, ``size`` events per emit (one write and one fsync per batch)."""
    with Store.open(root / "many", snapshot_every=0) as store:
        start = time.perf_counter()
        for b in range(batches):
            store.emit(*[_received(b * size + i, "m") for i in range(size)])
        elapsed = time.perf_counter() - start
    return {"append_many_events_per_s": round(batches * size / elapsed), "append_many_batch": size}


def build_big_log(events_dir: Path, n: int, seed: int = 1) -> float:
    """Write ``n`` simulated events through the Store (batches of 1000, fsync per batch)."""
    start = time.perf_counter()
    batch: list[E.Event] = []
    with Store.open(events_dir, snapshot_every=0) as store:
        for ev in simulate(random.Random(seed), n):
            batch.append(ev)
            if len(batch) == 1000:
                store.emit(*batch)
                batch = []
        if batch:
            store.emit(*batch)
    return time.perf_counter() - start


def bench_replay_and_cold_start(root: Path, n: int) -> dict:
    """Full replay of an ``n``-event log, then cold start with a snapshot at its end."""
    events_dir = root / "big" / "events"
    build_s = build_big_log(events_dir, n)
    size = sum(p.stat().st_size for p in events_dir.glob("*.jsonl"))
    os.sync()  # the log's writeback is done before the clock starts, not during a replay
    runs = []
    state = None
    for _ in range(3):
        del state  # the last run's State is freed before the clock starts
        start = time.perf_counter()
        state = replay_dir(events_dir)
        runs.append(time.perf_counter() - start)
    replay_s = min(runs)
    assert state.seq == n
    with Store.open(events_dir, use_snapshots=False) as store:
        t = time.perf_counter()
        snap = store.snapshot()
        snapshot_write_s = time.perf_counter() - t
    starts = []
    for _ in range(3):
        store = None  # the last store and its State are freed before the clock starts
        start = time.perf_counter()
        store = Store.open(events_dir)
        starts.append(time.perf_counter() - start)
        assert store.report["snapshot_seq"] == n and store.state.seq == n
        store.close()
    return {
        "replay_events_per_s": round(n / replay_s), "replay_events": n, "replay_s": round(replay_s, 3),
        "replay_runs_s": [round(r, 3) for r in runs],
        "log_bytes": size, "log_segments": len(list(events_dir.glob("*.jsonl"))),
        "build_log_s": round(build_s, 1), "submissions": len(state.submissions),
        "cold_start_s": round(min(starts), 3), "cold_start_runs_s": [round(s, 3) for s in starts],
        "snapshot_bytes": snap.stat().st_size, "snapshot_write_s": round(snapshot_write_s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object (default)")
    parser.add_argument("--events", type=int, default=1_000_000, help="size of the replay log")
    parser.add_argument("--emitters", type=int, default=32,
                        help="concurrent group-commit emitters (coroutines, then threads)")
    parser.add_argument("--group-events", type=int, default=20_000,
                        help="events per group-commit round (split over the emitters)")
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of the fsync loop")
    parser.add_argument("--dir", default=None, help="where to work (default: the tmp dir)")
    parser.add_argument("--out", default=None, help="also write the JSON object to this file")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="kz-bench-events-", dir=args.dir))
    try:
        result = {
            "benchmark": "kz_events",
            "command": "python benchmarks/bench_events.py --json" + (
                f" --events {args.events}" if args.events != 1_000_000 else ""),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {
                "cpu_count": os.cpu_count(), "python": platform.python_version(),
                "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                "filesystem": _filesystem(root), "tmp_dir": str(root.parent),
                "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
                "calibration_loop_s_at_start": calibration_s(),
            },
        }
        result.update(bench_append_fsync(root, args.seconds))
        result.update(bench_group_commit(root, args.emitters, args.group_events // args.emitters))
        result.update(bench_append_many(root, 200, 100))
        result.update(bench_replay_and_cold_start(root, args.events))
        result["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        result["machine"]["calibration_loop_s_at_end"] = calibration_s()
        result["targets"] = {"group_commit_events_per_s": ">= 20000 (coroutines, emit_async)",
                             "replay_events_per_s": ">= 200000", "cold_start_s": "<= 1"}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

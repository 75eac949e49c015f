"""Soak: mixed load for a long time on a small disk, the daemon SIGKILLed periodically; do RSS, fds, disk stay flat?

    python benchmarks/soak.py --minutes 60 [--sample-every 10] [--kill-every 300] [--disk 512m]

A real ``kz daemon`` process whose state directory is a tmpfs of ``--disk`` (when this
process may mount one; else a plain temporary directory, said in the report), paced
submitters (``--clients`` threads, one upload per ``--pause`` seconds each, tiny CPU
packages over ``--kernels`` kernels), wire-protocol runners and one real ``kz runner``,
readers on the API and the pages. Every ``--kill-every`` seconds the daemon is SIGKILLed
and restarted. Every ``--sample-every`` seconds it samples the daemon's RSS
(/proc/PID/status), its open file descriptors (/proc/PID/fd) and disk use (the whole
state directory and each folder in it). At the end the load stops, every acknowledged
submission must become terminal, and the invariants of the chaos suite are checked.

Writes ``benchmarks/results/soak_report.md`` and ``soak.json`` (``--out DIR``, ``--name``): the
samples, start/end/max and slope of each series, whether it stayed flat, and the run's
real duration. RSS and fds are judged per daemon lifetime (a kill starts a new
process); disk use is expected to grow with the accepted history, so it is reported per
submission and per folder instead.
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
import threading
import time
import uuid as uuidlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

import httpx  # noqa: E402
from machine import calibration_s, machine_facts  # noqa: E402

from kz_events.log.replay import replay_dir  # noqa: E402
from kz_events.status import TERMINAL  # noqa: E402
from tests.helpers.system import (  # noqa: E402
    Ack,
    ProtocolRunner,
    RunnerProcess,
    Tmpfs,
    ZooProcess,
    check_invariants,
    kernel_ids,
    submit,
    tiny_tarball,
)
from tests.helpers.workload import LoopThreads, Readers, wait_terminal_in_log  # noqa: E402

FOLDERS = ("events", "repo", "spool", "pending", "runs")


def du(path: Path) -> int:
    """Bytes of the files under ``path`` (apparent sizes, rounded up to 4 KiB blocks as a filesystem would)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                size = os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
            total += -(-size // 4096) * 4096
    return total


def slope(points: list[tuple[float, float]], least: int = 5) -> float | None:
    """Least-squares slope of (x, y) points; None with fewer than ``least`` points or one x."""
    if len(points) < least:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, per hour; None with fewer than 5 points."""
    per_s = slope(points)
    return None if per_s is None else per_s * 3600.0


def rss_per_submission(samples: list[dict]) -> dict:
    """RSS bytes per acknowledged submission: added within a lifetime, and held across restarts.

    Within: the least-squares slope of RSS against acknowledged submissions in each lifetime
    (samples at least 30 s old), their median. Across: the slope of each lifetime's first such
    sample against the submissions acknowledged by then. A restart rebuilds what the daemon
    must hold (the state) and gives back what it need not (caches, leaks): growth that is
    there across restarts is the state's, the rest is what a long lifetime accumulates.
    """
    lifetimes: dict[float, list[tuple[float, float]]] = {}
    for s in samples:
        if s.get("rss_bytes") is not None and s["daemon_age_s"] >= 30:
            lifetimes.setdefault(s["daemon_start"], []).append((s["acknowledged"], s["rss_bytes"]))
    within = sorted(v for v in (slope(p) for p in lifetimes.values()) if v is not None)
    firsts = [p[0] for p in lifetimes.values() if p]
    across = slope(firsts, least=3)
    return {"within_lifetime": round(within[len(within) // 2]) if within else None,
            "within_by_lifetime": [round(v) for v in within],
            "across_restarts": round(across) if across is not None else None,
            "lifetimes": len(lifetimes)}


class Paced(LoopThreads):
    """``clients`` threads, each uploading one tiny package every ``pause`` seconds until stopped."""

    join_s = 180.0  # an upload may be mid-retry against a daemon being restarted

    def __init__(self, zoo: ZooProcess, kernels: list[str], clients: int, pause: float) -> None:
        super().__init__(clients)
        self.zoo, self.kernels, self.pause = zoo, kernels, pause
        self.acks: list[Ack] = []
        self.refused: dict[str, int] = {}
        self.refused_examples: list[dict] = []
        self.retries = 0

    def _loop(self, i: int) -> None:
        rng = random.Random(i)
        n = 0
        with httpx.Client(timeout=120) as client:
            while not self.stop_event.is_set():
                kernel_id = rng.choice(self.kernels)
                data = tiny_tarball(kernel_id, f"soak-{i}-{n}")
                key, started = str(uuidlib.uuid4()), time.time()
                n += 1
                for _ in range(120):
                    try:
                        resp = submit(self.zoo.url, kernel_id, data, f"soak{i}", key=key, client=client)
                    except httpx.HTTPError:
                        resp = None
                    if resp is None or resp.status_code in (429, 503):
                        with self.lock:
                            self.retries += 1
                        time.sleep(1.0)
                        continue
                    with self.lock:
                        if resp.status_code // 100 == 2:
                            self.acks.append(Ack(resp.json()["uuid"], kernel_id, started))
                        else:
                            error = resp.json().get("error", {})
                            code = error.get("code", str(resp.status_code))
                            self.refused[code] = self.refused.get(code, 0) + 1
                            if len(self.refused_examples) < 10:
                                self.refused_examples.append({"at": round(time.time(), 1), "status": resp.status_code,
                                                              "error": error})
                    break
                self.stop_event.wait(self.pause)


def start_load(zoo: ZooProcess, base: Path, kernels: list[str], proto_ids: list[str], clients: int,
               pause: float) -> tuple[threading.Event, list[threading.Thread], RunnerProcess, Paced, Readers]:
    """The soak's load against a started ``zoo``: wire-protocol runner threads (stopped by the
    event), one real runner, paced submitters and readers."""
    stop = threading.Event()
    protos = [ProtocolRunner(zoo.url, rid, zoo.tokens[rid]) for rid in proto_ids]
    threads = [threading.Thread(target=p.loop, args=(stop,), daemon=True) for p in protos]
    for t in threads:
        t.start()
    real = RunnerProcess(zoo, "real", base / "work-real", wait=5)
    paced = Paced(zoo, kernels, clients, pause).start()
    readers = Readers(zoo, kernels, paced.acks, 2, pause=1.0).start()
    return stop, threads, real, paced, readers


def commit() -> str | None:
    """The commit the code under test came from (None outside a git checkout)."""
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or None


def series_summary(samples: list[dict], key: str) -> dict:
    """start/end/max/min over the run and the slope per daemon lifetime (samples older than 30 s)."""
    values = [s[key] for s in samples if s.get(key) is not None]
    lifetimes: dict[int, list[tuple[float, float]]] = {}
    for s in samples:
        if s.get(key) is not None and s["daemon_age_s"] >= 30:
            lifetimes.setdefault(s["daemon_start"], []).append((s["t"], s[key]))
    slopes = [v for v in (slope_per_hour(p) for p in lifetimes.values()) if v is not None]
    longest = max(lifetimes.values(), key=len) if lifetimes else []
    return {"start": values[0] if values else None, "end": values[-1] if values else None,
            "min": min(values) if values else None, "max": max(values) if values else None,
            "slope_per_hour_by_lifetime": [round(v, 1) for v in slopes],
            "slope_per_hour_longest_lifetime": round(slope_per_hour(longest), 1) if slope_per_hour(longest) else None,
            "longest_lifetime_samples": len(longest),
            "longest_lifetime_first": longest[0][1] if longest else None,
            "longest_lifetime_last": longest[-1][1] if longest else None}


def flat(summary: dict, tolerance: float) -> bool | None:
    """Flat: over the longest lifetime the fitted growth per hour is under ``tolerance`` of its first value."""
    slope, first = summary["slope_per_hour_longest_lifetime"], summary["longest_lifetime_first"]
    if slope is None or not first:
        return None
    return slope <= tolerance * first


def main(argv: list[str] | None = None) -> int:
    """Run the soak and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="how long the load runs")
    parser.add_argument("--sample-every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--kill-every", type=float, default=300.0, help="seconds between daemon SIGKILLs (0: never)")
    parser.add_argument("--disk", default="512m", help="size of the tmpfs the state directory lives on")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--pause", type=float, default=1.0, help="seconds each client waits between uploads")
    parser.add_argument("--kernels", type=int, default=12)
    parser.add_argument("--protocol-runners", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results"), help="folder for the report and the samples")
    parser.add_argument("--report-from", metavar="JSON", default=None,
                        help="print the report of an earlier run's JSON file (no run)")
    parser.add_argument("--name", default="soak", help="files are NAME_report.md and NAME.json (default soak)")
    args = parser.parse_args(argv)
    if args.report_from:
        doc = json.loads(Path(args.report_from).read_text())
        doc["rss_per_submission"] = rss_per_submission(doc["samples"])
        print(report(doc))
        return 0

    base = Path(tempfile.mkdtemp(prefix="kz-soak-"))
    disk = None
    disk_note = "a plain temporary directory (mount -t tmpfs not permitted here)"
    if Tmpfs.permitted() is None:
        disk = Tmpfs(base / "state", args.disk)
        disk_note = f"a tmpfs of {args.disk}"
    kernels = kernel_ids(args.kernels, "soak")
    proto_ids = [f"p{i}" for i in range(args.protocol_runners)]
    zoo = ZooProcess(base / "state", lease=30, runners=tuple(proto_ids) + ("real",))
    calibration_start = calibration_s()
    wall_start = time.time()
    zoo.start()
    daemon_start = time.time()
    stop, threads, real, clients, readers = start_load(zoo, base, kernels, proto_ids, args.clients, args.pause)
    samples: list[dict] = []
    kills, findings = 0, []
    end = wall_start + args.minutes * 60
    next_kill = wall_start + args.kill_every if args.kill_every > 0 else float("inf")
    try:
        while time.time() < end:
            now = time.time()
            if now >= next_kill:
                zoo.kill()
                kills += 1
                zoo.start()
                daemon_start = time.time()
                next_kill = daemon_start + args.kill_every
                now = time.time()
            if not real.alive():
                findings.append(f"the real runner exited (status {real.proc.returncode}) at "
                                f"{now - wall_start:.0f} s: {real.log_tail(500)}")
                real = RunnerProcess(zoo, "real", base / f"work-real-{len(findings)}", wait=5)
            state = replay_dir(zoo.config.paths.events)
            st = os.statvfs(zoo.state_dir)
            sample = {"t": round(now - wall_start, 1), "daemon_start": round(daemon_start - wall_start, 1),
                      "daemon_age_s": round(now - daemon_start, 1), "pid": zoo.pid,
                      "rss_bytes": zoo.rss_bytes(), "open_fds": zoo.open_fds(),
                      "disk_used_bytes": (st.f_blocks - st.f_bfree) * st.f_frsize,
                      "acknowledged": len(clients.acks),
                      "terminal": sum(1 for s in state.submissions.values() if s.status in TERMINAL),
                      "events": state.seq}
            for name in FOLDERS:
                sample[f"du_{name}"] = du(zoo.state_dir / name)
            samples.append(sample)
            print(json.dumps(sample), flush=True)
            time.sleep(max(0.0, args.sample_every - (time.time() - now)))
    finally:
        clients.stop()
        readers.stop()
    load_end = time.time()
    rest = wait_terminal_in_log(zoo, clients.acks, 600)
    stop.set()
    for t in threads:
        t.join(60)
    verdict = check_invariants(zoo, clients.acks)
    real.stop()
    rc = zoo.stop()
    wall_end = time.time()
    calibration_end = calibration_s()
    if disk is not None:
        disk.unmount()
    shutil.rmtree(base, ignore_errors=True)

    summaries = {key: series_summary(samples, key) for key in ("rss_bytes", "open_fds", "disk_used_bytes")}
    acked = len(clients.acks)
    disk_growth = (samples[-1]["disk_used_bytes"] - samples[0]["disk_used_bytes"]) if samples else 0
    doc = {
        "command": "python benchmarks/soak.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": commit(),
        "real_duration_s": round(wall_end - wall_start, 1), "load_duration_s": round(load_end - wall_start, 1),
        "disk": disk_note, "daemon_kills": kills, "acknowledged": acked, "not_terminal": len(rest),
        "statuses": verdict.statuses, "refused": clients.refused, "refused_examples": clients.refused_examples, "upload_retries": clients.retries,
        "reader_requests": readers.requests, "reader_5xx": len(readers.errors),
        "invariant_problems": verdict.problems, "findings": findings, "daemon_exit_status": rc,
        "summaries": summaries,
        "flat": {"rss_bytes": flat(summaries["rss_bytes"], 0.10), "open_fds": flat(summaries["open_fds"], 0.10)},
        "rss_per_submission": rss_per_submission(samples),
        "disk_bytes_per_acknowledged": round(disk_growth / acked) if acked else None,
        "disk_by_folder_end": {name: samples[-1][f"du_{name}"] for name in FOLDERS} if samples else {},
        "machine": machine_facts(calibration_loop_s_start=calibration_start, calibration_loop_s_end=calibration_end,
                                 kernel=platform.release(), mem_total_bytes=os.sysconf("SC_PAGE_SIZE") *
                                 os.sysconf("SC_PHYS_PAGES")),
        "samples": samples,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / f"{args.name}_report.md").write_text(report(doc))
    print(report(doc))
    return 0 if not verdict.problems and not rest and not findings else 1


def _mib(v) -> str:
    return "-" if v is None else f"{v / 2 ** 20:.1f} MiB"


def _rss_lines(per: dict) -> list[str]:
    within, across = per["within_lifetime"], per["across_restarts"]
    if within is None:
        return []
    text = (f"RSS per acknowledged submission: {within} bytes added within a lifetime (median of "
            f"{len(per['within_by_lifetime'])} lifetimes: {per['within_by_lifetime']})")
    if across is not None:
        text += (f"; {across} bytes held across restarts (each of {per['lifetimes']} lifetimes' first sample "
                 "against the submissions by then): what a restart rebuilds is the state, what it gives back "
                 "is what a lifetime accumulates beyond it")
    return [text + ".", ""]


def report(doc: dict) -> str:
    """The Markdown report of one soak run."""
    s = doc["summaries"]
    lines = [
        "# Soak report", "",
        f"Command: `{doc['command']}` at commit {doc['commit']}.", "",
        f"Real duration: **{doc['real_duration_s'] / 60:.1f} minutes** ({doc['real_duration_s']} s in all; "
        f"the load ran {doc['load_duration_s']} s, then the drain and the checks). State directory on "
        f"{doc['disk']}. The daemon was SIGKILLed and restarted {doc['daemon_kills']} times.", "",
        f"Machine: {doc['machine']['cpu_model']}, {doc['machine']['cpus']} CPUs, "
        f"{doc['machine']['mem_total_bytes'] / 2 ** 30:.1f} GiB, Python {doc['machine']['python']}, "
        f"kernel {doc['machine']['kernel']}; calibration loop {doc['machine']['calibration_loop_s_start']} s at the "
        f"start, {doc['machine']['calibration_loop_s_end']} s at the end (shared machine: other work ran beside it).", "",
        "## Outcome", "",
        f"- acknowledged submissions: {doc['acknowledged']}; not terminal after the drain: {doc['not_terminal']}; "
        f"statuses: {doc['statuses']}",
        f"- refused uploads: {doc['refused'] or 'none'}; upload retries (daemon down or 429/503): "
        f"{doc['upload_retries']}",
        f"- readers: {doc['reader_requests']} requests, {doc['reader_5xx']} answered 5xx other than 503",
        f"- invariants after the run (none lost, two commits per accept, kz audit clean, index = rebuild): "
        f"{'all hold' if not doc['invariant_problems'] else doc['invariant_problems'][:10]}",
        f"- findings: {doc['findings'] or 'none'}", "",
        "## Resources", "",
        "| series | start | end | min | max | slope/hour (longest lifetime) | flat |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, fmt in (("rss_bytes", _mib), ("open_fds", str), ("disk_used_bytes", _mib)):
        x = s[key]
        slope = x["slope_per_hour_longest_lifetime"]
        flat_cell = {True: "yes", False: "**no**", None: "n/a"}[doc["flat"].get(key)] if key in doc["flat"] else \
            "grows with history (below)"
        lines.append(f"| {key} | {fmt(x['start'])} | {fmt(x['end'])} | {fmt(x['min'])} | {fmt(x['max'])} | "
                     f"{'-' if slope is None else (fmt(slope) if key != 'open_fds' else slope)} | {flat_cell} |")
    lines += [
        "",
        "Flat means: over the daemon's longest lifetime in the run (samples taken once it was 30 s old), the "
        "least-squares growth per hour is under 10 % of the lifetime's first value. Slopes per lifetime: "
        f"RSS {s['rss_bytes']['slope_per_hour_by_lifetime']}, fds {s['open_fds']['slope_per_hour_by_lifetime']}.",
        "",
        *_rss_lines(doc.get("rss_per_submission") or rss_per_submission(doc["samples"])),
        f"Disk: {_mib(doc['disk_bytes_per_acknowledged'])} per acknowledged submission"
        if doc["disk_bytes_per_acknowledged"] is None else
        f"Disk: {doc['disk_bytes_per_acknowledged']} bytes per acknowledged submission; by folder at the end: "
        + ", ".join(f"{k} {_mib(v)}" for k, v in doc["disk_by_folder_end"].items()) + ".",
        "",
        f"Samples: {len(doc['samples'])} (every sample is in the JSON file beside this report).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

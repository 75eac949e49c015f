"""Where a long-lived daemon's memory goes: the soak's load, with probes taken inside the daemon.

    python benchmarks/memory_probe.py --minutes 20 [--probe-every 120] [--frames 1]

Runs the soak's load (paced submitters over tiny CPU packages, wire-protocol runners, one
real ``kz runner``, readers on the API and the pages) against one ``kz daemon`` that is
never killed, started with ``PYTHONTRACEMALLOC=<frames>`` and
``benchmarks/memory_probe_site/sitecustomize.py`` on its path. Every ``--probe-every``
seconds it sends the daemon SIGUSR2: the daemon writes a ``tracemalloc`` snapshot and what
its memory is made of (RSS anonymous and file pages, Python's traced bytes, glibc's bytes
in use and free in its arenas, live objects by type, threads).

The report (``benchmarks/results/NAME_report.md`` and ``NAME.json``) sets the probes side by
side per acknowledged submission and compares the first probe after the warm-up
(``--warmup-probes``) with the last: the source lines whose traced memory grew most and
the object types whose count grew most. RSS growing while traced bytes and malloc's
in-use bytes stay flat is the allocator keeping pages, not objects kept alive. Tracing
slows allocation, so the load runs slower than the soak's: compare its figures per
submission, not per hour.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

from machine import machine_facts  # noqa: E402
from soak import commit, start_load  # noqa: E402

from tests.helpers.system import ZooProcess, kernel_ids  # noqa: E402

SITE = HERE / "memory_probe_site"


def probe(zoo: ZooProcess, folder: Path, timeout: float = 300) -> dict | None:
    """SIGUSR2 the daemon and wait for its probe line (None when none came)."""
    lines = folder / "probes.jsonl"
    before = lines.read_text().count("\n") if lines.exists() else 0
    os.kill(zoo.pid, signal.SIGUSR2)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if lines.exists():
            text = lines.read_text().splitlines()
            if len(text) > before:
                return json.loads(text[before])
        time.sleep(0.5)
    return None


def growth_by_line(first: Path, last: Path, top: int) -> list[dict]:
    """The source lines whose traced memory grew most between two snapshots."""
    a = tracemalloc.Snapshot.load(str(first))
    b = tracemalloc.Snapshot.load(str(last))
    stats = b.compare_to(a, "lineno")
    out = []
    for stat in stats[:top]:
        frame = stat.traceback[0]
        name = frame.filename
        for prefix in (str(ROOT) + os.sep, sys.prefix + os.sep, sys.base_prefix + os.sep):
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        out.append({"where": f"{name}:{frame.lineno}", "size_diff": stat.size_diff, "size": stat.size,
                    "count_diff": stat.count_diff})
    return out


def growth_by_type(first: dict, last: dict, top: int) -> list[dict]:
    """The object types whose live count grew most between two probes."""
    names = set(first["types"]) | set(last["types"])
    diffs = sorted(((last["types"].get(n, 0) - first["types"].get(n, 0), n) for n in names), reverse=True)
    return [{"type": n, "count_diff": d, "count": last["types"].get(n, 0)} for d, n in diffs[:top] if d > 0]


def per_submission(a: dict, b: dict, key) -> float | None:
    """Bytes per acknowledged submission of the series ``key`` between probes ``a`` and ``b``."""
    subs = b["acknowledged"] - a["acknowledged"]
    va, vb = key(a), key(b)
    if subs <= 0 or va is None or vb is None:
        return None
    return (vb - va) / subs


SERIES = {
    "rss": lambda p: p["status"].get("VmRSS"),
    "rss_anon": lambda p: p["status"].get("RssAnon"),
    "rss_file": lambda p: p["status"].get("RssFile"),
    "traced": lambda p: p.get("traced"),
    "malloc_in_use": lambda p: p["mallinfo"].get("uordblks"),
    "malloc_free": lambda p: p["mallinfo"].get("fordblks"),
    "malloc_arena": lambda p: p["mallinfo"].get("arena"),
    "mmapped": lambda p: p["mallinfo"].get("hblkhd"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="how long the load runs")
    parser.add_argument("--probe-every", type=float, default=120.0, help="seconds between probes")
    parser.add_argument("--warmup-probes", type=int, default=1, help="probes before the one compared with the last")
    parser.add_argument("--frames", type=int, default=1, help="tracemalloc frames per allocation (0: no tracing)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--pause", type=float, default=1.0, help="seconds each client waits between uploads")
    parser.add_argument("--kernels", type=int, default=12)
    parser.add_argument("--protocol-runners", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="more environment for the daemon (e.g. MALLOC_ARENA_MAX=2); repeatable")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--name", default="memory_probe")
    args = parser.parse_args(argv)

    base = Path(tempfile.mkdtemp(prefix="kz-memprobe-"))
    folder = base / "probes"
    folder.mkdir()
    kernels = kernel_ids(args.kernels, "probe")
    proto_ids = [f"p{i}" for i in range(args.protocol_runners)]
    zoo = ZooProcess(base / "state", lease=60, runners=tuple(proto_ids) + ("real",))
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{SITE}", "KZ_MEMORY_PROBE_DIR": str(folder)}
    if args.frames > 0:
        env["PYTHONTRACEMALLOC"] = str(args.frames)
    env.update(item.split("=", 1) for item in args.env)
    started = time.time()
    zoo.start(env_extra=env, ready_timeout=300)
    stop, threads, real, clients, readers = start_load(zoo, base, kernels, proto_ids, args.clients, args.pause)
    probes: list[dict] = []
    end = started + args.minutes * 60
    try:
        while True:
            got = probe(zoo, folder)
            if got is None:
                print("the daemon wrote no probe", file=sys.stderr)
                break
            got["acknowledged"] = len(clients.acks)
            got["t_run"] = round(time.time() - started, 1)
            probes.append(got)
            brief = {k: SERIES[k](got) for k in SERIES}
            print(json.dumps({"t": got["t_run"], "acknowledged": got["acknowledged"], "probe_s": got["probe_s"],
                              **brief}), flush=True)
            if time.time() + args.probe_every > end + 1:
                break
            time.sleep(max(0.0, args.probe_every - got["probe_s"]))
    finally:
        clients.stop()
        readers.stop()
        stop.set()
        for t in threads:
            t.join(60)
        real.stop()
        zoo.stop()
    first_i = max(0, min(args.warmup_probes, len(probes) - 2))
    doc: dict = {"command": "python benchmarks/memory_probe.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                 "commit": commit(), "real_duration_s": round(time.time() - started, 1),
                 "acknowledged": len(clients.acks), "frames": args.frames, "env": args.env,
                 "machine": machine_facts(kernel=os.uname().release),
                 "probes": [{"t": p["t_run"], "acknowledged": p["acknowledged"], "probe_s": p["probe_s"],
                             "threads": p["threads"], "objects": p["objects"], **{k: SERIES[k](p) for k in SERIES}}
                            for p in probes]}
    if len(probes) >= 2:
        a, b = probes[first_i], probes[-1]
        doc["compared"] = {"first": first_i + 1, "last": len(probes), "submissions": b["acknowledged"] - a["acknowledged"]}
        doc["per_submission"] = {k: (round(v) if v is not None else None)
                                 for k, v in ((k, per_submission(a, b, SERIES[k])) for k in SERIES)}
        doc["types"] = growth_by_type(a, b, args.top)
        snaps = sorted(folder.glob("snapshot-*.tracemalloc"))
        if len(snaps) >= 2:
            doc["lines"] = growth_by_line(snaps[first_i], snaps[-1], args.top)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / f"{args.name}_report.md").write_text(report(doc))
    print(report(doc))
    shutil.rmtree(base, ignore_errors=True)
    return 0 if len(probes) >= 2 else 1


def _kib(v) -> str:
    return "-" if v is None else f"{v / 1024:,.1f} KiB"


def report(doc: dict) -> str:
    lines = ["# Memory probe", "",
             f"Command: `{doc['command']}` at commit {doc['commit']}.", "",
             f"{doc['real_duration_s'] / 60:.1f} minutes, {doc['acknowledged']} acknowledged submissions, "
             f"tracemalloc frames {doc['frames']}, daemon environment {doc.get('env') or 'unchanged'}. Machine: {doc['machine'].get('cpu_model', '?')}, "
             f"{doc['machine'].get('cpus', '?')} CPUs, load {doc['machine'].get('loadavg_1m_at_end', '?')} at the end.", "",
             "| t (s) | submissions | RSS | anon | file | traced | malloc in use | malloc free | threads | objects |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in doc["probes"]:
        lines.append(f"| {p['t']:.0f} | {p['acknowledged']} | {_kib(p['rss'])} | {_kib(p['rss_anon'])} | "
                     f"{_kib(p['rss_file'])} | {_kib(p['traced'])} | {_kib(p['malloc_in_use'])} | "
                     f"{_kib(p['malloc_free'])} | {p['threads']} | {p['objects']:,} |")
    if "per_submission" in doc:
        c = doc["compared"]
        lines += ["", f"Per acknowledged submission, probe {c['first']} to probe {c['last']} "
                      f"({c['submissions']} submissions), bytes:", ""]
        lines += [f"- {k}: {v}" for k, v in doc["per_submission"].items()]
        lines += ["", "Object types whose count grew most:", "", "| type | added | live |", "| --- | --- | --- |"]
        lines += [f"| `{t['type']}` | {t['count_diff']:,} | {t['count']:,} |" for t in doc["types"]]
    if doc.get("lines"):
        lines += ["", "Source lines whose traced memory grew most:", "", "| where | grew | now | blocks added |",
                  "| --- | --- | --- | --- |"]
        lines += [f"| `{x['where']}` | {_kib(x['size_diff'])} | {_kib(x['size'])} | {x['count_diff']:,} |"
                  for x in doc["lines"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

"""Where intake's time goes, per file: wall and CPU time, fsyncs and passes over the tarball.

    python benchmarks/bench_intake_profile.py [--files 200] [--rounds 3] [--profile FILE] [--json] [--out FILE]

Drops ``--files`` valid CPU Axpy tarballs (each with its own source bytes) into the spool
of a fresh state directory, then decides them with one direct ``Intake.scan_once`` in this
thread (no watchdog, no intake thread: the decision path alone, as the intake thread runs
it, fsyncs included). For each round it reports the files per second, the CPU seconds
this thread spent per file (``time.thread_time``: less sensitive to a loaded machine than
the wall clock), and per file the ``os.fsync`` calls, the passes over a tarball
(``kz_runner.contract.tarball``'s reader), the YAML documents parsed (``yaml.load``:
the submitted desc.yaml, HEAD's where it is read) and the Python files parsed
(``ast.parse``: benchmark.py, build_test_env.py, the source area's). ``--profile FILE`` runs one more round under
``cProfile`` and writes its stats there (read them with ``python -m pstats FILE``).
The figures go to benchmarks/results/bench_intake_profile.json (``--out``).
"""
from __future__ import annotations

import argparse
import ast
import cProfile
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test helpers that build the packages

import yaml  # noqa: E402
from machine import calibration_s, machine_facts  # noqa: E402  (benchmarks/ is sys.path[0])

from tests.helpers.daemon import axpy_tarball, drop_into_inbox  # noqa: E402


class Counting:
    """Counts calls of a module function while installed (``with``)."""

    def __init__(self, module: object, name: str) -> None:
        self.module, self.name, self.count = module, name, 0
        self.original = getattr(module, name)

    def __enter__(self) -> Counting:
        def counted(*args, **kwargs):
            self.count += 1
            return self.original(*args, **kwargs)
        setattr(self.module, self.name, counted)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self.module, self.name, self.original)


def one_round(work: Path, files: int, profile: str | None = None) -> dict:
    """Decide ``files`` tarballs in one direct scan; the figures of that scan."""
    from kz_daemon.ops.runtime import init_state_dir
    from kz_daemon.ops.service import Zoo
    from kz_runner.contract import tarball

    config = init_state_dir(work, seed_from=ROOT / "examples")
    blobs = [axpy_tarball(mutate=lambda f, i=i: f.__setitem__("src/n.txt", str(i).encode())) for i in range(files)]
    zoo = Zoo(config)  # not started: this thread is the intake
    try:
        for i, data in enumerate(blobs):
            drop_into_inbox(config.paths.spool, f"b{i}.tar.gz", data)
        os.sync()  # the drops' writeback does not land in the measurement
        prof = cProfile.Profile() if profile else None
        with Counting(os, "fsync") as fsyncs, Counting(tarball, "_iterate") as passes, \
                Counting(yaml, "load") as yaml_loads, Counting(ast, "parse") as ast_parses:
            wall, cpu = time.perf_counter(), time.thread_time()
            if prof is not None:
                prof.enable()
            decided = zoo.intake.scan_once()
            if prof is not None:
                prof.disable()
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        if prof is not None and profile:
            prof.dump_stats(profile)
        assert decided == files and zoo.store.state.status_counts.get("queued", 0) == files, \
            zoo.store.state.status_counts
    finally:
        zoo.store.close()
    return {"files_per_s": round(files / wall, 1), "cpu_ms_per_file": round(cpu * 1000 / files, 2),
            "fsyncs_per_file": round(fsyncs.count / files, 2),
            "tarball_passes_per_file": round(passes.count / files, 2),
            "yaml_parses_per_file": round(yaml_loads.count / files, 2),
            "python_parses_per_file": round(ast_parses.count / files, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", default=None, help="write cProfile stats of one more round here")
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_intake_profile.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kz-intake-", dir=os.environ.get("KZ_BENCH_DIR")))
    load_start = round(os.getloadavg()[0], 2)
    calibration = calibration_s()
    try:
        rounds = [one_round(work / f"r{i}", args.files) for i in range(args.rounds)]
        if args.profile:
            one_round(work / "profiled", args.files, args.profile)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {"command": f"python benchmarks/bench_intake_profile.py --files {args.files} --rounds {args.rounds}",
           "rounds": rounds,
           "median": {key: round(statistics.median(r[key] for r in rounds), 2) for key in rounds[0]},
           "machine": machine_facts(loadavg_1m_at_start=load_start, calibration_loop_s_start=calibration,
                                    calibration_loop_s_end=calibration_s()),
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2) if args.json else json.dumps(doc["median"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

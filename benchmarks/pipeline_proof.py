"""The full pipeline on real GPUs: a daemon, one runner per GPU, the sm_90 examples resubmitted.

What it measures:

- repeatability: each example is submitted ``--resubmits`` times in a row through the whole
  pipeline (spool → queue → runner → accept → git → index); for each case, the coefficient of
  variation of its primary metric over the runs;
- false rejects: how many of those identical resubmissions the package's own policy rejected
  (each run is judged against the scorecard the previous accepts left);
- with two or more GPUs, cross-talk: the examples are then submitted concurrently, one kernel
  per GPU at a time (the daemon keeps one job per kernel in flight), and each case's median
  is compared with its median from the solo phase.

Every figure comes from the submissions' own status documents (``kz submit --json``).

    python3 benchmarks/pipeline_proof.py --out DIR [--resubmits 20] [--gpus 0,1]
                                         [--arch-runner ARCH[:GPU] ...] [PKG[:N] ...]

``PKG:N`` resubmits that package N times instead of ``--resubmits``. ``--arch-runner``
starts one more runner that claims jobs of ARCH (``cpu`` for the CPU examples; an arch
other than the GPU's own, e.g. ``gfx928`` on an NVIDIA host, runs that example's portable
code on this GPU and is reported as such), on GPU index GPU when given.

Needs kernel_zoo installed with its CuPy extra on the GPU host (``pip install -e '.[cuda13]'``
from a checkout, or ``[cuda12]``): the daemon, the runner and CuPy. Prints a table last; writes
``DIR/pipeline_proof.json`` with every raw value and ``DIR/daemon.log``/``runner-N.log``.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from machine import machine_facts  # noqa: E402  (benchmarks/ is sys.path[0])

DEFAULT_PACKAGES = sorted(str(p.parent.parent.relative_to(ROOT))
                          for p in (ROOT / "examples" / "sm_90").glob("*/*/*/*/.kernel_package/desc.yaml"))


def kz_argv(*args: str) -> list[str]:
    """The kz console script as a module call of this interpreter, so the install measured is this one."""
    return [sys.executable, "-m", "kz_daemon", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"daemon at {url} not ready after {timeout}s")


def submit(url: str, package: str, submitter: str) -> dict:
    """One submission through ``kz submit --json``; returns its final status document."""
    proc = subprocess.run(kz_argv("submit", str(ROOT / package), "--server", url,
                                  "--submitter", submitter, "--json", "--timeout", "900"),
                          capture_output=True, text=True)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doc = {"status": "error", "stdout": proc.stdout[-2000:], "stderr": proc.stderr[-2000:]}
    doc["_exit"] = proc.returncode
    return doc


def case_values(doc: dict) -> dict[str, float]:
    return {c["test_case_id"]: c["value"] for c in doc.get("cases") or [] if c.get("value") is not None}


def stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"n": len(values), "median": statistics.median(values), "mean": mean,
            "min": min(values), "max": max(values), "cv_pct": 100.0 * sd / mean if mean else None,
            "spread_pct": 100.0 * (max(values) / min(values) - 1.0) if min(values) > 0 else None}


def solo_phase(url: str, packages: dict[str, int], save) -> dict:
    """Each package its count of times in a row, one package after the other (one GPU busy)."""
    out: dict[str, list] = {}
    for pkg, resubmits in packages.items():
        runs = out.setdefault(pkg, [])
        for i in range(resubmits):
            t0 = time.monotonic()
            doc = submit(url, pkg, "proof-solo")
            runs.append({"status": doc.get("status"), "runner_id": doc.get("runner_id"),
                         "reasons": doc.get("reasons"), "values": case_values(doc),
                         "commit_sha": doc.get("commit_sha"), "wall_s": time.monotonic() - t0})
            print(f"solo {pkg} {i + 1}/{resubmits}: {doc.get('status')} {case_values(doc)}",
                  file=sys.stderr, flush=True)
            save(out)
    return out


def concurrent_phase(url: str, packages: list[str], resubmits: int) -> dict:
    """All packages at once, each resubmitted in its own thread: every GPU busy together."""
    out: dict[str, list] = {pkg: [] for pkg in packages}

    def worker(pkg: str) -> None:
        for i in range(resubmits):
            doc = submit(url, pkg, "proof-concurrent")
            out[pkg].append({"status": doc.get("status"), "runner_id": doc.get("runner_id"),
                             "reasons": doc.get("reasons"), "values": case_values(doc)})
            print(f"concurrent {pkg} {i + 1}/{resubmits}: {doc.get('status')} on {doc.get('runner_id')}",
                  file=sys.stderr, flush=True)

    threads = [threading.Thread(target=worker, args=(pkg,)) for pkg in packages]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def summarise(solo: dict, concurrent: dict | None) -> dict:
    table = {}
    for pkg, runs in solo.items():
        cases = sorted({c for r in runs for c in r["values"]})
        for case in cases:
            vals = [r["values"][case] for r in runs if case in r["values"]]
            row = {"solo": stats(vals),
                   "rejects": sum(1 for r in runs if r["status"] != "accepted"),
                   "runs": len(runs)}
            if concurrent and pkg in concurrent:
                cvals = [r["values"][case] for r in concurrent[pkg] if case in r["values"]]
                row["concurrent"] = stats(cvals)
                row["concurrent_rejects"] = sum(1 for r in concurrent[pkg] if r["status"] != "accepted")
                row["concurrent_runners"] = sorted({r["runner_id"] for r in concurrent[pkg] if r["runner_id"]})
                if cvals and vals:
                    row["crosstalk_pct"] = 100.0 * (statistics.median(cvals) / statistics.median(vals) - 1.0)
            table[f"{pkg}:{case}"] = row
    return table


def gpu_facts() -> dict:
    """nvidia-smi's view of the GPUs and CuPy's version, where available."""
    facts: dict = {}
    try:
        facts["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        import cupy
        facts["cupy"] = cupy.__version__
    except ImportError:
        pass
    return facts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", default=DEFAULT_PACKAGES)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "pipeline-proof")))
    parser.add_argument("--resubmits", type=int, default=20, help="resubmissions per package (PKG:N overrides)")
    parser.add_argument("--concurrent-resubmits", type=int, default=5)
    parser.add_argument("--gpus", default="0", help="comma-separated GPU indices, one runner each ('' for none: "
                                                     "then only the --arch-runner runners)")
    parser.add_argument("--arch-runner", action="append", default=[], metavar="ARCH[:GPU]",
                        help="one more runner claiming ARCH's jobs (repeatable), e.g. cpu or gfx928:0")
    args = parser.parse_args()
    if not args.gpus.strip(",") and not args.arch_runner:
        parser.error("no runner: give --gpus or --arch-runner")
    args.out.mkdir(parents=True, exist_ok=True)
    gpus = [g for g in args.gpus.split(",") if g]
    counts: dict[str, int] = {}
    for spec in args.packages:
        pkg, _, n = spec.partition(":")
        counts[pkg] = int(n) if n else args.resubmits

    from kz_daemon.config.tokens import TokenStore
    from kz_daemon.ops.runtime import init_state_dir

    state = Path(tempfile.mkdtemp(prefix="kz-proof-"))
    init_state_dir(state, seed_from=ROOT / "examples")
    store = TokenStore(state / "auth.yaml")
    token_files = []
    for g in gpus:
        path = state / f"runner-{g}.token"
        path.write_text(store.issue("runner", f"h200-gpu{g}"))
        path.chmod(0o600)
        token_files.append(path)
    extra = [spec.partition(":")[::2] for spec in args.arch_runner]  # (arch, gpu or "")
    for arch, g in extra:
        path = state / f"runner-{arch}.token"
        path.write_text(store.issue("runner", f"{arch}-runner{g}"))
        path.chmod(0o600)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    logs = []
    daemon_log = open(args.out / "daemon.log", "w")
    logs.append(daemon_log)
    daemon = subprocess.Popen(kz_argv("up", "--state-dir", str(state), "--port", str(port), "--no-runner"),
                              stdout=daemon_log, stderr=subprocess.STDOUT)
    runners: list[subprocess.Popen] = []
    result: dict = {"machine": machine_facts(**gpu_facts()), "packages": counts, "gpus": gpus,
                    "arch_runners": args.arch_runner}

    def save(partial_solo: dict | None = None) -> None:
        if partial_solo is not None:
            result["solo"] = partial_solo
        (args.out / "pipeline_proof.json").write_text(json.dumps(result, indent=2, sort_keys=True))

    try:
        wait_ready(url)

        def start_runner(i: int) -> None:
            log = open(args.out / f"runner-{gpus[i]}.log", "w")
            logs.append(log)
            runners.append(subprocess.Popen(
                kz_argv("runner", "--server", url, "--token-file", str(token_files[i]), "--gpu", gpus[i],
                        "--runner-id", f"h200-gpu{gpus[i]}"), stdout=log, stderr=subprocess.STDOUT))

        def start_arch_runner(arch: str, gpu: str) -> None:
            log = open(args.out / f"runner-{arch}.log", "w")
            logs.append(log)
            argv = ["runner", "--server", url, "--token-file", str(state / f"runner-{arch}.token"),
                    "--arch", arch, "--runner-id", f"{arch}-runner{gpu}"]
            runners.append(subprocess.Popen(kz_argv(*argv, *(["--gpu", gpu] if gpu else [])),
                                            stdout=log, stderr=subprocess.STDOUT))

        if gpus:
            start_runner(0)
        for arch, g in extra:
            start_arch_runner(arch, g)
        time.sleep(3)
        for proc in runners:
            if proc.poll() is not None:  # e.g. `--gpu 0` where CuPy finds no GPU
                raise RuntimeError(f"a runner exited with {proc.returncode} at start ({proc.args}); "
                                   f"see the runner logs in {args.out}")
        t0 = time.monotonic()
        result["solo"] = solo_phase(url, counts, save)
        result["solo_wall_s"] = time.monotonic() - t0
        result["concurrent"] = None
        if len(gpus) > 1:
            for i in range(1, len(gpus)):
                start_runner(i)
            t0 = time.monotonic()
            result["concurrent"] = concurrent_phase(url, list(counts), args.concurrent_resubmits)
            result["concurrent_wall_s"] = time.monotonic() - t0
        result["summary"] = summarise(result["solo"], result["concurrent"])
    finally:
        for proc in runners + [daemon]:
            proc.terminate()
        for proc in runners + [daemon]:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs:
            log.close()
        save()
    # audited once everything has stopped: the log, git and index.json must agree
    audit = subprocess.run(kz_argv("audit", "--state-dir", str(state)), capture_output=True, text=True)
    result["audit"] = {"exit": audit.returncode, "output": audit.stdout[-2000:]}
    try:
        git_log = subprocess.run(["git", "-C", str(state / "repo"), "log", "--oneline"],
                                 capture_output=True, text=True)
        result["commits"] = len(git_log.stdout.splitlines())
    except OSError:
        result["commits"] = None
    save()

    print(f"{'case':64} {'median':>10} {'cv %':>6} {'rejects':>8} {'xtalk %':>8}")
    for key, row in result.get("summary", {}).items():
        solo = row["solo"]
        xt = row.get("crosstalk_pct")
        print(f"{key:64} {solo.get('median', float('nan')):10.5g} {solo.get('cv_pct') or 0:6.3f} "
              f"{row['rejects']:>3}/{row['runs']:<4} {'' if xt is None else f'{xt:+.2f}':>8}")
    print("audit exit", result.get("audit", {}).get("exit"), "commits", result.get("commits"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

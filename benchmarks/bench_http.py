"""HTTP shim figures: GET /api/kernels at 10,000 kernels, status polls under 50 clients, submit-to-claim.

    python benchmarks/bench_http.py --json [--kernels 10000] [--duration 10] [--state-dir DIR]

Starts the real embedded default (`kz up --no-runner`, a subprocess) on a state
directory whose repo holds N copies of the CPU Axpy example (built once; pass
--state-dir to reuse it), then measures on loopback:

- ``kernels_*``: ``GET /api/kernels`` (first page, default size 100) with wrk
  (1 thread, 16 connections) when wrk is installed, else a Python client;
- ``status_p99_ms`` / ``status_p50_ms``: the status long poll under 50 concurrent
  clients: 50 clients wait in ``?wait=30`` on one queued submission; the time from
  its claim to each poll's answer. ``status_get_*``: plain ``GET .../status`` (no wait)
  with 50 concurrent connections saturating the server (wrk -c50);
- ``submit_to_claim_ms``: a runner already waiting in the claim long poll; time from
  sending the upload (the guide's multipart POST) to the claim's answer (median of
  --submits runs; p99 reported beside it).

Prints ONE JSON object (with machine facts) on stdout; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the test helpers (tests/helpers) that build the packages
from machine import machine_facts, percentile  # noqa: E402  (benchmarks/ is sys.path[0])

AXPY = "cpu/Elementwise/Axpy/fp32/numpy_ref"


def log(message: str) -> None:
    """Progress on stderr."""
    print(f"[bench_http] {message}", file=sys.stderr, flush=True)


def make_seed(seed: Path, count: int) -> None:
    """``count`` copies of the Axpy example at ``cpu/Elementwise/Axpy/fp32/k<i>`` (kernel_id fixed up)."""
    src = ROOT / "examples" / AXPY
    files = {p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    for i in range(count):
        kid = f"cpu/Op{i % 25}/Sub{i % 8}/fp32/k{i:05d}"
        base = seed / kid
        for rel, data in files.items():
            path = base / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if rel.endswith((".yaml", ".py")):
                data = data.replace(AXPY.encode(), kid.encode())
                data = data.replace(b"op_class: Elementwise", f"op_class: Op{i % 25}".encode())
                data = data.replace(b"sub_class: Axpy", f"sub_class: Sub{i % 8}".encode())
            path.write_bytes(data)


def prepare_state(state: Path, count: int) -> None:
    """Initialise ``state`` with a repo of ``count`` kernels unless it already has one."""
    from kz_daemon.ops.runtime import init_state_dir

    if (state / "repo" / ".git").exists():
        log(f"reusing {state}")
        return
    with tempfile.TemporaryDirectory(prefix="kz-bench-seed-") as tmp:
        t0 = time.perf_counter()
        make_seed(Path(tmp), count)
        log(f"generated {count} packages in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        init_state_dir(state, seed_from=Path(tmp))
        log(f"seeded the repo in {time.perf_counter() - t0:.1f} s")


class Daemon:
    """`kz up --no-runner` on a free port."""

    def __init__(self, state: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KZ_")}
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen([sys.executable, "-m", "kz_daemon", "up", "--state-dir", str(state),
                                      "--port", "0", "--no-runner"], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.url = ""
        deadline = time.monotonic() + 600
        for line in self.proc.stdout:
            match = re.match(r"kz up: serving (http://\S+)", line)
            if match:
                self.url = match.group(1)
                break
            if time.monotonic() > deadline:
                break
        if not self.url:
            self.proc.kill()
            raise SystemExit("kz up did not start")
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        self.runner_token = (state / "tokens" / "runner.token").read_text().strip()

    def stop(self) -> None:
        """SIGTERM, as an operator would; SIGKILL after a minute."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def wrk(url: str, connections: int, duration: float) -> dict:
    """Requests/s and latency percentiles (ms) from ``wrk --latency``."""
    seconds = max(1, round(duration))  # wrk takes whole seconds; -d0s is an error
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", url],
                         capture_output=True, text=True, check=True).stdout
    units = {"us": 1e-3, "ms": 1.0, "s": 1e3}

    def pct(label: str) -> float:
        match = re.search(rf"^\s+{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
        return float(match.group(1)) * units[match.group(2)]

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"req_per_s": rps, "p50_ms": pct("50"), "p99_ms": pct("99"),
            "non_2xx": int(errors.group(1)) if errors else 0, "tool": "wrk -t1"}


def python_load(url: str, connections: int, duration: float) -> dict:
    """Fallback load generator (threads with keep-alive connections) when wrk is missing."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + duration

    def worker() -> None:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        mine = []
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            conn.request("GET", parts.path + ("?" + parts.query if parts.query else ""))
            conn.getresponse().read()
            mine.append((time.perf_counter() - t0) * 1e3)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    latencies.sort()
    return {"req_per_s": len(latencies) / duration, "p50_ms": latencies[len(latencies) // 2],
            "p99_ms": latencies[int(len(latencies) * 0.99)], "non_2xx": 0, "tool": "python threads"}


def load(url: str, connections: int, duration: float) -> dict:
    """wrk when installed, else the Python fallback."""
    return wrk(url, connections, duration) if shutil.which("wrk") else python_load(url, connections, duration)


def submit(client, kernel_id: str, data: bytes) -> str:
    """The guide's multipart POST; returns the uuid."""
    resp = client.post("/api/submissions", headers={"X-Submitter-Id": "bench"},
                       data={"kernel_id": kernel_id, "submitter_id": "bench"},
                       files={"package": ("package.tar.gz", data, "application/gzip")})
    if resp.status_code != 202:
        raise SystemExit(f"the upload of {kernel_id} answered {resp.status_code}: {resp.text[:500]}")
    return resp.json()["uuid"]


def submit_to_claim(daemon: Daemon, runs: int) -> list[float]:
    """Milliseconds from sending an upload to an idle runner's claim answer, per run."""
    import httpx

    from tests.helpers.http_server import package_tarball

    auth = {"Authorization": f"Bearer {daemon.runner_token}"}
    out = []
    with httpx.Client(base_url=daemon.url, timeout=60) as client, \
            httpx.Client(base_url=daemon.url, timeout=60, headers=auth) as runner:
        drained = 0
        while True:  # a reused state may hold jobs queued by an earlier run: clear them first
            resp = runner.post("/api/runner/claim", json={"arch": "cpu", "wait": 0})
            if resp.status_code != 200:
                break
            job = resp.json()
            runner.post(f"/api/submissions/{job['uuid']}/result",
                        json={"lease_id": job["lease_id"], "result": None, "logs_b64": "", "env": {},
                              "failure": {"code": "BENCHMARK_CRASHED", "message": "bench: cleared"}})
            drained += 1
        if drained:
            log(f"cleared {drained} job(s) left queued in the reused state")
        busy = {job["kernel_id"] for job in client.get("/api/queue").json().get("in_flight", [])}
        # kernels of their own (the seeded ones' harness files are locked: another desc.yaml is
        # refused); one with a job in flight (an aborted run) cannot be claimed
        kids = [k for k in (f"cpu/Elementwise/Axpy/fp32/claim{j:05d}" for j in range(100, 100 + 2 * runs))
                if k not in busy][:runs]
        for i, kid in enumerate(kids):
            data = package_tarball(kid, AXPY)
            got: dict = {}
            waiting = threading.Event()

            def claim(got: dict, waiting: threading.Event) -> None:
                waiting.set()
                resp = runner.post("/api/runner/claim", json={"arch": "cpu", "wait": 30})
                got["t"] = time.perf_counter()
                got["body"] = resp.json() if resp.status_code == 200 else None

            thread = threading.Thread(target=claim, args=(got, waiting))
            thread.start()
            waiting.wait()
            time.sleep(0.3)  # the runner is parked in the long poll
            t0 = time.perf_counter()
            uuid = submit(client, kid, data)
            thread.join(60)
            if not got.get("body") or got["body"]["uuid"] != uuid:
                raise SystemExit(f"run {i}: the idle runner did not get {uuid}: {got}")
            out.append((got["t"] - t0) * 1e3)
            runner.post(f"/api/submissions/{uuid}/result",
                        json={"lease_id": got["body"]["lease_id"], "result": None, "logs_b64": "", "env": {},
                              "failure": {"code": "BENCHMARK_CRASHED", "message": "bench: not run"}})
    return out


def status_wake(daemon: Daemon, clients: int) -> list[float]:
    """50 long polls on one queued submission; ms from its claim to each poll's answer."""
    import httpx

    from tests.helpers.http_server import package_tarball

    kid = "cpu/Elementwise/Axpy/fp32/wake00000"  # a kernel of its own: the seeded ones' harness files are locked
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        uuid = submit(client, kid, package_tarball(kid, AXPY))
    answered: list[float] = []
    lock = threading.Lock()
    started = threading.Barrier(clients + 1)

    def poll() -> None:
        with httpx.Client(base_url=daemon.url, timeout=60) as c:
            started.wait()
            c.get(f"/api/submissions/{uuid}/status", params={"wait": 30})
            with lock:
                answered.append(time.perf_counter())

    threads = [threading.Thread(target=poll) for _ in range(clients)]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(1.0)  # every poll is parked
    auth = {"Authorization": f"Bearer {daemon.runner_token}"}
    with httpx.Client(base_url=daemon.url, timeout=60, headers=auth) as runner:
        t0 = time.perf_counter()
        claim = runner.post("/api/runner/claim", json={"arch": "cpu", "wait": 5}).json()
        for t in threads:
            t.join(60)
        runner.post(f"/api/submissions/{uuid}/result",
                    json={"lease_id": claim["lease_id"], "result": None, "logs_b64": "", "env": {},
                          "failure": {"code": "BENCHMARK_CRASHED", "message": "bench: not run"}})
    return sorted((t - t0) * 1e3 for t in answered)


def machine() -> dict:
    """Facts about where this ran."""
    import starlette
    import uvicorn

    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    return machine_facts(starlette=starlette.__version__, uvicorn=uvicorn.__version__, git_rev=rev.strip(),
                         load_tool="wrk" if shutil.which("wrk") else "python")


def main(argv: list[str] | None = None) -> int:
    """Run the measurements and print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the JSON object (always printed)")
    parser.add_argument("--kernels", type=int, default=10_000)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per load run")
    parser.add_argument("--submits", type=int, default=20)
    parser.add_argument("--state-dir", default=None, help="reuse/keep the state directory here")
    args = parser.parse_args(argv)
    keep = args.state_dir is not None
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="kz-bench-http-")) / "state"
    try:
        prepare_state(state, args.kernels)
        daemon = Daemon(state)
        try:
            import httpx

            first = httpx.get(daemon.url + "/api/kernels", timeout=60).json()
            log(f"serving {daemon.url}: {first['total']} kernels, page of {len(first['kernels'])}")
            kernels = load(daemon.url + "/api/kernels", 16, args.duration)
            log(f"GET /api/kernels: {kernels}")
            stc = submit_to_claim(daemon, args.submits)
            log(f"submit-to-claim ms: {[round(x, 1) for x in stc]}")
            wake = status_wake(daemon, 50)
            with httpx.Client(base_url=daemon.url, timeout=60) as client:
                uuid = submit(client, "cpu/Elementwise/Axpy/fp32/status00001", __import__(
                    "tests.helpers.http_server", fromlist=["package_tarball"]).package_tarball(
                        "cpu/Elementwise/Axpy/fp32/status00001", AXPY))
            status = load(f"{daemon.url}/api/submissions/{uuid}/status", 50, args.duration)
            log(f"GET status (50 connections): {status}")
        finally:
            daemon.stop()
        result = {
            "kernels": first["total"],
            "kernels_req_per_s": round(kernels["req_per_s"], 1),
            "kernels_p50_ms": round(kernels["p50_ms"], 2),
            "kernels_p99_ms": round(kernels["p99_ms"], 2),
            "kernels_non_2xx": kernels["non_2xx"],
            "status_p99_ms": round(percentile(wake, 0.99), 2),
            "status_p50_ms": round(percentile(wake, 0.5), 2),
            "status_get_p99_ms": round(status["p99_ms"], 2),
            "status_get_p50_ms": round(status["p50_ms"], 2),
            "status_get_req_per_s": round(status["req_per_s"], 1),
            "status_clients": 50,
            "submit_to_claim_ms": round(statistics.median(stc), 2),
            "submit_to_claim_p99_ms": round(percentile(stc, 0.99), 2),
            "submit_runs": len(stc),
            "duration_s": args.duration,
            "machine": machine(),
            "command": "python benchmarks/bench_http.py --json " + " ".join(
                a for a in (argv if argv is not None else sys.argv[1:]) if a != "--json"),
        }
        print(json.dumps(result, sort_keys=True))
        return 0
    finally:
        if not keep:
            shutil.rmtree(state.parent, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())

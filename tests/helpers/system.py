"""The whole system as real processes on 127.0.0.1, for the chaos, hostile-input and load suites.

``ZooProcess`` is a ``kz daemon`` subprocess over a state directory (killable, restartable);
``RunnerProcess`` a ``kz runner`` subprocess on the CPU lane; ``ProtocolRunner`` an HTTP
client that speaks the runner wire protocol and reports a fixed result (it stands in for
a runner where a real one would cost a second of CPU per job); ``submit`` and
``half_upload`` are clients. ``check_invariants`` states what must hold whatever
happened: no acknowledged submission lost, each accepted submission exactly its two
commits, ``kz audit`` clean, the served index equal to a full rebuild. ``Tmpfs`` gives a
small filesystem to fill for real ENOSPC.
"""
from __future__ import annotations

import base64
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kz_daemon.config.tokens import TokenStore
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.storage.gitstore import GitStore
from kz_events.status import TERMINAL
from tests.helpers.daemon import ROOT, axpy_result, axpy_tarball, wait_for
from tests.helpers.submissions import logged

#: kernel_ids of the tiny CPU packages the suites submit (the CPU Axpy example, renamed)
KERNEL_PREFIX = "cpu/Elementwise/Axpy/fp32"


def kernel_ids(n: int, stem: str = "sys") -> list[str]:
    """``n`` distinct kernel_ids of the tiny package (the queue runs one job per kernel at a time)."""
    return [f"{KERNEL_PREFIX}/{stem}_{i:02d}" for i in range(n)]


def tiny_tarball(kernel_id: str, variant: str = "") -> bytes:
    """The CPU Axpy example as ``kernel_id`` with a short timing budget; ``variant`` makes the bytes distinct."""
    def mutate(files: dict[str, bytes]) -> None:
        bench = files[".kernel_package/benchmark.py"].decode()
        # the timing budget only: a run takes a fraction of a second on a loaded 2-core machine
        bench = bench.replace("min_reps=20, budget_s=0.15", "min_reps=5, budget_s=0.02")
        files[".kernel_package/benchmark.py"] = bench.encode()
        if variant:
            files["src/VARIANT"] = variant.encode()
    return axpy_tarball(kernel_id, mutate)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONFIG = """\
http:
  host: 127.0.0.1
  port: {port}
  submit_rate_per_s: 1000.0
  submit_burst: 100000
  intake_wait_s: 60.0
queue:
  lease_seconds: {lease}
  max_attempts: {attempts}
  reaper_interval_s: 0.2
timeouts:
  build_s: 60
  benchmark_s: 60
intake:
  rescan_interval_s: 1.0
{extra}"""


def pin_confirmation(state_dir: Path) -> None:
    """Give a daemon started as a subprocess the confirmation tests/conftest.py pins in this one.

    Its kz.yaml gets the pinned values unless it has a ``confirmation:`` section of its own;
    a missing kz.yaml is written from the (pinned) default.
    """
    from kz_daemon.config.settings import write_default
    from tests.conftest import PINNED_CONFIRMATION

    path = Path(state_dir) / "kz.yaml"
    if write_default(path):
        return
    text = path.read_text(encoding="utf-8")
    if not any(line.startswith("confirmation:") for line in text.splitlines()):
        pinned = ", ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in PINNED_CONFIRMATION.items())
        path.write_text(text.rstrip("\n") + f"\nconfirmation: {{{pinned}}}\n", encoding="utf-8")


# -- processes ----------------------------------------------------------------------------------

class ZooProcess:
    """``kz daemon`` over ``state_dir`` as a subprocess; its output goes to ``state_dir.parent/daemon-N.log``."""

    def __init__(self, state_dir: Path, *, lease: float = 5.0, attempts: int = 5, extra_yaml: str = "",
                 runners: tuple[str, ...] = (), seed_from: Path | None = None, nofile: int | None = None) -> None:
        self.nofile = nofile  # RLIMIT_NOFILE (soft and hard) of the daemon process, when given
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (self.state_dir / "kz.yaml").write_text(CONFIG.format(port=self.port, lease=lease, attempts=attempts,
                                                              extra=extra_yaml))
        pin_confirmation(self.state_dir)
        self.config = init_state_dir(self.state_dir, seed_from=seed_from)
        store = TokenStore(self.state_dir / "auth.yaml")
        self.tokens = {rid: store.issue("runner", rid) for rid in runners}
        self.tokens["admin"] = store.issue("admin", "root")
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.logs: list[Path] = []

    @property
    def pid(self) -> int | None:
        """The running daemon's pid (None when not running)."""
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self, crash_at: str | None = None, ready_timeout: float = 90, env_extra: dict[str, str] | None = None
              ) -> None:
        """Start the daemon (``crash_at``: the accept-saga point where it SIGKILLs itself); wait for /readyz.
        ``env_extra``: more environment for the daemon (a benchmark's probe)."""
        assert self.pid is None, "already running"
        env = {k: v for k, v in os.environ.items() if k != "KZ_CRASH_AT"}
        env["PYTHONPATH"] = str(ROOT)
        env.update(env_extra or {})
        if crash_at:
            env["KZ_CRASH_AT"] = crash_at
        self.starts += 1
        log = self.state_dir.parent / f"daemon-{self.starts}.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "kz_daemon.cli", "daemon", "--state-dir",
                                          str(self.state_dir)], cwd=ROOT, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, preexec_fn=self._limits)
        wait_for(lambda: self.ready() or self.proc.poll() is not None, timeout=ready_timeout, interval=0.1)
        if crash_at and self.proc.poll() == -signal.SIGKILL:
            return  # start-up recovery finished a saga left pending and met the crash point: a crash like any
        assert self.proc.poll() is None, f"the daemon died at start:\n{self.log_tail()}"

    def _limits(self) -> None:
        """In the child before exec: the descriptor limit asked for (soft and hard: it cannot be raised)."""
        if self.nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def ready(self) -> bool:
        """True when /readyz answers 200."""
        try:
            return httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL the daemon and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, wait for the exit; the exit status (SIGKILL after ``timeout``)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc is not None else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            raise AssertionError(f"the daemon did not stop within {timeout} s:\n{self.log_tail()}") from None

    def log_tail(self, n: int = 4000) -> str:
        """The end of the current run's output."""
        return self.logs[-1].read_text(errors="replace")[-n:] if self.logs else ""

    def rss_bytes(self) -> int | None:
        """Resident set size of the daemon from /proc (None when not running)."""
        pid = self.pid
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except (OSError, TypeError):
            return None
        return None

    def open_fds(self) -> int | None:
        """Open file descriptors of the daemon from /proc/PID/fd."""
        try:
            return len(os.listdir(f"/proc/{self.pid}/fd"))
        except (OSError, TypeError):
            return None


class RunnerProcess:
    """A real ``kz runner`` on the CPU lane against ``zoo``."""

    def __init__(self, zoo: ZooProcess, runner_id: str, work_root: Path, wait: float = 2.0,
                 extra: tuple[str, ...] = ()) -> None:
        self.zoo, self.runner_id = zoo, runner_id
        self.work_root = Path(work_root)
        self.work_root.parent.mkdir(parents=True, exist_ok=True)
        self.log = self.work_root.parent / f"runner-{runner_id}-{int(time.monotonic() * 1000)}.log"
        env = {k: v for k, v in os.environ.items() if k not in ("KZ_SERVER", "KZ_CRASH_AT")}
        env.update(KZ_RUNNER_TOKEN=zoo.tokens[runner_id], PYTHONPATH=str(ROOT))
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kz_daemon", "runner", "--server", zoo.url, "--arch", "cpu",
                 "--work-root", str(self.work_root), "--runner-id", runner_id, "--wait", str(wait),
                 "--grace", "5", *extra], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the runner (its job's children are in their own process groups: kill those too)."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait; the exit status."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def log_tail(self, n: int = 3000) -> str:
        """The end of the runner's output."""
        return self.log.read_text(errors="replace")[-n:]


# -- clients ------------------------------------------------------------------------------------

@dataclass
class Ack:
    """A submission the server acknowledged with a 2xx: it must never be lost."""

    uuid: str
    kernel_id: str
    submitted_at: float
    terminal_at: float | None = None
    status: str | None = None


def submit(url: str, kernel_id: str, data: bytes, submitter: str = "alice", *, key: str | None = None,
           timeout: float = 90, client: httpx.Client | None = None) -> httpx.Response:
    """POST /api/submissions the way the guide's curl line does (with an Idempotency-Key when given)."""
    headers = {"X-Submitter-Id": submitter}
    if key is not None:
        headers["Idempotency-Key"] = key
    args = dict(headers=headers, data={"kernel_id": kernel_id, "submitter_id": submitter},
                files={"package": ("package.tar.gz", data, "application/gzip")}, timeout=timeout)
    if client is not None:
        return client.post(f"{url}/api/submissions", **args)
    return httpx.post(f"{url}/api/submissions", **args)


def half_upload(url: str, kernel_id: str, data: bytes, submitter: str = "mallory") -> None:
    """A client that vanishes mid-upload: a raw socket sends half a multipart body, then closes."""
    boundary = "kzchaosboundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"kernel_id\"\r\n\r\n{kernel_id}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"submitter_id\"\r\n\r\n{submitter}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"package\"; filename=\"package.tar.gz\"\r\n"
            f"Content-Type: application/gzip\r\n\r\n").encode()
    body = head + data + f"\r\n--{boundary}--\r\n".encode()
    host, port = url.rsplit("//", 1)[1].split(":")
    request = (f"POST /api/submissions HTTP/1.1\r\nHost: {host}:{port}\r\nX-Submitter-Id: {submitter}\r\n"
               f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n"
               f"\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request + body[: len(body) // 2])
        time.sleep(0.05)


def status_of(url: str, uuid: str, wait: float = 0, client: httpx.Client | None = None) -> dict | None:
    """The submission's status document (long poll ``wait`` s); None when the server does not answer."""
    try:
        getter = client.get if client is not None else httpx.get
        resp = getter(f"{url}/api/submissions/{uuid}/status", params={"wait": wait}, timeout=wait + 30)
    except httpx.HTTPError:
        return None
    return resp.json() if resp.status_code == 200 else None


class ProtocolRunner:
    """A runner that speaks the wire protocol over HTTP and reports a fixed accepting result.

    It claims, downloads the package (the lease holder's right), renews nothing and
    reports ``axpy_result`` for the claimed kernel; ``hold`` keeps the claim unreported
    (a late report test). Server-side it is indistinguishable from a fast runner.
    """

    def __init__(self, url: str, runner_id: str, token: str, job_s: float = 0.0) -> None:
        self.url, self.runner_id = url, runner_id
        self.client = httpx.Client(base_url=url, timeout=90, headers={"Authorization": f"Bearer {token}"})
        self.done = 0
        self.job_s = job_s  # how long each job "runs" between the package download and the report

    def claim(self, wait: float = 2.0) -> dict | None:
        """One claim long poll; the claim document or None."""
        try:
            resp = self.client.post("/api/runner/claim", json={"arch": "cpu", "wait": wait, "host": self.runner_id})
        except httpx.HTTPError:
            return None
        return resp.json() if resp.status_code == 200 else None

    def report_doc(self, claim: dict, latency: float = 1e5) -> dict:
        """The result body this runner sends for ``claim``."""
        return {"lease_id": claim["lease_id"], "result": axpy_result(claim["kernel_id"], latency),
                "logs_b64": base64.b64encode(b"protocol runner\n").decode(), "env": {"runner": self.runner_id},
                "failure": None}

    def report(self, claim: dict, doc: dict | None = None) -> httpx.Response:
        """POST the result of ``claim`` (``doc``: a body to send instead)."""
        return self.client.post(f"/api/submissions/{claim['uuid']}/result", json=doc or self.report_doc(claim))

    def run_one(self, wait: float = 2.0) -> bool:
        """Claim, download and report one job; True when one was reported."""
        claim = self.claim(wait)
        if claim is None:
            return False
        try:
            self.client.get(claim["package_url"])
            if self.job_s > 0:
                time.sleep(self.job_s)
            resp = self.report(claim)
        except httpx.HTTPError:
            return False
        self.done += resp.status_code == 200
        return True

    def loop(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set."""
        while not stop.is_set():
            self.run_one(1.0)

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()


# -- faults -------------------------------------------------------------------------------------

class Tmpfs:
    """A small tmpfs mounted at ``path`` (root only); ``fill`` writes until ENOSPC, ``free`` undoes it."""

    def __init__(self, path: Path, size: str) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(self.path)], check=True,
                       capture_output=True)
        self.filler = self.path / ".filler"

    @staticmethod
    def permitted() -> str | None:
        """None when this process may mount a tmpfs, else the reason it may not."""
        if os.geteuid() != 0:
            return "mounting a tmpfs needs root"
        probe = Path(tempfile.mkdtemp(prefix="kz-mount-probe-"))
        try:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                return f"mount -t tmpfs is not permitted here: {done.stderr.strip()}"
            subprocess.run(["umount", str(probe)], check=True)
            return None
        finally:
            probe.rmdir()

    def fill(self) -> int:
        """Write a filler file until the filesystem is full (real ENOSPC); the bytes written."""
        written = 0
        chunk = b"\0" * (1 << 20)
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while len(chunk) >= 512:
                try:
                    written += os.write(fd, chunk)
                except OSError:  # ENOSPC: try a smaller piece until nothing fits
                    chunk = chunk[: len(chunk) // 4]
        finally:
            os.close(fd)
        return written

    def free(self) -> None:
        """Remove the filler."""
        self.filler.unlink(missing_ok=True)

    def used_bytes(self) -> int:
        """Bytes in use on the filesystem."""
        st = os.statvfs(self.path)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def unmount(self) -> None:
        """Unmount (lazily: a killed process may still hold a file open for a moment)."""
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


# -- invariants ---------------------------------------------------------------------------------

@dataclass
class Verdict:
    """What ``check_invariants`` found; ``problems`` empty means every invariant holds."""

    problems: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    accepted: int = 0

    def require(self, ok: bool, message: str) -> None:
        """Record ``message`` unless ``ok``."""
        if not ok:
            self.problems.append(message)


def wait_all_terminal(url: str, acks: list[Ack], timeout: float) -> list[Ack]:
    """Poll until every acknowledged submission is terminal (or ``timeout``); the ones still not terminal."""
    deadline = time.monotonic() + timeout
    open_ = [a for a in acks if a.terminal_at is None]
    with httpx.Client(timeout=60) as client:
        while open_ and time.monotonic() < deadline:
            doc = status_of(url, open_[0].uuid, wait=min(10.0, max(0.0, deadline - time.monotonic())),
                            client=client)
            still = []
            for ack in open_:
                doc = doc if doc and doc.get("uuid") == ack.uuid else status_of(url, ack.uuid, client=client)
                if doc and doc.get("terminal"):
                    ack.terminal_at, ack.status = time.monotonic(), doc["status"]
                else:
                    still.append(ack)
                doc = None
            open_ = still
    return open_


def _export_head(git: GitStore, dest: Path) -> None:
    """Write HEAD's files under ``dest`` (what a fresh clone would check out)."""
    for path, mode, blob in git.walk_files():
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(git.store[blob].data)
        if mode & 0o111:
            target.chmod(0o755)


def rebuilt_index(state_dir: Path, head: str | None) -> dict:
    """``kz index`` over HEAD's files exported from the repo (a full rebuild, no cache; None: no commit yet)."""
    with tempfile.TemporaryDirectory(prefix="kz-rebuild-") as tmp:
        git = GitStore.open(Path(state_dir) / "repo")
        try:
            _export_head(git, Path(tmp) / "repo")
        finally:
            git.close()
        out = Path(tmp) / "index.json"
        (Path(tmp) / "repo").mkdir(exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "kz_daemon.cli", "index", "--repo", str(Path(tmp) / "repo"),
                               "--out", str(out), *(["--head", head] if head else []), "--no-cache",
                               "--workers", "1"],
                              cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert done.returncode == 0, done.stderr
        return json.loads(out.read_text())


def run_audit(state_dir: Path) -> tuple[int, str]:
    """``kz audit --state-dir DIR --json``: (exit status, output)."""
    done = subprocess.run([sys.executable, "-m", "kz_daemon.cli", "audit", "--state-dir", str(state_dir), "--json"],
                          cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return done.returncode, done.stdout + done.stderr


def index_diff(served: dict, rebuilt: dict) -> str:
    """Where two index documents differ: top-level keys, kernels in one only, kernels' differing fields."""
    out = [f"{k}: {served.get(k)!r} != {rebuilt.get(k)!r}" for k in sorted(set(served) | set(rebuilt))
           if k not in ("kernels", "generated_at") and served.get(k) != rebuilt.get(k)]
    a = {e.get("kernel_id"): e for e in served.get("kernels", [])}
    b = {e.get("kernel_id"): e for e in rebuilt.get("kernels", [])}
    out += [f"only served: {sorted(set(a) - set(b))[:5]}"] if set(a) - set(b) else []
    out += [f"only rebuilt: {sorted(set(b) - set(a))[:5]}"] if set(b) - set(a) else []
    for kid in sorted(set(a) & set(b)):
        paths = _differences(a[kid], b[kid], "")
        if paths:
            out.append(f"{kid}: " + "; ".join(paths[:6]))
    return " | ".join(out[:8])


def _differences(x: object, y: object, at: str) -> list[str]:
    """The innermost places where two JSON values differ, as ``path: served != rebuilt``."""
    if isinstance(x, dict) and isinstance(y, dict):
        return [d for k in sorted(set(x) | set(y), key=str) for d in _differences(x.get(k), y.get(k), f"{at}.{k}")]
    if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        return [d for i, (u, v) in enumerate(zip(x, y)) for d in _differences(u, v, f"{at}[{i}]")]
    return [] if x == y else [f"{at.lstrip('.')}: {x!r:.200} != {y!r:.200}"]


def _comparable(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "generated_at"}


def check_invariants(zoo: ZooProcess, acks: list[Ack], *, require_terminal: bool = True,
                     index_timeout: float = 60) -> Verdict:
    """Check, against a running daemon, everything that must hold whatever faults happened."""
    verdict = Verdict()
    subs = logged(zoo.config.paths.events)  # live and finished: the State keeps only live ones
    for sub in subs.values():
        verdict.statuses[sub.status] = verdict.statuses.get(sub.status, 0) + 1
    # 1. none lost: every 2xx answer names a submission the log holds
    for ack in acks:
        sub = subs.get(ack.uuid)
        verdict.require(sub is not None, f"LOST: {ack.uuid} ({ack.kernel_id}) was acknowledged but is not in the log")
        if sub is not None:
            verdict.require(sub.kernel_id == ack.kernel_id, f"{ack.uuid}: kernel_id {sub.kernel_id} != {ack.kernel_id}")
            if require_terminal:
                verdict.require(sub.status in TERMINAL, f"{ack.uuid}: still {sub.status}")
    # 2. each accepted submission: exactly its two commits, source then scorecard
    git = GitStore.open(zoo.config.paths.repo)
    try:
        head = git.head()
        by_uuid: dict[str, list] = {}
        for info in git.log():
            if "Kz-Submission" in info.trailers:
                by_uuid.setdefault(info.trailers["Kz-Submission"], []).append(info)
    finally:
        git.close()
    for uuid in by_uuid:
        sub = subs.get(uuid)
        verdict.require(sub is not None and sub.status == "accepted",
                        f"{uuid}: has commits but is {sub.status if sub else 'unknown'}")
    for uuid, sub in subs.items():
        if sub.status != "accepted":
            continue
        verdict.accepted += 1
        commits = by_uuid.get(uuid, [])  # newest first
        steps = [c.trailers.get("Kz-Step") for c in commits]
        verdict.require(steps == ["scorecard", "source"], f"{uuid}: commits {steps} (want scorecard over source)")
        if steps == ["scorecard", "source"]:
            card, src = commits
            verdict.require(card.parents[:1] == (src.sha,), f"{uuid}: scorecard commit's parent is not its source")
            verdict.require(card.trailers.get("Kz-Source") == src.sha, f"{uuid}: Kz-Source does not name the source")
            verdict.require((sub.sha_src, sub.sha_br) == (src.sha, card.sha), f"{uuid}: log SHAs differ from git")
    # 3. the served index equals a full rebuild (once it caught up with HEAD)
    served = None
    deadline = time.monotonic() + index_timeout
    while time.monotonic() < deadline:
        try:
            served = httpx.get(f"{zoo.url}/index.json", timeout=30).json()
        except (httpx.HTTPError, ValueError):
            served = None
        if served is not None and served.get("head") == head:
            break
        time.sleep(0.2)
    verdict.require(served is not None and served.get("head") == head,
                    f"served index head {served and served.get('head')} != HEAD {head} after {index_timeout} s")
    if served is not None and served.get("head") == head:
        rebuilt = rebuilt_index(zoo.state_dir, head)
        if _comparable(served) != _comparable(rebuilt):
            verdict.problems.append("served index differs from a full rebuild: " + index_diff(served, rebuilt))
    # 4. kz audit is clean
    rc, out = run_audit(zoo.state_dir)
    verdict.require(rc == 0, f"kz audit exit {rc}: {out[-3000:]}")
    return verdict

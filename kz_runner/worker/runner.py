"""The runner loop: claim a job, keep its lease, run it, report, repeat.

One runner serves one GPU. It long-polls ``POST /api/runner/claim`` for jobs of
its arch, downloads the package, renews the lease from a background thread at
about a third of ``lease_seconds`` (a ``LEASE_LOST`` answer stops the job), runs
:func:`kz_runner.worker.job.execute_job` (the one replaceable step), and reports the
outcome with base64 logs, redacted stderr tails and the environment.

A finished result stays valid while the lease does, so reporting it is retried
(connection errors, 5xx answers) with bounded exponential backoff and jitter until
the lease as last renewed runs out, the lease keeper still renewing meanwhile: a
daemon that restarts within the lease gets the result instead of a stalled job
and a burnt attempt. A definitive answer (2xx, 409 ``LEASE_LOST``, any other 4xx)
ends the retries; failed attempts are logged once, then at most every
``report_log_interval_s``.

No sandbox, no claims: before its first claim the runner runs
:func:`kz_runner.worker.job.preflight` (the bubblewrap probe, then the harness library
imported by the job user in a real step sandbox). When that fails it logs the reason
and the fix, claims nothing and exits with :data:`EXIT_SANDBOX_UNAVAILABLE` (78), which
``kz up``'s supervisor turns into a failing ``/readyz`` check. A job whose sandbox cannot
be made later on (``SANDBOX_UNAVAILABLE``), or whose harness library changed since the
start (``HARNESS_LIBRARY_CHANGED``), is not the package's fault: the runner releases its
lease without a report, logs why (after a fresh probe) and exits the same way (78 for the
sandbox, 2 for a changed installation, which a restart picks up). A job whose judge found
the host too loaded to time it (``MACHINE_BUSY``, after the harness's own retries) is no
verdict either: its lease is released, the job queued again, and the runner goes on.

Stopping (SIGTERM/SIGINT, see :meth:`Runner.request_stop`): while idle the
runner exits at once; during a job it lets the job finish if it ends within the
grace period, else the job's process group is killed and the lease released so
the job is re-queued at once. A second signal skips the grace.

Everything here is stdlib + ``kz_runner``: it runs on a GPU host without the
daemon's dependencies.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import random
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from kz_runner.contract.arch import detect_arch
from kz_runner.worker import contain, envinfo, sandbox
from kz_runner.worker.client import NO_RETRY, ApiError, Claim, ClientError, ResponseTooLarge, RetryPolicy, ZooClient
from kz_runner.worker.job import SANDBOX_UNAVAILABLE, UNPACK_FAILED, JobOutcome, JobSettings, execute_job, preflight

MACHINE_BUSY = "MACHINE_BUSY"  # the judge's: the host too loaded to time the job (a library code, not a verdict)

MiB = 1024 * 1024

# Exit codes of serve(): the CLI passes them through.
EXIT_OK = 0
EXIT_JOB_NOT_REPORTED = 1
EXIT_ENVIRONMENT = 2
# No sandbox can be made on this host (SANDBOX_UNAVAILABLE): no job was or will be claimed.
# EX_CONFIG of sysexits.h; kz up's supervisor reports it on /readyz.
EXIT_SANDBOX_UNAVAILABLE = 78
# With --once, a server that cannot be reached this many times in a row ends the runner.
ONCE_CLAIM_ATTEMPTS = 3


@dataclass(frozen=True)
class RunnerConfig:
    """What one runner does; built from the ``kz runner`` options."""

    # base URL of the zoo server, http(s)://host[:port]
    server: str
    # GPU index this runner serves (None: leave device visibility alone, e.g. a CPU runner)
    gpu: str | None = None
    # arch to claim jobs for; None to detect it on the GPU
    arch: str | None = None
    # handle at most one job, then exit (batch schedulers)
    once: bool = False
    # seconds one claim long-poll waits for a job
    wait_s: float = 30.0
    # where job directories are made (one work root per runner; it is locked); None: a fresh
    # temporary directory, removed when the runner exits
    work_root: Path | None = None
    # this runner's name, passed to packages as KZ_RUNNER_ID and shown in logs
    runner_id: str = "runner"
    # host name sent with claims
    host: str = field(default_factory=socket.gethostname)
    # seconds a running job may still take after a stop request before it is killed
    grace_s: float = 60.0
    # largest package tarball accepted from the server
    max_package_bytes: int = 64 * MiB
    # first pause between report attempts (doubling, with jitter, up to report_backoff_cap_s);
    # attempts go on until the lease runs out
    report_backoff_base_s: float = 1.0
    # largest pause between report attempts
    report_backoff_cap_s: float = 30.0
    # seconds between two log lines about a report that keeps failing
    report_log_interval_s: float = 60.0
    # build/benchmark timeouts when the claim names none
    default_build_timeout_s: float = 600.0
    default_benchmark_timeout_s: float = 1800.0
    # keep job directories (debugging)
    keep_workdir: bool = False
    # the job user and limits of each step's sandbox (kz_runner.worker.contain); contain.UNCONFINED
    # runs steps without a sandbox (development only: the runs are marked and never accepted)
    containment: contain.Containment = contain.Containment()


class _Interrupted(Exception):
    """Raised from the signal handler to abandon an idle long-poll."""


class LeaseKeeper(threading.Thread):
    """Renews one lease every ``interval_s`` until stopped; sets ``cancel`` when the lease is lost."""

    def __init__(self, client: ZooClient, claim: Claim, cancel: threading.Event, interval_s: float,
                 log: Callable[[str], None]) -> None:
        super().__init__(name=f"lease-{claim.uuid[:8]}", daemon=True)
        self.client = client
        self.claim = claim
        self.cancel = cancel
        self.interval_s = interval_s
        self.log = log
        # set when the server said the lease is gone (the job must be abandoned)
        self.lost = threading.Event()
        self._stop_event = threading.Event()
        # monotonic time the lease ends at as far as this runner knows: the claim's, moved on
        # by each renewal (counted from when the renewal was sent, to stay on the safe side)
        self.expires_mono = time.monotonic() + claim.lease_seconds

    def run(self) -> None:
        """Renew until :meth:`stop`, or until the server says the lease is gone."""
        retry = RetryPolicy(attempts=3, base_s=0.5, cap_s=min(5.0, self.interval_s))
        while not self._stop_event.wait(self.interval_s):
            try:
                sent = time.monotonic()
                expires = self.client.renew(self.claim.uuid, self.claim.lease_id, retry=retry)
                self.expires_mono = sent + self.claim.lease_seconds
                self.log(f"lease {self.claim.lease_id} renewed until {expires}")
            except ApiError as exc:
                if exc.code in ("LEASE_LOST", "NOT_FOUND") or exc.status in (404, 409):
                    self.log(f"lease lost ({exc.code}: {exc.message}); stopping the job")
                    self.lost.set()
                    self.cancel.set()
                    return
                self.log(f"lease renewal refused: {exc}")
            except ClientError as exc:
                self.log(f"lease renewal failed, will retry: {exc}")

    def stop(self) -> None:
        """Stop renewing (the job is over)."""
        self._stop_event.set()


_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` on Linux; False where it is unavailable or refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def make_non_dumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)``: other non-root processes of the same user (the
    package's steps included) can no longer read this process's memory or
    ``/proc/<pid>/environ``. Best effort; False where unavailable."""
    return _prctl(_PR_SET_DUMPABLE, 0)


def become_subreaper() -> bool:
    """``prctl(PR_SET_CHILD_SUBREAPER, 1)``: a process a job leaves behind by escaping its
    process group (double fork + ``setsid``) is re-parented to the runner instead of
    init, so :func:`reap_strays` can find and kill it. False where unavailable."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc; [] where /proc is unreadable)."""
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(name))
    return found


def reap_strays() -> int:
    """Kill and reap every child of this process; returns how many were still running.

    Only for a process whose children are all job leftovers at the time of the call
    (the runner between jobs): each killed child's own children are re-parented here
    when it dies and are killed in the next round.
    """
    import signal

    me, killed = os.getpid(), 0
    for _ in range(50):
        kids = [k for k in _children_of(me) if not _is_zombie(k)]
        if not kids:
            break
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    while True:  # zombies of leftovers that ended on their own
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    return killed


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


class Runner:
    """The loop; one instance per process (it installs signal handlers in serve())."""

    def __init__(self, config: RunnerConfig, token: str, *, stream: TextIO | None = None,
                 job_step: Callable[..., JobOutcome] = execute_job) -> None:
        self.config = config
        self._token = token
        self.client = ZooClient(config.server, token, timeout_s=30.0)
        self.stream = stream or sys.stderr
        self.job_step = job_step
        self.arch: str | None = config.arch
        self._stopping = threading.Event()
        # set by a hard stop: abandon a report that is still being retried
        self._report_abort = threading.Event()
        # True only while waiting for work (a claim long poll, a backoff pause): a stop
        # signal then abandons the wait at once instead of after it
        self._interruptible = False
        self._job_cancel: threading.Event | None = None
        self._grace_timer: threading.Timer | None = None
        self._cupy_facts: dict[str, Any] | None = None
        self._lock_fd: int | None = None
        self._subreaper = False
        self._temp_root = config.work_root is None
        self.work_root = Path(config.work_root) if config.work_root is not None else None
        # the harness inputs' hash taken at start (preflight), compared before every job
        self._harness_sha256: str | None = None
        # set when a job met a refusal of the host (RUNNER_REFUSALS): the exit code to stop with
        self._refusal_exit: int | None = None

    def __repr__(self) -> str:
        return f"Runner({self.config.runner_id!r}, {self.config.server!r})"

    # -- logging and stopping -------------------------------------------------------------

    def log(self, message: str) -> None:
        """One timestamped line on the runner's stream."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            self.stream.write(f"{stamp} kz-runner[{self.config.runner_id}] {message}\n")
            self.stream.flush()
        except (OSError, ValueError, RuntimeError):  # RuntimeError: re-entered from a signal handler
            pass

    def request_stop(self, hard: bool = False) -> None:
        """Stop after the current job (or its grace period); ``hard`` kills it now."""
        first = not self._stopping.is_set()
        self._stopping.set()
        cancel = self._job_cancel
        if cancel is None:
            return
        if hard or not first:
            self.log("stop requested again: killing the running job")
            self._report_abort.set()
            cancel.set()
        elif self._grace_timer is None:
            self.log(f"stop requested: the running job gets {self.config.grace_s:g} s to finish")
            self._grace_timer = threading.Timer(self.config.grace_s, cancel.set)
            self._grace_timer.daemon = True
            self._grace_timer.start()

    def _on_signal(self, signum, _frame) -> None:
        self.log(f"received signal {signum}")
        self.request_stop()
        if self._interruptible:
            raise _Interrupted()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT request a stop (main thread only)."""
        import signal

        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    # -- work root ----------------------------------------------------------------------

    def _work_root(self) -> Path:
        """The work root, which _prepare_work_root settles before anything uses it."""
        assert self.work_root is not None
        return self.work_root

    def _prepare_work_root(self) -> str | None:
        """Lock the work root and clear what a killed runner left; an error text or None."""
        if self.work_root is None:
            self.work_root = Path(tempfile.mkdtemp(prefix=f"kz-runner-{self.config.runner_id}-"))
        root = self.work_root
        try:
            root.mkdir(parents=True, exist_ok=True)
            # Only the runner enters the work root: a step sees its own job's folders through the
            # sandbox's bind mounts, never this path's parents.
            os.chmod(root, 0o700)
            fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            return f"cannot use work root {root}: {exc}"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return f"work root {root} is in use by another runner; give each runner its own --work-root"
        self._lock_fd = fd
        for entry in root.iterdir():
            if entry.name.startswith("job-") or entry.name.endswith((".tar.gz", ".part")):
                self.log(f"removing leftover {entry}")
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        return None

    # -- the loop ---------------------------------------------------------------------

    def serve(self, *, signals: bool = True) -> int:
        """Run until stopped (or one job with ``once``); returns the exit code."""
        make_non_dumpable()
        self._subreaper = become_subreaper()
        problem = self._prepare_work_root()
        if problem:
            self.log(problem)
            return EXIT_ENVIRONMENT
        if signals:
            self.install_signal_handlers()
        try:
            return self._serve()
        except _Interrupted:
            self.log("stopped while idle")
            return EXIT_OK
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            if self._temp_root and self.work_root is not None:
                shutil.rmtree(self.work_root, ignore_errors=True)

    def _detect(self) -> str | None:
        """Settle the arch; an error text when --gpu names a GPU that CuPy cannot see."""
        if self.arch is None:
            probe = detect_arch(self.config.gpu)
            why = f" ({probe.reason})" if probe.reason else ""
            if probe.arch == "cpu" and self.config.gpu is not None:
                # A GPU runner that quietly took CPU jobs would be worse than none.
                return f"no GPU {self.config.gpu} found{why}; pass --arch cpu to serve CPU jobs"
            self.arch = probe.arch
            self.log(f"detected arch {probe.arch} on gpu {self.config.gpu}{why}")
        if self.arch != "cpu":
            self._cupy_facts = envinfo.cupy_facts(self.config.gpu)
        return None

    def _preflight(self) -> int | None:
        """The sandbox probe and the harness library's trial import; an exit code when no job
        may run here (logged with the reason and the fix), else None."""
        if self.config.containment.unconfined:
            self.log("WARNING: --unconfined-dev: job steps run WITHOUT a sandbox, as this runner's user; "
                     "for development only: the zoo never accepts these runs")
        check = preflight(self._settings_base(), self._work_root())
        self._harness_sha256 = check.harness_sha256
        if check.problem:
            self.log(f"refusing to run jobs: {check.problem}")
            return EXIT_SANDBOX_UNAVAILABLE
        if check.report is not None:
            memory = (f"; memory: {check.memory.mechanism} ({check.memory.limit_bytes} bytes a step, "
                      f"{check.memory.pids_max} processes; {check.memory.why})" if check.memory else "")
            self.log(f"sandbox ok: bubblewrap {check.report.version or '?'}, mode {check.report.mode}, steps run "
                     f"as uid {self.config.containment.uid} ({check.report.seconds:.2f} s probe){memory}")
        return None

    def _serve(self) -> int:
        problem = self._detect()
        if problem:
            self.log(problem)
            return EXIT_ENVIRONMENT
        refused = self._preflight()
        if refused is not None:
            return refused
        arch = self.arch
        assert arch is not None  # _detect settled it
        self.log(f"serving {self.config.server} for arch {self.arch}, gpu {self.config.gpu}, "
                 f"work root {self.work_root}" + (", one job" if self.config.once else ""))
        failures = 0
        claim_retry = RetryPolicy(attempts=1)
        backoff = RetryPolicy(attempts=1, base_s=1.0, cap_s=30.0)
        rng = random.Random()
        # --once: the server caps each long poll (60 s by default); keep asking until --wait is over.
        once_deadline = time.monotonic() + self.config.wait_s
        while not self._stopping.is_set():
            wait = self.config.wait_s
            if self.config.once:
                wait = max(0.0, round(once_deadline - time.monotonic(), 3))
            try:
                self._interruptible = True
                try:
                    claim = self.client.claim(arch, wait, host=self.config.host,
                                              gpu=self.config.gpu, retry=claim_retry)
                finally:
                    self._interruptible = False
                failures = 0
            except ApiError as exc:
                if exc.status in (401, 403):
                    self.log(f"the server refused this runner's token ({exc.code}: {exc.message})")
                    return EXIT_ENVIRONMENT
                failures += 1
                self.log(f"claim refused: {exc}")
                if self.config.once and failures >= ONCE_CLAIM_ATTEMPTS:
                    return EXIT_ENVIRONMENT
                self._stopping.wait(backoff.delay(min(failures, 6), rng))
                continue
            except ClientError as exc:
                failures += 1
                self.log(f"claim failed ({exc}); retrying")
                if self.config.once and failures >= ONCE_CLAIM_ATTEMPTS:
                    return EXIT_ENVIRONMENT
                self._stopping.wait(backoff.delay(min(failures, 6), rng))
                continue
            if claim is None:
                if self.config.once and time.monotonic() >= once_deadline - 0.05:
                    self.log(f"no job within {self.config.wait_s:g} s")
                    return EXIT_OK
                continue
            reported = self.handle(claim)
            if self._refusal_exit is not None:
                return self._refusal_exit
            if self.config.once:
                return EXIT_OK if reported or self._stopping.is_set() else EXIT_JOB_NOT_REPORTED
        self.log("stopped")
        return EXIT_OK

    # -- one job ----------------------------------------------------------------------

    def handle(self, claim: Claim) -> bool:
        """Run one claimed job to the end; True when its result was reported."""
        cancel = threading.Event()
        self._job_cancel = cancel
        if self._stopping.is_set():  # a stop arrived between the claim and here
            self._stopping.clear()
            self.request_stop()
        self.log(f"claimed {claim.uuid} ({claim.kernel_id}), lease {claim.lease_id} for {claim.lease_seconds:g} s")
        interval = max(0.5, claim.lease_seconds / 3.0)
        keeper = LeaseKeeper(self.client, claim, cancel, interval, self.log)
        keeper.start()
        tarball = self._work_root() / f"{claim.uuid}.tar.gz"
        try:
            try:
                size = self.client.fetch_package(claim, tarball, max_bytes=self.config.max_package_bytes)
                os.chmod(tarball, 0o600)  # the work root is passable by the job user; the tarball is ours
                self.log(f"downloaded the package ({size} bytes)")
            except ResponseTooLarge as exc:
                outcome = JobOutcome(None, UNPACK_FAILED, str(exc), f"[kz-runner] {exc}\n".encode(), {})
                return self._report(claim, outcome, keeper)
            except ClientError as exc:
                self.log(f"package download failed: {exc}")
                if not (isinstance(exc, ApiError) and exc.code == "LEASE_LOST"):
                    self._release(claim, f"package download failed: {exc}")
                return False
            outcome = self.job_step(tarball, self.work_root, self._settings(claim), cancel=cancel)
            if self._subreaper:
                strays = reap_strays()
                if strays:
                    note = f"killed {strays} process(es) the job left behind outside its process group"
                    self.log(note)
                    outcome = replace(outcome, logs=outcome.logs + f"[kz-runner] {note}\n".encode())
            if keeper.lost.is_set():
                self.log("the lease was lost while running; the outcome is dropped")
                return False
            if outcome.cancelled:
                self._release(claim, "runner stopping" if self._stopping.is_set() else "job cancelled")
                return False
            if outcome.refused:
                self._refuse(claim, outcome)
                return False
            if outcome.failure_code == MACHINE_BUSY:
                # No verdict on the package: the host was too loaded for the judge's clock, even after the
                # harness's own retries. Given back, the job is queued again (an attempt counted, so a
                # host that stays loaded ends in ATTEMPTS_EXHAUSTED instead of a timing that means nothing).
                self.log(f"job {claim.uuid}: {outcome.failure_message}; released to be run again")
                self._release(claim, f"{MACHINE_BUSY}: the runner's host was too loaded to judge the timing "
                                     "(queued again)")
                return False
            self.log(f"job done: {outcome.failure_code or 'result captured'} "
                     f"({', '.join(f'{k}={v:.2f}' for k, v in outcome.timings.items())})")
            return self._report(claim, outcome, keeper)
        finally:
            keeper.stop()
            tarball.unlink(missing_ok=True)
            if self._grace_timer is not None:
                self._grace_timer.cancel()
                self._grace_timer = None
            self._job_cancel = None

    def _refuse(self, claim: Claim, outcome: JobOutcome) -> None:
        """A job the host refused (no sandbox, a changed harness library): release it without
        blaming the package, say why, and stop claiming."""
        self.log(f"job {claim.uuid} not run: {outcome.failure_message}")
        self._release(claim, f"runner {self.config.runner_id} cannot run jobs: {outcome.failure_code} "
                             "(the runner host's trouble, not the package's)")
        if outcome.failure_code == SANDBOX_UNAVAILABLE:
            report = sandbox.probe(refresh=True)
            now = "the sandbox probe passes again" if report.ok else f"{report.reason} (fix: {report.fix})"
            self.log(f"refusing to run more jobs: {SANDBOX_UNAVAILABLE}: {now}")
            self._refusal_exit = EXIT_SANDBOX_UNAVAILABLE
        else:
            self.log(f"refusing to run more jobs: {outcome.failure_code}: restart the runner")
            self._refusal_exit = EXIT_ENVIRONMENT

    def _settings_base(self) -> JobSettings:
        """The job settings that do not depend on a claim."""
        return JobSettings(
            gpu=self.config.gpu,
            arch=self.arch or "cpu",
            runner_id=self.config.runner_id,
            secrets=(self._token,),
            keep_workdir=self.config.keep_workdir,
            containment=self.config.containment,
            harness_sha256=self._harness_sha256,
        )

    def _settings(self, claim: Claim) -> JobSettings:
        t = claim.timeouts
        return replace(
            self._settings_base(),
            build_timeout_s=float(t.get("build_s") or self.config.default_build_timeout_s),
            benchmark_timeout_s=float(t.get("benchmark_s") or self.config.default_benchmark_timeout_s),
            kernel_id=claim.kernel_id,
        )

    def _env(self, outcome: JobOutcome) -> dict[str, Any]:
        env = envinfo.collect(self.config.gpu, self.arch or "cpu", self.config.runner_id,
                              probe_gpu=self.arch != "cpu", cupy=self._cupy_facts)
        env["timings"] = outcome.timings
        env.update(outcome.env)
        return env

    def _report(self, claim: Claim, outcome: JobOutcome, keeper: LeaseKeeper) -> bool:
        """Report the outcome, retrying transient failures until the lease runs out."""
        rng = random.Random()
        env = self._env(outcome)
        attempt, last_logged = 0, float("-inf")
        while True:
            try:
                view = self.client.report_result(claim.uuid, claim.lease_id, result=outcome.result,
                                                 logs=outcome.logs, env=env, failure=outcome.failure,
                                                 log_tails=outcome.log_tails or None, retry=NO_RETRY)
                self.log(f"reported {claim.uuid}: status {view.get('status')}"
                         + (f" after {attempt + 1} attempts" if attempt else ""))
                return True
            except ApiError as exc:
                if exc.status < 500:
                    self.log(f"result for {claim.uuid} refused: {exc}")
                    # 422 RESULT_INVALID: the server recorded the run and rejected the submission.
                    return exc.status == 422
                problem: ClientError = exc
            except ClientError as exc:  # connection refused or reset, timeout, an answer that is not JSON
                problem = exc
            attempt += 1
            now = time.monotonic()
            left = keeper.expires_mono - now
            if keeper.lost.is_set() or left <= 0:
                self.log(f"could not report {claim.uuid} within its lease ({attempt} attempts, last: {problem}); "
                         "the job will be re-queued")
                return False
            delay = min(left, rng.uniform(0.5, 1.0) * min(self.config.report_backoff_cap_s,
                                                          self.config.report_backoff_base_s * 2 ** min(attempt, 16)))
            if now - last_logged >= self.config.report_log_interval_s:
                last_logged = now
                self.log(f"report of {claim.uuid} failed ({problem}); retrying until the lease ends "
                         f"in {left:.0f} s (attempt {attempt})")
            if self._report_abort.wait(delay):
                self.log(f"stopped while reporting {claim.uuid}; the lease will expire")
                return False

    def _release(self, claim: Claim, reason: str) -> None:
        try:
            self.client.release(claim.uuid, claim.lease_id, reason, retry=RetryPolicy(attempts=3, cap_s=2.0))
            self.log(f"released {claim.uuid}: {reason}")
        except ClientError as exc:
            self.log(f"could not release {claim.uuid} ({exc}); the lease will expire")


def default_runner_id(gpu: str | None) -> str:
    """``<host>-gpu<N>``, or ``<host>-cpu`` without a GPU index."""
    host = socket.gethostname().split(".")[0] or "runner"
    return f"{host}-gpu{gpu}" if gpu is not None else f"{host}-cpu"


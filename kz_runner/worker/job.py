"""Job execution: one package tarball in, one :class:`JobOutcome` out.

This is deliberately one small, replaceable step (:func:`execute_job`): the runner
loop knows nothing of how a package is run, only what came out.

Steps:

1. safe unpack into a fresh job directory (the daemon intake's rules and limits);
   the package files are made read-only and ``.kernel_package/`` is hashed; the
   harness library is staged and its hash compared with the one the runner took at
   start (:func:`preflight`; ``HARNESS_LIBRARY_CHANGED`` when they differ);
2. ``python .kernel_package/build_test_env.py WORKDIR`` with cwd = the package root;
3. everything the build wrote into WORKDIR is hashed and made read-only
   (:mod:`kz_runner.worker.seal`);
4. ``python .kernel_package/benchmark.py WORKDIR`` with the trial seed and result
   pipes of :mod:`kz_runner.worker.result_channel`; the result comes from the harness's result
   channel, or from stdout (exactly one JSON document) when the harness sent none;
5. the hashes are checked again: any change is ``INTEGRITY_ERROR`` naming the files.

Each step runs through :func:`run_sandboxed`, the one way a step runs: a bubblewrap
sandbox (:mod:`kz_runner.worker.sandbox`) that shows the step only the package and the
staged library (read-only), the job's ``work/`` (writable for the build, read-only for
the benchmark), ``home/`` and ``tmp/``, the interpreter, ``/usr`` and its GPU's device
nodes; no network, no other process, never root; limits from
:class:`kz_runner.worker.contain.Containment`, memory and processes held by the step's own
cgroup where the runner has one, else by rlimits (:func:`kz_runner.worker.contain.memory_guard`):
a step stopped at its memory limit ends the job with ``MEMORY_LIMIT``. It is supervised in its own process group
with a timeout (the whole group is killed), a scrubbed environment built from an
allow-list (never the runner's token or server address), only the runner's GPU visible,
and caps on captured output. ``PYTHONPATH`` holds only a read-only staged copy of the
harness library (:mod:`kz_runner.worker.harnesslib`). A sandbox that cannot be made
stops the job before any package code runs (``SANDBOX_UNAVAILABLE``): there is no
unsandboxed fallback, only the explicit development switch ``Containment.unconfined``.

Expected failures are values: ``JobOutcome.failure_code`` is one of the codes in
:data:`FAILURE_CODES` or one of the harness library's integrity codes
(:data:`kz_runner.worker.result_channel.LIBRARY_CODES`).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import signal
import stat
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypedDict

from kz_runner.contract import tarball
from kz_runner.contract.layout import BENCHMARK, BUILD_TEST_ENV, KP, WORKER_SANDBOX_ENV, WORKER_SOURCE_ENV
from kz_runner.contract.rules.pysource import harness_not_judged, read_metas
from kz_runner.worker import contain, harnesslib, result_channel as channel, sandbox, seal as integrity
from kz_runner.worker.logtail import Redactor, tail
from kz_runner.worker.procs import StepResult, run_step

MiB = 1024 * 1024

# Failure codes a job can end with (the wire protocol's runner failure codes, plus
# CANCELLED, which is never reported: the runner releases the lease instead).
UNPACK_FAILED = "UNPACK_FAILED"
BUILD_FAILED = "BUILD_FAILED"
BUILD_TIMEOUT = "BUILD_TIMEOUT"
BENCHMARK_TIMEOUT = "BENCHMARK_TIMEOUT"
BENCHMARK_CRASHED = "BENCHMARK_CRASHED"
# a step was stopped at its memory limit (the OOM killer in its cgroup, or its own allocation
# refused under RLIMIT_DATA)
MEMORY_LIMIT = "MEMORY_LIMIT"
BAD_OUTPUT = channel.BAD_OUTPUT
INTEGRITY_ERROR = channel.INTEGRITY_ERROR
CANCELLED = "CANCELLED"
# The runner host's trouble, not the package's: never reported (the runner releases the job and
# stops claiming). Their meaning and fix are in kz_runner.contract.codes.
SANDBOX_UNAVAILABLE = sandbox.SANDBOX_UNAVAILABLE
HARNESS_LIBRARY_CHANGED = "HARNESS_LIBRARY_CHANGED"
RUNNER_REFUSALS = (SANDBOX_UNAVAILABLE, HARNESS_LIBRARY_CHANGED)
FAILURE_CODES = (UNPACK_FAILED, BUILD_FAILED, BUILD_TIMEOUT, BENCHMARK_TIMEOUT, BENCHMARK_CRASHED, MEMORY_LIMIT,
                 BAD_OUTPUT, INTEGRITY_ERROR, CANCELLED, *RUNNER_REFUSALS)

BUILD_SCRIPT = f"{KP}/{BUILD_TEST_ENV}"
BENCHMARK_SCRIPT = f"{KP}/{BENCHMARK}"

# Variables copied from the runner's environment into the steps' environment, when set.
# Everything else (tokens, server URLs, credentials, the systemd credentials
# directory, proxies) stays behind.
PASS_THROUGH = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ",
    "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_CACHE_MAXSIZE",
    "ROCM_PATH", "ROCM_HOME", "HIP_PATH", "HIP_PLATFORM", "HSA_OVERRIDE_GFX_VERSION",
    "NVIDIA_DRIVER_CAPABILITIES",
)
PASS_THROUGH_PREFIXES = ("CUPY_",)
# Visibility variables: copied only when the runner was not given a GPU index.
VISIBILITY = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# Toolkit variables whose directories the sandbox shows read-only (when outside /usr, which it
# shows anyway); LD_LIBRARY_PATH's entries too.
TOOLKIT_DIRS = ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "ROCM_PATH", "ROCM_HOME", "HIP_PATH")
# bytes of bwrap's status lines kept (a few short JSON lines)
STATUS_CAP = 64 * 1024
# seconds the preflight's sandboxed import of the harness library may take
PREFLIGHT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class JobSettings:
    """How to run one job; the runner fills it from its options and the claim."""

    # seconds build_test_env.py may run
    build_timeout_s: float = 600.0
    # seconds benchmark.py may run
    benchmark_timeout_s: float = 1800.0
    # GPU index the steps may see (CUDA/HIP_VISIBLE_DEVICES), None to leave visibility alone
    gpu: str | None = None
    # the runner's arch, passed to the steps as KZ_ARCH and used in synthesized results
    arch: str = "cpu"
    # the runner's id, passed to the steps as KZ_RUNNER_ID
    runner_id: str = "local"
    # the kernel_id the tarball must hold (the claim's), None to accept the one found
    kernel_id: str | None = None
    # bytes of benchmark stdout kept; more is BAD_OUTPUT
    stdout_cap: int = 1 * MiB
    # bytes of logs kept (each step's stderr gets half); more is cut with a marker
    log_cap: int = 1 * MiB
    # seconds between SIGTERM and SIGKILL when a step's group is killed
    kill_grace_s: float = 5.0
    # the interpreter the steps run with
    python: str = sys.executable
    # unpack limits (the daemon intake's defaults)
    unpack_limits: tarball.Limits = tarball.Limits()
    # extra variables for the steps, set by the operator (never secrets)
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # values that must never reach a step's environment (the runner token); not shown in repr
    secrets: tuple[str, ...] = field(default=(), repr=False)
    # keep the job directory afterwards (debugging)
    keep_workdir: bool = False
    # the job user and limits of each step's sandbox; contain.UNCONFINED runs steps without one
    # (development only: such runs are marked unconfined and never accepted)
    containment: contain.Containment = contain.Containment()
    # the harness inputs' hash the runner took at start (preflight); None: not compared
    harness_sha256: str | None = None


@dataclass(frozen=True)
class JobOutcome:
    """What came out of one job."""

    # the document to report: benchmark stdout, or a synthesized build_ok=false one; None otherwise
    result: dict[str, Any] | None
    # None on success, else one of FAILURE_CODES
    failure_code: str | None
    # human-readable failure reason, None on success
    failure_message: str | None
    # runner notes + each step's stderr (and offending stdout), capped at JobSettings.log_cap
    logs: bytes
    # seconds per step: unpack_s, build_s, benchmark_s, total_s (steps that ran)
    timings: dict[str, float]
    # kernel_id found in the tarball, None when unpacking failed
    kernel_id: str | None = None
    # the job directory when kept (JobSettings.keep_workdir), else None (it was removed)
    workdir: Path | None = None
    # facts for the report's env: containment, integrity (counts and hash times), result_channel
    env: dict[str, Any] = field(default_factory=dict)
    # redacted stderr tails {"build", "benchmark"} of the steps that ran (kz_runner.worker.logtail)
    log_tails: dict[str, str] = field(default_factory=dict)

    @property
    def failure(self) -> dict[str, str] | None:
        """The wire form ``{"code", "message"}``, None on success."""
        if self.failure_code is None:
            return None
        return {"code": self.failure_code, "message": self.failure_message or self.failure_code}

    @property
    def cancelled(self) -> bool:
        """True when the job was stopped from outside (lease lost, runner stopping)."""
        return self.failure_code == CANCELLED

    @property
    def refused(self) -> bool:
        """True when the runner host, not the package, stopped the job (:data:`RUNNER_REFUSALS`):
        no package code ran to a verdict, and the outcome must not be reported."""
        return self.failure_code in RUNNER_REFUSALS


def _now_rfc3339() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def child_env(settings: JobSettings, job_dir: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The steps' environment: an allow-list of ``base`` plus the job's own variables."""
    base = os.environ if base is None else base
    env: dict[str, str] = {}
    for key, value in base.items():
        if key in PASS_THROUGH or key.startswith(PASS_THROUGH_PREFIXES):
            env[key] = value
        elif key in VISIBILITY and settings.gpu is None:
            env[key] = value
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("LANG", "C.UTF-8")
    home, tmp = job_dir / "home", job_dir / "tmp"
    env.update({
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        # only the staged copy of the harness library (kz_runner.worker.harnesslib)
        "PYTHONPATH": str(job_dir / "lib"),
        "KZ_RUNNER_ID": settings.runner_id,
        "KZ_ARCH": settings.arch,
    })
    if settings.gpu is not None:
        env.update({"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(settings.gpu),
                    "HIP_VISIBLE_DEVICES": str(settings.gpu)})
    env.update(settings.extra_env)
    for secret in settings.secrets:
        if secret:
            for key in [k for k, v in env.items() if secret in v or secret in k]:
                del env[key]
    return env


def synthesize_build_failure(package_dir: Path, kernel_id: str, settings: JobSettings, error: str) -> dict[str, Any]:
    """A ``benchmark_output`` document for a failed build: build_ok=false, every METAS case skipped."""
    try:
        source = (package_dir / BENCHMARK_SCRIPT).read_bytes()
        metas, _ = read_metas(source)
    except OSError:
        metas = None
    case_ids = []
    for meta in metas or []:
        if isinstance(meta, dict) and isinstance(meta.get("test_case_id"), str) and meta["test_case_id"] not in case_ids:
            case_ids.append(meta["test_case_id"])
    return {
        "schema_version": "1.0.0",
        "kernel_id": kernel_id,
        "ran_at": _now_rfc3339(),
        "runner_id": settings.runner_id,
        "arch": settings.arch,
        "overall": {"accept": False, "accept_reason": f"build failed: {error}", "build_ok": False},
        "cases": [
            {"test_case_id": cid, "correctness": "skipped", "accept": False, "metrics": [],
             "accept_reason": "not run: the build failed", "error": f"build failed: {error}"}
            for cid in case_ids
        ],
    }


class _Logs:
    """Runner notes and step output, assembled into one capped byte string."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def note(self, text: str) -> None:
        self.parts.append(f"[kz-runner {_now_rfc3339()}] {text}\n".encode())

    def section(self, title: str, data: bytes, dropped: int = 0) -> None:
        self.parts.append(f"===== {title} ({len(data) + dropped} bytes) =====\n".encode())
        self.parts.append(data)
        if data and not data.endswith(b"\n"):
            self.parts.append(b"\n")
        if dropped:
            self.parts.append(f"[kz-runner: truncated, {dropped} more bytes dropped]\n".encode())

    def value(self, cap: int) -> bytes:
        data = b"".join(self.parts)
        if len(data) <= cap:
            return data
        marker = f"\n[kz-runner: logs truncated, {len(data) - cap} bytes dropped]\n".encode()
        return data[: max(0, cap - len(marker))] + marker


def _rmtree(path: Path) -> None:
    """Remove a job directory even where the package made parts of it read-only."""
    def onerror(func, target, _exc):
        try:
            parent = os.path.dirname(target)
            os.chmod(parent, stat.S_IRWXU)
            if os.path.isdir(target) and not os.path.islink(target):
                os.chmod(target, stat.S_IRWXU)
            func(target)
        except OSError:
            pass
    shutil.rmtree(path, onerror=onerror)


def _step_note(name: str, res: StepResult) -> str:
    if res.start_error:
        return f"{name} could not start: {res.start_error}"
    how = "timed out and its process group was killed" if res.timed_out else (
        "was cancelled and its process group was killed" if res.cancelled else f"exited with status {res.returncode}")
    return f"{name} {how} after {res.duration_s:.2f} s"


def _hand_over(settings: JobSettings, job_dir: Path) -> None:
    """Give the job's writable folders (work/, home/, tmp/) to the job user when the runner is
    root (``drop`` mode: the step is the real uid 65534 there). In ``userns`` mode the runner's
    own uid is the job user outside the namespace, so nothing changes hands."""
    c = settings.containment
    if c.unconfined or sandbox.mode() != "drop":
        return
    for sub in ("work", "home", "tmp"):
        os.chown(job_dir / sub, c.uid, c.gid)
        os.chmod(job_dir / sub, 0o700)


def library_paths(env: Mapping[str, str]) -> tuple[str, ...]:
    """Toolkit directories the step's environment names (:data:`TOOLKIT_DIRS`, the entries of
    ``LD_LIBRARY_PATH``) that the sandbox shows read-only: absolute, existing, outside /usr,
    and never a top-level directory (``/``, ``/root``, ``/home`` would show everything)."""
    names = [env.get(key, "") for key in TOOLKIT_DIRS] + env.get("LD_LIBRARY_PATH", "").split(":")
    found = []
    for name in names:
        path = os.path.realpath(name) if name and os.path.isabs(name) else ""
        if len(Path(path).parts) >= 3 and os.path.isdir(path) and not path.startswith("/usr/"):
            found.append(path)
    return tuple(dict.fromkeys(found))


def device_view(settings: JobSettings) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(device nodes, read-only paths) the steps of this runner see: its own GPU's nodes on an
    ``sm_*`` lane (every NVIDIA GPU when the runner has no ``--gpu``), the KFD and render nodes
    on a ``gfx*`` lane (all of them: HIP_VISIBLE_DEVICES selects), nothing on the CPU lane."""
    if settings.arch.startswith("sm_"):
        return sandbox.nvidia_view(settings.gpu if settings.gpu is not None else "[0-9]*")
    if settings.arch.startswith("gfx"):
        return sandbox.amd_view("*")
    return (), ()


def _data_limit(c: contain.Containment) -> int | None:
    """RLIMIT_DATA of a step: the memory limit where no cgroup holds it, else None (the cgroup's
    memory.max counts the whole step; a per-process limit besides would only differ)."""
    return c.memory_bytes if contain.memory_guard(c).mechanism == "rlimit" else None


def sandbox_spec(settings: JobSettings, *, cwd: Path, env: Mapping[str, str], timeout_s: float,
                 readonly: Sequence[Path] = (), writable: Sequence[Path] = (), pass_fds: Sequence[int] = (),
                 status_fd: int | None = None, nested: bool = False,
                 readonly_at: Sequence[tuple[str, str]] = ()) -> sandbox.SandboxSpec:
    """The sandbox of one step: the given paths, the interpreter of ``settings.python``, the
    lane's devices, the job user and limits of ``settings.containment``; ``nested``: the step
    makes the kernel worker's sandbox (the judge's step)."""
    c = settings.containment
    devices, ro_try = device_view(settings)
    return sandbox.SandboxSpec(
        cwd=str(cwd), rw=tuple(str(p) for p in writable), ro=tuple(str(p) for p in readonly),
        interpreter=sandbox.interpreter_paths(settings.python), devices=devices,
        ro_try=tuple(ro_try) + library_paths(env), env=dict(env), pass_fds=tuple(pass_fds),
        cpu_s=c.cpu_seconds(timeout_s), fsize_bytes=c.fsize_bytes, nproc=c.nproc, nofile=c.nofile,
        data_bytes=_data_limit(c), uid=c.uid, gid=c.gid, status_fd=status_fd, nested=nested,
        ro_at=tuple((str(a), str(b)) for a, b in readonly_at))


# Where the judge's view holds what only the kernel's worker uses: the package's source area and the
# build's outputs are not at their own paths there (a benchmark that imports from src/ fails, and is
# run again unverified), but a nested sandbox can only show what its maker's view holds.
WORKER_SOURCE_AT = "/.kz-worker/package"
WORKER_BUILD_AT = "/.kz-worker/build"


def worker_views(package_dir: Path, work: Path) -> list[tuple[str, str]]:
    """(path in the judge's view, path in the worker's view) of the package and the build's ``build/``."""
    pairs = [(WORKER_SOURCE_AT, str(package_dir))]
    if (work / "build").is_dir():
        pairs.append((WORKER_BUILD_AT, str(work / "build")))
    return pairs


def worker_prefix(settings: JobSettings, package_dir: Path, lib: Path, work: Path, env: Mapping[str, str],
                  timeout_s: float) -> list[str]:
    """The argv prefix of the kernel worker's sandbox, which the judge's step makes itself
    (``KZ_WORKER_SANDBOX``): the package (its source area) and the staged library read-only,
    ``build/`` of the workdir read-only when the build made one, never the inputs or expected
    outputs; no network, the lane's devices, the step's limits; a user namespace below the
    judge's (``userns`` mode whoever the runner is: the judge is never root)."""
    c = settings.containment
    devices, ro_try = device_view(settings)
    spec = sandbox.SandboxSpec(
        cwd=str(package_dir), ro=(str(lib),), ro_at=tuple(worker_views(package_dir, work)),
        interpreter=sandbox.interpreter_paths(settings.python),
        devices=devices, ro_try=tuple(ro_try) + library_paths(env), cpu_s=c.cpu_seconds(timeout_s),
        fsize_bytes=c.fsize_bytes, nproc=c.nproc, nofile=c.nofile, data_bytes=_data_limit(c), hostname="kz-worker")
    return sandbox.nested_command(spec)


def _close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class _Caps(TypedDict):
    """The supervision arguments :func:`run_sandboxed` passes on to :func:`run_step` (a plain dict)."""

    timeout_s: float
    stdout_cap: int
    stderr_cap: int
    kill_grace_s: float
    cancel: threading.Event | None


def run_sandboxed(argv: Sequence[str], settings: JobSettings, *, cwd: Path, env: Mapping[str, str],
                  timeout_s: float, readonly: Sequence[Path] = (), writable: Sequence[Path] = (),
                  pass_fds: Sequence[int] = (), reads: Mapping[str, tuple[int, int]] | None = None,
                  cancel: threading.Event | None = None, nested: bool = False,
                  readonly_at: Sequence[tuple[str, str]] = ()) -> StepResult:
    """Run one job step in its own sandbox, supervised: the one way package code runs.

    ``argv`` runs with cwd ``cwd`` and exactly the environment ``env``, seeing ``readonly``
    and ``writable`` (paths keep their host names), the interpreter of ``settings.python``,
    ``/usr``, the lane's device nodes, and nothing else of the host (:mod:`.sandbox`). It is
    supervised like :func:`kz_runner.worker.procs.run_step` (timeout, ``cancel``, capped
    output from ``settings``): ``pass_fds`` are inherited by the step and, like the read ends
    of ``reads``, closed here whatever happens. Call it from a thread that outlives the step
    (the sandbox dies with the thread that started it).

    Under the ``cgroup`` memory mechanism the step runs in a cgroup of its own (its limits, then
    killed and removed when the step ends) and ``extra["limits"]`` holds its events as JSON
    (``oom_kill``, ``pids_max``, ``memory_peak``; :func:`memory_limit_hit` reads them).

    Raises :class:`kz_runner.worker.sandbox.SandboxUnavailable` when the sandbox could not be
    made (``SANDBOX_UNAVAILABLE``), its limits included: the step did not run, and the package is
    not to blame. With ``settings.containment.unconfined`` (development only) the step runs directly.
    """
    s = settings
    caps = _Caps(timeout_s=timeout_s, stdout_cap=s.stdout_cap, stderr_cap=max(1, s.log_cap // 2),
                 kill_grace_s=s.kill_grace_s, cancel=cancel)
    reads = dict(reads or {})
    if s.containment.unconfined:
        return run_step(argv, cwd=cwd, env=env, pass_fds=pass_fds, reads=reads, **caps)
    status_read, status_write = os.pipe()
    os.set_inheritable(status_read, False)
    cgroup: contain.StepCgroup | None = None
    try:
        spec = sandbox_spec(s, cwd=cwd, env=env, timeout_s=timeout_s, readonly=readonly, writable=writable,
                            pass_fds=(*pass_fds, status_write), status_fd=status_write, nested=nested,
                            readonly_at=readonly_at)
        command = sandbox.command(spec, argv)
        cgroup = _step_cgroup(s.containment)
        if cgroup is not None:
            command = cgroup.enter_argv() + command
    except BaseException:
        _close_fds([status_read, status_write, *pass_fds, *(fd for fd, _cap in reads.values())])
        raise
    reads["sandbox"] = (status_read, STATUS_CAP)
    try:
        res = run_step(command, cwd=cwd, env=spec.env, pass_fds=spec.pass_fds, reads=reads, **caps)
    finally:
        events = cgroup.events() if cgroup is not None else None
        if cgroup is not None:
            cgroup.close()
    if events is not None:
        res = replace(res, extra={**res.extra, "limits": json.dumps(events).encode()})
    if res.cancelled or sandbox.started(res.extra.get("sandbox", b"")):
        return res
    lines = res.stderr.decode("utf-8", "replace").strip().splitlines()
    why = res.start_error or (lines[-1] if lines else f"bwrap exited with status {res.returncode}")
    fix = (f"make the interpreter and its site-packages readable and executable by uid {s.containment.uid}"
           if "kz-sandbox:" in why else "read bwrap's message in the runner's log")
    report = sandbox.SandboxReport(False, f"a job step's sandbox could not be made: {why}", fix, "broken",
                                   mode=sandbox.mode(), stderr="\n".join(lines[-20:]))
    raise sandbox.SandboxUnavailable(report)


def _step_cgroup(c: contain.Containment) -> contain.StepCgroup | None:
    """A fresh cgroup for one step under the ``cgroup`` mechanism, None under ``rlimit``. Raises
    :class:`~kz_runner.worker.sandbox.SandboxUnavailable` when the limits cannot be held: an
    operator's ``--job-cgroup`` that cannot be used, or a step cgroup that cannot be made."""
    guard = contain.memory_guard(c)
    why = guard.problem
    if why is None and guard.mechanism == "cgroup":
        try:
            return contain.StepCgroup(guard, "step")
        except OSError as exc:
            why = f"the step's cgroup cannot be made under {guard.parent}: {exc}"
    if why is None:
        return None
    raise sandbox.SandboxUnavailable(sandbox.SandboxReport(
        False, why, "delegate a cgroup v2 directory to the runner (systemd: Delegate=yes) or give "
        "--job-cgroup auto", "denied", mode=sandbox.mode()))


def memory_limit_hit(res: StepResult, settings: JobSettings) -> str | None:
    """Why a failed step counts as stopped at its memory limit (``MEMORY_LIMIT``), else None: its
    cgroup's ``oom_kill`` count (the kernel's word), or under the rlimit mechanism the step's own
    last words (``MemoryError``, ``bad_alloc``, ...: :data:`kz_runner.worker.contain.OOM_WORDS`)."""
    c = settings.containment
    if c.unconfined or res.ok or res.timed_out or res.cancelled:
        return None
    limit = f"{c.memory_bytes / MiB:g} MiB"
    raw = res.extra.get("limits")
    if raw is not None:
        events = json.loads(raw)
        if events.get("oom_kill", 0) > 0:
            return (f"was killed at its memory limit of {limit} (the kernel's OOM killer took "
                    f"{events['oom_kill']} process(es) in its cgroup)")
        return None
    if contain.oom_in_stderr(res.stderr_tail):
        return f"ran out of memory at its memory limit of {limit} per process (RLIMIT_DATA; its own error says so)"
    return None


def containment_facts(settings: JobSettings) -> dict[str, Any]:
    """``env.containment`` of a run: how its steps were sandboxed (the probe's findings and
    the limits), or that they were not (``unconfined``, development only)."""
    c = settings.containment
    if c.unconfined:
        return {"unconfined": True, "mode": "unconfined",
                "reason": "the runner ran with --unconfined-dev: steps ran without a sandbox"}
    report = sandbox.probe()
    devices, _ro = device_view(settings)
    limits = sandbox.SandboxSpec(cwd="/", interpreter=(), fsize_bytes=c.fsize_bytes, nproc=c.nproc,
                                 nofile=c.nofile, data_bytes=_data_limit(c)).limits()
    for step, timeout_s in (("BUILD", settings.build_timeout_s), ("BENCHMARK", settings.benchmark_timeout_s)):
        limits[f"CPU_{step}"] = sandbox.SandboxSpec(cwd="/", interpreter=(), cpu_s=c.cpu_seconds(timeout_s)).limits()["CPU"]
    return {"unconfined": False, "sandbox": "bubblewrap", "ok": report.ok, "mode": report.mode,
            "bwrap_version": report.version, "uid": c.uid, "gid": c.gid, "network": "none (own loopback only)",
            "devices": list(devices), "limits": {k: list(v) for k, v in limits.items()},
            "memory": contain.memory_guard(c).as_dict(), "pythonpath": "a read-only copy of kz_runner.bench"}


def harness_hash(lib: Path, python: str) -> str:
    """sha256 of what a job's steps run with: the staged harness library ``lib``, the
    interpreter executable of ``python`` and libpython (where the interpreter has one)."""
    paths = [str(lib), os.path.realpath(python)]
    libdir, ldlib = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    if libdir and ldlib and os.path.isfile(os.path.join(libdir, ldlib)):
        paths.append(os.path.realpath(os.path.join(libdir, ldlib)))
    return sandbox.hash_tree(paths)


@dataclass(frozen=True)
class Preflight:
    """What a runner learns before its first claim (:func:`preflight`)."""

    # the harness inputs' hash every job is compared with (JobSettings.harness_sha256)
    harness_sha256: str | None
    # None when jobs can run here; else why not, with the fix (SANDBOX_UNAVAILABLE)
    problem: str | None
    # the sandbox probe's report (None when unconfined)
    report: sandbox.SandboxReport | None = None
    # how the steps' memory and processes are held (None when unconfined)
    memory: contain.MemoryGuard | None = None


def preflight(settings: JobSettings, work_root: Path) -> Preflight:
    """Can this runner run jobs? The sandbox probe (:func:`kz_runner.worker.sandbox.probe`), then
    the harness library staged, hashed and imported by the job user in a real step sandbox, as a
    job's benchmark would: a venv or a library the job user cannot reach fails here, before any
    job is claimed, instead of failing every package's build."""
    job_dir = Path(tempfile.mkdtemp(prefix="job-preflight-", dir=work_root))
    try:
        lib = job_dir / "lib"
        harnesslib.stage(lib)
        digest = harness_hash(lib, settings.python)
        if settings.containment.unconfined:
            return Preflight(digest, None)
        report = sandbox.probe()
        if not report.ok:
            return Preflight(digest, f"{SANDBOX_UNAVAILABLE}: {report.reason} (fix: {report.fix})", report)
        guard = contain.memory_guard(settings.containment)
        if guard.problem:
            return Preflight(digest, f"{SANDBOX_UNAVAILABLE}: {guard.problem}", report, guard)
        nested = sandbox.probe_nested()  # the judge's step makes the kernel worker's sandbox itself
        if not nested.ok:
            return Preflight(digest, f"{SANDBOX_UNAVAILABLE}: {nested.reason} (fix: {nested.fix})", nested)
        for sub in ("work", "home", "tmp"):
            (job_dir / sub).mkdir()
        _hand_over(settings, job_dir)
        env = child_env(settings, job_dir)
        code = "import kz_runner.bench, sys; print('harness-library', sys.version_info[:2])"
        try:
            res = run_sandboxed([settings.python, "-c", code], settings, cwd=job_dir / "home", env=env,
                                timeout_s=PREFLIGHT_TIMEOUT_S, readonly=(lib,),
                                writable=(job_dir / "home", job_dir / "tmp"))
        except sandbox.SandboxUnavailable as exc:
            return Preflight(digest, str(exc), report)
        if not res.ok or b"harness-library" not in res.stdout:
            lines = res.stderr.decode("utf-8", "replace").strip().splitlines()
            why = res.start_error or (lines[-1] if lines else f"exit status {res.returncode}")
            return Preflight(digest, f"{SANDBOX_UNAVAILABLE}: uid {settings.containment.uid} cannot import the "
                                     f"harness library with {settings.python} in the sandbox: {why} (fix: make the "
                                     "interpreter and its site-packages readable by that uid)", report)
        return Preflight(digest, None, report, guard)
    finally:
        _rmtree(job_dir)


class _Steps:
    """Starts the two steps of one job in their sandboxes (:func:`run_sandboxed`)."""

    def __init__(self, settings: JobSettings, job_dir: Path, package_dir: Path, env: dict[str, str],
                 cancel: threading.Event | None) -> None:
        self.settings = settings
        self.job_dir = job_dir
        self.package_dir = package_dir
        self.env = env
        self.cancel = cancel

    def run(self, script: str, work: Path, timeout_s: float, pipes: channel.Pipes | None = None, *,
            work_writable: bool, worker: list[str] | None = None) -> StepResult:
        """Run one step; ``pipes`` (the benchmark's) are handed over and drained. The build writes
        ``work``; the benchmark sees it read-only (what the build made is sealed).

        ``worker`` (the kernel worker's sandbox prefix) makes it the judge's step: the benchmark
        sees ``.kernel_package/``, the inputs and expected outputs and the library, never the
        source area, and starts the kernel's worker itself in that sandbox."""
        env = dict(self.env)
        pass_fds: list[int] = []
        reads: dict[str, tuple[int, int]] = {}
        if pipes is not None:
            env.update(pipes.env())
            pass_fds.extend(pipes.child_fds)
            reads["result"] = (pipes.result_read, channel.RESULT_CAP)
        writable = [self.job_dir / "home", self.job_dir / "tmp"]
        if worker is not None:
            env.update({WORKER_SANDBOX_ENV: json.dumps(worker), WORKER_SOURCE_ENV: str(self.package_dir)})
            readonly = [self.package_dir / KP, self.job_dir / "lib"]
            readonly += [work / sub for sub in ("inputs", "expected") if (work / sub).is_dir()]
            shown_at = [(dest, src) for src, dest in worker_views(self.package_dir, work)]
        else:
            readonly = [self.job_dir / "pkg", self.job_dir / "lib"]
            (writable if work_writable else readonly).append(work)
            shown_at = []
        try:
            return run_sandboxed([self.settings.python, script, str(work)], self.settings, cwd=self.package_dir,
                                 env=env, timeout_s=timeout_s, readonly=readonly, writable=writable,
                                 pass_fds=pass_fds, reads=reads, cancel=self.cancel, nested=worker is not None,
                                 readonly_at=shown_at)
        finally:
            if pipes is not None:  # run_sandboxed closed every end it was given
                pipes.control_read = pipes.result_write = pipes.result_read = -1


def execute_job(
    package_tarball: Path,
    workdir_root: Path,
    settings: JobSettings,
    *,
    cancel: threading.Event | None = None,
) -> JobOutcome:
    """Run one job (see the module docstring); never raises for anything the package does.

    ``cancel``, when set from another thread, stops the running step (its group is
    killed) and the outcome is ``CANCELLED``.
    """
    start = time.monotonic()
    Path(workdir_root).mkdir(parents=True, exist_ok=True)
    job_dir = Path(tempfile.mkdtemp(prefix="job-", dir=workdir_root))
    redactor = Redactor(settings.secrets, job_dir)
    logs = _Logs()
    timings: dict[str, float] = {}
    facts: dict[str, Any] = {}
    tails: dict[str, str] = {}
    state: dict[str, Any] = {"kernel_id": None}

    def done(result, code, message) -> JobOutcome:
        timings["total_s"] = round(time.monotonic() - start, 6)
        if code is not None:
            logs.note(f"job failed: {code}: {message}")
        else:
            logs.note("job finished; result document captured")
        kept = job_dir if settings.keep_workdir else None
        if not settings.keep_workdir:
            _rmtree(job_dir)
        return JobOutcome(result, code, message, redactor.data(logs.value(settings.log_cap)), timings,
                          state["kernel_id"], kept, facts, tails)

    try:
        logs.note(f"runner {settings.runner_id} arch {settings.arch} gpu {settings.gpu}; job dir {job_dir}")
        t0 = time.monotonic()
        report = tarball.safe_unpack(package_tarball, job_dir / "pkg", settings.unpack_limits,
                                     expected_kernel_id=settings.kernel_id)
        timings["unpack_s"] = round(time.monotonic() - t0, 6)
        if not report.valid:
            text = "; ".join(p.render() for p in report.errors[:10])
            return done(None, UNPACK_FAILED, f"the package tarball was refused: {text}")
        package_dir = Path(report.facts["package_dir"])
        state["kernel_id"] = kernel_id = report.facts["kernel_id"]
        work = job_dir / "work"
        for sub in (work, job_dir / "home", job_dir / "tmp"):
            sub.mkdir()
        harnesslib.stage(job_dir / "lib")
        if settings.harness_sha256 is not None:
            digest = harness_hash(job_dir / "lib", settings.python)
            if digest != settings.harness_sha256:
                return done(None, HARNESS_LIBRARY_CHANGED,
                            f"the harness library or the interpreter changed since the runner started (sha256 "
                            f"{digest[:12]}, not {settings.harness_sha256[:12]}): restart the runner")
        env = child_env(settings, job_dir)
        facts["containment"] = containment_facts(settings)
        user = not settings.containment.unconfined and sandbox.mode() == "drop"
        if not settings.containment.unconfined:
            integrity.seal(job_dir / "pkg")
            _hand_over(settings, job_dir)
        contract_dir = package_dir / KP
        contract_before = integrity.snapshot(contract_dir)
        steps = _Steps(settings, job_dir, package_dir, env, cancel)

        build = steps.run(BUILD_SCRIPT, work, settings.build_timeout_s, work_writable=True)
        timings["build_s"] = round(build.duration_s, 6)
        tails["build"] = tail(build.stderr_tail, redactor)
        logs.note(_step_note(BUILD_TEST_ENV, build))
        logs.section(f"{BUILD_TEST_ENV} stderr", build.stderr, build.stderr_dropped)
        if build.stdout:
            logs.section(f"{BUILD_TEST_ENV} stdout", build.stdout, build.stdout_dropped)
        if build.cancelled:
            return done(None, CANCELLED, "stopped during build_test_env.py")
        if build.timed_out:
            return done(None, BUILD_TIMEOUT, f"build_test_env.py ran past {settings.build_timeout_s:g} s")
        memory = memory_limit_hit(build, settings)
        if memory:
            return done(None, MEMORY_LIMIT, f"build_test_env.py {memory}")
        if not build.ok:
            why = build.start_error or f"build_test_env.py exited with status {build.returncode}"
            return done(synthesize_build_failure(package_dir, kernel_id, settings, why), BUILD_FAILED, why)
        tampered = _contract_changes(contract_before, contract_dir)
        if tampered:
            return done(None, INTEGRITY_ERROR, f"the package's contract files changed during the build: {tampered}")

        sealed = integrity.snapshot(work)
        integrity.seal(work, (os.geteuid(), os.getegid()) if user else None)
        facts["integrity"] = {"files": sealed.files, "bytes": sealed.bytes, "hash_s": sealed.seconds,
                              "workers": sealed.workers}
        logs.note(f"sealed {sealed.files} file(s) of the build ({sealed.bytes} bytes) in {sealed.seconds:.3f} s")

        bench = _run_benchmark(steps, settings, job_dir, package_dir, work, env, logs, facts)
        timings["benchmark_s"] = round(bench.duration_s, 6)
        tails["benchmark"] = tail(bench.stderr_tail, redactor)
        logs.note(_step_note(BENCHMARK, bench))
        logs.section(f"{BENCHMARK} stderr", bench.stderr, bench.stderr_dropped)
        if bench.cancelled:
            return done(None, CANCELLED, "stopped during benchmark.py")
        after = integrity.snapshot(work)
        facts["integrity"]["verify_s"] = after.seconds
        changes = integrity.compare(sealed, after)
        tampered = _contract_changes(contract_before, contract_dir)
        if changes or tampered:
            if changes:
                logs.section("files build_test_env.py produced that changed during the benchmark",
                             "\n".join(changes).encode())
                message = f"files build_test_env.py produced changed during the benchmark: {integrity.describe(changes)}"
            else:
                message = f"the package's contract files changed during the benchmark: {tampered}"
            facts["result_channel"] = "harness" if bench.extra.get("result", b"").strip() else "stdout"
            return done(None, INTEGRITY_ERROR, message)
        result, code, reason = _judge_benchmark(bench, settings, logs, facts)
        if isinstance(result, dict) and "measurement" in facts:  # the runner's word, never the package's
            result["measurement"] = facts["measurement"]
        return done(result, code, reason)
    except sandbox.SandboxUnavailable as exc:  # the host's trouble: no step of the package ran
        logs.note(f"the sandbox could not be made: {exc.report.stderr or exc}")
        return done(None, SANDBOX_UNAVAILABLE, str(exc))
    except Exception as exc:  # a bug or an I/O failure of the runner host, not the package's doing
        logs.note(f"runner error: {type(exc).__name__}: {exc}")
        raise
    finally:
        if job_dir.exists() and not settings.keep_workdir:
            _rmtree(job_dir)


def _run_benchmark(steps: _Steps, settings: JobSettings, job_dir: Path, package_dir: Path, work: Path,
                   env: Mapping[str, str], logs: _Logs, facts: dict[str, Any]) -> StepResult:
    """The benchmark: the judge's step when the harness names its kernel with ``bench.kernel`` and
    imports nothing from the source area (``measurement: judged``); else, or when the judge's
    step reports that it needs the source area, the whole benchmark in one sandbox with the source
    visible, as before the judge (``measurement: unverified``: accepted, never ranked)."""
    why = harness_not_judged((package_dir / BENCHMARK_SCRIPT).read_bytes())
    if why is None:
        prefix = [] if settings.containment.unconfined else worker_prefix(
            settings, package_dir, job_dir / "lib", work, env, settings.benchmark_timeout_s)
        pipes = channel.open_pipes()
        try:
            bench = steps.run(BENCHMARK_SCRIPT, work, settings.benchmark_timeout_s, pipes, work_writable=False,
                              worker=prefix)
        finally:
            pipes.close()
        doc, _problem = channel.parse_channel(bench.extra.get("result", b""))
        if bench.cancelled or doc is None or doc.get("kind") != "unjudged":
            facts["measurement"] = "judged"
            return bench
        why = str(doc.get("reason") or "")[:500]
        logs.note(f"the judge's step needs the source area ({why}): run again with it, unverified")
        logs.section(f"{BENCHMARK} stderr (the judge's step)", bench.stderr, bench.stderr_dropped)
    else:
        logs.note(f"{BENCHMARK} is not judged ({why}): it runs with the source area, unverified")
    facts["measurement"] = "unverified"
    facts["unverified_reason"] = why
    pipes = channel.open_pipes()
    try:
        return steps.run(BENCHMARK_SCRIPT, work, settings.benchmark_timeout_s, pipes, work_writable=False)
    finally:
        pipes.close()


def _contract_changes(before: integrity.Snapshot, contract_dir: Path) -> str:
    """The changed contract files (``.kernel_package/``) as one line, "" when none changed."""
    after = integrity.snapshot(contract_dir)
    lines = set(integrity.compare(before, after))
    lines.update(f"added: {rel}" for rel in set(after.entries) - set(before.entries))
    return integrity.describe(sorted(lines))


def _judge_benchmark(bench: StepResult, settings: JobSettings, logs: _Logs,
                     facts: dict[str, Any]) -> tuple[Any, str | None, str | None]:
    """(result, failure code, message) for a finished benchmark step (not cancelled)."""
    channel_data = bench.extra.get("result", b"")
    facts["result_channel"] = "harness" if channel_data.strip() else "stdout"
    if bench.timed_out:
        logs.section("benchmark.py stdout", bench.stdout, bench.stdout_dropped)
        return None, BENCHMARK_TIMEOUT, f"benchmark.py ran past {settings.benchmark_timeout_s:g} s"
    memory = memory_limit_hit(bench, settings)
    if memory:
        logs.section("benchmark.py stdout", bench.stdout, bench.stdout_dropped)
        return None, MEMORY_LIMIT, f"benchmark.py {memory}"
    if channel_data.strip() and not bench.extra_dropped.get("result"):
        doc, _problem = channel.parse_channel(channel_data)
        if doc is not None and doc.get("kind") == "integrity":
            # The library found tampering: that is the finding, whatever the exit status.
            verdict = channel.integrity_verdict(doc)
            logs.note(verdict.note)
            logs.section("benchmark.py stdout", bench.stdout, bench.stdout_dropped)
            return None, verdict.code, verdict.message
    if not bench.ok:
        logs.section("benchmark.py stdout", bench.stdout, bench.stdout_dropped)
        why = bench.start_error or f"benchmark.py exited with status {bench.returncode}"
        if bench.returncode == -signal.SIGXCPU:
            why += " (its CPU-time limit)"
        return None, BENCHMARK_CRASHED, why
    if bench.stdout_dropped and not channel_data.strip():
        logs.section("benchmark.py stdout (offending)", bench.stdout, bench.stdout_dropped)
        return None, BAD_OUTPUT, (f"stdout is larger than the {settings.stdout_cap} byte cap "
                                  f"({len(bench.stdout) + bench.stdout_dropped} bytes)")
    verdict = channel.judge(bench.stdout, channel_data, channel_dropped=bench.extra_dropped.get("result", 0))
    facts["result_channel"] = verdict.channel
    if verdict.note:
        logs.section(f"benchmark.py {verdict.note}", bench.stdout)
    return verdict.result, verdict.code, verdict.message

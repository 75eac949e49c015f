"""The runner's containment options: the job user and the limits each step's sandbox gets.

The sandbox itself is :mod:`kz_runner.worker.sandbox` (bubblewrap, failing closed);
:func:`kz_runner.worker.job.run_sandboxed` turns these options into its
:class:`~kz_runner.worker.sandbox.SandboxSpec` for each step:

- the job user (uid/gid, 65534 by default): the real uid on the host when the runner
  is root (``drop`` mode), the uid inside a user namespace otherwise (``userns``);
- ``RLIMIT_CPU`` (the step's timeout plus :data:`CPU_SLACK_S`, per process),
  ``RLIMIT_FSIZE`` (largest file a step may write), ``RLIMIT_NPROC`` (processes of
  the job's uid), ``RLIMIT_NOFILE``, ``RLIMIT_CORE=0``;
- the memory limit (:data:`DEFAULT_MEMORY`, ``kz runner --job-memory``) and the process
  count, held by one of two mechanisms (:func:`memory_guard`, named in the runner's start
  line and in every run's ``env.containment.memory``):

  * ``cgroup``: each step runs in a child cgroup of its own under a cgroup v2 directory the
    runner owns (``--job-cgroup``: ``auto`` takes the runner's own cgroup when it was
    delegated to it, as systemd's ``Delegate=yes`` does; the runner moves itself into a leaf
    ``runner/`` beside the jobs'). The child has ``memory.max`` = the limit,
    ``memory.swap.max`` = 0, ``memory.oom.group`` = 1 and ``pids.max`` = ``nproc`` (where the
    pids controller is offered; ``RLIMIT_NPROC`` holds in every case); a step
    past its memory is killed whole by the kernel's OOM killer and ``memory.events``'
    ``oom_kill`` says so (``MEMORY_LIMIT``), which no package output can forge. The whole
    tree (tmpfs pages of its ``/tmp`` included) counts, and ``cgroup.kill`` ends whatever is
    left when the step ends.
  * ``rlimit`` (no delegated cgroup, or ``--job-cgroup none``): ``RLIMIT_DATA`` = the limit
    per process (heap and private writable mappings: an allocation past it fails) and
    ``RLIMIT_NPROC`` for processes. ``RLIMIT_AS`` is never used for memory: CUDA reserves
    far more address space than it uses and fails under it, while ``RLIMIT_DATA`` leaves
    its ``PROT_NONE`` reservations and the driver's shared mappings alone (measured on an
    H200: CuPy allocates and runs kernels under ``RLIMIT_DATA`` = 1 GiB, and a 2 GiB host
    array is refused). Weaker than the cgroup: per process, not per job, and the verdict
    ``MEMORY_LIMIT`` comes from the step's own error (``MemoryError``, ``bad_alloc``,
    ``Cannot allocate memory``).

  Missing cgroup is the fallback above, never an unlimited run. A ``--job-cgroup DIR`` the
  operator named that cannot be used refuses every job (``SANDBOX_UNAVAILABLE``): an
  explicit choice is never replaced by a weaker one. In both mechanisms each step's
  ``oom_score_adj`` is 1000, so a host- or pod-wide OOM takes a job before the runner.

``unconfined`` is the one way to run steps without a sandbox: a development switch
(``kz runner --unconfined-dev``), never for untrusted packages. Every run made that
way says so in its ``env.containment`` (``"unconfined": true``), and the daemon never
accepts such a run (``UNCONFINED_RUN``).
"""
from __future__ import annotations

import errno
import grp
import math
import os
import pwd
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GiB = 1024 ** 3
NOBODY = 65534
DEFAULT_FSIZE = 8 * GiB
DEFAULT_NPROC = 4096
DEFAULT_NOFILE = 4096
# Memory a step may use (all its processes, with its /tmp and /dev/shm pages, under a cgroup;
# each process's data segment under the rlimit fallback).
DEFAULT_MEMORY = 16 * GiB
# Below this no interpreter starts: a smaller limit is a mistake, refused at start.
MIN_MEMORY = 64 * 1024 ** 2
# "auto": the runner's own cgroup when delegated to it; "none": the rlimit fallback; else a path
DEFAULT_CGROUP = "auto"
CGROUP_MOUNT = "/sys/fs/cgroup"
# The leaf the runner moves itself into, so its cgroup may hand memory and pids to the jobs'.
RUNNER_LEAF = "runner"
# Extra CPU seconds past the step's timeout before SIGXCPU (SIGKILL follows 5 s later).
CPU_SLACK_S = 5


@dataclass(frozen=True)
class Containment:
    """The runner's containment options (``kz runner --job-user/--job-fsize/--job-nproc``)."""

    # True: run the steps directly, as the runner's user, with no sandbox (development only;
    # the runs are marked unconfined and never accepted)
    unconfined: bool = False
    # the job's uid/gid inside the sandbox (never 0)
    uid: int = NOBODY
    gid: int = NOBODY
    # RLIMIT_FSIZE in bytes
    fsize_bytes: int = DEFAULT_FSIZE
    # RLIMIT_NPROC (processes of the job's uid)
    nproc: int = DEFAULT_NPROC
    # RLIMIT_NOFILE
    nofile: int = DEFAULT_NOFILE
    # bytes of memory a step may use (memory.max under a cgroup, RLIMIT_DATA otherwise)
    memory_bytes: int = DEFAULT_MEMORY
    # where the steps' cgroups are made: "auto", "none" or a cgroup v2 directory (:func:`memory_guard`)
    cgroup: str = DEFAULT_CGROUP

    def __post_init__(self) -> None:
        if self.memory_bytes < MIN_MEMORY:
            raise ValueError(f"the job memory limit must be at least {MIN_MEMORY} bytes (64 MiB), "
                             f"not {self.memory_bytes}")
        if self.cgroup not in ("auto", "none") and not os.path.isabs(self.cgroup):
            raise ValueError(f"--job-cgroup is auto, none or an absolute path, not {self.cgroup!r}")

    def cpu_seconds(self, timeout_s: float) -> int:
        """RLIMIT_CPU for a step with this wall-clock timeout."""
        return int(math.ceil(timeout_s)) + CPU_SLACK_S


UNCONFINED = Containment(unconfined=True)


def parse_user(text: str) -> tuple[int, int]:
    """``"65534"``, ``"65534:65534"``, ``"nobody"`` or ``"nobody:nogroup"`` as (uid, gid).

    Raises ValueError for an unknown name or uid 0.
    """
    user, _, group = text.partition(":")
    if user.isdigit():
        uid = gid = int(user)  # a group given below replaces the gid
    else:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise ValueError(f"no such user {user!r}") from None
        uid, gid = entry.pw_uid, entry.pw_gid
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            try:
                gid = grp.getgrnam(group).gr_gid
            except KeyError:
                raise ValueError(f"no such group {group!r}") from None
    if uid == 0 or gid == 0:
        raise ValueError("the job user must not be root")
    return uid, gid


# --- the memory limit -----------------------------------------------------------------

# What the rlimit mechanism reads as "the step ran out of memory" in a failed step's stderr tail.
OOM_WORDS = (b"MemoryError", b"std::bad_alloc", b"Cannot allocate memory", b"out of memory")


@dataclass(frozen=True)
class MemoryGuard:
    """How the memory limit and the process count are held for this runner's steps."""

    # "cgroup" or "rlimit"; "" when it cannot be held at all (``problem`` says why)
    mechanism: str
    # bytes a step may use
    limit_bytes: int
    # processes a step may have (pids.max; RLIMIT_NPROC in both mechanisms)
    pids_max: int
    # the cgroup v2 directory the steps' cgroups are made in ("cgroup" only)
    parent: str | None = None
    # why this mechanism (why no cgroup, for "rlimit")
    why: str = ""
    # not None: no step may run (an operator's --job-cgroup that cannot be used)
    problem: str | None = None
    # the steps' cgroups also hold pids.max (the pids controller is there); RLIMIT_NPROC holds always
    pids_cgroup: bool = False

    def as_dict(self) -> dict[str, Any]:
        """``env.containment.memory``: the mechanism, the limit and why."""
        return {"mechanism": self.mechanism, "limit_bytes": self.limit_bytes, "pids_max": self.pids_max,
                "pids": "cgroup and rlimit" if self.pids_cgroup else "rlimit", "cgroup": self.parent, "why": self.why}


def _read(path: Path) -> str:
    return path.read_text(encoding="ascii", errors="replace")


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def own_cgroup(proc_cgroup: str = "/proc/self/cgroup", mount: str = CGROUP_MOUNT) -> Path | None:
    """This process's cgroup v2 directory (the ``0::`` line under a cgroup2 mount), or None on a
    host without the unified hierarchy there (cgroup v1 or hybrid without controllers)."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    rel = next((ln[3:] for ln in lines if ln.startswith("0::")), None)
    if rel is None or not os.path.isfile(os.path.join(mount, "cgroup.controllers")):
        return None
    return Path(mount + (rel if rel != "/" else ""))


def _delegated(path: Path) -> bool:
    """Whether ``path`` was handed to this process to manage: owned by its (non-root) uid, as
    systemd's ``Delegate=yes`` with ``User=`` leaves it, or marked with systemd's delegate xattr."""
    try:
        if os.geteuid() != 0 and os.stat(path).st_uid == os.geteuid():
            return True
    except OSError:
        return False
    for name in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(path, name).strip() == b"1":
                return True
        except OSError:
            continue
    return False


def prepare_cgroup(path: Path) -> tuple[str | None, bool]:
    """Make ``path`` a parent for the steps' cgroups: the memory controller (and pids, where
    offered) enabled for its children. When this process sits in ``path`` itself (a delegated
    service cgroup), it moves into the leaf :data:`RUNNER_LEAF` first (cgroup v2 gives controllers
    to children only of a cgroup without processes). ``(None, pids enabled)`` when ready, else
    ``(why not, False)``."""
    try:
        available = set(_read(path / "cgroup.controllers").split())
        if "memory" not in available:
            return f"{path} does not offer the memory controller (it has {sorted(available)})", False
        wanted = {"memory", "pids"} & available
        enabled = set(_read(path / "cgroup.subtree_control").split())
        if not wanted <= enabled:
            if str(os.getpid()) in _read(path / "cgroup.procs").split():
                leaf = path / RUNNER_LEAF
                leaf.mkdir(exist_ok=True)
                _write(leaf / "cgroup.procs", str(os.getpid()))
            _write(path / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(wanted)))
        return None, "pids" in wanted
    except OSError as exc:
        why = "other processes share it" if exc.errno == errno.EBUSY else exc.strerror
        return f"{path} cannot give the memory controller to child cgroups: {why}", False


_GUARDS: dict[tuple, MemoryGuard] = {}
_GUARD_LOCK = threading.Lock()


def memory_guard(c: Containment, *, refresh: bool = False) -> MemoryGuard:
    """The mechanism holding ``c``'s memory limit on this host (the module docstring), found once
    per process: ``cgroup`` when ``c.cgroup`` names a usable cgroup v2 directory or is ``auto``
    and the runner's own cgroup is delegated to it; otherwise ``rlimit``, except that a
    directory named explicitly that cannot be used is a ``problem`` (no job runs)."""
    key = (c.cgroup, c.memory_bytes, c.nproc)
    with _GUARD_LOCK:
        if refresh or key not in _GUARDS:
            _GUARDS[key] = _find_guard(c)
        return _GUARDS[key]


def _find_guard(c: Containment) -> MemoryGuard:
    def rlimit(why: str) -> MemoryGuard:
        return MemoryGuard("rlimit", c.memory_bytes, c.nproc, None, why)

    if c.cgroup == "none":
        return rlimit("cgroups not used (--job-cgroup none)")
    if c.cgroup != "auto":
        path = Path(c.cgroup)
        problem, pids = (None, False) if (path / "cgroup.controllers").is_file() else (
            f"{path} is not a cgroup v2 directory", False)
        if problem is None:
            problem, pids = prepare_cgroup(path)
        if problem:
            return MemoryGuard("", c.memory_bytes, c.nproc, str(path), "--job-cgroup",
                               f"the job cgroup cannot be used: {problem} (fix: delegate it to the runner's user, "
                               "e.g. Delegate=yes in its systemd unit, or give --job-cgroup auto)")
        return MemoryGuard("cgroup", c.memory_bytes, c.nproc, str(path), "--job-cgroup", pids_cgroup=pids)
    own = own_cgroup()
    if own is None:
        return rlimit("no cgroup v2 hierarchy at /sys/fs/cgroup")
    if own.name == RUNNER_LEAF and _delegated(own.parent):  # moved there already (an earlier guard)
        own = own.parent
    if own == Path(CGROUP_MOUNT) or not _delegated(own):
        return rlimit(f"the runner's cgroup {own} is not delegated to it (systemd: Delegate=yes)")
    problem, pids = prepare_cgroup(own)
    if problem:
        return rlimit(problem)
    return MemoryGuard("cgroup", c.memory_bytes, c.nproc, str(own), "the runner's delegated cgroup", pids_cgroup=pids)


class StepCgroup:
    """One step's cgroup: made with its limits, entered by the step's first program
    (:meth:`enter_argv`), read (:meth:`events`) and removed with anything left in it (:meth:`close`)."""

    _count = 0
    _count_lock = threading.Lock()

    def __init__(self, guard: MemoryGuard, label: str) -> None:
        if guard.mechanism != "cgroup" or guard.parent is None:
            raise ValueError("a step cgroup needs the cgroup mechanism")
        with StepCgroup._count_lock:
            StepCgroup._count += 1
            n = StepCgroup._count
        self.path = Path(guard.parent) / f"kz-{label}-{os.getpid()}-{n}"
        self.path.mkdir()
        try:
            _write(self.path / "memory.max", str(guard.limit_bytes))
            if (self.path / "memory.swap.max").exists():  # absent without swap accounting
                _write(self.path / "memory.swap.max", "0")
            _write(self.path / "memory.oom.group", "1")
            if guard.pids_cgroup:
                _write(self.path / "pids.max", str(guard.pids_max))
        except BaseException:
            self.path.rmdir()
            raise

    def enter_argv(self) -> list[str]:
        """The argv prefix that moves the step's first process into this cgroup (so everything it
        starts is in it too) and raises its ``oom_score_adj``, then becomes the rest of the argv.
        A process that cannot enter never runs the rest (exit 125, a ``kz-cgroup:`` line)."""
        return ["/bin/sh", "-c", 'echo 1000 > /proc/self/oom_score_adj 2>/dev/null; '
                'echo 0 > "$0/cgroup.procs" || { echo "kz-cgroup: cannot enter $0" >&2; exit 125; }; exec "$@"',
                str(self.path)]

    def events(self) -> dict[str, int]:
        """``oom_kill`` (processes the OOM killer took in this cgroup), ``pids_max`` (forks refused
        at pids.max) and ``memory_peak`` (bytes, where the kernel keeps it; else 0)."""
        out = {"oom_kill": 0, "pids_max": 0, "memory_peak": 0}
        for name, key, field_ in (("memory.events", "oom_kill", "oom_kill"), ("pids.events", "pids_max", "max")):
            try:
                for line in _read(self.path / name).splitlines():
                    word, _, value = line.partition(" ")
                    if word == field_:
                        out[key] = int(value)
            except (OSError, ValueError):
                pass
        try:
            out["memory_peak"] = int(_read(self.path / "memory.peak").strip())
        except (OSError, ValueError):
            pass
        return out

    def close(self, wait_s: float = 10.0) -> None:
        """Kill whatever is left in the cgroup (``cgroup.kill``; SIGKILL to each process on a kernel
        without it) and remove it."""
        end = time.monotonic() + wait_s
        while True:
            try:
                procs = _read(self.path / "cgroup.procs").split()
            except FileNotFoundError:
                return
            if not procs:
                break
            if (self.path / "cgroup.kill").exists():
                _write(self.path / "cgroup.kill", "1")
            else:
                for pid in procs:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
            if time.monotonic() > end:
                break
            time.sleep(0.02)
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > end:
                    raise
                time.sleep(0.02)


def oom_in_stderr(tail: bytes) -> bool:
    """The rlimit mechanism's verdict: the failed step's own last words say it ran out of memory."""
    return any(word in tail[-4096:] for word in OOM_WORDS)

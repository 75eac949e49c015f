"""systemd/: the units verify without a warning, and sysusers/tmpfiles apply to a scratch root."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SYSTEMD = Path(__file__).resolve().parent.parent / "systemd"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        pytest.skip(f"{name} is not installed here (apt-get install systemd to run this check)")
    return path


def _unit(name: str) -> dict[str, list[str]]:
    """``Section.Key`` -> every value (repeatable keys keep all of theirs)."""
    found: dict[str, list[str]] = {}
    section = ""
    for raw in (SYSTEMD / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return found


def test_systemd_analyze_verify_has_no_warnings(tmp_path):
    analyze = _tool("systemd-analyze")
    for unit in ("kz-daemon.service", "kz-runner@.service"):
        shutil.copy(SYSTEMD / unit, tmp_path / unit)
    # A template is verified through an instance; systemd finds the template beside it.
    proc = subprocess.run([analyze, "verify", "--man=no", str(tmp_path / "kz-daemon.service"),
                           str(tmp_path / "kz-runner@0.service")], capture_output=True, text=True, timeout=120)
    output = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0 and output == "", output


def test_verify_does_catch_a_bad_unit(tmp_path):
    """The check above is meaningful: an unknown key is reported."""
    analyze = _tool("systemd-analyze")
    bad = tmp_path / "kz-bad.service"
    bad.write_text((SYSTEMD / "kz-daemon.service").read_text().replace("[Service]\n", "[Service]\nProtectSystm=strict\n"))
    proc = subprocess.run([analyze, "verify", "--man=no", str(bad)], capture_output=True, text=True, timeout=120)
    assert "ProtectSystm" in proc.stdout + proc.stderr


def test_daemon_unit_is_notify_watchdog_and_hardened():
    u = _unit("kz-daemon.service")
    assert u["Service.Type"] == ["notify"]
    assert int(u["Service.WatchdogSec"][0]) > 0
    assert u["Service.Restart"] == ["on-failure"]
    assert u["Service.User"] == ["kz"]
    assert "kz daemon --state-dir /var/lib/kz" in u["Service.ExecStart"][0]
    for key, value in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("PrivateTmp", "yes"),
                       ("ProtectHome", "yes"), ("PrivateDevices", "yes")]:
        assert u[f"Service.{key}"] == [value], key
    assert u["Service.ReadWritePaths"] == ["/var/lib/kz"]


def test_runner_unit_is_one_per_gpu_with_gpu_devices_and_no_token():
    u = _unit("kz-runner@.service")
    start = u["Service.ExecStart"][0]
    assert "kz runner --gpu %i" in start and "--token" not in start
    assert u.get("Service.PrivateDevices") == ["no"]
    allowed = " ".join(u["Service.DeviceAllow"])
    assert "nvidia" in allowed and "/dev/kfd" in allowed and "char-drm" in allowed
    assert u["Service.KillMode"] == ["mixed"]
    assert u["Service.User"] == ["kz-runner"] and u["Service.NoNewPrivileges"] == ["yes"]
    assert u["Service.EnvironmentFile"] == ["/etc/kz/runner.env"]
    text = (SYSTEMD / "kz-runner@.service").read_text()
    assert "KZ_RUNNER_TOKEN=" not in "".join(ln for ln in text.splitlines() if not ln.startswith("#"))


def test_sysusers_and_tmpfiles_apply_to_a_scratch_root(tmp_path):
    sysusers = _tool("systemd-sysusers")
    tmpfiles = _tool("systemd-tmpfiles")
    (tmp_path / "etc").mkdir()
    for name in ("passwd", "group", "shadow", "gshadow"):
        (tmp_path / "etc" / name).touch()
    proc = subprocess.run([sysusers, f"--root={tmp_path}", str(SYSTEMD / "kz.sysusers")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    passwd = (tmp_path / "etc" / "passwd").read_text()
    group = (tmp_path / "etc" / "group").read_text()
    assert passwd.count("\nkz:") + passwd.startswith("kz:") == 1 and "\nkz-runner:" in "\n" + passwd
    assert any(line.startswith("video:") and "kz-runner" in line for line in group.splitlines())
    if os.geteuid() != 0:
        pytest.skip("systemd-tmpfiles --create chowns; needs root")
    proc = subprocess.run([tmpfiles, f"--root={tmp_path}", "--create", str(SYSTEMD / "kz.tmpfiles")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    inbox = tmp_path / "var/lib/kz/spool/inbox"
    assert inbox.is_dir() and (inbox.stat().st_mode & 0o7777) == 0o2770
    assert ((tmp_path / "var/lib/kz").stat().st_mode & 0o777) == 0o750


def _daemon_speaks_sd_notify() -> bool:
    """Whether `kz daemon` serves through kz_daemon.http.serve (HTTP + sd_notify) yet."""
    source = (SYSTEMD.parent / "kz_daemon" / "commands" / "daemon.py").read_text()
    return "serve_config" in source


@pytest.mark.xfail(not _daemon_speaks_sd_notify(), run=False,
                   reason="kz daemon does not serve HTTP nor speak sd_notify yet; it should run "
                          "kz_daemon.http.serve.serve_config like kz up does (checked by reading its source; runs once it does)")
def test_the_daemon_units_command_says_ready_and_pings_the_watchdog(tmp_path):
    """Type=notify + WatchdogSec need READY=1 and WATCHDOG=1 from the ExecStart command."""
    import shlex
    import socket
    import sys
    import time

    start = _unit("kz-daemon.service")["Service.ExecStart"][0]
    argv = shlex.split(start.replace("/var/lib/kz", str(tmp_path / "state")))
    assert argv[:3] == ["/usr/bin/env", "kz", "daemon"]
    (tmp_path / "state").mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "state" / "kz.yaml").write_text(f"http:\n  host: 127.0.0.1\n  port: {port}\n")
    sock_path = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(sock_path)
    listener.settimeout(1.0)
    env = {k: v for k, v in os.environ.items()}
    env.update(NOTIFY_SOCKET=sock_path, WATCHDOG_USEC="2000000")
    proc = subprocess.Popen([sys.executable, "-m", "kz_daemon", *argv[2:]], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen: set[str] = set()
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and not {"READY=1", "WATCHDOG=1"} <= seen and proc.poll() is None:
            try:
                seen.update(listener.recv(4096).decode().split("\n"))
            except TimeoutError:
                pass
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
        listener.close()
    assert {"READY=1", "WATCHDOG=1"} <= seen, (seen, err.decode(errors="replace")[-2000:])


def test_runner_unit_lets_the_job_sandbox_make_its_namespaces_and_proc():
    """bwrap needs these namespaces, and the kernel refuses a fresh /proc in a user namespace
    while parts of the unit's /proc are mounted over (ProtectKernelTunables/Logs)."""
    u = _unit("kz-runner@.service")
    assert set(u["Service.RestrictNamespaces"][0].split()) == {"user", "mnt", "pid", "net", "ipc", "uts", "cgroup"}
    assert "Service.ProtectKernelTunables" not in u and "Service.ProtectKernelLogs" not in u


def test_runner_unit_gives_the_sandbox_what_it_needs_and_nothing_more():
    """The job sandbox's needs: user namespaces (the runner is not root), the unit's cgroup delegated
    (each step's memory.max and pids.max), /sys/fs/cgroup writable for that; and no privilege
    besides: no capabilities, no_new_privs, not root, a task limit on the whole unit."""
    u = _unit("kz-runner@.service")
    assert {"memory", "pids"} <= set(u["Service.Delegate"][0].split())
    assert u.get("Service.ProtectControlGroups", ["no"]) == ["no"]  # "yes" makes the delegated cgroup read-only
    assert "user" in u["Service.RestrictNamespaces"][0].split() and "Service.PrivateUsers" not in u
    assert u["Service.User"] == ["kz-runner"] and u["Service.NoNewPrivileges"] == ["yes"]
    assert u["Service.CapabilityBoundingSet"] == [""] and u["Service.AmbientCapabilities"] == [""]
    assert int(u["Service.TasksMax"][0]) > 0
    assert "--unconfined-dev" not in u["Service.ExecStart"][0] and "--job-cgroup none" not in u["Service.ExecStart"][0]

"""Containment of a job's steps: who they run as, what they may reach, what limits hold.

Both steps (``build_test_env.py`` and ``benchmark.py``) start through
:mod:`kz_runner.worker.launcher`, which applies, best effort and in this order:

- a new network namespace (``unshare(CLONE_NEWNET)``; without the privilege, inside
  a new user namespace where the kernel allows one): no route to anything but the
  namespace's own loopback, so nothing on the host's 127.0.0.1 or the network;
- resource limits: ``RLIMIT_CPU`` (the step's timeout, per process),
  ``RLIMIT_FSIZE`` (largest file a step may write), ``RLIMIT_NPROC`` (processes of
  the job's user; the kernel does not enforce it for root), ``RLIMIT_CORE=0``;
- an unprivileged user when the runner runs as root (uid/gid from
  :class:`Containment`, 65534 by default), no supplementary groups, ``no_new_privs``.

The job directory holds the step's cwd (``work/``), ``HOME`` (``home/``) and ``TMPDIR``
(``tmp/``); with a user drop the directory itself stays the runner's, listable by the
job's group only (mode 0750), those three folders are the job user's (mode 0700), and
the package files and the staged library stay owned by the runner and read-only. What "cannot leave it" means here: the
step cannot write outside it where the filesystem's permissions stop the job's
user (a world-writable ``/tmp`` or ``/dev/shm`` stays writable); it can still read
whatever the job's user may read. There is no mount namespace.

A drop to the job's user is only asked for when that user can actually run the
interpreter and reach the job directory (a probe through the launcher, before the
build); otherwise the steps run as the runner's user and the reason is recorded.
Every measure's outcome goes into ``env.containment``: a list of
``{"measure", "applied", "detail"|"reason"}``.
"""
from __future__ import annotations

import grp
import json
import math
import os
import pwd
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kz_runner.worker import launcher as _launcher

GiB = 1024 ** 3
NOBODY = 65534
DEFAULT_FSIZE = 8 * GiB
DEFAULT_NPROC = 4096
# Extra CPU seconds past the step's timeout before SIGXCPU, and again before SIGKILL.
CPU_SLACK_S = 5
LAUNCHER = str(Path(_launcher.__file__).resolve())
PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Containment:
    """Which measures to ask for (the runner's options)."""

    # False: run the steps directly, as the runner's user, with no limits (the old behaviour)
    enabled: bool = True
    # ask for a new network namespace
    network: bool = True
    # the job's uid/gid when the runner runs as root; None: keep the runner's user
    uid: int | None = NOBODY
    gid: int | None = NOBODY
    # RLIMIT_FSIZE in bytes
    fsize_bytes: int = DEFAULT_FSIZE
    # RLIMIT_NPROC (processes of the job's user, all of them on the host)
    nproc: int = DEFAULT_NPROC

    def wants_user(self) -> bool:
        """True when a drop to another user is asked for and possible (the runner is root)."""
        return self.enabled and self.uid is not None and os.geteuid() == 0 and self.uid != 0


OFF = Containment(enabled=False)


def parse_user(text: str) -> tuple[int, int]:
    """``"65534"``, ``"65534:65534"``, ``"nobody"`` or ``"nobody:nogroup"`` as (uid, gid).

    Raises ValueError for an unknown name or uid 0.
    """
    user, _, group = text.partition(":")
    if user.isdigit():
        uid = int(user)
        gid = int(user) if not group else None
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


def spec(c: Containment, *, timeout_s: float, report_fd: int | None, user: bool) -> dict[str, Any]:
    """The launcher's spec for one step (``user``: drop to the job's user)."""
    cpu = int(math.ceil(timeout_s)) + CPU_SLACK_S
    limits = {"CPU": [cpu, cpu + CPU_SLACK_S], "FSIZE": [c.fsize_bytes, c.fsize_bytes], "CORE": [0, 0],
              "NPROC": [c.nproc, c.nproc]}
    return {"network": c.network, "uid": c.uid if user else None, "gid": c.gid if user else None,
            "limits": limits, "report_fd": report_fd}


def wrap(argv: list[str], step_spec: dict[str, Any]) -> list[str]:
    """``argv`` started through the launcher (itself run by this interpreter, isolated)."""
    return [sys.executable, "-I", "-S", LAUNCHER, json.dumps(step_spec, separators=(",", ":")), *argv]


def probe_user(c: Containment, python: str, job_dir: Path, env: dict[str, str]) -> str | None:
    """None when the job's user can run ``python`` and list ``job_dir`` (already its own);
    else why not (the launcher's or the interpreter's complaint)."""
    code = "import os, sys; os.listdir(sys.argv[1])"
    argv = wrap([python, "-c", code, str(job_dir)], spec(c, timeout_s=PROBE_TIMEOUT_S, report_fd=None, user=True))
    try:
        done = subprocess.run(argv, cwd=str(job_dir), env=env, capture_output=True, timeout=PROBE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"probe failed: {type(exc).__name__}: {exc}"
    if done.returncode == 0:
        return None
    lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
    return f"uid {c.uid} cannot run {python} in the job directory: " + (lines[-1] if lines else
                                                                       f"exit status {done.returncode}")


def merge(reports: list[list[dict[str, Any]]], extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One ``env.containment`` list from the steps' launcher reports and the runner's own facts:
    a measure counts as applied only when every step that ran had it."""
    merged: dict[str, dict[str, Any]] = {}
    for report in reports:
        for entry in report:
            name = str(entry.get("measure"))
            seen = merged.get(name)
            if seen is None or (seen.get("applied") and not entry.get("applied")):
                merged[name] = dict(entry)
    return [*extra, *merged.values()]


def parse_report(data: bytes) -> list[dict[str, Any]] | None:
    """The launcher's report, None when it sent none (it failed before writing it)."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return [e for e in doc if isinstance(e, dict)] if isinstance(doc, list) else None

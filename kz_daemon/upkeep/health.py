"""What is broken right now: the event store, disk headroom, the local runner's supervision.

``/healthz`` (alive) and ``/readyz`` (ready to take work) answer from :func:`report`.
Each check is ``{"ok": bool, "reason": str | None, ...facts}``. Liveness fails only
for what a restart fixes (a store that cannot recover in-process, ``StoreBroken``);
readiness fails for anything that stops work being taken now: the daemon starting
or draining, a store whose last commit failed (until a write succeeds again), a
disk below its headroom, a local runner that keeps dying.

The headroom guard (:func:`check_headroom`) refuses an upload with ``503
STORAGE_FULL`` before the disk is full, so the uploads that are taken can still be
logged, judged and committed.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kz_daemon.config.ports import Daemon, Service
from kz_daemon.config.settings import Config
from kz_daemon.core.errors import ZooError
from kz_daemon.upkeep.supervise import Supervisor

#: seconds a client is told to wait before retrying after STORAGE_FULL
RETRY_AFTER_S = 30


def headroom(path: Path, min_free_bytes: int, min_free_percent: float,
             label: str = "the state directory's disk") -> dict[str, Any]:
    """Free space of the file system holding ``path`` against the configured headroom.

    The threshold is the smaller of ``min_free_bytes`` and ``min_free_percent`` of the
    file system's size (a small disk is not held to 512 MiB); either at 0 turns the
    guard off. ``label`` names the disk in the reason.
    """
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    size = st.f_blocks * st.f_frsize
    need = 0
    if min_free_bytes > 0 and min_free_percent > 0:
        need = int(min(min_free_bytes, size * min_free_percent / 100.0))
    ok = free >= need
    return {"ok": ok, "free_bytes": free, "size_bytes": size, "min_free_bytes": need,
            "reason": None if ok else f"{free} bytes free on {label}, below the headroom of {need} bytes"}


#: the folders the daemon writes, by config.paths field, and how a reason names their disk
_WRITTEN = (("events", "the event log's disk"), ("repo", "the kernel repo's disk"),
            ("spool", "the spool's disk"), ("pending", "the pending store's disk"))


def disks(config: Config) -> dict[str, Any]:
    """Headroom of every file system the daemon writes: the state directory's, and the
    event log's, repo's, spool's or pending store's where an operator mounted them apart.

    The figures of the first disk below its headroom (else the state directory's),
    ``ok`` for all of them, and ``filesystems``: one entry per file system, named by
    its first folder. OSError when the state directory cannot be read.
    """
    limits = config.limits
    found: list[dict[str, Any]] = []
    devices = {os.stat(config.state_dir).st_dev}
    found.append({"folder": "state_dir", **headroom(config.state_dir, limits.min_free_bytes,
                                                    limits.min_free_percent)})
    for name, label in _WRITTEN:
        path = getattr(config.paths, name)
        try:
            device = os.stat(path).st_dev
        except FileNotFoundError:  # not made yet: nothing is written there
            continue
        if device not in devices:
            devices.add(device)
            found.append({"folder": name, **headroom(path, limits.min_free_bytes, limits.min_free_percent, label)})
    bad = [d for d in found if not d["ok"]]
    return {**(bad or found)[0], "ok": not bad, "filesystems": found}


def storage_full(what: str) -> ZooError:
    """The error for a full disk or quota: 503 STORAGE_FULL, retry later."""
    return ZooError("STORAGE_FULL",
                    f"the server's disk is full ({what}); nothing was recorded: retry in a while "
                    "(the operator has been told)", {"retry_after_s": RETRY_AFTER_S})


def check_headroom(zoo: Daemon) -> None:
    """Raise STORAGE_FULL when a disk the daemon writes (:func:`disks`) is below its headroom."""
    disk = disks(zoo.config)
    if not disk["ok"]:
        raise storage_full(disk["reason"])


def store_check(zoo: Daemon) -> dict[str, Any]:
    """The event store's own health (``Store.health()``) as a check."""
    health = zoo.store.health()
    reason = None
    if health["broken"]:
        reason = "the event store is broken and refuses every write: restart the daemon"
    elif health["closed"]:
        reason = "the event store is closed"
    elif not health["ok"]:
        last = health.get("last_error") or {}
        word = "full" if last.get("full") else "failing"
        reason = (f"the event log's disk is {word}: the last write failed ({last.get('code')}: "
                  f"{last.get('message')}); it recovers by itself once a write succeeds")
    return {"ok": reason is None, "reason": reason, **health}


def report(zoo: Service, supervisor: Supervisor | None = None, draining: bool = False) -> dict[str, Any]:
    """Every check and the verdicts: ``{"alive", "ready", "reasons", "checks"}``.

    ``supervisor``: the local runner child's (``kz up``), None without one.
    """
    checks: dict[str, dict[str, Any]] = {}
    started = zoo.started and not draining
    checks["daemon"] = {"ok": started,
                        "reason": None if started else "the daemon is starting or shutting down"}
    checks["store"] = store_check(zoo)
    try:
        checks["disk"] = disks(zoo.config)
    except OSError as exc:
        checks["disk"] = {"ok": False, "reason": f"cannot stat the state directory: {exc.strerror}"}
    if supervisor is not None:
        checks["runner"] = supervisor.health()
    reasons = [f"{name}: {check['reason']}" for name, check in checks.items() if not check["ok"]]
    alive = not checks.get("store", {}).get("broken", False)
    return {"alive": alive, "ready": not reasons, "reasons": reasons, "checks": checks}

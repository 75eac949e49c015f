"""Bounded retention of rejected uploads: ``spool/rejected/<uuid>/`` (``retention:`` in kz.yaml).

A rejected upload leaves its tarball (``package.tar.gz``, up to the upload cap) and its
``reason.json`` (a few KiB: the codes and messages the submitter was shown). Anyone
can upload, so without a bound the tarballs alone could fill the disk. Each sweep
(the daemon's retention sweep: once at start, then every ``sweep_interval_s``):

- tarballs: the newest are kept while all three bounds hold: at most
  ``rejected_keep`` of them, at most ``rejected_max_bytes`` together, none older than
  ``rejected_days``; every other tarball is removed (0 turns a bound off);
- ``reason.json`` outlives its tarball: the folder goes whole only after
  ``rejected_reason_days`` (0 keeps it forever), so an operator can still read why
  an upload was refused long after its bytes are gone;
- only folders whose submission is in the event log are touched (a rejection written
  but not logged yet is intake recovery's to finish); the event log is never pruned.

A folder is removed by renaming it to a ``.gc-`` name first (intake recovery and every
reader skip names that are not uuids), so a reader sees it whole or not at all.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from kz_daemon.config.settings import Config
from kz_daemon.intake.spool import is_uuid
from kz_daemon.storage.pending import PACKAGE_FILE
from kz_daemon.upkeep.prune_runs import DAY_S, TRASH_PREFIX, Removal, remove, tree_size

REASON_FILE = "reason.json"


def plan(config: Config, logged: Callable[[str], bool], now: float) -> list[Removal]:
    """What the bounds let go of at ``now`` (epoch seconds): whole folders first, then tarballs."""
    keep = config.retention
    root = config.spool_rejected
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    folders: list[Removal] = []
    tarballs: list[tuple[float, Path, int, str]] = []  # (rejected at, path, bytes, uuid)
    for name in names:
        folder = root / name
        if name.startswith(TRASH_PREFIX) and folder.is_dir():
            folders.append(Removal(folder, tree_size(folder), "", "leftover"))
            continue
        if not is_uuid(name) or not logged(name) or not folder.is_dir() or folder.is_symlink():
            continue
        reason = folder / REASON_FILE
        try:
            rejected_at = (reason if reason.exists() else folder).stat().st_mtime
        except FileNotFoundError:
            continue
        age_days = (now - rejected_at) / DAY_S
        if keep.rejected_reason_days > 0 and age_days > keep.rejected_reason_days:
            folders.append(Removal(folder, tree_size(folder), name, "rejected entry"))
            continue
        tarball = folder / PACKAGE_FILE
        try:
            size = tarball.lstat().st_size
        except FileNotFoundError:
            continue
        tarballs.append((rejected_at, tarball, size, name))
    out = list(folders)
    kept = kept_bytes = 0
    for rejected_at, tarball, size, name in sorted(tarballs, key=lambda t: (-t[0], t[3])):
        fits = (keep.rejected_keep <= 0 or kept < keep.rejected_keep) \
            and (keep.rejected_max_bytes <= 0 or kept_bytes + size <= keep.rejected_max_bytes) \
            and (keep.rejected_days <= 0 or (now - rejected_at) / DAY_S <= keep.rejected_days)
        if fits:
            kept += 1
            kept_bytes += size
        else:
            out.append(Removal(tarball, size, name, "rejected package"))
    return out


def sweep(config: Config, logged: Callable[[str], bool], now: float, dry_run: bool = False) -> list[Removal]:
    """Remove (``dry_run``: only list) what the rejected-upload bounds let go of; what was removed."""
    return [r for r in plan(config, logged, now) if dry_run or remove(r, ignore_errors=True)]

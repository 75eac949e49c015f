"""Retention: what a finished submission leaves in ``pending/`` and ``runs/``, pruned by age.

Only terminal submissions are touched (their status never changes back; an accepted
one may only become revoked), and only by the age of their last status change:

- after ``retention.pending_days``: ``pending/<uuid>/`` loses the package and the
  runner tarball; ``submission.json`` stays while it is needed (the METAS that the
  page's per-case results and a revocation read). A submission that was not accepted
  and has no ``runs/<uuid>/`` left loses the whole folder.
- after ``retention.run_logs_days``: ``runs/<uuid>/`` loses its logs (``logs.txt``
  before ``log_tails.json``, so the logs endpoint's ``pruned`` flag is never true while
  a tail is still there) and env files; a run that was not accepted goes whole.
  Files this module does not name are left alone.
- never: the event log, git, and of an accepted (or revoked) submission its
  ``submission.json`` and ``result.json`` (with the confirmation result and failure
  files beside it): a revocation recomputes the kernel's bests from them.

Every removal is atomic on its own: a file is unlinked, a folder is first renamed to a
``.gc-`` name (which intake's recovery and every reader ignore) and then deleted, so a
reader beside a running daemon sees a file or folder whole or not at all. A crash
between the rename and the delete leaves a ``.gc-`` folder that the next sweep removes.
Two sweeps at once (``kz gc`` beside the daemon) each count only what they removed.
"""
from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kz_daemon.config.settings import Config
from kz_daemon.core.clock import epoch_of
from kz_daemon.storage.pending import ENV_FILE, LOGS_FILE, PACKAGE_FILE, RUNNER_TARBALL, RUNNER_TARBALL_KEY
from kz_daemon.storage.run_logs import TAILS_FILE
from kz_events.codec import format_ts
from kz_events.status import TERMINAL, Status

__all__ = ["TRASH_PREFIX", "Finished", "Removal", "Sweep", "finished", "finished_rows", "plan", "sweep",
           "sweep_pages"]

TRASH_PREFIX = ".gc-"
DAY_S = 86400.0
#: an accepted (or revoked) submission's record: never pruned
KEPT_STATUSES = frozenset({Status.ACCEPTED, Status.REVOKED})
#: what pending/<uuid>/ loses first (submission.json stays: see the module docstring)
PACKAGE_FILES = (PACKAGE_FILE, RUNNER_TARBALL, RUNNER_TARBALL_KEY)
#: a run's log files by name (a confirmation run's carry a prefix: confirm-logs.txt), in removal
#: order: the full logs before the tails (see the module docstring), then the env
RUN_LOG_SUFFIXES = (LOGS_FILE, TAILS_FILE, ENV_FILE)


@dataclass(frozen=True)
class Finished:
    """A terminal submission as retention sees it: its status and when it reached it (epoch seconds)."""

    uuid: str
    status: str
    ended_at: float


@dataclass(frozen=True)
class Removal:
    """One file or folder to remove, with its size and why."""

    path: Path
    bytes: int
    uuid: str
    what: str          # package | run logs | pending entry | run entry | leftover


@dataclass
class Sweep:
    """What one sweep removed (or, dry, would remove)."""

    dry_run: bool
    removed: list[Removal] = field(default_factory=list)

    @property
    def count(self) -> int:
        """How many files and folders."""
        return len(self.removed)

    @property
    def bytes(self) -> int:
        """Their size in bytes (a folder: every file under it)."""
        return sum(r.bytes for r in self.removed)

    @property
    def submissions(self) -> int:
        """How many submissions lost files."""
        return len({r.uuid for r in self.removed if r.uuid})


def finished(submissions: Iterable[Any]) -> list[Finished]:
    """The terminal submissions among reducer ``Submission`` values, with the time of their last change.

    Call it under ``store.lock`` in the daemon; the result is plain data.
    """
    out = []
    for sub in submissions:
        if sub.status not in TERMINAL or not sub.history:
            continue
        ended = epoch_of(sub.history[-1][2])
        if ended is not None:
            out.append(Finished(sub.uuid, str(sub.status), ended))
    return out


def finished_rows(rows: Iterable[tuple[str, str, str]]) -> list[Finished]:
    """Finished entries from the history projection's rows: (uuid, status, ts of the last change)."""
    out = []
    for uuid, status, ended_ts in rows:
        ended = epoch_of(ended_ts)
        if ended is not None:
            out.append(Finished(uuid, str(status), ended))
    return out


def cutoff_ts(config: Config, now: float) -> str | None:
    """The ts before which a submission's last change must lie for any class to be due (None: none is)."""
    keep = config.retention
    days = [d for d in (keep.pending_days, keep.run_logs_days) if d]
    if not days:
        return None
    return format_ts(math.floor(now - min(days) * DAY_S))  # the log's ts form, whole seconds


def sweep_pages(config: Config, pages: Iterable[Iterable[tuple[str, str, str]]], now: float,
                dry_run: bool = False) -> Sweep:
    """``sweep`` over the history projection read page by page (``History.finished``, old enough
    ones only: ``cutoff_ts``), so a sweep's memory is one page's, not the history's."""
    result = Sweep(dry_run=dry_run)
    first = True
    for rows in pages:
        part = sweep(config, finished_rows(rows), now, dry_run, leftovers=first)
        result.removed.extend(part.removed)
        first = False
    if first:  # no page: the leftovers of a crashed sweep still go
        result.removed.extend(sweep(config, [], now, dry_run).removed)
    return result


def tree_size(path: Path) -> int:
    """Bytes of the files (and links) at or below ``path``; 0 when it is gone."""
    try:
        if path.is_dir() and not path.is_symlink():
            return sum(tree_size(child) for child in path.iterdir())
        return path.lstat().st_size
    except FileNotFoundError:
        return 0


def _files(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _run_logs(run: Path) -> list[Path]:
    ranked = []
    for path in _files(run):
        rank = next((i for i, suffix in enumerate(RUN_LOG_SUFFIXES) if path.name.endswith(suffix)), None)
        if rank is not None:
            ranked.append((rank, path.name, path))
    return [path for _rank, _name, path in sorted(ranked)]


def plan(config: Config, subs: Iterable[Finished], now: float, leftovers: bool = True) -> list[Removal]:
    """What a sweep at ``now`` removes, in removal order (reads sizes; removes nothing).

    ``leftovers``: also the ``.gc-`` folders a crashed sweep left (once per sweep).
    """
    keep = config.retention
    pending_dir, runs_dir = config.paths.pending, config.paths.runs
    out: list[Removal] = []
    for base in (pending_dir, runs_dir) if leftovers else ():
        out += [Removal(p, tree_size(p), "", "leftover") for p in _files(base) if p.name.startswith(TRASH_PREFIX)]
    for sub in sorted(subs, key=lambda s: s.uuid):
        age_days = (now - sub.ended_at) / DAY_S
        record = sub.status in KEPT_STATUSES
        run = runs_dir / sub.uuid
        run_gone = not run.exists()
        if keep.run_logs_days and age_days >= keep.run_logs_days and not run_gone:
            if record:
                out += [Removal(p, tree_size(p), sub.uuid, "run logs") for p in _run_logs(run)]
            else:
                out.append(Removal(run, tree_size(run), sub.uuid, "run entry"))
                run_gone = True
        folder = pending_dir / sub.uuid
        if keep.pending_days and age_days >= keep.pending_days and folder.exists():
            if not record and run_gone:
                out.append(Removal(folder, tree_size(folder), sub.uuid, "pending entry"))
            else:
                out += [Removal(folder / n, tree_size(folder / n), sub.uuid, "package") for n in PACKAGE_FILES
                        if (folder / n).exists()]
    return out


def remove(removal: Removal, *, ignore_errors: bool = False) -> bool:
    """Remove one file or folder atomically; False when it was gone already (another sweep).

    A folder is first renamed to a trash name so a half-deleted one is never mistaken for a
    live entry; ``ignore_errors`` also tolerates failures inside it (the next sweep finds the
    trash folder again), otherwise only a concurrent sweep's deletions are tolerated.
    """
    path = removal.path
    try:
        if path.is_dir() and not path.is_symlink():
            trash = path if path.name.startswith(TRASH_PREFIX) else \
                path.with_name(f"{TRASH_PREFIX}{os.getpid()}-{path.name}")
            if trash != path:
                os.rename(path, trash)
            if ignore_errors:
                shutil.rmtree(trash, ignore_errors=True)
            else:
                shutil.rmtree(trash, onerror=_gone_is_fine)
        else:
            path.unlink()
    except FileNotFoundError:
        return False
    return True


def _gone_is_fine(func: Any, path: str, exc_info: Any) -> None:
    # a concurrent sweep may delete the same leftover folder under us
    if not issubclass(exc_info[0], FileNotFoundError):
        raise exc_info[1]


def sweep(config: Config, subs: Iterable[Finished], now: float, dry_run: bool = False,
          leftovers: bool = True) -> Sweep:
    """Remove (``dry_run``: only list) what retention lets go of at ``now``; what was removed."""
    result = Sweep(dry_run=dry_run)
    for removal in plan(config, subs, now, leftovers):
        if dry_run or remove(removal):
            result.removed.append(removal)
    return result

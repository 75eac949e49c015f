"""Durable file writes: the one place that knows how to make a file survive a crash.

Every file the project writes that must not be seen half-written (a submission's
facts, a run's result, the index, the token store, a snapshot, a cache) goes through
``atomic_write``: the bytes go to a temporary name in the same folder, are fsynced,
renamed over the target, and the folder is fsynced so the rename itself survives a
power cut. A reader therefore sees the old file or the new one, never a mix.

Standard library only, so every package (``kz_events``, ``kz_runner``, ``kz_daemon``)
can use it.
"""
from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path
from typing import Any

#: errno values that mean "the disk or a quota is full": freeing space cures them
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

__all__ = ["FULL_ERRNOS", "atomic_write", "atomic_write_json", "fsync_dir", "fsync_path", "temp_name"]


def temp_name(path: Path) -> Path:
    """The temporary name ``atomic_write`` uses beside ``path`` (unique per process and thread)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def fsync_dir(path: Path | str) -> None:
    """fsync a directory so an entry created, renamed or removed in it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: Path | str) -> None:
    """fsync a file or a directory by path (opened read-only)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path | str, data: bytes, *, fsync: bool = True, sync_dir: bool = True,
                 mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` atomically.

    ``fsync=False`` skips every fsync (caches and tests that do not need durability);
    ``sync_dir=False`` leaves the folder's fsync to a caller that renames more into it;
    ``mode`` sets the file's permission bits before the rename (e.g. 0o600 for secrets).
    """
    path = Path(path)
    tmp = temp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644 if mode is None else mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if fsync and sync_dir:
        fsync_dir(path.parent)


def atomic_write_json(path: Path | str, doc: Any, *, fsync: bool = True, sync_dir: bool = True,
                      indent: int | None = 2, sort_keys: bool = True) -> None:
    """``atomic_write`` of ``doc`` as JSON (indented, sorted keys, trailing newline)."""
    data = json.dumps(doc, indent=indent, sort_keys=sort_keys).encode() + b"\n"
    atomic_write(path, data, fsync=fsync, sync_dir=sync_dir)

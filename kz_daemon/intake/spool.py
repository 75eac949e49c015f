"""The maildir-style spool: writers drop files, the daemon claims them with a uuid.

Layout under ``DIR/spool``::

    tmp/                writers create files here ...
    inbox/              ... and rename them in: NAME.tar.gz [+ NAME.meta.json sidecar]
    work/               the daemon's claim: <uuid>.tar.gz + <uuid>.meta.json
    rejected/<uuid>/    package.tar.gz + reason.json (machine-readable)

A file in ``inbox/`` has no uuid yet; moving it into ``work/<uuid>.tar.gz`` (one
atomic rename, after ``work/<uuid>.meta.json`` is durably written) is the moment its
uuid is decided, so a crash can never give one file two uuids. The uuid is the
sidecar's when it brings one (the HTTP upload pre-assigns it), else a fresh uuid4.

The watchdog observer only wakes the intake; a directory scan is what finds files,
run at start-up, on every wake-up and periodically, so nothing is missed across
restarts or an inotify queue overflow.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import stat
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from watchdog.events import FileSystemEventHandler
from watchdog.observers import Observer

from kz_daemon.core.errors import ZooError
from kz_events.durable import atomic_write_json, fsync_dir

TARBALL_SUFFIX = ".tar.gz"
SIDECAR_SUFFIX = ".meta.json"
CHUNK = 1 << 20
#: An inbox file the kernel cannot say is closed is claimed once unmodified this long ...
SETTLE_QUIET_S = 2.0
#: ... and any inbox file once unmodified this long, even while held open for writing.
SETTLE_MAX_S = 600.0
SIDECAR_KEYS = ("uuid", "submitter_id", "kernel_id", "source", "received_at", "filename", "idempotency_key",
                "idempotency_sha256")


@dataclass(frozen=True)
class SpoolDirs:
    """The spool's folders."""

    root: Path

    @property
    def tmp(self) -> Path:
        """Writers' staging folder."""
        return self.root / "tmp"

    @property
    def inbox(self) -> Path:
        """Renamed-in files wait here."""
        return self.root / "inbox"

    @property
    def work(self) -> Path:
        """Files the daemon has given a uuid."""
        return self.root / "work"

    @property
    def rejected(self) -> Path:
        """Archive of rejected submissions."""
        return self.root / "rejected"

    def ensure(self) -> None:
        """Create the folders."""
        for d in (self.tmp, self.inbox, self.work, self.rejected):
            d.mkdir(parents=True, exist_ok=True)


@dataclass(frozen=True)
class Claimed:
    """A spooled file that has its uuid: ``work/<uuid>.tar.gz`` plus its metadata."""

    uuid: str
    tarball: Path
    meta: dict[str, Any]


def is_uuid(text: object) -> bool:
    """Whether ``text`` is a canonical (lower-case, dashed) UUID string."""
    if not isinstance(text, str):
        return False
    try:
        return str(uuidlib.UUID(text)) == text
    except ValueError:
        return False


def owner_name(path: Path) -> str:
    """The login name of the file's owner (``uid<N>`` when the uid has no passwd entry)."""
    uid = path.stat().st_uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def drop(dirs: SpoolDirs, fileobj: BinaryIO, meta: dict[str, Any], max_bytes: int,
         name: str | None = None) -> str:
    """Stream ``fileobj`` into the inbox the way every writer must; returns the submission uuid.

    The tarball goes to ``tmp/`` with the size cap enforced while streaming
    (PAYLOAD_TOO_LARGE, nothing left behind), the sidecar (with a pre-assigned
    uuid) is renamed into the inbox first, then the tarball.
    """
    meta = {k: v for k, v in meta.items() if k in SIDECAR_KEYS and v is not None}
    sub_uuid = meta.get("uuid") or str(uuidlib.uuid4())
    meta["uuid"] = sub_uuid
    base = name or sub_uuid
    tmp_tar = dirs.tmp / f"{base}{TARBALL_SUFFIX}"
    tmp_meta = dirs.tmp / f"{base}{SIDECAR_SUFFIX}"
    size = 0
    try:
        with open(tmp_tar, "wb") as out:
            while True:
                chunk = fileobj.read(CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                if size > max_bytes:
                    raise ZooError("PAYLOAD_TOO_LARGE",
                                   f"the package is larger than the limit of {max_bytes} bytes; "
                                   "leave build outputs and data out of it",
                                   {"limit": max_bytes})
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        atomic_write_json(tmp_meta, meta)
        os.replace(tmp_meta, dirs.inbox / tmp_meta.name)
        os.replace(tmp_tar, dirs.inbox / tmp_tar.name)
        fsync_dir(dirs.inbox)
    except BaseException:
        for p in (tmp_tar, tmp_meta):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
        raise
    return sub_uuid


def inbox_files(dirs: SpoolDirs, skipped: Callable[[str, str], None] | None = None) -> list[Path]:
    """Regular files in the inbox that are submissions (not sidecars, not dot-files), oldest first.

    Anything else (a directory, symlink, fifo, socket, device) is left where it is
    and named to ``skipped(name, reason)``: a symlink could point anywhere on the
    host and a fifo would block the reader, so neither is ever opened.
    """
    out = []
    try:
        entries = list(os.scandir(dirs.inbox))
    except FileNotFoundError:
        return []
    for entry in entries:
        if entry.name.startswith(".") or entry.name.endswith(SIDECAR_SUFFIX):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            if skipped is not None:
                skipped(entry.name, entry_kind(st.st_mode))
            continue
        out.append((st.st_mtime_ns, entry.name, Path(entry.path)))
    return [p for _m, _n, p in sorted(out)]


def entry_kind(mode: int) -> str:
    """A word for a non-regular file type (the ``reason`` of ``spool.skipped``)."""
    for test, word in ((stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symlink"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device")):
        if test(mode):
            return word
    return "other"


def open_for_writing(path: Path) -> bool | None:
    """Whether any process has ``path`` open for writing; None when the kernel will not say.

    A read lease (``F_SETLEASE``) is refused with EAGAIN exactly while some open file
    description of the file is writable. Taking one needs the file's owner or
    CAP_LEASE, and not every file system supports leases: then None.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as exc:
        return True if exc.errno in (errno.EAGAIN, errno.EBUSY) else None
    else:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return False
    finally:
        os.close(fd)


def settled(path: Path, now: float, quiet_s: float = SETTLE_QUIET_S, max_wait_s: float = SETTLE_MAX_S) -> bool:
    """Whether an inbox file is complete enough to claim.

    A file renamed in from ``tmp/`` is complete at once; one written in place is not
    while its writer has it open, or (where the kernel cannot tell) while it was
    modified less than ``quiet_s`` ago. The wait is bounded: a file untouched for
    ``max_wait_s`` is claimed even if a writer still holds it open (its checks then
    judge whatever it holds).
    """
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    age = now - st.st_mtime
    if age >= max_wait_s:
        return True
    writing = open_for_writing(path)
    if writing is None:
        return age >= quiet_s
    return not writing


def sidecar_of(path: Path) -> Path:
    """``NAME.meta.json`` beside ``NAME.tar.gz`` (or beside any other file name)."""
    name = path.name
    stem = name[: -len(TARBALL_SUFFIX)] if name.endswith(TARBALL_SUFFIX) else name
    return path.with_name(stem + SIDECAR_SUFFIX)


def read_sidecar(path: Path) -> tuple[dict[str, Any], str | None]:
    """The sidecar's fields (only known keys), and an error text when it is unreadable."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, None
    except (ValueError, UnicodeDecodeError) as exc:
        return {}, f"sidecar {path.name} is not valid JSON: {exc}"
    if not isinstance(raw, dict):
        return {}, f"sidecar {path.name} is not a JSON object"
    return {k: raw[k] for k in SIDECAR_KEYS if k in raw and isinstance(raw[k], str)}, None


def claim(dirs: SpoolDirs, path: Path, known: Callable[[str], bool],
          clock_iso: Callable[[], str]) -> Claimed | None:
    """Give inbox file ``path`` its uuid by moving it to ``work/``; None when it vanished.

    ``known(uuid)`` says whether the event log already has that uuid (a re-dropped
    sidecar uuid then gets a fresh one, recorded as ``duplicate_of``).
    """
    side = sidecar_of(path)
    meta, side_error = read_sidecar(side)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    sub_uuid = meta.get("uuid")
    extra: dict[str, Any] = {}
    if sub_uuid is not None and (not is_uuid(sub_uuid) or known(sub_uuid)):
        extra["sidecar_uuid_refused"] = sub_uuid
        sub_uuid = None
    if sub_uuid is None:
        sub_uuid = str(uuidlib.uuid4())
    if not meta.get("submitter_id"):
        try:
            meta["submitter_id"] = owner_name(path)
        except FileNotFoundError:
            return None
    meta.setdefault("source", "spool")
    meta.setdefault("received_at", clock_iso())
    record = dict(meta, uuid=sub_uuid, size=st.st_size, **extra)
    record["filename"] = meta.get("filename") or path.name  # the name the submitter gave it
    if side_error:
        record["sidecar_error"] = side_error
    work_meta = dirs.work / f"{sub_uuid}{SIDECAR_SUFFIX}"
    atomic_write_json(work_meta, record, sync_dir=False)  # the fsync_dir below covers both names
    target = dirs.work / f"{sub_uuid}{TARBALL_SUFFIX}"
    try:
        os.rename(path, target)
    except FileNotFoundError:
        work_meta.unlink(missing_ok=True)
        return None
    fsync_dir(dirs.work)
    try:
        side.unlink()
    except FileNotFoundError:
        pass
    return Claimed(sub_uuid, target, record)


def claimed_files(dirs: SpoolDirs) -> list[Claimed]:
    """Files already in ``work/`` (a crash left them there): their uuid is decided."""
    out = []
    try:
        names = sorted(os.listdir(dirs.work))
    except FileNotFoundError:
        return []
    for name in names:
        if not name.endswith(TARBALL_SUFFIX) or name.startswith("."):
            continue
        sub_uuid = name[: -len(TARBALL_SUFFIX)]
        meta_path = dirs.work / f"{sub_uuid}{SIDECAR_SUFFIX}"
        try:
            meta = json.loads(meta_path.read_text())
        except (FileNotFoundError, ValueError):
            meta = {"uuid": sub_uuid, "submitter_id": "unknown", "source": "spool",
                    "filename": name, "size": (dirs.work / name).stat().st_size}
        out.append(Claimed(sub_uuid, dirs.work / name, meta))
    return out


def remove_orphan_work_meta(dirs: SpoolDirs) -> int:
    """Delete ``work/<uuid>.meta.json`` files whose tarball never moved in (a crash mid-claim)."""
    count = 0
    for name in os.listdir(dirs.work):
        if name.endswith(SIDECAR_SUFFIX):
            stem = name[: -len(SIDECAR_SUFFIX)]
            if not (dirs.work / f"{stem}{TARBALL_SUFFIX}").exists():
                (dirs.work / name).unlink(missing_ok=True)
                count += 1
    return count


def keyed_sidecars(dirs: SpoolDirs) -> list[dict[str, Any]]:
    """The sidecars in the inbox and work/ that carry an Idempotency-Key: uploads intake has not recorded."""
    out = []
    for folder in (dirs.inbox, dirs.work):
        for name in sorted(os.listdir(folder)):
            if name.endswith(SIDECAR_SUFFIX) and not name.startswith("."):
                meta, _error = read_sidecar(folder / name)
                if meta.get("idempotency_key") and meta.get("uuid") and meta.get("idempotency_sha256"):
                    out.append(meta)
    return out


class InboxWatcher:
    """A watchdog observer on the inbox that calls ``wake()`` when something is created or moved in."""

    def __init__(self, inbox: Path, wake: Callable[[], None]) -> None:
        self.inbox = inbox
        self.wake = wake
        self._observer: Any = None  # a watchdog Observer while started

    def start(self) -> None:
        """Start observing (watchdog's inotify backend on Linux)."""
        wake = self.wake

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event):  # noqa: D401 - watchdog callback
                if event.event_type in ("created", "moved", "closed"):
                    wake()

        self._observer = Observer()
        self._observer.schedule(_Handler(), str(self.inbox), recursive=False)
        self._observer.daemon = True
        self._observer.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop observing and join the observer thread."""
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout)
            self._observer = None

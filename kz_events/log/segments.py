"""The append-only segment files of the event log: locking, appending, reading, repair.

Layout of an events directory::

    LOCK                        flock(2)-ed by the one writer; holds its pid
    00000000000000000001.jsonl  segments, named by the seq of their first line
    00000000000000412345.jsonl
    snapshots/                  see kz_events.log.snapshot
    quarantine/                 torn tails cut off at open, kept for inspection

Every line ends with ``\\n``; a line without one was never acknowledged (the
writer acknowledges only after the newline is fsync-ed), so at open the bytes
after the last newline of the last segment are a torn tail: they are moved to
``quarantine/`` and the segment is truncated. Anything else that is wrong (a line
that does not parse, a broken hash link, a seq gap, a segment whose name does not
match its first line) raises ``CorruptLog`` naming the seq, file and byte offset.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kz_events.codec import GENESIS, parse_json
from kz_events.durable import fsync_dir

__all__ = [
    "LogError", "LogLocked", "RollbackFailed", "CorruptLog", "Position", "Repair", "EventLog",
    "segment_name", "list_segments", "DEFAULT_SEGMENT_BYTES",
]

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
_SEGMENT_RE = re.compile(r"^(\d{20})\.jsonl$")
_sha256 = hashlib.sha256


class LogError(Exception):
    """Base of the event log's errors."""


class LogLocked(LogError):
    """Another process (or another open Store) holds the events directory."""


class RollbackFailed(LogError):
    """An append failed and cutting the log back to its last durable line failed too."""


class CorruptLog(LogError):
    """A line in the log that cannot be trusted; names the seq, file and byte offset."""

    def __init__(self, seq: int, path: Path | str, offset: int, reason: str):
        self.seq, self.path, self.offset, self.reason = seq, str(path), offset, reason
        super().__init__(f"corrupt event log at seq {seq} ({path}, byte offset {offset}): {reason}")


@dataclass(frozen=True, slots=True)
class Position:
    """Where an event's line lies: its seq and hash, its segment and byte range."""

    seq: int          # 0 for the empty log
    hash: str         # sha256 of the line (GENESIS for the empty log)
    segment: int      # first seq of the segment file (its name)
    line_start: int   # byte offset of the line in the segment
    offset: int       # byte offset just after the line's newline


@dataclass(frozen=True, slots=True)
class Repair:
    """What the torn-tail repair at open did."""

    segment: str          # file name of the repaired segment
    offset: int           # where it was truncated
    dropped_bytes: int
    quarantine_file: str  # relative to the events dir


def segment_name(first_seq: int) -> str:
    """The file name of a segment whose first line has seq ``first_seq``."""
    return f"{first_seq:020d}.jsonl"


def list_segments(events_dir: Path) -> list[int]:
    """First seqs of the segment files in ``events_dir``, ascending."""
    found = []
    for entry in os.scandir(events_dir):
        m = _SEGMENT_RE.match(entry.name)
        if m and entry.is_file():
            found.append(int(m.group(1)))
    return sorted(found)


def _acquire_lock(events_dir: Path) -> int:
    fd = os.open(events_dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        finally:
            os.close(fd)
        raise LogLocked(
            f"the event log {events_dir} is in use by pid {holder} "
            "(one writer at a time: stop that process or use another --state-dir)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _repair_torn_tail(events_dir: Path, first_seq: int) -> Repair | None:
    """Cut the bytes after the last newline of the segment off into quarantine/."""
    path = events_dir / segment_name(first_seq)
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return None
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None
        cut, end = 0, size
        while end > 0:  # search backwards for the last newline
            start = max(0, end - 65536)
            f.seek(start)
            block = f.read(end - start)
            i = block.rfind(b"\n")
            if i >= 0:
                cut = start + i + 1
                break
            end = start
        f.seek(cut)
        torn = f.read(size - cut)
    qdir = events_dir / "quarantine"
    qdir.mkdir(exist_ok=True)
    base = f"{path.stem}.at{cut}"
    n = 0
    while (qdir / f"{base}.{n}.torn").exists():
        n += 1
    qpath = qdir / f"{base}.{n}.torn"
    with open(qpath, "wb") as q:
        q.write(torn)
        q.flush()
        os.fsync(q.fileno())
    fsync_dir(qdir)
    fsync_dir(events_dir)
    with open(path, "r+b") as f:
        f.truncate(cut)
        os.fsync(f.fileno())
    return Repair(path.name, cut, len(torn), f"quarantine/{qpath.name}")


class EventLog:
    """The segment files of one events directory, held by this process for writing.

    ``open`` takes the lock and repairs a torn tail; ``read_segment`` gives the
    bytes that ``kz_events.log.replay`` checks and folds (it then sets ``tail``);
    ``append`` writes encoded lines and fsyncs once per call, and cuts the log back
    to where it was when that fails (``rollback``). Not thread-safe:
    the Store serialises calls.
    """

    def __init__(self, events_dir: Path, lock_fd: int | None, segments: list[int],
                 repair: Repair | None, segment_bytes: int, fsync: bool,
                 readonly: bool = False):
        self.dir = events_dir
        self._lock_fd = lock_fd
        self.segments = segments
        self.repair = repair
        self.segment_bytes = segment_bytes
        self._fsync = fsync
        self.readonly = readonly
        self.tail = Position(0, GENESIS, 1, 0, 0)  # set by kz_events.log.replay.replay_into
        self._fd: int | None = None

    @classmethod
    def open(cls, events_dir: Path | str, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES,
             fsync: bool = True, readonly: bool = False) -> EventLog:
        """Lock ``events_dir`` (created if missing), list segments, repair a torn tail.

        ``readonly=True`` is for tools reading a log that a daemon may be writing:
        no lock, no repair, and an unterminated last line is left unread.
        """
        events_dir = Path(events_dir)
        if readonly:
            if not events_dir.is_dir():
                raise LogError(f"no event log at {events_dir}")
            return cls(events_dir, None, list_segments(events_dir), None, segment_bytes,
                       fsync, readonly=True)
        events_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = _acquire_lock(events_dir)
        try:
            segments = list_segments(events_dir)
            repair = _repair_torn_tail(events_dir, segments[-1]) if segments else None
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(events_dir, lock_fd, segments, repair, segment_bytes, fsync)

    # --- reading ------------------------------------------------------------------

    def check_position(self, pos: Position) -> bool:
        """True when the line at ``pos`` exists and hashes to ``pos.hash`` (snapshot check)."""
        if pos.seq == 0:
            return True
        if pos.segment not in self.segments:
            return False
        path = self.dir / segment_name(pos.segment)
        try:
            with open(path, "rb") as f:
                f.seek(pos.line_start)
                line = f.read(pos.offset - pos.line_start)
        except OSError:
            return False
        if len(line) != pos.offset - pos.line_start or not line.endswith(b"\n"):
            return False
        if _sha256(line[:-1]).hexdigest() != pos.hash:
            return False
        try:
            return parse_json(line[:-1].decode("utf-8"))["seq"] == pos.seq
        except (ValueError, KeyError, TypeError):
            return False

    def start_position(self) -> Position:
        """The position before the first event (seq 0)."""
        return Position(0, GENESIS, self.segments[0] if self.segments else 1, 0, 0)

    def iter_lines(self, first: int, offset: int = 0,
                   chunk_bytes: int = 1 << 20) -> Iterator[list[bytes]]:
        """Lists of the whole lines (without newlines) of segment ``first`` from ``offset``.

        Reads in chunks (a small working set is faster than one big read). Raises
        CorruptLog for bytes after the last newline, except in read-only mode at
        the end of the last segment (a line being written).
        """
        path = self.dir / segment_name(first)
        with open(path, "rb") as f:
            f.seek(offset)
            rest = b""
            while True:
                chunk = f.read(chunk_bytes)
                if not chunk:
                    break
                lines = (rest + chunk).split(b"\n") if rest else chunk.split(b"\n")
                rest = lines.pop()
                if lines:
                    yield lines
        if rest and not (self.readonly and first == self.segments[-1]):
            size = path.stat().st_size
            raise CorruptLog(-1, path, size - len(rest),
                             "segment does not end with a newline (a torn line that is "
                             "not at the end of the log)")

    def read_segment(self, first: int, offset: int = 0) -> bytes:
        """The bytes of segment ``first`` from ``offset``: whole lines only.

        Raises CorruptLog when a segment does not end with a newline (only possible
        for a torn line that is not at the end of the log). In read-only mode an
        unterminated last line of the last segment is left out (it is being written).
        """
        path = self.dir / segment_name(first)
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
        if self.readonly and first == self.segments[-1]:
            data = data[:data.rfind(b"\n") + 1]
        if data and not data.endswith(b"\n"):
            raise CorruptLog(-1, path, offset + data.rfind(b"\n") + 1,
                             "segment does not end with a newline (a torn line that is "
                             "not at the end of the log)")
        return data

    # --- writing ------------------------------------------------------------------

    def _open_for_append(self) -> int:
        if self.readonly:
            raise LogError("this EventLog was opened read-only")
        if self._fd is not None:
            return self._fd
        if not self.segments:
            return self._new_segment(1)
        self._fd = os.open(self.dir / segment_name(self.segments[-1]), os.O_WRONLY | os.O_APPEND)
        return self._fd

    def _new_segment(self, first_seq: int) -> int:
        """Start segment ``first_seq`` and make it the one appended to; returns its descriptor."""
        if self._fd is not None:
            os.close(self._fd)
        path = self.dir / segment_name(first_seq)
        self._fd = fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        if self._fsync:
            fsync_dir(self.dir)
        self.segments.append(first_seq)
        self.tail = Position(self.tail.seq, self.tail.hash, first_seq, 0, 0)
        return fd

    def append(self, records: list[tuple[int, bytes, str]]) -> None:
        """Write (seq, line without newline, hash) records in order, then fsync once.

        Rotates to a new segment, named by its first seq, when the current one has
        reached ``segment_bytes``. On a failed write or fsync the log is put back as
        it was before the call (``rollback``) and the OSError is raised: the caller
        may append again later. If putting it back fails too, ``RollbackFailed`` is
        raised (its ``__cause__`` is the error of the put-back): the caller must
        then stop writing, because the file's end is unknown.
        """
        before = self.tail
        try:
            self._append(records)
        except OSError as exc:
            try:
                self.rollback(before)
            except OSError as undo:
                raise RollbackFailed(
                    f"appending to {self.dir} failed ({exc}) and so did cutting the log back "
                    f"to seq {before.seq} ({undo})") from undo
            raise

    def _append(self, records: list[tuple[int, bytes, str]]) -> None:
        fd = self._open_for_append()
        tail = self.tail
        seg, size, line_start = tail.segment, tail.offset, tail.line_start
        parts: list[bytes] = []
        seq, h = tail.seq, tail.hash
        for rseq, line, rhash in records:
            if size >= self.segment_bytes:
                self._write(fd, parts)
                if self._fsync:
                    os.fdatasync(fd)
                parts = []
                fd = self._new_segment(rseq)
                seg, size = rseq, 0
            parts.append(line)
            parts.append(b"\n")
            line_start = size
            size += len(line) + 1
            seq, h = rseq, rhash
        self._write(fd, parts)
        if self._fsync:
            os.fdatasync(fd)
        self.tail = Position(seq, h, seg, line_start, size)

    def rollback(self, to: Position) -> None:
        """Cut the log back to ``to`` (the tail before a failed append) and make that durable.

        Segments begun after ``to.segment`` are removed and that segment is truncated
        to ``to.offset``; the bytes a failed write or fsync may have left are gone,
        so a later append writes them afresh rather than trusting pages the kernel
        may have dropped. Raises OSError when the cut itself fails.
        """
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        removed = False
        for first in list_segments(self.dir):
            if first > to.segment:
                os.unlink(self.dir / segment_name(first))
                removed = True
        path = self.dir / segment_name(to.segment)
        if path.exists():
            fd = os.open(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, to.offset)
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        if removed and self._fsync:
            fsync_dir(self.dir)
        self.segments = list_segments(self.dir)
        self.tail = to

    @staticmethod
    def _write(fd: int, parts: list[bytes]) -> None:
        data = memoryview(b"".join(parts))
        while data:
            n = os.write(fd, data)
            data = data[n:]

    def close(self) -> None:
        """Close the segment and release the lock."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

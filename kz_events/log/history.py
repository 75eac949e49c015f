"""The history projection: every finished submission in SQLite, beside the log it comes from.

The State keeps only live submissions; a submission that finishes is handed over
(``kz_events.state.Handoff``) and stored here, one row each, with the later changes
a finished submission can still have (a revocation) applied to its row. The file
is ``DIR/events/history.sqlite`` (standard-library ``sqlite3``, WAL mode), a cache
of the log like the snapshots: it can always be rebuilt by replaying the log.

Exactly consistent with the log after a crash: each ``apply`` is one transaction
that writes its rows and the log position they reach (seq, hash and where that
line lies) together. Only durable lines are applied, and a hand-off whose seq is
at or below the stored seq is skipped, so nothing is applied twice. At open the
store checks that the log still holds the stored position, loads a snapshot no
newer than it and replays the rest, handing over what finished after it; a file
that is missing, unreadable, of another layout, or no longer matching the log is
rebuilt from the whole log.

Rows keep the ``Submission`` (the State's snapshot row form, marshal-encoded as the
snapshots are: several times faster than JSON both ways; a file written by another
Python version is rebuilt) and the
columns the API's queries filter on, indexed: uuid (and uuid prefixes), submitter,
kernel_id, status, received time; the newest-first order is the seq of
``submission.received`` (the table's integer key, so every index is in that order
within one value). An accept-latency histogram is kept alongside, in the same
transactions, so ``/metrics`` does not read every accepted row.
"""
from __future__ import annotations

import bisect
import json
import marshal
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kz_events.log.segments import Position
from kz_events.log.snapshot import BODY_ENCODING
from kz_events.reducer import REDUCER_VERSION, amend
from kz_events.state import _SUB_FIELDS, Handoff, Submission
from kz_events.status import Status

__all__ = ["FILE_NAME", "LAYOUT", "ACCEPT_LATENCY_BOUNDS", "History", "HistoryError", "Query",
           "history_path", "remove_files"]

FILE_NAME = "history.sqlite"
#: bump when the tables change; a file of another layout is rebuilt.
LAYOUT = 1
#: upper bounds (seconds) of the received → accepted histogram (``/metrics``).
ACCEPT_LATENCY_BOUNDS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS submissions (
    rseq INTEGER PRIMARY KEY,        -- seq of submission.received: arrival order
    uuid TEXT NOT NULL UNIQUE,
    submitter_id TEXT NOT NULL,
    kernel_id TEXT NOT NULL,
    status TEXT NOT NULL,
    received_at TEXT NOT NULL,       -- the log's ts format: comparable as text
    ended_at TEXT NOT NULL,          -- ts of the last status change
    idempotency_key TEXT,
    seq INTEGER NOT NULL,            -- the last event folded into this row
    doc BLOB NOT NULL                -- the Submission's fields (marshal, as the snapshots)
);
CREATE INDEX IF NOT EXISTS submissions_by_submitter ON submissions(submitter_id);
CREATE INDEX IF NOT EXISTS submissions_by_kernel ON submissions(kernel_id);
CREATE INDEX IF NOT EXISTS submissions_by_status ON submissions(status);
CREATE INDEX IF NOT EXISTS submissions_by_received ON submissions(received_at);
-- a submitter's (or kernel's) rows in one status, newest first, without scanning the others
CREATE INDEX IF NOT EXISTS submissions_by_submitter_status ON submissions(submitter_id, status);
CREATE INDEX IF NOT EXISTS submissions_by_kernel_status ON submissions(kernel_id, status);
CREATE INDEX IF NOT EXISTS submissions_by_key ON submissions(submitter_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE TABLE IF NOT EXISTS accept_latency (
    bucket INTEGER PRIMARY KEY, count INTEGER NOT NULL, total REAL NOT NULL);
"""
_POSITION_KEYS = ("seq", "hash", "segment", "line_start", "offset")
#: a ``since`` that leaves fewer rows than this is answered through the time index
SINCE_WINDOW = 5000
#: reading connections at most (a query waits for a free one), and each one's page cache
READERS = 4
READER_CACHE_KIB = 2048
_ACCEPTED = Status.ACCEPTED.value
#: a page of ``select``: newest first, by the integer key
_PAGE_SQL = "SELECT rseq, doc FROM submissions{condition} ORDER BY rseq DESC LIMIT ?"
_REVOKED = Status.REVOKED.value


class HistoryError(Exception):
    """The projection file cannot be used (unreadable, another layout, or inconsistent): rebuild it."""


@dataclass(frozen=True)
class Query:
    """What a list of submissions is filtered on (None: any).

    ``kernel_prefix`` matches a kernel_id equal to it or below it as a folder;
    ``since`` is a ts in the log's format (``kz_events.codec.format_ts``): received at or after.
    """

    submitter: str | None = None
    kernel_id: str | None = None
    kernel_prefix: str | None = None
    status: str | None = None
    since: str | None = None

    def match(self, sub: Submission) -> bool:
        """Whether a record passes (the same test the SQL applies)."""
        if self.submitter is not None and sub.submitter_id != self.submitter:
            return False
        if self.kernel_id is not None and sub.kernel_id != self.kernel_id:
            return False
        if self.kernel_prefix is not None:
            folder = self.kernel_prefix.rstrip("/")
            if sub.kernel_id != folder and not sub.kernel_id.startswith(folder + "/"):
                return False
        if self.status is not None and sub.status != self.status:
            return False
        return self.since is None or sub.received_at >= self.since


def history_path(events_dir: Path | str) -> Path:
    """Where the projection of ``events_dir`` lives."""
    return Path(events_dir) / FILE_NAME


def remove_files(path: Path) -> None:
    """Remove a projection file with its WAL and shared-memory files."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def epoch_of_ts(ts: str) -> float | None:
    """Epoch seconds of a ts in the log's format (None when it is not one)."""
    if not isinstance(ts, str) or not ts.endswith("Z"):
        return None
    try:
        return datetime.fromisoformat(ts[:-1]).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def accept_latency_of(sub: Submission) -> float | None:
    """Seconds from received to accepted (None without both stamps)."""
    stamps = {status: ts for _seq, status, ts in sub.history}
    start, end = epoch_of_ts(stamps.get(Status.RECEIVED, "")), epoch_of_ts(stamps.get(_ACCEPTED, ""))
    if start is None or end is None:
        return None
    return max(0.0, end - start)


def _decode(doc: bytes) -> Submission:
    return Submission(*marshal.loads(doc))


def _encode(sub: Submission) -> bytes:
    return marshal.dumps(sub.to_row())


class History:
    """The open projection: one writer (the store), many readers (each thread its own connection).

    ``readonly`` opens an existing file for reading only (tools beside a running daemon).
    """

    def __init__(self, path: Path, conn: sqlite3.Connection, readonly: bool, position: Position) -> None:
        self.path = path
        self.readonly = readonly
        self._db = conn                       # the writer's connection (the reader's when readonly)
        self._lock = threading.Lock()         # one apply at a time
        self._position = position
        self._readers: list[sqlite3.Connection] = []   # every reading connection opened
        self._free: list[sqlite3.Connection] = []      # those not in use
        self._readers_cond = threading.Condition()
        self._closed = False

    # --- opening ------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | str, *, readonly: bool = False, fsync: bool = True) -> History:
        """Open (creating when missing, unless ``readonly``) the projection at ``path``.

        Raises HistoryError for a file that cannot serve: not a database, damaged, written
        by another layout or reducer version (the store then rebuilds it).
        """
        path = Path(path)
        try:
            if readonly:
                if not path.exists():
                    raise HistoryError(f"{path} does not exist")
                conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None,
                                       check_same_thread=False)
            else:
                conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                # FULL: a committed apply survives a power cut; it runs off the emit path
                conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'OFF'}")
                conn.executescript(_SCHEMA)
            position = cls._read_meta(conn, path, readonly)
        except sqlite3.Error as exc:
            raise HistoryError(f"{path}: {type(exc).__name__}: {exc}") from None
        return cls(path, conn, readonly, position)

    @staticmethod
    def _read_meta(conn: sqlite3.Connection, path: Path, readonly: bool) -> Position:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        expected = {"layout": str(LAYOUT), "reducer_version": str(REDUCER_VERSION),
                    "submission_fields": json.dumps(list(_SUB_FIELDS)), "body_encoding": BODY_ENCODING}
        if not meta:
            if readonly:
                raise HistoryError(f"{path} holds no projection yet")
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT INTO meta VALUES (?, ?)", list(expected.items()) + [
                ("seq", "0"), ("hash", "0" * 64), ("segment", "1"), ("line_start", "0"), ("offset", "0")])
            conn.execute("COMMIT")
            return Position(0, "0" * 64, 1, 0, 0)
        for key, value in expected.items():
            if meta.get(key) != value:
                raise HistoryError(f"{path} was written with {key} {meta.get(key)!r}, this is {value!r}")
        try:
            return Position(int(meta["seq"]), meta["hash"], int(meta["segment"]), int(meta["line_start"]),
                            int(meta["offset"]))
        except (KeyError, ValueError) as exc:
            raise HistoryError(f"{path}: its position is unreadable ({exc})") from None

    # --- writing ------------------------------------------------------------------------

    @property
    def position(self) -> Position:
        """The log position the rows reach (seq 0: nothing applied)."""
        return self._position

    @property
    def seq(self) -> int:
        """The last seq applied."""
        return self._position.seq

    def apply(self, handoffs: Iterable[Handoff], position: Position) -> int:
        """Store the hand-offs (those after the stored seq) and ``position``, in one transaction.

        Every hand-off must be at or below ``position.seq`` (durable lines only); returns
        how many were applied. Raises HistoryError when a change names a submission the
        projection does not hold (the file no longer matches the log).
        """
        if self.readonly:
            raise HistoryError(f"{self.path} is open read-only")
        with self._lock:
            done = self._position.seq
            todo = [h for h in handoffs if h.seq > done]
            if not todo and position.seq <= done:
                return 0
            if todo and todo[-1].seq > position.seq:
                raise ValueError(f"hand-off at seq {todo[-1].seq} is past the position {position.seq}")
            conn = self._db
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    latency: dict[int, list[float]] = {}
                    for h in todo:
                        if h.record is not None:
                            self._put(conn, h.record, h.seq, latency)
                        else:
                            self._change(conn, h, latency)
                    for bucket, (count, total) in latency.items():
                        conn.execute("INSERT INTO accept_latency VALUES (?, ?, ?) ON CONFLICT(bucket) DO UPDATE "
                                     "SET count = count + excluded.count, total = total + excluded.total",
                                     (bucket, count, total))
                    if position.seq > done:
                        conn.executemany("UPDATE meta SET value = ? WHERE key = ?",
                                         [(str(getattr(position, k)), k) for k in _POSITION_KEYS])
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise HistoryError(f"{self.path}: {type(exc).__name__}: {exc}") from None
            if position.seq > done:
                self._position = position
            return len(todo)

    @staticmethod
    def _count_latency(latency: dict[int, list[float]], sub: Submission, sign: int) -> None:
        seconds = accept_latency_of(sub)
        if seconds is None:
            return
        entry = latency.setdefault(bisect.bisect_left(ACCEPT_LATENCY_BOUNDS, seconds), [0, 0.0])
        entry[0] += sign
        entry[1] += sign * seconds

    def _put(self, conn: sqlite3.Connection, sub: Submission, seq: int, latency: dict) -> None:
        conn.execute("INSERT OR REPLACE INTO submissions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (sub.history[0][0], sub.uuid, sub.submitter_id, sub.kernel_id, sub.status,
                      sub.received_at, sub.history[-1][2], sub.idempotency_key, seq, _encode(sub)))
        if sub.status == _ACCEPTED:
            self._count_latency(latency, sub, 1)

    def _change(self, conn: sqlite3.Connection, h: Handoff, latency: dict) -> None:
        change = h.change
        if change is None:
            raise ValueError(f"hand-off at seq {h.seq} holds neither a record nor a change")
        row = conn.execute("SELECT doc FROM submissions WHERE uuid = ?", (h.uuid,)).fetchone()
        if row is None:
            raise HistoryError(f"{self.path}: {change[0]} at seq {h.seq} names submission {h.uuid}, "
                               "which the projection does not hold")
        sub = _decode(row[0])
        was = sub.status
        amend(sub, h.seq, change)
        if was == _ACCEPTED and sub.status != _ACCEPTED:
            self._count_latency(latency, sub, -1)
        conn.execute("UPDATE submissions SET status = ?, ended_at = ?, seq = ?, doc = ? WHERE uuid = ?",
                     (sub.status, sub.history[-1][2], h.seq, _encode(sub), h.uuid))

    # --- reading ------------------------------------------------------------------------

    def _rows(self, sql: str, args: tuple) -> list[tuple]:
        """Run a query on a pooled reading connection (WAL: reads never wait for the writer)."""
        if self.readonly:  # a tool: reads go through the connection it opened
            with self._lock:
                try:
                    return self._db.execute(sql, args).fetchall()
                except sqlite3.Error as exc:
                    raise HistoryError(f"{self.path}: {type(exc).__name__}: {exc}") from None
        conn = self._borrow()
        try:
            return conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise HistoryError(f"{self.path}: {type(exc).__name__}: {exc}") from None
        finally:
            self._give_back(conn)

    def _borrow(self) -> sqlite3.Connection:
        """A reading connection: a free one, a new one while fewer than ``READERS`` exist, else wait.

        A bounded pool rather than one per thread: the HTTP server's thread pool has tens
        of threads, and each connection keeps its own page cache.
        """
        with self._readers_cond:
            while True:
                if self._closed:
                    raise HistoryError(f"{self.path} is closed")
                if self._free:
                    return self._free.pop()
                if len(self._readers) < READERS:
                    break
                self._readers_cond.wait()
            try:
                conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
                conn.execute("PRAGMA query_only=ON")
                conn.execute(f"PRAGMA cache_size=-{READER_CACHE_KIB}")
            except sqlite3.Error as exc:
                raise HistoryError(f"{self.path}: {type(exc).__name__}: {exc}") from None
            self._readers.append(conn)
            return conn

    def _give_back(self, conn: sqlite3.Connection) -> None:
        with self._readers_cond:
            self._free.append(conn)
            self._readers_cond.notify()

    def get(self, uuid: str) -> tuple[int, Submission] | None:
        """(the last seq folded into it, the record) of a finished submission, or None."""
        rows = self._rows("SELECT seq, doc FROM submissions WHERE uuid = ?", (uuid,))
        return (rows[0][0], _decode(rows[0][1])) if rows else None

    def has(self, uuid: str) -> bool:
        """Whether the projection holds ``uuid``."""
        return bool(self._rows("SELECT 1 FROM submissions WHERE uuid = ?", (uuid,)))

    def known_among(self, uuids: Iterable[str]) -> set[str]:
        """Those of ``uuids`` the projection holds (asked in batches: one query per 500)."""
        uuids = list(uuids)
        found: set[str] = set()
        for i in range(0, len(uuids), 500):
            chunk = uuids[i:i + 500]
            found.update(r[0] for r in self._rows(
                f"SELECT uuid FROM submissions WHERE uuid IN ({','.join('?' * len(chunk))})", tuple(chunk)))
        return found

    def uuids_with_prefix(self, prefix: str, limit: int = 100) -> list[str]:
        """Uuids that start with ``prefix`` (lower case), in order, at most ``limit``."""
        prefix = prefix.lower()
        if not prefix:
            return []
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        return [r[0] for r in self._rows("SELECT uuid FROM submissions WHERE uuid >= ? AND uuid < ? "
                                         "ORDER BY uuid LIMIT ?", (prefix, upper, limit))]

    def select(self, query: Query, before: int | None = None, limit: int = 50) -> list[tuple[int, Submission]]:
        """(received seq, record) of the newest finished submissions that match, newest first.

        ``before``: only those received before that seq (the cursor of the previous page):
        a keyset predicate on the table's integer key, which every index ends with, so a
        next page is one index range like the first (``plan`` shows it).
        """
        condition, args = self._where(query, before)
        if query.since is not None and self._recent(query.since):
            # few rows since then: take them through the time index and order them here (a
            # scan in arrival order would read on to the oldest row when fewer match)
            found = sorted((r[0] for r in self._rows(
                "SELECT rseq FROM submissions INDEXED BY submissions_by_received" + condition, tuple(args))),
                reverse=True)[:limit]
            marks = ",".join("?" * len(found))
            rows = self._rows(f"SELECT rseq, doc FROM submissions WHERE rseq IN ({marks}) ORDER BY rseq DESC",
                              tuple(found)) if found else []
        else:
            rows = self._rows(_PAGE_SQL.format(condition=condition), (*args, limit))
        return [(rseq, _decode(doc)) for rseq, doc in rows]

    def plan(self, query: Query, before: int | None = None) -> list[str]:
        """SQLite's query plan (``EXPLAIN QUERY PLAN`` details) of ``select``'s page query,
        e.g. ``SEARCH submissions USING INDEX submissions_by_submitter (submitter_id=? AND rowid<?)``."""
        condition, args = self._where(query, before)
        return [row[3] for row in self._rows("EXPLAIN QUERY PLAN " + _PAGE_SQL.format(condition=condition),
                                             (*args, 50))]

    @staticmethod
    def _where(query: Query, before: int | None) -> tuple[str, list[Any]]:
        """The WHERE clause (empty or with its leading space) and its arguments."""
        where: list[str] = []
        args: list[Any] = []
        if query.submitter is not None:
            where.append("submitter_id = ?")
            args.append(query.submitter)
        if query.kernel_id is not None:
            where.append("kernel_id = ?")
            args.append(query.kernel_id)
        if query.kernel_prefix is not None:
            folder = query.kernel_prefix.rstrip("/")
            where.append("(kernel_id = ? OR (kernel_id >= ? AND kernel_id < ?))")
            args += [folder, folder + "/", folder + "0"]  # "0" follows "/"
        if query.status is not None:
            where.append("status = ?")
            args.append(query.status)
        if query.since is not None:
            where.append("received_at >= ?")
            args.append(query.since)
        if before is not None:
            where.append("rseq < ?")
            args.append(before)
        return (" WHERE " + " AND ".join(where) if where else ""), args

    def _recent(self, since: str) -> bool:
        """Whether fewer than ``SINCE_WINDOW`` rows were received at or after ``since`` (counted on the index)."""
        (count,) = self._rows("SELECT count(*) FROM (SELECT 1 FROM submissions INDEXED BY submissions_by_received "
                              "WHERE received_at >= ? LIMIT ?)", (since, SINCE_WINDOW))[0]
        return count < SINCE_WINDOW

    def idempotency(self, submitter: str, key: str) -> list | None:
        """``[uuid, sha256, received ts]`` of the newest finished submission that carried this key."""
        rows = self._rows("SELECT doc FROM submissions WHERE submitter_id = ? AND idempotency_key = ? "
                          "ORDER BY rseq DESC LIMIT 1", (submitter, key))
        if not rows:
            return None
        sub = _decode(rows[0][0])
        return [sub.uuid, sub.sha256, sub.received_at]

    def records_of_kernel(self, kernel_id: str) -> list[Submission]:
        """Every finished record of a kernel, in arrival order."""
        return [_decode(doc) for (doc,) in self._rows(
            "SELECT doc FROM submissions WHERE kernel_id = ? ORDER BY rseq", (kernel_id,))]

    def finished(self, ended_before: str | None = None, page: int = 5000) -> Iterator[list[tuple[str, str, str]]]:
        """Pages of (uuid, status, ts of its last change) of the finished submissions, in uuid order.

        ``ended_before``: only those whose last change is older than that ts. Pages keep
        the memory of a walk over the whole history at one page's.
        """
        after = ""
        while True:
            sql, args = "SELECT uuid, status, ended_at FROM submissions WHERE uuid > ?", [after]
            if ended_before is not None:
                sql += " AND ended_at < ?"
                args.append(ended_before)
            rows = self._rows(sql + " ORDER BY uuid LIMIT ?", (*args, page))
            if not rows:
                return
            yield rows
            after = rows[-1][0]

    def count(self) -> int:
        """How many finished submissions the projection holds."""
        return self._rows("SELECT count(*) FROM submissions", ())[0][0]

    def accept_latency(self) -> dict[str, Any]:
        """``{buckets: {bound: cumulative count}, sum, count}`` of received → accepted seconds
        over the accepted (not revoked) submissions held."""
        per = dict((b, (n, t)) for b, n, t in self._rows("SELECT bucket, count, total FROM accept_latency", ()))
        running, buckets = 0, {}
        for i, bound in enumerate(ACCEPT_LATENCY_BOUNDS):
            running += per.get(i, (0, 0.0))[0]
            buckets[bound] = running
        return {"buckets": buckets, "sum": sum(t for _n, t in per.values()),
                "count": sum(n for n, _t in per.values())}

    # --- closing ------------------------------------------------------------------------

    def close(self) -> None:
        """Close every connection (idempotent; the queries in progress finish first)."""
        with self._readers_cond:
            if self._closed:
                return
            self._closed = True
            while len(self._free) < len(self._readers):
                self._readers_cond.wait(1.0)
            readers, self._readers, self._free = self._readers, [], []
        for conn in readers:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        with self._lock:
            try:
                self._db.close()
            except sqlite3.Error:
                pass

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"History({str(self.path)!r}, seq={self.seq}{', readonly' if self.readonly else ''})"


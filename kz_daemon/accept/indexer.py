"""index.json: the leaderboard index, updated incrementally after each accept.

The document itself is built by the contract library (``kz_runner.contract.indexing.build``:
``build_index`` for a full scan, ``update_index`` for the kernels an accept
touched), from the checked-out files, which ``GitStore.sync_files`` brings to HEAD
first. This module adds the daemon's part: the atomic replace of ``DIR/index.json``
and the ``index.updated`` event with a version that increases with every rewrite.
At 10,000 kernels the document is ~15 MB, so the file is assembled from cached
per-kernel JSON fragments (one entry re-encoded per accept, compact C-encoded
JSON). A full rebuild at the same HEAD gives the identical document
(tests/test_daemon_index_mirror.py).
"""
from __future__ import annotations

import bisect
import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from dulwich.diff_tree import tree_changes
from dulwich.objects import ObjectID

from kz_daemon.config.ports import Daemon
from kz_daemon.core.clock import iso_now
from kz_daemon.storage.gitstore import GitStore
from kz_events import durable, events as ev
from kz_runner.contract.host import usable_cpus
from kz_runner.contract.indexing import build as lib
from kz_runner.contract.indexing.cache import ContentsCache
from kz_runner.contract.layout import KP

logger = logging.getLogger(__name__)


def build(repo_root: Path, head: str | None = None, generated_at: str | None = None,
          cache: ContentsCache | None = None, workers: int = 1) -> dict[str, object]:
    """A full index document of the checked-out repo at ``repo_root`` (``cache``: parsed contract files).

    ``workers`` > 1 forks helper processes: only for a process with no other thread.
    """
    return lib.build_index(repo_root, head=head, generated_at=generated_at, cache=cache, workers=workers)


#: most processes a start-up rebuild forks (the CLI's ``kz index`` uses the same cap)
STARTUP_WORKERS_MAX = 8


def startup_workers() -> int:
    """How many processes a rebuild may use now: the CPUs (at most 8) while this process runs no
    other thread, else 1.

    A forked child holds only the forking thread; a lock another thread held at the fork stays
    locked there. With no other thread there is no such lock, and none can appear before the
    fork: only a running thread could start one.
    """
    if threading.active_count() != 1 or not hasattr(os, "fork"):
        return 1
    return usable_cpus(STARTUP_WORKERS_MAX)


def update(doc: dict | None, repo_root: Path, kernel_ids: Iterable[str], head: str | None = None,
           generated_at: str | None = None, cache: ContentsCache | None = None) -> dict[str, object]:
    """``doc`` with the entries of ``kernel_ids`` recomputed from ``repo_root`` (a full build when None)."""
    if doc is None:
        return build(repo_root, head, generated_at, cache)
    return lib.update_index(doc, repo_root, list(kernel_ids), head=head, generated_at=generated_at,
                               cache=cache)


def kernel_count(doc: dict) -> int:
    """Number of kernels in an index document (list or mapping under ``kernels``)."""
    kernels = doc.get("kernels") or []
    return len(kernels)


def canonical(doc: dict) -> bytes:
    """Compact JSON bytes of an index document (the C encoder: fast at 10,000 kernels)."""
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"


_PLACEHOLDER = "__KZ_KERNELS__"


class IndexFile:
    """index.json written from per-kernel JSON fragments, so an accept re-encodes one entry.

    The file is a projection of HEAD: it is replaced atomically (temp file + rename)
    but not fsynced; after a crash, recovery rebuilds it whenever the log's last
    ``index.updated`` head differs from HEAD or the file does not parse. The fragments'
    kernel_ids are kept sorted beside them, so an accept finds what it changes by
    bisection instead of walking all 10,000 entries.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fragments: dict[str, bytes] = {}
        self.order: list[str] = []  # the fragments' kernel_ids, sorted (the file's order)

    def reset(self, doc: dict) -> None:
        """Encode every entry of ``doc`` afresh (and sort its kernels, should a file read back not be)."""
        kernels = doc.get("kernels", [])
        if not lib.is_sorted(kernels):
            kernels.sort(key=lambda k: k["kernel_id"])
        self.fragments = {k["kernel_id"]: _encode(k) for k in kernels}
        self.order = sorted(self.fragments)

    def refresh(self, doc: dict, kernel_ids: Iterable[str]) -> None:
        """Re-encode the entries of ``kernel_ids`` (and drop those gone, nested ones included)."""
        kernels = doc.get("kernels", [])
        order = self.order
        for kid in kernel_ids:
            for stale in lib.family(order, kid, key=None):
                del self.fragments[stale]
                del order[bisect.bisect_left(order, stale)]
            for entry in lib.family(kernels, kid):  # none of them is left in the fragments now
                bisect.insort(order, entry["kernel_id"])
                self.fragments[entry["kernel_id"]] = _encode(entry)
        if len(self.fragments) != len(kernels) or len(self.order) != len(kernels):
            self.reset(doc)  # defensive: never write a partial list

    def write(self, doc: dict, fragments: dict[str, bytes] | None = None, order: list[str] | None = None) -> None:
        """Replace the file atomically with ``doc`` (kernels joined from the fragments, in ``order``)."""
        fragments = self.fragments if fragments is None else fragments
        order = self.order if order is None else order
        head = json.dumps({**doc, "kernels": _PLACEHOLDER}, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode("utf-8")
        before, _sep, after = head.partition(json.dumps(_PLACEHOLDER).encode())
        body = b",".join(fragments[k] for k in order)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        durable.atomic_write(self.path, before + b"[" + body + b"]" + after + b"\n", fsync=False)


def _encode(entry: dict) -> bytes:
    return json.dumps(entry, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


class Indexer:
    """Owns DIR/index.json for a Zoo (callers of rebuild/update/catch_up hold ``zoo.git_lock``).

    ``update`` (the accept saga's index step) recomputes the touched entries of the
    in-memory document, which :meth:`current` serves at once; the ~15 MB file is
    written by a background thread (coalescing bursts of accepts), which then emits
    ``index.updated``. ``stop`` flushes. After a crash the file may lag HEAD:
    :meth:`catch_up` (start-up recovery) updates it for the packages that changed
    between its head and HEAD, or rebuilds it when it is unreadable.
    """

    def __init__(self, zoo: Daemon) -> None:
        self.zoo = zoo
        self.path: Path = zoo.config.paths.index
        self.file = IndexFile(self.path)
        self._doc: dict | None = None
        # Parsed contract files by content: a rebuild after a restart re-reads but does not re-parse.
        self.cache_path = zoo.config.state_dir / "index-cache.json"
        self.cache = ContentsCache.load(self.cache_path)
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self._fast = OneKernelUpdate()
        self._dirty = False
        self._last_update = 0.0
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- reading -------------------------------------------------------------------
    def _load(self) -> dict | None:
        if self._doc is None:
            try:
                self._doc = json.loads(self.path.read_text(encoding="utf-8"))
                self.file.reset(self._doc)
            except (FileNotFoundError, ValueError):
                self._doc = None
        return self._doc

    def current(self) -> dict:
        """The current index document (in memory; fresh right after an accept)."""
        with self._cond:
            doc = self._doc
        if doc is not None:
            return doc
        with self.zoo.git_lock:
            doc = self._load()
            return doc if doc is not None else self.rebuild()

    # -- writing -------------------------------------------------------------------
    def _stamp(self) -> tuple[str | None, str]:
        return self.zoo.git.head(), iso_now(self.zoo.clock)

    def _write_now(self) -> None:
        """Write the in-memory document and announce it (index.updated)."""
        # _write_lock orders writes and their events (never zoo.lock here: callers may
        # hold git_lock); the snapshot is taken under _cond, the slow write outside it.
        with self._write_lock:
            with self._cond:
                doc = self._doc
                self._dirty = False
                if doc is None:
                    return
                fragments, order = dict(self.file.fragments), list(self.file.order)
            self.file.write(doc, fragments, order)
            zoo = self.zoo
            zoo.store.emit(ev.IndexUpdated(version=zoo.store.state.index_version + 1, head=doc.get("head"),
                                           kernels=kernel_count(doc)))

    def rebuild(self, startup: bool = False) -> dict:
        """Full rebuild from the repo at HEAD; written and announced before returning.

        ``startup`` (recovery, before the daemon's threads start): when this process runs no
        other thread right then (see :func:`startup_workers`), the scan is spread over forked
        processes; the document is the same.
        """
        self.zoo.git.sync_files()
        head, now = self._stamp()
        workers = startup_workers() if startup and self._thread is None else 1  # checked just before the fork
        doc = build(self.zoo.git.root, head, now, self.cache, workers=workers)
        with self._cond:
            self.file.reset(doc)
            self._doc = doc
        self.cache.save(self.cache_path)
        self._write_now()
        return doc

    def update(self, kernel_ids: Iterable[str]) -> dict:
        """Recompute the entries of ``kernel_ids`` after an accept; the file follows in the background."""
        kernel_ids = list(kernel_ids)
        self.zoo.git.sync_files()
        old = self._load()
        if old is None:
            return self.rebuild()
        head, now = self._stamp()
        doc = None
        if len(kernel_ids) == 1:
            doc = self._fast.update(old, self.zoo.git.root, kernel_ids[0], head, now, self.cache)
        if doc is None:
            doc = update(old, self.zoo.git.root, kernel_ids, head, now, self.cache)
        with self._cond:
            self.file.refresh(doc, kernel_ids)
            self._doc = doc
            self._dirty = True
            self._last_update = time.monotonic()
            self._cond.notify_all()
        if self._thread is None:  # not started (tools, tests): write synchronously
            self._write_now()
        return doc

    def catch_up(self) -> str:
        """Bring index.json to HEAD at start-up: 'current', 'updated' (changed packages only) or 'rebuilt'."""
        git = self.zoo.git
        head = git.head()
        doc = self._load()
        if head is None:
            return "current"
        if doc is None or not isinstance(doc.get("head"), str) or doc["head"].encode() not in git.store:
            self.rebuild(startup=True)  # a cold start: the scan may use forked helpers
            return "rebuilt"
        if doc.get("head") == head and self.zoo.store.state.index_head == head:
            return "current"
        kernel_ids = changed_packages(git, doc["head"], head)
        git.sync_files()
        now = self._stamp()[1]
        new = update(doc, git.root, kernel_ids, head, now, self.cache)
        with self._cond:
            self.file.refresh(new, kernel_ids)
            self._doc = new
        self._write_now()
        return "updated"

    # -- the writer thread ---------------------------------------------------------
    def start(self) -> None:
        """Start the background writer."""
        self._thread = threading.Thread(target=self._run, name="kz-index-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._dirty and not self._stopping:
                    self._cond.wait()
                # Write in a quiet moment (WRITE_QUIET_S without an update), or once the file
                # is MAX_STALE_S behind: a burst of accepts becomes one ~15 MB write, and the
                # accepts' fsyncs do not wait in the journal behind index.json's writeback.
                first = time.monotonic()
                while not self._stopping:
                    now = time.monotonic()
                    quiet = now - self._last_update
                    if quiet >= WRITE_QUIET_S or now - first >= MAX_STALE_S:
                        break
                    self._cond.wait(min(WRITE_QUIET_S - quiet, MAX_STALE_S - (now - first)))
                if self._stopping:
                    return
            try:
                self._write_now()
            except Exception as exc:  # the next accept or the stop retries
                logger.warning("index.json not written: %s: %s", type(exc).__name__, exc)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the writer and flush a pending write; persist the parse cache."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        # A clean stop leaves index.json at the in-memory document's HEAD (kz audit counts a
        # stale file without a running daemon as an error). A write the thread began before
        # the join gave up finishes first (it holds _write_lock; stopping, it starts no other).
        with self._write_lock:
            pass
        if self._dirty:
            self._write_now()
        self.cache.save(self.cache_path)


class OneKernelUpdate:
    """The common accept case in O(log N): one package changed, nothing nested in or around it.

    ``update_index`` re-lists and re-counts all 10,000 entries on every call (~30 ms);
    here the entries, their sorted ids and the counts are kept between accepts and
    only the changed entry is recomputed (``kernel_entry``, the same function a full
    build uses). Anything unusual (nesting, a package that disappeared, a document
    that is not the one last produced here) returns None and the caller falls back
    to ``update_index``. tests/test_daemon_index_mirror.py checks the result equals a
    full rebuild.
    """

    COUNT_KEYS = ("kernels", "valid", "invalid", "frozen", "deprecated", "with_warnings", "cases")

    def __init__(self) -> None:
        self._doc: dict | None = None  # the document the kept entries describe (compared by identity)
        self.hits = 0
        self._entries: dict[str, dict] = {}
        self._ids: list[str] = []
        self._counts: dict[str, int] = {}

    @classmethod
    def contribution(cls, entry: dict) -> dict[str, int]:
        """What one entry adds to the document's counts (the rules of ``build_index``)."""
        return {
            "kernels": 1,
            "valid": 1 if entry["valid"] else 0,
            "invalid": 0 if entry["valid"] else 1,
            "frozen": 1 if entry["status"] == "frozen" else 0,
            "deprecated": 1 if entry["status"] == "deprecated" else 0,
            "with_warnings": 1 if any(p["severity"] == "warning" for p in entry["problems"]) else 0,
            "cases": len(entry["cases"]),
        }

    def _adopt(self, doc: dict) -> bool:
        kernels = doc.get("kernels") or []
        self._entries = {k["kernel_id"]: k for k in kernels}
        self._ids = sorted(self._entries)
        if self._ids != [k["kernel_id"] for k in kernels]:  # unsorted or repeated ids: not the simple case
            return False
        counts = dict.fromkeys(self.COUNT_KEYS, 0)
        for entry in kernels:
            for key, value in self.contribution(entry).items():
                counts[key] += value
        if counts != doc.get("counts"):
            return False
        self._counts = counts
        self._doc = doc
        return True

    def update(self, doc: dict, root: Path, kernel_id: str, head: str | None, generated_at: str,
               cache: ContentsCache | None) -> dict | None:
        """The new document, or None when this is not the simple case."""
        if not (root / kernel_id / KP).is_dir():
            return None
        if self._doc is not doc and not self._adopt(doc):
            return None
        i = bisect.bisect_left(self._ids, kernel_id + "/")
        if i < len(self._ids) and self._ids[i].startswith(kernel_id + "/"):
            return None  # packages below it: the general path handles nesting
        parts = kernel_id.split("/")
        if any("/".join(parts[:n]) in self._entries for n in range(1, len(parts))):
            return None  # it lies inside another package
        entry = lib.kernel_entry(root, kernel_id, cache)
        if any(p["code"] == "NESTED_PACKAGE" for p in entry["problems"]):
            return None
        old = self._entries.get(kernel_id)
        kernels = list(doc["kernels"])  # a copy: ``doc`` is left as it was
        at = bisect.bisect_left(self._ids, kernel_id)
        if old is not None:
            for key, value in self.contribution(old).items():
                self._counts[key] -= value
            kernels[at] = entry
        else:
            self._ids.insert(at, kernel_id)
            kernels.insert(at, entry)
        for key, value in self.contribution(entry).items():
            self._counts[key] += value
        self._entries[kernel_id] = entry
        new = {"schema_version": doc.get("schema_version", lib.SCHEMA_VERSION),
               "head": head, "generated_at": generated_at, "counts": dict(self._counts),
               "kernels": kernels}
        self._doc = new
        self.hits += 1
        return new


def changed_packages(git: GitStore, old_commit: str, new_commit: str) -> list[str]:
    """kernel_ids whose package folder differs between two commits (present in either)."""
    found: set[str] = set()
    old_tree, new_tree = git.tree_of(old_commit), git.tree_of(new_commit)
    for change in tree_changes(git.store, None if old_tree is None else ObjectID(old_tree),
                               None if new_tree is None else ObjectID(new_tree)):
        for side, commit in ((change.old, old_commit), (change.new, new_commit)):
            if side is None or side.path is None:
                continue
            parts = side.path.decode().split("/")
            if KP in parts:
                found.add("/".join(parts[:parts.index(KP)]))
                continue
            for i in range(len(parts) - 1, 0, -1):
                prefix = "/".join(parts[:i])
                if prefix in found or git.is_dir(f"{prefix}/{KP}", commit):
                    found.add(prefix)
                    break
    return sorted(found)


WRITE_QUIET_S = 0.3   # index.json is written once updates pause this long ...
MAX_STALE_S = 5.0     # ... or when it is this far behind

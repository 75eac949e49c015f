"""A kernel's package at any of its recorded commits, read from git with dulwich (read-only).

A kernel's *records* are the first-parent commits of the branch that changed its
folder: the commit that brought it in (the seed, or a new package's source commit),
then each accept's source and scorecard commits and each revocation. Any of them can
be named by its SHA or an unambiguous prefix of it (at least ``MIN_REV_CHARS`` hex
digits, as git asks); ``HEAD`` (or nothing) names the newest. Files are read from the
object store, never from the worktree, so what is served is what git holds.

The tarball of a record is packed the way ``kz pack`` packs a directory
(:func:`kz_runner.contract.targz.deterministic_targz`, ``bench_result.yaml`` and
caches left out), so it can be submitted again as it is.
"""
from __future__ import annotations

import re
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass

from dulwich.object_store import tree_lookup_path
from dulwich.objects import Blob, Commit, ObjectID, Tree
from dulwich.refs import HEADREF, Ref
from dulwich.repo import Repo

from kz_daemon.core.errors import ZooError
from kz_daemon.storage.gitstore import parse_trailers
from kz_daemon.storage.history import KernelHistory
from kz_runner.contract.layout import BENCH_RESULT, KP
from kz_runner.contract.targz import deterministic_targz
from kz_runner.contract.validate import is_ignored

#: The fewest hex digits a short SHA may have (git's own minimum).
MIN_REV_CHARS = 4
REV_RE = re.compile(r"^[0-9a-f]{%d,40}$" % MIN_REV_CHARS)
#: A listing stops here: a package is source code, not a data set.
MAX_FILES = 5000
#: The file the server owns: never packed into a resubmittable tarball.
SCORECARD = f"{KP}/{BENCH_RESULT}"


@dataclass(frozen=True)
class Record:
    """One commit that changed the kernel's folder."""

    commit: str          # full SHA
    parent: str | None   # first parent, None for a root commit
    tree: str            # the kernel folder's tree SHA at this commit
    time: int            # commit time, epoch seconds
    step: str            # the Kz-Step trailer (source, scorecard, revoke), "seed" for a root commit, else ""
    submission: str      # the Kz-Submission trailer, or ""
    submitter: str       # the Kz-Submitter trailer, else the author
    subject: str

    def to_json(self) -> dict:
        """The record as the API shows it."""
        return {"commit": self.commit, "parent": self.parent, "time": self.time, "step": self.step,
                "submission": self.submission or None, "submitter": self.submitter, "subject": self.subject}


@dataclass(frozen=True)
class FileEntry:
    """One file of the package at a record: its path in the package, size and whether it is executable."""

    path: str
    size: int
    executable: bool
    blob: str

    def to_json(self) -> dict:
        """The entry as the API lists it."""
        return {"path": self.path, "size": self.size, "executable": self.executable, "blob": self.blob}


def _tree_at(repo: Repo, commit: Commit | None, path: bytes) -> ObjectID | None:
    """The tree SHA at ``path`` in ``commit`` (None when absent or not a folder)."""
    if commit is None:
        return None
    try:
        mode, sha = tree_lookup_path(repo.object_store.__getitem__, commit.tree, path)
    except (KeyError, NotADirectoryError):
        return None
    return sha if stat.S_ISDIR(mode) else None


def _record(commit: Commit, tree: ObjectID) -> Record:
    message = commit.message.decode("utf-8", "replace")
    trailers = parse_trailers(message)
    author = commit.author.decode("utf-8", "replace")
    step = trailers.get("Kz-Step", "") or ("" if commit.parents else "seed")
    return Record(commit=commit.id.decode(), parent=commit.parents[0].decode() if commit.parents else None,
                  tree=tree.decode(), time=int(commit.commit_time), step=step,
                  submission=trailers.get("Kz-Submission", ""),
                  submitter=trailers.get("Kz-Submitter", "") or author.split(" <", 1)[0],
                  subject=message.strip().split("\n", 1)[0] if message.strip() else "")


def safe_path(path: str) -> str:
    """``path`` when it is a plain relative path inside a package; BAD_REQUEST otherwise.

    Nothing is ever joined onto a file system path: the lookup walks the kernel's git
    tree, so ``..`` could not leave it anyway; refusing it says so plainly.
    """
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") for p in parts) or "\\" in path or "\x00" in path:
        raise ZooError("BAD_REQUEST", f"{path!r} is not a plain relative path inside the package "
                       "(no empty, '.' or '..' segment)", {"path": path})
    return path


class KernelRevisions:
    """Reads a kernel's records, files and tarballs from the repo ``history`` reads (cached per branch head)."""

    def __init__(self, history: KernelHistory, cache_size: int = 256) -> None:
        self.history = history
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[ObjectID, list[Record]]] = OrderedDict()
        self._cache_size = cache_size

    def _open(self) -> Repo:
        try:
            return Repo(str(self.history.repo_path))
        except Exception:
            raise ZooError("UNAVAILABLE", "the kernel repo cannot be read") from None

    def _head(self, repo: Repo) -> ObjectID | None:
        for ref in (Ref(b"refs/heads/" + self.history.branch), HEADREF):
            try:
                return repo.refs[ref]
            except KeyError:
                continue
        return None

    def _records(self, repo: Repo, kernel_id: str) -> list[Record]:
        """Newest first. Cached per kernel; a moved head walks only the commits since the cached one."""
        head = self._head(repo)
        if head is None:
            return []
        with self._lock:
            cached = self._cache.get(kernel_id)
        if cached is not None and cached[0] == head:
            return cached[1]
        stop = cached[0] if cached is not None and cached[0] in repo.object_store else None
        path = kernel_id.encode()
        found: list[Record] = []
        sha: ObjectID | None = head
        commit: Commit | None = _commit(repo, head)
        tree = _tree_at(repo, commit, path)
        while sha is not None and sha != stop and tree is not None:
            assert commit is not None  # a tree was found in it
            parent_sha = commit.parents[0] if commit.parents else None
            parent = _commit(repo, parent_sha) if parent_sha is not None else None
            parent_tree = _tree_at(repo, parent, path)
            if tree != parent_tree:
                found.append(_record(commit, tree))
            # the kernel did not exist before its first record: nothing older can be one of its records
            sha, commit, tree = parent_sha, parent, parent_tree
        records = found + (list(cached[1]) if stop is not None and cached is not None else [])
        with self._lock:
            self._cache[kernel_id] = (head, records)
            self._cache.move_to_end(kernel_id)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return records

    def records(self, kernel_id: str) -> list[Record]:
        """The kernel's records, newest first; NOT_FOUND when the kernel is not at the branch head."""
        with self._open() as repo:
            records = self._records(repo, kernel_id)
        if not records:
            raise ZooError("NOT_FOUND", f"no kernel {kernel_id!r} in the repo; GET /api/kernels lists them",
                           {"kernel_id": kernel_id})
        return records

    def resolve(self, kernel_id: str, rev: str | None) -> Record:
        """The record ``rev`` names: None, "" or HEAD → the newest; else a full or short SHA of a record.

        BAD_REQUEST for a rev that is not hex (or too short), NOT_FOUND when no record
        starts with it, AMBIGUOUS_REV when several do (``details.candidates`` lists them).
        """
        records = self.records(kernel_id)
        if rev is None or rev == "" or rev == "HEAD":
            return records[0]
        wanted = rev.lower()
        if not REV_RE.match(wanted):
            raise ZooError("BAD_REQUEST", f"rev must be HEAD or {MIN_REV_CHARS} to 40 hex digits of a commit "
                           f"SHA, got {rev[:80]!r}", {"parameter": "rev"})
        hits = [r for r in records if r.commit.startswith(wanted)]
        if not hits:
            raise ZooError("NOT_FOUND", f"no commit of {kernel_id} starts with {wanted!r}; "
                           f"GET /api/kernels/{kernel_id}/commits lists them", {"kernel_id": kernel_id, "rev": rev})
        if len(hits) > 1:
            raise ZooError("AMBIGUOUS_REV", f"{len(hits)} commits of {kernel_id} start with {wanted!r}; "
                           "give more digits", {"kernel_id": kernel_id, "rev": rev,
                                                "candidates": [r.commit for r in hits]})
        return hits[0]

    def files(self, kernel_id: str, rev: str | None) -> tuple[Record, list[FileEntry], bool]:
        """``(record, files sorted by path, truncated)``: every file of the package at the record."""
        record = self.resolve(kernel_id, rev)
        with self._open() as repo:
            out: list[FileEntry] = []
            truncated = False
            for rel, mode, sha in _walk(repo, ObjectID(record.tree.encode())):
                if len(out) >= MAX_FILES:
                    truncated = True
                    break
                assert mode is not None  # without dirs, _walk yields files only
                size = len(repo.object_store[sha].as_raw_string())
                out.append(FileEntry(rel, size, bool(mode & 0o111), sha.decode()))
        return record, out, truncated

    def read(self, kernel_id: str, path: str, rev: str | None) -> tuple[Record, bytes]:
        """``(record, bytes)`` of one file of the package at the record; NOT_FOUND when it is not a file there."""
        safe_path(path)
        record = self.resolve(kernel_id, rev)
        with self._open() as repo:
            try:
                mode, sha = tree_lookup_path(repo.object_store.__getitem__, ObjectID(record.tree.encode()),
                                             path.encode())
                obj = repo.object_store[sha]
            except (KeyError, NotADirectoryError):
                obj, mode = None, 0
            if not isinstance(obj, Blob) or not stat.S_ISREG(mode):
                raise ZooError("NOT_FOUND", f"{kernel_id} has no file {path!r} at {record.commit[:10]}; "
                               f"GET /api/kernels/{kernel_id}/files?rev={record.commit[:10]} lists them",
                               {"kernel_id": kernel_id, "path": path, "commit": record.commit})
            return record, obj.as_raw_string()

    def tarball(self, kernel_id: str, rev: str | None) -> tuple[Record, bytes]:
        """``(record, tar.gz bytes)``: the package at the record, packed as ``kz pack`` packs it."""
        record = self.resolve(kernel_id, rev)
        entries: dict[str, tuple[str, int, bytes]] = {kernel_id: ("dir", 0o755, b"")}
        with self._open() as repo:
            for rel, mode, sha in _walk(repo, ObjectID(record.tree.encode()), dirs=True):
                if rel == SCORECARD or any(is_ignored(part) for part in rel.split("/")):
                    continue
                if mode is None:
                    entries[f"{kernel_id}/{rel}"] = ("dir", 0o755, b"")
                else:
                    entries[f"{kernel_id}/{rel}"] = ("file", mode & 0o777, repo.object_store[sha].as_raw_string())
        return record, deterministic_targz(entries)

    def trees(self, kernel_id: str, old: str | None, new: str | None) -> tuple[Record, Record]:
        """The two records a diff compares (``old`` defaults to the parent record of ``new``)."""
        records = self.records(kernel_id)
        after = self.resolve(kernel_id, new)
        if old:
            before = self.resolve(kernel_id, old)
        else:
            index = next(i for i, r in enumerate(records) if r.commit == after.commit)
            before = records[index + 1] if index + 1 < len(records) else after
        return before, after


def _commit(repo: Repo, sha: ObjectID) -> Commit:
    """The commit ``sha`` (KeyError when the repo lacks it)."""
    commit = repo[sha]
    assert isinstance(commit, Commit), f"{sha!r} is not a commit"
    return commit


def _walk(repo: Repo, tree_id: ObjectID, dirs: bool = False) -> list[tuple[str, int | None, ObjectID]]:
    """``(relative path, mode, sha)`` of each regular file under a tree (links and submodules skipped);
    with ``dirs``, folders too, as ``(path, None, sha)``. Paths come out sorted."""
    stack: list[tuple[ObjectID, str]] = [(tree_id, "")]
    found: list[tuple[str, int | None, ObjectID]] = []
    while stack:
        sha, prefix = stack.pop()
        tree = repo.object_store[sha]
        if not isinstance(tree, Tree):
            continue
        for entry in tree.iteritems():
            name = entry.path.decode("utf-8", "replace")
            rel = f"{prefix}/{name}" if prefix else name
            if stat.S_ISDIR(entry.mode):
                if dirs:
                    found.append((rel, None, entry.sha))
                stack.append((entry.sha, rel))
            elif stat.S_ISREG(entry.mode):
                found.append((rel, entry.mode, entry.sha))
    return sorted(found, key=lambda item: item[0])

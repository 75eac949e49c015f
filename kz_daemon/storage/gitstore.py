"""A thin porcelain over dulwich's object model: the daemon's only way to write git.

Why not ``dulwich.porcelain.add/commit``: they stat and re-read the whole index, so
a two-commit accept on a repo of 10,000 packages takes over a minute (docs/architecture.md).
Here a commit is built from the object store: only the trees on the changed paths
are rewritten (bottom-up), new objects are written durably (each loose object file
fsynced, then its directory), and the branch moves only by compare-and-swap
(``refs.set_if_equals``). The daemon never runs the ``git`` binary; the repo stays
a normal repository the ``git`` CLI reads (tests check ``git fsck``).

The checked-out worktree (and git's index file) is a *view* for people who browse
the repo and for the indexer, which reads package files from disk. HEAD is the
truth. :meth:`GitStore.sync_files` brings the files of the paths that changed
since the last sync to HEAD (cheap: only differing subtrees are read) and runs on
the accept path; rewriting git's 50,000-entry index file costs about a second, so
:meth:`GitStore.sync_index` runs from a background thread after accepts and at
start-up. ``git status`` is clean once both have run.

Commit messages carry trailers (``Kz-Submission``, ``Kz-Submitter``, ``Kz-Runner``,
``Kz-Step``) so history explains itself and recovery can see what reached git.
"""
from __future__ import annotations

import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Final, Literal, Union, overload

from dulwich.diff_tree import tree_changes
from dulwich.index import index_entry_from_stat
from dulwich.objects import Blob, Commit, ObjectID, ShaFile, Tree
from dulwich.refs import HEADREF, Ref
from dulwich.repo import Repo

from kz_daemon.core.errors import ZooError
from kz_events import durable

TREE_MODE = 0o040000
FILE_MODE = 0o100644
EXEC_MODE = 0o100755
WORKTREE_MARK = "kz-worktree"  # file under .git: the tree SHA the checked-out files show
INDEX_MARK = "kz-index"        # file under .git: the tree SHA git's index file matches
TREE_CACHE = 1024              # commits whose root tree id is kept in memory (the recent ones are read)
#: parsed trees kept in memory: at most this many, and at most about this many bytes (a tree
#: is costed at 200 bytes plus 100 per entry: its entries dict, tuples and ids). Every accept
#: adds some 7 new trees; a bounded cache keeps a running daemon's memory flat.
TREE_CACHE_TREES = 1024
TREE_CACHE_BYTES = 8 * 1024 * 1024

# A change's value: file bytes, (bytes, mode), or None to delete the file or folder.
Change = Union[bytes, "tuple[bytes, int]", None]


def _tree_cost(tree: Tree) -> int:
    """What a parsed tree is counted as against TREE_CACHE_BYTES."""
    return 200 + 100 * len(tree)


class CommitConflict(ZooError):
    """The branch moved under us (compare-and-swap failed): nothing was changed."""


@dataclass(frozen=True)
class CommitInfo:
    """A commit as recovery and audit see it."""

    sha: str
    parents: tuple[str, ...]
    subject: str
    trailers: dict[str, str]
    commit_time: int


class _Node:
    """A folder in the change plan; ``clear`` means its old content is dropped first."""

    __slots__ = ("clear", "children")

    def __init__(self, clear: bool = False) -> None:
        self.clear = clear
        self.children: dict[bytes, _Node | Literal[_Mark.DELETE] | tuple[bytes, int]] = {}


class _Mark(Enum):
    """A plan's mark for a file or folder to delete (a one-member enum: a sentinel mypy can narrow)."""

    DELETE = 0


_DELETE: Final = _Mark.DELETE


def format_message(subject: str, trailers: Mapping[str, str], body: str = "") -> str:
    """A commit message: subject, optional body, then ``Key: value`` trailer lines."""
    parts = [subject.strip()]
    if body.strip():
        parts.append(body.strip())
    if trailers:
        parts.append("\n".join(f"{k}: {v}" for k, v in trailers.items()))
    return "\n\n".join(parts) + "\n"


def parse_trailers(message: str) -> dict[str, str]:
    """The ``Key: value`` lines of the message's last paragraph (keys with a dash or ``Kz``)."""
    paragraphs = [p for p in message.strip().split("\n\n") if p.strip()]
    if len(paragraphs) < 2:
        return {}
    out: dict[str, str] = {}
    for line in paragraphs[-1].splitlines():
        key, sep, value = line.partition(": ")
        if not sep or " " in key or not key:
            return {}
        out[key] = value.strip()
    return out


class GitStore:
    """One non-bare repository and one branch; build with :meth:`open` or :meth:`init`."""

    def __init__(self, repo: Repo, branch: str = "main", fsync: bool = True,
                 clock: Callable[[], float] = time.time) -> None:
        self.repo = repo
        self.root = Path(repo.path)
        self.git_dir = Path(repo.controldir())
        self.branch = branch
        self.ref = Ref(f"refs/heads/{branch}".encode())
        self.fsync = fsync
        self.clock = clock
        # Objects are fsynced by us (file and directory) in _write_objects.
        self.store = repo.object_store
        # Trees are immutable by id: keep recently read ones parsed (the top levels of a
        # 10,000-package repo are read on every lookup and every commit).
        self._trees: dict[ObjectID, Tree] = {}
        self._tree_bytes = 0  # the cost of the cached trees, as TREE_CACHE_BYTES counts it
        self._cache_lock = threading.Lock()
        self._commit_trees: dict[str, ObjectID] = {}

    # -- opening -------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, branch: str = "main", fsync: bool = True,
             clock: Callable[[], float] = time.time) -> GitStore:
        """Open an existing repository at ``path`` (its worktree root)."""
        return cls(Repo(str(path)), branch, fsync, clock)

    @classmethod
    def init(cls, path: str | Path, branch: str = "main", fsync: bool = True,
             clock: Callable[[], float] = time.time) -> GitStore:
        """Create a non-bare repository at ``path`` whose HEAD names ``branch`` (no commit yet)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        repo = Repo.init(str(path))
        repo.refs.set_symbolic_ref(HEADREF, Ref(f"refs/heads/{branch}".encode()))
        return cls(repo, branch, fsync, clock)

    @classmethod
    def open_or_init(cls, path: str | Path, branch: str = "main", fsync: bool = True,
                     clock: Callable[[], float] = time.time) -> GitStore:
        """Open the repository at ``path``, creating it (empty) if there is none."""
        if (Path(path) / ".git").exists():
            return cls.open(path, branch, fsync, clock)
        return cls.init(path, branch, fsync, clock)

    def close(self) -> None:
        """Release the repository's file handles (pack files)."""
        self.repo.close()

    # -- reading -------------------------------------------------------------------
    def head(self) -> str | None:
        """The branch's commit SHA (hex), or None before the first commit."""
        try:
            return self.repo.refs[self.ref].decode()
        except KeyError:
            return None

    @overload
    def tree_of(self, commit_sha: str) -> ObjectID: ...

    @overload
    def tree_of(self, commit_sha: None) -> None: ...

    @overload
    def tree_of(self, commit_sha: str | None) -> ObjectID | None: ...

    def tree_of(self, commit_sha: str | None) -> ObjectID | None:
        """The root tree id of ``commit_sha`` (None for None)."""
        if commit_sha is None:
            return None
        found = self._commit_trees.get(commit_sha)
        if found is None:
            commit = self.store[ObjectID(commit_sha.encode())]
            assert isinstance(commit, Commit), f"{commit_sha} is not a commit"
            found = commit.tree
            if len(self._commit_trees) >= TREE_CACHE:
                self._commit_trees.pop(next(iter(self._commit_trees)))
            self._commit_trees[commit_sha] = found
        return found

    def tree(self, tree_id: ObjectID) -> Tree:
        """The parsed tree ``tree_id`` (cached; trees never change)."""
        found = self._trees.get(tree_id)
        if found is None:
            obj = self.store[tree_id]
            assert isinstance(obj, Tree), f"{tree_id!r} is not a tree"
            found = obj
            cost = _tree_cost(found)
            with self._cache_lock:  # the intake, the saga and the pages read trees from their own threads
                while self._trees and (len(self._trees) >= TREE_CACHE_TREES
                                       or self._tree_bytes + cost > TREE_CACHE_BYTES):
                    self._tree_bytes -= _tree_cost(self._trees.pop(next(iter(self._trees))))
                if tree_id not in self._trees:
                    self._trees[tree_id] = found
                    self._tree_bytes += cost
        return found

    def _lookup(self, path: str, commit_sha: str | None) -> tuple[int, ObjectID] | None:
        tree_id = self.tree_of(commit_sha if commit_sha is not None else self.head())
        if tree_id is None:
            return None
        mode, sha = TREE_MODE, tree_id
        for part in [p for p in path.strip("/").split("/") if p]:
            if mode != TREE_MODE:
                return None
            tree = self.tree(sha)
            try:
                mode, sha = tree[part.encode()]
            except KeyError:
                return None
        return mode, sha

    def read_file(self, path: str, commit_sha: str | None = None) -> bytes | None:
        """The bytes of ``path`` at ``commit_sha`` (default HEAD), or None if absent or a folder."""
        found = self._lookup(path, commit_sha)
        if found is None or found[0] == TREE_MODE:
            return None
        return self.store[found[1]].as_raw_string()

    def is_dir(self, path: str, commit_sha: str | None = None) -> bool:
        """Whether ``path`` is a folder at ``commit_sha`` (default HEAD)."""
        found = self._lookup(path, commit_sha)
        return found is not None and found[0] == TREE_MODE

    def exists(self, path: str, commit_sha: str | None = None) -> bool:
        """Whether ``path`` (file or folder) exists at ``commit_sha`` (default HEAD)."""
        return self._lookup(path, commit_sha) is not None

    def list_files(self, prefix: str = "", commit_sha: str | None = None) -> list[str]:
        """Every file path under ``prefix`` (repo-relative, sorted), at ``commit_sha`` or HEAD."""
        return sorted(p for p, _mode, _sha in self.walk_files(prefix, commit_sha))

    def walk_files(self, prefix: str = "",
                   commit_sha: str | None = None) -> Iterator[tuple[str, int, ObjectID]]:
        """Yield (path, mode, blob id) for every file under ``prefix`` in tree order."""
        prefix = prefix.strip("/")
        found = self._lookup(prefix, commit_sha)
        if found is None:
            return
        if found[0] != TREE_MODE:
            yield prefix, found[0], found[1]
            return
        stack = [(prefix, found[1])]
        while stack:
            base, tree_id = stack.pop()
            tree = self.store[tree_id]
            assert isinstance(tree, Tree), f"{tree_id!r} is not a tree"
            for entry in sorted(tree.iteritems(), key=lambda e: e.path, reverse=True):
                name = entry.path.decode()
                full = f"{base}/{name}" if base else name
                if entry.mode == TREE_MODE:
                    stack.append((full, entry.sha))
                else:
                    yield full, entry.mode, entry.sha

    def commit_info(self, sha: str) -> CommitInfo:
        """Subject, parents and trailers of one commit."""
        commit = self.store[ObjectID(sha.encode())]
        assert isinstance(commit, Commit), f"{sha} is not a commit"
        message = commit.message.decode("utf-8", "replace")
        return CommitInfo(sha=sha, parents=tuple(p.decode() for p in commit.parents),
                          subject=message.split("\n", 1)[0], trailers=parse_trailers(message),
                          commit_time=commit.commit_time)

    def log(self, start: str | None = None, stop: str | None = None,
            limit: int | None = None) -> Iterator[CommitInfo]:
        """First-parent history from ``start`` (default HEAD), newest first, until ``stop`` (excluded)."""
        sha = start if start is not None else self.head()
        count = 0
        while sha is not None and sha != stop and (limit is None or count < limit):
            info = self.commit_info(sha)
            yield info
            count += 1
            sha = info.parents[0] if info.parents else None

    def find_commits(self, key: str, value: str, since: str | None = None) -> list[CommitInfo]:
        """Commits after ``since`` (exclusive; None = all history) whose trailer ``key`` is ``value``, oldest first."""
        found = [c for c in self.log(stop=since) if c.trailers.get(key) == value]
        found.reverse()
        return found

    # -- writing -------------------------------------------------------------------
    def commit_changes(self, changes: Mapping[str, Change], message: str, author: str,
                       parent_expected: str | None, *,
                       before_ref_update: Callable[[], None] | None = None) -> str:
        """Commit ``changes`` on top of ``parent_expected`` and move the branch; returns the SHA.

        ``changes`` maps repo-relative paths to new content (bytes or (bytes, mode)) or
        None (delete that file or whole folder). Deletions apply before writes, so
        ``{"k": None, "k/a": b"..."}`` replaces folder ``k`` wholesale. Only the trees
        on the changed paths are rebuilt. Raises :class:`CommitConflict` when the
        branch is not at ``parent_expected`` (the compare-and-swap failed).
        ``before_ref_update`` is called after the objects are durable and before the
        branch moves: the accept saga's crash point between the two (fault injection).
        """
        current = self.head()
        if current != parent_expected:
            raise CommitConflict("CONFLICT", f"branch {self.branch} is at {current}, expected "
                                 f"{parent_expected}", {"head": current, "expected": parent_expected})
        new_objects: list[ShaFile] = []
        plan = _plan(changes)
        base_tree = self.tree_of(parent_expected)
        tree_id = self._apply(base_tree, plan, new_objects)
        if tree_id is None:
            empty = Tree()
            new_objects.append(empty)
            tree_id = empty.id
        commit = Commit()
        commit.tree = tree_id
        commit.parents = [ObjectID(parent_expected.encode())] if parent_expected else []
        ident = author.encode()
        commit.author = commit.committer = ident
        now = int(self.clock())
        commit.author_time = commit.commit_time = now
        commit.author_timezone = commit.commit_timezone = 0
        commit.encoding = b"UTF-8"
        commit.message = message.encode()
        new_objects.append(commit)
        self._write_objects(new_objects)
        if before_ref_update is not None:
            before_ref_update()
        if parent_expected is None:
            moved = self.repo.refs.add_if_new(self.ref, commit.id)
        else:
            moved = self.repo.refs.set_if_equals(self.ref, ObjectID(parent_expected.encode()), commit.id)
        if not moved:
            raise CommitConflict("CONFLICT", f"branch {self.branch} moved during the commit",
                                 {"expected": parent_expected})
        return commit.id.decode()

    def _apply(self, tree_id: ObjectID | None, node: _Node, out: list[ShaFile]) -> ObjectID | None:
        """Rebuild one folder: returns the new tree id, or None when it ends up empty."""
        entries: dict[bytes, tuple[int, ObjectID]] = {}
        if tree_id is not None and not node.clear:
            for entry in self.tree(tree_id).iteritems():
                entries[entry.path] = (entry.mode, entry.sha)
        for name, child in node.children.items():
            if child is _DELETE:
                entries.pop(name, None)
            elif isinstance(child, _Node):
                old = entries.get(name)
                old_tree = old[1] if old is not None and old[0] == TREE_MODE else None
                sub = self._apply(old_tree, child, out)
                if sub is None:
                    entries.pop(name, None)
                else:
                    entries[name] = (TREE_MODE, sub)
            else:
                data, mode = child
                blob = Blob.from_string(data)
                out.append(blob)
                entries[name] = (mode, blob.id)
        if not entries:
            return None
        tree = Tree()
        for name, (mode, sha) in entries.items():
            tree.add(name, mode, sha)
        if tree_id is not None and tree.id == tree_id:
            return tree_id
        out.append(tree)
        return tree.id

    def _write_objects(self, objects: Iterable[ShaFile]) -> None:
        """Write loose objects; with fsync on, every new file and then its folder is fsynced.

        The fsyncs run in a few threads at once (fsync releases the GIL), so the
        filesystem can commit them in one journal transaction instead of one each.
        """
        files: list[str] = []
        dirs: set[str] = set()
        objects_dir = Path(self.store.path)
        for obj in objects:
            hexsha = obj.id.decode()
            path = objects_dir / hexsha[:2] / hexsha[2:]
            if path.exists():
                continue
            try:
                self.store.add_object(obj)
            except OSError:
                # dulwich leaves its lock file when the flush at close fails (a full disk):
                # remove it, so the retry once there is space is not refused
                Path(f"{path}.lock").unlink(missing_ok=True)
                raise
            files.append(str(path))
            dirs.add(str(path.parent))
        if self.fsync and files:
            dirs.add(str(objects_dir))
            _fsync_all(files)
            _fsync_all(sorted(dirs))

    # -- maintenance ---------------------------------------------------------------
    def clear_stale_locks(self) -> list[str]:
        """Remove ``*.lock`` files a killed writer left under .git (call only while no writer runs)."""
        removed = []
        for base, _dirs, files in os.walk(self.git_dir):
            for name in files:
                if name.endswith(".lock"):
                    path = os.path.join(base, name)
                    os.unlink(path)
                    removed.append(os.path.relpath(path, self.git_dir))
        return sorted(removed)

    def _mark(self, name: str) -> ObjectID | None:
        path = self.git_dir / name
        return ObjectID(path.read_text().strip().encode()) if path.exists() else None

    def _set_mark(self, name: str, tree_id: ObjectID) -> None:
        durable.atomic_write(self.git_dir / name, tree_id + b"\n", fsync=False)  # a view's mark, like the view

    def sync_files(self) -> int:
        """Bring the checked-out files to HEAD for the paths changed since the last sync; returns how many.

        Fast (only the differing subtrees are read); git's index file is left to
        :meth:`sync_index`. Files are replaced by rename, so readers never see half a file.
        """
        head = self.head()
        if head is None:
            return 0
        target = self.tree_of(head)
        synced = self._mark(WORKTREE_MARK)
        if synced == target:
            return 0
        count = 0
        for change in tree_changes(self.store, synced, target):
            old, new = change.old, change.new
            if old is not None and old.path is not None and (new is None or new.path != old.path):
                self._remove_worktree_file(old.path)
                count += 1
            if new is not None and new.path is not None and new.sha is not None:
                full = self.root / new.path.decode()
                if full.is_dir() and not full.is_symlink():
                    _rmtree(full)
                full.parent.mkdir(parents=True, exist_ok=True)
                # the worktree is a view (HEAD is the truth): atomic, not fsynced
                durable.atomic_write(full, self.store[new.sha].as_raw_string(), fsync=False,
                                     mode=0o755 if new.mode == EXEC_MODE else 0o644)
                count += 1
        self._set_mark(WORKTREE_MARK, target)
        return count

    def sync_index(self) -> int:
        """Bring git's index file to the synced files (entries of changed paths only); returns how many.

        Rewriting the index costs about a second at 50,000 entries, so the daemon
        calls this from a background thread, never on the accept path.
        """
        target = self._mark(WORKTREE_MARK)
        if target is None:
            return 0
        synced = self._mark(INDEX_MARK)
        if synced == target:
            return 0
        index = self.repo.open_index()
        count = 0
        for change in tree_changes(self.store, synced, target):
            old, new = change.old, change.new
            if old is not None and old.path is not None and (new is None or new.path != old.path):
                try:
                    del index[old.path]
                except KeyError:
                    pass
                count += 1
            if new is not None and new.path is not None and new.sha is not None:
                try:
                    st = os.lstat(self.root / new.path.decode())
                except FileNotFoundError:
                    continue
                index[new.path] = index_entry_from_stat(st, new.sha, new.mode)
                count += 1
        index.write()
        self._set_mark(INDEX_MARK, target)
        return count

    def sync_worktree(self) -> int:
        """:meth:`sync_files` then :meth:`sync_index`; returns the number of files written or removed."""
        count = self.sync_files()
        self.sync_index()
        return count

    def _remove_worktree_file(self, path: bytes) -> None:
        full = self.root / path.decode()
        try:
            full.unlink()
        except FileNotFoundError:
            pass
        parent = full.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent


def _plan(changes: Mapping[str, Change]) -> _Node:
    """Turn ``{path: content|None}`` into a tree of folders; deletions first, then writes."""
    root = _Node()
    ordered = sorted(changes.items(), key=lambda kv: (kv[1] is not None, kv[0]))
    for path, value in ordered:
        parts = [p.encode() for p in path.strip("/").split("/") if p]
        if not parts or any(p in (b".", b"..", b".git") for p in parts):
            raise ValueError(f"bad path in commit: {path!r}")
        node = root
        for part in parts[:-1]:
            child = node.children.get(part)
            if not isinstance(child, _Node):
                # Missing, or deleted/replaced by a file earlier in the plan: start afresh
                # when something was removed there, otherwise merge with the old folder.
                child = _Node(clear=child is not None)
                node.children[part] = child
            node = child
        leaf = parts[-1]
        if value is None:
            node.children[leaf] = _DELETE
        else:
            data, mode = (value, FILE_MODE) if isinstance(value, (bytes, bytearray)) else value
            node.children[leaf] = (bytes(data), mode)
    return root


_FSYNC_POOL = None


def _fsync_all(paths: list[str]) -> None:
    """fsync every path (files or folders), several at once."""
    global _FSYNC_POOL
    if len(paths) == 1:
        durable.fsync_path(paths[0])
        return
    if _FSYNC_POOL is None:
        _FSYNC_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kz-fsync")
    for _ in _FSYNC_POOL.map(durable.fsync_path, paths):
        pass


def _rmtree(path: Path) -> None:
    shutil.rmtree(path)


def file_mode(st_mode: int) -> int:
    """The git mode for a file with POSIX mode ``st_mode`` (executable or not)."""
    return EXEC_MODE if st_mode & stat.S_IXUSR else FILE_MODE

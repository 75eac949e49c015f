"""A kernel's accepted history, read from git with dulwich (read-only).

Every accept ends with a commit that changes only the kernel's
``.kernel_package/bench_result.yaml`` (commit 2 of the two-commit model), so
walking the commits that touch that file and reading ``metrics_current`` at each
gives the primary metric over time. The seed scorecard (``commit_sha: "0000000"``)
is not an accept and is left out, and so is a revocation commit (``Kz-Step: revoke``,
which restores an earlier record's scorecard); the accept it takes back stays in the
history, marked ``revoked``. Results are cached per branch head. The harness
of a package (its ``benchmark.py``) is identified by its blob SHA at the head, and
its declared metrics (unit, direction) and each case's params are read from that
blob's METAS literal.
"""
from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from dulwich.object_store import tree_lookup_path
from dulwich.objects import Blob, Commit, ObjectID
from dulwich.refs import HEADREF, Ref
from dulwich.repo import Repo

from kz_daemon.core import scorecard
from kz_daemon.storage.gitstore import parse_trailers
from kz_runner.contract.layout import BENCHMARK, KP, is_seed_sha
from kz_runner.contract.rules.pysource import read_metas
from kz_runner.contract.yamlio import YAMLError, load_yaml

#: the Kz-Step trailer of a revocation commit (kz_daemon.accept.revoke writes them)
REVOKE_STEP = "revoke"
#: the Kz-Step trailer of an accept's scorecard commit (commit 2; kz_daemon.accept.saga)
SCORECARD_STEP = "scorecard"
#: the subject of an accept's source commit names its kernel: ``accept <kernel_id> (submission <uuid8>)``
_SOURCE_SUBJECT = re.compile(r"^accept (\S+) \(submission [0-9a-f]{8}\)")


@dataclass(frozen=True)
class HeadHarness:
    """A package's ``benchmark.py`` at the head: its blob SHA and the metrics its METAS declare."""

    blob: str | None  # git blob SHA (hex), None when the file is missing
    metrics: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # case -> metric -> unit, direction
    params: dict[str, dict] = field(default_factory=dict)  # case -> its METAS params (the shapes)


@dataclass(frozen=True)
class HistoryPoint:
    """One accepted run: when, by whom, which source commit, and each case's current metrics."""

    commit: str  # the bench_result commit (SHA_br)
    commit_sha: str  # the source commit the scorecard names (SHA_src)
    time: int  # commit time, epoch seconds
    recorded_at: str
    submitter: str
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # case -> metric -> value
    submission: str = ""  # the accept's Kz-Submission trailer ('' for a commit without one)
    revoked: bool = False  # a later revocation commit (Revokes: <submission>) took it back
    best: dict[str, dict[str, float]] = field(default_factory=dict)  # case -> metric -> the best after it


@dataclass(frozen=True)
class AcceptRecord:
    """One accept read from the branch: who, when, and the kernel's scorecard before and after it."""

    kernel_id: str
    submission: str  # the Kz-Submission trailer
    submitter: str
    time: int  # commit time of the scorecard commit, epoch seconds
    sha_src: str
    sha_br: str
    before: dict | None  # the scorecard in the source commit's tree: what the run was judged against
    after: dict | None  # the scorecard the accept committed
    revoked: bool = False  # a later revocation commit took it back


class KernelHistory:
    """Reads package files at the branch head and the accepted history of a kernel."""

    def __init__(self, repo_path: str | Path, branch: str = "main", max_points: int = 500,
                 cache_size: int = 256) -> None:
        self.repo_path = Path(repo_path)
        self.branch = branch.encode()
        self.max_points = max_points
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[ObjectID, list[HistoryPoint]]] = OrderedDict()
        self._cache_size = cache_size
        self._harness: dict[ObjectID, HeadHarness] = {}
        #: (head, hour of since, keep, max_walk) -> recent_accepts' answer
        self._recent: tuple[tuple[ObjectID, int, int, int], tuple[int, list[AcceptRecord]]] | None = None

    def _repo(self) -> Repo | None:
        try:
            return Repo(str(self.repo_path))
        except Exception:
            return None

    def _head(self, repo: Repo) -> ObjectID | None:
        for ref in (Ref(b"refs/heads/" + self.branch), HEADREF):
            try:
                return repo.refs[ref]
            except KeyError:
                continue
        return None

    def head(self) -> str | None:
        """The branch head's SHA, or None for an empty or missing repo."""
        repo = self._repo()
        if repo is None:
            return None
        with repo:
            head = self._head(repo)
        return head.decode() if head else None

    @staticmethod
    def _read(repo: Repo, commit_id: ObjectID, path: str) -> bytes | None:
        try:
            tree = _commit(repo, commit_id).tree
            _mode, sha = tree_lookup_path(repo.object_store.__getitem__, tree, path.encode())
            return _blob_data(repo, sha)
        except KeyError:
            return None

    def read_head(self, path: str) -> bytes | None:
        """A file's bytes at the branch head, or None."""
        repo = self._repo()
        if repo is None:
            return None
        with repo:
            head = self._head(repo)
            return self._read(repo, head, path) if head else None

    def harness(self, kernel_id: str) -> HeadHarness:
        """The kernel's ``benchmark.py`` at the head: blob SHA and declared metrics (cached per blob)."""
        repo = self._repo()
        if repo is None:
            return HeadHarness(None)
        with repo:
            head = self._head(repo)
            blob = _blob_id(repo, _commit(repo, head).tree, f"{kernel_id}/{KP}/{BENCHMARK}".encode()) if head else None
            if blob is None:
                return HeadHarness(None)
            with self._lock:
                cached = self._harness.get(blob)
            if cached is not None:
                return cached
            data = _blob_data(repo, blob)
        metas, _problems = read_metas(data)
        metrics: dict[str, dict[str, dict[str, str]]] = {}
        params: dict[str, dict] = {}
        for meta in metas or []:
            if isinstance(meta, dict) and isinstance(meta.get("params"), dict):
                params[str(meta.get("test_case_id"))] = dict(meta["params"])
            if isinstance(meta, dict) and isinstance(meta.get("metrics"), list):
                metrics[str(meta.get("test_case_id"))] = {
                    str(m.get("name")): {"unit": str(m.get("unit") or ""), "direction": str(m.get("direction") or "")}
                    for m in meta["metrics"] if isinstance(m, dict)}
        found = HeadHarness(blob.decode(), metrics, params)
        with self._lock:
            self._harness[blob] = found
            while len(self._harness) > self._cache_size:
                self._harness.pop(next(iter(self._harness)))
        return found

    def package_docs(self, kernel_id: str) -> tuple[dict | None, dict | None]:
        """``(desc.yaml, bench_result.yaml)`` of a kernel at the head, parsed as the contract reads
        them (None where absent, unreadable or not a mapping)."""
        out = []
        for name in ("desc.yaml", "bench_result.yaml"):
            raw = self.read_head(f"{kernel_id}/.kernel_package/{name}")
            try:
                doc = load_yaml(raw) if raw is not None else None
            except YAMLError:
                doc = None
            out.append(doc if isinstance(doc, dict) else None)
        return out[0], out[1]

    def recent_accepts(self, since: int, keep: int = 50, max_walk: int = 20_000) -> tuple[int, list[AcceptRecord]]:
        """``(accepts since ``since``, the newest ``keep`` accepts)`` of the whole branch, newest first.

        Walks the first-parent history from the head: every accept is a scorecard commit
        (``Kz-Step: scorecard``) whose parent is its source commit, whose subject names
        the kernel. The walk stops once it is past ``since`` and holds ``keep`` accepts,
        or after ``max_walk`` commits. Cached per head (and hour of ``since``).
        """
        repo = self._repo()
        if repo is None:
            return 0, []
        with repo:
            head = self._head(repo)
            if head is None:
                return 0, []
            key = (head, since // 3600, keep, max_walk)
            with self._lock:
                if self._recent is not None and self._recent[0] == key:
                    return self._recent[1]
            count = 0
            kept: list[AcceptRecord] = []
            revoked: set[str] = set()
            sha: ObjectID | None = head
            for _ in range(max_walk):
                if sha is None:
                    break
                commit = _commit(repo, sha)
                parent_sha = commit.parents[0] if commit.parents else None
                if commit.commit_time < since and len(kept) >= keep:
                    break
                trailers = parse_trailers(commit.message.decode("utf-8", "replace"))
                step = trailers.get("Kz-Step")
                if step == REVOKE_STEP:
                    revoked.add(trailers.get("Revokes", ""))
                elif step == SCORECARD_STEP and parent_sha is not None:
                    source = _commit(repo, parent_sha)
                    match = _SOURCE_SUBJECT.match(source.message.decode("utf-8", "replace"))
                    if match is not None:
                        count += commit.commit_time >= since
                        if len(kept) < keep:
                            path = f"{match.group(1)}/{KP}/bench_result.yaml".encode()
                            uuid = trailers.get("Kz-Submission", "")
                            kept.append(AcceptRecord(match.group(1), uuid, trailers.get("Kz-Submitter", ""),
                                                     commit.commit_time, parent_sha.decode(), sha.decode(),
                                                     _card(repo, source, path), _card(repo, commit, path),
                                                     bool(uuid) and uuid in revoked))
                sha = parent_sha
        found = (count, kept)
        with self._lock:
            self._recent = (key, found)
        return found

    def accepted(self, kernel_id: str) -> list[HistoryPoint]:
        """The kernel's accepted runs, oldest first (at most ``max_points``, the newest ones).

        Cached per kernel; when the branch moved, only the commits since the cached
        head are walked (the branch only moves forward), so a page load after an
        accept costs the new commits, not the whole history.
        """
        repo = self._repo()
        if repo is None:
            return []
        with repo:
            head = self._head(repo)
            if head is None:
                return []
            with self._lock:
                cached = self._cache.get(kernel_id)
            if cached is not None and cached[0] == head:
                return cached[1]
            path = f"{kernel_id}/.kernel_package/bench_result.yaml"
            stop = cached[0] if cached is not None and cached[0] in repo.object_store else None
            newest_first: list[HistoryPoint] = []
            revoked: set[str] = set()  # newest first, so a revocation is met before the accept it takes back
            for commit, blob in _changes(repo, head, stop, path.encode()):
                trailers = parse_trailers(commit.message.decode("utf-8", "replace"))
                if trailers.get("Kz-Step") == REVOKE_STEP:
                    revoked.add(trailers.get("Revokes", ""))
                    continue
                point = _point(commit.id.decode(), commit.commit_time, _blob_data(repo, blob))
                if point is not None:
                    uuid = trailers.get("Kz-Submission", "")
                    newest_first.append(replace(point, submission=uuid, revoked=bool(uuid) and uuid in revoked))
                    if len(newest_first) >= self.max_points:
                        break
            exclude = stop is not None
        older = [replace(p, revoked=True) if p.submission and p.submission in revoked else p
                 for p in cached[1]] if exclude and cached is not None else []
        points = older + list(reversed(newest_first))
        points = points[-self.max_points:]
        with self._lock:
            self._cache[kernel_id] = (head, points)
            self._cache.move_to_end(kernel_id)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return points


def _commit(repo: Repo, sha: ObjectID) -> Commit:
    """The commit ``sha`` (KeyError when the repo lacks it)."""
    commit = repo[sha]
    assert isinstance(commit, Commit), f"{sha!r} is not a commit"
    return commit


def _blob_data(repo: Repo, sha: ObjectID) -> bytes:
    """The bytes of the blob ``sha`` (KeyError when the repo lacks it)."""
    blob = repo[sha]
    assert isinstance(blob, Blob), f"{sha!r} is not a blob"
    return blob.data


def _card(repo: Repo, commit: Commit, path: bytes) -> dict | None:
    blob = _blob_id(repo, commit.tree, path)
    if blob is None:
        return None
    try:
        return scorecard.load(_blob_data(repo, blob))
    except YAMLError:
        return None


def _blob_id(repo: Repo, tree: ObjectID, path: bytes) -> ObjectID | None:
    try:
        _mode, sha = tree_lookup_path(repo.object_store.__getitem__, tree, path)
    except KeyError:
        return None
    return sha


def _changes(repo: Repo, head: ObjectID, stop: ObjectID | None,
             path: bytes) -> Iterator[tuple[Commit, ObjectID]]:
    """``(commit, blob id)`` of each first-parent commit from ``head`` (down to ``stop``) that changed ``path``.

    Two tree lookups per commit (its version of the file and its parent's) instead of a
    full tree diff, which for the seed commit of a 10,000-package repo means 50,000 files.
    """
    sha: ObjectID | None = head
    first = _commit(repo, head)
    commit: Commit | None = first
    blob = _blob_id(repo, first.tree, path)
    while sha is not None and sha != stop:
        assert commit is not None  # the commit ``sha`` names: None only once sha is
        parent_sha = commit.parents[0] if commit.parents else None
        parent = _commit(repo, parent_sha) if parent_sha is not None else None
        parent_blob = _blob_id(repo, parent.tree, path) if parent is not None else None
        if blob is not None and blob != parent_blob:
            yield commit, blob
        sha, commit, blob = parent_sha, parent, parent_blob


def _point(commit: str, when: int, raw: bytes | None) -> HistoryPoint | None:
    """A history point from one scorecard version, or None for the seed or an unreadable file."""
    if raw is None:
        return None
    try:
        doc = scorecard.load(raw)  # None unless a mapping
    except YAMLError:
        return None
    if doc is None:
        return None
    metrics: dict[str, dict[str, float]] = {}
    bests: dict[str, dict[str, float]] = {}
    source, submitter, recorded = "", "", ""
    for case in doc.get("cases") or []:
        if not isinstance(case, dict):
            continue
        for name, record in (case.get("metrics_best") or {}).items():
            if isinstance(record, dict) and not is_seed_sha(str(record.get("commit_sha", ""))) \
                    and isinstance(record.get("value"), (int, float)) and not isinstance(record.get("value"), bool):
                bests.setdefault(str(case.get("test_case_id")), {})[str(name)] = float(record["value"])
        current = case.get("metrics_current") or {}
        values: dict[str, float] = {}
        for name, record in current.items():
            if not isinstance(record, dict):
                continue
            sha = str(record.get("commit_sha", ""))
            if is_seed_sha(sha) or sha == "":
                continue
            value = record.get("value")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                values[str(name)] = float(value)
                source = source or sha
                submitter = submitter or str(record.get("submitter", ""))
                recorded = recorded or str(record.get("recorded_at", ""))
        if values:
            metrics[str(case.get("test_case_id"))] = values
    if not metrics:
        return None
    return HistoryPoint(commit=commit, commit_sha=source, time=int(when), recorded_at=recorded,
                        submitter=submitter, metrics=metrics, best=bests)

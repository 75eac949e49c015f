"""Harness review: a harness a submission brought ranks only once a maintainer approved it.

A kernel's *harness* is its ``.kernel_package/`` files but the scorecard (``desc.yaml``,
``build_test_env.py``, ``benchmark.py``): how the kernel is measured. It is named by
:func:`harness_digest`, the sha256 of one line ``<git blob id> <name>`` per file in name
order, so git gives it without reading a file::

    git ls-tree HEAD:<kernel_id>/.kernel_package | awk '$4 != "bench_result.yaml" {print $3, $4}' | sha256sum

A harness is *brought* when an accepted submission committed it: a new kernel's first
submission, a maintainer's harness change (``State.harnesses`` keeps their source commits;
a revocation takes one out). A brought harness is *unreviewed* until an admin approves its
hash (``harness.reviewed``); a harness no submission brought (the seed, a commit written
outside the accept path) is the maintainers' own and counts as reviewed. An approval names
one hash, so a later change of the harness is unreviewed again.

An unreviewed kernel is accepted into the repository as the guide says, but it does not
rank and sets no operator best: :func:`unreviewed_kernels` names the kernels whose harness
at a commit is unreviewed, and the catalogue marks their index entries
(``kz_daemon.board.ranking.UNREVIEWED``), which the board reads; :func:`review_of` says
the same of one record.

Git is read with dulwich through a Repo of its own, at fixed commits (git objects never
change), so any thread may ask without the daemon's git lock; trees and digests are cached.
"""
from __future__ import annotations

import hashlib
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from dulwich.objects import Commit, ObjectID, Tree
from dulwich.repo import Repo

from kz_daemon.board.ranking import REVIEWED, UNREVIEWED
from kz_events.log.store import Store
from kz_events.status import Status
from kz_runner.contract.layout import BENCH_RESULT, KP

__all__ = ["harness_digest", "HarnessDigests", "Reviews", "reviews_of", "is_unreviewed", "unreviewed_at",
           "unreviewed_kernels", "review_of"]

#: (commit, kernel_id): a kernel's package at one commit
Pair = tuple[str, str]


def harness_digest(blobs: Mapping[str, str]) -> str:
    """The harness hash of a ``.kernel_package/`` listing ({file name: git blob id hex}); the scorecard left out."""
    names = sorted((n for n in blobs if n != BENCH_RESULT), key=lambda n: n.encode("utf-8", "surrogateescape"))
    text = "".join(f"{blobs[name]} {name}\n" for name in names)
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


class HarnessDigests:
    """Harness hashes of kernels at commits of one repository (read-only, any thread, cached)."""

    def __init__(self, repo_path: str | Path, cache_size: int = 8192) -> None:
        self.repo_path = Path(repo_path)
        self._lock = threading.Lock()
        self._digests: OrderedDict[Pair, str | None] = OrderedDict()
        self._trees: OrderedDict[bytes, Tree] = OrderedDict()
        self._size = cache_size
        self._marks: tuple[tuple, frozenset[str]] | None = None

    def of(self, pairs: Iterable[Pair]) -> dict[Pair, str | None]:
        """``{(commit, kernel_id): harness hash}``; None where the commit or the kernel's package is missing."""
        wanted = list(dict.fromkeys(pairs))
        out: dict[Pair, str | None] = {}
        with self._lock:
            for pair in wanted:
                if pair in self._digests:
                    out[pair] = self._digests[pair]
        missing = [pair for pair in wanted if pair not in out]
        if not missing:
            return out
        try:
            repo = Repo(str(self.repo_path))
        except Exception:  # no repo yet: nothing to hash
            return {**out, **{pair: None for pair in missing}}
        with repo:
            for commit, kernel_id in missing:
                out[(commit, kernel_id)] = self._digest(repo, commit, kernel_id)
        with self._lock:
            for pair in missing:
                self._digests[pair] = out[pair]
            while len(self._digests) > self._size:
                self._digests.popitem(last=False)
        return out

    def at(self, commit: str, kernel_ids: Iterable[str]) -> dict[str, str | None]:
        """``{kernel_id: harness hash at commit}`` (None for a kernel without a package there)."""
        found = self.of((commit, kid) for kid in kernel_ids)
        return {kid: digest for (_commit, kid), digest in found.items()}

    def _tree(self, repo: Repo, sha: bytes) -> Tree | None:
        with self._lock:
            tree = self._trees.get(sha)
        if tree is None:
            obj = repo.object_store[ObjectID(sha)]
            if not isinstance(obj, Tree):
                return None
            tree = obj
            with self._lock:
                self._trees[sha] = tree
                while len(self._trees) > self._size:
                    self._trees.popitem(last=False)
        return tree

    def _digest(self, repo: Repo, commit: str, kernel_id: str) -> str | None:
        try:
            found = repo[ObjectID(commit.encode())]
        except (KeyError, ValueError):
            return None
        if not isinstance(found, Commit):
            return None
        sha: bytes = found.tree
        for part in [*kernel_id.split("/"), KP]:
            tree = self._tree(repo, sha)
            if tree is None:
                return None
            try:
                mode, sha = tree[part.encode()]
            except KeyError:
                return None
            if not stat.S_ISDIR(mode):
                return None
        folder = self._tree(repo, sha)
        if folder is None:
            return None
        return harness_digest({entry.path.decode("utf-8", "surrogateescape"): entry.sha.decode()
                               for entry in folder.iteritems() if not stat.S_ISDIR(entry.mode)})

    def marks(self, key: tuple, compute: Callable[[], Iterable[str]]) -> frozenset[str]:
        """``compute()`` once per ``key`` (the last one is kept): the unreviewed kernels at a commit and review state."""
        with self._lock:
            if self._marks is not None and self._marks[0] == key:
                return self._marks[1]
        value = frozenset(compute())
        with self._lock:
            self._marks = (key, value)
        return value


#: kernel_id -> (brought {uuid: sha_src}, approved harness hashes): what the State says of a harness's review
Reviews = dict[str, tuple[dict[str, str], frozenset[str]]]


def reviews_of(store: Store, kernel_ids: Iterable[str] | None = None) -> Reviews:
    """The reviews of the kernels a standing accept brought a harness to (or of ``kernel_ids``), copied.

    An accept whose saga has committed but not completed (``accepting`` with its source
    commit) counts as brought already: the index shows its kernel before ``accept.completed``
    records the harness, and it must not rank in between.
    """
    wanted = None if kernel_ids is None else set(kernel_ids)
    with store.lock:
        state = store.state
        table = state.harnesses
        out = {kid: (dict(r["brought"]), frozenset(r["approved"])) for kid, r in table.items()
               if (r["brought"] if wanted is None else kid in wanted)}
        for sub in state.submissions.values():
            if sub.status == Status.ACCEPTING and sub.sha_src and (sub.new_kernel or sub.harness_change) \
                    and (wanted is None or sub.kernel_id in wanted):
                brought, approved = out.get(sub.kernel_id, ({}, frozenset()))
                out[sub.kernel_id] = ({**brought, sub.uuid: sub.sha_src}, approved)
        return out


def is_unreviewed(current: str | None, brought: Iterable[str | None], approved: frozenset[str]) -> bool:
    """Whether the harness ``current`` is unreviewed: a submission brought it and no approval names it."""
    return current is not None and current not in approved and current in set(brought)


def unreviewed_at(digests: HarnessDigests, commit: str, reviews: Reviews) -> set[str]:
    """The kernels of ``reviews`` whose harness at ``commit`` is unreviewed (git reads, cached)."""
    pairs = [(commit, kid) for kid in reviews]
    pairs += [(sha, kid) for kid, (brought, _approved) in reviews.items() for sha in brought.values()]
    found = digests.of(pairs)
    return {kid for kid, (brought, approved) in reviews.items()
            if is_unreviewed(found[(commit, kid)], (found[(sha, kid)] for sha in brought.values()), approved)}


def unreviewed_kernels(store: Store | None, digests: HarnessDigests | None, commit: str | None) -> frozenset[str]:
    """The kernels whose harness at ``commit`` (the index's head) is unreviewed (cached per commit and review state)."""
    if store is None or digests is None or commit is None:
        return frozenset()
    return digests.marks((commit, store.state.harness_seq), lambda: unreviewed_at(digests, commit, reviews_of(store)))


def review_of(store: Store | None, digests: HarnessDigests | None, kernel_id: str, commit: str | None) -> str:
    """``reviewed`` or ``unreviewed``: the review of the kernel's harness at ``commit`` (one of its records)."""
    if store is None or digests is None or commit is None:
        return REVIEWED
    reviews = {kid: review for kid, review in reviews_of(store, [kernel_id]).items() if review[0]}
    return UNREVIEWED if reviews and kernel_id in unreviewed_at(digests, commit, reviews) else REVIEWED

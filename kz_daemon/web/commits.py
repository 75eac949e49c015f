"""One commit of the kernel repo as the web shows it: message, trailers, changed files, diff.

Read-only through dulwich. The diff against the first parent is written by
``dulwich.patch.write_tree_diff`` into a bounded buffer: a seed commit of thousands
of packages stops at ``MAX_DIFF_BYTES`` (the page says so) instead of reading every
blob, and binary files appear as dulwich's one-line summary, never as bytes. The diff is
cut into lines at "\n" only (:func:`diff_lines`): a file's own CR, U+2028 or form feed cannot
start a line on the page.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

from dulwich.diff_tree import tree_changes
from dulwich.objects import Commit
from dulwich.patch import write_tree_diff
from dulwich.repo import Repo

from kz_daemon.storage.gitstore import parse_trailers

if TYPE_CHECKING:
    from dulwich.objects import ObjectID

MAX_DIFF_BYTES = 256 * 1024
# Characters that end a line for str.splitlines(), Unicode line breaking or an HTML parser (which
# turns a lone CR into a newline), besides "\n": inside a diff line they are file content, shown as
# a visible mark so no file can start a line of its own on the page (a forged "+++" or "@@").
_BREAKS = {"\r": "\u240d", "\x0b": "\u240b", "\x0c": "\u240c", "\x1c": "<U+001C>", "\x1d": "<U+001D>",
           "\x1e": "<U+001E>", "\x85": "<U+0085>", "\u2028": "<U+2028>", "\u2029": "<U+2029>"}
_VISIBLE = str.maketrans(_BREAKS)
MAX_FILES = 400
FULL_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class FileChange:
    """One changed path: ``add``, ``modify`` or ``delete`` (dulwich's change types)."""

    kind: str
    path: str


@dataclass(frozen=True)
class DiffLine:
    """One line of the unified diff with its display class (add, del, hunk, file or ctx)."""

    cls: str
    text: str


@dataclass(frozen=True)
class CommitView:
    """What the commit page shows."""

    sha: str
    parents: tuple[str, ...]
    author: str
    time: int
    subject: str
    body: str
    trailers: tuple[tuple[str, str], ...]
    files: tuple[FileChange, ...]
    files_truncated: bool
    diff: tuple[DiffLine, ...]
    diff_truncated: bool


class _Full(Exception):
    """Raised by the bounded buffer once the diff reached its size limit."""


class _Bounded:
    """A write-only byte sink that keeps at most ``limit`` bytes, then raises :class:`_Full`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> None:
        room = self.limit - self.size
        self.chunks.append(data[:room])
        self.size += min(len(data), room)
        if len(data) > room:
            raise _Full

    def writelines(self, lines) -> None:  # write_tree_diff calls this for each hunk
        for line in lines:
            self.write(line)


def _line_class(line: str) -> str:
    if line.startswith(("+++", "---", "diff --git", "index ", "new file", "deleted file", "Binary files")):
        return "file"
    if line.startswith("@@"):
        return "hunk"
    if line.startswith("+"):
        return "add"
    if line.startswith("-"):
        return "del"
    return "ctx"


def split_message(message: str) -> tuple[str, str, dict[str, str]]:
    """``(subject, body without the trailer paragraph, trailers)`` of a commit message."""
    trailers = parse_trailers(message)
    paragraphs = [p for p in message.strip().split("\n\n") if p.strip()]
    subject = paragraphs[0].split("\n", 1)[0] if paragraphs else ""
    rest = paragraphs[1:-1] if trailers else paragraphs[1:]
    first_extra = paragraphs[0].split("\n", 1)[1:] if paragraphs else []
    return subject, "\n\n".join(first_extra + rest).strip(), trailers


def tree_diff(repo: Repo, old_tree: bytes | None, new_tree: bytes | None, *, max_diff: int = MAX_DIFF_BYTES,
              max_files: int = MAX_FILES) -> tuple[tuple[FileChange, ...], bool, tuple[DiffLine, ...], bool]:
    """``(changed files, files cut, diff lines, diff cut)`` between two trees of ``repo``.

    Paths are relative to the trees: a commit's root trees give repo paths, a package's
    subtrees give paths inside the package (the kernel page's diff between two records).
    """
    # dulwich's ObjectID is bytes at run time (a NewType): the casts only name it
    old_id, new_id = cast("ObjectID | None", old_tree), cast("ObjectID | None", new_tree)
    files: list[FileChange] = []
    files_truncated = False
    for change in tree_changes(repo.object_store, old_id, new_id):
        if len(files) >= max_files:
            files_truncated = True
            break
        # an added file has no old entry, a deleted one no new entry: None in current dulwich (older ones
        # gave an entry whose path is None)
        new_path = change.new.path if change.new is not None else None
        old_path = change.old.path if change.old is not None else None
        path = (new_path or old_path or b"").decode("utf-8", "replace")
        files.append(FileChange(str(change.type), path))
    sink = _Bounded(max_diff)
    try:
        # cast: write_tree_diff writes to its file only through write and writelines, all _Bounded has
        write_tree_diff(cast(IO[bytes], sink), repo.object_store, old_id, new_id)
        diff_truncated = False
    except _Full:
        diff_truncated = True
    return tuple(files), files_truncated, diff_lines(b"".join(sink.chunks), diff_truncated), diff_truncated


def diff_lines(data: bytes, truncated: bool = False) -> tuple[DiffLine, ...]:
    """The unified diff ``data`` as classed lines, split at "\n" only: every other line-ending
    character (:data:`_BREAKS`: CR, VT, FF, NEL, U+2028, ...) belongs to the line it is in and is
    shown as a visible mark. ``truncated``: the last line was cut and is left out."""
    text = data.decode("utf-8", "replace")
    lines = text.split("\n")
    if lines and lines[-1] == "" and text.endswith("\n"):
        lines.pop()
    if truncated and lines:
        lines = lines[:-1]  # the cut line is partial
    return tuple(DiffLine(_line_class(line), line.translate(_VISIBLE)) for line in lines)


def read_commit(repo_path: str | Path, sha: str, *, max_diff: int = MAX_DIFF_BYTES,
                max_files: int = MAX_FILES) -> CommitView | None:
    """The commit ``sha`` (40 hex digits) of the repo, or None when it is not a commit there."""
    if not FULL_SHA.match(sha):
        return None
    try:
        repo = Repo(str(repo_path))
    except Exception:  # no repo (yet): nothing to show
        return None
    with repo:
        try:
            commit = repo[sha.encode()]
        except KeyError:
            return None
        if not isinstance(commit, Commit):
            return None
        old_tree = cast(Commit, repo[commit.parents[0]]).tree if commit.parents else None  # a commit's parent
        files, files_truncated, diff, diff_truncated = tree_diff(repo, old_tree, commit.tree,
                                                                 max_diff=max_diff, max_files=max_files)
        message = commit.message.decode("utf-8", "replace")
        subject, body, trailers = split_message(message)
        return CommitView(sha=sha, parents=tuple(p.decode() for p in commit.parents),
                          author=commit.author.decode("utf-8", "replace"), time=int(commit.commit_time),
                          subject=subject, body=body, trailers=tuple(trailers.items()), files=tuple(files),
                          files_truncated=files_truncated,
                          diff=diff, diff_truncated=diff_truncated)

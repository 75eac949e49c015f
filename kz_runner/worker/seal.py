"""The workdir seal: what ``build_test_env.py`` produced, hashed, made read-only, checked again.

After the build step the runner takes a :class:`Snapshot` of the workdir (sha256
of every regular file, the target of every symlink, the type of anything else,
and the set of directories), then :func:`seal` makes it read-only: files 0444 (or
0555 when executable), directories 0555, and, when the runner may chown, owned by
the runner's user so the job's user cannot make them writable again. After the
benchmark a second snapshot is compared with the first (:func:`compare`): a
changed, removed or retyped entry, or a new entry inside a directory the build
made, is an ``INTEGRITY_ERROR`` naming the paths. New files directly in the
workdir itself are allowed (it belongs to the runner, not to the build).

Hashing streams each file in 1 MiB blocks and spreads files over a few threads
(``hashlib`` releases the GIL on large blocks), so GB-scale inputs cost about a
second per GB per core. Files are opened with ``O_NOFOLLOW | O_NONBLOCK`` and
checked with ``fstat`` after opening, so a symlink or FIFO swapped in cannot make
the runner read elsewhere or block.
"""
from __future__ import annotations

import hashlib
import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kz_runner.contract.host import usable_cpus

BLOCK = 1024 * 1024
MAX_WORKERS = 8
# How many paths an INTEGRITY_ERROR message names before it says "and N more".
NAMED_IN_MESSAGE = 10


@dataclass
class Snapshot:
    """One look at a tree: ``{relative path: fingerprint}`` plus the directories."""

    # "sha256:<hex>" for files, "symlink:<target>", "dir", or "other:<mode>"
    entries: dict[str, str] = field(default_factory=dict)
    # total bytes hashed
    bytes: int = 0
    # seconds the snapshot took
    seconds: float = 0.0
    # threads used for hashing
    workers: int = 1

    @property
    def files(self) -> int:
        """How many entries are not directories."""
        return sum(1 for v in self.entries.values() if v != "dir")


def _workers() -> int:
    return usable_cpus(MAX_WORKERS)


def hash_file(path: Path) -> tuple[str, int]:
    """(fingerprint, size) of one path, without following a symlink or blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            return f"symlink:{os.readlink(path)}", 0
        return f"unreadable:{exc.strerror}", 0
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"other:{stat.S_IFMT(st.st_mode):o}", 0
        digest = hashlib.sha256()
        buf = bytearray(BLOCK)
        view = memoryview(buf)
        size = 0
        while True:
            n = os.readv(fd, [buf])
            if not n:
                break
            digest.update(view[:n])
            size += n
        return f"sha256:{digest.hexdigest()}", size
    finally:
        os.close(fd)


def snapshot(root: Path) -> Snapshot:
    """Fingerprint everything under ``root`` (``root`` itself excluded)."""
    start = time.monotonic()
    root = Path(root)
    snap = Snapshot()
    todo: list[tuple[str, Path, int]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for name in list(dirnames):
            path = base / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():  # os.walk lists a symlink to a directory as a directory
                dirnames.remove(name)
                snap.entries[rel] = f"symlink:{os.readlink(path)}"
            else:
                snap.entries[rel] = "dir"
        for name in filenames:
            path = base / name
            try:
                size = path.lstat().st_size
            except OSError:
                size = 0
            todo.append((path.relative_to(root).as_posix(), path, size))
    todo.sort(key=lambda t: -t[2])  # big files first: the threads finish together
    snap.workers = _workers()
    with ThreadPoolExecutor(max_workers=snap.workers) as pool:
        for (rel, _path, _size), (fingerprint, size) in zip(todo, pool.map(lambda t: hash_file(t[1]), todo)):
            snap.entries[rel] = fingerprint
            snap.bytes += size
    snap.seconds = round(time.monotonic() - start, 6)
    return snap


def compare(before: Snapshot, after: Snapshot) -> list[str]:
    """Human lines for every difference that matters (see the module docstring); [] when sealed."""
    made_dirs = {rel for rel, v in before.entries.items() if v == "dir"}
    lines = []
    for rel, old in sorted(before.entries.items()):
        new = after.entries.get(rel)
        if new is None:
            lines.append(f"removed: {rel}")
        elif new != old:
            lines.append(f"changed: {rel}")
    for rel in sorted(set(after.entries) - set(before.entries)):
        parent = rel.rpartition("/")[0]
        if parent in made_dirs:
            lines.append(f"added: {rel}")
    return lines


def describe(lines: list[str]) -> str:
    """One line naming the first few differences."""
    named = ", ".join(lines[:NAMED_IN_MESSAGE])
    more = f" and {len(lines) - NAMED_IN_MESSAGE} more" if len(lines) > NAMED_IN_MESSAGE else ""
    return named + more


def seal(root: Path, owner: tuple[int, int] | None = None, *, include_root: bool = False) -> int:
    """Make everything under ``root`` read-only (and owned by ``owner`` when given); returns
    how many entries were sealed. Symlinks are left alone (their targets are not ours)."""
    root = Path(root)
    paths = [root] if include_root else []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        paths.extend(base / n for n in dirnames + filenames)
    count = 0
    for path in paths:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue
        if owner is not None:
            os.chown(path, *owner, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            os.chmod(path, 0o555)
        elif stat.S_ISREG(st.st_mode):
            os.chmod(path, 0o555 if st.st_mode & 0o111 else 0o444)
        else:
            os.chmod(path, 0o444)
        count += 1
    return count

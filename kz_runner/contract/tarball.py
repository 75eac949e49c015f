"""Safe handling of submitted ``.tar.gz`` packages, shared by daemon intake and runners.

Three operations, all streaming (the archive is read front to back once per call):

- :func:`scan_tarball` lists the members without writing anything, enforcing the
  :class:`Limits` *while* decompressing, so a gzip bomb is stopped after at most a
  few blocks past the limit; it can capture the bytes of a few small members
  (the daemon reads ``desc.yaml`` and ``benchmark.py`` this way).
- :func:`safe_unpack` never calls ``extractall``: it creates directories itself,
  writes regular files with ``O_EXCL | O_NOFOLLOW``, normalises modes to 0644/0755
  and refuses the whole archive when any member breaks the rules.
- :func:`read_member` returns one member's bytes.

Rules for members: only regular files and directories (no symbolic or hard links,
devices, FIFOs, sparse files), relative names without ``..``, backslashes, control
characters (C0, DEL, C1, the Unicode line and paragraph separators: a name is shown on
pages and in diffs, where a newline in it would start a forged line), empty segments or
non-UTF-8 bytes, each name once, no component over 255
bytes and no name over 1024; no component git refuses in a tree (``.git`` in any
disguise, a ``.gitmodules`` link: ``GIT_PATH_REFUSED``, see :mod:`.gitpath`), since an
accepted package is committed to the kernel repo. Breaking a rule or a
limit is an expected outcome reported as :class:`Problem` values (``TARBALL_*``).
"""
from __future__ import annotations

import gzip
import os
import re
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from kz_runner.contract.codes import problem
from kz_runner.contract.gitpath import git_component_problem, git_symlink_problem
from kz_runner.contract.kernel_id import SEGMENTS, SHAPE
from kz_runner.contract.layout import KP
from kz_runner.contract.problems import Problem, Report

MiB = 1024 * 1024
KERNEL_PACKAGE_DIR = KP
MAX_PROBLEMS = 50
#: the longest path component every common file system takes
MAX_NAME_BYTES = 255
#: the longest member path: leaves room below PATH_MAX (4096) for the unpacking directory
MAX_MEMBER_PATH_BYTES = 1024
#: characters no name may hold: C0 controls, DEL, C1 controls and the two Unicode line breaks
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def control_character_problem(name: str, path: str | None = None) -> Problem | None:
    """TARBALL_BAD_NAME when ``name`` holds a control character (named as ``U+XXXX``), else None.

    The problem's ``file`` is ``path`` (default ``name``) with such characters escaped, so
    the report itself cannot be split into forged lines.
    """
    found = CONTROL_CHARACTERS.search(name)
    if found is None:
        return None
    return problem("TARBALL_BAD_NAME", f"the name contains the control character U+{ord(found.group()):04X}",
                   file=repr(name if path is None else path)[1:-1])


@dataclass(frozen=True)
class Limits:
    """Resource limits for one archive (defaults suit a source-only kernel package)."""

    compressed_bytes: int = 64 * MiB   # size of the .tar.gz itself
    members: int = 10_000              # files + directories
    member_bytes: int = 64 * MiB       # one file, unpacked
    total_bytes: int = 256 * MiB       # all files, unpacked
    ratio: float = 200.0               # unpacked bytes / compressed bytes
    ratio_floor: int = 1 * MiB         # the ratio is judged only past this many unpacked bytes


@dataclass(frozen=True)
class Member:
    """One accepted archive member: normalised name, ``file`` or ``dir``, size, normalised mode."""

    name: str
    kind: str
    size: int
    mode: int


@dataclass
class TarballScan:
    """What one pass over an archive found."""

    members: list[Member] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    captured: dict[str, bytes] = field(default_factory=dict)
    compressed_bytes: int = 0    # compressed bytes read
    unpacked_bytes: int = 0      # sum of file sizes declared by accepted members
    complete: bool = False       # the whole archive was read (no limit or corruption stopped it)

    @property
    def ok(self) -> bool:
        """True when the archive was read completely and no member broke a rule."""
        return self.complete and not any(p.severity == "error" for p in self.problems)

    def names(self) -> list[str]:
        """Names of the accepted members, in archive order."""
        return [m.name for m in self.members]


class _ScanStop(Exception):
    """A limit was hit: reading stops and ``problem`` is reported."""

    def __init__(self, found: Problem):
        super().__init__(found.message)
        self.problem = found


class _CountingReader:
    """Counts compressed bytes read from ``raw`` and stops past the compressed limit."""

    def __init__(self, raw: BinaryIO, limit: int):
        self.raw, self.limit, self.count = raw, limit, 0

    def read(self, size: int = -1) -> bytes:
        """Read from the raw stream, counting."""
        data = self.raw.read(size)
        self.count += len(data)
        if self.count > self.limit:
            raise _ScanStop(problem("TARBALL_COMPRESSED_TOO_LARGE",
                                f"compressed size exceeds {self.limit} bytes"))
        return data


class _InflatingReader:
    """Decompresses gzip and stops when the unpacked volume or the ratio is out of bounds."""

    def __init__(self, counting: _CountingReader, limits: Limits):
        self.counting = counting
        # no seek(): the reader only reads forward, so gzip never rewinds it
        self.gzip = gzip.GzipFile(fileobj=counting, mode="rb")  # type: ignore[call-overload]
        self.limits = limits
        # tar headers and padding add to the file bytes: allow 1 KiB per member on top
        self.cap = limits.total_bytes + 1024 * (limits.members + 2) + MiB
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        """Decompressed bytes, checking the volume and ratio limits after each read."""
        if size is None or size < 0:
            size = 1 << 16
        data = self.gzip.read(size)
        self.count += len(data)
        if self.count > self.cap:
            raise _ScanStop(problem("TARBALL_TOO_LARGE", f"unpacks to more than {self.limits.total_bytes} bytes"))
        if (self.count > self.limits.ratio_floor
                and self.count > self.limits.ratio * max(self.counting.count, 1)):
            raise _ScanStop(problem("TARBALL_RATIO", f"unpacks to {self.count} bytes from "
                                f"{self.counting.count} compressed (more than {self.limits.ratio:g}x)"))
        return data

    def drain(self) -> None:
        """Read to the end of the gzip stream so its CRC and length are verified."""
        while self.read(1 << 16):
            pass


def normalize_member_name(raw: str) -> tuple[str | None, Problem | None]:
    """The member name without a leading ``./``; ``("", None)`` for the archive root entry."""
    if "\x00" in raw:
        return None, problem("TARBALL_BAD_NAME", "member name contains a NUL byte", file=repr(raw))
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        return None, problem("TARBALL_BAD_NAME", "member name is not UTF-8", file=ascii(raw))
    bad = control_character_problem(raw)
    if bad is not None:
        return None, bad
    if "\\" in raw:
        return None, problem("TARBALL_BAD_NAME", "member name contains a backslash", file=raw)
    if raw.startswith("/"):
        return None, problem("TARBALL_ABSOLUTE", "member name is absolute", file=raw)
    name = raw
    while name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/") if name not in ("", ".") else ""
    if name == "" or name == ".":
        return "", None
    parts = name.split("/")
    if ".." in parts:
        return None, problem("TARBALL_DOTDOT", "member name contains '..'", file=raw)
    if "" in parts or "." in parts:
        return None, problem("TARBALL_BAD_NAME", "member name has an empty or '.' segment", file=raw)
    if len(name.encode("utf-8")) > MAX_MEMBER_PATH_BYTES:
        return None, problem("TARBALL_BAD_NAME", f"member name is longer than {MAX_MEMBER_PATH_BYTES} bytes",
                             file=raw[:200] + "...")
    for part in parts:
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            return None, problem("TARBALL_BAD_NAME", f"a path component is longer than {MAX_NAME_BYTES} bytes",
                                 file=raw[:200] + "...")
        why = git_component_problem(part)
        if why is not None:
            return None, problem("GIT_PATH_REFUSED", f"git refuses this path: {why}", file=raw)
    return name, None


def _kind_problem(info: tarfile.TarInfo, name: str) -> Problem | None:
    if info.issym() or info.islnk():
        why = git_symlink_problem(name.rsplit("/", 1)[-1])
        if why is not None:
            return problem("GIT_PATH_REFUSED", f"git refuses this path: {why}", file=name)
    if info.issym():
        return problem("TARBALL_SYMLINK", f"symbolic link to {info.linkname!r}", file=name)
    if info.islnk():
        return problem("TARBALL_HARDLINK", f"hard link to {info.linkname!r}", file=name)
    if info.type == tarfile.GNUTYPE_SPARSE:
        return problem("TARBALL_SPECIAL", "sparse file", file=name)
    if info.isreg() or info.isdir():
        return None
    what = ("character device" if info.ischr() else "block device" if info.isblk()
            else "FIFO" if info.isfifo() else f"member of type {info.type!r}")
    return problem("TARBALL_SPECIAL", what, file=name)


def normalized_mode(info_mode: int, is_dir: bool) -> int:
    """0755 for directories and owner-executable files, 0644 otherwise."""
    return 0o755 if is_dir or info_mode & 0o100 else 0o644


def _open_source(source) -> tuple[BinaryIO, bool]:
    if isinstance(source, (str, os.PathLike)):
        return open(source, "rb"), True
    return source, False


def _iterate(source, limits: Limits, scan: TarballScan,
             on_member: Callable[[tarfile.TarFile, tarfile.TarInfo, Member], None]) -> None:
    """Stream the archive, append accepted members and problems to ``scan``, call ``on_member``."""
    if isinstance(source, (str, os.PathLike)):
        size = os.stat(source).st_size
        if size > limits.compressed_bytes:
            scan.problems.append(problem("TARBALL_COMPRESSED_TOO_LARGE",
                                         f"compressed size {size} exceeds {limits.compressed_bytes} bytes"))
            return
    raw, owned = _open_source(source)
    counting = _CountingReader(raw, limits.compressed_bytes)
    inflating = _InflatingReader(counting, limits)
    seen: dict[str, str] = {}
    count = 0
    try:
        with tarfile.open(fileobj=inflating, mode="r|") as archive:  # type: ignore[call-overload]
            for info in archive:
                count += 1
                if count > limits.members:
                    raise _ScanStop(problem("TARBALL_TOO_MANY_MEMBERS", f"more than {limits.members} members"))
                name, bad = normalize_member_name(info.name)
                if bad is None and name is not None:
                    bad = _kind_problem(info, name or ".")
                if bad is not None:
                    scan.problems.append(bad)
                    if len(scan.problems) >= MAX_PROBLEMS:
                        raise _ScanStop(problem("TARBALL_CORRUPT", "too many bad members; stopped reading"))
                    continue
                assert name is not None
                if name == "":
                    continue  # the archive root entry ("./")
                kind = "dir" if info.isdir() else "file"
                if name in seen and (kind == "file" or seen[name] == "file"):
                    scan.problems.append(problem("TARBALL_DUPLICATE", "member appears twice", file=name))
                    continue
                if name in seen:
                    continue
                seen[name] = kind
                if kind == "file":
                    if info.size > limits.member_bytes:
                        raise _ScanStop(problem("TARBALL_MEMBER_TOO_LARGE", f"{info.size} bytes exceeds "
                                            f"{limits.member_bytes}", file=name))
                    scan.unpacked_bytes += info.size
                    if scan.unpacked_bytes > limits.total_bytes:
                        raise _ScanStop(problem("TARBALL_TOO_LARGE", f"unpacks to more than "
                                            f"{limits.total_bytes} bytes"))
                member = Member(name, kind, info.size if kind == "file" else 0,
                                normalized_mode(info.mode, kind == "dir"))
                scan.members.append(member)
                on_member(archive, info, member)
        inflating.drain()
        scan.complete = True
    except _ScanStop as stop:
        scan.problems.append(stop.problem)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        scan.problems.append(problem("TARBALL_CORRUPT", f"{type(exc).__name__}: {exc}"))
    finally:
        scan.compressed_bytes = counting.count
        if owned:
            raw.close()
    if scan.complete:
        scan.problems.extend(_collisions(seen))
        if not scan.members and not scan.problems:
            scan.problems.append(problem("TARBALL_EMPTY", "the archive holds no members"))


def _collisions(seen: dict[str, str]) -> list[Problem]:
    """A file whose name is also a parent directory of another member."""
    files = {name for name, kind in seen.items() if kind == "file"}
    out = []
    for name in sorted(seen):
        parts = name.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in files:
                out.append(problem("TARBALL_DUPLICATE", f"{parent!r} is a file and a directory", file=name))
                break
    return out


def scan_tarball(source, limits: Limits = Limits(),
                 capture: Iterable[str] | Callable[[str], bool] = (),
                 capture_bytes: int | Callable[[str], int] = MiB) -> TarballScan:
    """Read the whole archive once without writing; capture the bytes of chosen members.

    ``source`` is a path or a binary file object positioned at the start. ``capture``
    is a set of normalised member names or a predicate; a captured member larger than
    ``capture_bytes`` (a number, or a function of the member's name) gives a
    ``FILE_TOO_LARGE`` problem instead.
    """
    wanted = capture if callable(capture) else set(capture).__contains__
    scan = TarballScan()

    def on_member(archive: tarfile.TarFile, info: tarfile.TarInfo, member: Member) -> None:
        if member.kind != "file" or not wanted(member.name):
            return
        limit = capture_bytes(member.name) if callable(capture_bytes) else capture_bytes
        if member.size > limit:
            scan.problems.append(problem("FILE_TOO_LARGE", f"{member.size} bytes (the limit is "
                                         f"{limit})", file=member.name))
            return
        handle = archive.extractfile(info)
        scan.captured[member.name] = handle.read() if handle is not None else b""

    _iterate(source, limits, scan, on_member)
    return scan


def read_member(source, name: str, limits: Limits = Limits(), max_bytes: int = MiB) -> bytes | None:
    """The bytes of member ``name`` (normalised), or None when absent, too big or unreadable."""
    return scan_tarball(source, limits, capture={name}, capture_bytes=max_bytes).captured.get(name)


def find_package_root(names: Iterable[str], expected: str | None = None) -> tuple[str | None, list[Problem]]:
    """The kernel_id directory of an archive: the one holding ``.kernel_package/``.

    Every member must be that directory, one of its ancestors (directories only, as
    ``tar`` writes them) or under it. ``expected`` (the submission's kernel_id), when
    given, must equal it.
    """
    names = list(names)
    roots = set()
    for name in names:
        parts = name.split("/")
        if KERNEL_PACKAGE_DIR in parts:
            roots.add("/".join(parts[: parts.index(KERNEL_PACKAGE_DIR)]))
    if not roots:
        want = expected or "<kernel_id>"
        return None, [problem("TARBALL_TOP_DIR", f"no {want}/{KERNEL_PACKAGE_DIR}/ in the archive")]
    root = min(roots, key=lambda r: (r.count("/"), r))
    problems: list[Problem] = []
    for other in sorted(roots - {root}):
        code = "NESTED_PACKAGE" if other.startswith(root + "/") or root == "" else "TARBALL_TOP_DIR"
        problems.append(problem(code, f"a second package directory {other!r} besides {root!r}",
                                file=f"{other}/{KERNEL_PACKAGE_DIR}" if other else KERNEL_PACKAGE_DIR))
    if root == "":
        return None, problems + [problem("TARBALL_TOP_DIR", f"{KERNEL_PACKAGE_DIR}/ is at the archive root; "
                                         "the top-level directory must be the kernel_id")]
    if root.count("/") + 1 != SEGMENTS:
        # a bare ``wrong/`` (or any other depth) names no operator: say so instead of judging its files
        depth = root.count("/") + 1
        return None, problems + [problem("TARBALL_TOP_DIR", f"the package directory {root + '/'!r} has {depth} "
                                         f"path segment{'s' if depth != 1 else ''}; a tarball's top directories "
                                         f"must spell the kernel_id {SHAPE} (pack with `kz pack`)")]
    if expected is not None and root != expected:
        problems.append(problem("TARBALL_TOP_DIR", f"the package directory is {root!r}, "
                                f"but the kernel_id is {expected!r}"))
    ancestors = {"/".join(root.split("/")[:i]) for i in range(1, root.count("/") + 1)}
    outside = [n for n in names if n != root and not n.startswith(root + "/") and n not in ancestors]
    if outside:
        shown = ", ".join(repr(n) for n in outside[:5]) + (" ..." if len(outside) > 5 else "")
        problems.append(problem("TARBALL_TOP_DIR", f"{len(outside)} member(s) outside {root + '/'!r}: {shown}"))
    return root, problems


def _ensure_dir(dest: Path, rel_parts: list[str], made: set[str]) -> Path:
    """Create ``dest/<rel_parts>`` one component at a time, refusing anything but real dirs."""
    path = dest
    for i, part in enumerate(rel_parts):
        path = path / part
        key = "/".join(rel_parts[: i + 1])
        if key in made:
            continue
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise _ScanStop(problem("TARBALL_DUPLICATE", "a path component exists and is not a directory",
                                    file=key)) from None
        made.add(key)
    return path


def safe_unpack(tar_path, dest_dir, limits: Limits = Limits(), expected_kernel_id: str | None = None,
                require_package_root: bool = True) -> Report:
    """Unpack ``tar_path`` into ``dest_dir`` safely; nothing is written when a rule is broken.

    A first pass checks every member and limit; the second writes. The report's
    facts hold ``kernel_id`` (the package directory, when ``require_package_root``),
    ``package_dir`` (its absolute path), ``files`` and ``bytes``. Call it with a
    fresh ``dest_dir`` (created when missing): after an I/O failure it may hold part
    of the archive.
    """
    subject = str(tar_path)
    first = scan_tarball(tar_path, limits)
    problems = list(first.problems)
    root = None
    if first.complete and require_package_root:
        root, root_problems = find_package_root(first.names(), expected_kernel_id)
        problems += root_problems
    if problems or not first.complete:
        return Report(subject, tuple(problems))
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    made: set[str] = set()
    written = {"files": 0, "bytes": 0}
    scan = TarballScan()

    def on_member(archive: tarfile.TarFile, info: tarfile.TarInfo, member: Member) -> None:
        parts = member.name.split("/")
        if member.kind == "dir":
            _ensure_dir(dest, parts, made)
            return
        parent = _ensure_dir(dest, parts[:-1], made)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(parent / parts[-1], flags, 0o600)
        try:
            handle = archive.extractfile(info)
            remaining = member.size
            while handle is not None and remaining > 0:
                chunk = handle.read(min(remaining, MiB))
                if not chunk:
                    break
                os.write(fd, chunk)
                remaining -= len(chunk)
            os.fchmod(fd, member.mode)
        finally:
            os.close(fd)
        written["files"] += 1
        written["bytes"] += member.size

    try:
        _iterate(tar_path, limits, scan, on_member)
    except _ScanStop as stop:
        scan.problems.append(stop.problem)
    except FileExistsError as exc:
        scan.problems.append(problem("TARBALL_DUPLICATE", f"already exists in the destination: {exc.filename}"))
    if scan.problems or not scan.complete:
        return Report(subject, tuple(scan.problems or [problem("TARBALL_CORRUPT", "second pass failed")]))
    facts: dict[str, int | str] = {"files": written["files"], "bytes": written["bytes"]}
    if root is not None:
        facts.update(kernel_id=root, package_dir=str((dest / root).resolve()))
    return Report(subject, (), facts)

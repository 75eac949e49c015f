"""Packing a package directory into a deterministic submission tarball.

The archive holds ``<kernel_id>/`` and everything under it except
``.kernel_package/bench_result.yaml`` (the scorecard is the server's) and
caches (``__pycache__/``, ``*.pyc``, ``.git``). Members are sorted, with mtime 0,
uid/gid 0, empty owner names and modes normalised to 0644/0755; the gzip header
carries mtime 0 and no file name. So the same package always packs to the same
bytes, whatever the files' timestamps or owners on disk.
"""
from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

from kz_events.durable import atomic_write
from kz_runner.contract.kernel_id import find_repo_root
from kz_runner.contract.problems import Problem, Report
from kz_runner.contract.tarball import Limits
from kz_runner.contract.targz import deterministic_targz
from kz_runner.contract.validate import (
    BENCH_RESULT,
    analyze_package_dir,
    bench_kernel_id,
    contract_path,
    is_ignored,
    resolve_kernel_id,
    validate_package_dir,
    validate_tarball,
)

BENCH_RESULT_REL = contract_path(BENCH_RESULT)


@dataclass(frozen=True)
class PackResult:
    """The outcome of :func:`pack_package`: ``path``/``sha256`` are None when packing was refused."""

    report: Report
    kernel_id: str | None
    path: Path | None = None
    sha256: str | None = None
    size: int = 0
    files: int = 0

    def to_json(self) -> dict:
        """JSON-able summary for ``kz pack --json``."""
        return {"kernel_id": self.kernel_id, "path": str(self.path) if self.path else None,
                "sha256": self.sha256, "size": self.size, "files": self.files,
                "valid": self.report.valid, "problems": [p.to_json() for p in self.report.problems]}


def pack_kernel_id(package_dir: str | os.PathLike, kernel_id: str | None = None) -> tuple[str | None, str]:
    """``(kernel_id, where it came from)``: the argument, else the rule ``kz validate`` applies.

    That rule (:func:`~kz_runner.contract.validate.resolve_kernel_id`): bench_result.yaml's
    ``kernel_id`` when the directory's path ends with it, else the path under the repo root.
    A copied package whose bench_result.yaml still names the original is therefore not
    packed (or submitted) as the original.
    """
    if kernel_id:
        return kernel_id, "argument"
    bench_id = bench_result_kernel_id(Path(package_dir))
    resolved = resolve_kernel_id(Path(package_dir).resolve(), bench_id)
    if resolved is None:
        return None, "unknown"
    if resolved == bench_id:
        return resolved, BENCH_RESULT_REL
    return resolved, f"path under {find_repo_root(Path(package_dir).resolve().parent)}"


def bench_result_kernel_id(package_dir: Path) -> str | None:
    """The ``kernel_id`` string in the directory's bench_result.yaml (None: no file, unreadable, absent)."""
    bench = package_dir / BENCH_RESULT_REL
    value = bench_kernel_id(bench.read_bytes()) if bench.is_file() else None
    return value if isinstance(value, str) and value else None


def package_entries(package_dir: str | os.PathLike, exclude: Path | None = None) -> list[tuple[str, bool]]:
    """``(relative path, is_dir)`` of everything packed, sorted; links and specials are skipped."""
    root = Path(package_dir)
    out: list[tuple[str, bool]] = []
    stack = [(root, "")]
    skip = exclude.resolve() if exclude is not None else None
    while stack:
        directory, rel = stack.pop()
        for entry in os.scandir(directory):
            if is_ignored(entry.name):
                continue
            sub = f"{rel}/{entry.name}" if rel else entry.name
            if sub == BENCH_RESULT_REL or entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                out.append((sub, True))
                stack.append((Path(entry.path), sub))
            elif entry.is_file(follow_symlinks=False):
                if skip is not None and Path(entry.path).resolve() == skip:
                    continue
                out.append((sub, False))
    return sorted(out)


def build_tarball(package_dir: str | os.PathLike, kernel_id: str, exclude: Path | None = None) -> tuple[bytes, int]:
    """The deterministic ``.tar.gz`` bytes of a package and the number of files in it."""
    root = Path(package_dir)
    entries: dict[str, tuple[str, int, bytes]] = {kernel_id: ("dir", 0o755, b"")}
    files = 0
    for rel, is_dir in package_entries(root, exclude):
        path = root / rel
        mode = os.lstat(path).st_mode
        if is_dir:
            entries[f"{kernel_id}/{rel}"] = ("dir", mode, b"")
            continue
        entries[f"{kernel_id}/{rel}"] = ("file", mode, path.read_bytes())
        files += 1
    return deterministic_targz(entries), files


def default_output(kernel_id: str) -> Path:
    """``<kernel_id with '/' as '__'>.tar.gz`` in the current directory."""
    return Path(kernel_id.replace("/", "__") + ".tar.gz")


def pack_package(package_dir: str | os.PathLike, out: str | os.PathLike | None = None,
                 kernel_id: str | None = None, limits: Limits = Limits()) -> PackResult:
    """Validate and pack ``package_dir``; nothing is written when validation finds an error.

    The directory is validated as a package (a missing bench_result.yaml is fine:
    it is never packed) and the archive as a submission, so what this writes is
    what the server's intake accepts.
    """
    pkg = Path(package_dir)
    kid, _source = pack_kernel_id(pkg, kernel_id)
    if kid is None:  # kz validate's report, which says why (KERNEL_ID_UNKNOWN or BENCH_KERNEL_ID_MISMATCH)
        return PackResult(validate_package_dir(pkg), None)
    analysis = analyze_package_dir(pkg, kid)
    analysis.problems = [p for p in analysis.problems
                         if not (p.code == "FILE_MISSING" and p.file == BENCH_RESULT_REL)]
    dir_report = analysis.report(str(pkg))
    if not dir_report.valid:
        return PackResult(dir_report, kid)
    target = Path(out) if out is not None else default_output(kid)
    data, files = build_tarball(pkg, kid, exclude=target)
    tar_report = validate_tarball(io.BytesIO(data), target.name, limits, kernel_id=kid)
    extra: list[Problem] = [p for p in tar_report.problems
                            if p.code.startswith("TARBALL_") or p.code == "BENCH_RESULT_IN_TARBALL"]
    report = dir_report.with_problems(extra)
    if not report.valid:
        return PackResult(report, kid)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, data)
    return PackResult(report, kid, target, hashlib.sha256(data).hexdigest(), len(data), files)


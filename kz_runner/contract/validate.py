"""The package validator: every §6 checklist item that can be checked without running code.

One library for ``kz validate``, ``kz pack``, ``kz index``, the dry-run and the
daemon's intake, so all of them give the same verdict:

- :func:`validate_package_dir` checks a package directory (with its seed or
  current ``bench_result.yaml``);
- :func:`validate_tarball` checks a submission ``.tar.gz`` without unpacking it
  (member safety and limits, the top-level directory, no ``bench_result.yaml``,
  then the package contents); :func:`read_package` reads a tarball once into a
  :class:`PackageRecord` (its members' bytes, each parse cached) and
  :func:`validate_record` checks that, so the daemon's intake reads and parses each
  file once for the validation, its static rules and its policies (and the harness
  files not at all when their bytes were checked before: :class:`HarnessChecks`);
- :func:`analyze_contents` is the shared core over the contract files' bytes.

Package code is never imported: Python files are read with ``ast``.
"""
from __future__ import annotations

import ast
import copy
import hashlib
import json
import os
import posixpath
import re
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kz_runner.contract.codes import problem
from kz_runner.contract.kernel_id import (
    category_mismatches,
    check_kernel_id,
    find_repo_root,
    is_valid_kernel_id,
    kernel_id_from_path,
    path_ends_with,
)
from kz_runner.contract.layout import BENCH_RESULT, BENCHMARK, BUILD_TEST_ENV, CONTRACT_FILES, DESC, HARNESS_FILES
from kz_runner.contract.problems import ERROR, WARNING, Problem, Report
from kz_runner.contract.rules.engine import REJECT, RULES_BY_ID, SOURCE_SUFFIXES, check_sources
from kz_runner.contract.rules.floor import signature_problems
from kz_runner.contract.rules.pysource import (  # noqa: F401
    check_benchmark_source,
    check_build_env_source,
    decode_utf8_sig,
    parse_python,
    read_metas,
)
from kz_runner.contract.schema_check import may_hold_huge_number, nonfinite_paths, schema_problems
from kz_runner.contract.tarball import (
    KERNEL_PACKAGE_DIR,
    Limits,
    MiB,
    TarballScan,
    control_character_problem,
    find_package_root,
    scan_tarball,
)
from kz_runner.contract.yamlio import YAMLError, load_yaml, yaml_error_text

BUILD_ENV = BUILD_TEST_ENV
_SUBMITTED_FILES = HARNESS_FILES
MAX_CONTRACT_FILE_BYTES = MiB
#: Names ``kz pack`` leaves out and the validator ignores inside a package.
IGNORED_NAMES = frozenset({"__pycache__", ".git"})
IGNORED_SUFFIXES = (".pyc",)


def contract_path(name: str) -> str:
    """``.kernel_package/<name>``: the file field used in problems."""
    return f"{KERNEL_PACKAGE_DIR}/{name}"


def is_ignored(name: str) -> bool:
    """True for a file or directory name that packing leaves out (caches, VCS data)."""
    return name in IGNORED_NAMES or name.endswith(IGNORED_SUFFIXES)


@dataclass
class Analysis:
    """What the validator learned about one package (parsed documents are None when unusable)."""

    kernel_id: str | None
    problems: list[Problem] = field(default_factory=list)
    desc: dict | None = None           # desc.yaml, when it parsed to a mapping
    desc_valid: bool = False           # desc.yaml matched its schema
    bench: dict | None = None          # bench_result.yaml, when schema-valid
    metas: list | None = None          # KERNEL_ZOO_TEST_CASE_METAS, when it was a readable literal
    cache_key: str | None = None       # set by a cache that produced it: same key, same contract files

    def facts(self) -> dict[str, Any]:
        """JSON-able facts for a :class:`Report` (kernel_id, name, category, status, case ids)."""
        facts: dict[str, Any] = {"kernel_id": self.kernel_id}
        if self.desc_valid and self.desc is not None:
            facts.update(name=self.desc["name"], category=dict(self.desc["category"]),
                         arch=self.desc["category"]["arch"], status=self.desc["status"])
        if self.metas is not None:
            facts["test_case_ids"] = [m.get("test_case_id") for m in self.metas if isinstance(m, dict)]
            try:  # the METAS themselves, when they are plain JSON (saves callers a second read)
                facts["metas"] = json.loads(json.dumps(self.metas, allow_nan=False))
            except (TypeError, ValueError):
                pass
        return facts

    def report(self, subject: str, extra: dict | None = None) -> Report:
        """The :class:`Report` of this analysis, errors first then warnings, each in finding order."""
        ordered = [p for p in self.problems if p.severity == "error"] + \
                  [p for p in self.problems if p.severity != "error"]
        facts = self.facts()
        facts.update(extra or {})
        return Report(subject, tuple(ordered), facts)


def _load_yaml_file(data: bytes, file: str, out: list[Problem]) -> tuple[bool, Any]:
    try:
        text = decode_utf8_sig(data)
    except UnicodeDecodeError as exc:
        out.append(problem("FILE_ENCODING", f"not UTF-8 at byte {exc.start}", file=file))
        return False, None
    try:
        return True, load_yaml(text)
    except YAMLError as exc:
        out.append(problem("YAML_INVALID", yaml_error_text(exc), file=file))
        return False, None
    except (ValueError, RecursionError) as exc:  # e.g. a timestamp libyaml cannot convert
        out.append(problem("YAML_INVALID", str(exc)[:200], file=file))
        return False, None


def _check_desc(an: Analysis, data: bytes, id_valid: bool | None = None,
                parsed: tuple[bool, Any, tuple[Problem, ...]] | None = None) -> None:
    """desc.yaml's checks; ``id_valid``: whether ``an.kernel_id`` is valid, when the caller knows.

    ``parsed``: a package record's cached :meth:`PackageRecord.yaml` of ``data``.
    """
    file = contract_path(DESC)
    if parsed is None:
        ok, desc = _load_yaml_file(data, file, an.problems)
    else:
        ok, desc, found = parsed
        an.problems.extend(found)
    if not ok:
        return
    if not isinstance(desc, dict):
        an.problems.append(problem("DESC_SCHEMA", f"the document is a {type(desc).__name__}, "
                                   "expected a mapping of fields", file=file))
        return
    an.desc = desc
    errors = schema_problems(desc, "desc", "DESC_SCHEMA", file)
    an.problems.extend(errors)
    an.desc_valid = not errors
    category = desc.get("category")
    if id_valid is None:
        id_valid = bool(an.kernel_id) and is_valid_kernel_id(an.kernel_id)
    if an.kernel_id and id_valid and isinstance(category, dict):
        for name, segment, value in category_mismatches(an.kernel_id, category):
            where = f"path segment {segment!r}" if segment is not None else "no path segment"
            an.problems.append(problem("CATEGORY_MISMATCH", f"category.{name} is {value!r} but the "
                                       f"kernel_id has {where}", file=file, field=f"category.{name}"))
    status = desc.get("status")
    if status == "frozen":
        an.problems.append(problem("STATUS_FROZEN", "status is frozen", file=file, field="status"))
    elif status == "deprecated":
        an.problems.append(problem("STATUS_DEPRECATED", "status is deprecated", file=file, field="status"))


def check_reference_sources(refs: object, exists: Callable[[str], bool | None]) -> list[Problem]:
    """``REFERENCE_SOURCE_*`` problems for desc.yaml's ``reference_sources`` list.

    ``exists(normalised relative path)`` answers True (present in the source area),
    False (absent) or None (present but resolving outside the package).
    """
    out: list[Problem] = []
    if not isinstance(refs, list):
        return out
    file = contract_path(DESC)
    for index, ref in enumerate(refs):
        if not isinstance(ref, str) or not ref:
            continue
        norm = posixpath.normpath(ref)
        fld = f"reference_sources[{index}]"
        if (ref.startswith("/") or norm == ".." or norm.startswith("../") or norm == "."
                or norm.split("/")[0] == KERNEL_PACKAGE_DIR):
            out.append(problem("REFERENCE_SOURCE_OUTSIDE", f"{ref!r} is not in the source area",
                               file=file, field=fld))
            continue
        found = exists(norm)
        if found is None:
            out.append(problem("REFERENCE_SOURCE_OUTSIDE", f"{ref!r} resolves outside the package "
                               "(through a link)", file=file, field=fld))
        elif not found:
            out.append(problem("REFERENCE_SOURCE_MISSING", f"{ref!r} does not exist", file=file, field=fld))
    return out


#: What a YAML document needs for the safe loader to make a NaN or an infinity: an explicit tag
#: (``!!float inf``), ``.inf``/``.nan`` in any case, or a float that overflows, which takes a
#: 3-digit exponent or a long run of digits (with ``_``, ``.`` and the ``:`` of base 60): see
#: schema_check.may_hold_huge_number. Plain floats match ``[-+]?[0-9][0-9_]*\.[0-9_]*([eE][-+][0-9]+)?``
#: and the like; quoted and block scalars are strings unless tagged.
_YAML_NONFINITE_WORD = re.compile(rb"\.[iInN]")


def _check_bench(an: Analysis, data: bytes, id_valid: bool | None = True) -> None:
    """bench_result.yaml's checks; its kernel_id is compared only with a valid package kernel_id."""
    file = contract_path(BENCH_RESULT)
    ok, bench = _load_yaml_file(data, file, an.problems)
    if not ok:
        return
    if not isinstance(bench, dict):
        an.problems.append(problem("BENCH_RESULT_SCHEMA", f"the document is a {type(bench).__name__}, "
                                   "expected a mapping", file=file))
        return
    errors = schema_problems(bench, "bench_result", "BENCH_RESULT_SCHEMA", file)
    an.problems.extend(errors)
    proven_finite = b"!" not in data and _YAML_NONFINITE_WORD.search(data) is None \
        and not may_hold_huge_number(data)
    bad_numbers = [] if proven_finite else list(nonfinite_paths(bench))
    for path in bad_numbers:
        an.problems.append(problem("NONFINITE_VALUE", f"{path} is NaN or infinite", file=file, field=path))
    recorded = bench.get("kernel_id")
    if an.kernel_id is not None and id_valid is not False and isinstance(recorded, str) \
            and recorded != an.kernel_id:  # an invalid kernel_id is one KERNEL_ID_INVALID, not two problems
        an.problems.append(problem("BENCH_KERNEL_ID_MISMATCH", f"kernel_id is {recorded!r} but the "
                                   f"package is {an.kernel_id!r}", file=file, field="kernel_id"))
    cases = bench.get("cases")
    if isinstance(cases, list):
        seen: set[str] = set()
        for index, case in enumerate(cases):
            case_id = case.get("test_case_id") if isinstance(case, dict) else None
            if isinstance(case_id, str):
                if case_id in seen:
                    an.problems.append(problem("BENCH_DUPLICATE_CASE", f"test_case_id {case_id!r} repeats",
                                               file=file, field=f"cases[{index}].test_case_id"))
                seen.add(case_id)
    if not errors and not bad_numbers:
        an.bench = bench


def _check_cases_match(an: Analysis, bench_cases: list | None) -> None:
    if an.metas is None or bench_cases is None:
        return
    meta_ids: set[str] = {i for m in an.metas if isinstance(m, dict) and isinstance(i := m.get("test_case_id"), str)}
    bench_ids: set[str] = {i for c in bench_cases if isinstance(c, dict) and isinstance(i := c.get("test_case_id"), str)}
    if meta_ids != bench_ids:
        parts = []
        if meta_ids - bench_ids:
            parts.append(f"only in METAS: {sorted(meta_ids - bench_ids)}")
        if bench_ids - meta_ids:
            parts.append(f"only in bench_result.yaml: {sorted(bench_ids - meta_ids)}")
        an.problems.append(problem("CASES_MISMATCH", "; ".join(parts), file=contract_path(BENCH_RESULT),
                                   field="cases"))


class HarnessChecks:
    """What the checks of the two harness files found, kept by content (the ``size`` most recent).

    An existing kernel's ``benchmark.py`` and ``build_test_env.py`` are HEAD's byte for byte
    (the harness is locked), so nearly every submission brings harness bytes already
    checked; parsing them again was a fifth of intake's CPU. Keyed by the sha256 of the bytes
    and the file name; the checks are pure functions of both. Callers get copies.
    """

    def __init__(self, size: int = 128) -> None:
        self._size = size
        self._found: OrderedDict[tuple[str, bytes, str], tuple[Any, tuple[Problem, ...]]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def _get(self, check: str, source: bytes | str, file: str,
             run: Callable[[], tuple[Any, list[Problem]]]) -> tuple[Any, list[Problem]]:
        data = source.encode("utf-8", "surrogatepass") if isinstance(source, str) else source
        key = (check, hashlib.sha256(data).digest(), file)
        with self._lock:
            found = self._found.get(key)
            if found is not None:
                self._found.move_to_end(key)
                self.hits += 1
        if found is None:
            value, problems = run()
            found = (copy.deepcopy(value), tuple(problems))
            with self._lock:
                self.misses += 1
                self._found[key] = found
                while len(self._found) > self._size:
                    self._found.popitem(last=False)
        return copy.deepcopy(found[0]), list(found[1])

    def benchmark(self, source: bytes | str, file: str) -> tuple[list | None, list[Problem]]:
        """``check_benchmark_source(source, file)``: (METAS, problems)."""
        return self._get("benchmark", source, file, lambda: check_benchmark_source(source, file))

    def build_env(self, source: bytes | str, file: str) -> list[Problem]:
        """``check_build_env_source(source, file)``: problems."""
        return self._get("build_env", source, file, lambda: (None, check_build_env_source(source, file)))[1]


#: the checks of submitted harness files (:func:`analyze_contents` with a package record: intake)
HARNESS_CHECKS = HarnessChecks()


def analyze_contents(kernel_id: str | None, files: dict[str, bytes | None],
                     exists: Callable[[str], bool | None] | None, expect_bench_result: bool = True,
                     record: PackageRecord | None = None) -> Analysis:
    """Check the contract files' bytes (``files`` maps a basename to bytes; None = absent).

    ``exists(relpath)`` answers whether a normalised path exists in the source area
    (True), is absent (False) or resolves outside it (None); it serves the
    ``reference_sources`` check, skipped when ``exists`` is None. Missing files are reported
    as ``FILE_MISSING``; ``bench_result.yaml`` is checked only when expected. ``record``:
    the package record the bytes come from (members under ``<kernel_id>/``), whose
    cached parse of desc.yaml is used and kept for later readers; with a record, the
    harness files' checks come from :data:`HARNESS_CHECKS` when their bytes were seen.
    """
    an = Analysis(kernel_id)
    id_valid = None
    if kernel_id is not None:
        id_problems = check_kernel_id(kernel_id, field="kernel_id")
        an.problems.extend(id_problems)
        id_valid = not id_problems
    wanted = CONTRACT_FILES if expect_bench_result else _SUBMITTED_FILES
    for name in wanted:
        if files.get(name) is None:
            hint = ("A new package needs a seed bench_result.yaml (the guide's §3.2, commit_sha \"0000000\")."
                    if name == BENCH_RESULT else None)
            an.problems.append(problem("FILE_MISSING", f"{contract_path(name)} is missing",
                                       file=contract_path(name), hint=hint))
    if files.get(DESC) is not None:
        parsed = record.yaml(f"{kernel_id}/{contract_path(DESC)}", contract_path(DESC)) \
            if record is not None else None
        _check_desc(an, files[DESC], id_valid, parsed)  # type: ignore[arg-type]
    raw_bench_cases = None
    if expect_bench_result and files.get(BENCH_RESULT) is not None:
        _check_bench(an, files[BENCH_RESULT], id_valid)  # type: ignore[arg-type]
        if an.bench is not None:
            raw_bench_cases = an.bench["cases"]
    # A submission (read into a record) mostly brings harness bytes checked before: see HarnessChecks.
    build_env, benchmark = files.get(BUILD_ENV), files.get(BENCHMARK)
    if build_env is not None:
        an.problems.extend(HARNESS_CHECKS.build_env(build_env, contract_path(BUILD_ENV)) if record is not None
                           else check_build_env_source(build_env, contract_path(BUILD_ENV)))
    if benchmark is not None:
        metas, problems = HARNESS_CHECKS.benchmark(benchmark, contract_path(BENCHMARK)) if record is not None \
            else check_benchmark_source(benchmark, contract_path(BENCHMARK))
        an.metas = metas
        an.problems.extend(problems)
    _check_cases_match(an, raw_bench_cases)
    if an.desc is not None and an.metas is not None:  # every case must have a physics floor
        an.problems.extend(signature_problems(an.desc.get("io_signature"), an.metas, contract_path(DESC),
                                              contract_path(BENCHMARK)))
    if exists is not None and an.desc is not None:
        an.problems.extend(check_reference_sources(an.desc.get("reference_sources"), exists))
    return an


# ---------------------------------------------------------------- directories


def bench_kernel_id(data: bytes | None) -> Any:
    """The ``kernel_id`` value of bench_result.yaml's bytes (None: no file, unreadable, not a mapping)."""
    if data is None:
        return None
    try:
        doc = load_yaml(data)
    except (YAMLError, ValueError, RecursionError):
        return None
    return doc.get("kernel_id") if isinstance(doc, dict) else None


def resolve_kernel_id(package_dir: Path, bench_kernel_id: object = None) -> str | None:
    """The kernel_id of a package directory when none is given.

    The ``kernel_id`` in bench_result.yaml when the directory path ends with it;
    else the path under the nearest repo root (``.kernel_zoo_root`` or ``.git``);
    else None.
    """
    if isinstance(bench_kernel_id, str) and is_valid_kernel_id(bench_kernel_id) \
            and path_ends_with(package_dir, bench_kernel_id):
        return bench_kernel_id
    root = find_repo_root(package_dir.parent)
    if root is not None:
        try:
            return kernel_id_from_path(package_dir, root)
        except ValueError:
            return None
    return None


_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _read_contract_file(entry: os.DirEntry, name: str, out: list[Problem]) -> bytes | None:
    if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
        what = "a symbolic link" if entry.is_symlink() else "not a regular file"
        out.append(problem("FILE_MISSING", f"{contract_path(name)} is {what}", file=contract_path(name)))
        return None
    # os-level calls: a buffered file object costs more than the read of a small file
    fd = os.open(entry.path, _OPEN_FLAGS)
    try:
        data = os.read(fd, MAX_CONTRACT_FILE_BYTES + 1)
        if data:  # read to the end of the file (a read may return less than asked)
            chunks = [data]
            total = len(data)
            while total <= MAX_CONTRACT_FILE_BYTES:
                chunk = os.read(fd, MAX_CONTRACT_FILE_BYTES + 1 - total)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            if total > MAX_CONTRACT_FILE_BYTES:
                out.append(problem("FILE_TOO_LARGE", f"{os.fstat(fd).st_size} bytes", file=contract_path(name)))
                return None
            if len(chunks) > 1:
                data = b"".join(chunks)
    finally:
        os.close(fd)
    return data


def walk_package(package_dir: str | os.PathLike, listings: dict[str, list] | None = None,
                 top: list[os.DirEntry] | None = None) -> list[Problem]:
    """Links, special files, names with control characters and nested packages in a package directory.

    Caches are ignored. ``listings`` (optional) receives each directory's entries by relative path, so a
    caller can read ``.kernel_package/`` without listing it a second time; ``top`` is
    the package directory's own entries when the caller has listed it already.
    """
    out: list[Problem] = []
    stack = [(os.fspath(package_dir), "")]
    while stack:
        directory, rel = stack.pop()
        if top is not None and not rel:
            entries = top
        else:
            try:
                entries = list(os.scandir(directory))
            except OSError as exc:
                out.append(problem("NOT_A_PACKAGE", f"cannot list {rel or '.'}: {exc.strerror}",
                                   file=rel or None))
                continue
        if listings is not None:
            listings[rel] = entries
        for entry in entries:
            name = entry.name
            if name in IGNORED_NAMES or name.endswith(IGNORED_SUFFIXES):
                continue
            bad = control_character_problem(name, f"{rel}/{name}" if rel else name)
            if bad is not None:  # the packed tarball would be refused for it: say so here already
                out.append(bad)
            if entry.is_dir(follow_symlinks=False):
                sub = f"{rel}/{name}" if rel else name
                if name == KERNEL_PACKAGE_DIR and rel:
                    out.append(problem("NESTED_PACKAGE", f"another package lives at {rel!r}", file=sub))
                stack.append((entry.path, sub))
            elif entry.is_file(follow_symlinks=False):
                continue
            elif entry.is_symlink():  # neither a directory nor a file, not followed: a link
                sub = f"{rel}/{name}" if rel else name
                out.append(problem("PACKAGE_SYMLINK", f"symbolic link to {os.readlink(entry.path)!r}", file=sub))
            else:
                sub = f"{rel}/{name}" if rel else name
                out.append(problem("PACKAGE_SYMLINK", "special file (device, FIFO or socket)", file=sub))
    if len(out) > 1:  # directory order is the filesystem's: sort once at the end
        out.sort(key=lambda p: (p.file or "", p.code))
    return out


def _exists_in(package_dir: str | os.PathLike, listings: dict[str, list] | None = None
               ) -> Callable[[str], bool | None]:
    """``exists(rel)`` for :func:`check_reference_sources`: lstat each component, realpath only past a link.

    ``listings`` (what :func:`walk_package` listed, by relative directory) answers for a
    component found there without a system call; anything else is looked up on disk.
    """
    base = os.fspath(package_dir)

    def through_link(rel: str) -> bool | None:
        full = os.path.join(base, rel)
        if not os.path.exists(full):
            return False
        root = os.path.realpath(base)
        real = os.path.realpath(full)
        inside = real.startswith(root + os.sep) and not real.startswith(
            os.path.join(root, KERNEL_PACKAGE_DIR) + os.sep)
        return True if inside else None

    def on_disk(rel: str) -> bool | None:
        current = base
        for part in rel.split("/"):
            current = os.path.join(current, part)
            try:
                st = os.lstat(current)
            except OSError:
                return False
            if stat.S_ISLNK(st.st_mode):
                return through_link(rel)
        return True

    def exists(rel: str) -> bool | None:
        if not listings:
            return on_disk(rel)
        parent = ""
        for part in rel.split("/"):
            entries = listings.get(parent)
            if entries is None:  # not a directory the walk listed: ask the filesystem
                return on_disk(rel)
            for entry in entries:
                if entry.name == part:
                    break
            else:
                return on_disk(rel)  # absent from the listing: the filesystem has the last word
            if entry.is_symlink():
                return through_link(rel)
            parent = f"{parent}/{part}" if parent else part
        return True
    return exists


def read_package_files(package_dir: str | os.PathLike, listing: list[os.DirEntry] | None = None
                       ) -> tuple[list[Problem], dict[str, bytes | None]]:
    """Problems of the ``.kernel_package/`` layout and the contract files' bytes (empty when it is absent).

    ``listing``: the entries of ``.kernel_package/`` when the caller has listed it as a
    real directory (not a link) already.
    """
    pre: list[Problem] = []
    files: dict[str, bytes | None] = {}
    if listing is not None:
        is_dir, entries = True, {e.name: e for e in listing}
    else:
        kp_dir = os.path.join(os.fspath(package_dir), KERNEL_PACKAGE_DIR)
        try:
            is_dir = stat.S_ISDIR(os.lstat(kp_dir).st_mode)
            entries = {e.name: e for e in os.scandir(kp_dir)} if is_dir else {}
        except OSError:
            is_dir = False
    if not is_dir:
        pre.append(problem("KERNEL_PACKAGE_MISSING", f"no {KERNEL_PACKAGE_DIR}/ directory in {package_dir}",
                           file=KERNEL_PACKAGE_DIR))
        return pre, files
    for name in CONTRACT_FILES:
        entry = entries.get(name)
        files[name] = None if entry is None else _read_contract_file(entry, name, pre)
    if len(entries) > len(CONTRACT_FILES) or any(name not in CONTRACT_FILES for name in entries):
        for name in sorted(entries):
            if name not in CONTRACT_FILES and not is_ignored(name):
                pre.append(problem("KERNEL_PACKAGE_EXTRA_FILE", f"unexpected {name!r}",
                                   file=f"{KERNEL_PACKAGE_DIR}/{name}"))
    return pre, files


def _contents(kernel_id: str | None, files: dict[str, bytes | None]) -> Analysis:
    return analyze_contents(kernel_id, files, None, expect_bench_result=True)


def analyze_package_dir(package_dir: str | os.PathLike, kernel_id: str | None = None, walk: bool = True,
                        contents: Callable[[str | None, dict[str, bytes | None]], Analysis] = _contents,
                        listing: list[os.DirEntry] | None = None) -> Analysis:
    """The :class:`Analysis` of a package directory (``walk=False`` skips the link scan).

    ``contents(kernel_id, files)`` analyses the contract files' bytes; the index passes
    a memoised version (the result is copied, never modified). ``listing``: the
    directory's entries, when the caller has listed it as a real directory already.
    """
    path = Path(package_dir)
    if listing is None and not os.path.isdir(package_dir):
        an = Analysis(kernel_id)
        an.problems.append(problem("NOT_A_PACKAGE", f"{path} is not a directory"))
        return an
    where = os.fspath(path)  # the normalised path, as a string: what the file system calls take
    listings: dict[str, list] = {}
    walked = walk_package(where, listings, listing) if walk else []  # lists .kernel_package/ for the read too
    pre, files = read_package_files(path, listings.get(KERNEL_PACKAGE_DIR))
    unknown_id = False
    bench_id = None
    if kernel_id is None:
        bench_id = bench_kernel_id(files.get(BENCH_RESULT))
        kernel_id = resolve_kernel_id(path.resolve(), bench_id)
        unknown_id = kernel_id is None
    base = contents(kernel_id, files)
    problems = base.problems
    if pre:
        reported = {p.file for p in pre}
        # a file already reported as a link or too large: a FILE_MISSING on top would say the
        # same thing twice (and with no .kernel_package/ at all, every FILE_MISSING would)
        problems = pre + [p for p in problems
                          if not (p.code == "FILE_MISSING" and (not files or p.file in reported))]
    elif not files:
        problems = [p for p in problems if p.code != "FILE_MISSING"]
    else:
        problems = list(problems)
    an = Analysis(base.kernel_id, problems, base.desc, base.desc_valid, base.bench, base.metas, base.cache_key)
    if an.desc is not None:
        refs = an.desc.get("reference_sources")
        if refs:
            problems.extend(check_reference_sources(refs, _exists_in(where, listings if walk else None)))
    if unknown_id and isinstance(bench_id, str):
        problems.append(problem("BENCH_KERNEL_ID_MISMATCH", f"kernel_id is {bench_id!r} but the directory "
                                f"{path} does not end with it (and is not under a repo root)",
                                file=contract_path(BENCH_RESULT), field="kernel_id"))
    elif unknown_id:
        problems.append(problem("KERNEL_ID_UNKNOWN", f"cannot tell the kernel_id of {path}"))
    problems.extend(walked)
    return an


def rule_problems(files: dict[str, bytes], desc: dict | None) -> list[Problem]:
    """The static rules (``rules.check_sources``) over a source area as problems.

    Each finding becomes a problem whose code is the rule id: an error for a rule the
    server rejects on, a warning for one it holds for an admin's review; ``file`` and
    ``field`` give file and line, the hint is the rule's reason. The server's defaults
    apply (a server may configure other vendor calls or switch rules off).
    """
    desc = desc if isinstance(desc, dict) else {}
    category = desc.get("category")
    if not isinstance(category, dict):
        category = {}
    refs = desc.get("reference_sources")
    if not isinstance(refs, list):
        refs = []
    out = []
    for f in check_sources(files, op_class=str(category.get("op_class") or ""),
                           reference_sources=[str(r).strip("/") for r in refs]):
        # codes.problem() knows only the contract's own codes; a rule id is its own code here
        out.append(Problem(code=f.rule, message=f.text, severity=ERROR if f.action == REJECT else WARNING,
                           file=f.file, field=str(f.line) if f.line else None, hint=RULES_BY_ID[f.rule].reason))
    return out


def _source_area(package_dir: str | os.PathLike) -> dict[str, bytes]:
    """{path relative to the package: bytes} of the regular files outside ``.kernel_package/`` (caches skipped)."""
    base = os.fspath(package_dir)
    files: dict[str, bytes] = {}
    for top, dirs, names in os.walk(base):
        rel_top = os.path.relpath(top, base).replace(os.sep, "/")
        rel_top = "" if rel_top == "." else rel_top
        dirs[:] = sorted(d for d in dirs if not is_ignored(d) and not (not rel_top and d == KERNEL_PACKAGE_DIR)
                         and not os.path.islink(os.path.join(top, d)))
        for name in names:
            full = os.path.join(top, name)
            if is_ignored(name) or os.path.islink(full) or not os.path.isfile(full):
                continue
            rel = f"{rel_top}/{name}" if rel_top else name
            # large files are binaries or data: only their names matter to the rules; a source
            # file is read whole however large (the server reads every submitted byte of it)
            large = os.path.getsize(full) > MAX_CONTRACT_FILE_BYTES and not name.lower().endswith(SOURCE_SUFFIXES)
            files[rel] = b"" if large else Path(full).read_bytes()
    return files


def validate_package_dir(path: str | os.PathLike, kernel_id: str | None = None, rules: bool = False) -> Report:
    """Validate a package directory; ``kernel_id`` defaults to what :func:`resolve_kernel_id` finds.

    ``rules``: also run the static rules over the source area (:func:`rule_problems`).
    """
    an = analyze_package_dir(path, kernel_id)
    if rules and os.path.isdir(path):
        an.problems.extend(rule_problems(_source_area(path), an.desc))
    return an.report(str(path))


# ---------------------------------------------------------------- tarballs


def _is_contract_member(name: str) -> bool:
    parts = name.rsplit("/", 2)
    return len(parts) >= 2 and parts[-2] == KERNEL_PACKAGE_DIR and parts[-1] in CONTRACT_FILES


@dataclass(frozen=True)
class PackageRecord:
    """A submitted package as read once from its tarball: the scan, its members' bytes, each parse cached.

    Built by :func:`read_package`, one pass over the archive. The validation
    (:func:`validate_record`), the daemon's static rules and its policies read this record
    instead of the archive, and a member is decoded and parsed at most once: :meth:`yaml`
    (desc.yaml) and :meth:`python` (benchmark.py) keep what they computed. The documents
    and trees they give are shared between those readers: never modify them.
    """

    scan: TarballScan
    #: every regular member was captured (the static rules need the source area), not just the contract files
    source_area: bool
    _parsed: dict[tuple[str, str, str], Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def files(self) -> dict[str, bytes]:
        """{member name: bytes} of the captured members (contract files over 1 MiB are not captured)."""
        return self.scan.captured

    def data(self, name: str) -> bytes | None:
        """The bytes of member ``name`` (normalised, e.g. ``<kernel_id>/.kernel_package/desc.yaml``), or None."""
        return self.scan.captured.get(name)

    def yaml(self, name: str, file: str) -> tuple[bool, Any, tuple[Problem, ...]]:
        """Member ``name`` read as a YAML contract file, once: (parsed, document, problems).

        ``parsed`` is False with a ``FILE_ENCODING`` or ``YAML_INVALID`` problem (naming
        ``file``) when the bytes are not UTF-8 YAML, or when the member is absent.
        """
        key = ("yaml", name, file)
        if key not in self._parsed:
            data = self.data(name)
            found: list[Problem] = []
            ok, doc = _load_yaml_file(data, file, found) if data is not None else (False, None)
            self._parsed[key] = (ok, doc, tuple(found))
        result: tuple[bool, Any, tuple[Problem, ...]] = self._parsed[key]
        return result

    def mapping(self, name: str, file: str) -> dict | None:
        """The mapping :meth:`yaml` parsed member ``name`` to, or None (absent, unreadable, not a mapping)."""
        ok, doc, _found = self.yaml(name, file)
        return doc if ok and isinstance(doc, dict) else None

    def python(self, name: str, file: str) -> tuple[ast.Module | None, list[Problem]]:
        """Member ``name``'s syntax tree, parsed once (``parse_python``; problems name ``file``)."""
        key = ("python", name, file)
        if key not in self._parsed:
            data = self.data(name)
            self._parsed[key] = parse_python(data, file) if data is not None else \
                (None, [problem("FILE_MISSING", f"{file} is missing", file=file)])
        tree, found = self._parsed[key]
        return tree, list(found)

    def source_area_of(self, kernel_id: str) -> dict[str, bytes]:
        """{path relative to the package: bytes} of the files under ``<kernel_id>/`` outside ``.kernel_package/``."""
        if not self.source_area:
            raise ValueError("this record holds the contract files only (read_package(..., source_area=True))")
        prefix = f"{kernel_id}/"
        contract = f"{prefix}{KERNEL_PACKAGE_DIR}/"
        return {name[len(prefix):]: data for name, data in self.scan.captured.items()
                if name.startswith(prefix) and not name.startswith(contract)}


def _capture_bytes(limits: Limits) -> Callable[[str], int]:
    """The most bytes captured of a member: a contract file's limit, else the archive's member limit."""
    def most(name: str) -> int:
        return MAX_CONTRACT_FILE_BYTES if _is_contract_member(name) else limits.member_bytes
    return most


def read_package(source, limits: Limits = Limits(), source_area: bool = True) -> PackageRecord:
    """Read a submission tarball (a path or a binary file object) once into a :class:`PackageRecord`.

    The pass enforces ``limits`` as :func:`scan_tarball` does and captures the contract
    files (one over 1 MiB is a ``FILE_TOO_LARGE`` problem instead) and, with
    ``source_area``, every other regular member too.
    """
    if source_area:
        scan = scan_tarball(source, limits, capture=lambda _name: True, capture_bytes=_capture_bytes(limits))
    else:
        scan = scan_tarball(source, limits, capture=_is_contract_member, capture_bytes=MAX_CONTRACT_FILE_BYTES)
    return PackageRecord(scan, source_area)


def _implied_paths(names: Iterable[str]) -> set[str]:
    out: set[str] = set()
    for name in names:
        parts = name.split("/")
        for i in range(1, len(parts) + 1):
            out.add("/".join(parts[:i]))
    return out


def validate_tarball(source, name: str, limits: Limits = Limits(), kernel_id: str | None = None,
                     rules: bool = False) -> Report:
    """Validate a submission tarball (a path or a binary file object) without unpacking it.

    ``name`` is the file name as submitted (it must end in ``.tar.gz``); ``kernel_id``,
    when given (the daemon knows it from the upload), must equal the archive's
    top-level package directory. A ``.kernel_package/bench_result.yaml`` inside is a
    ``BENCH_RESULT_IN_TARBALL`` error (the daemon answers VALIDATION_ERROR). ``rules``:
    also run the static rules over the source area (:func:`rule_problems`). One pass
    over the archive (:func:`read_package`), then :func:`validate_record`.
    """
    return validate_record(read_package(source, limits, source_area=rules), name, kernel_id, rules)


def validate_record(record: PackageRecord, name: str, kernel_id: str | None = None, rules: bool = False) -> Report:
    """:func:`validate_tarball` over a tarball already read into ``record``: the same problems, in the same order.

    ``rules`` needs a record read with its source area.
    """
    problems: list[Problem] = []
    if not name.endswith(".tar.gz"):
        problems.append(problem("TARBALL_NAME", f"{name!r} does not end in .tar.gz", file=name))
    scan = record.scan
    problems.extend(scan.problems)
    extra: dict[str, Any] = {"compressed_bytes": scan.compressed_bytes, "unpacked_bytes": scan.unpacked_bytes,
             "members": len(scan.members)}
    if not scan.complete or not scan.members:
        return Analysis(kernel_id, problems).report(name, extra)
    root, root_problems = find_package_root(scan.names(), kernel_id)
    problems.extend(root_problems)
    if root is None:
        return Analysis(kernel_id, problems).report(name, extra)
    prefix = root + "/"
    rel_names = [n[len(prefix):] for n in scan.names() if n.startswith(prefix)]
    kinds = {m.name[len(prefix):]: m.kind for m in scan.members if m.name.startswith(prefix)}
    if f"{KERNEL_PACKAGE_DIR}/{BENCH_RESULT}" in kinds:
        problems.append(problem("BENCH_RESULT_IN_TARBALL", "the scorecard must not be submitted",
                                file=f"{root}/{contract_path(BENCH_RESULT)}"))
    files: dict[str, bytes | None] = {}
    for contract in (DESC, BUILD_ENV, BENCHMARK):
        rel = contract_path(contract)
        if rel in kinds and kinds[rel] != "file":
            problems.append(problem("FILE_MISSING", f"{rel} is not a regular file", file=rel))
        files[contract] = scan.captured.get(prefix + rel)
    for rel in sorted(kinds):
        parts = rel.split("/")
        if len(parts) == 2 and parts[0] == KERNEL_PACKAGE_DIR and parts[1] not in CONTRACT_FILES \
                and not is_ignored(parts[1]):
            problems.append(problem("KERNEL_PACKAGE_EXTRA_FILE", f"unexpected {parts[1]!r}", file=rel))
    present = _implied_paths(rel_names)
    an = analyze_contents(root, files, present.__contains__, expect_bench_result=False, record=record)
    reported = {p.file for p in problems} | {f"{prefix}{p.file}" for p in problems}
    an.problems = [p for p in an.problems
                   if not (p.code == "FILE_MISSING" and (f"{prefix}{p.file}" in reported or p.file in reported))]
    an.problems[:0] = problems
    if rules:  # the source area was captured whole, with the member limit, in the same pass
        an.problems.extend(rule_problems(record.source_area_of(root), an.desc))
    extra["kernel_id"] = root
    return an.report(name, extra)

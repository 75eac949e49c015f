"""The leaderboard index: every package of a kernel repo, its verdict and its scores.

``build_index(repo_root)`` scans the repo (a ``.kernel_package`` directory marks a
package; ``.git`` is skipped) and returns the index document, which matches
``schemas/index.json``. The document is a pure function of the repo's files and
the arguments: kernels sorted by kernel_id, no timestamps unless the caller
passes ``head``/``generated_at``, so the same repo gives byte-identical JSON
(:func:`dumps`). ``update_index(doc, repo_root, kernel_ids)`` rescans only the
named packages (the daemon calls it after an accept) and gives exactly what a
full rebuild would. ``write_index`` replaces the file atomically.
"""
from __future__ import annotations

import bisect
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no forked workers either
    fcntl = None  # type: ignore[assignment]

from kz_events.durable import atomic_write
from kz_runner.contract.codes import problem
from kz_runner.contract.indexing.cache import ContentsCache
from kz_runner.contract.kernel_id import CATEGORY_FIELDS
from kz_runner.contract.layout import SEED_SHA
from kz_runner.contract.problems import Problem
from kz_runner.contract.tarball import KERNEL_PACKAGE_DIR
from kz_runner.contract.validate import Analysis, analyze_package_dir, is_ignored

SCHEMA_VERSION = "1.0.0"
ENV_REPO = "KERNEL_ZOO_KERNEL_REPO_PATH"
ENV_INDEX = "KERNEL_ZOO_INDEX_PATH"


def default_paths(environ: dict | None = None) -> tuple[Path, Path]:
    """``(repo root, index path)`` from KERNEL_ZOO_KERNEL_REPO_PATH / KERNEL_ZOO_INDEX_PATH (cwd, ./index.json)."""
    env = os.environ if environ is None else environ
    repo = Path(env.get(ENV_REPO) or ".")
    index = Path(env.get(ENV_INDEX) or "index.json")
    return repo, index


def find_packages(repo_root: str | os.PathLike, under: str = "") -> list[str]:
    """kernel_ids of the top-level packages at or below ``under`` (packages are not entered)."""
    return _find_packages(repo_root, under, None)


def _find_packages(repo_root: str | os.PathLike, under: str, listings: dict[str, list] | None) -> list[str]:
    """:func:`find_packages`; ``listings`` receives each package directory's entries."""
    root = os.fspath(repo_root)
    start = os.path.join(root, under) if under else root
    found: list[str] = []
    stack = [(start, under)]
    while stack:
        directory, rel = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        if rel and any(e.name == KERNEL_PACKAGE_DIR and e.is_dir(follow_symlinks=False) for e in entries):
            found.append(rel)
            if listings is not None:
                listings[rel] = entries
            continue
        for entry in entries:
            if entry.name == ".git" or is_ignored(entry.name) or entry.name == KERNEL_PACKAGE_DIR:
                continue
            if entry.is_dir(follow_symlinks=False):
                stack.append((entry.path, f"{rel}/{entry.name}" if rel else entry.name))
    return sorted(found)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _record(value: Any) -> dict | None:
    if not isinstance(value, dict):
        return None
    record = {"value": value.get("value"), "submitter": value.get("submitter"),
              "commit_sha": value.get("commit_sha"), "recorded_at": value.get("recorded_at"),
              "seed": value.get("commit_sha") == SEED_SHA}
    spread = value.get("spread")
    if isinstance(spread, dict) and {"n", "lo", "hi"} <= set(spread):  # the schema checked the scorecard's
        record["spread"] = {"n": spread["n"], "lo": spread["lo"], "hi": spread["hi"]}
    if value.get("measurement") == "unverified":  # measured where the package's code ran: shown, never ranked
        record["unverified"] = True
    return record


def _cases(an: Analysis) -> list[dict]:
    bench_cases = {c["test_case_id"]: c for c in an.bench["cases"]} if an.bench is not None else {}
    if an.metas is not None:
        metas = [m for m in an.metas if isinstance(m, dict) and isinstance(m.get("test_case_id"), str)]
    else:
        metas = [{"test_case_id": case_id} for case_id in bench_cases]
    out = []
    seen: set[str] = set()
    for meta in metas:
        case_id = meta["test_case_id"]
        if case_id in seen:
            continue
        seen.add(case_id)
        primary = _text(meta.get("primary_metric"))
        declared = {}
        for metric in meta.get("metrics") or []:
            if isinstance(metric, dict) and metric.get("name") == primary:
                declared = metric
                break
        case = bench_cases.get(case_id) or {}
        best = (case.get("metrics_best") or {}).get(primary) if primary else None
        current = (case.get("metrics_current") or {}).get(primary) if primary else None
        out.append({"test_case_id": case_id, "primary_metric": primary,
                    "direction": _text(declared.get("direction")), "unit": _text(declared.get("unit")),
                    "best": _record(best), "current": _record(current),
                    "correctness_current": _text(case.get("correctness_current"))})
    return out


def _ancestor_package(repo_root: str | os.PathLike, kernel_id: str) -> str | None:
    base = os.fspath(repo_root)
    parts = kernel_id.split("/")
    for i in range(1, len(parts)):
        candidate = "/".join(parts[:i])
        if os.path.isdir(os.path.join(base, candidate, KERNEL_PACKAGE_DIR)):
            return candidate
    return None


def kernel_entry(repo_root: str | os.PathLike, kernel_id: str, cache: ContentsCache | None = None,
                 top_level: bool = False, listing: list | None = None) -> dict:
    """The index entry of one package, validated exactly as ``kz validate`` does.

    ``top_level`` says the caller knows no ancestor directory is a package (what
    :func:`find_packages` returns), which saves the ancestor checks; ``listing`` is
    the package directory's entries when the caller has listed it.
    """
    root = os.fspath(repo_root)
    package_dir = os.path.join(root, kernel_id)
    if cache is None:
        an = analyze_package_dir(package_dir, kernel_id, listing=listing)
    else:
        an = analyze_package_dir(package_dir, kernel_id, contents=cache.analyze, listing=listing)
    outer = None if top_level else _ancestor_package(root, kernel_id)
    if outer is not None:
        an.problems.append(problem("NESTED_PACKAGE", f"inside the source area of package {outer!r}"))
    return _entry(an, kernel_id, cache)


def _static_fields(an: Analysis) -> dict:
    """The entry fields that depend only on the contract files (cached per content key)."""
    desc = an.desc or {}
    category = desc.get("category")
    if isinstance(category, dict) and all(isinstance(category.get(k), str) for k in CATEGORY_FIELDS):
        category = {k: category[k] for k in CATEGORY_FIELDS}
    else:
        category = None
    tags = desc.get("tags")
    tags = [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []
    return {"name": _text(desc.get("name")), "category": category, "summary": _text(desc.get("summary")),
            "status": _text(desc.get("status")), "tags": tags, "cases": _cases(an)}


def _entry(an: Analysis, kernel_id: str, cache: ContentsCache | None = None) -> dict:
    if cache is not None and an.cache_key is not None:
        static = cache.derived(an.cache_key, lambda: _static_fields(an))
    else:
        static = _static_fields(an)
    problems = an.problems
    if problems:
        errors = [p for p in problems if p.severity == "error"]
        ordered = errors + [p for p in problems if p.severity != "error"] if errors else problems
    else:
        errors = ordered = problems
    return {
        "kernel_id": kernel_id,
        "name": static["name"],
        "category": static["category"],
        "summary": static["summary"],
        "status": static["status"],
        "tags": static["tags"],
        "valid": not errors,
        "problems": [_problem_json(p) for p in ordered],
        "cases": static["cases"],
    }


def _problem_json(p: Problem) -> dict:
    return {"code": p.code, "severity": p.severity, "message": p.message, "file": p.file, "field": p.field}


def _nested_under(entry: dict) -> list[str]:
    """kernel_ids of packages nested in ``entry``'s source area (from its NESTED_PACKAGE problems)."""
    out = []
    for p in entry["problems"]:
        if p["code"] == "NESTED_PACKAGE" and p["file"] and p["file"].endswith("/" + KERNEL_PACKAGE_DIR):
            out.append(f"{entry['kernel_id']}/{p['file'][: -len(KERNEL_PACKAGE_DIR) - 1]}")
    return out


def _scan(root: Path, kernel_ids: Iterable[str], cache: ContentsCache | None,
          top_level: bool = False, listings: dict[str, list] | None = None) -> dict[str, dict]:
    """Entries for ``kernel_ids`` and every package nested inside them (``listings``: see _find_packages)."""
    entries: dict[str, dict] = {}
    todo = [(kernel_id, top_level) for kernel_id in kernel_ids]
    while todo:
        kernel_id, known_top = todo.pop()
        if kernel_id in entries:
            continue
        listing = listings.pop(kernel_id, None) if listings is not None else None  # used once, then freed
        entry = kernel_entry(root, kernel_id, cache, top_level=known_top, listing=listing)
        entries[kernel_id] = entry
        todo.extend((nested, False) for nested in _nested_under(entry))
    return entries


def _kernel_id_of(entry: dict) -> str:
    return entry["kernel_id"]


def with_prefix(kernels: Sequence[Any], prefix: str, key: Callable[[Any], str] | None = _kernel_id_of) -> list:
    """The items of ``kernels`` whose kernel_id starts with ``prefix``, found in O(log N).

    ``kernels`` must be sorted by kernel_id, as a document's entries always are;
    ``key`` gives an item's kernel_id (None: the items are kernel_ids).
    """
    ident = key if key is not None else str
    start = bisect.bisect_left(kernels, prefix, key=key)
    end = start
    while end < len(kernels) and ident(kernels[end]).startswith(prefix):
        end += 1
    return list(kernels[start:end])


def family(kernels: Sequence[Any], kernel_id: str, key: Callable[[Any], str] | None = _kernel_id_of) -> list:
    """The items of ``kernel_id`` and of the packages nested below it (sorted ``kernels``, O(log N))."""
    ident = key if key is not None else str
    i = bisect.bisect_left(kernels, kernel_id, key=key)
    own = [kernels[i]] if i < len(kernels) and ident(kernels[i]) == kernel_id else []
    return own + with_prefix(kernels, kernel_id + "/", key)


def is_sorted(kernels: Sequence[dict]) -> bool:
    """Whether ``kernels`` is strictly sorted by kernel_id (what :func:`with_prefix` and :func:`family` need)."""
    ids = [k["kernel_id"] for k in kernels]
    return all(a < b for a, b in zip(ids, ids[1:]))


def _document(entries: dict[str, dict], head: str | None, generated_at: str | None) -> dict:
    kernels = [entries[k] for k in sorted(entries)]
    valid = frozen = deprecated = with_warnings = cases = 0
    for kernel in kernels:  # one pass (10,000 entries)
        if kernel["valid"]:
            valid += 1
        status = kernel["status"]
        if status == "frozen":
            frozen += 1
        elif status == "deprecated":
            deprecated += 1
        if kernel["problems"] and any(p["severity"] == "warning" for p in kernel["problems"]):
            with_warnings += 1
        cases += len(kernel["cases"])
    counts = {"kernels": len(kernels), "valid": valid, "invalid": len(kernels) - valid, "frozen": frozen,
              "deprecated": deprecated, "with_warnings": with_warnings, "cases": cases}
    return {"schema_version": SCHEMA_VERSION, "head": head, "generated_at": generated_at,
            "counts": counts, "kernels": kernels}


#: (repo root, cache, package listings) handed to forked workers of a parallel build; set only while
#: the workers run
_FORK_STATE: tuple[Path, ContentsCache | None, dict[str, list]] | None = None
PARALLEL_MIN_PACKAGES = 500
_CHUNK = 32          # packages per claim: small enough that the last claims end close together
_FRAME = 8           # bytes of the length that precedes each pickled frame a worker sends
_CLAIM = 4           # bytes of a chunk number in the claims pipe


def _scan_chunk(kernel_ids: list[str]) -> tuple[dict[str, dict], tuple | None]:
    """Worker side of a parallel build: entries for ``kernel_ids`` and what the cache learned."""
    assert _FORK_STATE is not None
    root, cache, listings = _FORK_STATE
    if cache is not None:  # one worker runs several chunks: report each chunk's own counts
        cache.reset_counts()
    entries = _scan(root, kernel_ids, cache, top_level=True, listings=listings)
    return entries, (cache.export_used() if cache is not None else None)


def _claim(fd: int) -> int | None:
    """The next unclaimed chunk number from the claims pipe, or None when all are taken."""
    try:
        data = os.read(fd, _CLAIM)
    except BlockingIOError:
        return None
    return int.from_bytes(data, "little") if len(data) == _CLAIM else None


def _worker(claims: int, out: int, chunks: list[list[str]]) -> None:
    """A forked worker: scan claimed chunks and send an ``(entries, learned)`` frame for each."""
    import pickle

    def send(value: Any) -> None:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(len(data).to_bytes(_FRAME, "little") + data)
        while view:
            view = view[os.write(out, view):]

    while (number := _claim(claims)) is not None:
        send(_scan_chunk(chunks[number]))


class _Inbox:
    """The parent's end of one worker's frames: read as they come, decoded whole."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid, self.fd = pid, fd
        self.buffer = bytearray()
        self.closed = False  # the stream ended (the worker exited)

    def drain(self) -> list:
        """The frames complete so far (the descriptor is non-blocking: what has arrived)."""
        import pickle

        while True:
            try:
                data = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                break
            if not data:
                self.closed = True
                break
            self.buffer += data
        frames = []
        at = 0
        while len(self.buffer) - at >= _FRAME:
            size = int.from_bytes(self.buffer[at:at + _FRAME], "little")
            if len(self.buffer) - at - _FRAME < size:
                break
            with memoryview(self.buffer) as view:
                frames.append(pickle.loads(view[at + _FRAME:at + _FRAME + size]))
            at += _FRAME + size
        del self.buffer[:at]
        return frames


def _scan_parallel(root: Path, kernel_ids: list[str], cache: ContentsCache | None,
                   workers: int, listings: dict[str, list]) -> dict[str, dict]:
    """Entries for ``kernel_ids`` from ``workers`` forked processes.

    Every worker claims chunks of packages from a shared pipe of chunk numbers (so a
    worker slowed by other load simply claims fewer) and sends their entries back as
    pickled frames, which this process decodes as they arrive (it scans nothing itself,
    so it touches few of the pages it shares with the workers). Whatever a worker does
    not deliver (it died) is scanned here at the end, so the result is always every
    entry, as a serial scan makes it.
    """
    import selectors

    global _FORK_STATE
    size = max(_CHUNK, -(-len(kernel_ids) // 16_000))  # the claims must fit the pipe's 64 KiB
    chunks = [kernel_ids[i:i + size] for i in range(0, len(kernel_ids), size)]
    claims, fill = os.pipe()
    try:
        tokens = memoryview(b"".join(n.to_bytes(_CLAIM, "little") for n in range(len(chunks))))
        while tokens:
            tokens = tokens[os.write(fill, tokens):]
    finally:
        os.close(fill)
    os.set_blocking(claims, False)
    inboxes: list[_Inbox] = []
    entries: dict[str, dict] = {}
    _FORK_STATE = (root, cache, listings)
    try:
        for _ in range(workers):
            read_end, write_end = os.pipe()
            if hasattr(fcntl, "F_SETPIPE_SZ"):
                try:  # room for a few frames: a worker seldom waits for this process to read
                    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 1 << 20)
                except OSError:
                    pass
            try:
                pid = os.fork()
            except OSError:  # no more processes now: the others (or this one, at the end) do the rest
                os.close(read_end)
                os.close(write_end)
                break
            if pid == 0:  # the worker: never returns
                status = 1
                try:
                    os.close(read_end)
                    for inbox in inboxes:
                        os.close(inbox.fd)
                    _worker(claims, write_end, chunks)
                    status = 0
                except BaseException:  # noqa: BLE001 - reported, then the parent scans what is missing
                    import traceback

                    traceback.print_exc()
                finally:
                    os._exit(status)
            os.close(write_end)
            os.set_blocking(read_end, False)
            inboxes.append(_Inbox(pid, read_end))
        _FORK_STATE = None
        with selectors.DefaultSelector() as selector:
            for inbox in inboxes:
                selector.register(inbox.fd, selectors.EVENT_READ, inbox)
            open_streams = len(inboxes)
            while open_streams:
                for key, _events in selector.select():
                    inbox = key.data
                    for chunk_entries, learned in inbox.drain():
                        entries.update(chunk_entries)
                        if cache is not None and learned is not None:
                            cache.absorb(*learned)
                    if inbox.closed:
                        selector.unregister(inbox.fd)
                        open_streams -= 1
    finally:
        _FORK_STATE = None
        os.close(claims)
        for inbox in inboxes:
            os.close(inbox.fd)  # a worker still sending now fails and ends
            try:
                os.waitpid(inbox.pid, 0)
            except ChildProcessError:  # reaped already (SIGCHLD ignored)
                pass
    missing = [kernel_id for kernel_id in kernel_ids if kernel_id not in entries]
    if missing:  # a worker died (or none could start): what it did not send is scanned here
        entries.update(_scan(root, missing, cache, top_level=True, listings=listings))
    return entries


def build_index(repo_root: str | os.PathLike, head: str | None = None, generated_at: str | None = None,
                cache: ContentsCache | None = None, workers: int = 1) -> dict:
    """Scan the whole repo and return the index document (see ``schemas/index.json``).

    ``cache`` (optional) skips re-parsing contract files whose bytes it has seen;
    the document is the same with or without it. ``workers`` > 1 splits a large
    repo over forked processes (for single-threaded callers such as ``kz index``;
    a threaded daemon should keep the default 1, since fork and threads mix badly).
    """
    import gc

    root = Path(repo_root)
    listings: dict[str, list] = {}
    kernel_ids = _find_packages(root, "", listings)
    parallel = workers > 1 and len(kernel_ids) >= PARALLEL_MIN_PACKAGES and hasattr(os, "fork")
    enabled = gc.isenabled()
    gc.disable()  # tens of thousands of small containers: collection passes would cost more than the scan
    try:
        if parallel:
            entries = _scan_parallel(root, kernel_ids, cache, workers, listings)
        else:
            entries = _scan(root, kernel_ids, cache, top_level=True, listings=listings)
        return _document(entries, head, generated_at)
    finally:
        if enabled:
            gc.enable()


def update_index(doc: dict, repo_root: str | os.PathLike, kernel_ids: Iterable[str],
                 head: str | None = None, generated_at: str | None = None,
                 cache: ContentsCache | None = None) -> dict:
    """A new document with only ``kernel_ids`` (and packages nested in them) rescanned.

    A kernel_id whose package is gone is dropped, as are stale packages nested
    under it. The result equals ``build_index`` on the same repo when only those
    packages changed since ``doc`` was built. ``doc`` itself is not modified.
    """
    root = Path(repo_root)
    entries = {k["kernel_id"]: k for k in doc.get("kernels", [])}
    for kernel_id in kernel_ids:
        for stale in [k for k in entries if k == kernel_id or k.startswith(kernel_id + "/")]:
            del entries[stale]
        if (root / kernel_id / KERNEL_PACKAGE_DIR).is_dir():
            entries.update(_scan(root, [kernel_id], cache))
        else:  # no longer a package: whatever packages now live below it are found afresh
            entries.update(_scan(root, find_packages(root, kernel_id), cache))
    return _document(entries, head if head is not None else doc.get("head"),
                     generated_at if generated_at is not None else doc.get("generated_at"))


def dumps(doc: dict) -> str:
    """The canonical JSON text of an index document: compact, stable key order, UTF-8, trailing newline."""
    return json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"


def write_index(doc: dict, path: str | os.PathLike) -> Path:
    """Write ``doc`` to ``path`` atomically: temporary file, fsync, rename, fsync of the directory."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, dumps(doc).encode("utf-8"))
    return target

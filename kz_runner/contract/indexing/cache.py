"""A content-addressed cache of package analyses, so a full index rebuild re-reads but does not re-parse.

Key: the kernel_id and the bytes of the four contract files (BLAKE2b), so an
entry can never be stale: a changed file is a different key. The cache file also
records a fingerprint of the validator (its sources and the schemas); a file
written by another version is ignored. Filesystem-dependent checks (links,
reference_sources, nested packages) are never cached: they run on every rebuild.
Records written to disk keep only what the index reads (the problems, the desc
fields the filesystem checks need, and the index fields derived from the files),
so an analysis restored from the file serves the index, not a full ``kz validate``
report.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from kz_events.durable import atomic_write
from kz_runner.contract.problems import Problem
from kz_runner.contract.schema_check import _json_finite
from kz_runner.contract.validate import CONTRACT_FILES, Analysis, analyze_contents

CACHE_FORMAT = 2
_DESC_KEYS = ("reference_sources",)


#: the whole contract package: validate, the rules, the floor ... (not the indexing folder alone)
CONTRACT_DIR = Path(__file__).resolve().parent.parent


@cache
def validator_fingerprint(contract: Path = CONTRACT_DIR) -> str:
    """SHA-256 over the contract package's sources and the schemas: changes whenever verdicts may."""
    import kz_schemas

    digest = hashlib.sha256(str(CACHE_FORMAT).encode())
    sources = [(p.relative_to(contract).as_posix(), p) for p in sorted(contract.rglob("*.py"))]
    schemas = [(p.name, p) for p in sorted(Path(kz_schemas.SCHEMA_DIR).glob("*.json"))]
    for name, path in sources + schemas:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def contents_key(kernel_id: str | None, files: dict[str, bytes | None]) -> str:
    """The cache key of a package's contract files."""
    digest = hashlib.blake2b(digest_size=20)
    digest.update((kernel_id or "").encode() + b"\0")
    for name in CONTRACT_FILES:
        data = files.get(name)
        digest.update(b"-" if data is None else b"+%d:" % len(data) + data)
    return digest.hexdigest()


def _to_record(an: Analysis, derived: Any) -> dict | None:
    """An analysis as the index needs it back: problems, the desc fields for the filesystem checks
    and the derived entry fields (the parsed scorecard and METAS stay in memory only)."""
    desc = None if an.desc is None else {k: an.desc[k] for k in _DESC_KEYS if k in an.desc}
    record = {"kernel_id": an.kernel_id, "problems": [p.to_json() for p in an.problems], "desc": desc,
              "desc_valid": an.desc_valid, "derived": derived}
    if not _json_finite(record):  # one C pass, as json.dumps(record, allow_nan=False) would make
        return None  # e.g. a desc holding a YAML timestamp: keep it in memory only
    return record


def _from_record(record: dict) -> Analysis:
    return Analysis(record["kernel_id"], [Problem(**p) for p in record["problems"]], record["desc"],
                    record["desc_valid"], None, None)


class ContentsCache:
    """Memoises ``analyze_contents`` for packages; pass :meth:`analyze` as ``contents=``."""

    def __init__(self) -> None:
        self._memory: dict[str, Analysis] = {}
        self._stored: dict[str, dict] = {}
        self._used: set[str] = set()
        self._derived: dict[str, Any] = {}
        # kernel_id -> key of its newest analysis: a package replaced by a newer one is
        # dropped, else a long-running daemon keeps every version ever accepted (~30 KiB each)
        self._latest: dict[str, str] = {}
        self.hits = 0
        self.misses = 0

    def analyze(self, kernel_id: str | None, files: dict[str, bytes | None]) -> Analysis:
        """``analyze_contents(kernel_id, files)``, from the cache when the same bytes were seen."""
        key = contents_key(kernel_id, files)
        if kernel_id is not None:
            self._supersede(kernel_id, key)
        self._used.add(key)
        found = self._memory.get(key)
        if found is None and key in self._stored:
            record = self._stored[key]
            found = self._memory[key] = _from_record(record)
            self._derived[key] = record["derived"]
        if found is None:
            self.misses += 1
            found = self._memory[key] = analyze_contents(kernel_id, files, None, expect_bench_result=True)
        else:
            self.hits += 1
        # a copy the caller may change (dataclasses.replace does the same, slower)
        return Analysis(found.kernel_id, list(found.problems), found.desc, found.desc_valid, found.bench,
                        found.metas, key)

    def _supersede(self, kernel_id: str, key: str) -> None:
        previous = self._latest.get(kernel_id)
        self._latest[kernel_id] = key
        if previous is not None and previous != key:
            for held in (self._memory, self._derived, self._stored):
                held.pop(previous, None)
            self._used.discard(previous)

    def derived(self, key: str, make: Callable[[], Any]) -> Any:
        """A value computed once per key from an analysis (in memory only; treat it as read-only)."""
        value = self._derived.get(key)
        if value is None:
            value = self._derived[key] = make()
        return value

    def __len__(self) -> int:
        """Number of analyses held (loaded from disk or computed)."""
        return len(self._stored.keys() | self._memory.keys())

    def reset_counts(self) -> None:
        """Forget hits, misses and used keys (a worker starting a new chunk)."""
        self.hits = self.misses = 0
        self._used = set()

    def export_used(self) -> tuple[list[str], dict[str, dict], int, int]:
        """For a worker process: keys used, records of fresh analyses, hits, misses."""
        fresh = {}
        for key in self._used:
            if key not in self._stored and key in self._memory and key in self._derived:
                record = _to_record(self._memory[key], self._derived[key])
                if record is not None:
                    fresh[key] = record
        return sorted(self._used), fresh, self.hits, self.misses

    def absorb(self, used: list[str], fresh: dict[str, dict], hits: int, misses: int) -> None:
        """Merge what a worker process's copy of this cache learned (see :meth:`export_used`)."""
        self._used.update(used)
        self._stored.update(fresh)
        self.hits += hits
        self.misses += misses

    @classmethod
    def load(cls, path: str | os.PathLike) -> ContentsCache:
        """A cache filled from ``path``; empty when the file is missing, unreadable or from another version."""
        cache = cls()
        try:
            data = json.loads(Path(path).read_bytes())
        except (OSError, ValueError):
            return cache
        if isinstance(data, dict) and data.get("fingerprint") == validator_fingerprint():
            entries = data.get("entries")
            if isinstance(entries, dict):
                cache._stored = entries
        return cache

    def save(self, path: str | os.PathLike) -> None:
        """Write the entries used since load (older ones are dropped) atomically to ``path``."""
        entries: dict[str, dict] = {}
        for key in sorted(self._used):
            record: dict | None
            if key in self._stored:
                record = self._stored[key]
            elif key in self._memory and key in self._derived:
                record = _to_record(self._memory[key], self._derived[key])
            else:
                record = None  # analysed but never turned into index fields: recomputed next time
            if record is not None:
                entries[key] = record
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"format": CACHE_FORMAT, "fingerprint": validator_fingerprint(),
                           "entries": entries}, separators=(",", ":")).encode()
        atomic_write(target, data, fsync=False)  # a lost cache only costs one slower rebuild


def default_cache_path(repo_root: str | os.PathLike) -> Path:
    """``$XDG_CACHE_HOME/kernel_zoo/index-<repo hash>.json`` (``~/.cache`` by default)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    tag = hashlib.sha256(str(Path(repo_root).resolve()).encode()).hexdigest()[:16]
    return base / "kernel_zoo" / f"index-{tag}.json"

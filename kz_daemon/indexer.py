"""index.json: the leaderboard index, updated incrementally after each accept.

The document itself is built by the contract library (``kz_runner.contract.index``:
``build_index`` for a full scan, ``update_index`` for the kernels an accept
touched), from the checked-out files, which ``GitStore.sync_files`` brings to HEAD
first. This module adds the daemon's part: the atomic replace of ``DIR/index.json``
(temp file, fsync, rename) and the ``index.updated`` event with a version that
increases with every rewrite. A full rebuild at the same HEAD gives the identical
document (tests/test_daemon_index.py).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable


def _lib():
    try:
        from kz_runner.contract import index as lib
    except ImportError:  # until the contract library's index lands: the minimal builder below
        import sys

        return sys.modules[__name__]
    return lib


# -- minimal builder (used only while kz_runner.contract.index is missing) -------------
def _entry(repo_root: Path, kernel_id: str) -> dict | None:
    import yaml

    kp = repo_root / kernel_id / ".kernel_package"
    if not kp.is_dir():
        return None
    def load(name):
        try:
            return yaml.safe_load((kp / name).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            return None
    desc = load("desc.yaml") or {}
    bench = load("bench_result.yaml") or {}
    files = ("desc.yaml", "bench_result.yaml", "build_test_env.py", "benchmark.py")
    return {"kernel_id": kernel_id, "name": desc.get("name"), "category": desc.get("category"),
            "status": desc.get("status"), "valid": all((kp / f).is_file() for f in files),
            "cases": bench.get("cases") or []}


def build_index(repo_root: Path, head: str | None = None, generated_at: str | None = None) -> dict:
    """Minimal full index (fallback)."""
    repo_root = Path(repo_root)
    kernels = []
    for kp in sorted(repo_root.rglob(".kernel_package")):
        if ".git" in kp.parts:
            continue
        entry = _entry(repo_root, kp.parent.relative_to(repo_root).as_posix())
        if entry is not None:
            kernels.append(entry)
    return {"schema_version": "1.0.0", "head": head, "generated_at": generated_at, "kernels": kernels}


def update_index(doc: dict, repo_root: Path, kernel_ids: list, head: str | None = None,
                 generated_at: str | None = None) -> dict:
    """Minimal incremental update (fallback)."""
    by_id = {k["kernel_id"]: k for k in doc.get("kernels", [])}
    for kid in kernel_ids:
        entry = _entry(Path(repo_root), kid)
        if entry is None:
            by_id.pop(kid, None)
        else:
            by_id[kid] = entry
    return dict(doc, head=head, generated_at=generated_at, kernels=[by_id[k] for k in sorted(by_id)])


def build(repo_root: Path, head: str | None = None, generated_at: str | None = None) -> dict[str, Any]:
    """A full index document of the checked-out repo at ``repo_root``."""
    return _lib().build_index(repo_root, head=head, generated_at=generated_at)


def update(doc: dict | None, repo_root: Path, kernel_ids: Iterable[str], head: str | None = None,
           generated_at: str | None = None) -> dict[str, Any]:
    """``doc`` with the entries of ``kernel_ids`` recomputed from ``repo_root`` (a full build when None)."""
    if doc is None:
        return build(repo_root, head, generated_at)
    return _lib().update_index(doc, repo_root, list(kernel_ids), head=head, generated_at=generated_at)


def kernel_count(doc: dict) -> int:
    """Number of kernels in an index document (list or mapping under ``kernels``)."""
    kernels = doc.get("kernels") or []
    return len(kernels)


def canonical(doc: dict) -> bytes:
    """The bytes written to index.json (the contract library's canonical text when available)."""
    lib = _lib()
    if hasattr(lib, "dumps"):
        return lib.dumps(doc).encode("utf-8")
    return json.dumps(doc, ensure_ascii=False, indent=1).encode("utf-8") + b"\n"


def write_atomic(path: Path, doc: dict) -> None:
    """Replace ``path`` with ``doc`` atomically (temp file in the same folder, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(canonical(doc))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Indexer:
    """Owns DIR/index.json for a Zoo (callers hold ``zoo.git_lock``)."""

    def __init__(self, zoo) -> None:
        self.zoo = zoo
        self.path: Path = zoo.config.paths.index
        self._doc: dict | None = None

    def current(self) -> dict:
        """The index document as last written (read from disk once, then kept in memory)."""
        if self._doc is None:
            try:
                self._doc = json.loads(self.path.read_text(encoding="utf-8"))
            except (FileNotFoundError, ValueError):
                with self.zoo.git_lock:
                    return self.rebuild()
        return self._doc

    def _publish(self, doc: dict) -> dict:
        from kz_events import events as ev

        zoo = self.zoo
        write_atomic(self.path, doc)
        self._doc = doc
        head = zoo.git.head()
        zoo.store.emit(ev.IndexUpdated(version=zoo.store.state.index_version + 1, head=head,
                                       kernels=kernel_count(doc)))
        return doc

    def _stamp(self) -> tuple[str | None, str]:
        from kz_daemon.service import iso_now

        return self.zoo.git.head(), iso_now(self.zoo.clock)

    def rebuild(self) -> dict:
        """Full rebuild from the repo at HEAD; writes and announces it."""
        self.zoo.git.sync_files()
        head, now = self._stamp()
        return self._publish(build(self.zoo.git.root, head, now))

    def update(self, kernel_ids: Iterable[str]) -> dict:
        """Recompute the entries of ``kernel_ids`` after an accept; writes and announces it."""
        self.zoo.git.sync_files()
        if self._doc is None:
            try:
                self._doc = json.loads(self.path.read_text(encoding="utf-8"))
            except (FileNotFoundError, ValueError):
                self._doc = None
        head, now = self._stamp()
        return self._publish(update(self._doc, self.zoo.git.root, kernel_ids, head, now))

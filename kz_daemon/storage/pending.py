"""The pending store: what the daemon keeps on disk about a submission between intake and its end.

``pending/<uuid>/`` holds the package as submitted (``package.tar.gz``), the intake
facts (``submission.json``, with the METAS the hard checks and the scorecard need) and
the cached runner tarball; ``runs/<uuid>/`` holds the reported run (``result.json``,
whose sha256 ``result.reported`` records, ``logs.txt``, ``env.json``, ``failure.json``).
Every JSON document here is replaced atomically through ``kz_events.durable``.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kz_events import durable

__all__ = ["PACKAGE_FILE", "SUBMISSION_FILE", "RUNNER_TARBALL", "RUNNER_TARBALL_KEY", "RESULT_FILE",
           "PendingStore", "StoredRun", "result_bytes"]

PACKAGE_FILE = "package.tar.gz"
SUBMISSION_FILE = "submission.json"
RUNNER_TARBALL = "runner.tar.gz"
RUNNER_TARBALL_KEY = "runner.json"
RESULT_FILE = "result.json"
LOGS_FILE = "logs.txt"
ENV_FILE = "env.json"
FAILURE_FILE = "failure.json"


def result_bytes(result: dict | None) -> bytes:
    """The bytes stored as ``runs/<uuid>/result.json``; their sha256 is ``result.reported``'s result_sha256."""
    return json.dumps(result, sort_keys=True, allow_nan=True).encode() + b"\n"


def result_doc(doc: object) -> dict[str, object] | None:
    """A stored result.json's JSON, as a result document: an object, or null (ValueError for anything else)."""
    if doc is None or isinstance(doc, dict):
        return doc
    raise ValueError(f"a stored result.json holds {type(doc).__name__}, not an object")


@dataclass(frozen=True)
class StoredRun:
    """A run as ``runs/<uuid>/`` holds it: the result (as the file reads back), its sha256, the failure."""

    result: dict[str, object] | None  # as the file reads back; None: the runner sent none
    sha256: str
    failure: dict | None


class PendingStore:
    """The ``pending/<uuid>/`` and ``runs/<uuid>/`` folders of one state directory."""

    def __init__(self, pending_dir: Path, runs_dir: Path) -> None:
        self.pending_dir = Path(pending_dir)
        self.runs_dir = Path(runs_dir)

    # -- pending/<uuid>/ ---------------------------------------------------------
    def folder(self, sub_uuid: str) -> Path:
        """``pending/<uuid>/``."""
        return self.pending_dir / sub_uuid

    def package(self, sub_uuid: str) -> Path:
        """The package as submitted."""
        return self.pending_dir / sub_uuid / PACKAGE_FILE

    def exists(self, sub_uuid: str) -> bool:
        """Whether intake left a folder for ``sub_uuid`` here."""
        return (self.pending_dir / sub_uuid).exists()

    def uuids(self) -> list[str]:
        """The folder names under ``pending/`` (sorted; none when it does not exist yet)."""
        return sorted(os.listdir(self.pending_dir)) if self.pending_dir.exists() else []

    def read_submission(self, sub_uuid: str) -> dict:
        """The ``submission.json`` intake wrote for a queued submission."""
        return json.loads((self.pending_dir / sub_uuid / SUBMISSION_FILE).read_text())

    def metas(self, sub_uuid: str) -> list[dict]:
        """The submission's KERNEL_ZOO_TEST_CASE_METAS as intake read them ([] when it found none)."""
        return self.read_submission(sub_uuid).get("metas") or []

    # -- runs/<uuid>/ ------------------------------------------------------------
    def run_folder(self, sub_uuid: str) -> Path:
        """``runs/<uuid>/``."""
        return self.runs_dir / sub_uuid

    def store_run(self, sub_uuid: str, result: dict | None, logs: bytes, env: dict,
                  failure: dict | None, prefix: str = "") -> StoredRun:
        """Write a reported run; the result comes back as the stored file reads, with its sha256.

        ``result.json`` is fsynced (its digest goes into the log); the logs, env and
        failure are replaced atomically without an fsync (a lost one only loses detail).
        ``prefix`` names a second run beside the first (``confirm-``: a confirmation run).
        """
        folder = self.run_folder(sub_uuid)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / (prefix + LOGS_FILE)).write_bytes(logs or b"")
        durable.atomic_write_json(folder / (prefix + ENV_FILE), env or {}, fsync=False)
        durable.atomic_write_json(folder / (prefix + FAILURE_FILE), failure, fsync=False)
        data = result_bytes(result)
        durable.atomic_write(folder / (prefix + RESULT_FILE), data, sync_dir=False)
        # The saga must build from what the file holds (a restarted saga reads the file), so the
        # caller gets the decoded bytes, not the object it passed in.
        return StoredRun(result_doc(json.loads(data)), hashlib.sha256(data).hexdigest(), failure)

    def load_result(self, sub_uuid: str, prefix: str = "") -> dict[str, object] | None:
        """The stored result.json of a submission (None when the runner sent none).

        FileNotFoundError when there is none; ValueError when it is not JSON or not a result
        document (only an object or null is ever stored).
        """
        return result_doc(json.loads((self.run_folder(sub_uuid) / (prefix + RESULT_FILE)).read_text()))

    def load_env(self, sub_uuid: str, prefix: str = "") -> dict:
        """The stored env.json of a run ({} when missing or unreadable: pruned, or never written)."""
        try:
            doc = json.loads((self.run_folder(sub_uuid) / (prefix + ENV_FILE)).read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def load_run(self, sub_uuid: str, prefix: str = "") -> StoredRun:
        """The stored run (result and failure None where a file is missing or unreadable)."""
        folder = self.run_folder(sub_uuid)
        docs: list[Any] = []
        for name in (RESULT_FILE, FAILURE_FILE):
            try:
                docs.append(json.loads((folder / (prefix + name)).read_text()))
            except (FileNotFoundError, ValueError):
                docs.append(None)
        result = docs[0] if isinstance(docs[0], dict) else None
        return StoredRun(result, "", docs[1] if isinstance(docs[1], dict) else None)

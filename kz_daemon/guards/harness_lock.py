"""The locked harness: an existing kernel's desc.yaml, build_test_env.py and benchmark.py belong to its maintainers.

A submission for a kernel present at HEAD must carry HEAD's harness files byte for
byte (``HARNESS_LOCKED`` otherwise), unless its submitter is a maintainer of that
kernel: an admin token, or a submitter token bound to an id that ``maintainers:``
in kz.yaml lists for a kernel_id prefix. A maintainer claim must be authenticated:
the HTTP layer records, for each upload that came with a token, who the token
belongs to in ``DIR/verified/<uuid>.json`` (a folder only the daemon writes);
intake reads that record, never the submitter id of a sidecar. So under the open
policy (no tokens) nobody is a maintainer except through an admin token, and
files dropped straight into the spool never are.

The runner tarball carries HEAD's harness files for an existing kernel whatever the
submission holds (:func:`head_harness`), so a maintainer's change that lands while
a job waits applies to that job.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kz_daemon.core.errors import ZooError
from kz_daemon.storage.gitstore import GitStore
from kz_events import durable
from kz_runner.contract.layout import BENCHMARK, HARNESS_FILES, KP

__all__ = ["VERIFIED_DIR", "parse_maintainers", "is_maintainer", "record_verified", "read_verified",
           "forget_verified", "head_harness", "changed_files", "locked_message", "harness_sha"]

VERIFIED_DIR = "verified"
#: the length of the short blob sha a scorecard record carries as its harness.
SHORT_SHA = 12


def parse_maintainers(raw: Any, source: str) -> dict[str, tuple[str, ...]]:
    """``maintainers:`` of kz.yaml ({kernel_id prefix: [submitter id, ...]}); CONFIG_INVALID on a bad shape."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ZooError("CONFIG_INVALID", f"{source}: 'maintainers' must be a mapping of kernel_id prefix "
                       "to a list of submitter ids", {"path": source, "key": "maintainers"})
    out: dict[str, tuple[str, ...]] = {}
    for prefix, ids in raw.items():
        if not isinstance(prefix, str) or not prefix.strip("/") or \
                not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise ZooError("CONFIG_INVALID", f"{source}: maintainers.{prefix} must be a list of submitter ids "
                           "under a non-empty kernel_id prefix", {"path": source, "key": f"maintainers.{prefix}"})
        out[prefix.strip("/")] = tuple(ids)
    return out


def _covers(prefix: str, kernel_id: str) -> bool:
    """Whether ``prefix`` names ``kernel_id`` or a folder above it (whole path segments only)."""
    return prefix == "*" or kernel_id == prefix or kernel_id.startswith(prefix + "/")


def is_maintainer(kernel_id: str, verified: Mapping[str, str] | None,
                  maintainers: Mapping[str, tuple[str, ...]]) -> bool:
    """Whether the authenticated principal ``verified`` ({kind, id}; None: no token) maintains ``kernel_id``."""
    if not verified:
        return False
    if verified.get("kind") == "admin":
        return True
    if verified.get("kind") != "submitter":
        return False
    who = verified.get("id")
    return any(who in ids for prefix, ids in maintainers.items() if _covers(prefix, kernel_id))


def record_verified(state_dir: Path, sub_uuid: str, kind: str, principal_id: str) -> None:
    """Remember that upload ``sub_uuid`` came with a token of ``(kind, principal_id)`` (before it is spooled)."""
    folder = Path(state_dir) / VERIFIED_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    durable.atomic_write_json(folder / f"{sub_uuid}.json", {"kind": kind, "id": principal_id})


def read_verified(state_dir: Path, sub_uuid: str) -> dict | None:
    """The token principal recorded for ``sub_uuid``, or None (no token, or not an HTTP upload)."""
    try:
        doc = json.loads((Path(state_dir) / VERIFIED_DIR / f"{sub_uuid}.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def forget_verified(state_dir: Path, sub_uuid: str) -> None:
    """Drop the record once intake decided (the decision keeps what it needed)."""
    try:
        os.unlink(Path(state_dir) / VERIFIED_DIR / f"{sub_uuid}.json")
    except FileNotFoundError:
        pass


def head_harness(git: GitStore, kernel_id: str, known: Mapping[str, bytes | None] | None = None) -> dict[str, bytes]:
    """{name: bytes} of the harness files at HEAD (empty for a kernel not at HEAD).

    ``known``: files the caller read at the same HEAD already ({name: bytes, or None for
    absent}), which are not read again.
    """
    out = {}
    for name in HARNESS_FILES:
        data = known[name] if known is not None and name in known else git.read_file(f"{kernel_id}/{KP}/{name}")
        if data is not None:
            out[name] = data
    return out


def changed_files(head: Mapping[str, bytes], submitted: Mapping[str, bytes | None]) -> list[str]:
    """The harness file names whose submitted bytes differ from HEAD's."""
    return [name for name in HARNESS_FILES if head.get(name) != submitted.get(name)]


def locked_message(kernel_id: str, changed: list[str]) -> str:
    """What a submitter reads when the locked harness refused their package."""
    names = ", ".join(changed)
    first = changed[0]
    verb = "differs" if len(changed) == 1 else "differ"
    return (f"{kernel_id} exists and its harness files are locked: {names} {verb} from the repo's. "
            "desc.yaml, build_test_env.py and benchmark.py of an existing kernel belong to its "
            "maintainers; submit with the current files (GET /api/kernels/"
            f"{kernel_id}/files/{KP}/{first}, or git show HEAD:{kernel_id}/{KP}/{first}) and change "
            "only the source area, or ask a maintainer to change the harness")


def harness_sha(git: GitStore, kernel_id: str) -> str | None:
    """The short git blob sha of ``benchmark.py`` at HEAD (the harness a record was measured under)."""
    data = git.read_file(f"{kernel_id}/{KP}/{BENCHMARK}")
    return blob_sha(data)[:SHORT_SHA] if data is not None else None


def blob_sha(data: bytes) -> str:
    """git's blob id of ``data`` (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

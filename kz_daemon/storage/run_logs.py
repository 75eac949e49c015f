"""Stored log tails: the end of each step's stderr, as the runner reported it, kept with the run.

The runner sends ``log_tails: {"build": str, "benchmark": str}`` (already bounded and
redacted on the runner) with its result; the daemon keeps them as
``runs/<uuid>/log_tails.json`` (written durably before the report's events, so a
status document that shows the verdict can show the logs), the status document
carries them and ``GET /api/submissions/{uuid}/logs`` serves them with the runner's
failure.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kz_daemon.core.errors import ZooError
from kz_daemon.storage.pending import FAILURE_FILE, LOGS_FILE
from kz_events import durable

__all__ = ["TAILS_FILE", "STEPS", "MAX_TAIL_CHARS", "clean_tails", "store_tails", "load_tails", "logs_doc"]

TAILS_FILE = "log_tails.json"
#: the steps whose tails a report may carry, in the order they ran
STEPS = ("build", "benchmark")
#: a tail is kept to its last this many characters (the wire protocol's bound)
MAX_TAIL_CHARS = 8192


def clean_tails(raw: Any) -> dict[str, str]:
    """The ``log_tails`` field of a result report, checked and bounded; ZooError BAD_REQUEST if malformed."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ZooError("BAD_REQUEST", "field log_tails must be an object {build, benchmark}",
                       {"field": "log_tails"})
    out: dict[str, str] = {}
    for key, value in raw.items():
        if key not in STEPS:
            raise ZooError("BAD_REQUEST", f"field log_tails may hold only {', '.join(STEPS)}, not {key!r:.40}",
                           {"field": "log_tails"})
        if not isinstance(value, str):
            raise ZooError("BAD_REQUEST", f"field log_tails.{key} must be a string", {"field": f"log_tails.{key}"})
        if value:
            out[key] = value[-MAX_TAIL_CHARS:]
    return out


def store_tails(run_folder: Path, tails: dict[str, str]) -> None:
    """Write ``runs/<uuid>/log_tails.json`` durably (replacing an earlier attempt's)."""
    folder = Path(run_folder)
    folder.mkdir(parents=True, exist_ok=True)
    durable.atomic_write_json(folder / TAILS_FILE, {k: tails[k] for k in STEPS if k in tails})


def load_tails(run_folder: Path) -> dict[str, str]:
    """The stored tails (``{}`` when the run sent none, or they were pruned or unreadable)."""
    try:
        doc = json.loads((Path(run_folder) / TAILS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: v[-MAX_TAIL_CHARS:] for k in STEPS if isinstance(v := doc.get(k), str) and v}


def logs_doc(sub_uuid: str, run_folder: Path) -> dict[str, Any]:
    """The ``GET /api/submissions/{uuid}/logs`` document of a reported run."""
    folder = Path(run_folder)
    try:
        failure = json.loads((folder / FAILURE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        failure = None
    tails = load_tails(folder)
    return {"uuid": sub_uuid, "build": tails.get("build", ""), "benchmark": tails.get("benchmark", ""),
            "failure": failure if isinstance(failure, dict) else None,
            # retention removes a run's logs (never its result.json): say so rather than show nothing
            "pruned": not (folder / TAILS_FILE).exists() and not (folder / LOGS_FILE).exists()}

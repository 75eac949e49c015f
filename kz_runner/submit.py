"""`kz submit`'s library: validate and pack locally, upload, follow the status long poll.

Stdlib plus the contract package only (no daemon dependencies), so it runs on any
submitter's machine. The HTTP side is :class:`kz_runner.client.ZooClient`.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kz_runner.client import ApiError, NetworkError, RetryPolicy, ZooClient

TERMINAL = ("accepted", "rejected", "failed", "cancelled")
EXIT_ACCEPTED, EXIT_REJECTED, EXIT_ERROR = 0, 1, 2


class SubmitError(Exception):
    """A failure that is not a verdict on the package (network, auth, limits, timeout): exit 2."""


class LocalRejection(Exception):
    """The package fails local validation: exit 1, nothing was uploaded."""

    def __init__(self, message: str, problems: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.problems = problems


@dataclass
class Prepared:
    """A tarball ready to upload."""

    tarball: Path
    kernel_id: str
    packed: bool  # True when we packed it from a directory (a temp file to delete)
    warnings: list[dict[str, Any]] = field(default_factory=list)


def _problems(report: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    errors = [p.to_json() for p in report.errors]
    warnings = [p.to_json() for p in report.warnings]
    return errors, warnings


def prepare(path: str | os.PathLike[str], kernel_id: str | None = None) -> Prepared:
    """Validate ``path`` (package dir or .tar.gz) locally and pack a directory; raises LocalRejection."""
    from kz_runner.contract import validate

    path = Path(path)
    if path.is_dir():
        from kz_runner.contract.pack import pack_package

        tmpdir = Path(tempfile.mkdtemp(prefix="kz-submit-"))
        packed = pack_package(path, tmpdir / "package.tar.gz", kernel_id=kernel_id)
        errors, warnings = _problems(packed.report)
        if packed.path is None:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise LocalRejection(f"{path} fails validation ({len(errors)} problem(s))",
                                 errors or [{"code": "KERNEL_ID_UNKNOWN", "message": "pass --kernel-id"}])
        return Prepared(packed.path, str(packed.kernel_id), True, warnings)
    if not path.is_file():
        raise SubmitError(f"{path} is neither a package directory nor a .tar.gz file")
    report = validate.validate_tarball(path, path.name, kernel_id=kernel_id)
    errors, warnings = _problems(report)
    if errors:
        raise LocalRejection(f"{path} fails validation ({len(errors)} problem(s))", errors)
    resolved = kernel_id or report.facts.get("kernel_id")
    if not resolved:
        raise LocalRejection(f"cannot tell the kernel_id of {path}; pass --kernel-id",
                             [{"code": "KERNEL_ID_UNKNOWN", "message": "pass --kernel-id"}])
    return Prepared(path, str(resolved), False, warnings)


def upload(client: ZooClient, prepared: Prepared, submitter: str) -> dict[str, Any]:
    """POST the multipart upload; returns the 202 body. Intake rejection → LocalRejection-like ApiError."""
    resp = client.upload_multipart(
        "/api/submissions",
        {"kernel_id": prepared.kernel_id, "submitter_id": submitter},
        "package", prepared.tarball, filename=f"{prepared.kernel_id.replace('/', '_')}.tar.gz",
        headers={"X-Submitter-Id": submitter}, retry=RetryPolicy(attempts=1),
    )
    return resp.body if isinstance(resp.body, dict) else {}


def follow(client: ZooClient, uuid: str, timeout_s: float,
           progress: Callable[[dict[str, Any], float], None] | None = None,
           clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Long-poll the status until terminal or ``timeout_s``; calls ``progress`` on each new status."""
    start = clock()
    last_status = None
    doc: dict[str, Any] = {}
    while True:
        remaining = timeout_s - (clock() - start)
        wait = max(0.0, min(25.0, remaining))
        resp = client.request_json("GET", f"/api/submissions/{uuid}/status?wait={wait:.1f}",
                                   timeout_s=wait + 30)
        doc = resp.body if isinstance(resp.body, dict) else {}
        status = doc.get("status")
        if status != last_status:
            last_status = status
            if progress is not None:
                progress(doc, clock() - start)
        if status in TERMINAL:
            return doc
        if clock() - start >= timeout_s:
            raise SubmitError(f"gave up after {timeout_s:.0f} s; submission {uuid} is still {status}; "
                              f"follow it with GET /api/submissions/{uuid}/status")


def case_table(doc: dict[str, Any]) -> str:
    """The per-case results as a plain-text table."""
    cases = [c for c in doc.get("cases") or [] if isinstance(c, dict)]
    if not cases:
        return "(no per-case results)"
    rows = [("case", "correctness", "accept", "primary metric", "value")]
    for c in cases:
        value = c.get("value")
        rows.append((str(c.get("test_case_id", "")), str(c.get("correctness", "")),
                     str(c.get("accept", "")), str(c.get("primary_metric", "")),
                     f"{value:.6g}" if isinstance(value, (int, float)) else str(value or "")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows)


def exit_code_for(status: str | None) -> int:
    """0 accepted, 1 rejected/failed/cancelled, 2 anything else."""
    if status == "accepted":
        return EXIT_ACCEPTED
    if status in ("rejected", "failed", "cancelled"):
        return EXIT_REJECTED
    return EXIT_ERROR


__all__ = ["ApiError", "NetworkError", "Prepared", "discard", "SubmitError", "LocalRejection", "prepare", "upload",
           "follow", "case_table", "exit_code_for"]


def discard(prepared: Prepared) -> None:
    """Delete the temporary tarball (and its folder) that :func:`prepare` packed."""
    if prepared.packed:
        shutil.rmtree(prepared.tarball.parent, ignore_errors=True)

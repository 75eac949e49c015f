"""`kz submit`'s library: validate and pack locally, upload, follow the status long poll.

Stdlib plus the contract package only (no daemon dependencies), so it runs on any
submitter's machine. The HTTP side is :class:`kz_runner.worker.client.ZooClient`.

Every kernel_id problem is found by :mod:`kz_runner.contract.kernel_id`'s one rule,
so ``kz submit`` and ``kz validate`` word them alike. The upload carries an
``Idempotency-Key`` (one per invocation, the same on every retry of that upload), so
retrying an upload whose answer was lost cannot submit the package twice.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kz_events.status import TERMINAL, Status
from kz_runner.contract.checks import HINTS as RESULT_HINTS
from kz_runner.contract.codes import CODES, problem
from kz_runner.contract.kernel_id import REPO_MARKERS, check_kernel_id, find_repo_root
from kz_runner.contract.layout import BENCH_RESULT, KP
from kz_runner.contract.pack import bench_result_kernel_id, pack_kernel_id, pack_package
from kz_runner.contract.upload import IDEMPOTENCY_HEADER
from kz_runner.contract.validate import validate_tarball
from kz_runner.worker.client import ApiError, NetworkError, RetryPolicy, ZooClient

EXIT_ACCEPTED, EXIT_REJECTED, EXIT_ERROR = 0, 1, 2
#: held for an admin's review: not a verdict yet, and nothing happens until an admin decides
EXIT_HELD = 3
#: the upload is retried on network errors and 5xx answers; the idempotency key makes that safe
UPLOAD_RETRY = RetryPolicy(attempts=4, base_s=1.0, cap_s=10.0)


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


def new_idempotency_key() -> str:
    """A fresh key for one ``kz submit`` invocation (a uuid4)."""
    return str(uuidlib.uuid4())


def _problems(report: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    errors = [p.to_json() for p in report.errors]
    warnings = [p.to_json() for p in report.warnings]
    return errors, warnings


def kernel_id_sources_tried(package_dir: Path) -> list[str]:
    """What :func:`pack_kernel_id` looked at, in its order, for a directory whose kernel_id it could not tell."""
    bench = package_dir / KP / BENCH_RESULT
    tried = ["no --kernel-id was given"]
    named = bench_result_kernel_id(package_dir)
    if named is not None:
        tried.append(f"{bench} names {named!r}, but the folder's path {package_dir.resolve()} does not end with it "
                     "(a copied package? set kernel_id there to the copy's own kernel_id)")
    elif bench.is_file():
        tried.append(f"{bench} has no readable kernel_id")
    else:
        tried.append(f"{bench} does not exist")
    parent = package_dir.resolve().parent
    root = find_repo_root(parent)
    markers = " or ".join(REPO_MARKERS)
    if root is None:
        tried.append(f"no kernel repo root ({markers}) in {parent} or any folder above it")
    else:
        tried.append(f"the kernel repo root {root} does not hold {package_dir} as a package")
    return tried


def _check_given_kernel_id(kernel_id: str | None) -> None:
    """Refuse a malformed ``--kernel-id`` with the validator's own problems (the same words as ``kz validate``)."""
    if kernel_id is None:
        return
    found = check_kernel_id(kernel_id, field="kernel_id")
    if found:
        raise LocalRejection(f"--kernel-id {kernel_id!r} is not a valid kernel_id",
                             [p.to_json() for p in found])


def prepare(path: str | os.PathLike[str], kernel_id: str | None = None) -> Prepared:
    """Validate ``path`` (package dir or .tar.gz) locally and pack a directory; raises LocalRejection."""
    path = Path(path)
    _check_given_kernel_id(kernel_id)
    if path.is_dir():
        return _prepare_dir(path, kernel_id)
    if not path.is_file():
        raise SubmitError(f"{path} is neither a package directory nor a .tar.gz file")
    report = validate_tarball(path, path.name)
    top = report.facts.get("kernel_id")
    if kernel_id is not None and top and top != kernel_id:
        message = (f"--kernel-id {kernel_id} differs from the tarball's top folder {top}: pass "
                   f"--kernel-id {top} (or leave it out), or repack the tarball under {kernel_id}/")
        raise LocalRejection(message, [problem("TARBALL_TOP_DIR", message, file=path.name).to_json()])
    errors, warnings = _problems(report)
    if errors:
        raise LocalRejection(f"{path} fails validation ({len(errors)} problem(s))", errors)
    if not top:
        raise LocalRejection(f"cannot tell the kernel_id of {path}; pass --kernel-id",
                             [problem("KERNEL_ID_UNKNOWN", "no package directory found in the archive",
                                      severity="error").to_json()])
    return Prepared(path, str(top), False, warnings)


def _prepare_dir(path: Path, kernel_id: str | None) -> Prepared:
    resolved, _source = pack_kernel_id(path, kernel_id)
    if resolved is None:
        tried = kernel_id_sources_tried(path)
        message = f"cannot tell the kernel_id of {path}; pass --kernel-id KERNEL_ID (tried: {'; '.join(tried)})"
        raise LocalRejection(message, [problem("KERNEL_ID_UNKNOWN", message, severity="error").to_json()])
    tmpdir = Path(tempfile.mkdtemp(prefix="kz-submit-"))
    packed = pack_package(path, tmpdir / "package.tar.gz", kernel_id=resolved)
    errors, warnings = _problems(packed.report)
    if packed.path is None:
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise LocalRejection(f"{path} fails validation ({len(errors)} problem(s))", errors)
    return Prepared(packed.path, str(packed.kernel_id), True, warnings)


def upload(client: ZooClient, prepared: Prepared, submitter: str, idempotency_key: str,
           retry: RetryPolicy = UPLOAD_RETRY) -> dict[str, Any]:
    """POST the multipart upload with ``idempotency_key`` (the same on each retry); returns the 202 body."""
    resp = client.upload_multipart(
        "/api/submissions",
        {"kernel_id": prepared.kernel_id, "submitter_id": submitter},
        "package", prepared.tarball, filename=f"{prepared.kernel_id.replace('/', '_')}.tar.gz",
        headers={"X-Submitter-Id": submitter, IDEMPOTENCY_HEADER: idempotency_key}, retry=retry,
    )
    return resp.body if isinstance(resp.body, dict) else {}


def follow(client: ZooClient, uuid: str, timeout_s: float,
           progress: Callable[[dict[str, Any], float], None] | None = None,
           clock: Callable[[], float] = time.monotonic,
           on_doc: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Long-poll the status until terminal, held for review, or ``timeout_s``.

    ``progress`` is called on each new status, ``on_doc`` with every status document
    the server answers (warnings can arrive without a status change). A held submission
    waits for an admin, for hours perhaps: the document is returned at once.
    """
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
        if on_doc is not None:
            on_doc(doc)
        if status != last_status:
            last_status = status
            if progress is not None:
                progress(doc, clock() - start)
        if status in TERMINAL or status == Status.HELD:
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


def fix_hint(reason: dict[str, Any]) -> str:
    """The reason's own ``hint``, else the contract's advice for its code (empty when there is none)."""
    code = str(reason.get("code") or "")
    if reason.get("hint"):
        return str(reason["hint"])
    if code in CODES:
        return CODES[code].hint
    return RESULT_HINTS.get(code, "")


def reason_lines(reasons: Any) -> list[str]:
    """``reason: CODE: message`` per reason, each followed by its ``hint:`` line when it has one.

    A reason without a hint gets the contract's advice for its code, so problem and
    result-check codes carry a fix even from a server that sends none.
    """
    lines: list[str] = []
    for reason in reasons or []:
        if not isinstance(reason, dict):
            lines.append(f"reason: {reason}")
            continue
        lines.append(f"reason: {reason.get('code', '')}: {reason.get('message', '')}")
        hint = fix_hint(reason)
        if hint:
            lines.append(f"  hint: {hint}")
    return lines


def log_tail_lines(doc: dict[str, Any]) -> list[str]:
    """The status document's ``log_tails`` (build, then benchmark, then any other), each under a header."""
    tails = doc.get("log_tails")
    if not isinstance(tails, dict):
        return []
    lines: list[str] = []
    order = [k for k in ("build", "benchmark") if k in tails] + sorted(k for k in tails if k not in
                                                                       ("build", "benchmark"))
    for name in order:
        text = tails.get(name)
        if isinstance(text, str) and text.strip():
            lines.append(f"--- {name} log (last lines) ---")
            lines.extend(text.rstrip("\n").splitlines())
    return lines


def queue_warning_line(doc: dict[str, Any]) -> str | None:
    """The status document's ``queue_warning`` as one line (``CODE: message``), or None."""
    warning = doc.get("queue_warning")
    if not isinstance(warning, dict) or not (warning.get("code") or warning.get("message")):
        return None
    return f"warning: {warning.get('code', '')}: {warning.get('message', '')}"


def exit_code_for(status: str | None) -> int:
    """0 accepted, 1 rejected/failed/cancelled/revoked, 3 held for review, 2 anything else."""
    if status == Status.ACCEPTED:
        return EXIT_ACCEPTED
    if status in TERMINAL:
        return EXIT_REJECTED
    if status == Status.HELD:
        return EXIT_HELD
    return EXIT_ERROR


def held_lines(doc: dict[str, Any]) -> list[str]:
    """Why a held submission waits: each rule's finding (``file:line: text``), and what happens next."""
    held = doc.get("held")
    if not isinstance(held, dict):
        held = {}
    lines = [f"held: a static rule holds it until an admin approves or rejects it "
             f"(rules: {', '.join(held.get('rules') or []) or 'not listed'})"]
    for finding in held.get("evidence") or []:
        if isinstance(finding, dict):
            where = f"{finding.get('file')}:{finding.get('line')}" if finding.get("line") else str(finding.get("file"))
            lines.append(f"  {finding.get('rule')}: {where}: {finding.get('text', '')}".rstrip())
    return lines


def outcome_lines(doc: dict[str, Any]) -> list[str]:
    """What an accept changed (the status document's ``outcome``): new bests with their numbers, ranks."""
    out = doc.get("outcome")
    if not isinstance(out, dict):
        return []
    lines = []
    speedup = out.get("speedup")
    lines.append(("new best in " + f"{out.get('cases_improved', 0)} case(s)" if out.get("new_best") else "no new best")
                 + (f"; {speedup:.3g}x the previous best overall ({out.get('delta_pct'):+.1f} %)"
                    if isinstance(speedup, (int, float)) else ""))
    for case in out.get("cases") or []:
        if not isinstance(case, dict):
            continue
        prev, value, unit = case.get("previous_best"), case.get("value"), case.get("unit") or ""
        change = f" ({case['delta_pct']:+.1f} %)" if isinstance(case.get("delta_pct"), (int, float)) else ""
        was = f"{prev:.6g} -> " if isinstance(prev, (int, float)) else ""
        lines.append(f"  {case.get('test_case_id')}: {case.get('metric')} {was}{value:.6g} {unit}{change}"
                     f"{'  new best' if case.get('new_best') else ''}".rstrip())

    def rank(value: Any, approx: Any) -> str:
        return "unranked" if value is None else f"{'≈' if approx else ''}{value}"

    lines.append(f"rank in {out.get('operator')}: {rank(out.get('rank_before'), out.get('rank_before_approx'))}"
                 f" -> {rank(out.get('rank_after'), out.get('rank_after_approx'))}")
    return lines


def discard(prepared: Prepared) -> None:
    """Delete the temporary tarball (and its folder) that :func:`prepare` packed."""
    if prepared.packed:
        shutil.rmtree(prepared.tarball.parent, ignore_errors=True)


__all__ = ["ApiError", "NetworkError", "Prepared", "discard", "SubmitError", "LocalRejection", "prepare", "upload",
           "follow", "case_table", "exit_code_for", "new_idempotency_key", "reason_lines", "log_tail_lines",
           "held_lines", "outcome_lines", "EXIT_HELD",
           "queue_warning_line", "kernel_id_sources_tried"]

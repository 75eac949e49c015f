"""The harness's side of the runner protocol: the trial seed in, one result document out.

The runner starts ``python benchmark.py <workdir>`` with two inherited pipes named by
``KZ_CONTROL_FD`` (one JSON line ``{"trial_seed": <int 0..2**63-1>}``, then EOF) and
``KZ_RESULT_FD`` (where the harness writes exactly one JSON document, with one
write, then closes it). At import, before any package code runs, this module reads
the control pipe to EOF, closes it, removes both variables from ``os.environ`` and
keeps the result descriptor private (not inherited by child processes). Without
``KZ_CONTROL_FD`` (``kz dry-run``, a plain ``python benchmark.py``) the seed comes
from ``os.urandom`` and there is no result channel: stdout alone carries the result.

The result document is ``{"kind": "result", "result": <benchmark_output>}``,
``{"kind": "integrity", "code", "message", "case", "evidence"}`` or, from the judge's
step only, ``{"kind": "unjudged", "reason"}``: this harness cannot run without the
package's source area (it imports from it, or times a kernel the judge cannot serve), so
the runner runs it again with the source visible and marks the result unverified.

The judge's step also names, in ``KZ_WORKER_SANDBOX`` (a JSON list) and
``KZ_WORKER_SOURCE``, the sandbox prefix and the package folder of the worker that runs
the kernel (:mod:`kz_runner.judge`); both are taken out of the environment here. The
trial seed is never handed to that worker: the judge draws its own secret seed.
"""
from __future__ import annotations

import json
import os
from typing import Any

from kz_runner.contract.layout import CONTROL_ENV, RESULT_ENV, WORKER_SANDBOX_ENV, WORKER_SOURCE_ENV

SEED_LIMIT = 2 ** 63


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _parse_fd(name: str) -> int | None:
    raw = os.environ.pop(name, None)
    if raw is None:
        return None
    try:
        fd = int(raw)
        os.fstat(fd)
    except (ValueError, OSError):
        raise ValueError(f"{name}={raw!r} is not an open file descriptor") from None
    return fd


def _open() -> tuple[int, int | None, str | None]:
    """(trial seed, result fd or None, error or None), consuming the environment variables."""
    error = None
    try:
        control = _parse_fd(CONTROL_ENV)
    except ValueError as exc:
        control, error = None, str(exc)
    try:
        result = _parse_fd(RESULT_ENV)
    except ValueError as exc:
        result, error = None, error or str(exc)
    if result is not None:
        os.set_inheritable(result, False)
    seed = None
    if control is not None:
        try:
            message = json.loads(_read_all(control).decode("utf-8"))
            seed = message["trial_seed"]
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
                raise ValueError(f"trial_seed {seed!r} is not an integer in [0, 2**63)")
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            seed, error = None, error or f"unreadable control message: {exc}"
        finally:
            os.close(control)
    elif result is not None:
        error = error or f"{RESULT_ENV} given without {CONTROL_ENV}"
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little") % SEED_LIMIT
    return seed, result, error


def _worker() -> tuple[list[str] | None, str | None, str | None]:
    """(sandbox prefix or None, source folder or None, error or None), consuming the variables."""
    raw, source = os.environ.pop(WORKER_SANDBOX_ENV, None), os.environ.pop(WORKER_SOURCE_ENV, None)
    if raw is None:
        return None, source, None
    try:
        prefix = json.loads(raw)
        if not isinstance(prefix, list) or not all(isinstance(a, str) for a in prefix):
            raise ValueError("not a list of strings")
    except ValueError as exc:
        return None, source, f"{WORKER_SANDBOX_ENV} is not a JSON list of strings: {exc}"
    return prefix, source, None


_SEED, _RESULT_FD, _ERROR = _open()
_PREFIX, _SOURCE, _WORKER_ERROR = _worker()
_ERROR = _ERROR or _WORKER_ERROR
_SENT = False


def trial_seed() -> int:
    """The seed of this run's trial inputs and check schedule (the runner's, or random)."""
    return _SEED


def judged() -> bool:
    """Whether this process is the judge's step: kernels are timed only through ``bench.kernel``."""
    return _PREFIX is not None


def worker_sandbox() -> list[str]:
    """The argv prefix of the kernel worker's sandbox (``[]``: none, a local run)."""
    return list(_PREFIX or [])


def worker_source() -> str | None:
    """The package folder whose ``src/`` the worker imports (None: this benchmark's own package)."""
    return _SOURCE


def unjudged_document(reason: str) -> dict[str, Any]:
    """The channel document saying this harness needs the source area (see the module docstring)."""
    return {"kind": "unjudged", "reason": reason[:1000]}


def protocol_error() -> str | None:
    """Why the control message could not be used (the harness reports HARNESS_ERROR), or None."""
    return _ERROR


def send(document: dict[str, Any]) -> bool:
    """Write ``document`` to the result channel as one JSON document, then close it.

    Returns False when there is no channel (or it was used already): only the first
    document counts.
    """
    global _SENT
    if _RESULT_FD is None or _SENT:
        return False
    _SENT = True
    data = (json.dumps(document, allow_nan=False, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
    try:
        view = memoryview(data)
        while view:  # a blocking pipe writes everything; the loop only guards a signal's short write
            view = view[os.write(_RESULT_FD, view):]
    finally:
        os.close(_RESULT_FD)
    return True


def result_document(doc: dict[str, Any]) -> dict[str, Any]:
    """The channel document for a benchmark_output document."""
    return {"kind": "result", "result": doc}


def integrity_document(code: str, message: str, case: str | None, evidence: dict[str, Any]) -> dict[str, Any]:
    """The channel document for an integrity finding."""
    return {"kind": "integrity", "code": code, "message": message, "case": case, "evidence": evidence}

"""Building the benchmark_output document and writing it to stdout as one JSON document."""
from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import IO, Any

SCHEMA_VERSION = "1.0.0"


def utc_now() -> str:
    """The current UTC time, RFC 3339 with a ``Z`` suffix and seconds precision."""
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def nonfinite_paths(value: Any, path: str = "$") -> list[str]:
    """JSON paths of every NaN/Inf float inside ``value`` (dicts, lists, tuples)."""
    found: list[str] = []
    if isinstance(value, float):
        if not math.isfinite(value):
            found.append(path)
    elif isinstance(value, dict):
        for key, item in value.items():
            found.extend(nonfinite_paths(item, f"{path}.{key}"))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found.extend(nonfinite_paths(item, f"{path}[{i}]"))
    return found


def case_result(
    test_case_id: str,
    *,
    correctness: str,
    accept: bool,
    metrics: dict[str, float] | Sequence[dict[str, Any]],
    correctness_detail: dict[str, Any] | None = None,
    accept_reason: str | None = None,
    error: str | None = None,
    reference_ratio: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``cases[]`` entry; ``metrics`` as ``{name: value}`` or ``[{name, value, spread?}]``.

    ``spread`` (optional, per metric) is ``{n, lo, hi}``: how many timed calls the value
    summarises and a 95 % confidence interval of it in the metric's unit. ``reference_ratio``
    (a confirmation run's) is ``{value, lo, hi, rounds}``: the primary metric over the
    reference kernel's, timed alternately in the same run.
    """
    if correctness not in ("passed", "failed", "skipped"):
        raise ValueError(f"correctness must be passed, failed or skipped, not {correctness!r}")
    if isinstance(metrics, dict):
        metric_list = [{"name": str(k), "value": float(v)} for k, v in metrics.items()]
    else:
        metric_list = []
        for m in metrics:
            item = {"name": str(m["name"]), "value": float(m["value"])}
            if m.get("spread") is not None:
                spread = m["spread"]
                item["spread"] = {"n": int(spread["n"]), "lo": float(spread["lo"]), "hi": float(spread["hi"])}
            metric_list.append(item)
    case: dict[str, Any] = {
        "test_case_id": test_case_id,
        "correctness": correctness,
        "accept": bool(accept) and correctness != "failed",
        "metrics": metric_list,
        "error": error,
    }
    if correctness_detail is not None:
        case["correctness_detail"] = correctness_detail
    if accept_reason is not None:
        case["accept_reason"] = accept_reason
    if reference_ratio is not None:
        case["reference_ratio"] = {"value": float(reference_ratio["value"]), "lo": float(reference_ratio["lo"]),
                                   "hi": float(reference_ratio["hi"]), "rounds": int(reference_ratio["rounds"])}
    return case


def build_document(
    kernel_id: str,
    cases: Sequence[dict[str, Any]],
    *,
    arch: str | None = None,
    runner_id: str | None = None,
    build_ok: bool = True,
    accept_reason: str | None = None,
    ran_at: str | None = None,
    arch_detector: Callable[[], str] | None = None,
    reference: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The benchmark_output document: overall.accept = build_ok AND every case accepted.

    ``reference`` (a confirmation run's): which reference kernel was timed beside the
    candidate (``kernel_id``, ``commit``, ``status`` measured or unavailable, ``reason``).

    Raises ValueError for NaN/Inf anywhere and, when jsonschema is importable, for a
    document the schema rejects: both are bugs in the calling benchmark.py.
    """
    if arch is None:
        from kz_runner.bench.device import detect_arch

        arch = arch_detector() if arch_detector else detect_arch()
    cases = [dict(c) for c in cases]
    failed_accepts = [c["test_case_id"] for c in cases if c.get("correctness") == "failed" and c.get("accept")]
    if failed_accepts:
        raise ValueError(f"cases {failed_accepts} have correctness=failed and accept=true")
    accept = bool(build_ok) and bool(cases) and all(
        c.get("accept") and c.get("correctness") == "passed" for c in cases
    )
    if accept_reason is None:
        if not build_ok:
            accept_reason = "build failed"
        elif accept:
            accept_reason = f"all {len(cases)} cases accepted"
        else:
            rejected = [c["test_case_id"] for c in cases if not c.get("accept") or c.get("correctness") != "passed"]
            accept_reason = "rejected: " + ", ".join(rejected or ["no cases"])
    doc = {
        "schema_version": SCHEMA_VERSION,
        "kernel_id": kernel_id,
        "ran_at": ran_at or utc_now(),
        "runner_id": runner_id or os.environ.get("KZ_RUNNER_ID") or "local",
        "arch": arch,
        "overall": {"accept": accept, "accept_reason": accept_reason, "build_ok": bool(build_ok)},
        "cases": cases,
    }
    if reference is not None:
        doc["reference"] = dict(reference)
    bad = nonfinite_paths(doc)
    if bad:
        raise ValueError(f"NaN/Inf is not allowed in benchmark output: {', '.join(bad)}")
    _validate_schema(doc)
    return doc


def _validate_schema(doc: dict[str, Any]) -> None:
    try:
        import jsonschema

        import kz_schemas
    except ImportError:  # a bare GPU host: the server validates anyway
        return
    validator = jsonschema.Draft202012Validator(kz_schemas.load("benchmark_output"))
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(root)"
        raise ValueError(f"benchmark output does not match the schema at {where}: {errors[0].message}")


def dumps(doc: dict[str, Any]) -> str:
    """The document as one line of JSON (NaN/Inf refused)."""
    return json.dumps(doc, allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def write_document(doc: dict[str, Any], stream: IO[str] | None = None) -> None:
    """Write ``doc`` as exactly one JSON document plus a newline, then flush."""
    out = stream if stream is not None else sys.stdout
    out.write(dumps(doc) + "\n")
    out.flush()


def emit(kernel_id: str, cases: Sequence[dict[str, Any]], *, stream: IO[str] | None = None, **kwargs: Any) -> dict[str, Any]:
    """Build the document (see :func:`build_document`), write it to stdout, return it."""
    doc = build_document(kernel_id, cases, **kwargs)
    write_document(doc, stream)
    return doc

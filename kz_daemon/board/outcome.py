"""What an accept changed: per case the previous best, this run's value, whether the best moved, the delta.

An accept rewrites the kernel's scorecard (``kz_daemon.core.scorecard``); comparing the
card before it (the one in the source commit's tree, which the run was judged against)
with the card it committed says, for each case's primary metric:

- ``previous_best``: the best value before (None when only the seed placeholder stood);
- ``value``: this run's value (its ``metrics_current``), ``best``: the best after;
- ``new_best``: the best record is now this run's (it beat the old one beyond the noise,
  or there was none);
- ``delta_pct``: the signed relative change of this run against the previous best,
  ``100 * (value - previous) / previous`` (negative is faster for a time), and
  ``speedup``: how many times better than the previous best (above 1 = better, in the
  metric's direction).

The overall speed-up is the geometric mean of the per-case ones (cases without a
previous best left out), as the operator score is. :func:`accept_outcome` adds the
kernel's rank in its operator before and after. A kernel whose harness no maintainer
reviewed yet (its index entry marked, ``kz_daemon.board.ranking.unreviewed``) is no
operator's best: :func:`under_review` says so of its outcome (no new best, no rank after,
``harness: unreviewed``), and the status document applies it to an outcome recorded
before the mark was known. Pure functions over plain values: the
accept saga records the outcome in ``accept.completed`` and the home page computes the
same deltas from git for the latest records. :func:`rerun_deltas` and :func:`env_changes`
put a rerun of a record beside the record.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from kz_daemon.board import ranking
from kz_daemon.core.noise import interval_of
from kz_runner.contract.layout import is_seed_sha

__all__ = ["case_deltas", "overall", "accept_outcome", "under_review", "entry_with_card", "rerun_deltas",
           "env_changes", "VOLATILE_ENV"]

LOWER, HIGHER = "lower_better", "higher_better"


def _cases(card: Any) -> dict[str, Mapping[str, Any]]:
    cases = card.get("cases") if isinstance(card, Mapping) else None
    return {str(c.get("test_case_id")): c for c in cases or [] if isinstance(c, Mapping)}


def _real(record: Any) -> Mapping[str, Any] | None:
    if not isinstance(record, Mapping) or is_seed_sha(record.get("commit_sha")):
        return None
    return record if interval_of(record) is not None else None


def _primary_of(meta: Mapping[str, Any]) -> tuple[str, Any, Mapping[str, Any], str]:
    """(test_case_id, primary metric name, its declaration, its direction) of one METAS case."""
    primary = meta.get("primary_metric")
    declared = next((m for m in meta.get("metrics") or [] if isinstance(m, Mapping) and m.get("name") == primary), {})
    return str(meta.get("test_case_id")), primary, declared, str(declared.get("direction") or LOWER)


def case_deltas(before: Any, after: Any, metas: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per METAS case of ``after`` (see the module docstring); ``metas`` give primary metric, unit, direction."""
    old, new = _cases(before), _cases(after)
    out = []
    for meta in metas:
        cid, primary, declared, direction = _primary_of(meta)
        prev = _real(((old.get(cid) or {}).get("metrics_best") or {}).get(primary))
        cur = _real(((new.get(cid) or {}).get("metrics_current") or {}).get(primary))
        best = _real(((new.get(cid) or {}).get("metrics_best") or {}).get(primary))
        if cur is None:
            continue
        value = float(cur["value"])
        previous = float(prev["value"]) if prev is not None else None
        moved = best is not None and best.get("commit_sha") == cur.get("commit_sha") and \
            (prev is None or prev.get("commit_sha") != best.get("commit_sha") or prev.get("value") != best.get("value"))
        entry: dict[str, Any] = {
            "test_case_id": cid, "metric": primary, "unit": declared.get("unit"), "direction": direction,
            "previous_best": previous, "value": value, "best": float(best["value"]) if best is not None else None,
            "new_best": bool(moved), "delta_pct": None, "speedup": None}
        if previous is not None and previous > 0 and value > 0:
            entry["delta_pct"] = round(100.0 * (value - previous) / previous, 4)
            entry["speedup"] = previous / value if direction == LOWER else value / previous
        out.append(entry)
    return out


def overall(deltas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``{new_best, cases_improved, speedup, delta_pct}`` over the case deltas (geometric mean speed-up)."""
    ups = [d["speedup"] for d in deltas if d.get("speedup")]
    speedup = math.exp(math.fsum(math.log(u) for u in ups) / len(ups)) if ups else None
    return {"new_best": any(d.get("new_best") for d in deltas),
            "cases_improved": sum(1 for d in deltas if d.get("new_best")),
            "speedup": speedup, "delta_pct": round(100.0 * (1.0 / speedup - 1.0), 4) if speedup else None}


def entry_with_card(entry: Mapping[str, Any], card: Any) -> dict[str, Any]:
    """A copy of an index entry whose cases' best/current records come from ``card`` (a scorecard)."""
    cases = _cases(card)
    out = dict(entry)
    new_cases = []
    for case in entry.get("cases") or []:
        if not isinstance(case, Mapping):
            continue
        primary = case.get("primary_metric")
        found = cases.get(str(case.get("test_case_id"))) or {}
        copied = dict(case)
        for key, field in (("best", "metrics_best"), ("current", "metrics_current")):
            record = (found.get(field) or {}).get(primary) if primary else None
            copied[key] = dict(record, seed=is_seed_sha(record.get("commit_sha"))) \
                if isinstance(record, Mapping) else None
        new_cases.append(copied)
    out["cases"] = new_cases
    return out


def accept_outcome(kernel_id: str, before: Any, after: Any, metas: Sequence[Mapping[str, Any]],
                   operator_entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The structured outcome of an accept: case deltas, the overall figures, the kernel's rank before and after.

    ``operator_entries`` are the index entries of the kernel's operator *after* the accept
    (the kernel's own entry included, or absent for a kernel the index does not list yet);
    the ranking before is the same operator with this kernel's records taken from
    ``before`` (absent when ``before`` has no real record: a new kernel).
    """
    deltas = case_deltas(before, after, metas)
    operator = next((ranking.operator_of(e) for e in operator_entries if e.get("kernel_id") == kernel_id),
                    "/".join(kernel_id.split("/")[:4]))
    own = next((e for e in operator_entries if e.get("kernel_id") == kernel_id), None)
    others = [e for e in operator_entries if e.get("kernel_id") != kernel_id]
    after_entries = others + ([own] if own is not None else [])
    had_records = any(_real((c.get("metrics_best") or {}).get(m.get("primary_metric")))
                      for m in metas for c in [_cases(before).get(str(m.get("test_case_id"))) or {}])
    before_entries = others + ([entry_with_card(own, before)] if own is not None and had_records else [])

    def rank_in(entries: list) -> tuple[int | None, bool]:
        row = ranking.rank_operator(operator, entries).get(kernel_id) if entries else None
        return (row.rank, row.approx) if row is not None else (None, False)

    rank_before, approx_before = rank_in(before_entries)
    rank_after, approx_after = rank_in(after_entries)
    out = {"kernel_id": kernel_id, "operator": operator, **overall(deltas), "cases": deltas,
           "rank_before": rank_before, "rank_before_approx": approx_before,
           "rank_after": rank_after, "rank_after_approx": approx_after}
    return under_review(out) if own is not None and ranking.unreviewed(own) else out


def under_review(out: Mapping[str, Any]) -> dict[str, Any]:
    """An accept outcome of a kernel whose harness awaits review: the same figures, no new best, no rank after.

    The kernel's own scorecard still moves (its ``best`` values stay), but nothing it
    records counts as a best of its operator until a maintainer approves the harness.
    """
    cases = [dict(c, new_best=False) if isinstance(c, Mapping) else c for c in out.get("cases") or []]
    return {**out, "harness": ranking.UNREVIEWED, "new_best": False, "cases_improved": 0, "cases": cases,
            "rank_after": None, "rank_after_approx": False}


#: environment facts of a run that say nothing about the machine's speed (or always differ)
VOLATILE_ENV = frozenset({"runner_id", "timings", "integrity", "result_channel", "containment", "hostname",
                          "nvidia_smi", "rocm_smi"})


def rerun_deltas(record_card: Any, result: Any, metas: Sequence[Mapping[str, Any]]) -> tuple[list, dict]:
    """``(cases, overall)`` of a rerun against the record it measures again.

    Per METAS case: the record's committed value of the primary metric (``original``:
    its ``metrics_current`` in the record's own scorecard commit) with its spread, this
    run's value and spread, the change in % (``delta_pct``), the speed-up (above 1: the
    rerun was faster) and ``within_noise`` (the two 95 % intervals overlap; None when
    either has no spread). ``overall``: the geometric-mean speed-up, its delta_pct, and
    ``correct`` (every case passed its correctness check).
    """
    recorded = _cases(record_card)
    run = {str(c.get("test_case_id")): c for c in (result or {}).get("cases") or [] if isinstance(c, Mapping)}
    out = []
    for meta in metas:
        cid, primary, declared, direction = _primary_of(meta)
        original = _real(((recorded.get(cid) or {}).get("metrics_current") or {}).get(primary))
        case = run.get(cid) or {}
        metric = next((m for m in case.get("metrics") or [] if isinstance(m, Mapping) and m.get("name") == primary),
                      None)
        orig_i = interval_of(original) if original is not None else None
        new_i = interval_of(metric) if metric is not None else None
        entry: dict[str, Any] = {
            "test_case_id": cid, "metric": primary, "unit": declared.get("unit"), "direction": direction,
            "correctness": case.get("correctness"),
            "original": orig_i.value if orig_i else None,
            "original_spread": [orig_i.lo, orig_i.hi] if orig_i and not orig_i.exact else None,
            "value": new_i.value if new_i else None,
            "spread": [new_i.lo, new_i.hi] if new_i and not new_i.exact else None,
            "delta_pct": None, "speedup": None, "within_noise": None}
        if orig_i and new_i and orig_i.value > 0 and new_i.value > 0:
            entry["delta_pct"] = round(100.0 * (new_i.value - orig_i.value) / orig_i.value, 4)
            entry["speedup"] = orig_i.value / new_i.value if direction == LOWER else new_i.value / orig_i.value
            if not orig_i.exact and not new_i.exact:
                entry["within_noise"] = orig_i.lo <= new_i.hi and new_i.lo <= orig_i.hi
        out.append(entry)
    ups = [e["speedup"] for e in out if e["speedup"]]
    speedup = math.exp(math.fsum(math.log(u) for u in ups) / len(ups)) if ups else None
    return out, {"speedup": speedup, "delta_pct": round(100.0 * (1.0 / speedup - 1.0), 4) if speedup else None,
                 "correct": bool(out) and all(e["correctness"] == "passed" for e in out)}


def env_changes(original: Mapping[str, Any] | None, rerun: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The environment facts that differ between the record's run and the rerun: [{key, original, rerun}].

    Top-level keys only, those in ``VOLATILE_ENV`` left out; a nested fact (``cupy``) is
    compared whole. Empty when the record's environment is unknown (pruned): nothing to
    compare with.
    """
    if not original:
        return []
    keys = sorted((set(original) | set(rerun or {})) - VOLATILE_ENV)
    return [{"key": k, "original": original.get(k), "rerun": (rerun or {}).get(k)} for k in keys
            if original.get(k) != (rerun or {}).get(k)]

"""The scorecard (``.kernel_package/bench_result.yaml``) rewrite on accept: pure functions.

Rules (the kernel package guide §3.2; docs/architecture.md):

- cases follow the METAS order; cases no longer in the METAS are dropped;
- ``metrics_current`` ← every metric of this run (declared ones in METAS order,
  then any extra the run reported), ``commit_sha`` = ``__PENDING_COMMIT__``;
- ``metrics_best`` ← this run, per declared metric, where it strictly beats the
  best in the metric's declared ``direction`` or where the best is the seed
  sentinel ``0000000`` (or missing); otherwise the old record stays. For the case's
  *primary* metric "beats" means beyond the noise (:func:`kz_daemon.core.noise.better_beyond_noise`):
  when both the run's value and the best carry a ``spread`` (95 % interval), the run's
  interval must lie wholly on the better side of the best's, so a resubmission within
  the noise of the record does not take it; without a spread on either, strictly
  better by value. Sentinel
  records the run did not replace are dropped (the sentinel never survives an
  accept); real records of metrics no longer declared are kept;
- ``correctness_current`` ← the case's correctness (``skipped`` → ``unknown``);
- every record the run writes carries the metric's ``spread`` ({n, lo, hi}) when the
  run reported one, and ``harness``, the short blob sha of the
  ``benchmark.py`` it was measured under, when the caller knows it; old bests stay
  when the harness changes, and a page marks a best whose harness is not HEAD's
  (:func:`older_harness`). Seed records and records from before the field carry none;
- :func:`stamp` then replaces ``__PENDING_COMMIT__`` with SHA_src (commit 2).

Example::

    >>> metas = [{"test_case_id": "s", "primary_metric": "ms",
    ...           "metrics": [{"name": "ms", "unit": "ms", "direction": "lower_better"}]}]
    >>> seed = seed_scorecard("cpu/a/b/c/k", metas)
    >>> run = {"cases": [{"test_case_id": "s", "correctness": "passed",
    ...                   "metrics": [{"name": "ms", "value": 1.5}]}]}
    >>> card = update_scorecard(seed, "cpu/a/b/c/k", metas, run, "alice", "2026-01-01T00:00:00Z")
    >>> card["cases"][0]["metrics_best"]["ms"]["commit_sha"]
    '__PENDING_COMMIT__'
    >>> stamp(card, "abc1234")["cases"][0]["metrics_best"]["ms"]["commit_sha"]
    'abc1234'
"""
from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import yaml

from kz_daemon.core import noise
from kz_runner.contract.layout import (
    PENDING_COMMIT,
    SEED_RECORDED_AT,
    SEED_SHA,
    SEED_SUBMITTER,
    is_seed_sha,
    seed_scorecard,  # noqa: F401  (one seed for the daemon and kz dry-run)
)
from kz_runner.contract.yamlio import load_yaml

_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

SCHEMA_VERSION = "1.0.0"


def _record(value: Any, submitter: str, commit_sha: str, recorded_at: str,
            harness: str | None = None, spread: dict | None = None, unverified: bool = False) -> dict[str, Any]:
    record = {"value": value, "submitter": submitter, "commit_sha": commit_sha, "recorded_at": recorded_at}
    if harness:
        record["harness"] = harness
    if spread is not None:
        record["spread"] = spread
    if unverified:
        record["measurement"] = "unverified"
    return record


def takes_best(new: Any, prev: Any, direction: str, primary: bool) -> bool:
    """Whether record ``new`` replaces ``prev`` as the best (both ``{value, spread?}``; ``prev`` real).

    The primary metric must be better beyond the noise of both (see the module
    docstring); any other metric strictly better by value.
    """
    if not primary:
        return beats(new["value"], prev["value"], direction)
    new_i, prev_i = noise.interval_of(new), noise.interval_of(prev)
    if new_i is None or prev_i is None:
        return beats(new["value"], prev["value"], direction)
    return noise.better_beyond_noise(new_i, prev_i, direction)


def beats(new: float, old: float, direction: str) -> bool:
    """Whether ``new`` is strictly better than ``old`` in ``direction`` (lower_better/higher_better)."""
    if direction == "lower_better":
        return new < old
    if direction == "higher_better":
        return new > old
    raise ValueError(f"unknown metric direction {direction!r}")


def update_scorecard(current: dict | None, kernel_id: str, metas: list[dict], result: dict,
                     submitter: str, recorded_at: str, harness: str | None = None) -> dict[str, Any]:
    """The new scorecard after accepting ``result`` (commit_sha = ``__PENDING_COMMIT__``); inputs are not modified.

    ``harness`` (the short blob sha of the benchmark.py the run was measured under)
    goes into every record this run writes; None writes records without it.

    A result the runner marked ``measurement: unverified`` (the benchmark timed the kernel in
    its own process) writes ``metrics_current`` with ``measurement: unverified`` on every record
    and moves no best: such a record is shown, never ranked.
    """
    unverified = result.get("measurement") == "unverified"
    old_cases = {c.get("test_case_id"): c for c in (current or {}).get("cases", []) or []}
    run_cases = {c["test_case_id"]: c for c in result.get("cases", [])}
    cases = []
    for meta in metas:
        case_id = meta["test_case_id"]
        old = old_cases.get(case_id) or {}
        old_best: dict = old.get("metrics_best") or {}
        run = run_cases.get(case_id, {})
        values = {m["name"]: m["value"] for m in run.get("metrics", [])}
        spreads = {m["name"]: noise.spread_of(m.get("spread"), m["value"]) for m in run.get("metrics", [])}
        declared = [m["name"] for m in meta.get("metrics", [])]
        direction = {m["name"]: m.get("direction", "lower_better") for m in meta.get("metrics", [])}
        primary = meta.get("primary_metric")
        order = declared + [name for name in values if name not in declared]

        current_records = {name: _record(values[name], submitter, PENDING_COMMIT, recorded_at, harness,
                                         spreads.get(name), unverified)
                           for name in order if name in values}
        best: dict[str, Any] = {}
        for name in declared:
            prev = old_best.get(name)
            if unverified:  # the seed stays a seed: nothing unverified is a best
                best[name] = copy.deepcopy(prev) if prev is not None else \
                    _record(0, SEED_SUBMITTER, SEED_SHA, SEED_RECORDED_AT)
            elif name in values and (prev is None or is_seed_sha(prev.get("commit_sha"))
                                     or takes_best(current_records[name], prev, direction[name], name == primary)):
                best[name] = copy.deepcopy(current_records[name])
            elif prev is not None and not is_seed_sha(prev.get("commit_sha")):
                best[name] = copy.deepcopy(prev)
        for name, prev in old_best.items():
            if name not in best and name not in declared and not is_seed_sha(prev.get("commit_sha")):
                best[name] = copy.deepcopy(prev)
        correctness = run.get("correctness", "unknown")
        cases.append({
            "test_case_id": case_id,
            "metrics_best": best,
            "metrics_current": current_records,
            "correctness_current": correctness if correctness in ("passed", "failed") else "unknown",
        })
    return {"schema_version": SCHEMA_VERSION, "kernel_id": kernel_id, "cases": cases}


def recompute_best(card: dict, metas: list[dict], baseline: dict | None,
                   runs: Iterable[dict | None]) -> dict[str, Any]:
    """``card`` with every case's ``metrics_best`` rebuilt as if only ``runs`` had been accepted.

    Used when a record is revoked. ``baseline`` is the scorecard before the kernel's first
    logged accept (its real records stand; seed records do not); ``runs`` are the
    scorecards the remaining accepts committed, oldest first, whose ``metrics_current``
    records are replayed with the accept rule (a record replaces the best where it
    strictly beats it in the metric's declared direction, the primary metric beyond the
    noise: :func:`takes_best`). A declared metric nobody
    holds gets the seed sentinel. ``metrics_current`` and everything else is kept;
    inputs are not modified.
    """
    directions = {m["test_case_id"]: {x["name"]: x.get("direction", "lower_better") for x in m.get("metrics", [])}
                  for m in metas or []}
    primaries = {m["test_case_id"]: m.get("primary_metric") for m in metas or []}

    def cases_of(doc: dict | None) -> dict:
        return {c.get("test_case_id"): c for c in (doc or {}).get("cases", []) or []}

    base_cases = cases_of(baseline)
    run_cases = [cases_of(run) for run in runs]
    out = copy.deepcopy(card)
    for case in out.get("cases", []) or []:
        case_id = case.get("test_case_id")
        declared = directions.get(case_id) or {name: "lower_better" for name in case.get("metrics_best") or {}}
        best: dict[str, Any] = {name: copy.deepcopy(rec) for name, rec in
                                ((base_cases.get(case_id) or {}).get("metrics_best") or {}).items()
                                if isinstance(rec, dict) and not is_seed_sha(rec.get("commit_sha"))}
        for cases in run_cases:
            for name, rec in ((cases.get(case_id) or {}).get("metrics_current") or {}).items():
                if name not in declared or not isinstance(rec, dict) or rec.get("measurement") == "unverified":
                    continue
                prev = best.get(name)
                if prev is None or takes_best(rec, prev, declared[name], name == primaries.get(case_id)):
                    best[name] = copy.deepcopy(rec)
        rebuilt = {name: best.pop(name, None) or _record(0, SEED_SUBMITTER, SEED_SHA, SEED_RECORDED_AT)
                   for name in declared}
        rebuilt.update(best)  # real records of metrics no longer declared stay, as on accept
        case["metrics_best"] = rebuilt
    return out


def older_harness(record: Any, head_blob: str | None) -> bool:
    """Whether ``record`` was measured under a harness other than ``head_blob`` (HEAD's full benchmark.py blob sha).

    False for records without a ``harness`` (seeds, records from before the field) and
    when HEAD's harness is unknown: only a recorded difference is marked.
    """
    if not isinstance(record, dict) or not head_blob:
        return False
    harness = record.get("harness")
    return isinstance(harness, str) and bool(harness) and not head_blob.startswith(harness)


def stamp(scorecard: dict, sha_src: str) -> dict[str, Any]:
    """A copy with every ``__PENDING_COMMIT__`` commit_sha replaced by ``sha_src``."""
    out = copy.deepcopy(scorecard)
    for case in out.get("cases", []):
        for key in ("metrics_best", "metrics_current"):
            for record in (case.get(key) or {}).values():
                if record.get("commit_sha") == PENDING_COMMIT:
                    record["commit_sha"] = sha_src
    return out


def dump(scorecard: dict) -> bytes:
    """The YAML bytes written to the repo (stable key order, so equal cards give equal blobs)."""
    return yaml.dump(scorecard, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True).encode("utf-8")


def load(data: bytes | str | None) -> dict | None:
    """Parse a bench_result.yaml (None for None or anything that is not a mapping)."""
    if data is None:
        return None
    doc = load_yaml(data)  # what the safe C loader gives, faster on files like these
    return doc if isinstance(doc, dict) else None


def pending_in(scorecard: dict) -> bool:
    """Whether any record still carries ``__PENDING_COMMIT__``."""
    return any(r.get("commit_sha") == PENDING_COMMIT for c in scorecard.get("cases", [])
               for k in ("metrics_best", "metrics_current") for r in (c.get(k) or {}).values())


def desc_is_frozen(raw: bytes | None) -> bool:
    """Whether desc.yaml's bytes say ``status: frozen`` (False for no file or unreadable YAML)."""
    if raw is None:
        return False
    try:
        desc = load(raw)
    except yaml.YAMLError:
        return False
    return isinstance(desc, dict) and desc.get("status") == "frozen"

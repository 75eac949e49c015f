"""Reading the scorecard (``.kernel_package/bench_result.yaml``) and judging regressions.

The server hands every run the package's current scorecard (or the seed one for
a new package). Seed records carry the sentinel ``commit_sha: "0000000"``; they
never compete, so :meth:`Scorecard.best` and :meth:`Scorecard.current` ignore them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kz_runner.contract.layout import SEED_SHA, is_seed_sha

SEED_SENTINEL = SEED_SHA
LOWER_BETTER = "lower_better"
HIGHER_BETTER = "higher_better"


def is_sentinel(commit_sha: Any) -> bool:
    """True for the seed sentinel (``"0000000"``; any all-zero sha counts)."""
    return is_seed_sha(commit_sha)


def _record_value(record: Any) -> float | None:
    if not isinstance(record, dict) or is_sentinel(record.get("commit_sha")):
        return None
    value = record.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True)
class Scorecard:
    """Best and current values per case and metric; sentinel and malformed records dropped."""

    kernel_id: str | None = None
    best_values: dict[str, dict[str, float]] = field(default_factory=dict)
    current_values: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def from_document(cls, doc: Any) -> Scorecard:
        """Build from a parsed bench_result document (anything else gives an empty card)."""
        if not isinstance(doc, dict):
            return cls()
        best: dict[str, dict[str, float]] = {}
        current: dict[str, dict[str, float]] = {}
        for case in doc.get("cases") or []:
            if not isinstance(case, dict) or not isinstance(case.get("test_case_id"), str):
                continue
            cid = case["test_case_id"]
            for key, target in (("metrics_best", best), ("metrics_current", current)):
                metrics = case.get(key)
                if not isinstance(metrics, dict):
                    continue
                for name, record in metrics.items():
                    value = _record_value(record)
                    if value is not None:
                        target.setdefault(cid, {})[str(name)] = value
        kid = doc.get("kernel_id")
        return cls(kid if isinstance(kid, str) else None, best, current)

    @classmethod
    def load(cls, path: str | Path) -> Scorecard:
        """Read ``bench_result.yaml``; a missing or unreadable file gives an empty card."""
        import yaml

        try:
            doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            return cls()
        return cls.from_document(doc)

    def best(self, case_id: str, metric: str) -> float | None:
        """Best recorded value (not the seed sentinel), or None."""
        return self.best_values.get(case_id, {}).get(metric)

    def current(self, case_id: str, metric: str) -> float | None:
        """Current (HEAD) value (not the seed sentinel), or None."""
        return self.current_values.get(case_id, {}).get(metric)


@dataclass(frozen=True)
class Regression:
    """The outcome of :func:`regression_check`."""

    ok: bool  # within tolerance (or nothing to compare against)
    rel_change: float | None  # (value - reference) / reference; None without a reference
    worse_by: float | None  # how much worse in the metric's direction (negative = better)
    reason: str


def regression_check(
    value: float,
    reference: float | None,
    direction: str,
    tolerance: float,
    *,
    metric: str = "metric",
    unit: str = "",
    against: str = "best",
) -> Regression:
    """Is ``value`` within ``tolerance`` (a fraction, 0.05 = 5 %) of ``reference``?

    ``lower_better``: rejected when ``(value - ref) / ref > tolerance``.
    ``higher_better``: rejected when ``(ref - value) / ref > tolerance``.
    No reference (new package, seed scorecard) or a non-positive one: accepted.
    """
    if direction not in (LOWER_BETTER, HIGHER_BETTER):
        raise ValueError(f"direction must be {LOWER_BETTER!r} or {HIGHER_BETTER!r}, not {direction!r}")
    if tolerance < 0:
        raise ValueError("tolerance must be >= 0")
    unit_s = f" {unit}" if unit else ""
    if reference is None:
        return Regression(True, None, None, f"{metric} {value:.6g}{unit_s}; no recorded {against} to compare with")
    if reference <= 0:
        return Regression(True, None, None, f"{metric} {value:.6g}{unit_s}; recorded {against} {reference:.6g} is not positive")
    rel = (value - reference) / reference
    worse = rel if direction == LOWER_BETTER else -rel
    ok = worse <= tolerance
    verdict = "within" if ok else "exceeds"
    reason = (
        f"{metric} {value:.6g}{unit_s} vs {against} {reference:.6g}{unit_s} ({rel * 100:+.2f}%), "
        f"{verdict} the {tolerance * 100:g}% regression tolerance"
    )
    return Regression(ok, rel, worse, reason)

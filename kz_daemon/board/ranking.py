"""An operator's ranking: one score per kernel, ranks that know the noise.

An *operator* is ``<arch>/<op_class>/<sub_class>/<quant>``; the kernels under it
compete. Each kernel's standing in a test case is its best record of the case's
primary metric (index entries, ``zoo.index()``), with the record's ``spread``: a 95 %
confidence interval (``kz_daemon.core.noise``). A seed placeholder is no measurement.

**Reference.** Speed-ups are taken against the operator's *reference kernel*: the first
kernel (kernel_id order) with a measurement whose desc.yaml ``tags`` include ``reference``;
failing that, the first measured one whose name (last kernel_id segment) is one of
``REFERENCE_NAMES``; failing that, the first kernel with any measurement
(``reference_default``). A tagged or named reference that holds only its seed
placeholder (a fresh zoo's examples) scores nobody, so it is passed over until measured.

**Score.** A kernel's score is the geometric mean, over the *scored cases* (those in
which the reference has a measurement), of its speed-up against the reference:
``reference / value`` for a lower-is-better metric, ``value / reference`` for a
higher-is-better one, so above 1 is faster than the reference. The score's interval is
the same geometric mean taken over each case's interval ends, the reference's value
held fixed (a common factor of every kernel in a case, it moves no kernel against
another). A kernel without a measurement in some scored case is listed, unranked, with
the cases it misses: a score over fewer cases would not be comparable.

**Ranks.** Kernels are ordered by score (highest first, kernel_id on ties). Walking
down, a kernel whose score interval overlaps the interval of the first kernel of the
current group shares that kernel's rank, else it opens a new group at its position
(competition ranking: 1, 1, 3). Members of a group of two or more are ``approx``
(shown as ≈): these runs cannot tell them apart.

**Unreviewed harness.** An index entry marked ``"harness": "unreviewed"`` (:data:`UNREVIEWED`:
a submission brought its harness and no maintainer approved it yet,
``kz_daemon.guards.harness_review``) is listed with its figures and speed-ups but never
ranked: no score, no rank, never the reference, so it is nobody's best. Approving the
harness takes the mark away and the ranking follows, since it is computed from the marks.

Pure functions over plain values: the pages, the API and the accept path share them.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kz_daemon.core.noise import Interval, interval_of, overlaps
from kz_runner.contract.kernel_id import CATEGORY_FIELDS
from kz_runner.contract.layout import is_seed_sha

__all__ = ["REFERENCE_TAG", "REFERENCE_NAMES", "HARNESS", "REVIEWED", "UNREVIEWED", "CaseStanding", "KernelScore",
           "OperatorRanking", "operator_of", "reference_of", "measured", "speedup_interval", "geomean",
           "shared_ranks", "rank_operator", "rank_all", "cases_of", "unreviewed"]

REFERENCE_TAG = "reference"
REFERENCE_NAMES = ("reference_impl", "numpy_ref")
LOWER, HIGHER = "lower_better", "higher_better"
#: the key of an index entry (and of the API's documents) that says whether its harness was reviewed
HARNESS = "harness"
REVIEWED, UNREVIEWED = "reviewed", "unreviewed"


@dataclass(frozen=True)
class CaseStanding:
    """One kernel in one case: its best record's interval and its speed-up against the reference."""

    case_id: str
    metric: str
    unit: str
    direction: str
    best: Interval | None           # None: no measurement (or only the seed placeholder)
    reference: float | None         # the reference kernel's best value in this case
    speedup: Interval | None        # None without a best or a reference value
    record: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class KernelScore:
    """One kernel of an operator: its score, its rank (None: unranked) and its cases."""

    kernel_id: str
    name: str
    cases: dict[str, CaseStanding]
    score: Interval | None           # geometric mean of the speed-ups (None: unranked)
    missing: tuple[str, ...]         # scored cases it has no measurement in
    is_reference: bool = False
    rank: int | None = None
    approx: bool = False             # shares its rank with another kernel (≈)
    unreviewed: bool = False         # its harness awaits a maintainer's review: listed, never ranked

    @property
    def ranked(self) -> bool:
        """Whether the kernel has a rank (a measurement in every scored case)."""
        return self.rank is not None


@dataclass
class OperatorRanking:
    """The ranking of one operator: ranked kernels first (by rank), then the unranked ones."""

    operator: str
    reference: str | None
    reference_default: bool          # no measured kernel is tagged or named as the reference: the first measured one
    case_ids: list[str]
    scored_cases: list[str]
    kernels: list[KernelScore]

    def get(self, kernel_id: str) -> KernelScore | None:
        """The kernel's row, or None."""
        return next((k for k in self.kernels if k.kernel_id == kernel_id), None)


def cases_of(entry: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The per-case summaries of an index entry (``cases`` as a list, or a mapping by case id)."""
    raw = entry.get("cases") or []
    if isinstance(raw, Mapping):
        return [dict(v, test_case_id=v.get("test_case_id", k)) for k, v in raw.items() if isinstance(v, Mapping)]
    return [c for c in raw if isinstance(c, Mapping)]


def unreviewed(entry: Mapping[str, Any]) -> bool:
    """Whether an index entry is marked as measured under a harness no maintainer reviewed yet."""
    return entry.get(HARNESS) == UNREVIEWED


def operator_of(entry: Mapping[str, Any]) -> str:
    """``arch/op_class/sub_class/quant`` of an index entry (its category, else its kernel_id)."""
    cat = entry.get("category")
    if isinstance(cat, Mapping):
        return "/".join(str(cat.get(k, "")) for k in CATEGORY_FIELDS)
    parts = str(entry.get("kernel_id", "")).split("/")
    return "/".join(parts[i] if i < len(parts) else "" for i in range(len(CATEGORY_FIELDS)))


def measured(record: Any) -> Interval | None:
    """The interval of a best/current record, or None for a missing record or the seed placeholder."""
    if not isinstance(record, Mapping) or record.get("seed") or is_seed_sha(record.get("commit_sha")):
        return None
    found = interval_of(record)
    return found if found is not None and found.value > 0 and found.lo > 0 else None


def reference_of(entries: Iterable[Mapping[str, Any]], measured_only: bool = True) -> tuple[str | None, bool]:
    """``(kernel_id, by default)`` of the operator's reference kernel (see the module docstring).

    ``measured_only=False`` applies the same order to kernels without a measurement too (the
    confirmation run's fallback when no kernel of the operator is measured yet: it times the
    reference's source, it needs no record of it).
    """
    ordered = sorted((e for e in entries if not unreviewed(e)), key=lambda e: str(e.get("kernel_id", "")))
    has_record = {str(e.get("kernel_id")): not measured_only or
                  any(measured(c.get("best")) is not None for c in cases_of(e)) for e in ordered}
    for entry in ordered:
        if REFERENCE_TAG in (entry.get("tags") or []) and has_record[str(entry.get("kernel_id"))]:
            return str(entry.get("kernel_id")), False
    for entry in ordered:
        if str(entry.get("kernel_id", "")).rsplit("/", 1)[-1] in REFERENCE_NAMES \
                and has_record[str(entry.get("kernel_id"))]:
            return str(entry.get("kernel_id")), False
    for entry in ordered:
        if has_record[str(entry.get("kernel_id"))]:
            return str(entry.get("kernel_id")), True
    return None, False


def speedup_interval(value: Interval, reference: float, direction: str) -> Interval:
    """How many times better than ``reference`` the interval ``value`` is (above 1 = better)."""
    if direction == HIGHER:
        return value.scaled(1.0 / reference)
    return value.inverted(reference)


def geomean(intervals: Sequence[Interval]) -> Interval:
    """The geometric mean of positive intervals, end by end (``n``: the fewest timed calls of any)."""
    if not intervals:
        raise ValueError("geomean needs at least one interval")

    def mean_log(values: Iterable[float]) -> float:
        return math.exp(math.fsum(math.log(v) for v in values) / len(intervals))

    return Interval(mean_log(i.value for i in intervals), mean_log(i.lo for i in intervals),
                    mean_log(i.hi for i in intervals), min(i.n for i in intervals))


def shared_ranks(scores: Sequence[tuple[str, Interval]]) -> list[tuple[str, int, bool]]:
    """``(key, rank, approx)`` for each ``(key, higher-is-better interval)``, best first.

    Ordered by value (then key); a kernel whose interval overlaps that of its group's
    first kernel shares the group's rank (see the module docstring).
    """
    ordered = sorted(scores, key=lambda item: (-item[1].value, item[0]))
    out: list[list] = []
    leader: Interval | None = None
    group_start = 0
    for position, (key, interval) in enumerate(ordered):
        if leader is not None and overlaps(interval, leader):
            out.append([key, out[group_start][1], False])
        else:
            leader, group_start = interval, position
            out.append([key, position + 1, False])
    sizes: dict[int, int] = {}
    for _key, rank, _approx in out:
        sizes[rank] = sizes.get(rank, 0) + 1
    return [(key, rank, sizes[rank] > 1) for key, rank, _approx in out]


def rank_operator(operator: str, entries: Sequence[Mapping[str, Any]]) -> OperatorRanking:
    """The ranking of one operator's index entries (see the module docstring)."""
    entries = sorted(entries, key=lambda e: str(e.get("kernel_id", "")))
    reference, by_default = reference_of(entries)
    case_ids: list[str] = []
    # case -> (metric, unit, direction), as the reference declares it (else the first kernel that
    # has the case); cases in the reference's METAS order, then the others'
    spec: dict[str, tuple[str, str, str]] = {}
    ref_values: dict[str, float] = {}
    for entry in sorted(entries, key=lambda e: e.get("kernel_id") != reference):
        for case in cases_of(entry):
            cid = str(case.get("test_case_id", ""))
            if cid not in spec:
                case_ids.append(cid)
                spec[cid] = (str(case.get("primary_metric") or ""), str(case.get("unit") or ""),
                             str(case.get("direction") or LOWER))
            if entry.get("kernel_id") == reference:
                best = measured(case.get("best"))
                if best is not None:
                    ref_values[cid] = best.value
    scored = [cid for cid in case_ids if cid in ref_values]
    kernels: list[KernelScore] = []
    for entry in entries:
        kid = str(entry.get("kernel_id", ""))
        standings: dict[str, CaseStanding] = {}
        for case in cases_of(entry):
            cid = str(case.get("test_case_id", ""))
            metric, unit, direction = spec[cid]
            best = measured(case.get("best"))
            ref = ref_values.get(cid)
            raw = case.get("best")
            record: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
            standings[cid] = CaseStanding(cid, metric, unit, direction, best, ref,
                                          speedup_interval(best, ref, direction) if best and ref else None,
                                          record)
        ups = [standings[cid].speedup if cid in standings else None for cid in scored]
        missing = tuple(cid for cid, up in zip(scored, ups) if up is None)
        held_back = unreviewed(entry)
        score = geomean([up for up in ups if up is not None]) if scored and not missing and not held_back else None
        kernels.append(KernelScore(kid, str(entry.get("name") or ""), standings, score, missing,
                                   is_reference=kid == reference, unreviewed=held_back))
    by_id = {k.kernel_id: k for k in kernels}
    for key, rank, approx in shared_ranks([(k.kernel_id, k.score) for k in kernels if k.score is not None]):
        by_id[key].rank, by_id[key].approx = rank, approx
    kernels.sort(key=lambda k: (k.rank is None, k.rank or 0, -(k.score.value if k.score else 0), k.kernel_id))
    return OperatorRanking(operator, reference, by_default, case_ids, scored, kernels)


def rank_all(entries: Iterable[Mapping[str, Any]]) -> dict[str, OperatorRanking]:
    """Every operator's ranking, by operator path (sorted)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for entry in entries:
        groups.setdefault(operator_of(entry), []).append(entry)
    return {op: rank_operator(op, groups[op]) for op in sorted(groups)}

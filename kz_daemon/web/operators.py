"""Operators: the implementations of one arch/op_class/sub_class/quant, ranked per test case.

Pure functions over index entries (``zoo.index()``), so the web pages and their tests
share one ranking. An implementation's standing in a case is its *best* record of the
case's primary metric; a seed placeholder (``commit_sha`` ``0000000``) is not a
measurement and is never ranked. Ties share a rank (1, 1, 3).

The reference implementation of an operator, which speed-ups are measured against, is
the first package (in kernel_id order) whose desc.yaml ``tags`` include ``reference``;
failing that, the first whose last kernel_id segment is one of ``REFERENCE_NAMES``.
A speed-up is ``reference / value`` for a lower-is-better metric and ``value / reference``
for a higher-is-better one, so above 1 is always faster than the reference.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kz_daemon.api import views
from kz_runner.contract.layout import is_seed_sha

REFERENCE_TAG = "reference"
REFERENCE_NAMES = ("reference_impl", "numpy_ref")
LOWER, HIGHER = "lower_better", "higher_better"


@dataclass(frozen=True, order=True)
class OperatorKey:
    """arch/op_class/sub_class/quant: what makes implementations comparable."""

    arch: str
    op_class: str
    sub_class: str
    quant: str

    @property
    def path(self) -> str:
        """``arch/op_class/sub_class/quant`` (the operator page's URL tail)."""
        return "/".join((self.arch, self.op_class, self.sub_class, self.quant))


@dataclass
class Standing:
    """One implementation in one case."""

    kernel_id: str
    name: str
    value: float | None          # best measured value, None when only a placeholder (or nothing)
    record: dict[str, Any]       # the best record (submitter, commit_sha, recorded_at)
    current: float | None        # the package HEAD's measured value
    placeholder: bool            # the scorecard holds only the seed placeholder
    correctness: str
    is_reference: bool
    rank: int | None = None
    speedup: float | None = None
    secondary: dict[str, float] = field(default_factory=dict)
    older_harness: bool = False  # the best was measured under a harness other than HEAD's

    @property
    def measured(self) -> bool:
        """Whether the implementation has a real measurement in this case."""
        return self.value is not None


@dataclass
class CaseBoard:
    """The ranking of one case: measured implementations by rank, then the unmeasured ones."""

    case_id: str
    metric: str
    unit: str
    direction: str
    reference_value: float | None
    standings: list[Standing]


@dataclass
class OperatorSummary:
    """A row of the home page's operator list."""

    key: OperatorKey
    implementations: int
    measured: int                 # implementations with a measurement in at least one case
    cases: int
    leader: str | None            # kernel_id that ranks first in the most cases
    leads: int                    # in how many cases it does
    reference: str | None


def key_of(entry: Mapping[str, Any]) -> OperatorKey:
    """The operator an index entry implements (from its category, else its kernel_id)."""
    cat = views.category(entry)
    return OperatorKey(cat["arch"], cat["op_class"], cat["sub_class"], cat["quant"])


def group(entries: Iterable[Mapping[str, Any]]) -> dict[OperatorKey, list[Mapping[str, Any]]]:
    """Entries by operator, operators sorted, entries in kernel_id order within each."""
    out: dict[OperatorKey, list[Mapping[str, Any]]] = {}
    for entry in entries:
        out.setdefault(key_of(entry), []).append(entry)
    return {k: sorted(v, key=lambda e: str(e.get("kernel_id", ""))) for k, v in sorted(out.items())}


def reference_of(entries: Iterable[Mapping[str, Any]]) -> str | None:
    """The kernel_id of the operator's reference implementation (see the module docstring), or None."""
    ordered = sorted(entries, key=lambda e: str(e.get("kernel_id", "")))
    for entry in ordered:
        if REFERENCE_TAG in (entry.get("tags") or []):
            return str(entry.get("kernel_id"))
    for entry in ordered:
        if str(entry.get("kernel_id", "")).rsplit("/", 1)[-1] in REFERENCE_NAMES:
            return str(entry.get("kernel_id"))
    return None


def measured_value(record: Any) -> float | None:
    """The value of a scorecard record, or None for a missing record or the seed placeholder."""
    if not isinstance(record, Mapping) or record.get("seed") or is_seed_sha(record.get("commit_sha")):
        return None
    return views.metric_value(record)


def speedup(value: float | None, reference: float | None, direction: str) -> float | None:
    """How many times better than the reference ``value`` is (above 1 = better); None when unknown."""
    if value is None or reference is None or value <= 0 or reference <= 0:
        return None
    return value / reference if direction == HIGHER else reference / value


def _rank(standings: list[Standing], direction: str) -> None:
    measured = sorted((s for s in standings if s.measured),
                      key=lambda s: (-s.value if direction == HIGHER else s.value, s.kernel_id))
    previous, rank = None, 0
    for position, standing in enumerate(measured, start=1):
        if standing.value != previous:
            rank, previous = position, standing.value
        standing.rank = rank


def boards(entries: list[Mapping[str, Any]], reference: str | None = None) -> list[CaseBoard]:
    """One ranking per test case of the operator (cases in the order the implementations list them)."""
    reference = reference if reference is not None else reference_of(entries)
    by_case: dict[str, list[tuple[Mapping[str, Any], Mapping[str, Any]]]] = {}
    for entry in entries:
        for case in views.cases(entry):
            by_case.setdefault(str(case.get("test_case_id", "")), []).append((entry, case))
    out = []
    for case_id, pairs in by_case.items():
        ref_case = next((c for e, c in pairs if e.get("kernel_id") == reference), None)
        first = ref_case or pairs[0][1]
        direction = str(first.get("direction") or LOWER)
        standings = []
        for entry, case in pairs:
            best, current = case.get("best"), case.get("current")
            value = measured_value(best)
            standings.append(Standing(
                kernel_id=str(entry.get("kernel_id", "")), name=str(entry.get("name") or ""), value=value,
                record=dict(best) if isinstance(best, Mapping) else {}, current=measured_value(current),
                placeholder=value is None and isinstance(best, Mapping),
                correctness=str(case.get("correctness_current") or ""),
                is_reference=entry.get("kernel_id") == reference))
        ref_value = measured_value(ref_case.get("best")) if ref_case is not None else None
        _rank(standings, direction)
        for standing in standings:
            standing.speedup = speedup(standing.value, ref_value, direction)
        standings.sort(key=lambda s: (s.rank is None, s.rank or 0, s.kernel_id))
        out.append(CaseBoard(case_id, str(first.get("primary_metric") or ""), str(first.get("unit") or ""),
                             direction, ref_value, standings))
    return out


def summarise(key: OperatorKey, entries: list[Mapping[str, Any]]) -> OperatorSummary:
    """The operator's counts and the implementation that leads the most cases."""
    reference = reference_of(entries)
    case_boards = boards(entries, reference)
    leads: dict[str, int] = {}
    measured: set[str] = set()
    for board in case_boards:
        for standing in board.standings:
            if standing.measured:
                measured.add(standing.kernel_id)
            if standing.rank == 1:
                leads[standing.kernel_id] = leads.get(standing.kernel_id, 0) + 1
    leader = min(leads, key=lambda k: (-leads[k], k)) if leads else None
    return OperatorSummary(key, len(entries), len(measured), len(case_boards), leader,
                           leads.get(leader, 0) if leader else 0, reference)

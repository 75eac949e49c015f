"""Operators: the implementations of one arch/op_class/sub_class/quant, ranked overall and per test case.

Functions over index entries (``zoo.index()``), so the web pages and their tests share
one ranking. The overall ranking (one score per kernel, ranks within the noise) is
``kz_daemon.board.ranking``; the operator page also ranks each case on its own: an
implementation's standing in a case is its *best* record of the case's primary metric;
a seed placeholder (``commit_sha`` ``0000000``) is not a measurement and is never
ranked. Equal values share a rank (1, 1, 3).

The reference implementation of an operator, which speed-ups are measured against, is
``kz_daemon.board.ranking.reference_of``'s: the first package (in kernel_id order) whose
desc.yaml ``tags`` include ``reference``; failing that, the first whose last kernel_id
segment is one of ``REFERENCE_NAMES``; failing that, the first with a measurement. A
speed-up is ``reference / value`` for a lower-is-better metric and ``value / reference``
for a higher-is-better one, so above 1 is always faster than the reference. An
implementation whose harness awaits a maintainer's review (its entry marked,
``kz_daemon.board.ranking.unreviewed``) is shown with its figures but ranked in no case,
and its accepts are no "new best" on the home page.

The home page's *latest new bests* and *records this week* (:func:`latest_bests`) and the
operator page's *best over time* charts (:func:`best_over_time`) read the kernel repo's
history (``kz_daemon.storage.history``).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from kz_daemon.api import views
from kz_daemon.board import outcome, ranking
from kz_daemon.web import charts as web_charts
from kz_runner.contract.layout import is_seed_sha

REFERENCE_TAG = ranking.REFERENCE_TAG
REFERENCE_NAMES = ranking.REFERENCE_NAMES
LOWER, HIGHER = "lower_better", "higher_better"
#: "this week" on the home page, in seconds
WEEK_S = 7 * 86400
#: how many of the latest new bests the home page lists
NEW_BESTS_SHOWN = 10
#: how many accepts the home page reads to find them (newest first)
ACCEPTS_READ = 60
#: how many kernels (by rank) an operator page's best-over-time chart draws: one colour each
CHART_SERIES = len(web_charts.PALETTE)


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
    unreviewed: bool = False     # its harness awaits a maintainer's review: shown, never ranked

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
    leaders: list[str] = field(default_factory=list)  # ranked first by the overall score (≈ when several)
    leader_score: float | None = None                 # their score: geometric-mean speed-up


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
    return ranking.reference_of(list(entries))[0]


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
    measured = sorted((s for s in standings if s.measured and not s.unreviewed),  # measured: value is set
                      key=lambda s: (-cast(float, s.value) if direction == HIGHER else s.value, s.kernel_id))
    previous, rank = None, 0
    for position, standing in enumerate(measured, start=1):
        if standing.value != previous:
            rank, previous = position, standing.value
        standing.rank = rank


def boards(entries: list[Mapping[str, Any]], reference: str | None = None) -> list[CaseBoard]:
    """One ranking per test case of the operator (cases in the order the implementations list them)."""
    reference = reference if reference is not None else reference_of(entries)
    by_case: dict[str, list[tuple[Mapping[str, Any], Mapping[str, Any]]]] = {}
    case: Mapping[str, Any]
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
                is_reference=entry.get("kernel_id") == reference, unreviewed=ranking.unreviewed(entry)))
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
    overall = ranking.rank_operator(key.path, entries)
    first = [k for k in overall.kernels if k.rank == 1]
    return OperatorSummary(key, len(entries), len(measured), len(case_boards), leader,
                           leads.get(leader, 0) if leader else 0, reference, [k.kernel_id for k in first],
                           first[0].score.value if first and first[0].score else None)


def metas_of(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """METAS-like case descriptions (primary metric, unit, direction) from an index entry."""
    return [{"test_case_id": c.get("test_case_id"), "primary_metric": c.get("primary_metric"),
             "metrics": [{"name": c.get("primary_metric"), "unit": c.get("unit"), "direction": c.get("direction")}]}
            for c in views.cases(entry)]


def latest_bests(history: Any, lookup: Any, now: float,
                 unreviewed: Callable[[str, str], bool] | None = None) -> tuple[int, list[dict[str, Any]]]:
    """``(records this week, the latest accepts that set a new best)``, newest first, with their deltas.

    ``lookup(kernel_id)`` gives a kernel's index entry (its cases' primary metrics); each
    row: kernel_id, operator, time, submitter, submission, sha_src, revoked, the cases whose
    best moved (:func:`kz_daemon.board.outcome.case_deltas`) and the overall figures. An
    accept measured under a harness that awaits review (``unreviewed(kernel_id, sha_src)``)
    sets no best, so it is left out.
    """
    if history is None:
        return 0, []
    week, accepts = history.recent_accepts(int(now) - WEEK_S, keep=ACCEPTS_READ)
    rows = []
    for record in accepts:
        entry = lookup(record.kernel_id)
        if entry is None or (unreviewed is not None and unreviewed(record.kernel_id, record.sha_src)):
            continue
        deltas = outcome.case_deltas(record.before, record.after, metas_of(entry))
        improved = [d for d in deltas if d["new_best"]]
        if not improved:
            continue
        rows.append({"kernel_id": record.kernel_id, "operator": key_of(entry).path, "time": record.time,
                     "submitter": record.submitter, "submission": record.submission, "sha_src": record.sha_src,
                     "revoked": record.revoked, "cases": improved, "overall": outcome.overall(deltas)})
        if len(rows) >= NEW_BESTS_SHOWN:
            break
    return week, rows


def best_over_time(history: Any, doc: Mapping[str, Any]) -> list[Any]:
    """One chart per case of an operator document: each kernel's best of the primary metric over time.

    A series per kernel (the first ``CHART_SERIES`` by rank), a staircase through the
    accepts that moved its recorded best (the scorecard's ``metrics_best``, so a run within
    the noise of the best does not move the line; x: commit time); a revoked record is a
    ring off the line at its value, since the best it set was taken back.
    """
    if history is None:
        return []
    kernels = [k for k in doc.get("kernels") or [] if k.get("cases")][:CHART_SERIES]
    points = {k["kernel_id"]: history.accepted(k["kernel_id"]) for k in kernels}
    charts = []
    for case in doc.get("cases") or []:
        cid, metric = case["test_case_id"], case.get("metric") or ""
        series: dict[str, list[tuple]] = {}
        for kernel in kernels:
            name = kernel["kernel_id"].rsplit("/", 1)[-1]
            best: float | None = None
            for point in points[kernel["kernel_id"]]:
                value = point.metrics.get(cid, {}).get(metric)
                if point.revoked:
                    if value is not None:
                        series.setdefault(name, []).append(
                            (point.time, value, f"{name} {metric}={value:.4g} by {point.submitter} (revoked)",
                             f"/commits/{point.commit_sha}", True))
                    continue
                recorded = point.best.get(cid, {}).get(metric)
                if recorded is None or recorded == best:
                    continue
                best = recorded
                tip = f"{name}: best {metric}={recorded:.4g} after {point.submitter}'s run"
                series.setdefault(name, []).append((point.time, recorded, tip, f"/commits/{point.commit_sha}"))
        xs = [p[0] for pts in series.values() for p in pts]
        chart = web_charts.line_chart(series, title=f"{cid}: best {metric}", unit=case.get("unit") or "",
                                      x_labels=web_charts.time_labels(xs), width=420, height=200, step=True,
                                      legend=True)
        if chart is not None:
            charts.append(chart)
    return charts

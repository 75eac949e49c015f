"""The accept path's values: a run's :class:`Verdict` and its per-case :class:`CaseSummaryDoc`.

A verdict is what the hard checks, the physics floor and the containment rule say about one
reported run; a case summary is what ``result.reported`` and the status documents carry per
case; a :data:`BenchmarkResult` is the reported document both are read from. All are plain values (a named tuple, a typed dict: the summaries travel as JSON in the
event log unchanged), so the saga, the confirmation and start-up recovery pass the same types.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypedDict

__all__ = ["BenchmarkResult", "CaseSummaryDoc", "Summarize", "Verdict"]

#: A reported benchmark result document (``benchmark_output``), as JSON decodes it: an object.
#: The accept path reads ``overall`` (``build_ok``, ``accept_reason``) and ``cases`` (each with
#: ``test_case_id``, ``correctness``, ``accept`` and ``metrics``: ``name``, ``value``, ``spread``
#: with ``n``, ``lo``, ``hi``). A package's benchmark.py wrote it and a runner sent it, so no value
#: has a known type until the hard checks passed it: every reader checks the type of what it reads.
BenchmarkResult = dict[str, object]


class Verdict(NamedTuple):
    """One run's verdict: accepted, or the rejection's code and message with its details."""

    accepted: bool
    code: str
    message: str
    details: dict[str, Any]
    invalid: bool  # the document itself broke the contract (not a package that said reject)

    @classmethod
    def accepting(cls, message: str) -> Verdict:
        return cls(True, "", message, {}, False)

    @classmethod
    def rejecting(cls, code: str, message: str, details: Mapping[str, Any] | None = None,
               invalid: bool = False) -> Verdict:
        return cls(False, code, message, dict(details or {}), invalid)


class CaseSummaryDoc(TypedDict):
    """A case of a reported run: its correctness and accept, its primary figure with its 95 % interval."""

    test_case_id: str
    correctness: str
    accept: bool
    primary_metric: str | None
    value: float | None
    unit: str | None
    direction: str | None
    n: int | None
    lo: float | None
    hi: float | None


#: ``accept.case_summary``: a result document (None: the runner sent none) and its case metas -> its case summaries
Summarize = Callable[[BenchmarkResult | None, list[dict]], list[CaseSummaryDoc]]

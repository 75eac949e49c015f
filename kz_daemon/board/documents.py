"""The leaderboard's documents: an operator's ranking and a kernel's speed of light, as the API and pages show them.

Built from the pure maths (:mod:`kz_daemon.board.ranking`, :mod:`kz_daemon.board.roofline`)
and the facts a caller read at HEAD about each kernel (:class:`KernelFacts`: its cases'
params, desc.yaml's ``io_signature``, revoked records, submissions held for review) and the
mark an unreviewed harness puts on its index entry (``harness``: ranked only once reviewed), so
``GET /api/operators/{operator}``, ``GET /api/kernels/{kernel_id}`` and the operator page
never disagree. No I/O here: the HTTP layer reads the facts.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kz_daemon.board import ranking, roofline
from kz_daemon.core.noise import Interval
from kz_runner.contract.rules.floor import DEFAULT_CEILINGS, Ceiling

__all__ = ["KernelFacts", "ceilings_of", "interval_doc", "operator_document", "kernel_speed_of_light"]


@dataclass(frozen=True)
class KernelFacts:
    """What a ranking reads of one kernel at HEAD besides its index entry."""

    params: dict[str, dict] = field(default_factory=dict)   # case -> METAS params
    io_signature: Any = None                                # desc.yaml's io_signature
    revoked: int = 0                                        # accepted records taken back
    held: int = 0                                           # submissions waiting for an admin's review


class _Physics(Protocol):
    """``kz_daemon.guards.physics.Physics`` as :func:`ceilings_of` reads it."""

    @property
    def ceilings(self) -> Mapping[str, Ceiling]: ...


class _Config(Protocol):
    """``kz_daemon.config.settings.Config`` as :func:`ceilings_of` reads it."""

    @property
    def physics(self) -> _Physics: ...


class Configured(Protocol):
    """The daemon as :func:`ceilings_of` reads it: its ``config`` (``kz_daemon.config.ports.Daemon``).

    The config and guards wings are above this one: the protocols name what is read instead of importing them.
    """

    @property
    def config(self) -> _Config: ...


def ceilings_of(zoo: Configured) -> Mapping[str, Ceiling]:
    """The per-arch ceilings this server's physics floor uses (kz.yaml ``physics:``, else the defaults)."""
    return zoo.config.physics.ceilings or DEFAULT_CEILINGS


def interval_doc(iv: Interval | None) -> dict[str, Any] | None:
    """An interval as the API shows it: ``{value, lo, hi, n}``, or None."""
    if iv is None:
        return None
    return {"value": iv.value, "lo": iv.lo, "hi": iv.hi, "n": iv.n}


def _arch(operator: str) -> str:
    return operator.split("/", 1)[0]


def operator_document(board: ranking.OperatorRanking, facts: Mapping[str, KernelFacts],
                      ceilings: Mapping[str, Any]) -> dict[str, Any]:
    """The ranking of one operator as the API answers it (and the operator page shows it)."""
    arch = _arch(board.operator)
    ref_params = facts.get(board.reference or "", KernelFacts()).params
    cases = []
    specs: dict[str, ranking.CaseStanding] = {}
    for kernel in board.kernels:
        for cid, standing in kernel.cases.items():
            specs.setdefault(cid, standing)
    for cid in board.case_ids:
        spec = specs.get(cid)
        params = ref_params.get(cid)
        if params is None:
            params = next((f.params[cid] for f in facts.values() if cid in f.params), {})
        cases.append({"test_case_id": cid, "metric": spec.metric if spec else "", "unit": spec.unit if spec else "",
                      "direction": spec.direction if spec else "", "params": params,
                      "reference_value": spec.reference if spec else None, "scored": cid in board.scored_cases})
    kernels = []
    for kernel in board.kernels:
        fact = facts.get(kernel.kernel_id, KernelFacts())
        per_case = {}
        for cid, standing in kernel.cases.items():
            record = standing.record if isinstance(standing.record, Mapping) else {}
            per_case[cid] = {
                "best": interval_doc(standing.best), "speedup": interval_doc(standing.speedup),
                "speed_of_light": roofline.speed_of_light(standing.best, standing.unit, standing.direction,
                                                          fact.params.get(cid), fact.io_signature, arch, ceilings)
                if standing.best is not None else None,
                "commit_sha": record.get("commit_sha") if standing.best is not None else None,
                "submitter": record.get("submitter") if standing.best is not None else None,
                "recorded_at": record.get("recorded_at") if standing.best is not None else None}
        kernels.append({"kernel_id": kernel.kernel_id, "name": kernel.name, "rank": kernel.rank,
                        "approx": kernel.approx, "score": interval_doc(kernel.score), "missing": list(kernel.missing),
                        "is_reference": kernel.is_reference, "revoked": fact.revoked, "held": fact.held,
                        ranking.HARNESS: ranking.UNREVIEWED if kernel.unreviewed else ranking.REVIEWED,
                        "cases": per_case})
    return {"operator": board.operator, "arch": arch, "reference": board.reference,
            "reference_default": board.reference_default, "scored_cases": board.scored_cases,
            "cases": cases, "kernels": kernels}


def kernel_speed_of_light(entry: Mapping[str, Any], facts: KernelFacts, ceilings: Mapping[str, Any]
                          ) -> dict[str, Any]:
    """``{case: speed_of_light of its best record, or null}`` of one kernel's index entry."""
    arch = ranking.operator_of(entry).split("/", 1)[0]
    out: dict[str, Any] = {}
    for case in ranking.cases_of(entry):
        cid = str(case.get("test_case_id", ""))
        best = ranking.measured(case.get("best"))
        out[cid] = roofline.speed_of_light(best, case.get("unit"), case.get("direction"), facts.params.get(cid),
                                           facts.io_signature, arch, ceilings) if best is not None else None
    return out

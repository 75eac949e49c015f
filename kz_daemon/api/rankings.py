"""Operator rankings over HTTP: every operator's leader, one operator's ranking with its cases and speed of light.

The maths is ``kz_daemon.board`` (pure); this module gathers what it needs from the
index (the catalogue), the kernel repo at HEAD (each kernel's METAS params, desc.yaml's
``io_signature``) and the live state (submissions held for review), and turns the
result into the documents of ``GET /api/operators`` and
``GET /api/operators/{arch}/{op_class}/{sub_class}/{quant}``. The operator page
(``kz_daemon.web.operators``) renders the same document, so the page and the API
never disagree.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kz_daemon.api import views
from kz_daemon.api.spec import Op
from kz_daemon.board import ranking, roofline
from kz_daemon.core.errors import ZooError
from kz_daemon.core.noise import Interval
from kz_events.status import Status
from kz_runner.contract.rules.floor import DEFAULT_CEILINGS

__all__ = ["KernelFacts", "gather", "operator_document", "kernel_speed_of_light", "ceilings_of", "OPS"]


@dataclass(frozen=True)
class KernelFacts:
    """What a ranking reads of one kernel at HEAD besides its index entry."""

    params: dict[str, dict] = field(default_factory=dict)   # case -> METAS params
    io_signature: Any = None                                # desc.yaml's io_signature
    revoked: int = 0                                        # accepted records taken back
    held: int = 0                                           # submissions waiting for an admin's review


def ceilings_of(zoo: Any) -> Mapping[str, Any]:
    """The per-arch ceilings this server's physics floor uses (kz.yaml ``physics:``, else the defaults)."""
    physics = getattr(getattr(zoo, "config", None), "physics", None)
    return getattr(physics, "ceilings", None) or DEFAULT_CEILINGS


def held_by_kernel(zoo: Any) -> dict[str, int]:
    """How many live submissions of each kernel wait for an admin's review (status ``held``)."""
    store = getattr(zoo, "store", None)
    if store is None:
        return {}
    out: dict[str, int] = {}
    with store.lock:
        for sub in store.state.submissions.values():
            if sub.status == Status.HELD:
                out[sub.kernel_id] = out.get(sub.kernel_id, 0) + 1
    return out


def gather(history: Any, zoo: Any, kernel_ids: Sequence[str]) -> dict[str, KernelFacts]:
    """The facts of each kernel (git reads at HEAD: call it in a worker thread)."""
    held = held_by_kernel(zoo)
    out: dict[str, KernelFacts] = {}
    for kid in kernel_ids:
        if history is None:
            out[kid] = KernelFacts(held=held.get(kid, 0))
            continue
        harness = history.harness(kid)
        desc, _card = history.package_docs(kid)
        revoked = sum(1 for p in history.accepted(kid) if p.revoked)
        out[kid] = KernelFacts(dict(getattr(harness, "params", {}) or {}),
                               desc.get("io_signature") if isinstance(desc, dict) else None, revoked,
                               held.get(kid, 0))
    return out


def _interval(iv: Interval | None) -> dict[str, Any] | None:
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
                "best": _interval(standing.best), "speedup": _interval(standing.speedup),
                "speed_of_light": roofline.speed_of_light(standing.best, standing.unit, standing.direction,
                                                          fact.params.get(cid), fact.io_signature, arch, ceilings)
                if standing.best is not None else None,
                "commit_sha": record.get("commit_sha") if standing.best is not None else None,
                "submitter": record.get("submitter") if standing.best is not None else None,
                "recorded_at": record.get("recorded_at") if standing.best is not None else None}
        kernels.append({"kernel_id": kernel.kernel_id, "name": kernel.name, "rank": kernel.rank,
                        "approx": kernel.approx, "score": _interval(kernel.score), "missing": list(kernel.missing),
                        "is_reference": kernel.is_reference, "revoked": fact.revoked, "held": fact.held,
                        "cases": per_case})
    return {"operator": board.operator, "arch": arch, "reference": board.reference,
            "reference_default": board.reference_default, "scored_cases": board.scored_cases,
            "cases": cases, "kernels": kernels}


def kernel_speed_of_light(entry: Mapping[str, Any], facts: KernelFacts, ceilings: Mapping[str, Any]
                          ) -> dict[str, Any]:
    """``{case: speed_of_light of its best record, or null}`` of one kernel's index entry."""
    arch = ranking.operator_of(entry).split("/", 1)[0]
    out: dict[str, Any] = {}
    for case in views.cases(entry):
        cid = str(case.get("test_case_id", ""))
        best = ranking.measured(case.get("best"))
        out[cid] = roofline.speed_of_light(best, case.get("unit"), case.get("direction"), facts.params.get(cid),
                                           facts.io_signature, arch, ceilings) if best is not None else None
    return out


def _entries(request: Request) -> list[dict[str, Any]]:
    cat: views.Catalog = request.app.state.catalog
    cat.refresh(request.app.state.zoo.index())
    return cat.kernels()


def boards(request: Request) -> dict[str, ranking.OperatorRanking]:
    """Every operator's ranking of the current index (memoised per index version)."""
    cat: views.Catalog = request.app.state.catalog
    cat.refresh(request.app.state.zoo.index())
    return cat.memo(("rankings",), lambda: ranking.rank_all(cat.kernels()))


async def operator_doc(request: Request, operator: str) -> dict[str, Any]:
    """The document of ``operator`` (NOT_FOUND when the index has no kernel of it)."""
    board = boards(request).get(operator)
    if board is None:
        raise ZooError("NOT_FOUND", f"no operator {operator!r}; GET /api/operators lists them",
                       {"operator": operator})
    state = request.app.state
    facts = await run_in_threadpool(gather, state.history, state.zoo, [k.kernel_id for k in board.kernels])
    return operator_document(board, facts, ceilings_of(state.zoo))


async def list_operators(request: Request) -> Response:
    """GET /api/operators: every operator with its kernel counts, reference and leading kernel."""
    out = []
    for name, board in boards(request).items():
        ranked = [k for k in board.kernels if k.ranked]
        leaders = [k for k in ranked if k.rank == 1]
        out.append({"operator": name, "kernels": len(board.kernels), "ranked": len(ranked),
                    "cases": len(board.case_ids), "reference": board.reference,
                    "leaders": [k.kernel_id for k in leaders],
                    "leader_score": _interval(leaders[0].score) if leaders else None})
    return JSONResponse({"operators": out})


async def get_operator(request: Request) -> Response:
    """GET /api/operators/{arch}/{op_class}/{sub_class}/{quant}: the ranking, per-case standings, speed of light."""
    p = request.path_params
    operator = "/".join((p["arch"], p["op_class"], p["sub_class"], p["quant"]))
    return JSONResponse(views.plain(await operator_doc(request, operator)))


OPS: list[Op] = [
    Op("GET", "/api/operators", list_operators, "listOperators",
       "Every operator: kernels, reference, the leading kernel and its score", "kernels",
       responses={200: "api_operator_list"}),
    Op("GET", "/api/operators/{arch}/{op_class}/{sub_class}/{quant}", get_operator, "getOperator",
       "One operator's ranking: score, speed-up, spread and % of peak per case", "kernels",
       responses={200: "api_operator", 404: "api_error"}),
]

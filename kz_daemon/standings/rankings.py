"""Operator rankings over HTTP: every operator's leader, one operator's ranking with its cases and speed of light.

The maths and the documents are ``kz_daemon.board`` (pure); this module reads what they
need from the index (the catalogue, whose entries carry the mark of a harness that awaits
a maintainer's review: such a kernel is listed, never ranked), the kernel repo at HEAD
(each kernel's METAS params, desc.yaml's ``io_signature``, its revoked records) and the
live state (submissions held for review), and answers ``GET /api/operators`` and
``GET /api/operators/{arch}/{op_class}/{sub_class}/{quant}``. The operator page
(``kz_daemon.web.pages``) renders the same document, so the page and the API never
disagree.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kz_daemon.api import views
from kz_daemon.api.public import catalog
from kz_daemon.api.shim_settings import app_state
from kz_daemon.api.spec import Op
from kz_daemon.board import ranking
from kz_daemon.board.documents import KernelFacts, ceilings_of, interval_doc, operator_document
from kz_daemon.config.ports import Service
from kz_daemon.core.errors import ZooError
from kz_daemon.storage.history import KernelHistory
from kz_events.status import Status

__all__ = ["held_by_kernel", "gather", "boards", "operator_doc", "OPS"]


def held_by_kernel(zoo: Service) -> dict[str, int]:
    """How many live submissions of each kernel wait for an admin's review (status ``held``)."""
    store = zoo.store
    out: dict[str, int] = {}
    with store.lock:
        for sub in store.state.submissions.values():
            if sub.status == Status.HELD:
                out[sub.kernel_id] = out.get(sub.kernel_id, 0) + 1
    return out


def gather(history: KernelHistory | None, zoo: Service, kernel_ids: Sequence[str]) -> dict[str, KernelFacts]:
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
        out[kid] = KernelFacts(dict(harness.params),
                               desc.get("io_signature") if isinstance(desc, dict) else None, revoked,
                               held.get(kid, 0))
    return out


def boards(request: Request) -> dict[str, ranking.OperatorRanking]:
    """Every operator's ranking of the current index and harness reviews (memoised per index version and marks)."""
    cat: views.Catalog = catalog(request)
    return cat.memo(("rankings",), lambda: ranking.rank_all(cat.kernels()))


async def operator_doc(request: Request, operator: str) -> dict[str, Any]:
    """The document of ``operator`` (NOT_FOUND when the index has no kernel of it)."""
    board = boards(request).get(operator)
    if board is None:
        raise ZooError("NOT_FOUND", f"no operator {operator!r}; GET /api/operators lists them",
                       {"operator": operator})
    state = app_state(request)
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
                    "leader_score": interval_doc(leaders[0].score) if leaders else None})
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

"""The agent's whole loop as MCP tools: read the board and a kernel's best, validate, submit, follow.

One tool set, built on the official ``mcp`` SDK's :class:`MCPServer`, over a *backend*
that does the I/O: ``kz mcp`` (stdio) talks to a daemon over its HTTP API
(:mod:`kz_runner.tools.zoo_api`), the daemon's own ``/mcp/`` endpoint calls its service
layer (:mod:`kz_daemon.mcp.in_process`). The tools shape what either backend returns,
so both answer alike. Only the stdio server reads local paths (a package directory to
validate or submit); over HTTP a package travels as a base64 tarball.

A backend's expected failures carry ``code`` and ``message`` (``ZooError``, the HTTP
client's errors); a tool turns them into an MCP tool error whose text starts with the
code (``NOT_FOUND: ...``), with the details as JSON, so an agent can switch on it.
"""
from __future__ import annotations

import base64
import binascii
import functools
import json
import logging
from typing import Any, Protocol, runtime_checkable

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.requests import Request

from kz_daemon.api import views
from kz_daemon.web import operators
from kz_runner.contract.layout import BENCHMARK, DESC, KP
from kz_runner.contract.rules.pysource import read_metas
from kz_runner.contract.yamlio import YAMLError, load_yaml

NAME = "kernel_zoo"
INSTRUCTIONS = (
    "kernel_zoo is a GPU operator leaderboard. The loop: list_operators / list_kernels to find a kernel; "
    "get_kernel_contract for what it must compute (desc.yaml, the test cases in METAS); get_current_best "
    "for the scorecard and the source of the best accepted version; write a faster version with the same "
    "harness files; validate_package; submit_package; get_submission (wait_s long-polls) until it is "
    "terminal; get_submission_logs when it was rejected; get_ranking to see where it stands. "
    "Errors start with a stable code (e.g. NOT_FOUND, VALIDATION_ERROR, RATE_LIMITED).")
#: get_current_best inlines text files up to this many bytes in all (the rest: read_kernel_file).
MAX_INLINE_BYTES = 256 * 1024
MAX_INLINE_FILE = 64 * 1024
#: The filters the kernel list understands (desc.yaml's category fields).
CATEGORY = ("arch", "op_class", "sub_class", "quant")


class Backend(Protocol):
    """The I/O under the tools; every method is blocking (tools call them from a worker thread)."""

    #: True for the stdio server: validate and submit may name a local directory or .tar.gz.
    local_paths: bool

    def kernels(self) -> list[dict[str, Any]]:
        """Every index entry (``GET /api/kernels``' items)."""

    def kernel(self, kernel_id: str) -> dict[str, Any]:
        """``GET /api/kernels/{kernel_id}``: the index entry with ``desc`` and ``bench_result``."""

    def files(self, kernel_id: str, rev: str | None) -> dict[str, Any]:
        """``GET /api/kernels/{kernel_id}/files?rev=``."""

    def file(self, kernel_id: str, path: str, rev: str | None) -> bytes:
        """``GET /api/kernels/{kernel_id}/files/{path}?rev=``."""

    def validate(self, *, path: str | None, tarball: bytes | None) -> dict[str, Any]:
        """The validator's report (``valid``, ``problems``, ``facts``) of a package."""

    def submit(self, *, path: str | None, tarball: bytes | None, kernel_id: str | None,
               submitter: str | None, request: Request | None = None) -> dict[str, Any]:
        """``POST /api/submissions``' answer (uuid, status, kernel_id, status_url).

        ``request``: the MCP request's HTTP request (the daemon's endpoint only: its headers apply)."""

    def status(self, uuid: str, wait_s: float) -> dict[str, Any]:
        """``GET /api/submissions/{uuid}/status?wait=``."""

    def logs(self, uuid: str) -> dict[str, Any]:
        """``GET /api/submissions/{uuid}/logs``."""


@runtime_checkable
class ExpectedFailure(Protocol):
    """What a backend raises for an expected failure: ``kz_daemon.core.errors.ZooError`` in the daemon,
    ``kz_runner.tools.zoo_api.ZooApiError`` in ``kz mcp`` (a module this wing does not import)."""

    #: the stable error code (e.g. NOT_FOUND)
    code: str
    message: str
    details: dict[str, Any]


def _failure(exc: BaseException) -> ToolError | None:
    """A tool error for an expected failure (an :class:`ExpectedFailure` with a ``code``), None for a bug."""
    if not isinstance(exc, ExpectedFailure) or not isinstance(exc.code, str) or not exc.code:
        return None
    text = f"{exc.code}: {exc.message or exc}"
    details = exc.details
    if details:
        text += "\ndetails: " + json.dumps(details, ensure_ascii=False, default=str)[:8000]
    return ToolError(text)


async def call(fn, *args: Any, **kwargs: Any) -> Any:
    """Run a blocking backend call in a worker thread; expected failures become tool errors."""
    try:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
    except Exception as exc:
        failure = _failure(exc)
        if failure is None:
            raise
        raise failure from None


def _tarball(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise ToolError("BAD_REQUEST: tarball_base64 is not base64 (standard alphabet, padded)") from None


def _text_or_base64(data: bytes) -> dict[str, Any]:
    try:
        if b"\x00" in data:
            raise UnicodeDecodeError("utf-8", data, 0, 1, "NUL byte")
        return {"encoding": "utf-8", "text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"encoding": "base64", "base64": base64.b64encode(data).decode("ascii")}


def kernel_summary(entry: dict[str, Any]) -> dict[str, Any]:
    """An index entry as the kernel list shows it: id, name, status and each case's best."""
    cases = []
    for case in views.cases(entry):
        best = case.get("best")
        cases.append({"test_case_id": case.get("test_case_id"), "primary_metric": case.get("primary_metric"),
                      "unit": case.get("unit"), "direction": case.get("direction"),
                      "best": operators.measured_value(best),
                      "best_by": best.get("submitter") if isinstance(best, dict) else None})
    return {"kernel_id": entry.get("kernel_id"), "name": entry.get("name"), "operator": operators.key_of(entry).path,
            "status": views.status_of(entry), "valid": views.is_valid(entry), "cases": cases}


def operator_list(entries: list[dict[str, Any]], filters: dict[str, str]) -> list[dict[str, Any]]:
    """The operators (arch/op_class/sub_class/quant) with their implementations and leader."""
    out = []
    for key, members in operators.group(entries).items():
        if any(value and getattr(key, name) != value for name, value in filters.items()):
            continue
        summary = operators.summarise(key, members)
        out.append({"operator": key.path, "implementations": summary.implementations,
                    "measured": summary.measured, "cases": summary.cases, "leader": summary.leader,
                    "leads": summary.leads, "reference": summary.reference,
                    "kernels": [str(e.get("kernel_id")) for e in members]})
    return out


def ranking(entries: list[dict[str, Any]], operator: str) -> dict[str, Any]:
    """Each case's ranking of the operator's implementations (best record of the primary metric)."""
    parts = operator.strip("/").split("/")
    if len(parts) < 4:
        raise ToolError(f"BAD_REQUEST: operator must be arch/op_class/sub_class/quant, got {operator!r}")
    key = operators.OperatorKey(*parts[:4])
    members = operators.group(entries).get(key)
    if not members:
        raise ToolError(f"NOT_FOUND: no operator {key.path!r}; list_operators lists them")
    reference = operators.reference_of(members)
    boards = []
    for board in operators.boards(members, reference):
        boards.append({"test_case_id": board.case_id, "metric": board.metric, "unit": board.unit,
                       "direction": board.direction, "reference_value": board.reference_value,
                       "standings": [{"rank": s.rank, "kernel_id": s.kernel_id, "value": s.value,
                                      "speedup": s.speedup, "submitter": s.record.get("submitter"),
                                      "commit_sha": s.record.get("commit_sha"), "is_reference": s.is_reference,
                                      "correctness": s.correctness} for s in board.standings]})
    return {"operator": key.path, "reference": reference, "cases": boards}


def build_server(backend: Backend, *, name: str = NAME) -> MCPServer:
    """The MCP server with every tool over ``backend``."""
    # The SDK's constructor calls logging.basicConfig(INFO) with its own handler, which would turn on
    # every library's INFO lines in the daemon's output; a handler already on the root logger makes
    # basicConfig a no-op, so the process keeps the logging it had.
    root = logging.getLogger()
    placeholder = logging.NullHandler()
    root.addHandler(placeholder)
    try:
        server = MCPServer(name, instructions=INSTRUCTIONS)
    finally:
        root.removeHandler(placeholder)

    @server.tool()
    async def list_operators(arch: str = "", op_class: str = "", sub_class: str = "", quant: str = "") -> dict[str, Any]:
        """The operators (arch/op_class/sub_class/quant), each with its implementations, the kernel that
        leads the most test cases and the reference implementation. Empty filters match everything."""
        entries = await call(backend.kernels)
        filters = {"arch": arch, "op_class": op_class, "sub_class": sub_class, "quant": quant}
        return {"operators": operator_list(entries, filters)}

    @server.tool()
    async def list_kernels(arch: str = "", op_class: str = "", sub_class: str = "", quant: str = "",
                           q: str = "") -> dict[str, Any]:
        """The kernels (packages) of the zoo with their status and each test case's best value; filter by
        category fields and ``q`` (text in kernel_id, name, summary, tags)."""
        entries = await call(backend.kernels)
        filters = {"arch": arch, "op_class": op_class, "sub_class": sub_class, "quant": quant}
        chosen = [kernel_summary(e) for e in entries if views.matches(e, filters, q.strip())]
        return {"kernels": chosen, "total": len(chosen)}

    @server.tool()
    async def get_kernel_contract(kernel_id: str) -> dict[str, Any]:
        """What a kernel must compute and how it is judged: desc.yaml (parsed and as text) and the test
        cases (KERNEL_ZOO_TEST_CASE_METAS of its benchmark.py). A submission must keep desc.yaml,
        build_test_env.py and benchmark.py exactly as they are (the locked harness)."""
        desc_raw = await call(backend.file, kernel_id, f"{KP}/{DESC}", None)
        bench_raw = await call(backend.file, kernel_id, f"{KP}/{BENCHMARK}", None)
        try:
            desc = load_yaml(desc_raw)
        except (YAMLError, ValueError):
            desc = None
        metas, problems = read_metas(bench_raw)
        return {"kernel_id": kernel_id, "desc": views.plain(desc) if isinstance(desc, dict) else None,
                "desc_yaml": desc_raw.decode("utf-8", "replace"), "metas": views.plain(metas),
                "metas_problems": [p.to_json() for p in problems],
                "harness_files": [f"{KP}/{DESC}", f"{KP}/build_test_env.py", f"{KP}/{BENCHMARK}"]}

    @server.tool()
    async def get_current_best(kernel_id: str, rev: str = "") -> dict[str, Any]:
        """The kernel's scorecard (bench_result.yaml: best and current record per case) and its package
        files at a record (HEAD, the current best, by default; ``rev`` a commit SHA or prefix). Text files
        are inlined up to 256 KiB in all; read_kernel_file reads any other."""
        doc = await call(backend.kernel, kernel_id)
        listing = await call(backend.files, kernel_id, rev or None)
        budget = MAX_INLINE_BYTES
        files = []
        for entry in listing.get("files") or []:
            item = {"path": entry.get("path"), "size": entry.get("size")}
            size = int(entry.get("size") or 0)
            if size <= MAX_INLINE_FILE and size <= budget:
                data = await call(backend.file, kernel_id, str(entry.get("path")), listing.get("commit"))
                content = _text_or_base64(data)
                if content["encoding"] == "utf-8":
                    item["text"] = content["text"]
                    budget -= size
            files.append(item)
        return {"kernel_id": kernel_id, "commit": listing.get("commit"), "record": listing.get("record"),
                "cases": kernel_summary(doc)["cases"], "bench_result": doc.get("bench_result"),
                "files": files, "tarball_url": listing.get("tarball_url")}

    @server.tool()
    async def read_kernel_file(kernel_id: str, path: str, rev: str = "") -> dict[str, Any]:
        """One file of a kernel's package (path inside the package, e.g. src/kernel.cu) at a record
        (HEAD by default): UTF-8 text, or base64 for a binary file."""
        data = await call(backend.file, kernel_id, path, rev or None)
        return {"kernel_id": kernel_id, "path": path, "size": len(data), **_text_or_base64(data)}

    if backend.local_paths:
        @server.tool()
        async def validate_package(path: str = "", tarball_base64: str = "") -> dict[str, Any]:
            """Check a package without running it (what `kz validate` checks, the static rules included):
            ``path`` is a package directory or a .tar.gz on this machine; or send ``tarball_base64``."""
            if bool(path) == bool(tarball_base64):
                raise ToolError("BAD_REQUEST: give exactly one of path and tarball_base64")
            return await call(backend.validate, path=path or None,
                              tarball=_tarball(tarball_base64) if tarball_base64 else None)

        @server.tool()
        async def submit_package(path: str = "", tarball_base64: str = "", kernel_id: str = "",
                                 submitter_id: str = "") -> dict[str, Any]:
            """Submit a package (``path``: a directory or .tar.gz on this machine, validated and packed as
            `kz submit` does; or ``tarball_base64``). Answers once the server queued it: follow it with
            get_submission."""
            if bool(path) == bool(tarball_base64):
                raise ToolError("BAD_REQUEST: give exactly one of path and tarball_base64")
            return await call(backend.submit, path=path or None,
                              tarball=_tarball(tarball_base64) if tarball_base64 else None,
                              kernel_id=kernel_id or None, submitter=submitter_id or None)
    else:  # the HTTP endpoint's tools take other arguments than the local ones above
        @server.tool()
        async def validate_package(tarball_base64: str) -> dict[str, Any]:  # type: ignore[misc]
            """Check a package tarball (base64 of the .tar.gz `kz pack` writes) without running it: the
            checks intake applies, the static rules included."""
            return await call(backend.validate, path=None, tarball=_tarball(tarball_base64))

        @server.tool()
        async def submit_package(tarball_base64: str, ctx: Context, kernel_id: str = "",  # type: ignore[misc]
                                 submitter_id: str = "") -> dict[str, Any]:
            """Submit a package tarball (base64 of the .tar.gz; its top folder is the kernel_id). The HTTP
            request's Authorization and X-Submitter-Id headers apply as for POST /api/submissions. Answers
            once the server queued it: follow it with get_submission."""
            return await call(backend.submit, path=None, tarball=_tarball(tarball_base64),
                              kernel_id=kernel_id or None, submitter=submitter_id or None,
                              request=ctx.request_context.request)

    @server.tool()
    async def get_submission(uuid: str, wait_s: float = 0.0) -> dict[str, Any]:
        """A submission's status document: status, reasons (each with a code and a fix hint), the result
        and per-case values once run, the commit once accepted. ``wait_s`` (up to 60) waits for a change."""
        return await call(backend.status, uuid, max(0.0, min(60.0, float(wait_s))))

    @server.tool()
    async def get_submission_logs(uuid: str) -> dict[str, Any]:
        """The run's log tails (build_test_env.py and benchmark.py stderr) and the runner's failure."""
        return await call(backend.logs, uuid)

    @server.tool()
    async def get_ranking(operator: str) -> dict[str, Any]:
        """Each test case's ranking of an operator's implementations (``arch/op_class/sub_class/quant``, or
        a kernel_id): rank, best value, speed-up over the reference, who holds it."""
        entries = await call(backend.kernels)
        return ranking(entries, operator)

    return server

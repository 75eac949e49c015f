"""The API's route table (apispec) and /openapi.json built from it (openapi).

Paths and parameters, the kernel_id rule in the document, the routes against
docs/api_reference.md, and a bounded schemathesis fuzz (no 5xx).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import requests
from hypothesis import HealthCheck, given, settings

from kz_daemon.api import openapi
from kz_daemon.api.spec import Op, routes
from kz_daemon.http.app import api_ops
from kz_runner.contract.kernel_id import KERNEL_ID_PATTERN, MAX_KERNEL_ID_BYTES
from tests.helpers.http_server import CPU_AXPY, LiveServer

DOC = Path(__file__).resolve().parents[1] / "docs" / "api_reference.md"
DOC_ROUTE = re.compile(r"^#{2,4} `(GET|POST|PUT|DELETE|PATCH) (/[^`]*)`", re.MULTILINE)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = LiveServer.start(tmp_path_factory.mktemp("fuzz"), kernels=[CPU_AXPY],
                              settings={"claim_max_wait_s": 0.2, "status_max_wait_s": 0.2,
                                        "submit_burst": 100_000, "intake_wait_s": 5.0})
    yield server
    server.stop()


def _endpoint(request):
    raise AssertionError("never called")


def test_paths_and_path_parameters_in_openapi_syntax():
    op = Op("GET", "/api/kernels/{kernel_id:path}/history/{n}", _endpoint, "k", "a kernel", "kernels")
    assert op.openapi_path == "/api/kernels/{kernel_id}/history/{n}"
    assert op.path_params == ["kernel_id", "n"]
    assert Op("GET", "/healthz", _endpoint, "h", "health", "ops").path_params == []


def test_routes_are_one_per_operation():
    ops = [Op("GET", "/x/{uuid}", _endpoint, "get_x", "x", "t"),
           Op("POST", "/x/{uuid}", _endpoint, "post_x", "x", "t")]
    built = routes(ops)
    assert [(r.path, r.methods - {"HEAD"}, r.name) for r in built] == [
        ("/x/{uuid}", {"GET"}, "get_x"), ("/x/{uuid}", {"POST"}, "post_x")]


def test_kernel_id_parameter_carries_the_one_rule():
    doc = openapi.build(api_ops(), "test")
    params = [p for methods in doc["paths"].values() for operation in methods.values()
              for p in operation.get("parameters", []) if p["name"] == "kernel_id"]
    assert params
    for p in params:  # a path parameter, or the filter of GET /api/submissions
        assert (p["in"], p["required"]) in (("path", True), ("query", False))
        assert p["schema"] == {"type": "string", "minLength": 1, "maxLength": MAX_KERNEL_ID_BYTES,
                               "pattern": KERNEL_ID_PATTERN}
    pattern = re.compile(KERNEL_ID_PATTERN)
    assert pattern.search("cpu/Elementwise/Axpy/fp32/impl")
    for bad in ("cpu/x/.git", "cpu/x/..", "cpu/x\n", "/".join(["a"] * 17), "cpu/" + "k" * 101):
        assert not pattern.search(bad), bad


def test_auth_becomes_security_requirements():
    doc = openapi.build(api_ops(), "test")
    by_id = {op["operationId"]: op for methods in doc["paths"].values() for op in methods.values()}
    for op in api_ops():
        security = by_id[op.operation_id].get("security")
        if op.auth == "runner":
            assert security == [{"runnerToken": []}], op.operation_id
        elif op.auth == "submitter":
            assert security == [{}, {"submitterToken": []}], op.operation_id
        elif op.auth == "admin":
            assert security == [{"adminToken": []}], op.operation_id
    # revoking needs an admin token; the spec must not present it as open
    assert by_id["revokeSubmission"]["security"] == [{"adminToken": []}]
    for review in ("listReviews", "approveReview", "rejectReview"):  # admin-only handlers
        assert by_id[review]["security"] == [{"adminToken": []}], review
    upload = by_id["createSubmission"]
    assert "Idempotency-Key" in [p["name"] for p in upload["parameters"] if p["in"] == "header"]
    assert doc["components"]["securitySchemes"]["adminToken"] == {
        "type": "http", "scheme": "bearer", "description": "an admin token"}


def _documented() -> set[tuple[str, str]]:
    return set(DOC_ROUTE.findall(DOC.read_text(encoding="utf-8")))


def test_docs_list_exactly_the_routes():
    served = {(op.method, op.openapi_path) for op in api_ops()}
    documented = _documented()
    assert served - documented == set(), f"routes missing from docs/api_reference.md: {served - documented}"
    assert documented - served == set(), f"documented but not served: {documented - served}"


def test_docs_are_bilingual_and_name_every_error_code():
    text = DOC.read_text(encoding="utf-8")
    assert "## 中文" in text or "中文" in text
    for code in ("VALIDATION_ERROR", "NOT_FOUND", "CONFLICT", "UNAUTHORIZED", "FORBIDDEN", "LEASE_LOST",
                 "PAYLOAD_TOO_LARGE", "RESULT_INVALID", "RATE_LIMITED"):
        assert code in text, code
    # the guide's §7 curl line, unchanged apart from the server
    assert '-F "package=@package.tar.gz;type=application/gzip"' in text


def test_every_api_route_is_in_the_table(live):
    from starlette.routing import Route

    ops = {(op.method, op.path) for op in api_ops()}
    for route in live.app.routes:
        if isinstance(route, Route) and not route.name.startswith("page_"):
            for method in route.methods - {"HEAD"}:
                assert (method, route.path) in ops, (method, route.path)


def test_openapi_document_loads_in_schemathesis(live):
    import schemathesis

    spec = requests.get(live.url + "/openapi.json", timeout=10).json()
    assert spec == live.app.state.openapi
    schema = schemathesis.openapi.from_dict(spec)
    operations = [op.ok() for op in schema.get_all_operations()]
    assert {(o.method.upper(), o.path) for o in operations} == {(op.method, op.openapi_path) for op in api_ops()}


def test_fuzz_finds_no_server_errors(live):
    """Schema-driven requests (bounded: 12 examples per operation) never get a 5xx."""
    import schemathesis

    schema = schemathesis.openapi.from_dict(live.app.state.openapi)
    session = requests.Session()
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        token = live.tokens["runner:r1"] if "runner" in operation.tags else None
        headers = {"Authorization": f"Bearer {token}"} if token else {}

        @settings(max_examples=12, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def run(case):
            response = case.call(base_url=live.url, session=session, headers=headers,  # noqa: B023 (run now)
                                 timeout=30)
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path} -> {response.status_code}: "
                                f"{response.text[:200]}")

        run()
    assert failures == []
    # the server is still healthy afterwards
    assert session.get(live.url + "/healthz", timeout=10).status_code == 200

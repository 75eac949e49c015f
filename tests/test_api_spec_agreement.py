"""Where the served API and its published schemas disagreed: an empty failure object, the claim's
gpu field, a repeated query parameter. Each case is checked against both the schema and the server."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.helpers.http_server import CPU_AXPY, LiveServer

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = LiveServer.start(tmp_path_factory.mktemp("spec"), kernels=[CPU_AXPY])
    yield server
    server.stop()


def _valid(schema_name: str, doc) -> bool:
    try:
        jsonschema.validate(doc, json.loads((SCHEMAS / f"{schema_name}.json").read_text()))
    except jsonschema.ValidationError:
        return False
    return True


def test_an_empty_failure_object_is_refused_by_schema_and_server(live):
    body = {"lease_id": "x", "result": None, "failure": {}}
    assert not _valid("api_result_request", body)
    assert _valid("api_result_request", dict(body, failure={"code": "BUILD_FAILED", "message": "m"}))
    with live.client("runner:r1") as r1:
        resp = r1.post("/api/submissions/00000000-0000-4000-8000-000000000000/result", json=body)
        assert resp.status_code == 400 and resp.json()["error"]["details"]["field"] == "failure"


def test_the_claims_gpu_is_a_string_or_an_index(live):
    for gpu in ("0", 1):
        assert _valid("api_claim_request", {"arch": "sm_90", "gpu": gpu})
    assert not _valid("api_claim_request", {"arch": "sm_90", "gpu": [0]})
    with live.client("runner:r1") as r1:
        assert r1.post("/api/runner/claim", json={"arch": "gfx999", "wait": 0, "gpu": 3}).status_code == 204
        assert live.client().get("/api/queue").json()["runners"]["r1"]["gpu"] == "3"
        resp = r1.post("/api/runner/claim", json={"arch": "gfx999", "wait": 0, "gpu": [0]})
        assert resp.status_code == 400 and resp.json()["error"]["details"]["field"] == "gpu"


def test_a_repeated_query_parameter_is_400_not_silently_one_of_them(live):
    with live.client() as http:
        resp = http.get("/api/kernels", params=[("per_page", "1"), ("per_page", "50")])
        assert resp.status_code == 400 and resp.json()["error"]["details"]["parameter"] == "per_page"
        assert http.get("/api/kernels", params={"per_page": "1"}).status_code == 200

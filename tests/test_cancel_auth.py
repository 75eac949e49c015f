"""Who may cancel a submission: its submitter's token or an admin; under the open policy the
same X-Submitter-Id, and never a header alone for an id bound to a token."""
from __future__ import annotations

import pytest

from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball


@pytest.fixture(scope="module")
def open_policy(tmp_path_factory):
    server = LiveServer.start(tmp_path_factory.mktemp("cancel"), kernels=[CPU_AXPY],
                              settings={"submit_burst": 100})
    yield server
    server.stop()


def _submit(server, client, submitter):
    resp = server.submit(client, CPU_AXPY, package_tarball(CPU_AXPY), submitter=submitter)
    assert resp.status_code == 202, resp.text
    return resp.json()["uuid"]


def _cancel(client, uuid, submitter=None):
    headers = {"X-Submitter-Id": submitter} if submitter else {}
    return client.post(f"/api/submissions/{uuid}/cancel", json={}, headers=headers)


def test_a_header_alone_cannot_cancel_for_an_id_bound_to_a_token(open_policy):
    with open_policy.client("submitter:alice") as alice, open_policy.client() as anon:
        uuid = _submit(open_policy, alice, "alice")
        resp = _cancel(anon, uuid, "alice")
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "FORBIDDEN"
        assert "token" in resp.json()["error"]["message"]
        assert anon.get(f"/api/submissions/{uuid}/status").json()["status"] != "cancelled"
        resp = _cancel(alice, uuid)
        assert resp.status_code == 200 and resp.json()["status"] == "cancelled"


def test_open_policy_needs_the_same_submitter_id(open_policy):
    with open_policy.client() as anon:
        uuid = _submit(open_policy, anon, "bob")
        assert _cancel(anon, uuid).status_code == 403
        assert _cancel(anon, uuid, "mallory").status_code == 403
        resp = _cancel(anon, uuid, "bob")
        assert resp.status_code == 200 and resp.json()["status"] == "cancelled"


def test_another_submitters_token_cannot_cancel_but_an_admin_can(open_policy):
    with open_policy.client() as anon, open_policy.client("submitter:alice") as alice, \
            open_policy.client("admin") as admin:
        uuid = _submit(open_policy, anon, "carol")
        assert _cancel(alice, uuid).status_code == 403
        resp = _cancel(admin, uuid)
        assert resp.status_code == 200 and resp.json()["status"] == "cancelled"


def test_a_body_that_is_not_an_object_is_400(open_policy):
    with open_policy.client() as anon:
        uuid = _submit(open_policy, anon, "dave")
        resp = anon.post(f"/api/submissions/{uuid}/cancel", content=b"[1]",
                         headers={"X-Submitter-Id": "dave", "Content-Type": "application/json"})
        assert resp.status_code == 400
        spec = anon.get("/openapi.json").json()
        assert "400" in spec["paths"]["/api/submissions/{uuid}/cancel"]["post"]["responses"]


def test_token_policy_refuses_a_cancel_without_a_token(tmp_path):
    server = LiveServer.start(tmp_path, kernels=[CPU_AXPY], settings={"submissions_require_token": True})
    try:
        with server.client("submitter:alice") as alice, server.client() as anon:
            uuid = _submit(server, alice, "alice")
            assert _cancel(anon, uuid, "alice").status_code == 401
            assert _cancel(alice, uuid).status_code == 200
    finally:
        server.stop()

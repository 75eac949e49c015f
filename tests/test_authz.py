"""Who may call what (kz_daemon/api/authz.py): each principal kind against runner and submission routes."""
from __future__ import annotations

import pytest
from starlette.requests import Request

from kz_daemon.api import authz
from kz_daemon.api.shim_settings import ShimSettings
from kz_daemon.config.tokens import Principal, TokenStore
from kz_daemon.core.errors import ZooError
from kz_daemon.http.app import create_app
from tests.helpers.http_server import CPU_AXPY, package_tarball
from tests.helpers.live_api import api_error, live_server

live = live_server("authz")


@pytest.fixture()
def tokens(tmp_path):
    store = TokenStore(tmp_path / "auth.yaml")
    # the app's typed state (authz reads it with app_state), with and without the token policy
    apps = {need: create_app(object(), store, ShimSettings(submissions_require_token=need)) for need in (False, True)}
    return {"store": store, "apps": apps, "runner": store.issue("runner", "gpu-0"),
            "submitter": store.issue("submitter", "alice"), "admin": store.issue("admin", "admin")}


def _request(tokens, token=None, submitter=None, require_token=False) -> Request:
    """A request as the authz functions see it: headers and the app's token store and settings."""
    headers = []
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    if submitter is not None:
        headers.append((b"x-submitter-id", submitter.encode()))
    app = tokens["apps"][require_token]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers, "app": app})


def _code(call) -> str:
    with pytest.raises(ZooError) as info:
        call()
    return info.value.code


def test_runner_routes_take_runner_tokens_only(tokens):
    assert authz.require_runner(_request(tokens, tokens["runner"])) == "gpu-0"
    assert _code(lambda: authz.require_runner(_request(tokens))) == "UNAUTHORIZED"
    assert _code(lambda: authz.require_runner(_request(tokens, "unknown"))) == "UNAUTHORIZED"
    for kind in ("submitter", "admin"):
        assert _code(lambda k=kind: authz.require_runner(_request(tokens, tokens[k]))) == "FORBIDDEN", kind


def test_submission_routes_by_principal(tokens):
    assert authz.header_submitter(_request(tokens, submitter="bob")) == (None, "bob")
    assert _code(lambda: authz.header_submitter(_request(tokens, require_token=True))) == "UNAUTHORIZED"
    assert _code(lambda: authz.header_submitter(_request(tokens, tokens["runner"]))) == "FORBIDDEN"
    alice = Principal("submitter", "alice")
    assert authz.header_submitter(_request(tokens, tokens["submitter"], require_token=True)) == (alice, "alice")
    assert _code(lambda: authz.header_submitter(_request(tokens, tokens["submitter"], "bob"))) == "FORBIDDEN"
    admin = Principal("admin", "admin")
    assert authz.header_submitter(_request(tokens, tokens["admin"], "bob")) == (admin, "bob")  # as anyone
    for bound in ("alice", "admin"):  # ids a submitter or admin token is bound to: not without it
        assert _code(lambda b=bound: authz.header_submitter(_request(tokens, submitter=b))) == "SUBMITTER_ID_BOUND"
    assert _code(lambda: authz.header_submitter(_request(tokens, submitter="no spaces"))) == "VALIDATION_ERROR"


def test_final_submitter_reconciles_token_header_and_field(tokens):
    alice = Principal("submitter", "alice")
    bound = tokens["store"].bound
    assert authz.final_submitter(alice, "alice", None, bound=bound) == "alice"
    assert _code(lambda: authz.final_submitter(alice, "alice", "bob", bound=bound)) == "FORBIDDEN"
    assert authz.final_submitter(None, "bob", "bob", bound=bound) == "bob"
    assert _code(lambda: authz.final_submitter(None, "bob", "carol", bound=bound)) == "FORBIDDEN"
    assert authz.final_submitter(None, None, "carol", bound=bound) == "carol"
    assert authz.final_submitter(Principal("admin", "admin"), None, "", bound=bound) == "admin"
    assert _code(lambda: authz.final_submitter(None, None, None, bound=bound)) == "VALIDATION_ERROR"
    # an id a token is bound to: the form field alone cannot name it without that token
    assert _code(lambda: authz.final_submitter(None, None, "alice", bound=bound)) == "SUBMITTER_ID_BOUND"
    assert authz.final_submitter(Principal("admin", "admin"), None, "alice", bound=bound) == "alice"


def test_runner_auth(anon, live):
    api_error(anon.post("/api/runner/claim", json={"arch": "cpu", "wait": 0}), 401, "UNAUTHORIZED")
    with live.client("nope") as bad:
        api_error(bad.post("/api/runner/claim", json={"arch": "cpu", "wait": 0}), 401, "UNAUTHORIZED")
    with live.client(headers={"Authorization": "Basic abc"}) as basic:
        api_error(basic.post("/api/runner/claim", json={"arch": "cpu", "wait": 0}), 401, "UNAUTHORIZED")
    with live.client("submitter:alice") as alice:
        api_error(alice.post("/api/runner/claim", json={"arch": "cpu", "wait": 0}), 403, "FORBIDDEN")
    api_error(anon.get("/api/runner/package/x"), 401, "UNAUTHORIZED")
    api_error(anon.post("/api/runner/lease/x/renew", json={"lease_id": "y"}), 401, "UNAUTHORIZED")
    api_error(anon.post("/api/submissions/x/result", json={"lease_id": "y"}), 401, "UNAUTHORIZED")


def test_submitter_token_must_match_header(live):
    data = package_tarball(CPU_AXPY)
    with live.client("submitter:alice") as alice:
        api_error(live.submit(alice, CPU_AXPY, data, submitter="bob"), 403, "FORBIDDEN")
    with live.client("bogus-token") as bogus:
        api_error(live.submit(bogus, CPU_AXPY, data), 401, "UNAUTHORIZED")
    with live.client("runner:r1") as runner:
        api_error(live.submit(runner, CPU_AXPY, data), 403, "FORBIDDEN")

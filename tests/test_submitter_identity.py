"""A submitter id bound to a token is usable with that token only, and nobody can spend another's allowance.

Red-team findings, each sent through a real daemon over HTTP on 127.0.0.1:

- impersonation: after ``kz token issue submitter alice``, a client without a token
  uploaded with ``X-Submitter-Id: alice`` (or the form field) and was credited as alice;
- lock-out: 20 anonymous junk posts naming alice used up her rate allowance (the limit
  was charged to the named id before anything was checked), so her own token upload got
  429. Now a token holder is charged to her own bucket only, a request without a token
  to its client address only.
"""
from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from kz_daemon.config.tokens import TokenStore
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball
from tests.helpers.live_api import api_error
from tests.helpers.submissions import every

LIMITS = {"submit_burst": 3, "submit_rate_per_s": 0.001,
          "submit_burst_per_address": 3, "submit_rate_per_address_per_s": 0.001}
#: a second loopback address: a client the server tells apart from 127.0.0.1
OTHER_ADDRESS = "127.0.0.2"


def _count(server) -> int:
    return len(every(server.zoo.store))


def _upload(client: httpx.Client, *, header: str | None = None, field: str | None = None) -> httpx.Response:
    headers = {"X-Submitter-Id": header} if header is not None else {}
    data = {"kernel_id": CPU_AXPY}
    if field is not None:
        data["submitter_id"] = field
    return client.post("/api/submissions", headers=headers, data=data,
                       files={"package": ("package.tar.gz", package_tarball(CPU_AXPY), "application/gzip")})


def _junk(client: httpx.Client, submitter: str | None = None) -> httpx.Response:
    """A post that is refused after identity and the rate limits (not multipart): no upload needed."""
    headers = {"X-Submitter-Id": submitter} if submitter else {}
    return client.post("/api/submissions", json={}, headers=headers)


def _from(server: LiveServer, address: str, token: str | None = None) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=address)
    headers = {"Authorization": f"Bearer {server.tokens.get(token, token)}"} if token else {}
    return httpx.Client(base_url=server.url, transport=transport, headers=headers, timeout=60)


@pytest.fixture(scope="module")
def open_zoo(tmp_path_factory):
    server = LiveServer.start(tmp_path_factory.mktemp("identity"), kernels=[CPU_AXPY],
                              settings={"submit_burst": 100})
    yield server
    server.stop()


def test_a_header_naming_a_token_bound_id_without_the_token_is_refused(open_zoo):
    before = _count(open_zoo)
    with open_zoo.client() as anon:
        error = api_error(_upload(anon, header="alice", field="alice"), 403, "SUBMITTER_ID_BOUND")
    assert "token" in error["message"] and error["details"]["submitter_id"] == "alice"
    assert _count(open_zoo) == before  # nothing was spooled or recorded


def test_the_form_field_alone_cannot_name_it_either(open_zoo):
    before = _count(open_zoo)
    with open_zoo.client() as anon:
        error = api_error(_upload(anon, field="alice"), 403, "SUBMITTER_ID_BOUND")
    assert error["details"]["field"] == "submitter_id"
    assert _count(open_zoo) == before


def test_an_admins_id_is_bound_too(open_zoo):
    with open_zoo.client() as anon:
        api_error(_upload(anon, header="root"), 403, "SUBMITTER_ID_BOUND")


def test_the_token_submits_as_its_id_and_unbound_ids_stay_open(open_zoo):
    with open_zoo.client("submitter:alice") as alice:
        resp = _upload(alice, header="alice", field="alice")
    assert resp.status_code == 202, resp.text
    assert open_zoo.zoo.submission(resp.json()["uuid"]).submitter_id == "alice"
    with open_zoo.client() as anon:  # the open policy: an id nobody holds a token for
        resp = _upload(anon, header="walter", field="walter")
    assert resp.status_code == 202, resp.text
    assert open_zoo.zoo.submission(resp.json()["uuid"]).submitter_id == "walter"


def test_a_token_issued_while_serving_binds_the_id_at_once(open_zoo):
    with open_zoo.client() as anon:
        assert _upload(anon, header="dora").status_code == 202
    done = subprocess.run([sys.executable, "-m", "kz_daemon", "token", "--state-dir", str(open_zoo.state_dir),
                           "issue", "submitter", "dora"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    with open_zoo.client() as anon:
        api_error(_upload(anon, header="dora"), 403, "SUBMITTER_ID_BOUND")
    with open_zoo.client(done.stdout.strip()) as dora:
        assert _upload(dora, header="dora").status_code == 202


@pytest.fixture
def tight(tmp_path):
    server = LiveServer.start(tmp_path, kernels=[CPU_AXPY], settings=LIMITS)
    server.tokens["submitter:bob"] = TokenStore(server.state_dir / "auth.yaml").issue("submitter", "bob")
    yield server
    server.stop()


def test_junk_posts_naming_alice_do_not_lock_her_out(tight):
    with tight.client() as anon:
        for _ in range(20):  # the header: refused before anything is charged
            api_error(_junk(anon, "alice"), 403, "SUBMITTER_ID_BOUND")
        codes = [_upload(anon, field="alice").status_code for _ in range(20)]  # the form field only
    assert set(codes) <= {403, 429} and 429 in codes  # charged to the sender's address, never to alice
    with tight.client("submitter:alice") as alice:
        resp = _upload(alice, header="alice", field="alice")
    assert resp.status_code == 202, resp.text
    assert tight.zoo.submission(resp.json()["uuid"]).submitter_id == "alice"


def test_an_anonymous_flood_is_limited_by_address_and_another_client_is_not(tight):
    with tight.client() as flood:
        codes = [_junk(flood, f"id{i}").status_code for i in range(6)]
        assert codes == [400, 400, 400, 429, 429, 429]
        last = _junk(flood, "fresh")
        assert last.json()["error"]["details"]["scope"] == "address" and int(last.headers["Retry-After"]) > 0
    with _from(tight, OTHER_ADDRESS) as other:  # another client, no token
        assert _junk(other, "someone").status_code == 400
        assert _upload(other, header="walter").status_code == 202
    with tight.client("submitter:bob") as bob:  # a token holder on the flooded address
        assert _upload(bob, header="bob").status_code == 202


def test_a_token_holder_spends_her_own_bucket_only(tight):
    with tight.client("submitter:alice") as alice:
        codes = [_junk(alice).status_code for _ in range(4)]
        assert codes == [400, 400, 400, 429]
        details = _junk(alice).json()["error"]["details"]
        assert details["scope"] == "submitter" and details["submitter_id"] == "alice"
    with tight.client("submitter:bob") as bob:
        assert _junk(bob).status_code == 400
    with tight.client() as anon:
        assert _junk(anon, "walter").status_code == 400

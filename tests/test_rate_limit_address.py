"""The per-address submission limit beside the per-submitter one, and X-Forwarded-For only
from trusted proxies."""
from __future__ import annotations

import pytest

from kz_daemon.config.settings import Config
from kz_daemon.core.errors import ZooError
from tests.helpers.http_server import CPU_AXPY, LiveServer

LIMITS = {"submit_burst": 3, "submit_rate_per_s": 0.001,
          "submit_burst_per_address": 3, "submit_rate_per_address_per_s": 0.001}


def _post(client, submitter, forwarded=None):
    # not multipart: refused with 400 after the rate limits, so no upload is needed
    headers = {"X-Submitter-Id": submitter}
    if forwarded:
        headers["X-Forwarded-For"] = forwarded
    return client.post("/api/submissions", json={}, headers=headers)


@pytest.fixture
def direct(tmp_path):
    server = LiveServer.start(tmp_path, kernels=[CPU_AXPY], settings=LIMITS)
    yield server
    server.stop()


def test_one_address_cannot_spread_its_uploads_over_many_ids(direct):
    with direct.client() as http:
        assert [_post(http, f"id{i}", forwarded=f"203.0.113.{i}").status_code for i in range(3)] == [400] * 3
        resp = _post(http, "id9", forwarded="203.0.113.9")  # a fresh id and a forged header
        assert resp.status_code == 429 and resp.json()["error"]["details"]["scope"] == "address"
        assert int(resp.headers["Retry-After"]) > 0


def test_forwarded_for_is_honoured_from_a_trusted_proxy_only(tmp_path):
    server = LiveServer.start(tmp_path, kernels=[CPU_AXPY],
                              settings=dict(LIMITS, trusted_proxies=("127.0.0.1", "10.0.0.0/8")))
    try:
        with server.client() as http:
            # four clients behind the proxy chain: each its own address bucket
            codes = [_post(http, f"c{i}", forwarded=f"198.51.100.{i}, 10.1.2.3").status_code for i in range(4)]
            assert codes == [400] * 4
            same = [_post(http, f"d{i}", forwarded="198.51.100.77").status_code for i in range(4)]
            assert same == [400, 400, 400, 429]
    finally:
        server.stop()


def test_a_trusted_proxy_that_is_not_an_address_is_a_config_error(tmp_path):
    with pytest.raises(ZooError) as err:
        Config.from_dict({"http": {"trusted_proxies": ["not-an-ip"]}}, tmp_path)
    assert err.value.code == "CONFIG_INVALID" and err.value.details["key"] == "http.trusted_proxies"
    config = Config.from_dict({"http": {"trusted_proxies": ["10.0.0.0/8", "::1"]}}, tmp_path)
    assert config.http.trusted_proxies == ("10.0.0.0/8", "::1")

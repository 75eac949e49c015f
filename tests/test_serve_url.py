"""The URL a bound socket serves: the banner's and the local runner's are one, IPv6 in brackets."""
from __future__ import annotations

import pytest

from kz_daemon.http.serve import bind, url_of


def test_ipv4_url():
    sock = bind("127.0.0.1", 0)
    try:
        assert url_of(sock) == f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def test_ipv6_url_has_brackets():
    try:
        sock = bind("::1", 0)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc.strerror}")
    try:
        assert url_of(sock) == f"http://[::1]:{sock.getsockname()[1]}"
    finally:
        sock.close()

"""Request body caps (enforced while the body streams in) and the submission rate limits
(per token holder, and per client address for requests without a token; X-Forwarded-For
names the address behind trusted proxies only)."""
from __future__ import annotations

import ipaddress
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request

from kz_daemon.core.errors import ZooError
from kz_runner.contract.checks import unencodable_paths
from kz_runner.contract.problems import clip


def _too_large(limit: int, what: str) -> ZooError:
    return ZooError(
        "PAYLOAD_TOO_LARGE",
        f"{what} is larger than the server's limit of {limit} bytes; send a smaller body",
        {"limit_bytes": limit},
    )


def check_content_length(request: Request, limit: int, what: str = "the request body",
                         shown: int | None = None) -> None:
    """Refuse early when the declared Content-Length already exceeds ``limit`` (``shown`` in the message)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise ZooError("BAD_REQUEST", "Content-Length is not a number") from None
        if size > limit:
            raise _too_large(shown or limit, what)


async def capped_stream(request: Request, limit: int, what: str = "the request body",
                        shown: int | None = None) -> AsyncIterator[bytes]:
    """The request body chunk by chunk; raises PAYLOAD_TOO_LARGE as soon as ``limit`` is passed.

    ``shown`` is the limit named in the error when it differs from the byte cap
    (an upload's cap includes room for the multipart framing).
    """
    check_content_length(request, limit, what, shown)
    seen = 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > limit:
            raise _too_large(shown or limit, what)
        if chunk:
            yield chunk


async def read_body(request: Request, limit: int, what: str = "the request body") -> bytes:
    """The whole body, refusing anything over ``limit`` bytes while reading."""
    parts = [chunk async for chunk in capped_stream(request, limit, what)]
    return b"".join(parts)


async def read_json_object(request: Request, limit: int, required: tuple[str, ...] = (),
                           free: tuple[str, ...] = ()) -> dict[str, Any]:
    """The body parsed as one JSON object; 400 BAD_REQUEST naming what is wrong otherwise.

    A string or key UTF-8 cannot encode (a lone surrogate: JSON's ``\\ud800`` escape, or
    such raw bytes, which ``json.loads`` lets through) is refused too: the event log, a
    commit or a status document could not hold it. The top-level fields named in
    ``free`` are left to the caller (a result document goes to the hard checks, whose
    code for it is BAD_OUTPUT).
    """
    body = await read_body(request, limit)
    if not body.strip():
        if required:
            raise ZooError("BAD_REQUEST", f"send a JSON object with {', '.join(required)}",
                           {"required": list(required)})
        return {}
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ZooError("BAD_REQUEST", f"the body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ZooError("BAD_REQUEST", "the body must be a JSON object")
    missing = [key for key in required if key not in doc]
    if missing:
        raise ZooError("BAD_REQUEST", f"missing field(s): {', '.join(missing)}", {"missing": missing})
    broken = unencodable_paths({k: v for k, v in doc.items() if k not in free})
    if broken:
        raise ZooError("BAD_REQUEST", f"the body holds text that is not valid Unicode (a lone surrogate) at "
                       f"{clip(', '.join(broken[:5]), 200)}", {"fields": [clip(b, 120) for b in broken[:5]]})
    return doc


class TokenBucket:
    """Per-key token buckets: ``rate`` tokens per second up to ``burst``; bounded key count."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 10_000) -> None:
        self.rate = float(rate)
        self.burst = float(burst)
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, key: str) -> float | None:
        """Spend one token for ``key``: None when allowed, else seconds until one is available."""
        if self.rate <= 0 and self.burst <= 0:
            return None
        now = self._clock()
        tokens, last = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            self._buckets.move_to_end(key)
            while len(self._buckets) > self._max_keys:
                self._buckets.popitem(last=False)
            return None
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / self.rate if self.rate > 0 else 3600.0

    def check(self, key: str) -> None:
        """Raise RATE_LIMITED (429, with retry_after_s) when ``key`` has no token left."""
        wait = self.take(key)
        if wait is not None:
            raise ZooError(
                "RATE_LIMITED",
                f"too many submissions from {key!r}; retry in {wait:.1f} s",
                {"retry_after_s": round(wait, 3), "submitter_id": key},
            )


def parse_networks(entries: tuple[str, ...] | list[str]) -> tuple[ipaddress._BaseNetwork, ...]:
    """Addresses and CIDR ranges (``10.0.0.0/8``, ``::1``) as networks; ValueError names a bad one."""
    return tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries)


def _trusted(host: str, networks: tuple[ipaddress._BaseNetwork, ...]) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(address in net for net in networks)


def client_address(request: Request, trusted: tuple[ipaddress._BaseNetwork, ...] = ()) -> str:
    """The address a request came from, for per-address limits.

    The peer of the TCP connection, unless that peer is a trusted proxy: then
    ``X-Forwarded-For`` is read from its right end, skipping trusted proxies, and the
    first address no trusted proxy vouches for is the client. With no trusted proxies
    (the default) the header is ignored: any client could write it.
    """
    peer = request.client.host if request.client else "unknown"
    if not trusted or not _trusted(peer, trusted):
        return peer
    hops = [h.strip() for part in request.headers.getlist("x-forwarded-for") for h in part.split(",")]
    for hop in reversed([h for h in hops if h]):
        if not _trusted(hop, trusted):
            return hop
    return peer


class SubmitLimits:
    """The two token buckets of POST /api/submissions: per token holder and per client address.

    Identity is settled before anything is charged (``authz.header_submitter`` runs
    first). A request with a submitter or admin token is charged to that token's
    principal alone, so nobody else's requests can spend its allowance. A request
    without a token is charged to its client address alone, never to the id it names:
    naming a victim's id (20 junk posts as ``alice``) once used up the victim's own
    bucket, and anonymous ids cost nothing to invent.
    """

    def __init__(self, per_submitter: TokenBucket, per_address: TokenBucket,
                 trusted_proxies: tuple[str, ...] = ()) -> None:
        self.per_submitter = per_submitter
        self.per_address = per_address
        self.trusted = parse_networks(trusted_proxies)

    def check(self, request: Request, principal: Any) -> None:
        """Raise RATE_LIMITED when the token holder (``principal``) or, without one, the address has no token left."""
        if principal is not None:
            wait = self.per_submitter.take(f"{principal.kind}:{principal.id}")
            if wait is not None:
                raise ZooError("RATE_LIMITED", f"too many submissions from {principal.id!r}; retry in {wait:.1f} s",
                               {"retry_after_s": round(wait, 3), "scope": "submitter",
                                "submitter_id": principal.id})
            return
        address = client_address(request, self.trusted)
        wait = self.per_address.take(f"ip:{address}")
        if wait is not None:
            raise ZooError("RATE_LIMITED", f"too many submissions from this address; retry in {wait:.1f} s",
                           {"retry_after_s": round(wait, 3), "scope": "address"})

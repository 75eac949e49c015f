"""The HTTP shim's own knobs, read from the daemon's Config with safe defaults, and what the app holds.

``Config.http`` (kz_daemon/config/settings.py, the ``http:`` section of ``kz.yaml``) carries
the listen address and every limit below that shares a name with a field here;
the upload cap comes from ``limits.max_compressed_bytes``, lease and timeouts from
``queue`` and ``timeouts``.

:class:`AppState` is the app's ``state`` as ``create_app`` (kz_daemon/http/app.py) builds it,
typed: handlers read it with :func:`app_state`.
"""
from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.requests import Request

from kz_daemon.api.metrics import HttpCounters
from kz_daemon.api.rate_limits import SubmitLimits, TokenBucket
from kz_daemon.api.spec import Op
from kz_daemon.api.views import Catalog
from kz_daemon.config.ports import Service
from kz_daemon.config.settings import Config, HttpSettings
from kz_daemon.config.tokens import TokenStore
from kz_daemon.storage.history import KernelHistory
from kz_daemon.storage.revisions import KernelRevisions
from kz_daemon.upkeep.sdnotify import Notifier
from kz_daemon.upkeep.supervise import Supervisor
from kz_events import defaults

MIB = 1024 * 1024


#: the kz.yaml http: section's defaults, so each is written once (config/settings.py)
_HTTP = HttpSettings()


@dataclass(frozen=True)
class ShimSettings:
    """Limits and policies of the HTTP layer."""

    #: Largest upload (the tar.gz) accepted by POST /api/submissions, enforced while streaming.
    max_upload_bytes: int = 64 * MIB
    #: Any other JSON POST body (claim, renew, release, cancel).
    max_json_bytes: int = _HTTP.max_json_bytes
    #: POST /api/submissions/{uuid}/result (benchmark JSON + base64 logs).
    max_result_bytes: int = _HTTP.max_result_bytes
    #: Uploads with a token: a bucket per token holder, sustained submissions per second and burst.
    submit_rate_per_s: float = _HTTP.submit_rate_per_s
    submit_burst: int = _HTTP.submit_burst
    #: Uploads without a token: a bucket per client address (never below the per-submitter
    #: figures), and the proxies whose X-Forwarded-For names the client (addresses or CIDR
    #: ranges; none by default).
    submit_rate_per_address_per_s: float = _HTTP.submit_rate_per_address_per_s
    submit_burst_per_address: int = _HTTP.submit_burst_per_address
    trusted_proxies: tuple = _HTTP.trusted_proxies
    #: Submissions need a submitter (or admin) token.
    submissions_require_token: bool = False
    #: Upper bounds of the long polls' ``wait`` (seconds).
    status_max_wait_s: float = _HTTP.status_max_wait_s
    claim_max_wait_s: float = _HTTP.claim_max_wait_s
    #: How long POST /api/submissions waits for intake before answering 202 as ``received``.
    intake_wait_s: float = _HTTP.intake_wait_s
    #: Slow and crowding clients (kz_daemon/http/guard.py): a request head must arrive within
    #: ``header_timeout_s``, a body may stall for ``body_timeout_s``, an idle kept-alive
    #: connection is closed after ``keep_alive_s``; at most ``max_connections`` connections
    #: (``max_connections_per_address`` from one client address), and ``fd_reserve`` file
    #: descriptors are never spent on connections.
    header_timeout_s: float = _HTTP.header_timeout_s
    body_timeout_s: float = _HTTP.body_timeout_s
    keep_alive_s: float = _HTTP.keep_alive_s
    max_connections: int = _HTTP.max_connections
    max_connections_per_address: int = _HTTP.max_connections_per_address
    fd_reserve: int = _HTTP.fd_reserve
    #: Lease length reported to runners when the claim does not carry it.
    lease_seconds: float = 300.0
    #: Timeouts handed to runners with each claim.
    build_s: float = defaults.BUILD_TIMEOUT_S
    benchmark_s: float = defaults.BENCHMARK_TIMEOUT_S


def from_config(config: Config | None) -> ShimSettings:
    """ShimSettings from the daemon's Config (None: the defaults); ``dataclasses.replace`` changes one.

    Each field comes from the ``http:`` field of the same name, but ``max_upload_bytes``
    (``limits.max_compressed_bytes``), ``submissions_require_token`` (``policy``),
    ``lease_seconds`` (``queue``), ``build_s`` and ``benchmark_s`` (``timeouts``).
    """
    if config is None:
        return ShimSettings()
    http = config.http
    return ShimSettings(
        max_upload_bytes=config.limits.max_compressed_bytes,
        max_json_bytes=http.max_json_bytes, max_result_bytes=http.max_result_bytes,
        submit_rate_per_s=http.submit_rate_per_s, submit_burst=http.submit_burst,
        submit_rate_per_address_per_s=http.submit_rate_per_address_per_s,
        submit_burst_per_address=http.submit_burst_per_address, trusted_proxies=http.trusted_proxies,
        submissions_require_token=config.policy.submissions_require_token,
        status_max_wait_s=http.status_max_wait_s, claim_max_wait_s=http.claim_max_wait_s,
        intake_wait_s=http.intake_wait_s, header_timeout_s=http.header_timeout_s,
        body_timeout_s=http.body_timeout_s, keep_alive_s=http.keep_alive_s,
        max_connections=http.max_connections, max_connections_per_address=http.max_connections_per_address,
        fd_reserve=http.fd_reserve, lease_seconds=config.queue.lease_seconds,
        build_s=config.timeouts.build_s, benchmark_s=config.timeouts.benchmark_s)


class ConnectionCounts(Protocol):
    """The connection guard as the app's state holds it (``kz_daemon.http.guard.ConnectionGuard``).

    The guard lives in the ``http`` wing, above this one: the state names what it counts
    instead of importing it.
    """

    #: connections served now
    open: int
    #: connections refused so far
    refused: int
    #: connections served now, by client address
    by_address: Counter[str]


class AppState(State):
    """What the HTTP app holds (``app.state``), typed: set once by ``create_app``.

    Still a Starlette ``State``. What is set later is typed here too, None until then:
    ``runner_supervisor`` (``kz up``, once a runner child runs), ``connection_guard``
    (``make_server``) and ``revisions`` (the source reader, made on first use by
    ``kz_daemon.browse.source_api.revisions``).
    """

    #: The daemon, as the HTTP layer calls it.
    zoo: Service
    tokens: TokenStore
    settings: ShimSettings
    #: The kernel repo's reader (None: the app serves no repo history).
    history: KernelHistory | None
    notifier: Notifier
    catalog: Catalog
    rate_limiter: TokenBucket
    submit_limits: SubmitLimits
    #: Set when the server shuts down: long polls answer at once.
    draining: threading.Event
    poll_limiter: anyio.CapacityLimiter
    http_counters: HttpCounters
    openapi: dict[str, Any]
    ops: list[Op]
    #: The supervised runner child of ``kz up`` (None without one).
    runner_supervisor: Supervisor | None
    #: The server's connection guard (None until ``make_server`` guards the app's connections).
    connection_guard: ConnectionCounts | None
    #: The source reader (None until the first source request makes it).
    revisions: KernelRevisions | None

    def __init__(self, *, zoo: Service, tokens: TokenStore, settings: ShimSettings, history: KernelHistory | None,
                 notifier: Notifier, catalog: Catalog, rate_limiter: TokenBucket, submit_limits: SubmitLimits,
                 draining: threading.Event, poll_limiter: anyio.CapacityLimiter, http_counters: HttpCounters,
                 openapi: dict[str, Any], ops: list[Op], runner_supervisor: Supervisor | None = None) -> None:
        super().__init__({
            "zoo": zoo, "tokens": tokens, "settings": settings, "history": history, "notifier": notifier,
            "catalog": catalog, "rate_limiter": rate_limiter, "submit_limits": submit_limits, "draining": draining,
            "poll_limiter": poll_limiter, "http_counters": http_counters, "openapi": openapi, "ops": ops,
            "runner_supervisor": runner_supervisor, "connection_guard": None, "revisions": None})


def state_of(app: Starlette) -> AppState:
    """The state of ``app`` (a Starlette app ``create_app`` built), typed."""
    state = app.state
    if not isinstance(state, AppState):
        raise TypeError("the app's state is not an AppState: build the app with kz_daemon.http.app.create_app")
    return state


def app_state(request: Request) -> AppState:
    """The state of the app serving ``request``: what ``create_app`` built, typed."""
    return state_of(request.app)

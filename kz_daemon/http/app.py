"""The Starlette application: routes, shared objects on ``app.state``, one error mapping.

:func:`create_app` takes the running ``Zoo`` (kz_daemon/ops/service.py) and the token
store; nothing is held in module globals. :func:`make_server` wraps the app in a
uvicorn server whose shutdown first flags the app as draining, so long polls are
answered at once instead of holding the shutdown up.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kz_daemon.api import openapi, public as api, runner as runner_api
from kz_daemon.api.error_responses import EXCEPTION_HANDLERS
from kz_daemon.api.metrics import HttpCounters
from kz_daemon.api.rate_limits import SubmitLimits, TokenBucket, parse_networks
from kz_daemon.api.shim_settings import AppState, ShimSettings, app_state, state_of
from kz_daemon.api.spec import Op, routes
from kz_daemon.api.views import Catalog
from kz_daemon.browse import source_api
from kz_daemon.config.ports import Service
from kz_daemon.config.tokens import TokenStore
from kz_daemon.http.guard import BodyDeadline, ConnectionGuard, accept_backlog, protocol_class, raise_fd_limit
from kz_daemon.mcp.in_process import McpEndpoint
from kz_daemon.standings import rankings, rerun_api
from kz_daemon.storage.history import KernelHistory
from kz_daemon.upkeep.sdnotify import Notifier
from kz_daemon.web import pages, source_pages

STATIC_DIR = Path(__file__).resolve().parent.parent / "web" / "static"
#: Seconds between sd_notify STATUS updates.
STATUS_INTERVAL_S = 10.0


def api_ops() -> list[Op]:
    """Every documented API operation, in documentation order."""
    return [*source_api.OPS, *api.OPS, *rankings.OPS, *rerun_api.OPS, *runner_api.OPS, Op("GET", "/openapi.json", openapi_json, "getOpenApi",
                                          "This OpenAPI document", "ops", responses={200: None})]


async def openapi_json(request: Request) -> Response:
    """GET /openapi.json."""
    return JSONResponse(app_state(request).openapi)


class _CountRequests:
    """ASGI middleware counting answered requests by route name and status class."""

    def __init__(self, app: ASGIApp, counters: HttpCounters) -> None:
        self.app = app
        self.counters = counters

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status_holder = [500]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            name = getattr(route, "name", None) or ("static" if scope["path"].startswith("/static") else "other")
            self.counters.add(name, status_holder[0])


def create_app(zoo: Service, tokens: TokenStore, settings: ShimSettings | None = None, *,
               history: KernelHistory | None = None, notifier: Notifier | None = None, version: str = "0") -> Starlette:
    """The HTTP shim for ``zoo``: public API, runner API, web pages, /openapi.json.

    ``app.state`` is an :class:`AppState` holding ``zoo``, ``history`` and the shared objects;
    handlers read it with ``app_state(request)`` (typed).
    """
    settings = settings or ShimSettings()
    notifier = notifier or Notifier({})
    ops = api_ops()
    counters = HttpCounters()
    mcp_endpoint = McpEndpoint()

    async def status_loop() -> None:
        """Keep systemd's STATUS line current (queue depth) while serving."""
        if not notifier.enabled:
            return
        while True:
            await asyncio.sleep(STATUS_INTERVAL_S)
            with contextlib.suppress(Exception):
                data = zoo.metrics()
                notifier.status(f"serving: {data.get('queue_pending', '?')} pending, "
                                f"{data.get('queue_in_flight', '?')} in flight")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(notifier.watchdog_loop()), asyncio.create_task(status_loop())]
        try:
            async with mcp_endpoint.running():
                yield
        finally:
            state_of(app).draining.set()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    all_routes = [
        *routes(ops),
        *source_pages.ROUTES,
        *pages.ROUTES,
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
        Mount("/mcp", app=mcp_endpoint, name="mcp"),
    ]
    app = Starlette(routes=all_routes, exception_handlers=EXCEPTION_HANDLERS, lifespan=lifespan)
    rate_limiter = TokenBucket(settings.submit_rate_per_s, settings.submit_burst)
    app.state = AppState(
        zoo=zoo, tokens=tokens, settings=settings, history=history, notifier=notifier, catalog=Catalog(),
        rate_limiter=rate_limiter,
        submit_limits=SubmitLimits(
            rate_limiter,
            TokenBucket(max(settings.submit_rate_per_address_per_s, settings.submit_rate_per_s),
                        max(settings.submit_burst_per_address, settings.submit_burst)),
            tuple(settings.trusted_proxies)),
        draining=threading.Event(), poll_limiter=anyio.CapacityLimiter(512), http_counters=counters,
        openapi=openapi.build(ops, version), ops=ops)
    app.add_middleware(BodyDeadline, timeout_s=settings.body_timeout_s)
    app.add_middleware(_CountRequests, counters=counters)
    mcp_endpoint.bind(app)
    return app


def make_server(app: Starlette, host: str, port: int, *, log_level: str = "warning",
                graceful_s: float = 5.0, on_signal: Any = None):
    """A ``uvicorn.Server`` for ``app`` whose exit handling first marks the app as draining.

    ``on_signal(server)``, when given, takes over SIGINT/SIGTERM (it must set
    ``server.should_exit`` eventually); a second signal forces the exit. Its connections
    are guarded by the app's settings (``kz_daemon.http.guard``: a deadline for each
    request head, connection caps, file descriptors in reserve; the soft RLIMIT_NOFILE
    is raised to the hard limit here).
    """
    state = state_of(app)

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:  # uvicorn's signal hook
            state.draining.set()
            if self.should_exit or getattr(self, "_kz_signalled", False):
                self.force_exit = True
                self.should_exit = True
                return
            self._kz_signalled = True
            if on_signal is not None:
                on_signal(self)
            else:
                self.should_exit = True

        def request_stop(self) -> None:
            """Stop from another thread: drain long polls, then leave the serve loop."""
            state.draining.set()
            self.should_exit = True

    settings = state.settings
    guard = ConnectionGuard(header_timeout_s=settings.header_timeout_s, max_connections=settings.max_connections,
                            max_per_address=settings.max_connections_per_address, fd_reserve=settings.fd_reserve,
                            fd_limit=raise_fd_limit(), trusted=parse_networks(tuple(settings.trusted_proxies)))
    state.connection_guard = guard
    # proxy_headers off: uvicorn would take X-Forwarded-For from any local peer as the client;
    # which proxies are trusted is kz.yaml's http.trusted_proxies (kz_daemon.api.rate_limits)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=graceful_s,  # type: ignore[arg-type]  # a float works
                            access_log=False, proxy_headers=False,
                            http=protocol_class(guard),
                            timeout_keep_alive=settings.keep_alive_s,  # type: ignore[arg-type]  # a float works
                            backlog=accept_backlog(settings.fd_reserve))
    return _Server(config)

"""Run the daemon with its HTTP shim in one process: Zoo + Starlette under uvicorn (+ a runner child).

Shutdown order on SIGINT/SIGTERM, bounded in time: mark the app draining (long polls
answer at once, /readyz turns 503), stop the local runner child (SIGTERM; it releases
its lease over HTTP while the server still listens; SIGKILL after ``runner_grace_s``),
then stop uvicorn (in-flight requests get ``graceful_s``), then the Zoo.
"""
from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from kz_daemon.api.shim_settings import from_config, state_of
from kz_daemon.config.ports import Service
from kz_daemon.config.tokens import TokenStore
from kz_daemon.core.errors import ZooError
from kz_daemon.http.app import create_app, make_server
from kz_daemon.ops.service import Zoo
from kz_daemon.storage.history import KernelHistory
from kz_daemon.upkeep.sdnotify import Notifier
from kz_daemon.upkeep.supervise import RUNNER_REFUSALS, Supervisor
from kz_events import defaults
from kz_runner import __version__


@dataclass
class ServeOptions:
    """How to serve: address, runner child, grace periods, where to print."""

    host: str = "127.0.0.1"
    port: int = defaults.HTTP_PORT
    runner_argv: Sequence[str] | None = None
    runner_env: dict[str, str] | None = None
    runner_grace_s: float = 15.0
    graceful_s: float = 5.0
    zoo_stop_s: float = 10.0
    log_level: str = "warning"


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0 picks a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def _die_with_parent() -> None:
    """In the runner child (Linux): get SIGTERM when kz up dies, even by SIGKILL."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _stop_child(proc: Supervisor | None, grace_s: float) -> None:
    if proc is not None:
        proc.stop(grace_s)


def url_of(sock: socket.socket) -> str:
    """The ``http://host:port`` a bound socket serves (an IPv6 host in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://{host if ':' not in host else '[' + host + ']'}:{port}"


def serve(zoo: Service, app: Any, sock: socket.socket, options: ServeOptions, *,
          banner: Callable[[str], None] | None = None, out: TextIO = sys.stdout,
          notifier: Notifier | None = None) -> int:
    """Serve ``app`` on ``sock`` until SIGINT/SIGTERM; ``zoo`` must be started already. Returns 0."""
    notifier = notifier or Notifier()
    host, port = sock.getsockname()[:2]
    url = url_of(sock)
    child: list[Supervisor | None] = [None]

    def shutdown_sequence(srv: Any) -> None:
        notifier.stopping("stopping: runner, then HTTP, then daemon")
        _stop_child(child[0], options.runner_grace_s)
        srv.should_exit = True

    def on_signal(srv: Any) -> None:
        threading.Thread(target=shutdown_sequence, args=(srv,), name="kz-shutdown", daemon=True).start()

    server = make_server(app, host, port, log_level=options.log_level, graceful_s=options.graceful_s,
                         on_signal=on_signal)

    async def main() -> None:
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.02)
        if server.started:
            if options.runner_argv:
                env = dict(os.environ)
                env.update(options.runner_env or {})
                env.pop("NOTIFY_SOCKET", None)  # systemd's socket is ours, not the runner's
                env.pop("WATCHDOG_USEC", None)
                env.pop("WATCHDOG_PID", None)
                # supervised: a runner that dies (a poisonous job) is restarted with backoff
                # exit 78: the runner found no sandbox; /readyz says so with its reason
                child[0] = Supervisor(list(options.runner_argv), env=env, refusals=RUNNER_REFUSALS,
                                      preexec_fn=_die_with_parent if sys.platform == "linux" else None).start()
                state_of(app).runner_supervisor = child[0]
            if banner is not None:
                banner(url)
            notifier.ready(f"serving {url}")
        await serving

    try:
        asyncio.run(main())
    finally:
        _stop_child(child[0], options.runner_grace_s)
        zoo.stop(options.zoo_stop_s)
        notifier.close()
        print("kz: stopped", file=out, flush=True)
    return 0


def serve_config(config: Any, *, host: str | None = None, port: int | None = None,
                 runner_argv_for: Callable[[str], Sequence[str] | None] | None = None,
                 banner: Callable[[str], None] | None = None, out: TextIO = sys.stderr) -> int:
    """Run a Zoo for ``config`` with the HTTP shim until SIGINT/SIGTERM: the whole daemon process.

    Used by ``kz up`` (and meant for ``kz daemon``): binds ``host:port`` (default
    ``config.http``), starts the Zoo (recovery first), speaks sd_notify (READY once
    serving, WATCHDOG from the event loop, STOPPING), optionally starts a runner
    child whose command line ``runner_argv_for(url)`` returns. Returns the exit code
    (2 when the port is taken or the Zoo cannot start).
    """
    host = host or config.http.host
    port = config.http.port if port is None else port
    try:
        sock = bind(host, port)
    except OSError as exc:
        print(f"kz: cannot listen on {host}:{port}: {exc.strerror}; pick another --port", file=out)
        return 2
    notifier = Notifier()
    notifier.status("starting: recovery and intake")
    zoo = Zoo(config)
    try:
        zoo.start()
    except ZooError as exc:
        sock.close()
        print(f"kz: {exc.message}", file=out)
        return 2
    app = create_app(zoo, TokenStore(config.state_dir / "auth.yaml"), from_config(config),
                     history=KernelHistory(config.paths.repo, config.repo.branch), notifier=notifier,
                     version=__version__)
    bound_host, bound_port = sock.getsockname()[:2]
    runner_argv = runner_argv_for(url_of(sock)) if runner_argv_for is not None else None
    options = ServeOptions(host=bound_host, port=bound_port, runner_argv=runner_argv,
                           runner_env={"PYTHONUNBUFFERED": "1"})
    return serve(zoo, app, sock, options, banner=banner, notifier=notifier)

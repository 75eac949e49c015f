"""A real daemon + HTTP shim under uvicorn on a free 127.0.0.1 port, in a thread of the test process.

``LiveServer.start(tmp_path)`` initialises a state directory (repo seeded from the
given example packages), starts the real ``Zoo``, builds the app, binds a free port
and serves it; ``stop()`` drains long polls and stops everything. Tokens: one
runner token per runner id asked for, an admin token and a submitter token for alice
(an id bound to a token is refused without it, so ``submit`` sends it for her).
"""
from __future__ import annotations

import asyncio
import dataclasses
import io
import shutil
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
CPU_AXPY = "cpu/Elementwise/Axpy/fp32/numpy_ref"
CPU_SOFTMAX = "cpu/Reduction/Softmax/fp32/numpy_ref"


def seed_dir(tmp: Path, kernel_ids: list[str]) -> Path:
    """A folder holding copies of the named example packages (the repo's first commit)."""
    seed = tmp / "seed"
    for kid in kernel_ids:
        shutil.copytree(EXAMPLES / kid, seed / kid, ignore=shutil.ignore_patterns("__pycache__"))
    return seed


def package_tarball(kernel_id: str, source: str | None = None, *, mutate=None,
                    include_bench_result: bool = False) -> bytes:
    """The tar.gz a submitter sends for an example package (``source`` example, renamed to ``kernel_id``).

    ``mutate(files)`` may edit ``{relative path: bytes}`` before packing.
    """
    src = EXAMPLES / (source or kernel_id)
    files: dict[str, bytes] = {}
    for path in sorted(src.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            rel = path.relative_to(src).as_posix()
            if rel == ".kernel_package/bench_result.yaml" and not include_bench_result:
                continue
            files[rel] = path.read_bytes()
    if source and source != kernel_id:
        for rel in list(files):
            if rel.endswith((".yaml", ".py")):
                files[rel] = files[rel].replace(source.encode(), kernel_id.encode())
    if mutate is not None:
        mutate(files)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for rel, data in sorted(files.items()):
            info = tarfile.TarInfo(f"{kernel_id}/{rel}")
            info.size = len(data)
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class LiveServer:
    """A running zoo on loopback."""

    url: str
    state_dir: Path
    zoo: Any
    app: Any
    server: Any
    thread: threading.Thread
    tokens: dict[str, str] = field(default_factory=dict)

    @classmethod
    def start(cls, tmp: Path, *, kernels: list[str] | None = None, runners: tuple[str, ...] = ("r1", "r2"),
              settings: dict[str, Any] | None = None, config_yaml: str | None = None,
              submitters: tuple[str, ...] = ("alice",), clock: Any = None) -> LiveServer:
        """Initialise ``tmp/state`` and serve it (``submitters``: the ids given a submitter token;
        ``clock``: the Zoo's clock, epoch seconds, for commit times and leases)."""
        from kz_daemon.config.tokens import TokenStore
        from kz_daemon.ops.runtime import init_state_dir

        state = tmp / "state"
        state.mkdir(parents=True, exist_ok=True)
        if config_yaml is not None:
            (state / "kz.yaml").write_text(config_yaml)
        seed = seed_dir(tmp, kernels if kernels is not None else [CPU_AXPY, CPU_SOFTMAX])
        init_state_dir(state, seed_from=seed)
        store = TokenStore(state / "auth.yaml")
        tokens = {f"runner:{rid}": store.issue("runner", rid) for rid in runners}
        tokens["admin"] = store.issue("admin", "root")
        tokens.update({f"submitter:{sid}": store.issue("submitter", sid) for sid in submitters})
        return cls.serve(state, tokens, settings=settings, clock=clock)

    @classmethod
    def serve(cls, state: Path, tokens: dict[str, str], *, settings: dict[str, Any] | None = None,
              clock: Any = None) -> LiveServer:
        """Start the real ``Zoo`` on an initialised state directory and serve it (``start``, or a restart)."""
        from kz_daemon.api.shim_settings import from_config
        from kz_daemon.config.tokens import TokenStore
        from kz_daemon.http.app import create_app, make_server
        from kz_daemon.http.serve import bind
        from kz_daemon.ops.runtime import init_state_dir
        from kz_daemon.ops.service import Zoo
        from kz_daemon.storage.history import KernelHistory

        config = init_state_dir(state)
        store = TokenStore(state / "auth.yaml")
        zoo = Zoo(config, clock) if clock is not None else Zoo(config)
        zoo.start()
        app = create_app(zoo, store, dataclasses.replace(from_config(config), **(settings or {})),
                         history=KernelHistory(config.paths.repo, config.repo.branch))
        sock = bind("127.0.0.1", 0)
        port = sock.getsockname()[1]
        server = make_server(app, "127.0.0.1", port, graceful_s=3.0)

        def serve() -> None:
            asyncio.run(server.serve(sockets=[sock]))

        thread = threading.Thread(target=serve, name="uvicorn-test", daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return cls(f"http://127.0.0.1:{port}", state, zoo, app, server, thread, tokens)

    def restart(self, **kwargs: Any) -> LiveServer:
        """Stop this server and serve its state directory again, as a restarted daemon does (the log replayed)."""
        self.stop()
        return LiveServer.serve(self.state_dir, self.tokens, **kwargs)

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        """An httpx client for this server (``token`` is a key of ``tokens`` or a raw token)."""
        headers = dict(kwargs.pop("headers", {}) or {})
        if token is not None:
            headers["Authorization"] = f"Bearer {self.tokens.get(token, token)}"
        return httpx.Client(base_url=self.url, headers=headers, timeout=kwargs.pop("timeout", 60), **kwargs)

    def submit(self, client: httpx.Client, kernel_id: str, data: bytes, submitter: str = "alice",
               **kwargs: Any) -> httpx.Response:
        """POST /api/submissions the way the guide's curl line does.

        An id bound to a token here (``submitter:alice``) is sent with that token when the
        client holds none, as its owner does: the server refuses the id without it.
        """
        headers = {"X-Submitter-Id": submitter, **kwargs.pop("headers", {})}
        owned = self.tokens.get(f"submitter:{submitter}")
        if owned is not None and "authorization" not in client.headers and "Authorization" not in headers:
            headers["Authorization"] = f"Bearer {owned}"
        return client.post("/api/submissions", headers=headers,
                           data={"kernel_id": kernel_id, "submitter_id": submitter},
                           files={"package": ("package.tar.gz", data, "application/gzip")}, **kwargs)

    def stop(self) -> None:
        """Drain long polls, stop uvicorn, stop the Zoo."""
        self.server.request_stop()
        self.thread.join(15)
        self.zoo.stop(10)

"""The app's typed state: ``create_app`` builds an ``AppState``, handlers read it with ``app_state``."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from starlette.applications import Starlette

from kz_daemon.api.shim_settings import AppState, ShimSettings, app_state
from kz_daemon.config.tokens import TokenStore
from kz_daemon.http.app import create_app


def test_create_app_holds_its_objects_in_a_typed_state(tmp_path):
    zoo = object()
    settings = ShimSettings()
    app = create_app(zoo, TokenStore(tmp_path / "auth.yaml"), settings)
    state = app_state(SimpleNamespace(app=app))
    assert isinstance(state, AppState) and state is app.state
    assert state.zoo is zoo and state.settings is settings and state.history is None
    assert state.runner_supervisor is None and not state.draining.is_set()
    assert state.connection_guard is None and state.revisions is None  # set later, typed, None until then
    assert state.submit_limits is app.state.submit_limits and state.openapi["openapi"]
    # what is set later on app.state (a runner supervisor, the source reader) reads back typed and untyped
    marker = object()
    app.state.runner_supervisor = marker
    assert state.runner_supervisor is marker and app.state.runner_supervisor is marker
    state.revisions = marker
    assert getattr(app.state, "revisions", None) is marker


def test_app_state_refuses_an_app_create_app_did_not_build():
    with pytest.raises(TypeError, match="create_app"):
        app_state(SimpleNamespace(app=Starlette()))


def test_the_list_of_unreviewed_harnesses_without_a_repo_reader_is_unavailable(tmp_path):
    from starlette.testclient import TestClient

    tokens = TokenStore(tmp_path / "auth.yaml")
    admin = tokens.issue("admin", "root")
    app = create_app(object(), tokens, ShimSettings())  # no history: the kernel repo cannot be read
    with TestClient(app) as client:
        resp = client.get("/api/reviews/harnesses", headers={"Authorization": f"Bearer {admin}"})
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "UNAVAILABLE"


#: where the app's state is built and typed: the only modules that may touch ``app.state`` itself
STATE_BUILDERS = ("kz_daemon/api/shim_settings.py", "kz_daemon/http/app.py")
#: ``request.app.state``, ``self.app.state``, ``server.app.state.draining``, ...: a read past the typed accessor
UNTYPED_READ = re.compile(r"\.app\.state\b")


def test_no_module_reads_the_app_state_untyped():
    """Handlers read the app's objects with ``app_state(request)`` (or ``state_of(app)``), so mypy checks each."""
    root = Path(__file__).resolve().parent.parent
    found = []
    for path in sorted((root / "kz_daemon").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in STATE_BUILDERS:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if UNTYPED_READ.search(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert found == [], ("these lines read Starlette's untyped app.state; read the app's objects through the "
                         "typed AppState instead (kz_daemon.api.shim_settings.app_state(request), or "
                         "state_of(app)):\n" + "\n".join(found))

"""The runner needs none of the daemon's dependencies: it runs with them made unimportable."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_job import PREFIX, pack_fixture
from test_runner_loop import TOKEN, ProtocolServer

ROOT = Path(__file__).resolve().parent.parent
BLOCKED = ("watchdog", "dulwich", "starlette", "uvicorn", "multipart", "httpx", "kz_daemon", "kz_events")

# Loaded at interpreter start (sitecustomize): importing a blocked name fails as if it were not installed.
BLOCKER = f"""
import sys

BLOCKED = {BLOCKED!r}


class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the isolation test)")
        return None


sys.meta_path.insert(0, _Block())
"""


def _env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if k not in ("KZ_RUNNER_TOKEN", "KZ_SERVER")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    return env


def test_the_blocker_works(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import starlette"], env=_env(tmp_path), capture_output=True,
                          text=True)
    assert proc.returncode != 0 and "blocked by the isolation test" in proc.stderr


def test_runner_modules_import_without_daemon_dependencies(tmp_path):
    code = ("import kz_runner.contract.arch, kz_runner.worker.client, kz_runner.worker.envinfo, kz_runner.worker.job, kz_runner.worker.procs, "
            "kz_runner.worker.runner, kz_runner.commands.runner, sys\n"
            f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {BLOCKED!r})\n"
            "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_a_runner_serves_a_job_without_daemon_dependencies(tmp_path):
    zoo = ProtocolServer(TOKEN)
    try:
        uuid = zoo.add(pack_fixture("ok", tmp_path), f"{PREFIX}/ok")
        env = _env(tmp_path)
        env["KZ_RUNNER_TOKEN"] = TOKEN
        proc = subprocess.run([sys.executable, "-m", "kz_runner.commands.runner", "--server", zoo.url,
                               "--arch", "cpu", "--once", "--wait", "5", "--work-root", str(tmp_path / "work")],
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert zoo.results[uuid]["result"]["overall"]["accept"] is True
    finally:
        zoo.close()


def test_kz_runner_through_the_kz_dispatcher_without_daemon_dependencies(tmp_path):
    """`kz runner` goes through kz_daemon/cli.py, which imports every command module: their
    top levels must stay stdlib-only for a GPU host without the daemon's packages."""
    third_party = tuple(n for n in BLOCKED if not n.startswith("kz_"))
    (tmp_path / "sitecustomize.py").write_text(BLOCKER.replace(repr(BLOCKED), repr(third_party)))
    env = {k: v for k, v in os.environ.items() if k not in ("KZ_RUNNER_TOKEN", "KZ_SERVER")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    proc = subprocess.run([sys.executable, "-m", "kz_daemon", "runner", "--help"], env=env, capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "--token-file" in proc.stdout

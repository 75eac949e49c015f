"""Start-up recovery (kz_daemon/recovery.py): SIGKILL the daemon at every point of the accept saga;
after restart recovery leaves all terminal, nothing doubled."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kz_daemon.accept import CRASH_POINTS
from kz_daemon.audit import audit_state_dir
from kz_daemon.runtime import init_state_dir
from kz_daemon.service import Zoo
from tests.helpers.daemon import AXPY_ID, EXAMPLES, ROOT, axpy_tarball, drop_into_inbox, real_run, wait_for

GIT = shutil.which("git")


@pytest.fixture(scope="module")
def real_result(tmp_path_factory):
    """One real run of the CPU Axpy package (build_test_env.py + benchmark.py as child processes)."""
    base = tmp_path_factory.mktemp("real")
    config = init_state_dir(base / "kz", seed_from=EXAMPLES)
    zoo = Zoo(config)
    zoo.start()
    try:
        drop_into_inbox(config.paths.spool, "p.tar.gz", axpy_tarball())
        claim = zoo.claim("r", "cpu", wait_s=30)
        result = real_run(zoo.runner_package(claim.uuid, "r"), base / "run")
    finally:
        zoo.stop()
    assert result["overall"]["accept"] is True
    path = base / "result.json"
    path.write_text(json.dumps(result))
    return path


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_sigkill_inside_the_saga_recovers_cleanly(point, real_result, tmp_path):
    config = init_state_dir(tmp_path / "kz", seed_from=EXAMPLES)
    drop_into_inbox(config.paths.spool, "p.tar.gz", axpy_tarball(
        mutate=lambda f: f.__setitem__("src/CHANGELOG", point.encode())))
    from kz_daemon.gitstore import GitStore

    g = GitStore.open(config.paths.repo)
    base = g.head()
    g.close()
    env = dict(os.environ, KZ_CRASH_AT=point, PYTHONPATH=str(ROOT))
    child = subprocess.run([sys.executable, "-m", "tests.helpers.daemon_child", str(config.state_dir),
                            str(real_result)], env=env, cwd=ROOT, capture_output=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]

    zoo = Zoo(config)  # restart: recovery runs in start()
    zoo.start()
    try:
        subs = list(zoo.store.state.submissions.values())
        assert len(subs) == 1
        sub = subs[0]
        assert sub.status == "accepted", (sub.status, sub.reasons)
        commits = list(zoo.git.log(stop=base))
        assert [c.trailers.get("Kz-Step") for c in commits] == ["scorecard", "source"]
        assert all(c.trailers["Kz-Submission"] == sub.uuid for c in commits)
        assert commits[1].sha == sub.sha_src and commits[0].sha == sub.sha_br == zoo.git.head()
        card = zoo.git.read_file(f"{AXPY_ID}/.kernel_package/bench_result.yaml").decode()
        assert "__PENDING_COMMIT__" not in card and sub.sha_src in card
        wait_for(lambda: zoo.git._mark("kz-index") == zoo.git.tree_of(zoo.git.head()))
    finally:
        zoo.stop()
    assert [f for f in audit_state_dir(config.state_dir) if f.severity == "error"] == []
    assert not list((config.paths.repo / ".git").rglob("*.lock"))
    if GIT:
        subprocess.run([GIT, "-C", str(config.paths.repo), "fsck", "--strict"], check=True, capture_output=True)
        status = subprocess.run([GIT, "-C", str(config.paths.repo), "status", "--porcelain"], check=True,
                                capture_output=True, text=True).stdout
        assert status == ""

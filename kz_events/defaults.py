"""Every default the daemon, the runner and the command line share, in one place.

A default written twice drifts (the benchmark timeout was 1800 s in five places and
1200 s in the dry run; the port was written in six files), so each literal lives here
once and everything else names it. This module sits in ``kz_events`` because that is
the one package every other may import (standard library only, nothing of ours).
"""
from __future__ import annotations

#: the address ``kz up`` and ``kz daemon`` serve on, and the clients' default server
HTTP_HOST = "127.0.0.1"
HTTP_PORT = 8470
SERVER_URL = f"http://{HTTP_HOST}:{HTTP_PORT}"

#: the state directory of ``kz up``, ``kz daemon`` and the commands that read one
STATE_DIR = "./kz-data"

#: seconds a job's ``build_test_env.py`` and ``benchmark.py`` may run (runner, daemon, dry run)
BUILD_TIMEOUT_S = 600.0
BENCHMARK_TIMEOUT_S = 1800.0

__all__ = ["BENCHMARK_TIMEOUT_S", "BUILD_TIMEOUT_S", "HTTP_HOST", "HTTP_PORT", "SERVER_URL", "STATE_DIR"]

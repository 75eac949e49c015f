"""A daemon process for the crash tests: start a Zoo, claim the queued job, report a stored result.

Usage: python -m tests.helpers.daemon_child STATE_DIR RESULT_JSON
With KZ_CRASH_AT=<point> the accept saga SIGKILLs this process at that point.
"""
from __future__ import annotations

import json
import sys

from kz_daemon.config.settings import Config
from kz_daemon.ops.service import Zoo


def main(argv: list[str]) -> int:
    state_dir, result_path = argv[1], argv[2]
    zoo = Zoo(Config.load(state_dir))
    zoo.start()
    try:
        claim = zoo.claim("crash-runner", "cpu", wait_s=60)
        if claim is None:
            print("no job", file=sys.stderr)
            return 3
        zoo.runner_package(claim.uuid, "crash-runner")
        result = json.loads(open(result_path).read())
        view = zoo.report_result(claim.uuid, "crash-runner", claim.lease_id, result, b"log", {}, None)
        print(json.dumps({"uuid": claim.uuid, "status": view.status}))
    finally:
        zoo.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

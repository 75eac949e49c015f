"""``kz daemon``: run the daemon (spool intake, queue, accept saga, index, HTTP API) until SIGTERM/SIGINT.

By default the HTTP shim serves on ``kz.yaml``'s ``http.host``/``http.port`` and the
process speaks sd_notify (READY, WATCHDOG, STOPPING) for the systemd unit, through
``kz_daemon.http.serve.serve_config`` (the same path as ``kz up``, without the local
runner). ``--no-http`` runs the daemon core alone (spool-only installations, tests).
"""
from __future__ import annotations

import argparse
import sys

from kz_events import defaults

NAME = "daemon"
HELP = "run the kernel_zoo daemon (spool, queue, accept, index, HTTP API) until SIGTERM/SIGINT"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--state-dir, --repo, --config, --seed-from, --no-http."""
    parser.add_argument("--state-dir", default=defaults.STATE_DIR,
                        help=f"state directory (kz.yaml, repo/, spool/, events/ ...); default {defaults.STATE_DIR}")
    parser.add_argument("--repo", default=None, help="kernel repo path (default: STATE_DIR/repo)")
    parser.add_argument("--config", default=None, help="config file (default: STATE_DIR/kz.yaml)")
    parser.add_argument("--seed-from", default=None,
                        help="seed an empty repo with the packages under this folder (e.g. examples/)")
    parser.add_argument("--no-http", action="store_true",
                        help="run the daemon core only (spool intake), without the HTTP API")


def run(args: argparse.Namespace) -> int:
    """Initialise the state dir, then run the Zoo until a signal."""
    from kz_daemon.core.errors import ZooError
    from kz_daemon.ops.runtime import init_state_dir, open_failure, prepare_daemon_process, run_until_signal

    prepare_daemon_process()  # the heap tuned before any thread; the log lines on stderr
    try:
        config = init_state_dir(args.state_dir, seed_from=args.seed_from, config_file=args.config,
                                repo=args.repo)
    except ZooError as exc:
        print(f"kz daemon: {exc.message}", file=sys.stderr)
        return 2

    def ready(zoo) -> None:
        print(f"kz daemon: ready on {config.state_dir} (repo {config.paths.repo}, "
              f"inbox {config.spool_inbox}, pid {__import__('os').getpid()})", file=sys.stderr, flush=True)

    from kz_events.log.segments import LogError, LogLocked

    try:
        if not args.no_http:
            from kz_daemon.http.serve import serve_config

            return serve_config(config)
        return run_until_signal(config, on_ready=ready)
    except ZooError as exc:
        print(f"kz daemon: {exc.message}", file=sys.stderr)
        return 2
    except LogLocked as exc:
        print(f"kz daemon: another daemon holds {config.paths.events} ({exc}); stop it first",
              file=sys.stderr)
        return 2
    except LogError as exc:
        print(open_failure("kz daemon", config.state_dir, exc), file=sys.stderr)
        return 2

"""``kz revoke UUID --reason TEXT``: an admin takes an accepted record back.

Through a running server (``--server URL`` with an admin token, ``--token`` or env
``KZ_TOKEN``: ``POST /api/submissions/{uuid}/revoke``), or, with ``--state-dir DIR``,
directly on a state directory whose daemon is stopped (the event log admits one writer).
Either way the revocation is recorded as events and as a commit on the kernel that
restores its scorecard's best without that record; history is never rewritten.
Prints the submission's status document as JSON. Exit 0 revoked, 1 refused (not
found, not accepted, not an admin), 2 usage or environment error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

NAME = "revoke"
HELP = "revoke an accepted record (admin): events, a revocation commit, the best restored"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Fill the ``kz revoke`` parser."""
    parser.add_argument("uuid", help="the accepted submission's uuid")
    parser.add_argument("--reason", required=True, help="why (kept in the event log and the commit)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="URL of a running server (needs an admin token)")
    where.add_argument("--state-dir", type=Path, help="state directory of a stopped daemon")
    parser.add_argument("--token", default=os.environ.get("KZ_TOKEN"),
                        help="admin token for --server (env KZ_TOKEN)")
    parser.add_argument("--by", default="operator", help="who revokes, with --state-dir (default operator)")


def run(args: argparse.Namespace) -> int:
    """Revoke through the server or on the state directory; 0 revoked, 1 refused, 2 usage/environment."""
    if not args.reason.strip():
        print("kz revoke: --reason must say why", file=sys.stderr)
        return 2
    if args.server:
        return _through_server(args)
    return _on_state_dir(args)


def _through_server(args: argparse.Namespace) -> int:
    from kz_runner.worker.client import ApiError, ClientError, ZooClient

    if not args.token:
        print("kz revoke: --server needs an admin token (--token or env KZ_TOKEN)", file=sys.stderr)
        return 2
    client = ZooClient(args.server, args.token)
    try:
        resp = client.request_json("POST", f"/api/submissions/{args.uuid}/revoke", {"reason": args.reason})
    except ApiError as exc:
        print(f"kz revoke: {exc}", file=sys.stderr)
        return 1
    except ClientError as exc:
        print(f"kz revoke: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(resp.body, indent=2, ensure_ascii=False))
    return 0


def _on_state_dir(args: argparse.Namespace) -> int:
    from kz_daemon.api.views import submission_doc
    from kz_daemon.config.settings import Config
    from kz_daemon.core.errors import ZooError
    from kz_daemon.ops.service import Zoo
    from kz_events.log import LogLocked

    if not (args.state_dir / "kz.yaml").exists() and not (args.state_dir / "events").is_dir():
        print(f"kz revoke: {args.state_dir} is not a state directory", file=sys.stderr)
        return 2
    try:
        zoo = Zoo(Config.load(args.state_dir))
    except LogLocked:
        print("kz revoke: a daemon is running on this state directory; use --server", file=sys.stderr)
        return 2
    try:
        zoo.start()
        view = zoo.revoke(args.uuid, args.by, args.reason)
    except ZooError as exc:
        print(f"kz revoke: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    finally:
        zoo.stop()
    print(json.dumps(submission_doc(view), indent=2, ensure_ascii=False, default=str))
    return 0

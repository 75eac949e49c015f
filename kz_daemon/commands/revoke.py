"""``kz revoke UUID --reason TEXT``: an admin takes an accepted record back.

``UUID`` is the record's uuid or an unambiguous prefix of it (the 8 characters ``kz``
prints); a prefix that starts several records is refused, listing them. Through a
running server (``--server URL`` with an admin token, ``--token`` or env ``KZ_TOKEN``:
``POST /api/submissions/{uuid}/revoke``), or, with ``--state-dir DIR``, directly on a
state directory whose daemon is stopped (the event log admits one writer). Either way
the revocation is recorded as events and as a commit on the kernel that restores it as
the standing records leave it; history is never rewritten. Prints what happened in
words (``--json``: the submission's status document). Exit 0 revoked, 1 refused (not
found, ambiguous, not accepted, not an admin), 2 usage or environment error.
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
    parser.add_argument("uuid", help="the accepted submission's uuid, or an unambiguous prefix (8 characters)")
    parser.add_argument("--reason", required=True, help="why (kept in the event log and the commit)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="URL of a running server (needs an admin token)")
    where.add_argument("--state-dir", type=Path, help="state directory of a stopped daemon")
    parser.add_argument("--token", default=os.environ.get("KZ_TOKEN"),
                        help="admin token for --server (env KZ_TOKEN)")
    parser.add_argument("--by", default="operator", help="who revokes, with --state-dir (default operator)")
    parser.add_argument("--json", action="store_true", help="print the submission's status document as JSON")


def run(args: argparse.Namespace) -> int:
    """Revoke through the server or on the state directory; 0 revoked, 1 refused, 2 usage/environment."""
    if not args.reason.strip():
        print("kz revoke: --reason must say why", file=sys.stderr)
        return 2
    if args.server:
        return _through_server(args)
    return _on_state_dir(args)


def describe(doc: dict) -> list[str]:
    """The revocation in words: which record, by whom and why, its commit, whether the best changed."""
    uuid = str(doc.get("uuid") or "")
    lines = [f"{doc.get('status')}: {doc.get('kernel_id')} ({uuid[:8]}, {uuid}), submitted by {doc.get('submitter_id')}"]
    entry = next((r for r in reversed(doc.get("reasons") or []) if isinstance(r, dict) and r.get("stage") == "revoke"),
                 None)
    if entry is not None:
        lines.append(f"revoked by {entry.get('by')}: {entry.get('message')}")
        if entry.get("sha"):
            changed = entry.get("best_changed")
            lines.append(f"revocation commit: {entry['sha']}" + (
                "" if changed is None else f" ({'the kernel is back as the standing records leave it' if changed else 'no figure of the kernel changed'})"))
        else:
            lines.append("revocation commit: not made yet (the daemon finishes it)")
    return lines


def _refused(code: str, message: str, details: dict | None) -> int:
    print(f"kz revoke: {code}: {message}", file=sys.stderr)
    for candidate in (details or {}).get("candidates") or []:
        print(f"  {candidate}", file=sys.stderr)
    return 1


def _print(args: argparse.Namespace, doc: dict) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, ensure_ascii=False, default=str))
    else:
        print("\n".join(describe(doc)))


def _through_server(args: argparse.Namespace) -> int:
    from kz_runner.worker.client import ApiError, ClientError, ZooClient

    if not args.token:
        print("kz revoke: --server needs an admin token (--token or env KZ_TOKEN)", file=sys.stderr)
        return 2
    client = ZooClient(args.server, args.token)
    try:
        resp = client.request_json("POST", f"/api/submissions/{args.uuid.strip()}/revoke", {"reason": args.reason})
    except ApiError as exc:
        return _refused(exc.code, exc.message, exc.details)
    except ClientError as exc:
        print(f"kz revoke: {exc}", file=sys.stderr)
        return 2
    _print(args, resp.body if isinstance(resp.body, dict) else {})
    return 0


def _on_state_dir(args: argparse.Namespace) -> int:
    from kz_daemon.api.views import submission_doc
    from kz_daemon.config.settings import Config
    from kz_daemon.core.errors import ZooError
    from kz_daemon.ops.service import Zoo
    from kz_events.log.segments import LogLocked

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
        return _refused(exc.code, exc.message, exc.details)
    finally:
        zoo.stop()
    _print(args, json.loads(json.dumps(submission_doc(view), default=str)))
    return 0

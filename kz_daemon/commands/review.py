"""``kz review``: list the submissions a static rule holds, approve or reject them; review harnesses (admin token).

Talks to a running zoo over its API (``GET /api/reviews``, ``POST
/api/reviews/{uuid}/approve|reject``) with an admin token: ``--token``, the
``KZ_TOKEN`` environment variable, or ``--state-dir``'s ``tokens/admin.token`` (the
one ``kz up`` writes). ``kz review harness list|approve|revoke`` does the same for
the harnesses submissions brought (``GET /api/reviews/harnesses``, ``POST
/api/reviews/harnesses/{kernel_id}/approve|revoke``): a kernel ranks only once its
harness is approved. The calls go through :class:`kz_runner.worker.client.ZooClient` (the
one HTTP client), one attempt each: an approve or reject repeated after a lost answer would
be refused as already decided. Exit codes: 0 done, 1 the server refused (not held, nothing
to approve or revoke, not found, not an admin), 2 usage or connection error, or a server
error (5xx).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from pathlib import Path

from kz_events import defaults

NAME = "review"
HELP = "list held submissions with their evidence, approve or reject one; review harnesses (admin token)"
TIMEOUT_S = 30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", default=argparse.SUPPRESS, help=f"zoo URL (default {defaults.SERVER_URL})")
    common.add_argument("--token", default=argparse.SUPPRESS, help="admin token (default $KZ_TOKEN or "
                        "STATE_DIR/tokens/admin.token)")
    common.add_argument("--state-dir", default=argparse.SUPPRESS, help="state directory whose admin token "
                        f"to use (default {defaults.STATE_DIR})")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.add_parser("list", parents=[common], help="held submissions with the rules and evidence")
    for action in ("approve", "reject"):
        p = sub.add_parser(action, parents=[common], help=f"{action} a held submission")
        p.add_argument("uuid")
        p.add_argument("--reason", default="", help="why (the submitter sees a rejection's reason)")
    harness = sub.add_parser("harness", help="harnesses a submission brought: a kernel ranks once its harness is "
                             "approved").add_subparsers(dest="harness_action", metavar="ACTION")
    harness.add_parser("list", parents=[common], help="kernels whose harness at HEAD awaits review, with its hash "
                       "and where to read it")
    for action, text in (("approve", "approve the kernel's harness at HEAD: the kernel ranks"),
                         ("revoke", "take an approval back: the kernel no longer ranks")):
        p = harness.add_parser(action, parents=[common], help=text)
        p.add_argument("kernel_id")
        p.add_argument("--hash", dest="harness_hash", default=None,
                       help="the harness's hash or a prefix of 8+ hex digits (approve: must be HEAD's, as "
                            "`list` showed it; revoke: an approved one, default HEAD's)")
        p.add_argument("--reason", default="", help="why")


def _token(args: argparse.Namespace) -> str | None:
    token = getattr(args, "token", None) or os.environ.get("KZ_TOKEN")
    if token:
        return token.strip()
    path = Path(getattr(args, "state_dir", defaults.STATE_DIR)) / "tokens" / "admin.token"
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _print_row(row: dict) -> None:
    print(f"{row['uuid']}  {row['kernel_id']}  by {row['submitter_id']}  held {row.get('held_at', '')}  "
          f"rules: {', '.join(row.get('rules') or [])}")
    for f in row.get("evidence") or []:
        print(f"    {f.get('rule')} {f.get('file')}:{f.get('line')}: {f.get('text')}")


def _print_harness(row: dict, server: str) -> None:
    print(f"{row['kernel_id']}  harness {row['harness_hash']}")
    print(f"    brought by {row.get('submitter_id') or '?'} (submission {str(row.get('submission', ''))[:8]}, "
          f"commit {str(row.get('commit', ''))[:10]}); read it: {server.rstrip('/')}{row.get('source_url', '')}")
    print(f"    or: git show {row.get('commit', '')}:{row.get('path', '')}")


def _request(args: argparse.Namespace) -> tuple[str, str, dict | None] | None:
    """``(method, path, body)`` of the API call the arguments ask for; None for a missing action."""
    if args.action in ("list", "approve", "reject"):
        if args.action == "list":
            return "GET", "/api/reviews", None
        return "POST", f"/api/reviews/{args.uuid}/{args.action}", {"reason": args.reason}
    if args.action == "harness":
        action = getattr(args, "harness_action", None)
        if action == "list":
            return "GET", "/api/reviews/harnesses", None
        if action in ("approve", "revoke"):
            body = {"reason": args.reason}
            if args.harness_hash:
                body["harness_hash"] = args.harness_hash
            return "POST", f"/api/reviews/harnesses/{urllib.parse.quote(args.kernel_id, safe='/')}/{action}", body
    return None


def run(args: argparse.Namespace) -> int:
    request = _request(args)
    if request is None:
        print("kz review: name an action: list, approve, reject, or harness list|approve|revoke", file=sys.stderr)
        return 2
    server = getattr(args, "server", None) or os.environ.get("KZ_SERVER") or defaults.SERVER_URL
    token = _token(args)
    if not token:
        print("kz review: no admin token: pass --token, set KZ_TOKEN or point --state-dir at the "
              "daemon's state directory", file=sys.stderr)
        return 2
    from kz_runner.worker.client import NO_RETRY, ApiError, ClientError, ZooClient

    method, path, body = request
    try:
        answer = ZooClient(server, token, timeout_s=TIMEOUT_S).request_json(method, path, body, retry=NO_RETRY)
    except ApiError as exc:  # a 4xx: the server refused
        print(f"kz review: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except (ClientError, ValueError) as exc:  # unreachable, a 5xx, an answer that is not JSON, a bad --server
        print(f"kz review: {server}: {exc}", file=sys.stderr)
        return 2
    doc = answer.body if isinstance(answer.body, dict) else {}
    if getattr(args, "json", False):
        print(json.dumps(doc))
    elif args.action == "harness":
        _print_harness_answer(args, doc, server)
    elif args.action == "list":
        rows = doc.get("reviews") or []
        if not rows:
            print("no submissions are held for review")
        for row in rows:
            _print_row(row)
    else:
        print(f"{args.uuid}: {doc.get('status')}")
    return 0


def _print_harness_answer(args: argparse.Namespace, doc: dict, server: str) -> None:
    if args.harness_action == "list":
        rows = doc.get("harnesses") or []
        if not rows:
            print("no kernel's harness awaits review")
        for row in rows:
            _print_harness(row, server)
        return
    verb = "approved: the kernel ranks" if doc.get("decision") == "approve" else "approval revoked"
    print(f"{doc.get('kernel_id')}: harness {str(doc.get('harness_hash'))[:12]} {verb} "
          f"(its harness at HEAD is {doc.get('harness')})")

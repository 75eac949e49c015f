"""``kz review``: list the submissions a static rule holds, approve or reject them (admin token).

Talks to a running zoo over its API (``GET /api/reviews``, ``POST
/api/reviews/{uuid}/approve|reject``) with an admin token: ``--token``, the
``KZ_TOKEN`` environment variable, or ``--state-dir``'s ``tokens/admin.token`` (the
one ``kz up`` writes). Exit codes: 0 done, 1 the server refused (not held, not
found, not an admin), 2 usage or connection error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from kz_events import defaults

NAME = "review"
HELP = "list held submissions with their evidence; approve or reject one (admin token)"
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


def _token(args: argparse.Namespace) -> str | None:
    token = getattr(args, "token", None) or os.environ.get("KZ_TOKEN")
    if token:
        return token.strip()
    path = Path(getattr(args, "state_dir", defaults.STATE_DIR)) / "tokens" / "admin.token"
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _call(server: str, method: str, path: str, token: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server.rstrip("/") + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {"error": {"code": "HTTP_ERROR", "message": str(exc)}}


def _print_row(row: dict) -> None:
    print(f"{row['uuid']}  {row['kernel_id']}  by {row['submitter_id']}  held {row.get('held_at', '')}  "
          f"rules: {', '.join(row.get('rules') or [])}")
    for f in row.get("evidence") or []:
        print(f"    {f.get('rule')} {f.get('file')}:{f.get('line')}: {f.get('text')}")


def run(args: argparse.Namespace) -> int:
    if args.action not in ("list", "approve", "reject"):
        print("kz review: name an action: list, approve or reject", file=sys.stderr)
        return 2
    server = getattr(args, "server", None) or os.environ.get("KZ_SERVER") or defaults.SERVER_URL
    token = _token(args)
    if not token:
        print("kz review: no admin token: pass --token, set KZ_TOKEN or point --state-dir at the "
              "daemon's state directory", file=sys.stderr)
        return 2
    try:
        if args.action == "list":
            status, doc = _call(server, "GET", "/api/reviews", token)
        else:
            status, doc = _call(server, "POST", f"/api/reviews/{args.uuid}/{args.action}", token,
                                {"reason": args.reason})
    except (urllib.error.URLError, OSError) as exc:
        print(f"kz review: cannot reach {server}: {exc}", file=sys.stderr)
        return 2
    if status >= 400:
        err = doc.get("error")
        if not isinstance(err, dict):
            err = doc
        print(f"kz review: {err.get('code', status)}: {err.get('message', '')}", file=sys.stderr)
        return 1
    if getattr(args, "json", False):
        print(json.dumps(doc))
    elif args.action == "list":
        rows = doc.get("reviews") or []
        if not rows:
            print("no submissions are held for review")
        for row in rows:
            _print_row(row)
    else:
        print(f"{args.uuid}: {doc.get('status')}")
    return 0

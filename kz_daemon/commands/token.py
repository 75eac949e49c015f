"""``kz token``: issue, list and revoke the bearer tokens of runners, submitters and admins.

Tokens are stored hashed in ``DIR/auth.yaml``; a running daemon picks changes up
without a restart. ``issue`` prints the plaintext once (or writes it, mode 0600, to
``--out`` for a systemd credential or a Slurm job) — it cannot be recovered later.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kz_events import defaults

NAME = "token"
HELP = "issue, list or revoke runner/submitter/admin tokens of a state directory"
KINDS = ("runner", "submitter", "admin")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", default=defaults.STATE_DIR, help=f"state directory (default {defaults.STATE_DIR})")
    # --state-dir is accepted after the action too (`kz token issue runner gpu0 --state-dir D`);
    # SUPPRESS keeps an absent one from overriding the value given before the action.
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument("--state-dir", default=argparse.SUPPRESS, help=f"state directory (default {defaults.STATE_DIR})")
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    issue = sub.add_parser("issue", parents=[state], help="create a token and print it once")
    issue.add_argument("kind", choices=KINDS)
    issue.add_argument("id", help="runner id, submitter id or admin name the token maps to")
    issue.add_argument("--out", type=Path, help="write the token to this file (mode 0600) instead of stdout")
    issue.add_argument("--json", action="store_true", help='print {"kind", "id", "token"} (or "out" with --out)')
    revoke = sub.add_parser("revoke", parents=[state], help="remove every token of a principal")
    revoke.add_argument("kind", choices=KINDS)
    revoke.add_argument("id")
    revoke.add_argument("--json", action="store_true", help='print {"kind", "id", "revoked": N}')
    listing = sub.add_parser("list", parents=[state], help="list the principals that hold tokens")
    listing.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    from kz_daemon.config.tokens import TokenStore, write_secret

    state = Path(args.state_dir)
    if not state.is_dir():
        print(f"kz token: {state} is not a state directory (create one with kz up or kz daemon)", file=sys.stderr)
        return 2
    store = TokenStore(state / "auth.yaml")
    if args.action == "issue":
        token = store.issue(args.kind, args.id)
        if args.out:
            write_secret(args.out, token)
            print(f"{args.kind} token for {args.id} written to {args.out}", file=sys.stderr)
        if args.json:
            print(json.dumps({"kind": args.kind, "id": args.id, **({"out": str(args.out)} if args.out
                                                                   else {"token": token})}))
        elif not args.out:
            print(token)  # the bare token: what a script captures
        return 0
    if args.action == "revoke":
        removed = store.revoke(args.kind, args.id)
        if args.json:
            print(json.dumps({"kind": args.kind, "id": args.id, "revoked": removed}))
        if not removed:
            print(f"kz token: no {args.kind} token for {args.id!r}", file=sys.stderr)
            return 1
        print(f"revoked {removed} {args.kind} token(s) of {args.id}", file=sys.stderr)
        return 0
    if args.action == "list":
        principals = store.principals()
        if args.json:
            print(json.dumps([{"kind": p.kind, "id": p.id} for p in principals]))
        else:
            for p in principals:
                print(f"{p.kind:10} {p.id}")
        return 0
    print("kz token: name an action: issue, list or revoke", file=sys.stderr)
    return 2

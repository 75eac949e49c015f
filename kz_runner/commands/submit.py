"""`kz submit PATH`: validate and pack locally, upload, follow the status, print the verdict.

Exit codes: 0 accepted (or queued with --no-wait), 1 rejected (locally, at intake or
by the run), 2 error (network, auth, limits, timeout, usage).
"""
from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import sys

NAME = "submit"
HELP = "submit a package (directory or .tar.gz) to a kernel_zoo server and follow its status"
DEFAULT_SERVER = "http://127.0.0.1:8470"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Fill the ``kz submit`` parser."""
    parser.add_argument("path", help="package directory or .tar.gz")
    parser.add_argument("--server", default=os.environ.get("KZ_SERVER", DEFAULT_SERVER),
                        help=f"server URL (env KZ_SERVER; default {DEFAULT_SERVER})")
    parser.add_argument("--submitter", default=os.environ.get("KZ_SUBMITTER"),
                        help="submitter id (env KZ_SUBMITTER; default: your user name)")
    parser.add_argument("--token", default=os.environ.get("KZ_TOKEN"),
                        help="submitter token when the server requires one (env KZ_TOKEN)")
    parser.add_argument("--kernel-id", default=None, help="kernel_id (default: from the package)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--no-wait", action="store_true", help="return once the server has queued it")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds to follow the status before giving up (default 3600)")


def _progress(enabled: bool):
    def show(doc: dict, elapsed: float) -> None:
        if enabled:
            print(f"[{elapsed:6.1f}s] {doc.get('status')}", file=sys.stderr, flush=True)
    return show


def _emit_json(doc: dict) -> None:
    print(json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=True))


def run(args: argparse.Namespace) -> int:
    """Do the submission; see the module docstring for exit codes."""
    from kz_runner import submit as sub
    from kz_runner.client import ApiError, ClientError, ZooClient

    submitter = args.submitter or getpass.getuser()
    if not re.match(r"^[A-Za-z0-9._@+-]{1,64}$", submitter):
        print(f"kz submit: {submitter!r} is not a valid submitter id (1-64 of A-Z a-z 0-9 . _ @ + -); "
              "pass --submitter", file=sys.stderr)
        return 2
    try:
        prepared = sub.prepare(args.path, args.kernel_id)
    except sub.LocalRejection as exc:
        if args.json:
            _emit_json({"status": "rejected", "stage": "local", "message": str(exc), "problems": exc.problems})
        else:
            print(f"kz submit: {exc}; nothing was uploaded", file=sys.stderr)
            for p in exc.problems:
                print(f"  {p.get('code')}: {p.get('message')}", file=sys.stderr)
        return sub.EXIT_REJECTED
    except sub.SubmitError as exc:
        print(f"kz submit: {exc}", file=sys.stderr)
        return sub.EXIT_ERROR
    try:
        client = ZooClient(args.server, args.token)
    except ValueError as exc:
        print(f"kz submit: {exc}", file=sys.stderr)
        return sub.EXIT_ERROR
    quiet = args.json
    try:
        try:
            created = sub.upload(client, prepared, submitter)
        except ApiError as exc:
            if exc.code == "VALIDATION_ERROR":
                doc = {"status": "rejected", "stage": "intake", "code": exc.code, "message": exc.message,
                       "details": exc.details}
                if args.json:
                    _emit_json(doc)
                else:
                    print(f"kz submit: rejected at intake: {exc.message}", file=sys.stderr)
                    for reason in (exc.details or {}).get("reasons") or []:
                        print(f"  {reason}", file=sys.stderr)
                return sub.EXIT_REJECTED
            raise
        uuid = created.get("uuid")
        if not quiet:
            print(f"submitted {prepared.kernel_id} as {uuid} ({created.get('status')}); "
                  f"status: {args.server.rstrip('/')}/submissions/{uuid}", file=sys.stderr)
        if args.no_wait:
            if args.json:
                _emit_json(created)
            else:
                print(uuid)
            return sub.EXIT_ACCEPTED
        final = sub.follow(client, uuid, args.timeout, _progress(not quiet))
    except ApiError as exc:
        print(f"kz submit: server answered {exc.status} {exc.code}: {exc.message}", file=sys.stderr)
        return sub.EXIT_ERROR
    except (ClientError, sub.SubmitError, OSError) as exc:
        print(f"kz submit: {exc}", file=sys.stderr)
        return sub.EXIT_ERROR
    finally:
        if prepared.packed:
            sub.discard(prepared)
    status = final.get("status")
    if args.json:
        _emit_json(final)
    else:
        print(f"{status}: {prepared.kernel_id} ({uuid})")
        print(sub.case_table(final))
        if final.get("commit_sha"):
            print(f"commit: {final['commit_sha']}")
        for reason in final.get("reasons") or []:
            if isinstance(reason, dict):
                print(f"reason: {reason.get('code', '')}: {reason.get('message', '')}")
            else:
                print(f"reason: {reason}")
    return sub.exit_code_for(status)

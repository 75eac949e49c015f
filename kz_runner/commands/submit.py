"""`kz submit PATH`: validate and pack locally, upload, follow the status, print the verdict.

Exit codes: 0 accepted (or queued with --no-wait), 1 rejected (locally, at intake or
by the run), 2 error (network, auth, limits, timeout, usage), 3 held: a static rule
holds the package until an admin approves or rejects it (``kz submit`` returns at once
with the rule and its evidence; the status URL follows it). With ``--json`` stdout
holds exactly one JSON document whatever the outcome (errors too: ``{"status":
"error", ...}``); progress and warnings go to stderr. An accepted submission's
outcome (new bests with their deltas, the kernel's rank before and after) is printed
under the case table.
"""
from __future__ import annotations

import argparse
import getpass
import json
import os
import sys

from kz_events import defaults
from kz_runner.contract import upload

NAME = "submit"
HELP = "submit a package (directory or .tar.gz) to a kernel_zoo server and follow its status"
DEFAULT_SERVER = defaults.SERVER_URL


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Fill the ``kz submit`` parser."""
    parser.add_argument("path", help="package directory or .tar.gz")
    parser.add_argument("--server", default=os.environ.get("KZ_SERVER", DEFAULT_SERVER),
                        help=f"server URL (env KZ_SERVER; default {DEFAULT_SERVER})")
    parser.add_argument("--submitter", default=os.environ.get("KZ_SUBMITTER"),
                        help="submitter id (env KZ_SUBMITTER; default: your user name)")
    parser.add_argument("--token", default=os.environ.get("KZ_TOKEN"),
                        help="submitter token when the server requires one (env KZ_TOKEN)")
    parser.add_argument("--kernel-id", default=None,
                        help="kernel_id (default: the tarball's top folder, or for a directory its "
                             "bench_result.yaml's when the folder's path ends with it, else its path "
                             "under the kernel repo root)")
    parser.add_argument("--idempotency-key", default=None, metavar="KEY",
                        help="the upload's Idempotency-Key (default: a new uuid4 per invocation); "
                             "repeat a key to make a repeated submission a no-op on the server")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--no-wait", action="store_true", help="return once the server has queued it")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds to follow the status before giving up (default 3600)")


class _Watcher:
    """Shows progress (unless quiet) and each distinct queue warning once, on stderr."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.warned: set[str] = set()

    def progress(self, doc: dict, elapsed: float) -> None:
        """One line per status change."""
        if not self.quiet:
            print(f"[{elapsed:6.1f}s] {doc.get('status')}", file=sys.stderr, flush=True)

    def document(self, doc: dict) -> None:
        """Every status document: print a queue warning the first time it appears."""
        from kz_runner.tools.submit import queue_warning_line

        line = queue_warning_line(doc)
        if line and line not in self.warned:
            self.warned.add(line)
            print(line, file=sys.stderr, flush=True)


def _emit_json(doc: dict) -> None:
    print(json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=True))


def _error(args: argparse.Namespace, message: str, code: str = "ERROR", **extra) -> int:
    """Report an exit-2 failure: on stderr, and as the one JSON document with --json."""
    print(f"kz submit: {message}", file=sys.stderr)
    if args.json:
        _emit_json({"status": "error", "code": code, "message": message, **extra})
    return 2


def _render_problem(found: dict) -> str:
    """A problem dict in ``kz validate``'s one-line form."""
    from kz_runner.contract.problems import Problem

    try:
        return Problem(**found).render()
    except TypeError:  # not one of ours (a server's free-form reason): show it as it came
        return f"{found.get('code')}: {found.get('message')}"


def _intake_rejected(args: argparse.Namespace, exc) -> int:
    from kz_runner.tools import submit as sub

    doc = {"status": "rejected", "stage": "intake", "code": exc.code, "message": exc.message,
           "details": exc.details}
    if args.json:
        _emit_json(doc)
        return sub.EXIT_REJECTED
    print(f"kz submit: rejected at intake: {exc.message}", file=sys.stderr)
    problems = [p for p in (exc.details or {}).get("problems") or [] if isinstance(p, dict)]
    for found in problems:
        print(f"  {_render_problem(found)}", file=sys.stderr)
    if not problems:
        for line in sub.reason_lines((exc.details or {}).get("reasons")):
            print(f"  {line}", file=sys.stderr)
    return sub.EXIT_REJECTED


def run(args: argparse.Namespace) -> int:
    """Do the submission; see the module docstring for exit codes."""
    from kz_runner.tools import submit as sub
    from kz_runner.worker.client import ApiError, ClientError, ZooClient

    submitter = args.submitter or getpass.getuser()
    if not upload.is_submitter_id(submitter):
        return _error(args, f"{submitter!r} is not a valid submitter id ({upload.SUBMITTER_RULE}); "
                            "pass --submitter", "USAGE")
    key = args.idempotency_key or sub.new_idempotency_key()
    if not upload.is_idempotency_key(key):
        return _error(args, f"{key!r} is not a usable idempotency key ({upload.IDEMPOTENCY_KEY_RULE})", "USAGE")
    try:
        prepared = sub.prepare(args.path, args.kernel_id)
    except sub.LocalRejection as exc:
        if args.json:
            _emit_json({"status": "rejected", "stage": "local", "message": str(exc), "problems": exc.problems})
        else:
            print(f"kz submit: {exc}; nothing was uploaded", file=sys.stderr)
            for found in exc.problems:
                print(f"  {_render_problem(found)}", file=sys.stderr)
        return sub.EXIT_REJECTED
    except sub.SubmitError as exc:
        return _error(args, str(exc), "USAGE")
    try:
        client = ZooClient(args.server, args.token)
    except ValueError as exc:
        return _error(args, str(exc), "USAGE")
    watcher = _Watcher(quiet=args.json)
    uuid = None
    try:
        try:
            created = sub.upload(client, prepared, submitter, key)
        except ApiError as exc:
            if exc.code == "VALIDATION_ERROR":
                return _intake_rejected(args, exc)
            raise
        uuid = created.get("uuid")
        if not args.json:
            print(f"submitted {prepared.kernel_id} as {uuid} ({created.get('status')}); "
                  f"status: {args.server.rstrip('/')}/submissions/{uuid}", file=sys.stderr)
        if created.get("status") == "held":  # an admin decides, maybe hours from now: say why and return
            final = client.request_json("GET", f"/api/submissions/{uuid}/status").body
            final = final if isinstance(final, dict) else dict(created)
        elif args.no_wait:
            if args.json:
                _emit_json(created)
            else:
                print(uuid)
            return sub.EXIT_ACCEPTED
        else:
            final = sub.follow(client, str(uuid), args.timeout, watcher.progress, on_doc=watcher.document)
    except ApiError as exc:
        return _error(args, f"server answered {exc.status} {exc.code}: {exc.message}", exc.code,
                      uuid=uuid, details=exc.details)
    except (ClientError, sub.SubmitError, OSError) as exc:
        return _error(args, str(exc), type(exc).__name__, uuid=uuid)
    finally:
        if prepared.packed:
            sub.discard(prepared)
    status = final.get("status")
    if args.json:
        _emit_json(final)
    else:
        print(f"{status}: {prepared.kernel_id} ({uuid})")
        if status == "held":
            for line in sub.held_lines(final):
                print(line)
            print(f"follow it: {args.server.rstrip('/')}/submissions/{uuid}")
            return sub.exit_code_for(status)
        print(sub.case_table(final))
        if final.get("commit_sha"):
            print(f"commit: {final['commit_sha']}")
        for line in sub.outcome_lines(final) + sub.reason_lines(final.get("reasons")) + sub.log_tail_lines(final):
            print(line)
    return sub.exit_code_for(status)

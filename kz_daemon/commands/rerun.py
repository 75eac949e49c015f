"""``kz rerun UUID``: measure an accepted record again and show each case beside the record's figure.

The record's package and harness at its source commit run on a runner of its arch (or
only on ``--runner ID``), as a job of their own kind; the result never changes the
scorecard. ``UUID`` may be the 8-character short id ``kz`` prints. Needs an admin token
or the record's submitter's own (``--token`` or env ``KZ_TOKEN``). Follows the rerun
until it ends (``--no-wait``: print its id and return) and prints a table: each case's
recorded value and the rerun's, with their 95 % intervals, the change in % and whether
the two are within each other's noise; then the environment facts that changed. With
``--json`` stdout holds the rerun's document. Exit 0 done, 1 failed (or refused), 2
usage, network or timeout.

``kz rerun list`` shows every rerun, newest first, where each stands (``--status``,
``--record UUID``, ``--kernel ID`` filter; no token needed; ``--json``: ``GET
/api/reruns``'s document). ``kz rerun cancel RERUN_ID [--reason R]`` (an admin token)
cancels a rerun: a queued one never runs; a running one's runner finishes the job, and
its figures are discarded (the rerun ends ``cancelled``). Exit 0 when cancelled (or
cancelling), 1 refused (not an admin, unknown id, already done or failed), 2 usage or
network.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from kz_events import defaults

NAME = "rerun"
HELP = ("measure an accepted record again on a runner of its arch and compare, case by case; "
        "'list' the reruns, 'cancel' one (admin)")


#: the words ``kz rerun`` takes in place of a record's uuid (a uuid is hex: never one of them)
ACTIONS = ("list", "cancel")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Fill the ``kz rerun`` parser: ``kz rerun UUID``, ``kz rerun list``, ``kz rerun cancel RERUN_ID``."""
    parser.add_argument("uuid", metavar="UUID|list|cancel",
                        help="the accepted record's uuid, or an unambiguous prefix (8 characters); 'list' to show "
                             "every rerun; 'cancel' to cancel the rerun RERUN_ID (admin)")
    parser.add_argument("rerun_id", nargs="?", metavar="RERUN_ID",
                        help="with cancel: the rerun's id, or an unambiguous prefix (8 characters)")
    parser.add_argument("--server", default=os.environ.get("KZ_SERVER", defaults.SERVER_URL),
                        help=f"server URL (env KZ_SERVER; default {defaults.SERVER_URL})")
    parser.add_argument("--token", default=os.environ.get("KZ_TOKEN"),
                        help="an admin token, or the record's submitter's (env KZ_TOKEN)")
    parser.add_argument("--runner", default=None, help="only this runner may run it (default: any of the arch)")
    parser.add_argument("--no-wait", action="store_true", help="return once the rerun is queued")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds to follow the rerun before giving up (default 3600)")
    parser.add_argument("--reason", default="", help="with cancel: why (kept in the event log)")
    parser.add_argument("--status", default=None, help="with list: only reruns in this status")
    parser.add_argument("--record", default=None, metavar="UUID", help="with list: only reruns of this record")
    parser.add_argument("--kernel", default=None, metavar="ID", help="with list: only reruns of this kernel_id")
    parser.add_argument("--json", action="store_true",
                        help="print the rerun's document (list: every rerun's) as JSON")


def _num(value: object) -> str:
    return f"{value:.6g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _figure(value: object, spread: object) -> str:
    text = _num(value)
    if isinstance(spread, list) and len(spread) == 2:
        text += f" [{_num(spread[0])}-{_num(spread[1])}]"
    return text


def describe(doc: dict) -> list[str]:
    """The rerun in words and a table (see the module docstring)."""
    lines = [f"rerun {str(doc.get('rerun_id'))[:8]} of {doc.get('kernel_id')} "
             f"(record {str(doc.get('uuid'))[:8]}): {doc.get('status')}"
             + (f" on {doc['runner_id']}" if doc.get("runner_id") else "")]
    reason = doc.get("reason")
    if isinstance(reason, dict):
        lines.append(f"reason: {reason.get('code')}: {reason.get('message')}")
    cases = [c for c in doc.get("cases") or [] if isinstance(c, dict)]
    if cases:
        rows = [("case", "metric", "record", "rerun", "change", "within noise", "correctness")]
        for c in cases:
            noise = {True: "yes", False: "NO", None: "-"}.get(c.get("within_noise"), "-")
            change = f"{c['delta_pct']:+.1f} %" if isinstance(c.get("delta_pct"), (int, float)) else "-"
            rows.append((str(c.get("test_case_id")), f"{c.get('metric')}" + (f" ({c['unit']})" if c.get("unit") else ""),
                         _figure(c.get("original"), c.get("original_spread")), _figure(c.get("value"), c.get("spread")),
                         change, noise, str(c.get("correctness") or "-")))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    overall = doc.get("overall")
    if isinstance(overall, dict) and isinstance(overall.get("speedup"), (int, float)):
        lines.append(f"overall: {overall['speedup']:.3g}x the record ({overall.get('delta_pct'):+.1f} %); "
                     f"every case correct: {'yes' if overall.get('correct') else 'NO'}")
    if doc.get("status") == "done":
        changes = [c for c in doc.get("env_changes") or [] if isinstance(c, dict)]
        lines.append("environment: as the record's" if not changes else "environment changes:")
        lines += [f"  {c.get('key')}: {json.dumps(c.get('original'))} -> {json.dumps(c.get('rerun'))}"
                  for c in changes]
    return lines


def table(docs: list[dict]) -> list[str]:
    """``kz rerun list``'s table: one line per rerun, newest first."""
    if not docs:
        return ["no reruns"]
    rows = [("rerun", "record", "kernel", "status", "runner", "requested", "attempts", "reason")]
    for d in docs:
        found = d.get("reason")
        reason: dict = found if isinstance(found, dict) else {}
        rows.append((str(d.get("rerun_id"))[:8], str(d.get("uuid"))[:8], str(d.get("kernel_id")),
                     str(d.get("status")) + (" (figures discarded)" if d.get("discarded") else ""),
                     str(d.get("runner_id") or d.get("runner") or "-"), str(d.get("requested_at") or "-"),
                     str(d.get("attempts", 0)), str(reason.get("code") or "-")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]


def _list(args: argparse.Namespace, client: Any) -> int:
    import urllib.parse

    query = {k: v for k, v in (("status", args.status), ("uuid", args.record), ("kernel", args.kernel)) if v}
    path = "/api/reruns" + ("?" + urllib.parse.urlencode(query) if query else "")
    doc = client.request_json("GET", path).body
    if args.json:
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        print("\n".join(table(doc.get("reruns") or [])))
    return 0


def _cancel(args: argparse.Namespace, client: Any) -> int:
    body = {"reason": args.reason} if args.reason else {}
    doc = client.request_json("POST", f"/api/reruns/{args.rerun_id.strip()}/cancel", body).body
    if args.json:
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        lines = describe(doc)
        if doc.get("status") == "cancelling":
            lines.append("its runner finishes the job; its figures will be discarded")
        print("\n".join(lines))
    return 0


def _print(args: argparse.Namespace, doc: dict) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        print("\n".join(describe(doc)))



def _refused(prog: str, exc: Any) -> int:
    """Say the server's refusal (an ``ApiError``; the candidates of an ambiguous short id): 1, or 2 for a
    server error."""
    print(f"{prog}: {exc.code}: {exc.message}", file=sys.stderr)
    for candidate in (exc.details or {}).get("candidates") or []:
        print(f"  {candidate}", file=sys.stderr)
    return 1 if exc.status < 500 else 2

def run(args: argparse.Namespace) -> int:
    """Ask for the rerun and follow it; 0 done, 1 failed or refused, 2 usage/network/timeout."""
    from kz_runner.worker.client import ApiError, ClientError, ZooClient

    action = args.uuid.strip() if args.uuid.strip() in ACTIONS else None
    if action == "cancel" and not args.rerun_id:
        print("kz rerun cancel: name the rerun: kz rerun cancel RERUN_ID", file=sys.stderr)
        return 2
    if action != "cancel" and args.rerun_id:
        print(f"kz rerun: unexpected argument {args.rerun_id!r} (only 'cancel' takes a RERUN_ID)", file=sys.stderr)
        return 2
    if action == "list":
        try:
            return _list(args, ZooClient(args.server, args.token))
        except ApiError as exc:
            print(f"kz rerun list: {exc.code}: {exc.message}", file=sys.stderr)
            return 1 if exc.status < 500 else 2
        except (ClientError, ValueError, OSError) as exc:
            print(f"kz rerun list: {exc}", file=sys.stderr)
            return 2
    if not args.token and action == "cancel":
        print("kz rerun cancel: needs an admin token (--token or env KZ_TOKEN)", file=sys.stderr)
        return 2
    if action == "cancel":
        try:
            return _cancel(args, ZooClient(args.server, args.token))
        except ApiError as exc:
            return _refused("kz rerun cancel", exc)
        except (ClientError, ValueError, OSError) as exc:
            print(f"kz rerun cancel: {exc}", file=sys.stderr)
            return 2
    if not args.token:
        print("kz rerun: needs a token: an admin's or the record's submitter's (--token or env KZ_TOKEN)",
              file=sys.stderr)
        return 2
    try:
        client = ZooClient(args.server, args.token)
        body = {"runner": args.runner} if args.runner else {}
        doc = client.request_json("POST", f"/api/submissions/{args.uuid.strip()}/rerun", body).body
        if not args.json:
            print(f"rerun {doc['rerun_id']} queued for a {doc['arch']} runner"
                  + (f" ({args.runner} only)" if args.runner else "") + f": {args.server.rstrip('/')}"
                  f"/submissions/{doc['uuid']}", file=sys.stderr)
        if args.no_wait:
            if args.json:
                _print(args, doc)
            else:
                print(doc["rerun_id"])
            return 0
        deadline = time.monotonic() + args.timeout
        while not doc.get("terminal"):
            left = deadline - time.monotonic()
            if left <= 0:
                print(f"kz rerun: gave up after {args.timeout:.0f} s; rerun {doc['rerun_id']} is still "
                      f"{doc.get('status')}", file=sys.stderr)
                return 2
            wait = max(0.0, min(25.0, left))
            doc = client.request_json("GET", f"/api/reruns/{doc['rerun_id']}?wait={wait:.1f}",
                                      timeout_s=wait + 30).body
    except ApiError as exc:
        return _refused("kz rerun", exc)
    except (ClientError, ValueError, OSError) as exc:
        print(f"kz rerun: {exc}", file=sys.stderr)
        return 2
    _print(args, doc)
    return 0 if doc.get("status") == "done" else 1

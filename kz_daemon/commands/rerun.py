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
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

NAME = "rerun"
HELP = "measure an accepted record again on a runner of its arch and compare, case by case"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Fill the ``kz rerun`` parser."""
    parser.add_argument("uuid", help="the accepted record's uuid, or an unambiguous prefix (8 characters)")
    parser.add_argument("--server", default=os.environ.get("KZ_SERVER", "http://127.0.0.1:8470"),
                        help="server URL (env KZ_SERVER; default http://127.0.0.1:8470)")
    parser.add_argument("--token", default=os.environ.get("KZ_TOKEN"),
                        help="an admin token, or the record's submitter's (env KZ_TOKEN)")
    parser.add_argument("--runner", default=None, help="only this runner may run it (default: any of the arch)")
    parser.add_argument("--no-wait", action="store_true", help="return once the rerun is queued")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds to follow the rerun before giving up (default 3600)")
    parser.add_argument("--json", action="store_true", help="print the rerun's document as JSON")


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


def _print(args: argparse.Namespace, doc: dict) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        print("\n".join(describe(doc)))


def run(args: argparse.Namespace) -> int:
    """Ask for the rerun and follow it; 0 done, 1 failed or refused, 2 usage/network/timeout."""
    from kz_runner.worker.client import ApiError, ClientError, ZooClient

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
        print(f"kz rerun: {exc.code}: {exc.message}", file=sys.stderr)
        for candidate in (exc.details or {}).get("candidates") or []:
            print(f"  {candidate}", file=sys.stderr)
        return 1 if exc.status < 500 else 2
    except (ClientError, ValueError, OSError) as exc:
        print(f"kz rerun: {exc}", file=sys.stderr)
        return 2
    _print(args, doc)
    return 0 if doc.get("status") == "done" else 1

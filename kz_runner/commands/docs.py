"""``kz docs``: regenerate docs/kernel_package_format.md from the schemas (``--check``: is it current?).

``--json`` prints one document instead of the line: ``{"out", "status"}`` with status
``written``, ``current``, ``stale`` or ``missing`` (the exit code stays the same).
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import sys

NAME = "docs"
HELP = "Generate docs/kernel_package_format.md from schemas/*.json and the problem codes (--check: exit 1 if stale)."
DEFAULT_OUT = os.path.join("docs", "kernel_package_format.md")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--out``, ``--check``."""
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"file to write or check (default: {DEFAULT_OUT})")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when the file differs from what would be generated")
    parser.add_argument("--json", action="store_true", help='print {"out", "status": written|current|stale|missing}')


def _say(args: argparse.Namespace, status: str, line: str) -> None:
    if args.json:
        print(json.dumps({"out": args.out, "status": status}))
    elif line:
        print(line)


def run(args: argparse.Namespace) -> int:
    """Write (0) or check (0 current, 1 stale or missing); 2 when the file cannot be written."""
    from kz_events.durable import atomic_write
    from kz_runner.tools.docgen import render

    text = render()
    if args.check:
        try:
            with open(args.out, encoding="utf-8") as handle:
                current = handle.read()
        except FileNotFoundError:
            print(f"kz docs: {args.out} is missing; run `kz docs` to generate it", file=sys.stderr)
            _say(args, "missing", "")
            return 1
        if current == text:
            _say(args, "current", f"{args.out} is up to date")
            return 0
        diff = difflib.unified_diff(current.splitlines(), text.splitlines(), args.out, "generated", lineterm="", n=1)
        shown = list(diff)[:40]
        print("\n".join(shown), file=sys.stderr)
        print(f"kz docs: {args.out} is stale; run `kz docs` and commit the result", file=sys.stderr)
        _say(args, "stale", "")
        return 1
    try:
        directory = os.path.dirname(args.out)
        if directory:
            os.makedirs(directory, exist_ok=True)
        atomic_write(args.out, text.encode("utf-8"))
    except OSError as exc:
        print(f"kz docs: cannot write {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    _say(args, "written", f"wrote {args.out}")
    return 0

"""``kz validate PATH``: check a package directory or a submission .tar.gz without running it."""
from __future__ import annotations

import argparse
import json
import os
import sys

NAME = "validate"
HELP = ("Check a kernel package directory or .tar.gz against the contract and the static source rules "
        "(exit 0 valid, 1 invalid, 2 usage).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``PATH``, ``--kernel-id``, ``--json``."""
    parser.add_argument("path", metavar="PATH", help="package directory or submission .tar.gz")
    parser.add_argument("--kernel-id", help="the kernel_id to check against (default: derived from the "
                        "path, bench_result.yaml, or the tarball's top directory)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON document")


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as handle:
        return handle.read(2) == b"\x1f\x8b"


def render_report(report, out) -> None:
    """Problems (errors, then warnings) and a verdict line, for people."""
    for found in report.errors + report.warnings:
        print(found.render(), file=out)
    kernel_id = report.facts.get("kernel_id") or report.subject
    counts = f"{len(report.errors)} error(s), {len(report.warnings)} warning(s)"
    verdict = "VALID" if report.valid else "INVALID"
    print(f"{verdict}: {kernel_id} ({counts})", file=out)


def run(args: argparse.Namespace) -> int:
    """Validate and print; 0 valid (warnings allowed), 1 invalid, 2 usage error."""
    path = args.path
    if not os.path.exists(path):
        print(f"kz validate: {path}: no such file or directory", file=sys.stderr)
        return 2
    is_dir = os.path.isdir(path)
    if not is_dir and not (path.endswith((".tar.gz", ".tgz")) or _is_gzip(path)):
        print(f"kz validate: {path}: neither a package directory nor a .tar.gz", file=sys.stderr)
        return 2
    from kz_runner.contract.validate import validate_package_dir, validate_tarball

    if is_dir:
        report = validate_package_dir(path, kernel_id=args.kernel_id, rules=True)
    else:
        report = validate_tarball(path, os.path.basename(path), kernel_id=args.kernel_id, rules=True)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    else:
        render_report(report, sys.stdout)
    return 0 if report.valid else 1

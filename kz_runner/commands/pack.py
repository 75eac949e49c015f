"""``kz pack PKG_DIR``: validate a package and write its deterministic submission .tar.gz."""
from __future__ import annotations

import argparse
import json
import os
import sys

NAME = "pack"
HELP = "Pack a package directory into a deterministic .tar.gz (bench_result.yaml left out); refuses invalid packages."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``PKG_DIR``, ``-o``, ``--kernel-id``, ``--json``."""
    parser.add_argument("package", metavar="PKG_DIR", help="package directory (holds .kernel_package/)")
    parser.add_argument("-o", "--output", metavar="OUT.tar.gz",
                        help="where to write (default: ./<kernel_id with / as __>.tar.gz)")
    parser.add_argument("--kernel-id", help="kernel_id (default: bench_result.yaml's when the folder's path ends with it, "
                        "else the path under the repo root)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON document")


def run(args: argparse.Namespace) -> int:
    """Pack; 0 written, 1 refused (validation errors printed), 2 usage error."""
    if not os.path.isdir(args.package):
        print(f"kz pack: {args.package}: not a directory", file=sys.stderr)
        return 2
    if args.output is not None and not args.output.endswith(".tar.gz"):
        print(f"kz pack: {args.output}: the output name must end in .tar.gz", file=sys.stderr)
        return 2
    from kz_runner.contract.pack import pack_package

    result = pack_package(args.package, args.output, kernel_id=args.kernel_id)
    if result.kernel_id is None and not args.json:
        for found in result.report.errors:  # why: no kernel_id anywhere, or a bench_result.yaml naming another path
            if found.code in ("KERNEL_ID_UNKNOWN", "BENCH_KERNEL_ID_MISMATCH"):
                print(found.render(), file=sys.stderr)
        print(f"kz pack: cannot tell the kernel_id of {args.package}; pass --kernel-id "
              "(or keep bench_result.yaml, or pack inside a kernel repo)", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
    else:
        for found in result.report.errors + result.report.warnings:
            print(found.render(), file=sys.stderr if found.severity == "error" else sys.stdout)
        if result.path is not None:
            print(f"{result.path}  sha256={result.sha256}  ({result.files} files, {result.size} bytes, "
                  f"kernel_id {result.kernel_id})")
        else:
            print(f"kz pack: refused: {len(result.report.errors)} error(s); fix them and pack again",
                  file=sys.stderr)
    if result.kernel_id is None:
        return 2
    return 0 if result.path is not None else 1

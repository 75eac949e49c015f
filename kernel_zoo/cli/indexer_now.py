"""``python -m kernel_zoo.cli.indexer_now``: the guide's name for ``kz index``.

Reads the kernel repo from ``KERNEL_ZOO_KERNEL_REPO_PATH`` and writes the index to
``KERNEL_ZOO_INDEX_PATH`` (``kz index``'s defaults), or takes ``kz index``'s options.
"""
from __future__ import annotations

import sys

from kernel_zoo.cli import run_command
from kz_runner.commands import index


def main(argv: list[str] | None = None) -> int:
    """``kz index`` with the same arguments, output and exit codes (0 written, 2 usage)."""
    return run_command(index, "python -m kernel_zoo.cli.indexer_now", argv)


if __name__ == "__main__":
    sys.exit(main())

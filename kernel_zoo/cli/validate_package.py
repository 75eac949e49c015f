"""``python -m kernel_zoo.cli.validate_package <dir or .tar.gz>``: the guide's name for ``kz validate``."""
from __future__ import annotations

import sys

from kernel_zoo.cli import run_command
from kz_runner.commands import validate


def main(argv: list[str] | None = None) -> int:
    """``kz validate`` with the same arguments, output and exit codes (0 valid, 1 invalid, 2 usage)."""
    return run_command(validate, "python -m kernel_zoo.cli.validate_package", argv)


if __name__ == "__main__":
    sys.exit(main())

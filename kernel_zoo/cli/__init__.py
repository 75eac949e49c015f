"""Guide-compatible entry points: ``validate_package`` (``kz validate``), ``indexer_now`` (``kz index``)."""
from __future__ import annotations

import argparse
from types import ModuleType


def run_command(command: ModuleType, prog: str, argv: list[str] | None) -> int:
    """Parse ``argv`` with ``command``'s own arguments and run it; its exit code."""
    parser = argparse.ArgumentParser(prog=prog, description=command.HELP)
    command.add_arguments(parser)
    return command.run(parser.parse_args(argv))

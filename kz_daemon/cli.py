"""The ``kz`` console script: one entry point, one subcommand per module.

Subcommands are discovered in ``kz_runner.commands``, ``kz_events.commands`` and
``kz_daemon.commands``. Each command module imports only the standard library at
top level (heavy imports go inside ``run``), so ``kz runner`` works on a GPU host
where the daemon's dependencies are not installed. A command module defines:

- ``NAME``: the subcommand, e.g. ``"validate"``;
- ``HELP``: one line for ``kz --help``;
- ``add_arguments(parser)``: fills an ``argparse`` parser;
- ``run(args) -> int``: does the work and returns the exit code.

Exit codes are set here and only here: 0 success, 1 a negative verdict the
command reports (invalid package, rejected submission), 2 usage or environment
error (a command prints what to fix on stderr and returns 2). ``KeyboardInterrupt``
exits 130.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from types import ModuleType

from kz_runner import __version__

COMMAND_PACKAGES = ("kz_runner.commands", "kz_events.commands", "kz_daemon.commands")


def discover() -> dict[str, ModuleType]:
    """Import every command module and map its ``NAME`` to the module."""
    found: dict[str, ModuleType] = {}
    for package_name in COMMAND_PACKAGES:
        package = importlib.import_module(package_name)
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
            if info.name.startswith("_"):
                continue
            module = importlib.import_module(f"{package_name}.{info.name}")
            name = getattr(module, "NAME", None)
            if name is None:
                continue
            if name in found:
                raise RuntimeError(f"two modules define the kz command {name!r}")
            found[name] = module
    return found


def build_parser(commands: dict[str, ModuleType]) -> argparse.ArgumentParser:
    """The top-level parser with one subparser per discovered command."""
    parser = argparse.ArgumentParser(
        prog="kz",
        description="kernel_zoo: a git-repository-driven GPU operator leaderboard.",
    )
    parser.add_argument("--version", action="version", version=f"kz {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in sorted(commands):
        module = commands[name]
        command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command_parser)
        command_parser.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; returns the process exit code."""
    commands = discover()
    parser = build_parser(commands)
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `kz submit ... | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
        return 141


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

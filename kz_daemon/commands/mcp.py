"""``kz mcp``: serve the zoo's tools to an agent over MCP on stdio, talking to a daemon's HTTP API.

An MCP client (an agent's host) starts ``kz mcp --url http://HOST:8470`` and speaks
JSON-RPC on its stdin/stdout; the tools (kz_daemon/mcp/toolset.py) read the board and a
kernel's current best, validate and submit packages from this machine's paths, and
follow a submission. Nothing but MCP goes to stdout; diagnostics go to stderr. The
daemon serves the same tools itself at ``/mcp/`` (streamable HTTP). Exit codes: 0 when
the client closed the session, 2 for a bad URL.
"""
from __future__ import annotations

import argparse
import os
import sys

from kz_events import defaults

NAME = "mcp"
HELP = "serve the zoo's tools to an agent over MCP (stdio), against a daemon's HTTP API"
DEFAULT_SERVER = defaults.SERVER_URL


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Fill the ``kz mcp`` parser."""
    parser.add_argument("--url", "--server", dest="url", default=os.environ.get("KZ_SERVER", DEFAULT_SERVER),
                        help=f"the daemon's URL (env KZ_SERVER; default {DEFAULT_SERVER})")
    parser.add_argument("--token", default=os.environ.get("KZ_TOKEN"),
                        help="submitter token when the server requires one (env KZ_TOKEN)")
    parser.add_argument("--submitter", default=os.environ.get("KZ_SUBMITTER"),
                        help="submitter id for submit_package when the call names none "
                             "(env KZ_SUBMITTER; default: your user name)")


def run(args: argparse.Namespace) -> int:
    """Serve until the client closes stdin."""
    import getpass

    from kz_daemon.mcp.toolset import build_server
    from kz_runner.tools.zoo_api import HttpBackend
    from kz_runner.worker.client import ZooClient

    try:
        client = ZooClient(args.url, args.token)
    except ValueError as exc:
        print(f"kz mcp: {exc}", file=sys.stderr)
        return 2
    submitter = args.submitter
    if not submitter:
        try:
            submitter = getpass.getuser()
        except (KeyError, OSError):
            submitter = None
    build_server(HttpBackend(client, submitter)).run()
    return 0

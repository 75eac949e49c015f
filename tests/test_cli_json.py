"""Every ``kz`` command that prints a result offers ``--json``: the parser is walked, subcommand by subcommand.

The exempt commands are services whose output is a stream of logs (``kz up``, ``kz
daemon``, ``kz runner``) or a protocol of its own (``kz mcp`` speaks MCP's JSON-RPC on
stdio). A new command, or a new action of one (``kz token revoke``), without ``--json``
fails here. The newest ``--json`` outputs are read back as JSON.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

from kz_daemon.cli import build_parser, discover
from tests.helpers.daemon import ROOT

#: command -> why it has no --json
EXEMPT = {
    "up": "runs the daemon, HTTP and a local runner until stopped: a stream of logs",
    "daemon": "runs until SIGTERM: a stream of logs",
    "runner": "serves jobs until stopped: a stream of logs",
    "mcp": "speaks MCP's own JSON-RPC on stdio",
}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...]):
    """``(path, parser)`` of every command a user can run: a parser without actions, or each action."""
    children = _subparsers(parser)
    if not children:
        yield path, parser
    for name, child in children.items():
        yield from _leaves(child, (*path, name))


def _has_json(parser: argparse.ArgumentParser) -> bool:
    return any("--json" in action.option_strings for action in parser._actions)


def test_every_command_that_prints_a_result_has_json():
    commands = _subparsers(build_parser(discover()))
    assert set(EXEMPT) <= set(commands), "an exempt command no longer exists: drop it from EXEMPT"
    missing, walked = [], []
    for name, parser in commands.items():
        if name in EXEMPT:
            continue
        for path, leaf in _leaves(parser, (name,)):
            walked.append(" ".join(path))
            if not _has_json(leaf):
                missing.append(" ".join(path))
    assert not missing, f"kz subcommands without --json: {missing}"
    # the walk reached the actions of the commands that have them
    for expected in ("token issue", "token list", "token revoke", "events tail", "events show", "review list",
                     "rerun", "docs", "validate", "submit"):
        assert expected in walked, walked
    for name in EXEMPT:  # an exempt service that gains --json should leave the list
        assert not any(_has_json(leaf) for _path, leaf in _leaves(commands[name], (name,))), name


def _kz(*argv: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kz_daemon.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_kz_token_revoke_and_kz_docs_answer_in_json(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    issued = _kz("token", "issue", "submitter", "bob", "--state-dir", str(state), "--json")
    assert issued.returncode == 0, issued.stderr
    assert json.loads(issued.stdout)["id"] == "bob"
    revoked = _kz("token", "revoke", "submitter", "bob", "--state-dir", str(state), "--json")
    assert revoked.returncode == 0, revoked.stderr
    assert json.loads(revoked.stdout) == {"kind": "submitter", "id": "bob", "revoked": 1}
    again = _kz("token", "revoke", "submitter", "bob", "--state-dir", str(state), "--json")
    assert again.returncode == 1 and json.loads(again.stdout)["revoked"] == 0

    out = tmp_path / "format.md"
    missing = _kz("docs", "--check", "--out", str(out), "--json")
    assert missing.returncode == 1 and json.loads(missing.stdout) == {"out": str(out), "status": "missing"}
    written = _kz("docs", "--out", str(out), "--json")
    assert written.returncode == 0 and json.loads(written.stdout)["status"] == "written" and out.exists()
    current = _kz("docs", "--check", "--out", str(out), "--json")
    assert current.returncode == 0 and json.loads(current.stdout)["status"] == "current"
    out.write_text(out.read_text() + "edited\n")
    stale = _kz("docs", "--check", "--out", str(out), "--json")
    assert stale.returncode == 1 and json.loads(stale.stdout)["status"] == "stale"

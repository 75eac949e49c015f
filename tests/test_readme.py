"""The README's quickstart is exactly two commands, and .ci/run runs the second one verbatim."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S)]


def test_quickstart_has_exactly_two_commands():
    commands = quickstart_commands()
    assert len(commands) == 2
    assert all("\n" not in c for c in commands), "each quickstart command is one line"
    assert commands[0].endswith("kz up")
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    test_command = quickstart_commands()[1]
    assert test_command in (ROOT / ".ci/run").read_text(encoding="utf-8")

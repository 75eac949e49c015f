"""The distribution lists every package folder, and ``kz`` discovers its subcommands."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("kz_daemon", "kz_events", "kz_runner")
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert on_disk - listed == set(), "add these packages to [tool.setuptools] packages"
    assert "kz_schemas" in listed


def test_kz_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "kz_daemon", "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "COMMAND" in out.stdout


def test_kz_without_command_is_usage_error():
    out = subprocess.run([sys.executable, "-m", "kz_daemon"], capture_output=True, text=True)
    assert out.returncode == 2

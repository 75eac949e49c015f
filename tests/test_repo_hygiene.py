"""The repository stands alone: no tracked file names a development machine, a document
outside the repository, or the period of work it was written in.

Each rule is a precise pattern, so legitimate words pass: ``requests.Session()``,
``start_new_session``, a relative ``DIR/spool/work``, a container's ``"HOME": "/root"``.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# An absolute path starts a token: nothing path-like right before the slash.
_ABS = r"(?<![\w.~/-])"
RULES: dict[str, re.Pattern[str]] = {
    "absolute path of a development machine": re.compile(
        _ABS + r"/(?:work|root)/|" + _ABS + r"/home/[A-Za-z0-9_.-]+/"),
    "a design document outside the repository": re.compile(re.escape("DESIGN" + ".md")),
    "a folder outside the repository": re.compile(re.escape(".." + "/shared")),
    "work-period wording": re.compile(r"\b[Ss]ession \d"),
}


def tracked_text_files() -> list[Path]:
    """Every file git tracks that is present and is text (no NUL byte)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = []
    for name in names.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file() and not path.is_symlink() and b"\0" not in path.read_bytes():
            files.append(path)
    return files


def hits(rule: re.Pattern[str], text: str) -> list[int]:
    """The 1-based numbers of the lines of ``text`` where ``rule`` matches."""
    return [n for n, line in enumerate(text.splitlines(), 1) if rule.search(line)]


@pytest.mark.parametrize("name", sorted(RULES))
def test_no_tracked_file_breaks_the_rule(name):
    rule = RULES[name]
    found = []
    for path in tracked_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [f"{path.relative_to(ROOT)}:{n}" for n in hits(rule, text)]
    assert not found, f"{name}: " + ", ".join(found)


@pytest.mark.parametrize("line", [
    'sys.path.insert(0, "' + "/wo" + 'rk/main/src")',
    "see /" + "root/.cache/pip",
    "cd /home/" + "alice/kernel_zoo",
    "as " + "DESIGN" + ".md §6 says",
    "ln -s " + ".." + "/shared/spec",
    "measured in " + "Session" + " 3",
    "(" + "session" + " 2: 180k)",
])
def test_each_rule_catches_its_case(line):
    assert any(rule.search(line) for rule in RULES.values()), line


@pytest.mark.parametrize("line", [
    "session = requests.Session()",
    "subprocess.Popen(argv, start_new_session=True)",
    "DIR/spool/work  the daemon's claim",
    '"HOME": "/root", "TMPDIR": "/tmp"',
    "--work-root /scratch/kz-runner",
    "a session of 3 runners",
])
def test_legitimate_uses_pass(line):
    assert not any(rule.search(line) for rule in RULES.values()), line

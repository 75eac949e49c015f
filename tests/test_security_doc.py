"""docs/security.md names, for each thing a party cannot do, the test that shows it: every one of them exists."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "security.md"


def named_tests(text: str) -> list[tuple[str, str]]:
    """``(file, test)`` for each ``tests/x.py::name`` and each ``::name`` (the file named last before it)."""
    out, current = [], None
    for match in re.finditer(r"`(tests/[\w/]+\.py)?::(\w+)`", text):
        current = match.group(1) or current
        out.append((current, match.group(2)))
    return out


def test_every_test_the_threat_model_names_exists():
    named = named_tests(DOC.read_text(encoding="utf-8"))
    assert len(named) >= 20
    missing = [(path, name) for path, name in named
               if path is None or not re.search(rf"^\s*(async )?def {name}\(", (ROOT / path).read_text(encoding="utf-8"),
                                                re.MULTILINE)]
    assert missing == []


def test_a_bare_name_belongs_to_the_file_named_before_it():
    assert named_tests("`tests/a.py::one`, `::two` and `tests/b.py::three`") == [
        ("tests/a.py", "one"), ("tests/a.py", "two"), ("tests/b.py", "three")]

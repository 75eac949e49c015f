"""Every shared default is written once, in ``kz_events/defaults.py``; the code names it.

A default written twice drifts (the benchmark timeout was 1800 s in five places and 1200 s
in the dry run): this reads every module of the three packages with ``ast`` and fails on
any of the shared literals outside the defaults module (docstrings aside: prose may quote
them).
"""
from __future__ import annotations

import ast
from pathlib import Path

from kz_events import defaults

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kz_daemon", "kz_events", "kz_runner")
SHARED = {defaults.HTTP_PORT, defaults.SERVER_URL, defaults.STATE_DIR, defaults.BENCHMARK_TIMEOUT_S}


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring constants of the module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def shared_literals(source: str) -> list[tuple[int, object]]:
    """(line, value) of each shared default written as a literal in ``source``."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and id(node) not in skip and not isinstance(node.value, bool)
            and isinstance(node.value, (int, float, str)) and node.value in SHARED]


def test_the_shared_defaults_are_written_only_in_the_defaults_module():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "kz_events" / "defaults.py" or path.parent == ROOT / "kz_runner" / "worker":
                continue  # the worker runs on runner hosts without kz_events (test_runner_isolation.py)
            found += [f"{path.relative_to(ROOT)}:{line}: {value!r}"
                      for line, value in shared_literals(path.read_text(encoding="utf-8"))]
    assert found == [], "name kz_events.defaults instead:\n" + "\n".join(found)


def test_the_check_sees_a_literal_and_not_prose():
    assert shared_literals('"""Serves on 8470."""\nPORT = 8470\ndef f():\n    """1800.0"""\n    return 1800.0\n') == \
        [(2, 8470), (5, 1800.0)]
    assert shared_literals('URL = "http://127.0.0.1:8470"\nD = "./kz-data"\n') == [(1, defaults.SERVER_URL),
                                                                                   (2, "./kz-data")]


def test_the_workers_own_copies_equal_the_defaults():
    # kz_runner.worker imports nothing of ours outside kz_runner (a runner host has no daemon packages),
    # so it keeps its own literals; they must say what the defaults module says
    from kz_runner.worker.job import JobSettings
    from kz_runner.worker.runner import RunnerConfig

    assert JobSettings.__dataclass_fields__["benchmark_timeout_s"].default == defaults.BENCHMARK_TIMEOUT_S
    assert JobSettings.__dataclass_fields__["build_timeout_s"].default == defaults.BUILD_TIMEOUT_S
    fields = RunnerConfig.__dataclass_fields__
    assert fields["default_benchmark_timeout_s"].default == defaults.BENCHMARK_TIMEOUT_S
    assert fields["default_build_timeout_s"].default == defaults.BUILD_TIMEOUT_S

"""No module or class of ours defines the same name twice: the second ``def`` silently replaces the first.

Read with ``ast`` (nothing is imported); ``@overload`` stubs and property setters/deleters
(``@x.setter``) reuse a name on purpose and are skipped.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kz_events", "kz_runner", "kz_daemon")


def _reuses_on_purpose(node: ast.AST) -> bool:
    for dec in getattr(node, "decorator_list", []):
        if isinstance(dec, ast.Name) and dec.id == "overload":
            return True
        if isinstance(dec, ast.Attribute) and dec.attr in ("setter", "deleter", "overload", "register"):
            return True
    return False


def shadowed(source: str) -> list[str]:
    """'Scope.name (lines a, b)' for every function or class defined twice in one body."""
    out = []

    def walk(body: list[ast.stmt], scope: str) -> None:
        seen: dict[str, int] = {}
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not _reuses_on_purpose(node):
                    if node.name in seen:
                        out.append(f"{scope}{node.name} (lines {seen[node.name]}, {node.lineno})")
                    seen[node.name] = node.lineno
                if isinstance(node, ast.ClassDef):
                    walk(node.body, f"{scope}{node.name}.")

    walk(ast.parse(source).body, "")
    return out


def test_the_finder_finds_a_method_defined_twice():
    source = "class Z:\n    def a(self): pass\n    def b(self): pass\n    def a(self): pass\n"
    assert shadowed(source) == ["Z.a (lines 2, 4)"]
    assert shadowed("class Z:\n    @property\n    def a(self): pass\n    @a.setter\n    def a(self, v): pass\n") == []


def test_no_definition_is_shadowed():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += [f"{path.relative_to(ROOT)}: {hit}" for hit in shadowed(path.read_text())]
    assert found == []

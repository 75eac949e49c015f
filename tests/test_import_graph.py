"""The import graph of kz_events, kz_runner and kz_daemon: one direction, no cycles.

Read with ``ast`` (nothing is imported): every ``import`` and ``from ... import``
counts, at the top of a module or inside a function, ``if TYPE_CHECKING`` included.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kz_events", "kz_runner", "kz_daemon")
#: which packages each package may import (besides itself)
ALLOWED = {"kz_events": set(), "kz_runner": {"kz_events"}, "kz_daemon": {"kz_events", "kz_runner"}}
#: the packages whose modules import ``kz_events.events`` once, at the top
EVENTS_IMPORT_SCOPE = PACKAGES


def module_name(path: Path) -> str:
    """The dotted module name of a source file under ROOT."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    """Every module of the three packages, by dotted name."""
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(name: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, ast.AST, bool]]:
    """(imported module, node, inside a function) for every import statement of one module.

    ``from pkg import mod`` names the submodule when one exists, else the package.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: list[tuple[str, ast.AST, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, child, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                target = _resolve(name, path, child)
                for alias in child.names:
                    sub = f"{target}.{alias.name}"
                    found.append((sub if sub in modules else target, child, in_function))
            visit(child, nested)

    visit(tree, False)
    return found


def graph() -> dict[str, set[str]]:
    """Module → the modules of ours it imports (a package's ``__init__`` counts as a module)."""
    modules = all_modules()
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for target, _node, _in_function in imports_of(name, path, modules):
            while target and target not in modules:
                target = target.rpartition(".")[0]  # ``import a.b.c`` of a name inside a module
            if target and target != name:
                targets.add(target)
        edges[name] = targets
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_function_level_imports_are_seen(tmp_path):
    source = tmp_path / "kz_daemon" / "m.py"
    source.parent.mkdir()
    source.write_text("def f():\n    from kz_events import events as ev\n    from . import other\n")
    found = imports_of("kz_daemon.m", source, {"kz_events.events": source, "kz_daemon.other": source})
    assert [(t, f) for t, _n, f in found] == [("kz_events.events", True), ("kz_daemon.other", True)]


def test_no_import_cycle_between_modules():
    assert cycles(graph()) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_one_way(package):
    wrong = sorted((name, target) for name, targets in graph().items() if name.split(".")[0] == package
                   for target in targets
                   if target.split(".")[0] != package and target.split(".")[0] not in ALLOWED[package])
    assert wrong == [], f"{package} may import only {sorted(ALLOWED[package]) or 'nothing of ours'}"


@pytest.mark.parametrize("package", EVENTS_IMPORT_SCOPE)
def test_the_event_catalogue_is_imported_once_at_the_top(package):
    modules = all_modules()
    wrong = []
    for name, path in modules.items():
        if name.split(".")[0] != package:
            continue
        hits = sorted({(node.lineno, in_function) for target, node, in_function in imports_of(name, path, modules)
                       if target == "kz_events.events"})  # one entry per statement
        if len(hits) > 1 or any(in_function for _line, in_function in hits):
            wrong.append((name, hits))
    assert wrong == []


#: the wing of the modules that sit directly in a package's folder
TOP = "(top)"

#: The wings of each package, lowest first: a module may import its own wing and the wings
#: before it, never one after it (docs/architecture.md, "Wings").
WINGS = {
    "kz_daemon": ("core", "board", "storage", "guards", "config", "intake", "queue", "upkeep", "accept", "ops",
                  "api", "browse", "standings", "web", "mcp", "http", "commands", "cli", "__main__"),
    "kz_runner": ("contract", "judge", "bench", "worker", "tools", "commands"),
    # kz_events' own modules at its top (events, codec, state, reducer, ...) are its lowest wing
    "kz_events": (TOP, "log", "read", "commands"),
}
#: the most modules a wing's folder may hold (``__init__`` counted)
MAX_MODULES = {"kz_runner.contract": 16}
DEFAULT_MAX_MODULES = 12


def wing_of(module: str) -> tuple[str, int] | None:
    """(package, rank of its wing) of a module, or None for a package's own ``__init__``."""
    parts = module.split(".")
    if parts[0] not in WINGS or len(parts) == 1:
        return None
    wings = WINGS[parts[0]]
    if parts[1] not in wings and TOP in wings and len(parts) == 2:
        return parts[0], wings.index(TOP)  # a module directly in the package's folder
    return parts[0], wings.index(parts[1])


def test_every_module_lives_in_a_wing():
    stray = sorted(name for name in all_modules() if name.split(".")[0] in WINGS and "." in name
                   and name.split(".")[1] not in WINGS[name.split(".")[0]]
                   and not (TOP in WINGS[name.split(".")[0]] and name.count(".") == 1))
    assert stray == [], "each module belongs to a wing listed in WINGS (or add the wing, in its place)"


def test_wings_import_downwards_only():
    wrong = []
    for name, targets in graph().items():
        here = wing_of(name)
        for target in targets:
            there = wing_of(target)
            if here and there and here[0] == there[0] and there[1] > here[1]:
                wrong.append((name, target))
    assert sorted(wrong) == [], "a wing imports only itself and the wings before it"


def test_the_daemon_uses_only_the_runner_contract():
    """Below its commands, the daemon imports ``kz_runner.contract`` (and the version) only."""
    wrong = sorted((name, target) for name, targets in graph().items()
                   if name.startswith("kz_daemon.") and name.split(".")[1] not in ("commands", "cli")
                   for target in targets
                   if target.startswith("kz_runner") and target != "kz_runner"
                   and not target.startswith("kz_runner.contract"))
    assert wrong == []


def test_wing_folders_stay_small():
    big = []
    for package in PACKAGES:
        folders = [ROOT / package, *(ROOT / package).rglob("*")]
        for folder in sorted(p for p in folders if p.is_dir() and (p / "__init__.py").exists()):
            dotted = ".".join(folder.relative_to(ROOT).parts)
            count = len(list(folder.glob("*.py")))
            if count > MAX_MODULES.get(dotted, DEFAULT_MAX_MODULES):
                big.append((dotted, count))
    assert big == []


def test_no_two_modules_share_a_basename_within_a_package():
    """A module's name says what it is; the commands are named after their ``kz`` verbs instead."""
    seen: dict[tuple[str, str], list[str]] = {}
    for name in all_modules():
        parts = name.split(".")
        if len(parts) > 1 and parts[-1] != "__main__" and parts[1] != "commands":
            seen.setdefault((parts[0], parts[-1]), []).append(name)
    repeated = {key: names for key, names in seen.items() if len(names) > 1 and not key[1].startswith("_")}
    assert repeated == {}


def test_no_class_name_is_used_twice():
    """A class's name says which thing it is: no two classes of the three packages share one
    (``Finding`` was five classes; the judge's, the rules', the audits' now say whose)."""
    where: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    where.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


def test_the_module_map_names_every_module():
    """docs/architecture.md's module map lists every module of the three packages."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = sorted(str(path.relative_to(ROOT)) for path in (all_modules().values())
                     if path.name != "__init__.py" and f"`{path.relative_to(ROOT).as_posix()}`" not in text)
    assert missing == [], "add these modules to the module map in docs/architecture.md"

"""The staged harness library: the part of this installation a job's steps may import.

A package's ``benchmark.py`` imports ``kz_runner.bench``. Instead of putting the
runner's whole installation on the steps' ``PYTHONPATH``, :func:`stage` copies
``kz_runner.bench`` and the closure of this project's modules it imports (found
by reading the import statements, function-level ones included, so a new import
in the library is followed without a list to keep) into a directory of its own,
read-only: files 0444, directories 0555, owned by the runner's user.

The limit, stated plainly: this decides what the steps' ``PYTHONPATH`` exposes
and what the staged ``kz_runner`` package resolves to first. It does not hide
files. An installation that is readable by the job's user (a site-packages
directory or an editable install) can still be found and read by code that goes
looking for it; nothing secret lives in the code itself.
"""
from __future__ import annotations

import ast
import os
import shutil
import stat
from importlib.util import find_spec
from pathlib import Path

# Top-level packages of this project that the staged library may carry.
OURS = ("kz_runner", "kz_schemas", "kz_events")
ROOT_MODULE = "kz_runner.bench"
# Packages staged whole with the library: the judge's worker module is started by name
# (``python -m kz_runner.judge.serve_kernel``), which no import statement names.
WHOLE_PACKAGES = ("kz_runner.judge",)


def _imports(path: Path, module: str, is_package: bool) -> set[str]:
    """Names of this project's modules ``path`` imports (absolute and relative)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return set()
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return {name for name in found if name.split(".")[0] in OURS}


def closure(root: str = ROOT_MODULE) -> dict[str, Path]:
    """``{module name: source file}`` of ``root``, its submodules and everything of ours
    they import, with the ``__init__`` of every package on the way."""
    todo, seen = [root, *WHOLE_PACKAGES], {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            spec = find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue  # "from kz_runner.bench import device" names a module, "... import Check" does not
        origin = Path(spec.origin)
        seen[name] = origin
        is_package = spec.submodule_search_locations is not None
        todo.extend(_imports(origin, name, is_package))
        if "." in name:
            todo.append(name.rpartition(".")[0])
        if (name == root or name in WHOLE_PACKAGES) and is_package:
            todo.extend(f"{name}.{p.stem}" for p in origin.parent.glob("*.py") if p.stem != "__init__")
    return seen


def _data_files(modules: dict[str, Path]) -> list[tuple[str, Path]]:
    """Non-Python files a staged package needs: the JSON Schemas of ``kz_schemas``."""
    init = modules.get("kz_schemas")
    if init is None:
        return []
    return [(f"kz_schemas/{p.name}", p) for p in sorted(init.parent.glob("*.json"))]


def stage(dest: Path, root: str = ROOT_MODULE) -> list[str]:
    """Copy the library into ``dest`` (made fresh) read-only; returns the relative paths copied."""
    dest = Path(dest)
    if dest.exists():
        for path in [dest, *dest.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                os.chmod(path, stat.S_IRWXU)
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    modules = closure(root)
    copied = []
    files = []
    for name, origin in modules.items():
        rel = name.replace(".", "/") + ("/__init__.py" if origin.name == "__init__.py" else ".py")
        files.append((rel, origin))
    files.extend(_data_files(modules))
    for rel, origin in sorted(files):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(origin, target)
        os.chmod(target, 0o444)
        copied.append(rel)
    for path in sorted((p for p in dest.rglob("*") if p.is_dir()), reverse=True):
        os.chmod(path, 0o555)
    os.chmod(dest, 0o555)
    return copied

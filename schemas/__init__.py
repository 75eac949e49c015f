"""The project's JSON Schemas (draft 2020-12), shipped as the package ``kz_schemas``.

The files beside this module are the single source of truth for every document
format kernel_zoo reads or writes; ``docs/kernel_package_format.md`` is generated
from them by ``kz docs``.
"""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path

SCHEMA_DIR = Path(__file__).resolve().parent


def names() -> list[str]:
    """Names (without ``.json``) of every schema shipped, sorted."""
    return sorted(p.stem for p in SCHEMA_DIR.glob("*.json"))


@cache
def load(name: str) -> dict:
    """Return the parsed schema ``<name>.json``; raises KeyError for an unknown name."""
    path = SCHEMA_DIR / f"{name}.json"
    if not path.is_file():
        raise KeyError(f"no schema named {name!r} in {SCHEMA_DIR}")
    return json.loads(path.read_text(encoding="utf-8"))

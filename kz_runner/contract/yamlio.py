"""YAML reading for contract files: libyaml's safe loader, and nothing else.

Every YAML document a package carries is read by PyYAML's ``CSafeLoader`` (the pure
Python ``SafeLoader`` only where PyYAML was built without libyaml), so what the
validator, the index and the daemon see is exactly what any YAML tool sees.
"""
from __future__ import annotations

from typing import Any

import yaml

try:  # libyaml is ~10x faster, which an index of 10,000 packages needs
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML built without libyaml
    _Loader = yaml.SafeLoader

YAMLError = yaml.YAMLError

__all__ = ["YAMLError", "load_yaml", "yaml_error_text"]


def load_yaml(text: str | bytes) -> Any:
    """Parse one YAML document with the safe loader; raises :class:`YAMLError` on bad input."""
    return yaml.load(text, Loader=_Loader)


def yaml_error_text(error: Exception) -> str:
    """A one-line description of a YAML error, with line and column when known."""
    mark = getattr(error, "problem_mark", None)
    what = getattr(error, "problem", None) or str(error).splitlines()[0]
    if mark is not None:
        return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    return str(what)

"""YAML reading for contract files: safe loading only, the C loader when available.

:func:`load_yaml` returns exactly what ``yaml.load(text, Loader=CSafeLoader)``
returns. libyaml parses and composes the node tree in C; turning the nodes into
Python objects is PyYAML's Python constructor, a generator machine built for
aliases and recursive documents that costs more than the parse itself. For the
common plain document (mappings, sequences, str/int/float/bool/null/timestamp
scalars, no node reached twice, no merge keys) a direct walk over the node tree
builds the same objects with the SafeConstructor's own scalar functions; any
other document, and any error on the way, goes to the standard constructor on
the same node tree, so its values and its exceptions are the standard ones.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

try:  # libyaml makes loading ~10x faster, which the index of 10,000 packages needs
    _BaseLoader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML built without libyaml
    _BaseLoader = yaml.SafeLoader

YAMLError = yaml.YAMLError

_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
#: keys the standard constructor rewrites in ``flatten_mapping``: leave those documents to it
_SPECIAL_KEYS = frozenset({"tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"})
_SCALARS = {tag: SafeConstructor.yaml_constructors[tag] for tag in (
    "tag:yaml.org,2002:null", "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp")}
_RESOLVED_MAX = 50_000


_RESOLVER = yaml.resolver.Resolver()  # the safe loader's resolver, for the memo below


@lru_cache(maxsize=_RESOLVED_MAX)  # bounded: unique values must not grow it forever
def _resolve_tag(kind, value, implicit):
    """The safe resolver's tag for a node (kind, scalar value, implicit flags)."""
    return _RESOLVER.resolve(kind, value, implicit)


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    """The safe C loader with a memo of implicit tags.

    libyaml calls ``resolve`` for every node, and the safe resolver's answer depends
    only on (kind, value, implicit flags) when no path resolvers are registered (the
    safe loader has none): the memo (a C-level ``lru_cache``, no Python frame on a hit)
    skips its regex matching and the method call.
    """

    if not _BaseLoader.yaml_path_resolvers and type(_RESOLVER) in _BaseLoader.__mro__:
        resolve = staticmethod(_resolve_tag)  # type: ignore[assignment]
        # libyaml calls these around every node; without path resolvers they do nothing, and
        # builtins that accept the same arguments cost less than a Python method call
        descend_resolver = slice  # type: ignore[assignment]
        ascend_resolver = tuple  # type: ignore[assignment]


class _Unsure(Exception):
    """The direct walk does not handle this document: use the standard constructor."""


def _construct_plain(loader: Any, root: Any) -> Any:
    """The Python value of a plain node tree, or :class:`_Unsure`."""
    seen: set[int] = set()

    def build(node: Any) -> Any:
        cls = node.__class__
        tag = node.tag
        if cls is ScalarNode:
            if tag == _STR:
                return node.value
            make = _SCALARS.get(tag)
            if make is None:
                raise _Unsure
            return make(loader, node)
        if id(node) in seen:  # an alias (shared or recursive object): identity matters there
            raise _Unsure
        seen.add(id(node))
        if cls is MappingNode and tag == _MAP:
            out = {}
            for key_node, value_node in node.value:
                # plain string keys and values (most nodes) inline: a call per node is the main cost
                if key_node.tag == _STR and key_node.__class__ is ScalarNode:
                    key = key_node.value
                elif key_node.tag in _SPECIAL_KEYS:
                    raise _Unsure
                else:
                    key = build(key_node)
                if value_node.tag == _STR and value_node.__class__ is ScalarNode:
                    out[key] = value_node.value
                else:
                    out[key] = build(value_node)  # an unhashable key raises: standard path
            return out
        if cls is SequenceNode and tag == _SEQ:
            return [build(child) for child in node.value]
        raise _Unsure

    return build(root)


def load_yaml(text: str | bytes) -> Any:
    """Parse one YAML document with a safe loader; raises :class:`YAMLError` on bad input.

    The result (and any exception) is that of ``yaml.load(text, Loader=yaml.CSafeLoader)``.
    """
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            return _construct_plain(loader, node)
        except Exception:  # _Unsure, or an error the standard constructor reports its own way
            return loader.construct_document(node)
    finally:
        loader.dispose()


def yaml_error_text(error: Exception) -> str:
    """A one-line description of a YAML error, with line and column when known."""
    mark = getattr(error, "problem_mark", None)
    what = getattr(error, "problem", None) or str(error).splitlines()[0]
    if mark is not None:
        return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    return str(what)

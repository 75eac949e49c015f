"""YAML reading for contract files: safe loading only, the C loader when available.

:func:`load_yaml` returns exactly what ``yaml.load(text, Loader=CSafeLoader)``
returns, by one of two paths:

1. A line-oriented reader for the block-style subset the contract files use
   (desc.yaml, bench_result.yaml as written by hand, by the guide's templates and
   by the scorecard writer): block mappings and sequences (indentless sequences
   included), one-line plain and quoted scalars, ``|``/``|-`` literal blocks, and
   one-line flow collections of scalars (a flow mapping, of up to 12 entries, may
   also hold flow sequences of scalars). It accepts a text only where that subset provably reads
   as PyYAML's safe loader reads it: plain scalars are typed by PyYAML's own
   resolver and SafeConstructor functions, quoted ones are strings, and anything
   else, however harmless (tabs, CR, BOM, control characters, anchors, aliases,
   tags, document markers, directives, complex keys, multi-line plain or quoted
   scalars, folded blocks, flow collections over several lines, indentation it
   does not expect, merge keys, a text not ending in a newline ...), makes it give
   up. Building Python objects straight from the lines skips the ~130 event and
   node objects per document that libyaml and PyYAML's composer create, the main
   cost of a leaderboard index rebuild.
2. Otherwise libyaml parses and composes the node tree in C; turning the nodes
   into Python objects is PyYAML's Python constructor, a generator machine built
   for aliases and recursive documents that costs more than the parse itself. For
   the common plain document (mappings, sequences, str/int/float/bool/null/timestamp
   scalars, no node reached twice, no merge keys) a direct walk over the node tree
   builds the same objects with the SafeConstructor's own scalar functions; any
   other document, and any error on the way, goes to the standard constructor on
   the same node tree, so its values and its exceptions are the standard ones.

The line reader memoises what each line holds (contract files repeat most of their
lines from package to package) and the object of each plain scalar: equal immutable
scalars may be shared between results, containers never are. The values are equal,
and of equal types, to the standard loader's.
"""
from __future__ import annotations

import re
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


# ---------------------------------------------------------------- the line-oriented subset


class _Outside(Exception):
    """The text is outside the subset the line reader proves equal to the safe loader."""


_CONSTRUCTOR = SafeConstructor()  # the scalar functions of _SCALARS read no state of their loader
#: the first characters of plain scalars some implicit resolver may claim (any other is a str)
_IMPLICIT_FIRST = frozenset(_RESOLVER.yaml_implicit_resolvers)
#: the line reader relies on the resolver answering from (value) alone, by first character
_LINES_OK = (None not in _RESOLVER.yaml_implicit_resolvers and not _BaseLoader.yaml_path_resolvers
             and type(_RESOLVER) in _BaseLoader.__mro__)
#: characters that may not start a plain scalar ('-' may, before a non-space: handled apart)
_INDICATORS = frozenset("-?:,[]{}#&*!|>'\"%@`")
#: the ASCII bytes the line reader takes as they are: line feed and printable characters
_ASCII_OK = bytes([0x0A, *range(0x20, 0x7F)])
#: what is left of a text once those are deleted (non-ASCII, or bad ASCII) must match none of this:
#: libyaml's printable set less tab, CR, NEL, LS, PS and BOM (line breaks, blanks, the BOM)
_NOT_TAKEN = re.compile("[^\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]")
_ROWS_MAX = 16_384  # memoised lines (see _row)
_KEY_MAX = 250  # libyaml drops a simple key whose ":" is over 1024 characters (or bytes) on

# One-line flow collections: scalars, flow sequences of scalars, flow mappings of up to
# _FLOW_MAP_MAX scalar keys to those. A plain scalar in a flow takes no ':', '?' or '#'
# (libyaml versions differ on the first two there) and no trailing space. Each pattern
# matches in one way only from a given start, so ``findall`` over a validated sequence
# yields exactly its items, and a mapping's groups are its keys and values.
_FLOW_PLAIN_FIRST = r"""(?:[^ \[\]{},:#?"'&*!|>%@`-]|-(?=[^ \[\]{},:#?]))"""
_FLOW_PLAIN = _FLOW_PLAIN_FIRST + r"[^\[\]{},:#? ]*(?: +[^\[\]{},:#? ]+)*"
_FLOW_KEY = r'"[^"\\]*"' + r"|'[^']*'|" + _FLOW_PLAIN_FIRST + r"[^\[\]{},:#?]*(?<! )(?=:)"
_FLOW_SCALAR = r'"[^"\\]*"' + r"|'[^']*'|" + _FLOW_PLAIN
_FLOW_SEQ_PATTERN = rf"\[ *(?:(?:{_FLOW_SCALAR})(?: *, *(?:{_FLOW_SCALAR}))*)? *\]"
_FLOW_SEQ = re.compile(_FLOW_SEQ_PATTERN)
_FLOW_ITEM = re.compile(_FLOW_SCALAR)
_FLOW_MAP_MAX = 12


def _flow_map_pattern() -> re.Pattern:
    """``{k: v, ...}`` with one group for each key and each value, up to _FLOW_MAP_MAX entries."""
    entry = rf"({_FLOW_KEY}): +({_FLOW_SCALAR}|{_FLOW_SEQ_PATTERN})"
    more = ""
    for _ in range(_FLOW_MAP_MAX - 1):
        more = rf"(?: *, *{entry}{more})?"
    return re.compile(rf"\{{ *(?:{entry}{more})? *\}}")


_FLOW_MAP = _flow_map_pattern()


@lru_cache(maxsize=_RESOLVED_MAX)
def _typed_plain(value: str) -> Any:
    """The safe loader's object for the plain scalar ``value`` (raises :class:`_Outside` for merge keys).

    The tag is the safe resolver's, the object that of the SafeConstructor function for the tag.
    """
    tag = _resolve_tag(ScalarNode, value, (True, False))  # what libyaml's parser asks for a plain scalar
    if tag == _STR:
        return value
    make = _SCALARS.get(tag)
    if make is None:  # '<<' (merge) or '=' (value): the standard constructor treats those apart
        raise _Outside
    return make(_CONSTRUCTOR, ScalarNode(tag, value))


def _plain(value: str) -> Any:
    """The object for a non-empty plain scalar already checked to be one."""
    if value[0] not in _IMPLICIT_FIRST:
        return value
    return _typed_plain(value)


def _flow_scalar(token: str) -> Any:
    """The object for a scalar token of a flow collection (quoted tokens keep their quotes)."""
    c = token[0]
    if c == '"' or c == "'":
        return token[1:-1]
    if c not in _IMPLICIT_FIRST:
        return token
    return _typed_plain(token)


def _check_tail(s: str, pos: int) -> None:
    """What follows a quoted scalar or a flow collection on its line must be nothing, or a comment."""
    if pos < len(s):
        rest = s[pos:].lstrip(" ")
        if s[pos] != " " or (rest and rest[0] != "#"):
            raise _Outside


# What a line holds after its key or entry dash: a scalar (the object), nothing (a nested
# block or null follows), a literal block (the chomping's tail), or a flow collection whose
# items are kept as tuples, built afresh for every document.
_SCALAR, _EMPTY, _LITERAL, _FLOW_SEQ_ITEMS, _FLOW_MAP_PAIRS, _FLOW_MAP_NESTED = range(6)
_NO_KEY = object()  # the key of a row that holds a sequence entry's value (None is a key)


def _flow(s: str) -> tuple[int, tuple]:
    """``(kind, items)`` of the one-line flow collection that starts ``s``."""
    if s[0] == "[":
        match = _FLOW_SEQ.match(s)
        if match is None:
            raise _Outside
        _check_tail(s, match.end())
        return _FLOW_SEQ_ITEMS, tuple(map(_flow_scalar, _FLOW_ITEM.findall(match.group())))
    match = _FLOW_MAP.match(s)
    if match is None:
        raise _Outside
    _check_tail(s, match.end())
    pairs = []
    kind = _FLOW_MAP_PAIRS
    groups = iter(match.groups())
    for key, value in zip(groups, groups):
        if key is None:  # the entries are over
            break
        if len(key) > _KEY_MAX:
            raise _Outside
        c = value[0]
        if c == "[":
            kind = _FLOW_MAP_NESTED
            value = tuple(map(_flow_scalar, _FLOW_ITEM.findall(value)))
        elif c == '"' or c == "'":
            value = value[1:-1]
        elif c in _IMPLICIT_FIRST:
            value = _typed_plain(value)
        c = key[0]
        if c == '"' or c == "'":
            key = key[1:-1]
        elif c in _IMPLICIT_FIRST:
            key = _typed_plain(key)
        pairs.append((key, value))
    return kind, tuple(pairs)


def _build(kind: int, payload: Any) -> Any:
    """A fresh flow collection from its row's items (a repeated key keeps the last value, as in PyYAML)."""
    if kind == _FLOW_MAP_PAIRS:
        return dict(payload)
    if kind == _FLOW_SEQ_ITEMS:
        return list(payload)
    return {key: list(value) if value.__class__ is tuple else value for key, value in payload}


def _split_key(content: str) -> tuple[Any, str]:
    """``(key, rest of the line after ':')`` of a block mapping line from its key on."""
    c = content[0]
    if c == '"' or c == "'":
        end = content.find(c, 1)
        if end < 0 or end >= _KEY_MAX or not content.startswith(":", end + 1):
            raise _Outside
        key = content[1:end]
        if c == '"' and "\\" in key:
            raise _Outside
        rest = content[end + 2:]
        if rest and rest[0] != " ":
            raise _Outside
        return key, rest
    j = content.find(": ")
    if j < 0:
        if content[-1] != ":":
            raise _Outside
        j = len(content) - 1
    key = content[:j]
    if ((c in _INDICATORS and (c != "-" or key[1:2] in ("", " "))) or j > _KEY_MAX or key[-1] == " "
            or key[-1] == ":" or " #" in key or key.startswith(("---", "..."))):
        raise _Outside
    return _plain(key), content[j + 1:]


def _node(s: str) -> tuple[int, Any]:
    """``(kind, payload)`` of the node text ``s`` (no leading space, not empty, not a comment)."""
    c = s[0]
    if c == '"' or c == "'":
        end = s.find(c, 1)
        if end < 0 or (c == '"' and "\\" in s[1:end]):
            raise _Outside
        _check_tail(s, end + 1)
        return _SCALAR, s[1:end]
    if c == "[" or c == "{":
        return _flow(s)
    if c == "|":
        if s == "|":
            return _LITERAL, "\n"
        if s == "|-":
            return _LITERAL, ""
        raise _Outside
    cut = s.find(" #")
    s = (s[:cut] if cut > 0 else s).rstrip(" ")
    if (c in _INDICATORS and (c != "-" or len(s) < 2 or s[1] == " ")) or ": " in s or s[-1] == ":":
        raise _Outside
    return _SCALAR, _plain(s)


@lru_cache(maxsize=_ROWS_MAX)
def _row(line: str) -> tuple | None:
    """What one line outside a literal block holds; None for a blank or comment line.

    ``(indent, entry, column, key, kind, payload)``: ``entry`` whether the line starts with a
    sequence entry's '-', ``column`` that of its key or value, ``key`` :data:`_NO_KEY` for an
    entry's value. A line means the same wherever it stands (continuation lines, the only
    exception, are outside the subset), so rows are memoised by line: contract files repeat
    most of their lines from package to package.
    """
    s = line.lstrip(" ")
    if not s or s[0] == "#":
        return None
    indent = column = len(line) - len(s)
    entry = s[0] == "-" and (len(s) == 1 or s[1] == " ")
    if entry:
        rest = s[1:]
        s = rest.lstrip(" ")
        column = indent + 1 + len(rest) - len(s)
        if not s or s[0] == "#":
            return indent, True, column, _NO_KEY, _EMPTY, None
        c = s[0]
        if c == '"' or c == "'":
            end = s.find(c, 1)
            compact = end > 0 and s.startswith(":", end + 1)
        else:
            cut = s.find(" #")  # a comment's ': ' makes no key
            head = s if cut < 0 else s[:cut].rstrip(" ")
            compact = c not in "[{|" and (": " in head or head[-1] == ":")
        if not compact:  # '- value'; otherwise '- key: value', a mapping at the key's column
            return (indent, True, column, _NO_KEY, *_node(s))
    key, rest = _split_key(s)
    s = rest.lstrip(" ")
    if not s or s[0] == "#":
        return indent, entry, column, key, _EMPTY, None
    return (indent, entry, column, key, *_node(s))


#: the row after the last line: less indented than any other
_END = (-1, False, -1, _NO_KEY, _EMPTY, None)


def _scan(lines: list[str], i: int) -> tuple[int, tuple]:
    """``(index, row)`` of the first line from ``i`` on that is neither blank nor a comment.

    ``(len(lines), _END)`` when there is none.
    """
    n = len(lines)
    while i < n:
        row = _row(lines[i])
        if row is not None:
            return i, row
        i += 1
    return n, _END


def _literal(lines: list[str], i: int, indent: int, tail: str) -> tuple[str, int]:
    """A literal block scalar whose header ends line ``i``, in a collection at ``indent``.

    ``tail`` is what clip ('\\n') or strip ('') chomping leaves after the last content line.
    Returns the string and the index of the line after the block.
    """
    j = i + 1
    n = len(lines)
    if j >= n:
        raise _Outside
    first = lines[j]
    s = first.lstrip(" ")
    width = len(first) - len(s)
    if not s or width <= indent:  # leading blank lines or an empty block: not proved here
        raise _Outside
    pad = " " * width
    parts: list[str] = []
    kept = 0
    while j < n:
        line = lines[j]
        if line.startswith(pad):
            parts.append(line[width:])  # spaces past the indentation, even on a blank line, are content
            if len(line) > width:
                kept = len(parts)
        elif line.strip(" "):  # less indented: the block has ended
            break
        else:
            parts.append("")
        j += 1
    return "\n".join(parts[:kept]) + tail, j


def _item(lines: list[str], i: int, indent: int, in_map: bool, kind: int,
          payload: Any) -> tuple[Any, int, tuple]:
    """The value of row ``i`` in a collection at ``indent`` where it goes on past the line.

    ``kind`` is _EMPTY (a nested block follows, or the value is null) or _LITERAL (then
    ``payload`` is the chomping's tail). ``in_map``: whether that collection is a mapping
    (which may hold an indentless sequence). Returns the value and the index and row of
    the next content line.
    """
    if kind == _EMPTY:
        j, row = _scan(lines, i + 1)
        if row[0] > indent or (row[0] == indent and in_map and row[1]):
            return _block(lines, j, row)
        return None, j, row
    value, j = _literal(lines, i, indent, payload)
    return (value, *_scan(lines, j))


def _map(lines: list[str], i: int, row: tuple) -> tuple[dict, int, tuple]:
    """The block mapping whose first key is row ``i`` (at the row's column); then the next row."""
    indent = row[2]
    n = len(lines)
    out = {}
    while True:
        key, kind, payload = row[3:]
        if kind == _SCALAR or kind >= _FLOW_SEQ_ITEMS:  # one-line values (most rows): _scan inline
            out[key] = payload if kind == _SCALAR else _build(kind, payload)
            row = None
            while row is None:
                i += 1
                row = _row(lines[i]) if i < n else _END
        else:
            out[key], i, row = _item(lines, i, indent, True, kind, payload)
        # a repeated key keeps the last value (and the first position), as PyYAML's constructor
        if row[0] < indent:
            return out, i, row
        if row[0] > indent or row[1]:  # a continuation line, unexpected indentation, '-' here
            raise _Outside


def _seq(lines: list[str], i: int, row: tuple) -> tuple[list, int, tuple]:
    """The block sequence whose first entry is row ``i``; then the next row."""
    indent = row[0]
    n = len(lines)
    out = []
    while True:
        if row[3] is not _NO_KEY:  # '- key: value'
            value, i, row = _map(lines, i, row)
        elif row[4] == _SCALAR or row[4] >= _FLOW_SEQ_ITEMS:  # one-line values: _scan inline
            value = row[5] if row[4] == _SCALAR else _build(row[4], row[5])
            row = None
            while row is None:
                i += 1
                row = _row(lines[i]) if i < n else _END
        else:
            value, i, row = _item(lines, i, indent, False, row[4], row[5])
        out.append(value)
        if row[0] < indent:
            return out, i, row
        if row[0] > indent:
            raise _Outside
        if not row[1]:  # a key of the mapping that holds this indentless sequence
            return out, i, row


def _block(lines: list[str], i: int, row: tuple) -> tuple[Any, int, tuple]:
    """The block collection that starts at row ``i``; then the next row."""
    if row[1]:
        return _seq(lines, i, row)
    return _map(lines, i, row)


def _load_lines(text: str | bytes) -> Any:
    """The document of ``text`` read by the line reader, or :class:`_Outside` (or another error).

    Any exception means "not proved here": :func:`load_yaml` then asks libyaml.
    """
    if type(text) is str:  # exactly str or bytes, as libyaml's parser takes them (else TypeError)
        data = text.encode("utf-8")  # a lone surrogate raises: libyaml's answer, then
    elif type(text) is bytes:
        data, text = text, text.decode("utf-8")
    else:
        raise _Outside
    if not _LINES_OK or not data.endswith(b"\n"):
        raise _Outside
    odd = data.translate(None, _ASCII_OK)
    if odd and _NOT_TAKEN.search(odd.decode("utf-8")):
        raise _Outside
    lines = text.split("\n")
    i, row = _scan(lines, 0)
    if row[0] != 0:  # an empty document, or one indented as a whole
        raise _Outside
    value, i, row = _block(lines, i, row)
    if row is not _END:
        raise _Outside
    return value


# ---------------------------------------------------------------- the libyaml path


def load_yaml(text: str | bytes) -> Any:
    """Parse one YAML document with a safe loader; raises :class:`YAMLError` on bad input.

    The result (and any exception) is that of ``yaml.load(text, Loader=yaml.CSafeLoader)``.
    """
    try:
        return _load_lines(text)
    except Exception:  # noqa: BLE001 - _Outside, or an error: the standard path reports it its own way
        return _load_libyaml(text)


def _load_libyaml(text: str | bytes) -> Any:
    """:func:`load_yaml` through libyaml's node tree (the reference for the line reader)."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            return _construct_plain(loader, node)
        except Exception:  # noqa: BLE001 - _Unsure, or an error the standard constructor reports its own way
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

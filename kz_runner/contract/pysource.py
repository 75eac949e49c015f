"""Static checks of a package's Python files, by reading them with ``ast``.

Package code is never imported or executed here: the validator runs on the
server and on untrusted submissions. ``read_metas`` evaluates the assigned value
of ``KERNEL_ZOO_TEST_CASE_METAS`` with ``ast.literal_eval``, which accepts only
literals (strings, numbers, lists, tuples, dicts, sets, booleans, None).

>>> metas, problems = read_metas('KERNEL_ZOO_TEST_CASE_METAS = [{"test_case_id": "small", '
...     '"params": {}, "primary_metric": "ms", "metrics": [{"name": "ms", "unit": "ms", '
...     '"direction": "lower_better"}], "tolerance": {"correctness_atol": 0, "correctness_rtol": 0}}]')
>>> [m["test_case_id"] for m in metas], problems
(['small'], [])
"""
from __future__ import annotations

import ast
import json
import re
from typing import Any

from .codes import problem
from .problems import Problem
from .schema_check import (
    _json_finite,
    may_hold_huge_number,
    nonfinite_paths,
    schema_problems,
)

METAS_NAME = "KERNEL_ZOO_TEST_CASE_METAS"
BENCHMARK_FILE = ".kernel_package/benchmark.py"
BUILD_ENV_FILE = ".kernel_package/build_test_env.py"


_BOM = b"\xef\xbb\xbf"


def decode_utf8_sig(data: bytes) -> str:
    """``data.decode("utf-8-sig")`` (a leading BOM dropped), in C: the codec itself is Python code.

    A UnicodeDecodeError says the same offsets (counted after the BOM, as utf-8-sig does).
    """
    return data.decode("utf-8") if data[:3] != _BOM else data[3:].decode("utf-8")


def decode_source(data: bytes | str, file: str) -> tuple[str | None, list[Problem]]:
    """UTF-8 text of ``data``, or None and a ``FILE_ENCODING`` problem."""
    if isinstance(data, str):
        return data, []
    try:
        return decode_utf8_sig(data), []
    except UnicodeDecodeError as exc:
        return None, [problem("FILE_ENCODING", f"not UTF-8 at byte {exc.start}", file=file)]


def parse_python(source: str | bytes, file: str) -> tuple[ast.Module | None, list[Problem]]:
    """The module's AST, or None with a ``PYTHON_SYNTAX`` (or ``FILE_ENCODING``) problem."""
    text, problems = decode_source(source, file)
    if text is None:
        return None, problems
    try:
        return ast.parse(text, filename=file), []
    except SyntaxError as exc:
        where = f"line {exc.lineno}" + (f", column {exc.offset}" if exc.offset else "")
        return None, [problem("PYTHON_SYNTAX", f"{where}: {exc.msg}", file=file)]
    except ValueError as exc:  # e.g. source holding NUL bytes
        return None, [problem("PYTHON_SYNTAX", str(exc), file=file)]


def has_main_guard(tree: ast.Module) -> bool:
    """True when the module body holds ``if __name__ == "__main__":`` (either operand order)."""
    for node in tree.body:
        if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
            continue
        test = node.test
        if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
            continue
        sides = [test.left, test.comparators[0]]
        names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
        consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
        if names and consts:
            return True
    return False


#: the statements :func:`_assigned_names` can find a name in (a C-level test before the call)
_BINDING_STATEMENTS = (ast.Assign, ast.AnnAssign, ast.AugAssign)


def _assigned_names(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _metas_value_nodes(tree: ast.Module) -> tuple[list[ast.stmt], bool]:
    """Module-level statements binding the METAS name, and whether a nested one exists."""
    top = [node for node in tree.body
           if isinstance(node, _BINDING_STATEMENTS) and METAS_NAME in _assigned_names(node)]
    nested = False
    if not top:
        nested = any(isinstance(n, ast.Name) and n.id == METAS_NAME and isinstance(n.ctx, ast.Store)
                     for n in ast.walk(tree))
    return top, nested


_LITERAL_NODES = (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.UnaryOp, ast.BinOp,
                  ast.expr_context, ast.operator, ast.unaryop)


def _first_non_literal(node: ast.AST) -> ast.AST:
    """The first sub-node ``ast.literal_eval`` refuses (the node itself when none is obvious)."""
    for sub in ast.walk(node):
        if not isinstance(sub, _LITERAL_NODES):
            return sub
    return node


def extract_metas(tree: ast.Module, file: str = BENCHMARK_FILE) -> tuple[list | None, list[Problem]]:
    """The literal METAS list of a parsed benchmark.py, or None with problems."""
    nodes, nested = _metas_value_nodes(tree)
    if not nodes:
        where = " (it is only assigned inside a block; move it to module level)" if nested else ""
        return None, [problem("METAS_MISSING", f"no module-level {METAS_NAME}{where}",
                              file=file, field=METAS_NAME)]
    if len(nodes) > 1:
        lines = ", ".join(str(n.lineno) for n in nodes)
        return None, [problem("METAS_NOT_LITERAL", f"{METAS_NAME} is bound {len(nodes)} times "
                              f"(lines {lines}); bind it once", file=file, field=METAS_NAME)]
    node = nodes[0]
    if isinstance(node, ast.AugAssign) or node.value is None:
        return None, [problem("METAS_NOT_LITERAL", f"line {node.lineno}: {METAS_NAME} has no literal value",
                              file=file, field=METAS_NAME)]
    try:
        value = ast.literal_eval(node.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        bad = _first_non_literal(node.value)
        code = ast.unparse(bad)
        code = code if len(code) <= 60 else code[:57] + "..."
        return None, [problem("METAS_NOT_LITERAL", f"line {getattr(bad, 'lineno', node.lineno)}: "
                              f"{METAS_NAME} is not a literal: `{code}` is computed",
                              file=file, field=METAS_NAME)]
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        return None, [problem("METAS_NOT_LITERAL", f"{METAS_NAME} is a {type(value).__name__}, "
                              "expected a list of dicts", file=file, field=METAS_NAME)]
    return value, []


def check_metas(metas: list, file: str = BENCHMARK_FILE, finite: bool | None = None) -> list[Problem]:
    """Schema, primary_metric, unique-id, unique-metric and finiteness checks of METAS items.

    ``finite=True``: the caller knows every number in ``metas`` is finite (None: find out).
    """
    out: list[Problem] = []
    if not metas:
        out.append(problem("METAS_SCHEMA", f"{METAS_NAME} is empty; declare at least one case",
                           file=file, field=METAS_NAME))
    if finite is None:
        finite = _json_finite(metas)  # one C pass over every item: the per-item walk only when it fails
    seen: dict[str, int] = {}
    for index, meta in enumerate(metas):
        field = f"{METAS_NAME}[{index}]"
        out.extend(schema_problems(meta, "test_case_meta", "METAS_SCHEMA", file, field))
        if not finite:
            for path in nonfinite_paths(meta):
                out.append(problem("METAS_SCHEMA", f"{path} is NaN or infinite", file=file,
                                   field=f"{field}.{path}", hint="Use finite numbers in METAS."))
        if not isinstance(meta, dict):
            continue
        case_id = meta.get("test_case_id")
        if isinstance(case_id, str):
            if case_id in seen:
                out.append(problem("METAS_DUPLICATE_ID", f"test_case_id {case_id!r} is used by items "
                                   f"{seen[case_id]} and {index}", file=file, field=f"{field}.test_case_id"))
            else:
                seen[case_id] = index
        metrics = meta.get("metrics")
        names = [m.get("name") for m in metrics if isinstance(m, dict)] if isinstance(metrics, list) else []
        for name in sorted({n for n in names if isinstance(n, str) and names.count(n) > 1}):
            out.append(problem("METAS_DUPLICATE_METRIC", f"metric {name!r} is listed more than once",
                               file=file, field=f"{field}.metrics"))
        primary = meta.get("primary_metric")
        if isinstance(primary, str) and isinstance(metrics, list) and primary not in names:
            out.append(problem("METAS_PRIMARY_METRIC", f"primary_metric {primary!r} is not among the "
                               f"metrics {[n for n in names if isinstance(n, str)]}", file=file,
                               field=f"{field}.primary_metric"))
    return out


def read_metas(source: str | bytes, file: str = BENCHMARK_FILE) -> tuple[list[dict] | None, list[Problem]]:
    """Read and check ``KERNEL_ZOO_TEST_CASE_METAS`` from benchmark.py source, never importing it.

    Returns ``(metas, problems)``: ``metas`` is the literal list (None when it could not
    be read: syntax error, missing, not a literal); ``problems`` holds every finding,
    including per-item schema errors, a primary_metric missing from the metrics and
    duplicate ids. The METAS are usable when no problem has severity ``error``.
    """
    tree, problems = parse_python(source, file)
    if tree is None:
        return None, problems
    metas, problems = extract_metas(tree, file)
    if metas is None:
        return None, problems
    return metas, check_metas(metas, file)


def check_benchmark_source(source: str | bytes, file: str = BENCHMARK_FILE) -> tuple[list | None, list[Problem]]:
    """``read_metas`` plus the script entry-point check of benchmark.py."""
    fast = _fast_benchmark_check(source, file)
    if fast is not None:
        return fast
    return _full_benchmark_check(source, file)


def _full_benchmark_check(source: str | bytes, file: str) -> tuple[list | None, list[Problem]]:
    """:func:`check_benchmark_source` over the whole module's AST (the reference path)."""
    tree, problems = parse_python(source, file)
    if tree is None:
        return None, problems
    metas, problems = extract_metas(tree, file)
    if metas is not None:
        problems = check_metas(metas, file)
    if not has_main_guard(tree):
        problems.append(problem("BENCHMARK_NO_MAIN", "no if __name__ == \"__main__\": block", file=file))
    return metas, problems


# ---------------------------------------------------------------- METAS fast path
#
# Most of benchmark.py's syntax tree is the METAS literal, and building Python AST
# objects for it (then walking them in ``literal_eval``) costs more than everything
# else the index does with the file. The fast path reads a METAS list written in the
# JSON-like subset of Python literals (double-quoted strings without backslashes,
# JSON numbers, True/False/None, lists, dicts with string keys, trailing commas,
# comments) with ``json.loads``, and parses the rest of the module with the list
# replaced by an empty one of the same line count. It answers only when the module
# is certainly equivalent to the reference path's input: the name bound once at
# module level, by ``NAME = [...]`` whose list is exactly the placeholder (checked on
# the AST of the rest, positions included), and the rest free of syntax errors;
# otherwise the reference path decides.

_METAS_START = re.compile(r"^" + METAS_NAME + r"[ \t]*=[ \t]*\[", re.MULTILINE)
#: one token after optional whitespace and comments; group 1..6 = string, opener, closer, comma, colon, scalar
#: (possessive: a comment runs to the end of its line, never shortened to let a token follow it)
_LITERAL_TOKEN = re.compile(r"""(?:[ \t\n]+|\#[^\n]*+)*+(?:
    ("[^"\\\n]*")
  | ([\[{])
  | ([\]}])
  | (,)
  | (:)
  | (-?[0-9][0-9.eE+\-]*|(?:True|False|None)\b))""", re.VERBOSE)
_JSON_WORDS = {"True": "true", "False": "false", "None": "null"}
_MAX_DEPTH = 50  # far below the Python parser's nesting limit


class _NotJsonLike(Exception):
    """The METAS text is outside the subset the fast path reads."""


def _reject_constant(name: str) -> Any:
    raise _NotJsonLike(name)  # NaN / Infinity are JSON words but Python names, not literals


def _json_like_list_tokens(text: str, start: int) -> tuple[list, int]:
    """The list literal opening at ``text[start]`` and the offset just past its ``]`` (token by token).

    The reference reading of the subset: :func:`_json_like_list` gives the same answers in
    one pass of regular expressions and falls back here for the rare shapes it leaves out.
    """
    parts: list[str] = []
    depth = 0
    pos = start
    pending_comma = False
    after_value = False  # the last token ended a value: a comma or closer may follow, not a value
    match_at = _LITERAL_TOKEN.match
    while True:
        match = match_at(text, pos)
        if match is None:
            raise _NotJsonLike(pos)
        kind = match.lastindex
        token = match.group(kind)
        pos = match.end()
        if kind == 4:  # comma
            if pending_comma or not after_value:
                raise _NotJsonLike(pos)  # ``[,]`` or ``[1,,]``: not Python either
            pending_comma = True
            after_value = False
            continue
        if pending_comma:  # a trailing comma (Python allows it, JSON does not) is dropped
            if kind != 3:
                parts.append(",")
            pending_comma = False
        elif after_value and kind != 3 and kind != 5:
            raise _NotJsonLike(pos)  # two values side by side (``1 2``, ``"a" "b"``): leave it to Python
        if kind == 6:
            token = _JSON_WORDS.get(token, token)
        elif kind == 2:
            depth += 1
            if depth > _MAX_DEPTH:
                raise _NotJsonLike(pos)
        elif kind == 3:
            depth -= 1
        parts.append(token)
        after_value = kind == 1 or kind == 3 or kind == 6
        if depth == 0:
            break
    try:
        value = json.loads("".join(parts), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise _NotJsonLike(str(exc)) from None
    if not isinstance(value, list):
        raise _NotJsonLike("not a list")
    return value, pos


# The one-pass reading. ``_SPAN`` takes the longest run of text made only of what the
# token reader accepts (whitespace, structural characters and number characters, strings
# without backslashes or newlines, comments, the words True/False/None); it may run past
# the list. Translating that run to JSON keeps every offset: each word becomes its JSON
# word of the same length, each comment and each trailing comma (one before a closer)
# becomes spaces. ``raw_decode`` then reads one JSON value from the ``[`` and says where
# it ends. JSON is stricter than the token reader nowhere inside a list it accepts
# (whitespace is kept, so values side by side stay an error; a stray ``e``, ``.`` or ``-``
# of the character class is no JSON), and it accepts nothing the token reader refuses, so
# both give the same list and the same end; tests/test_index_speed_paths.py compares them
# on generated inputs. A comma that may follow no value (``[,`` ``1,,``, or any comma after
# whitespace), which blanking could hide, sends the text to the token reader (which refuses
# it when it lies inside the list).
_SPAN = re.compile(r'''\[(?:[ \t\n\[\]{},:0-9.eE+\-]++|"[^"\\\n]*+"|\#[^\n]*+|(?:True|False|None)\b)*+''')
_TRAILING_COMMA = re.compile(r",(?=[ \t\n]*+[\]}])")  # before a closer
#: a comma right after an opener, a comma, a colon (``[,`` ``,,``: not Python) or a space (``1 ,``, rare)
_COMMA_AFTER_NO_VALUE = re.compile(r",(?<=[\[{,:\s],)")
_STRING_OR_COMMENT = re.compile(r'"[^"\n]*"|#[^\n]*')
_STRING = re.compile(r'"[^"]*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
_EMPTY_PAIR = re.compile(r"\[\]|\{\}")
_STRING_SEP = "\0"  # stands for a string in the text outside strings (the source holds no NUL)
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _blank_comment(match: re.Match) -> str:
    token = match.group()
    return token if token[0] == '"' else " " * len(token)


def _max_depth(json_text: str) -> int:
    """The deepest nesting of brackets in a JSON text (strings without escapes), stopped past _MAX_DEPTH."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", json_text))
    depth = 0
    while brackets and depth <= _MAX_DEPTH:
        brackets = _EMPTY_PAIR.sub("", brackets)
        depth += 1
    return depth


def _json_like_list(text: str, start: int) -> tuple[list, int]:
    """The list literal opening at ``text[start]`` and the offset just past its ``]``.

    Raises :class:`_NotJsonLike` exactly when :func:`_json_like_list_tokens` does, and
    otherwise returns the same list and offset.
    """
    found = _SPAN.match(text, start)
    if found is None:
        raise _NotJsonLike("no list")
    span = found.group()
    parts = span.split('"')
    outside = _STRING_SEP.join(parts[0::2])
    if "#" in outside:  # comments: blank them (a comment may hold a quote, so split again)
        span = _STRING_OR_COMMENT.sub(_blank_comment, span)
        parts = span.split('"')
        outside = _STRING_SEP.join(parts[0::2])
    if "T" in outside or "F" in outside or "N" in outside:
        outside = outside.replace("True", "true").replace("False", "false").replace("None", "null")
    if "," in outside:
        if _COMMA_AFTER_NO_VALUE.search(outside):  # the token reader sorts these out
            return _json_like_list_tokens(text, start)
        outside = _TRAILING_COMMA.sub(" ", outside)  # each follows a value: Python drops it
    parts[0::2] = outside.split(_STRING_SEP)
    json_text = '"'.join(parts)
    try:
        value, end = _DECODER.raw_decode(json_text)
    except (ValueError, RecursionError) as exc:
        raise _NotJsonLike(str(exc)) from None
    if json_text.count("[", 0, end) + json_text.count("{", 0, end) > _MAX_DEPTH \
            and _max_depth(json_text[:end]) > _MAX_DEPTH:
        raise _NotJsonLike("nested too deeply")
    return value, start + end


def _fast_benchmark_check(source: str | bytes, file: str) -> tuple[list | None, list[Problem]] | None:
    """:func:`check_benchmark_source`'s answer by the fast path, or None when it is unsure."""
    if isinstance(source, bytes):
        try:
            text = decode_utf8_sig(source)
        except UnicodeDecodeError:
            return None
    else:
        text = source
        if not text.isascii():
            try:
                text.encode()
            except UnicodeEncodeError:  # a lone surrogate: the parser refuses the text, json would not
                return None
    if "\r" in text or "\0" in text or "\f" in text:  # other newlines, or no parse at all: reference path
        return None
    found = _METAS_START.search(text)
    if found is None:
        return None
    start = found.end() - 1
    try:
        metas, end = _json_like_list(text, start)
    except _NotJsonLike:
        return None
    lines = text.count("\n", start, end)
    rest = text[:start] + "[" + "\n" * lines + "]" + text[end:]
    try:
        tree = ast.parse(rest, filename=file)
    except (SyntaxError, ValueError):
        return None
    line = text.count("\n", 0, start) + 1
    column = len(text[text.rfind("\n", 0, start) + 1:start].encode("utf-8"))  # AST columns count bytes
    nodes, _ = _metas_value_nodes(tree)
    if len(nodes) != 1:
        return None
    node = nodes[0]
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.List) and not node.value.elts
            and node.value.lineno == line and node.value.col_offset == column
            and node.value.end_lineno == line + lines
            and node.value.end_col_offset == (column + 2 if lines == 0 else 1)):
        # the one module-level binding is ``NAME = <our placeholder>``, token for token: the match
        # was no text inside a string, and the original statement is ``NAME = <the literal read>``
        return None
    # json.loads makes no NaN here (the words are refused); a float overflows to an infinity
    # only from a number with a 3-digit exponent or ~300 digits, which the text would show
    finite = None if may_hold_huge_number(text[start:end].encode(), 200) else True
    problems = check_metas(metas, file, finite)
    if not has_main_guard(tree):
        problems.append(problem("BENCHMARK_NO_MAIN", "no if __name__ == \"__main__\": block", file=file))
    return metas, problems


def _callable_with_one_arg(func: ast.FunctionDef) -> bool:
    args = func.args
    positional = args.posonlyargs + args.args
    required = len(positional) - len(args.defaults)
    kwonly_required = sum(1 for d in args.kw_defaults if d is None)
    accepts_one = bool(positional) or args.vararg is not None
    return accepts_one and required <= 1 and kwonly_required == 0


def check_build_env_source(source: str | bytes, file: str = BUILD_ENV_FILE) -> list[Problem]:
    """build_test_env.py defines ``build_env(workdir)`` and has a ``__main__`` entry point."""
    tree, problems = parse_python(source, file)
    if tree is None:
        return problems
    found: Any = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "build_env":
            found = node
        elif isinstance(node, _BINDING_STATEMENTS) and "build_env" in _assigned_names(node):
            found = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (alias.asname or alias.name) == "build_env" for alias in node.names):
            found = node
    if found is None:
        problems.append(problem("BUILD_ENV_MISSING", "no module-level build_env", file=file, field="build_env"))
    elif isinstance(found, ast.AsyncFunctionDef):
        problems.append(problem("BUILD_ENV_SIGNATURE", "build_env is async; the runner calls it synchronously",
                                file=file, field="build_env"))
    elif isinstance(found, ast.FunctionDef) and not _callable_with_one_arg(found):
        problems.append(problem("BUILD_ENV_SIGNATURE", f"line {found.lineno}: build_env cannot be called "
                                "as build_env(workdir)", file=file, field="build_env"))
    if not has_main_guard(tree):
        problems.append(problem("BUILD_ENV_NO_MAIN", "no if __name__ == \"__main__\": block", file=file))
    return problems

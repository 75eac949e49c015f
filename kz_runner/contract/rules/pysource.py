"""Static checks of a package's Python files, by reading them with ``ast``.

Package code is never imported or executed here: the validator runs on the
server and on untrusted submissions. ``read_metas`` evaluates the assigned value
of ``KERNEL_ZOO_TEST_CASE_METAS`` with ``ast.literal_eval``, which accepts only
literals (strings, numbers, lists, tuples, dicts, sets, booleans, None), after
replacing the names of module-level literal constants by their values
(:mod:`.literals`).

>>> metas, problems = read_metas('KERNEL_ZOO_TEST_CASE_METAS = [{"test_case_id": "small", '
...     '"params": {}, "primary_metric": "ms", "metrics": [{"name": "ms", "unit": "ms", '
...     '"direction": "lower_better"}], "tolerance": {"correctness_atol": 0, "correctness_rtol": 0}}]')
>>> [m["test_case_id"] for m in metas], problems
(['small'], [])
"""
from __future__ import annotations

import ast
from typing import Any

from kz_runner.contract.codes import problem
from kz_runner.contract.layout import BENCHMARK, BUILD_TEST_ENV, KP
from kz_runner.contract.problems import Problem
from kz_runner.contract.rules.literals import NotLiteral, literal_value
from kz_runner.contract.schema_check import _json_finite, nonfinite_paths, schema_problems

METAS_NAME = "KERNEL_ZOO_TEST_CASE_METAS"
BENCHMARK_FILE = f"{KP}/{BENCHMARK}"
BUILD_ENV_FILE = f"{KP}/{BUILD_TEST_ENV}"


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


def walk_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree``, breadth first: the nodes and the order of ``ast.walk``, as a list.

    A plain loop over ``_fields`` instead of ``ast.walk``'s generators (about twice as
    fast), and a list a caller can go over more than once without walking the tree again.
    """
    out: list[ast.AST] = [tree]
    append = out.append
    for node in out:  # the list grows while it is read: breadth first, as ast.walk's queue
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, ast.AST):
                append(value)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        append(item)
    return out


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


def _metas_value_nodes(tree: ast.Module) -> tuple[list[ast.Assign | ast.AnnAssign | ast.AugAssign], bool]:
    """Module-level statements binding the METAS name, and whether a nested one exists."""
    top = [node for node in tree.body
           if isinstance(node, _BINDING_STATEMENTS) and METAS_NAME in _assigned_names(node)]
    nested = False
    if not top:
        nested = any(isinstance(n, ast.Name) and n.id == METAS_NAME and isinstance(n.ctx, ast.Store)
                     for n in walk_nodes(tree))
    return top, nested


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
        try:  # module-level constants named in it are resolved from the tree, never run
            value = literal_value(tree, node.value, tree.body.index(node))
        except NotLiteral as exc:
            return None, [problem("METAS_NOT_LITERAL", f"line {getattr(exc.node, 'lineno', node.lineno)}: "
                                  f"{METAS_NAME} is not a literal: {exc}", file=file, field=METAS_NAME)]
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


def read_metas(source: str | bytes, file: str = BENCHMARK_FILE,
               parsed: tuple[ast.Module | None, list[Problem]] | None = None
               ) -> tuple[list[dict] | None, list[Problem]]:
    """Read and check ``KERNEL_ZOO_TEST_CASE_METAS`` from benchmark.py source, never importing it.

    Returns ``(metas, problems)``: ``metas`` is the literal list (None when it could not
    be read: syntax error, missing, not a literal); ``problems`` holds every finding,
    including per-item schema errors, a primary_metric missing from the metrics and
    duplicate ids. The METAS are usable when no problem has severity ``error``.
    ``parsed``: :func:`parse_python`'s result for ``source`` and ``file``, when at hand.
    """
    tree, problems = parsed if parsed is not None else parse_python(source, file)
    if tree is None:
        return None, list(problems)
    metas, problems = extract_metas(tree, file)
    if metas is None:
        return None, problems
    return metas, check_metas(metas, file)


def check_benchmark_source(source: str | bytes, file: str = BENCHMARK_FILE,
                           parsed: tuple[ast.Module | None, list[Problem]] | None = None
                           ) -> tuple[list | None, list[Problem]]:
    """``read_metas`` plus the script entry-point check of benchmark.py.

    ``parsed``: what :func:`parse_python` gave for ``source`` and ``file`` already (a
    package record's cached parse), so the file is not parsed again.
    """
    tree, problems = parsed if parsed is not None else parse_python(source, file)
    if tree is None:
        return None, list(problems)
    metas, problems = extract_metas(tree, file)
    if metas is not None:
        problems = check_metas(metas, file)
    if not has_main_guard(tree):
        problems.append(problem("BENCHMARK_NO_MAIN", "no if __name__ == \"__main__\": block", file=file))
    why = _not_judged(tree)
    if why is not None:
        problems.append(problem("HARNESS_NOT_JUDGED", f"benchmark.py {why}: its results would be unverified "
                                "(accepted, never ranked)", file=file))
    return metas, problems


def _not_judged(tree: ast.Module) -> str | None:
    names_kernel = False
    for node in walk_nodes(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr == "kernel") or \
                    (isinstance(func, ast.Name) and func.id == "kernel"):
                names_kernel = True
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.strip().rstrip("/").rsplit("/", 1)[-1] == "src":
            return ("names the source area (src), so it imports from it in its own process; import nothing "
                    "from src/ and name the kernel with bench.kernel(module, function)")
    if not names_kernel:
        return "never names its kernel with bench.kernel(module, function), so it times it in its own process"
    return None


def harness_not_judged(source: str | bytes) -> str | None:
    """Why the judge cannot time this benchmark.py (it never calls ``bench.kernel``, or names the
    source area ``src`` in a string: it imports from it), or None when it can. Read with ``ast``;
    the runner then runs it with the source area visible, its result unverified."""
    tree, _problems = parse_python(source, BENCHMARK_FILE)
    return "cannot be read" if tree is None else _not_judged(tree)


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

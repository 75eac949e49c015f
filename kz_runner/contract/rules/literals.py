"""Static evaluation of a literal that may name module-level literal constants.

A harness may write ``"metrics": _METRICS`` with ``_METRICS = [...]`` a few lines
above. :func:`literal_value` resolves such names from the syntax tree alone (nothing
is imported or executed): a name is a constant when the module binds it exactly once,
by a plain ``NAME = value`` (or ``NAME: T = value``) statement at module level, before
the statement that uses it, and its value is itself a literal built from literals and
such constants. Everything else (a call, a comprehension, an attribute, a name bound
twice or inside ``if``/``for``/``with``/``try``, a name a function declares ``global``,
a star import) is refused with a reason a submitter can act on.
"""
from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

__all__ = ["NotLiteral", "literal_value", "module_bindings"]

#: substituted nodes allowed in one value: a chain of constants each listing the previous
#: one twice would otherwise grow exponentially
MAX_NODES = 200_000
_LITERAL_NODES = (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.UnaryOp, ast.BinOp,
                  ast.expr_context, ast.operator, ast.unaryop)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


class NotLiteral(Exception):
    """The value is not a static literal; ``node`` is the part to blame (for its line)."""

    def __init__(self, message: str, node: ast.AST):
        super().__init__(message)
        self.node = node


@dataclass(frozen=True)
class Binding:
    """Where a module-level name is bound: how often, and the one plain assignment if any."""

    count: int
    index: int | None = None          # position in the module body of the plain assignment
    value: ast.expr | None = None     # its value, when the name is bound by that statement only


def _bound_names(node: ast.AST) -> list[str]:
    """Names one node binds in the scope it belongs to."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return [node.id]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, ast.ExceptHandler) and node.name:
        return [node.name]
    if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
        return [node.name]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [node.rest]
    return []


def _module_scope_nodes(tree: ast.Module):
    """Every node whose bindings land in the module scope, and every ``global`` statement."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, _SCOPES):
            # a def binds its name here; its body binds here only through ``global``
            stack.extend(n for n in ast.walk(node) if isinstance(n, ast.Global))
            stack.extend(node.decorator_list if not isinstance(node, ast.Lambda) else ())
            continue
        stack.extend(ast.iter_child_nodes(node))


def module_bindings(tree: ast.Module) -> tuple[dict[str, Binding], bool]:
    """``{name: Binding}`` for the module scope, and whether a star import makes names unknowable."""
    counts: dict[str, int] = {}
    star = False
    for node in _module_scope_nodes(tree):
        if isinstance(node, ast.Global):
            for name in node.names:  # a function may rebind it at run time
                counts[name] = counts.get(name, 0) + 1
            continue
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            star = True
            continue
        for name in _bound_names(node):
            counts[name] = counts.get(name, 0) + 1
    plain: dict[str, tuple[int, ast.expr]] = {}
    for index, stmt in enumerate(tree.body):
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            plain[stmt.targets[0].id] = (index, stmt.value)
        elif (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
              and stmt.value is not None):
            plain[stmt.target.id] = (index, stmt.value)
    out = {}
    for name, count in counts.items():
        bound = plain.get(name)
        out[name] = Binding(count, *bound) if count == 1 and bound is not None else Binding(count)
    return out, star


def _describe(node: ast.AST) -> str:
    code = ast.unparse(node)
    return code if len(code) <= 60 else code[:57] + "..."


class _Substitute(ast.NodeTransformer):
    """Replace names of module-level constants by copies of their (substituted) values."""

    def __init__(self, bindings: dict[str, Binding], star: bool):
        self.bindings, self.star, self.nodes = bindings, star, 0

    def value(self, node: ast.expr, before: int) -> ast.expr:
        """A copy of ``node`` with every name resolved, as used by module statement ``before``."""
        for sub in ast.walk(node):
            if not isinstance(sub, _LITERAL_NODES) and not isinstance(sub, ast.Name):
                raise NotLiteral(f"`{_describe(sub)}` is computed", sub)
        self.nodes += sum(1 for _ in ast.walk(node))
        if self.nodes > MAX_NODES:
            raise NotLiteral(f"the value is too large once its constants are expanded "
                             f"(more than {MAX_NODES} nodes)", node)
        fresh = copy.deepcopy(node)
        return _Resolver(self, before).visit(fresh)


class _Resolver(ast.NodeTransformer):
    def __init__(self, outer: _Substitute, before: int):
        self.outer, self.before = outer, before

    def visit_Name(self, node: ast.Name) -> ast.expr:
        name = node.id
        found = self.outer.bindings.get(name)
        if found is None or found.count == 0:
            extra = " (a star import may define it)" if self.outer.star else ""
            raise NotLiteral(f"`{name}` is not bound at module level{extra}", node)
        if found.count > 1:
            raise NotLiteral(f"`{name}` is bound {found.count} times; a constant used here must be "
                             "bound once", node)
        if found.value is None or found.index is None:
            raise NotLiteral(f"`{name}` is not bound by a plain module-level `{name} = <literal>`", node)
        if found.index >= self.before:
            raise NotLiteral(f"`{name}` is bound after it is used", node)
        if self.outer.star:
            raise NotLiteral(f"`{name}` may be rebound by a star import", node)
        try:
            return self.outer.value(found.value, found.index)
        except NotLiteral as exc:
            raise NotLiteral(f"`{name}` is not a literal: {exc}", exc.node) from None


def literal_value(tree: ast.Module, node: ast.expr, index: int):
    """The value of ``node`` (the value of module statement ``index``), or :class:`NotLiteral`."""
    bindings, star = module_bindings(tree)
    try:
        expr = _Substitute(bindings, star).value(node, index)
    except RecursionError:
        raise NotLiteral("the value is nested too deeply", node) from None
    try:
        return ast.literal_eval(expr)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        for sub in ast.walk(expr):
            if not isinstance(sub, _LITERAL_NODES):
                raise NotLiteral(f"`{_describe(sub)}` is computed", sub) from None
        raise NotLiteral(f"`{_describe(node)}` is computed", node) from None

"""The API's route table: each operation once, with what OpenAPI and the docs need to know.

Route modules list :class:`Op` values; :func:`routes` turns them into Starlette
routes and :mod:`kz_daemon.api.openapi` into ``/openapi.json``. A test checks that
``docs/api_reference.md`` names exactly these operations.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from starlette.routing import Route

_PARAM_RE = re.compile(r"{([a-zA-Z_][a-zA-Z0-9_]*)(?::[a-z]+)?}")


@dataclass(frozen=True)
class Param:
    """A query parameter: name, JSON Schema of its value, description."""

    name: str
    schema: dict
    description: str
    required: bool = False


@dataclass(frozen=True)
class Op:
    """One API operation (method + path) and its documentation."""

    method: str
    path: str  # Starlette syntax, e.g. /api/kernels/{kernel_id:path}
    endpoint: Callable
    operation_id: str
    summary: str
    tag: str
    auth: str | None = None  # "runner", "submitter", "admin" or None
    params: tuple[Param, ...] = ()
    request: str | None = None  # schema name, or "multipart"
    responses: dict[int, str | None] = field(default_factory=dict)  # status -> schema name
    content_type: str = "application/json"  # of the 2xx response

    @property
    def openapi_path(self) -> str:
        """The path in OpenAPI syntax (``{kernel_id:path}`` → ``{kernel_id}``)."""
        return _PARAM_RE.sub(lambda m: "{" + m.group(1) + "}", self.path)

    @property
    def path_params(self) -> list[str]:
        """Names of the path parameters."""
        return _PARAM_RE.findall(self.path)


def routes(ops: Iterable[Op]) -> list[Route]:
    """Starlette routes for ``ops`` (operations sharing a path share one Route per method)."""
    return [Route(op.path, op.endpoint, methods=[op.method], name=op.operation_id) for op in ops]

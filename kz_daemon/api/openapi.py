"""``/openapi.json``: built from the route table (apispec.Op) and schemas/api_*.json."""
from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import kz_schemas
from kz_daemon.api.spec import Op
from kz_runner.contract import upload
from kz_runner.contract.kernel_id import KERNEL_ID_PATTERN, MAX_KERNEL_ID_BYTES

_REASONS = {200: "OK", 202: "Accepted", 204: "No Content", 400: "Bad request", 401: "Unauthorized",
            403: "Forbidden", 404: "Not found", 409: "Conflict", 413: "Payload too large",
            422: "Result invalid", 429: "Rate limited", 503: "Unavailable"}

#: the kernel_id rule of kz_runner.contract.kernel_id, as a schema (the handlers apply the rule itself).
KERNEL_ID_EXAMPLE = "cpu/Elementwise/Axpy/fp32/numpy_ref"
_KERNEL_ID_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_KERNEL_ID_BYTES,
                     "pattern": KERNEL_ID_PATTERN}


def _component(name: str) -> dict[str, Any]:
    """A schema file as an OpenAPI 3.1 component (JSON Schema 2020-12 keywords kept)."""
    schema = copy.deepcopy(kz_schemas.load(name))
    for key in ("$schema", "$id"):
        schema.pop(key, None)
    return schema


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def build(ops: Iterable[Op], version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document for ``ops``."""
    paths: dict[str, dict[str, Any]] = {}
    components: dict[str, Any] = {}

    def use(name: str | None) -> dict[str, str] | None:
        if name is None:
            return None
        if name not in components:
            components[name] = _component(name)
        return _ref(name)

    for op in ops:
        operation: dict[str, Any] = {
            "operationId": op.operation_id,
            "summary": op.summary,
            "tags": [op.tag],
            "responses": {},
        }
        parameters = [
            {"name": name, "in": "path", "required": True,
             "schema": dict(_KERNEL_ID_SCHEMA) if name == "kernel_id" else {"type": "string", "minLength": 1},
             "description": "kernel_id (contains slashes)" if name == "kernel_id" else f"the {name}"}
            for name in op.path_params
        ]
        for parameter in parameters:  # the example also tells generators a slash is meant (five segments)
            if parameter["name"] == "kernel_id":
                parameter["example"] = KERNEL_ID_EXAMPLE
        parameters += [
            {"name": p.name, "in": "query", "required": p.required, "schema": p.schema,
             "description": p.description}
            for p in op.params
        ]
        if op.tag == "submissions" and op.method == "POST":
            parameters.append({"name": "X-Submitter-Id", "in": "header", "required": False,
                               "schema": {"type": "string", "pattern": f"^{upload.SUBMITTER_PATTERN}$"},
                               "description": "who submits; must agree with the form field and the token"})
        if op.request == "multipart":  # the upload: a retry with the same key returns the first submission
            parameters.append({"name": "Idempotency-Key", "in": "header", "required": False,
                               "schema": {"type": "string", "pattern": f"^{upload.IDEMPOTENCY_KEY_PATTERN}$"},
                               "description": "makes a retried upload return the original submission "
                                              "(per submitter, remembered for limits.idempotency_ttl_s)"})
        if parameters:
            operation["parameters"] = parameters
        if op.request == "multipart":
            operation["requestBody"] = {
                "required": True,
                "content": {"multipart/form-data": {
                    "schema": use("api_submission_form"),
                    "encoding": {"package": {"contentType": "application/gzip, application/octet-stream"}},
                }},
            }
        elif op.request is not None:
            operation["requestBody"] = {"required": op.request != "api_empty",
                                        "content": {"application/json": {"schema": use(op.request)}}}
        if op.auth == "runner":
            operation["security"] = [{"runnerToken": []}]
        elif op.auth == "submitter":
            operation["security"] = [{}, {"submitterToken": []}]
        elif op.auth == "admin":  # required, unlike the submitter's (which policy may waive)
            operation["security"] = [{"adminToken": []}]
        for status, schema_name in sorted(op.responses.items()):
            response: dict[str, Any] = {"description": _REASONS.get(status, "answer")}
            if status != 204:
                if schema_name is not None:
                    response["content"] = {"application/json": {"schema": use(schema_name)}}
                elif 200 <= status < 300:
                    response["content"] = {op.content_type: {"schema": {}}}
            operation["responses"][str(status)] = response
        operation["responses"].setdefault("500", {"description": "Internal error (generic body)",
                                                  "content": {"application/json": {"schema": use("api_error")}}})
        paths.setdefault(op.openapi_path, {})[op.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "kernel_zoo",
            "version": version,
            "description": "A git-repository-driven GPU operator leaderboard. Errors are "
                           '{"error": {"code", "message", "details"}}. See docs/api_reference.md.',
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "runnerToken": {"type": "http", "scheme": "bearer", "description": "a runner token"},
                "submitterToken": {"type": "http", "scheme": "bearer",
                                   "description": "a submitter or admin token (required by policy)"},
                "adminToken": {"type": "http", "scheme": "bearer", "description": "an admin token"},
            },
        },
    }

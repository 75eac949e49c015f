"""Who is calling: runner tokens for runner endpoints, submitter identity for submissions."""
from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request

from kz_daemon.api.shim_settings import app_state
from kz_daemon.config.tokens import Principal, bearer_token
from kz_daemon.core.errors import ZooError
from kz_runner.contract import upload


def token_principal(request: Request) -> Principal | None:
    """The principal of the request's bearer token; None without one; 401 for an unknown token."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    token = bearer_token(header)
    if token is None:
        raise ZooError("UNAUTHORIZED", "the Authorization header must be 'Bearer <token>'")
    principal = app_state(request).tokens.verify(token)
    if principal is None:
        raise ZooError("UNAUTHORIZED", "the token is not known to this server; ask the operator for one")
    return principal


def require_runner(request: Request) -> str:
    """The runner id of a runner-token request: 401 without a valid token, 403 for a non-runner token."""
    principal = token_principal(request)
    if principal is None:
        raise ZooError("UNAUTHORIZED", "runner endpoints need 'Authorization: Bearer <runner token>'")
    if principal.kind != "runner":
        raise ZooError("FORBIDDEN", f"a {principal.kind} token cannot call runner endpoints")
    return principal.id


def check_submitter_id(value: str, where: str) -> str:
    """A well-formed submitter id, else 400 VALIDATION_ERROR naming ``where`` it came from."""
    if not upload.is_submitter_id(value):
        raise ZooError("VALIDATION_ERROR",
                       f"{where} {value!r} is not a valid submitter id ({upload.SUBMITTER_RULE})",
                       {"field": where})
    return value


def bound_id_error(submitter_id: str, where: str) -> ZooError:
    """403 SUBMITTER_ID_BOUND: ``submitter_id`` has a token, and a request without it named the id."""
    return ZooError("SUBMITTER_ID_BOUND",
                    f"{where} {submitter_id!r} is bound to a token: send that token "
                    "('Authorization: Bearer <submitter token>', kz submit --token) to submit as it, "
                    "or use an id of your own", {"submitter_id": submitter_id, "field": where})


def header_submitter(request: Request) -> tuple[Principal | None, str | None]:
    """The token principal and the submitter id known before the body is read (checked before any cost).

    Raises 401 when the policy requires a token and none is given, 403 when the
    token belongs to a runner or disagrees with ``X-Submitter-Id``, and 403
    SUBMITTER_ID_BOUND when a request without a token names an id bound to one.
    """
    principal, header = _caller(request)
    if principal is None and header is not None and app_state(request).tokens.bound(header):
        raise bound_id_error(header, "X-Submitter-Id")
    return principal, header


def _caller(request: Request) -> tuple[Principal | None, str | None]:
    """Token principal and X-Submitter-Id, with the policy's and the token's own checks."""
    principal = token_principal(request)
    header = request.headers.get("x-submitter-id")
    if header is not None:
        header = check_submitter_id(header.strip(), "X-Submitter-Id")
    settings = app_state(request).settings
    if principal is None:
        if settings.submissions_require_token:
            raise ZooError("UNAUTHORIZED",
                           "this server needs 'Authorization: Bearer <submitter token>' to submit")
        return None, header
    if principal.kind == "runner":
        raise ZooError("FORBIDDEN", "a runner token cannot submit; use a submitter token")
    if principal.kind == "submitter":
        if header is not None and header != principal.id:
            raise ZooError("FORBIDDEN",
                           f"X-Submitter-Id {header!r} does not match the token's submitter {principal.id!r}",
                           {"token_submitter": principal.id})
        return principal, principal.id
    return principal, header  # admin: may submit as anyone


def final_submitter(principal: Principal | None, header: str | None, field: str | None, *,
                    bound: Callable[[str], bool]) -> str:
    """Reconcile token, header and form field into one submitter id (403 on disagreement).

    ``bound(id)`` says whether a token owns ``id`` (``TokenStore.bound``): without a
    token such a form field is 403 SUBMITTER_ID_BOUND, as such a header already was.
    """
    if field is not None and field != "":
        field = check_submitter_id(field.strip(), "submitter_id")
    else:
        field = None
    if principal is None and field is not None and bound(field):
        raise bound_id_error(field, "submitter_id")
    if principal is not None and principal.kind == "submitter":
        if field is not None and field != principal.id:
            raise ZooError("FORBIDDEN",
                           f"submitter_id {field!r} does not match the token's submitter {principal.id!r}",
                           {"token_submitter": principal.id})
        return principal.id
    if header is not None and field is not None and header != field:
        raise ZooError("FORBIDDEN",
                       f"X-Submitter-Id {header!r} and the form field submitter_id {field!r} disagree",
                       {"header": header, "field": field})
    chosen = header or field
    if chosen is None:
        if principal is not None:
            return principal.id
        raise ZooError("VALIDATION_ERROR",
                       "say who submits: the X-Submitter-Id header and/or the form field submitter_id",
                       {"field": "submitter_id"})
    return chosen


def cancel_by(request: Request, submitter_id: str) -> str:
    """Who cancels a submission of ``submitter_id``: the id written into ``job.cancelled``.

    An admin token may cancel any submission, a submitter token its own. Without a
    token (only where the policy lets submissions in without one) the caller must
    send the same ``X-Submitter-Id`` as the submission, and only for an id that no
    submitter token is bound to: once an id has a token, a header alone can name it
    but never act for it. 401 when the policy needs a token, 403 otherwise.
    """
    principal, header = _caller(request)
    if principal is not None:
        if principal.kind == "admin" or principal.id == submitter_id:
            return principal.id
        raise ZooError("FORBIDDEN", "only the submitter's token (or an admin token) can cancel this submission")
    if app_state(request).tokens.bound(submitter_id):
        raise ZooError("FORBIDDEN", f"submitter {submitter_id!r} has a token: cancel with "
                       "'Authorization: Bearer <submitter token>'", {"submitter_id": submitter_id})
    if header is None or header != submitter_id:
        raise ZooError("FORBIDDEN", "only the submitter (the same X-Submitter-Id as the submission) or an "
                       "admin token can cancel this submission")
    return header

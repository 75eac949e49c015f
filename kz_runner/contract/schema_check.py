"""Schema validation as problem values, with validators compiled once per schema.

``validator(name)`` returns a cached jsonschema validator for ``schemas/<name>.json``
with a strict RFC 3339 ``date-time`` format check (jsonschema alone does not
enforce formats). ``schema_problems`` turns its errors into :class:`Problem`
values with a JSON-path ``field`` and a hint for the common YAML traps.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import re
from collections.abc import Iterator
from functools import cache
from typing import Any

from kz_runner.contract.codes import problem
from kz_runner.contract.problems import Problem, clip

MAX_ERRORS_PER_DOCUMENT = 20
_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def is_rfc3339(value: object) -> bool:
    """True for an RFC 3339 date-time string with a time zone, e.g. ``2026-08-02T00:00:00Z``."""
    if not isinstance(value, str):
        return True  # formats constrain strings only; the type keyword handles the rest
    if not _RFC3339.match(value):
        return False
    try:
        _dt.datetime.fromisoformat(value[:-1] + "+00:00" if value[-1] in "Zz" else value)
    except ValueError:
        return False
    return True


@cache
def _format_checker():
    import jsonschema

    checker = jsonschema.FormatChecker(formats=())
    checker.checks("date-time")(is_rfc3339)
    return checker


@cache
def validator(name: str):
    """The compiled jsonschema validator for ``schemas/<name>.json`` (cached)."""
    import jsonschema

    import kz_schemas

    schema = kz_schemas.load(name)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=_format_checker())


@cache
def _fast_validator(name: str):
    """A jsonschema_rs validator when that optional package is installed, else None.

    It only answers "valid?" (about 100x faster); every error message still comes
    from :func:`validator`, so the two must agree: tests/test_contract_schema_check.py
    checks that on valid and invalid documents.
    """
    try:
        import jsonschema_rs

        import kz_schemas
    except ImportError:
        return None
    try:
        return jsonschema_rs.validator_for(kz_schemas.load(name), validate_formats=True)
    except Exception:  # an engine that cannot compile the schema: use the reference validator
        return None


def is_valid(document: Any, schema_name: str) -> bool:
    """True when ``document`` matches ``schemas/<schema_name>.json`` (fast path when available)."""
    fast = _fast_validator(schema_name)
    if fast is not None:
        try:
            if fast.is_valid(document):
                return True
        except (TypeError, ValueError, OverflowError):  # a value the engine cannot convert
            pass
    return validator(schema_name).is_valid(document)


def json_path(parts) -> str:
    """``cases[0].metrics_best.tflops`` from a jsonschema path deque."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _short(value: Any, limit: int = 120) -> str:
    return clip(repr(value), limit)


def _hint_for(error) -> str | None:
    instance = error.instance
    if error.validator == "type" and isinstance(instance, (_dt.date, _dt.datetime)):
        return ("YAML read an unquoted timestamp as a date; quote it, "
                "e.g. recorded_at: \"2026-08-02T00:00:00Z\"")
    if error.validator in ("type", "pattern") and error.path and error.path[-1] == "commit_sha":
        return "Quote the SHA: commit_sha: \"0000000\" (unquoted, YAML reads digits as a number)."
    if error.validator == "additionalProperties":
        return ("Remove the unknown field(s); retired fields such as acceptance.* are rejected, "
                "and the acceptance policy lives in benchmark.py.")
    if error.validator == "maxLength" and error.path and error.path[-1] == "summary":
        return "Shorten summary to at most 300 characters; put detail in description."
    return None


def _message(error) -> str:
    if error.validator == "type":
        return f"{_short(error.instance)} is not of type {error.validator_value!r}"
    if error.validator in ("pattern", "enum", "format", "maxLength", "minLength", "minItems",
                           "minimum", "uniqueItems", "oneOf"):
        return f"{_short(error.instance)} violates {error.validator}: {_short(error.validator_value, 80)}"
    return clip(error.message, 300)


def schema_problems(document: Any, schema_name: str, code: str, file: str | None,
                    field_prefix: str = "") -> list[Problem]:
    """Problems (``code``) for every way ``document`` violates ``schemas/<schema_name>.json``."""
    if is_valid(document, schema_name):
        return []
    check = validator(schema_name)
    errors = sorted(check.iter_errors(document),
                    key=lambda e: (json_path(e.absolute_path), e.validator, e.message))
    out: list[Problem] = []
    for error in errors[:MAX_ERRORS_PER_DOCUMENT]:
        path = json_path(error.absolute_path)
        if field_prefix:
            path = field_prefix + ("." + path if path and not path.startswith("[") else path)
        out.append(problem(code, _message(error), file=file, field=path or None,
                           hint=_hint_for(error)))
    if len(errors) > MAX_ERRORS_PER_DOCUMENT:
        out.append(problem(code, f"... and {len(errors) - MAX_ERRORS_PER_DOCUMENT} more schema errors",
                           file=file, field=field_prefix or None))
    return out


def _json_finite(value: Any) -> bool:
    """True when ``value`` is plain JSON data without NaN or infinities (one pass in C)."""
    try:
        _dumps_finite(value)
    except (TypeError, ValueError, RecursionError):  # not JSON data (a YAML timestamp), or a NaN
        return False
    return True


def _encoder_of_finite_json():
    """A callable that encodes plain JSON data and raises on NaN, infinities or other types.

    The C encoder itself, made once (``JSONEncoder.encode`` makes one per call). Without
    the circular-reference markers: a recursive structure ends in RecursionError, which
    :func:`_json_finite` treats like any other failure (the walk then decides).
    """
    from json import encoder

    make = getattr(encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - json without its C accelerator
        return json.JSONEncoder(allow_nan=False).encode

    def refuse(value: Any) -> Any:
        raise TypeError(type(value).__name__)

    c_encode = make(None, refuse, encoder.encode_basestring, None, ":", ",", False, False, False)
    return lambda value: c_encode(value, 0)


_dumps_finite = _encoder_of_finite_json()


#: bytes.translate table for :func:`may_hold_huge_number`: digits and ``_ : .`` to ``0``, ``e``/``E`` to
#: ``e``, signs to ``+``, anything else to a space
_NUMBER_SHAPE = bytes(48 if chr(i) in "0123456789_:." else 101 if chr(i) in "eE" else 43 if chr(i) in "+-"
                      else 32 for i in range(256))


def may_hold_huge_number(data: bytes, run: int = 100) -> bool:
    """False when no number written in ``data`` can reach 10**(run + 99): no exponent of 3 digits
    or more and no ``run`` characters of digits, ``_``, ``:`` or ``.`` in a row (True: perhaps).

    A few C passes (a regular expression with character classes costs far more here).
    """
    shape = data.translate(_NUMBER_SHAPE)
    return b"e000" in shape or b"e+000" in shape or b"0" * run in shape


def nonfinite_paths(value: Any, path: str = "") -> Iterator[str]:
    """JSON paths of every NaN or infinite float inside ``value``."""
    if not path and isinstance(value, (dict, list)) and _json_finite(value):
        return  # the common case; the walk below names the paths when there are any
    if isinstance(value, float):
        if not math.isfinite(value):
            yield path or "$"
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from nonfinite_paths(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from nonfinite_paths(item, f"{path}[{index}]")

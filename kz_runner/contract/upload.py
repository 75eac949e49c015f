"""The upload's own fields, checked alike by ``kz submit`` and the server.

A submitter id is 1-64 of ``A-Z a-z 0-9 . _ @ + -``; an ``Idempotency-Key`` is 1-128
printable ASCII characters (space to ``~``). Both are matched against the whole string
(``fullmatch``: a trailing newline is not let through). A multipart upload is whole when
its body holds the closing delimiter ``--<boundary>--`` (:func:`multipart_complete`): a
body cut short on the way parses into whatever parts arrived whole, which must not be
mistaken for a form that left a field out.
"""
from __future__ import annotations

import re

SUBMITTER_PATTERN = r"[A-Za-z0-9._@+-]{1,64}"
SUBMITTER_RE = re.compile(SUBMITTER_PATTERN)
SUBMITTER_RULE = "1-64 of A-Z a-z 0-9 . _ @ + -"

IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY_MAX_CHARS = 128
IDEMPOTENCY_KEY_PATTERN = r"[ -~]{1,%d}" % IDEMPOTENCY_KEY_MAX_CHARS
IDEMPOTENCY_KEY_RE = re.compile(IDEMPOTENCY_KEY_PATTERN)
IDEMPOTENCY_KEY_RULE = f"1-{IDEMPOTENCY_KEY_MAX_CHARS} printable ASCII characters, space to '~'"


def is_submitter_id(value: str) -> bool:
    """True when ``value`` is a well-formed submitter id."""
    return SUBMITTER_RE.fullmatch(value) is not None


def is_idempotency_key(value: str) -> bool:
    """True when ``value`` is a well-formed Idempotency-Key."""
    return IDEMPOTENCY_KEY_RE.fullmatch(value) is not None


#: how much of a multipart body's end :func:`multipart_complete` needs (the close delimiter and an epilogue)
MULTIPART_TAIL_BYTES = 1024
_BOUNDARY_RE = re.compile(r'boundary="?([^";]+)"?', re.IGNORECASE)


def multipart_complete(content_type: str, tail: bytes) -> bool:
    """Whether a multipart body whose last bytes are ``tail`` ends with its closing delimiter.

    ``tail`` is the body's last ``MULTIPART_TAIL_BYTES`` bytes (or all of a shorter body).
    A content type without a boundary parameter cannot be judged here: True.
    """
    found = _BOUNDARY_RE.search(content_type or "")
    if found is None:
        return True
    return b"--" + found.group(1).strip().encode("latin-1", "replace") + b"--" in tail

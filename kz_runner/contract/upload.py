"""The upload's own fields, checked alike by ``kz submit`` and the server.

A submitter id is 1-64 of ``A-Z a-z 0-9 . _ @ + -``; an ``Idempotency-Key`` is 1-128
printable ASCII characters (space to ``~``). Both are matched against the whole string
(``fullmatch``: a trailing newline is not let through).
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

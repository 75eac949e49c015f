"""Log tails for the submitter: the end of a step's stderr, bounded and redacted.

A result report carries ``log_tails: {"build": str, "benchmark": str}``: each the
last :data:`MAX_LINES` lines and at most :data:`MAX_BYTES` bytes of that step's
stderr, decoded as UTF-8 with replacement. Before cutting, :class:`Redactor`
replaces the runner's token and every value of the runner's own environment whose
name looks secret (it contains TOKEN, SECRET, PASSWORD or KEY) with
``[redacted]``, and the absolute job directory with ``<workdir>``.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

MAX_LINES = 64
MAX_BYTES = 8 * 1024
REDACTED = "[redacted]"
WORKDIR = "<workdir>"
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|KEY", re.IGNORECASE)
# Values shorter than this are not redacted: replacing every "1" or "yes" would garble the logs
# and such a value is no secret worth the name.
MIN_SECRET_LEN = 6


class Redactor:
    """Replaces secrets and the job directory in text."""

    def __init__(self, secrets: Iterable[str] = (), job_dir: Path | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        values = {s for s in secrets if s}
        values.update(v for k, v in environ.items() if SECRET_NAME.search(k) and v)
        # Longest first, so a secret containing another is replaced whole.
        self.secrets = sorted((v for v in values if len(v) >= MIN_SECRET_LEN), key=len, reverse=True)
        self.paths: list[str] = []
        if job_dir is not None:
            paths = {str(job_dir), os.path.realpath(job_dir)}
            self.paths = sorted(paths, key=len, reverse=True)

    def __repr__(self) -> str:  # never show the secrets
        return f"Redactor({len(self.secrets)} secrets, {len(self.paths)} paths)"

    def text(self, text: str) -> str:
        """``text`` with secrets and the job directory replaced."""
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        for path in self.paths:
            text = text.replace(path, WORKDIR)
        return text

    def data(self, data: bytes) -> bytes:
        """The same for bytes (secrets only; the job directory stays, the runner's logs name it)."""
        for secret in self.secrets:
            data = data.replace(secret.encode("utf-8", "surrogateescape"), REDACTED.encode())
        return data


def tail(data: bytes, redactor: Redactor | None = None, *, max_lines: int = MAX_LINES,
         max_bytes: int = MAX_BYTES) -> str:
    """The redacted end of ``data``: at most ``max_lines`` lines and ``max_bytes`` UTF-8 bytes."""
    text = data.decode("utf-8", "replace")
    if redactor is not None:
        text = redactor.text(text)
    lines = text.splitlines(keepends=True)[-max_lines:]
    out = "".join(lines)
    raw = out.encode("utf-8")
    if len(raw) > max_bytes:
        # Cut at the byte limit, then drop a partial character at the front.
        out = raw[-max_bytes:].decode("utf-8", "ignore")
    return out

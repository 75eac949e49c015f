"""Bearer tokens, stored hashed in ``DIR/auth.yaml``.

Three kinds of principal: ``runner`` (a runner token maps to a runner id; the id is
never taken from a request body), ``submitter`` (a token maps to a submitter id;
``X-Submitter-Id`` must agree with it, and once an id has a token no request without
that token may name it: :meth:`TokenStore.bound`) and ``admin`` (may submit as anyone
and cancel; its own id is bound the same way). The file holds, per token, a random salt and ``sha256(salt || token)``;
plaintext tokens exist only where ``kz up`` writes them for the operator
(``DIR/tokens/*.token``, mode 0600). Lookups compare digests with
:func:`hmac.compare_digest` and pick the file up again when it changes on disk,
so an operator can add or revoke a token without a restart.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

import yaml

from kz_events import durable

KINDS = ("runner", "submitter", "admin")


@dataclass(frozen=True)
class Principal:
    """Who a token belongs to: ``kind`` (runner/submitter/admin) and the id it maps to."""

    kind: str
    id: str


@dataclass(frozen=True)
class _Entry:
    kind: str
    id: str
    salt: bytes
    digest: bytes


def _digest(salt: bytes, token: str) -> bytes:
    return hashlib.sha256(salt + token.encode("utf-8")).digest()


class TokenStore:
    """The hashed token file; thread-safe; re-read when its mtime changes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._entries: list[_Entry] = []
        self._stamp: tuple[int, int] | None = None
        self._load()

    def _load(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._entries, self._stamp = [], None
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        doc = yaml.safe_load(self.path.read_text(encoding="utf-8")) or {}
        entries = []
        for raw in doc.get("tokens") or []:
            try:
                entries.append(
                    _Entry(
                        kind=str(raw["kind"]),
                        id=str(raw["id"]),
                        salt=bytes.fromhex(raw["salt"]),
                        digest=bytes.fromhex(raw["sha256"]),
                    )
                )
            except (KeyError, TypeError, ValueError):
                continue  # a hand-edited broken line must not lock everyone out
        self._entries, self._stamp = entries, stamp

    def _save(self) -> None:
        doc = {
            "tokens": [
                {"kind": e.kind, "id": e.id, "salt": e.salt.hex(), "sha256": e.digest.hex()}
                for e in self._entries
            ]
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = "# kernel_zoo tokens: sha256(salt || token); plaintext is never stored here\n" \
            + yaml.safe_dump(doc, sort_keys=False)
        durable.atomic_write(self.path, text.encode("utf-8"), mode=0o600)
        st = self.path.stat()
        self._stamp = (st.st_mtime_ns, st.st_size)

    def issue(self, kind: str, principal_id: str) -> str:
        """Create a new token for ``(kind, principal_id)``, store its hash, return the plaintext once."""
        if kind not in KINDS:
            raise ValueError(f"unknown token kind {kind!r}; use one of {', '.join(KINDS)}")
        token = f"kz_{kind[0]}_{secrets.token_urlsafe(32)}"
        salt = secrets.token_bytes(16)
        with self._lock:
            self._load()
            self._entries.append(_Entry(kind, principal_id, salt, _digest(salt, token)))
            self._save()
        return token

    def revoke(self, kind: str, principal_id: str) -> int:
        """Remove every token of ``(kind, principal_id)``; returns how many were removed."""
        with self._lock:
            self._load()
            before = len(self._entries)
            self._entries = [e for e in self._entries if (e.kind, e.id) != (kind, principal_id)]
            removed = before - len(self._entries)
            if removed:
                self._save()
        return removed

    def verify(self, token: str | None) -> Principal | None:
        """The principal a plaintext token belongs to, or None (constant-time digest compare)."""
        if not token:
            return None
        with self._lock:
            self._load()
            entries = list(self._entries)
        found: Principal | None = None
        for entry in entries:
            if hmac.compare_digest(_digest(entry.salt, token), entry.digest):
                found = Principal(entry.kind, entry.id)
        return found

    def principals(self) -> list[Principal]:
        """Every principal that holds at least one token, sorted, each listed once."""
        with self._lock:
            self._load()
            return sorted({Principal(e.kind, e.id) for e in self._entries}, key=lambda p: (p.kind, p.id))

    def bound(self, principal_id: str) -> bool:
        """Whether a submitter or admin token maps to ``principal_id``: only that token may submit as it."""
        with self._lock:
            self._load()
            return any(e.id == principal_id and e.kind in ("submitter", "admin") for e in self._entries)

    def has(self, kind: str, principal_id: str) -> bool:
        """Whether a token for ``(kind, principal_id)`` is stored."""
        with self._lock:
            self._load()
            return any((e.kind, e.id) == (kind, principal_id) for e in self._entries)


def bearer_token(header_value: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, else None."""
    if not header_value:
        return None
    scheme, _, value = header_value.partition(" ")
    if scheme.lower() != "bearer":
        return None
    value = value.strip()
    return value or None


def write_secret(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the start (never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    durable.atomic_write(path, (text + "\n").encode("utf-8"), mode=0o600)


def ensure_local_tokens(state_dir: str | os.PathLike[str], runner_id: str = "local-runner",
                        submitter_id: str = "admin") -> dict[str, Path]:
    """Make sure ``DIR/tokens/{runner,admin}.token`` hold valid tokens; reuse them when they do.

    Returns ``{"runner": path, "admin": path}``. Used by ``kz up`` for its local runner
    and for the operator's copy-paste submit command.
    """
    state = Path(state_dir)
    store = TokenStore(state / "auth.yaml")
    out: dict[str, Path] = {}
    for kind, pid, name in (("runner", runner_id, "runner"), ("admin", submitter_id, "admin")):
        path = state / "tokens" / f"{name}.token"
        current = path.read_text(encoding="utf-8").strip() if path.exists() else ""
        principal = store.verify(current)
        if principal is None or principal != Principal(kind, pid):
            write_secret(path, store.issue(kind, pid))
        out[name] = path
    return out

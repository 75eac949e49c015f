"""Idempotency keys: a retried upload answers with the submission its first try created.

A submitter sends ``Idempotency-Key: KEY`` with ``POST /api/submissions`` (``kz submit``
sends a uuid4 per invocation and the same on its retries). Keys are scoped per submitter.
The durable record is the ``idempotency_key`` of ``submission.received`` (the reducer
keeps ``State.idempotency``: submitter -> {key -> [uuid, sha256, received ts]}), so a
restart keeps them; entries older than ``limits.idempotency_ttl_s`` are ignored.

Between the decision and intake's ``submission.received`` the key lives only here, as a
reservation made under ``zoo.lock`` before the upload is dropped into the spool: a
concurrent upload with the same key finds it and gets the same uuid instead of a second
submission. The sidecar carries the key and the package's sha256, so a daemon restarted
before intake recorded the upload reserves the key again (``Keys.seed``).
"""
from __future__ import annotations

import threading
import uuid as uuidlib
from collections.abc import Container
from dataclasses import dataclass

from kz_daemon.core.clock import epoch_of
from kz_daemon.core.errors import ZooError
from kz_runner.contract import upload

HEADER = upload.IDEMPOTENCY_HEADER
MAX_KEY_CHARS = upload.IDEMPOTENCY_KEY_MAX_CHARS


def key_error(key: str) -> str | None:
    """Why ``key`` is not a valid Idempotency-Key, or None when it is."""
    if upload.is_idempotency_key(key):
        return None
    if not key:
        return "the Idempotency-Key header is empty"
    if len(key) > MAX_KEY_CHARS:
        return f"the Idempotency-Key header is {len(key)} characters long; at most {MAX_KEY_CHARS}"
    return "the Idempotency-Key header must be printable ASCII (space to '~')"


def check_key(key: str) -> None:
    """ZooError VALIDATION_ERROR unless ``key`` is a valid Idempotency-Key."""
    problem = key_error(key)
    if problem is not None:
        raise ZooError("VALIDATION_ERROR", problem, {"header": HEADER, "max_chars": MAX_KEY_CHARS})


@dataclass(frozen=True)
class Decision:
    """What an upload with a key does: ``fresh`` (drop it as ``uuid``) or replay ``uuid``."""

    uuid: str
    fresh: bool


class Keys:
    """Reservations of keys whose upload is dropped but not yet received by intake."""

    def __init__(self) -> None:
        # (submitter, key) -> (uuid, sha256, reserved at epoch s); guarded by its own lock
        # besides zoo.lock so release() may run from any thread
        self._reserved: dict[tuple[str, str], tuple[str, str, float]] = {}
        self._lock = threading.Lock()

    def decide(self, durable: list | None, received: Container[str], submitter: str, key: str, sha256: str,
               now: float, ttl_s: float) -> Decision:
        """Replay the live entry for (submitter, key), refuse a different package, or reserve the key.

        ``durable`` is the folded ``[uuid, sha256, ts]`` (or None); ``received`` holds the
        uuids intake has recorded (their reservations are no longer needed). The caller
        holds ``zoo.lock`` so that two uploads with one key cannot both reserve it.
        """
        with self._lock:
            for k, (u, _sha, at) in list(self._reserved.items()):
                if u in received or now - at > ttl_s:
                    del self._reserved[k]
            prior: tuple[str, str] | None = None
            if durable is not None and now - (epoch_of(durable[2]) or 0.0) <= ttl_s:
                prior = (durable[0], durable[1])
            elif (submitter, key) in self._reserved:
                u, sha, _at = self._reserved[(submitter, key)]
                prior = (u, sha)
            if prior is not None:
                if prior[1] != sha256:
                    raise ZooError(
                        "CONFLICT",
                        f"Idempotency-Key {key!r} was used for submission {prior[0]} with a different "
                        "package; send a new key for a new upload",
                        {"uuid": prior[0], "idempotency_key": key})
                return Decision(prior[0], False)
            sub_uuid = str(uuidlib.uuid4())
            self._reserved[(submitter, key)] = (sub_uuid, sha256, now)
            return Decision(sub_uuid, True)

    def seed(self, sidecars: list[dict], now: float) -> int:
        """Reserve the keys of uploads dropped before a restart that intake has not recorded yet."""
        with self._lock:
            count = 0
            for meta in sidecars:
                key, submitter = meta["idempotency_key"], meta.get("submitter_id")
                if isinstance(submitter, str) and key_error(key) is None:
                    self._reserved.setdefault((submitter, key), (meta["uuid"], meta["idempotency_sha256"], now))
                    count += 1
            return count

    def release(self, submitter: str, key: str, sub_uuid: str) -> None:
        """Forget a reservation whose upload never reached the inbox (a retry may try again)."""
        with self._lock:
            if self._reserved.get((submitter, key), (None,))[0] == sub_uuid:
                del self._reserved[(submitter, key)]

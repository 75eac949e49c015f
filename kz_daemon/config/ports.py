"""What the daemon's modules need of the daemon object they share (``Zoo``), as a ``Protocol``.

The queue, intake, accept saga, recovery, indexer and mirror take the daemon as
their first argument; typing it here (instead of importing ``kz_daemon.ops.service``)
keeps them free of the service module, so imports run one way: service → them.
The HTTP layer takes the wider :class:`Service` (the daemon and its service calls): the
``zoo`` field of the app's typed state (``kz_daemon.api.shim_settings.AppState``).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from kz_daemon.config.settings import Config
from kz_daemon.core.readmodel import SubmissionView
from kz_daemon.storage.gitstore import GitStore
from kz_daemon.storage.pending import PendingStore
from kz_events.log.history import Query
from kz_events.log.store import Store

__all__ = ["Daemon", "IndexPort", "IntakePort", "Service"]


class IndexPort(Protocol):
    """The index.json owner, as the saga and recovery use it."""

    def update(self, kernel_ids: Iterable[str]) -> dict:
        """Recompute the entries of ``kernel_ids`` after an accept."""
        ...

    def catch_up(self) -> str:
        """Bring index.json to HEAD at start-up."""
        ...


class IntakePort(Protocol):
    """The intake, as recovery uses it."""

    def recover(self) -> int:
        """Emit the events of outcome folders the log lacks."""
        ...


class Daemon(Protocol):
    """The shared daemon object: its state, its locks and the few actions modules call back."""

    # Read-only members (properties), so the daemon's own types satisfy them: a mutable
    # protocol attribute would have to be of exactly the declared type (an RLock is not
    # "an AbstractContextManager" there, nor an Indexer "an IndexPort").
    @property
    def config(self) -> Config: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def lock(self) -> AbstractContextManager[Any]:
        """Decisions: read the state, then emit."""
        ...
    @property
    def git_lock(self) -> AbstractContextManager[Any]:
        """Every git access."""
        ...
    @property
    def store(self) -> Store: ...
    @property
    def git(self) -> GitStore: ...
    @property
    def pending(self) -> PendingStore: ...
    @property
    def intake(self) -> IntakePort: ...
    @property
    def indexer(self) -> IndexPort: ...
    @property
    def stopping(self) -> bool: ...

    def note_runner(self, runner_id: str, info: dict | str | None = None) -> None:
        """Remember that a runner asked for work."""
        ...

    def after_accept(self, head: str) -> None:
        """Wake the background work that follows an accept."""
        ...

    def submission(self, sub_uuid: str) -> SubmissionView:
        """The current view of a submission."""
        ...

    def log(self, message: str) -> None:
        """Tell the operator about trouble: one WARNING line in the daemon's log."""
        ...


class Service(Daemon, Protocol):
    """The daemon as the HTTP layer calls it: the ``Daemon`` and the service's calls (``Zoo``'s methods).

    ``create_app`` takes one, so mypy checks that ``Zoo`` has every call a handler makes;
    the handlers reach it as ``app_state(request).zoo``. Values of the wings above ``config`` (a ``Claim``,
    an idempotency ``Decision``) are ``Any`` here.
    """

    def start(self) -> None:
        """Recovery, then the daemon's threads."""
        ...

    @property
    def started(self) -> bool:
        """Whether ``start`` has finished (recovery done, threads running): /readyz reads it."""
        ...

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the threads and close the store and repo (never raises)."""
        ...

    def index(self) -> dict:
        """The current index document."""
        ...

    def metrics(self) -> dict:
        """Counters and gauges for /metrics."""
        ...

    def queue_view(self) -> dict:
        """seq, pending, in flight, accepting, runners."""
        ...

    def queue_warning(self, arch: str | None) -> dict | None:
        """Why a queued job of ``arch`` may wait (no live runner serves it), or None."""
        ...

    def submissions(self, query: Query, before: int | None = None, limit: int = 50) -> list[SubmissionView]:
        """Submissions matching ``query``, newest first."""
        ...

    def wait_submission(self, sub_uuid: str, after_seq: int, timeout: float) -> SubmissionView:
        """The view once it changed after ``after_seq`` (or at ``timeout``)."""
        ...

    def wait_intake(self, sub_uuid: str, timeout: float) -> SubmissionView:
        """The view once intake decided the upload (or at ``timeout``)."""
        ...

    def drop_upload(self, fileobj: BinaryIO, meta: dict[str, Any]) -> str:
        """Stream an upload into the inbox; its uuid."""
        ...

    def reserve_upload(self, submitter: str, key: str, sha256: str) -> Any:
        """Decide an upload carrying an Idempotency-Key (an ``idempotency.Decision``)."""
        ...

    def release_upload(self, submitter: str, key: str, sub_uuid: str) -> None:
        """Drop a key's reservation whose upload failed."""
        ...

    def note_verified(self, sub_uuid: str, kind: str, principal_id: str) -> None:
        """Record who (a verified token) uploaded ``sub_uuid``."""
        ...

    def claim(self, runner_id: str, arch: str, wait_s: float = 0.0) -> Any:
        """A job under a new lease (a ``queue.leases.Claim``), or None."""
        ...

    def runner_package(self, sub_uuid: str, runner_id: str) -> Path:
        """The tar.gz for the lease holder."""
        ...

    async def renew_async(self, sub_uuid: str, runner_id: str, lease_id: str) -> float:
        """Renew a lease; its new expiry."""
        ...

    async def release_async(self, sub_uuid: str, runner_id: str, lease_id: str, reason: str = "released") -> None:
        """Give a lease back."""
        ...

    async def cancel_async(self, sub_uuid: str, by: str, reason: str = "cancelled") -> None:
        """Cancel a submission."""
        ...

    def report_result(self, sub_uuid: str, runner_id: str, lease_id: str, result: dict | None,
                      logs: bytes = b"", env: dict | None = None,
                      failure: dict | None = None, log_tails: dict | None = None) -> SubmissionView:
        """A runner's report: the hard checks, then the accept saga or a rejection."""
        ...

    def reviews(self) -> list[dict]:
        """The held submissions with their evidence."""
        ...

    def review(self, sub_uuid: str, decision: str, by: str, reason: str = "") -> SubmissionView:
        """An admin's decision on a held submission."""
        ...

    def revoke(self, sub_uuid: str, by: str, reason: str) -> SubmissionView:
        """Take an accepted record back."""
        ...

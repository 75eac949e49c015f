"""What the daemon's modules need of the daemon object they share (``Zoo``), as a ``Protocol``.

The queue, intake, accept saga, recovery, indexer and mirror take the daemon as
their first argument; typing it here (instead of importing ``kz_daemon.ops.service``)
keeps them free of the service module, so imports run one way: service → them.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from kz_daemon.config.settings import Config
from kz_daemon.core.readmodel import SubmissionView
from kz_daemon.storage.gitstore import GitStore
from kz_daemon.storage.pending import PendingStore
from kz_events.log.store import Store

__all__ = ["Daemon", "IndexPort", "IntakePort"]


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

    config: Config
    clock: Callable[[], float]
    lock: AbstractContextManager[Any]       # decisions: read the state, then emit
    git_lock: AbstractContextManager[Any]   # every git access
    store: Store
    git: GitStore
    pending: PendingStore
    intake: IntakePort
    indexer: IndexPort
    stopping: bool

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

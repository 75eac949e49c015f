"""Every submission a store or a log knows, live and finished: the State keeps only live ones."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kz_events.log.history import Query
from kz_events.log.reading import replay_finished


def every(store: Any) -> dict[str, Any]:
    """Each submission of a running store (live ones and the history projection's), by uuid."""
    return {sub.uuid: sub for sub in store.select(Query(), limit=10_000_000)}


def logged(events_dir: Path | str) -> dict[str, Any]:
    """Each submission a replay of the log alone gives (live and finished), by uuid."""
    state, finished = replay_finished(events_dir)
    return {**finished, **state.submissions}

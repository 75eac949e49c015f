"""Thread helpers for tests of lock behaviour."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def held_in_another_thread(lock) -> Iterator[threading.Event]:
    """Hold ``lock`` in another thread until the yielded event is set (or the block ends)."""
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            holding.set()
            release.wait(20)

    thread = threading.Thread(target=holder, name="lock-holder")
    thread.start()
    try:
        assert holding.wait(10), "the holder thread never took the lock"
        yield release
    finally:
        release.set()
        thread.join(10)

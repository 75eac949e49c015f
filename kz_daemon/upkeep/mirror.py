"""Optional mirrors: push the kernel repo's branch to configured remotes after accepts.

A background thread, never the accept path: :meth:`Mirror.notify` only records the
newest head and wakes the thread. Each push (dulwich ``porcelain.push``; a local
path to a bare repository works, and is created bare when missing) is one
``mirror.pushed`` event, ok or not; a failed round of pushes is retried after
``compute_backoff`` of the failed rounds in a row (``kz_daemon.core.backoff``, as the
reaper's: 1 s doubling to 5 min) until it succeeds, or sooner when a newer head is notified.
"""
from __future__ import annotations

import io
import threading
from pathlib import Path

from dulwich import porcelain
from dulwich.repo import Repo

from kz_daemon.config.ports import Daemon
from kz_daemon.core.backoff import compute_backoff
from kz_events import events as ev

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 300.0


def push(repo_path: Path, url: str, branch: str) -> None:
    """Push ``branch`` of the repo at ``repo_path`` to ``url`` (raises on failure)."""
    if "://" not in url and ":" not in url.split("/", 1)[0]:
        target = Path(url)
        if not target.exists():
            target.mkdir(parents=True)
            Repo.init_bare(str(target)).close()
    ref = f"refs/heads/{branch}".encode()
    out, err = io.BytesIO(), io.BytesIO()
    porcelain.push(str(repo_path), url, [ref + b":" + ref], outstream=out, errstream=err, force=False)


class Mirror:
    """Pushes the branch to every configured mirror in a background thread."""

    def __init__(self, zoo: Daemon, first_backoff_s: float = BACKOFF_START_S,
                 max_backoff_s: float = BACKOFF_MAX_S) -> None:
        self.zoo = zoo
        self.first_backoff_s, self.max_backoff_s = first_backoff_s, max_backoff_s
        self.mirrors = zoo.config.mirrors
        self._cond = threading.Condition()
        self._wanted: str | None = None
        self._pushed: dict[str, str] = {}
        self._stop = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the pusher thread (no thread when no mirror is configured); pushes HEAD once."""
        if not self.mirrors:
            return
        self._thread = threading.Thread(target=self._run, name="kz-mirror", daemon=True)
        self._thread.start()
        with self.zoo.git_lock:
            head = self.zoo.git.head()
        if head:
            self.notify(head)

    def notify(self, head: str) -> None:
        """Ask for ``head`` to be pushed (coalesces with pending requests)."""
        if not self.mirrors:
            return
        with self._cond:
            self._wanted = head
            self._cond.notify_all()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread after the push in progress."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` before the next round (a notify or a stop ends the wait early)."""
        with self._cond:
            self._cond.wait(seconds)

    def _run(self) -> None:
        failures = 0  # failed rounds in a row
        while True:
            with self._cond:
                while not self._stop and (self._wanted is None or all(
                        self._pushed.get(m.name) == self._wanted for m in self.mirrors)):
                    self._cond.wait()
                if self._stop:
                    return
                head = self._wanted
            assert head is not None  # the wait above ends only with a head to push
            failed = False
            for mirror in self.mirrors:
                if self._pushed.get(mirror.name) == head:
                    continue
                error = None
                try:
                    push(self.zoo.git.root, mirror.url, self.zoo.config.repo.branch)
                    self._pushed[mirror.name] = head
                except Exception as exc:  # any transport failure is retried
                    error = f"{type(exc).__name__}: {exc}"[:500]
                    failed = True
                try:
                    self.zoo.store.emit(ev.MirrorPushed(remote=mirror.name, sha=head, ok=error is None,
                                                        error=error))
                except Exception:
                    return  # the store is closed or broken: the daemon is going down
            if failed:
                failures += 1
                self._pause(compute_backoff(failures, self.first_backoff_s, self.max_backoff_s))
            else:
                failures = 0

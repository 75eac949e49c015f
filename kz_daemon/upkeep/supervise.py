"""Keep ``kz up``'s local runner alive: restart it with backoff, and say when it keeps dying.

One poisonous job (a package that kills its runner) must not leave the zoo without
a runner. :class:`Supervisor` starts the child, watches it from a thread and, when
it exits while not being stopped, starts it again after ``compute_backoff`` of its
exits in a row (``kz_daemon.core.backoff``, as the reaper's: ``first_backoff_s``
doubling up to ``max_backoff_s``; the count starts over once a run lasted ``stable_s``).
Every exit is one WARNING line in the daemon's log (the module's logger). A child that exited ``crash_limit`` times within
``window_s`` is *crash-looping*: :meth:`health` reports it (``/readyz`` turns 503)
while the restarts go on.

An exit code in ``refusals`` (for the runner: 78, no sandbox can be made on this host)
is a refusal, not a crash: :meth:`health` fails at once with the refusal's text and the
child's last line that names its code (the runner's reason and fix), and keeps failing
until a restarted child has run for ``stable_s``. The child's stderr is passed through
line by line to ``child_out`` (the operator's stream) and its last lines kept for that.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from kz_daemon.core.backoff import compute_backoff

#: ``kz runner``'s exit code when no sandbox can be made on its host (its EXIT_SANDBOX_UNAVAILABLE;
#: the daemon does not import the runner's worker modules)
RUNNER_REFUSALS = {78: ("SANDBOX_UNAVAILABLE", "the local runner refused to run jobs: no sandbox can be made "
                                               "on this host")}
#: lines of the child's stderr kept for a refusal's reason
KEPT_LINES = 50

logger = logging.getLogger(__name__)


class Supervisor:
    """A supervised child process: ``start()``, ``health()``, ``stop(grace_s)``."""

    def __init__(self, argv: Sequence[str], *, env: dict[str, str] | None = None, name: str = "runner",
                 preexec_fn: Callable[[], None] | None = None,
                 first_backoff_s: float = 1.0, max_backoff_s: float = 60.0, stable_s: float = 60.0,
                 crash_limit: int = 3, window_s: float = 300.0,
                 refusals: Mapping[int, tuple[str, str]] | None = None, child_out: TextIO | None = None) -> None:
        self.argv = list(argv)
        self.env = env
        self.name = name
        self.preexec_fn = preexec_fn
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.stable_s = stable_s
        self.crash_limit = crash_limit
        self.window_s = window_s
        # exit code -> (code, text): exits that say the child cannot work here, not that it crashed
        self.refusals = dict(refusals or {})
        # where the child's stderr goes (None: this process's stderr at the time of writing)
        self.child_out = child_out
        # (code, reason) of the last refusal, until a child has run stable_s since
        self.refusal: tuple[str, str] | None = None
        self._lines: deque[str] = deque(maxlen=KEPT_LINES)
        self._began = time.monotonic()
        self._pump_thread: threading.Thread | None = None
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.last_exit: int | None = None
        self._exits: deque[float] = deque(maxlen=max(1, crash_limit))
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def log(self, message: str) -> None:
        """One WARNING line in the daemon's log, naming the child."""
        logger.warning("%s: %s", self.name, message)

    def start(self) -> Supervisor:
        """Start the child and the thread that restarts it."""
        self._spawn()
        self._thread = threading.Thread(target=self._watch, name=f"kz-supervise-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _spawn(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, preexec_fn=self.preexec_fn)
            self._began = time.monotonic()
            self.starts += 1
            self._pump_thread = threading.Thread(target=self._pump, args=(self.proc.stderr,),
                                                 name=f"kz-supervise-{self.name}-err", daemon=True)
            self._pump_thread.start()

    def _pump(self, stream: Any) -> None:
        """Pass the child's stderr through, keeping its last lines (for a refusal's reason)."""
        with stream:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", "replace")
                self._lines.append(line.rstrip("\n"))
                out = self.child_out or sys.stderr
                try:
                    out.write(line)
                    out.flush()
                except (OSError, ValueError):
                    pass

    def _watch(self) -> None:
        failures = 0  # exits in a row, each after a run shorter than stable_s
        while not self._stopping.is_set():
            proc = self.proc
            began = time.monotonic()
            code = proc.wait() if proc is not None else None
            pump = self._pump_thread
            if pump is not None:  # the child's last words, read to the end of its stderr
                pump.join(2)
            if self._stopping.is_set():
                return
            now = time.monotonic()
            self.last_exit = code
            if now - began >= self.stable_s:
                failures = 0
            failures += 1
            delay = compute_backoff(failures, self.first_backoff_s, self.max_backoff_s)
            if code in self.refusals:
                self.refusal = self._refusal_reason(code)
                self.log(f"{self.refusal[1]}; trying again in {delay:.3g} s")
            self._exits.append(now)
            looping = self.crash_looping()
            self.log(f"exited with code {code} after {now - began:.1f} s; restarting in {delay:.3g} s"
                     + (f" (it died {len(self._exits)} times within {self.window_s:.0f} s: "
                        "look at its log above)" if looping else ""))
            if self._stopping.wait(delay):
                return
            try:
                self._spawn()
            except OSError as exc:
                self.log(f"cannot be started: {exc}")

    def _refusal_reason(self, code: int) -> tuple[str, str]:
        """(code word, reason) of a refusal exit: the table's text and the child's last line naming it."""
        word, text = self.refusals[code]
        said = next((line.strip() for line in reversed(self._lines) if word in line), None)
        return word, f"{text} (exit {code}, {word})" + (f": {said}" if said else "")

    def refused(self) -> tuple[str, str] | None:
        """The last refusal, while no child has run ``stable_s`` since it."""
        if self.refusal is None:
            return None
        if self.alive() and time.monotonic() - self._began >= self.stable_s:
            self.refusal = None
        return self.refusal

    def crash_looping(self) -> bool:
        """Whether the child exited ``crash_limit`` times within the last ``window_s``."""
        exits = list(self._exits)
        return len(exits) >= self.crash_limit and time.monotonic() - exits[0] <= self.window_s

    def alive(self) -> bool:
        """Whether the child runs now."""
        proc = self.proc
        return proc is not None and proc.poll() is None

    def health(self) -> dict[str, Any]:
        """The ``runner`` check of /readyz: ok unless the child refused to work here (its reason)
        or is crash-looping."""
        looping = self.crash_looping()
        refused = self.refused()
        alive = self.alive()
        reason = None
        if refused is not None:
            reason = refused[1]
        elif looping:
            reason = (f"the local {self.name} died {len(self._exits)} times within {self.window_s:.0f} s "
                      f"(last exit code {self.last_exit}); kz up keeps restarting it")
        return {"ok": not looping and refused is None, "reason": reason, "code": refused and refused[0],
                "alive": alive, "starts": self.starts,
                "restarts": max(0, self.starts - 1), "last_exit": self.last_exit,
                "pid": self.proc.pid if alive and self.proc is not None else None}

    def stop(self, grace_s: float) -> None:
        """Stop restarting, then SIGTERM the child (SIGKILL after ``grace_s``)."""
        with self._lock:
            self._stopping.set()
            proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.terminate()
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            except ProcessLookupError:
                pass
        if self._thread is not None:
            self._thread.join(5)

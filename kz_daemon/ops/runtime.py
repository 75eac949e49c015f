"""Setting up a state directory and running a Zoo until a signal: shared by ``kz daemon`` and ``kz up``.

``init_state_dir(DIR, seed_from=examples/)`` makes a state directory ready to run:
the documented default ``kz.yaml`` (kept when present), the spool and the other
folders, and the kernel repo, created and seeded with a first commit holding
every package under ``seed_from`` when the repo has no commit yet. It is
idempotent: calling it again on a running installation changes nothing.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

from kz_daemon.config.settings import Config, write_default
from kz_daemon.ops.service import Zoo
from kz_daemon.storage.gitstore import GitStore, file_mode, format_message
from kz_events.log.segments import CorruptLog, LogError, LogLocked

#: the loggers whose lines the daemon's process shows: every module of these packages logs under them
DAEMON_LOGGERS = ("kz_daemon", "kz_events")
#: one line of the daemon's log: UTC time, level, the program, the message
LOG_FORMAT = "%(asctime)s %(levelname)s kz daemon: %(message)s"
LOG_DATE_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".mypy_cache"}
SKIP_SUFFIXES = (".pyc", ".pyo")


def seed_files(seed_from: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``seed_from`` as {repo path: (bytes, git mode)} (caches and .git skipped)."""
    out: dict[str, tuple[bytes, int]] = {}
    seed_from = Path(seed_from)
    for base, dirs, files in os.walk(seed_from):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            if name.endswith(SKIP_SUFFIXES):
                continue
            path = Path(base) / name
            if path.is_symlink() or not path.is_file():
                continue
            rel = path.relative_to(seed_from).as_posix()
            out[rel] = (path.read_bytes(), file_mode(path.stat().st_mode))
    return out


def init_state_dir(state_dir: str | Path, seed_from: str | Path | None = None,
                   config_file: str | Path | None = None, repo: str | Path | None = None) -> Config:
    """Create (or complete) a state directory and return its Config.

    Writes the default ``kz.yaml`` unless ``config_file`` is given or one exists,
    creates the folders, initialises the repo and, when it has no commit yet and
    ``seed_from`` is given, commits every file under ``seed_from`` as the first
    commit (subject ``seed: packages from <name>``) and checks it out.
    """
    state_dir = Path(state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    if config_file is None:
        write_default(state_dir / "kz.yaml")
    config = Config.load(state_dir, config_file)
    if repo is not None:
        config = config.with_paths(repo=repo)
    config.ensure_dirs()
    for sub in ("tmp", "inbox", "work", "rejected"):
        (config.paths.spool / sub).mkdir(parents=True, exist_ok=True)
    git = GitStore.open_or_init(config.paths.repo, config.repo.branch, config.repo.fsync)
    try:
        if git.head() is None and seed_from is not None:
            files = seed_files(Path(seed_from))
            if files:
                message = format_message(f"seed: packages from {Path(seed_from).name}",
                                         {"Kz-Step": "seed"})
                git.commit_changes(files, message, config.repo.author, None)
                git.sync_worktree()
    finally:
        git.close()
    return config


def run_until_signal(config: Config, on_ready: Callable[[object], None] | None = None,
                     stop_event: threading.Event | None = None) -> int:
    """Start a Zoo, wait for SIGTERM/SIGINT (or ``stop_event``), stop it; returns 0."""
    stop = stop_event or threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    zoo = Zoo(config)
    try:
        zoo.start()
        if on_ready is not None:
            on_ready(zoo)
        while not stop.wait(1.0):
            pass
    finally:
        zoo.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


class DaemonLogHandler(logging.StreamHandler):
    """The handler :func:`configure_logging` installs (told apart from any other by its class)."""


#: glibc's mallopt parameters (malloc.h) and what the daemon sets them to
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
HEAP_SETTINGS = ((M_ARENA_MAX, 2), (M_MMAP_THRESHOLD, 128 * 1024), (M_TRIM_THRESHOLD, 128 * 1024))
#: an operator who sets any of these chose the allocator's behaviour: left alone
MALLOC_ENV = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def tune_malloc(environ: Mapping[str, str] | None = None) -> str:
    """Keep glibc's heap from holding memory the daemon freed; what was done, in words.

    A long-lived daemon with a thread pool fragments glibc's default heap: an arena per
    thread (up to 8 per core), and a mmap threshold that rises after the first large free,
    so later large buffers (tarballs, result documents, git objects) come from the heap and
    leave holes it keeps. Measured with ``benchmarks/memory_probe.py`` (soak load, 2-core
    VM): malloc's free bytes grew from 2 to 17 MiB in five minutes and RSS 3.7 KB per
    submission over the last three; with two arenas and fixed 128 KiB thresholds free bytes
    stayed at 1.5 MiB and RSS grew 0.7 KB per submission. Called by
    :func:`prepare_daemon_process` before any thread starts.
    """
    env = os.environ if environ is None else environ
    chosen = [name for name in MALLOC_ENV if name in env]
    if chosen:
        return f"malloc left as the environment sets it ({', '.join(chosen)})"
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "malloc left as it is (no glibc mallopt here)"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    failed = [param for param, value in HEAP_SETTINGS if mallopt(param, value) != 1]
    if failed:
        return f"malloc partly tuned (mallopt refused {failed})"
    return "malloc tuned: 2 arenas, mmap and trim thresholds fixed at 128 KiB"


def prepare_daemon_process() -> logging.Handler:
    """A daemon process's first step (``kz daemon``, ``kz up``): tune the heap, then show the log lines.

    The heap first, before any thread starts (glibc makes arenas per thread); what was done
    is logged at debug level once the handler exists (stderr at INFO stays for what an
    operator must read).
    """
    heap = tune_malloc()
    handler = configure_logging()
    logging.getLogger("kz_daemon").debug(heap)
    return handler


def configure_logging(stream: TextIO | None = None, level: int = logging.INFO) -> logging.Handler:
    """Show the daemon's log lines on ``stream`` (stderr): ``kz daemon`` and ``kz up`` call this once.

    The modules log through ``logging.getLogger(__name__)``; this gives the ``kz_daemon``
    and ``kz_events`` loggers one handler writing ``LOG_FORMAT`` (UTC time, level, the
    message), at ``level`` and up. Other libraries' loggers are left as they are. A second
    call returns the handler of the first.
    """
    for name in DAEMON_LOGGERS:
        for existing in logging.getLogger(name).handlers:
            if isinstance(existing, DaemonLogHandler):
                return existing
    handler = DaemonLogHandler(sys.stderr if stream is None else stream)
    formatter = logging.Formatter(LOG_FORMAT, LOG_DATE_FORMAT)
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    for name in DAEMON_LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(level)
    return handler


def open_failure(prog: str, state_dir: Path, exc: BaseException) -> str | None:
    """One line telling the operator why the event log cannot be opened, or None for any other error.

    A log that fails its checks at open (a hash link broken by an edit, a seq gap,
    an unreadable line) is not something a restart fixes: the line names the seq and
    the file, and says to run ``kz audit`` and to move the events folder aside.
    """
    if isinstance(exc, CorruptLog):
        return (f"{prog}: the event log is corrupt at seq {exc.seq} in {exc.path} "
                f"(byte offset {exc.offset}: {exc.reason}); nothing was started. "
                f"Run `kz audit --state-dir {state_dir}` for the full report, then move "
                f"{state_dir / 'events'} aside (quarantine) and restore it from a backup")
    if isinstance(exc, LogError) and not isinstance(exc, LogLocked):
        return (f"{prog}: the event log cannot be opened: {exc}; nothing was started. "
                f"Run `kz audit --state-dir {state_dir}` for the full report")
    return None

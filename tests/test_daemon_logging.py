"""The daemon's operator lines go through ``logging``: one handler, set up by ``kz daemon``/``kz up``.

The modules log with ``logging.getLogger(__name__)``; ``kz_daemon.ops.runtime.configure_logging``
gives the ``kz_daemon`` and ``kz_events`` loggers one stderr handler whose lines carry the UTC
time and the level before the words operators read before. A real ``kz daemon`` process shows
the line of an inbox entry it leaves alone that way.
"""
from __future__ import annotations

import io
import logging
import re

import pytest

from kz_daemon.ops.runtime import DAEMON_LOGGERS, configure_logging
from tests.helpers.daemon import wait_for
from tests.helpers.system import ZooProcess

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (?P<level>[A-Z]+) kz daemon: (?P<message>.*)$")


@pytest.fixture()
def configured():
    """configure_logging on a buffer, taken away again after the test."""
    stream = io.StringIO()
    levels = {name: logging.getLogger(name).level for name in DAEMON_LOGGERS}
    handler = configure_logging(stream)
    try:
        yield handler, stream
    finally:
        for name in DAEMON_LOGGERS:
            logging.getLogger(name).removeHandler(handler)
            logging.getLogger(name).setLevel(levels[name])


def test_a_module_logger_line_has_the_time_the_level_and_the_message(configured):
    handler, stream = configured
    logging.getLogger("kz_daemon.accept.indexer").warning("index.json not written: %s: %s", "OSError", "full")
    logging.getLogger("kz_daemon.ops.service").info("retention: removed %d file(s)", 3)
    logging.getLogger("kz_daemon.ops.service").debug("not shown")
    logging.getLogger("kz_events.log.store").error("from the event store")
    logging.getLogger("dulwich").warning("another library's line")
    lines = stream.getvalue().splitlines()
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    assert [(m["level"], m["message"]) for m in parsed if m] == [
        ("WARNING", "index.json not written: OSError: full"),
        ("INFO", "retention: removed 3 file(s)"),
        ("ERROR", "from the event store")]


def test_configuring_twice_keeps_one_handler(configured):
    handler, stream = configured
    assert configure_logging(io.StringIO()) is handler
    for name in DAEMON_LOGGERS:
        assert logging.getLogger(name).handlers.count(handler) == 1
    logging.getLogger("kz_daemon.intake.admit").warning("once")
    assert stream.getvalue().count("once") == 1


def test_the_daemon_process_logs_a_skipped_inbox_entry_with_time_and_level(tmp_path):
    zoo = ZooProcess(tmp_path / "state")
    zoo.start()
    try:
        (zoo.config.spool_inbox / "not-a-file").mkdir()  # a folder: left alone, said once
        wanted = "spool: left 'not-a-file' in the inbox alone: it is a directory, not a regular file"
        wait_for(lambda: wanted in zoo.log_tail(100_000), timeout=60)
    finally:
        assert zoo.stop() == 0
    lines = [LINE.match(line) for line in zoo.log_tail(100_000).splitlines() if wanted in line]
    assert len(lines) == 1 and lines[0] is not None, zoo.log_tail()
    assert lines[0]["level"] == "WARNING" and lines[0]["message"] == wanted

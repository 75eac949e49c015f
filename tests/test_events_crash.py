"""SIGKILL a process appending to the log, many times: every acknowledged event survives."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest

from kz_events.log.store import Store
from kz_events.read.audit import verify_log

CHILD = textwrap.dedent("""
    import asyncio, sys, uuid
    from kz_events import events as E
    from kz_events.log.store import Store
    store = Store.open(sys.argv[1], segment_bytes=int(sys.argv[2]), snapshot_every=int(sys.argv[3]))
    print("OPEN", store.state.seq, flush=True)

    def batch(i):
        u = str(uuid.uuid4())
        k = f"sm_90/Op{i % 7}/x/fp16/k"
        if i % 3:
            return u, [E.SubmissionReceived(u, k, "crash", "spool", "f.tar.gz", i, "a" * 64)]
        return u, [E.SubmissionReceived(u, k, "crash", "spool", "f.tar.gz", i, "a" * 64),  # one write
                   E.SubmissionValidated(u, k, "sm_90", False, []),
                   E.JobQueued(u, k, "sm_90")]

    async def emitter(c):  # many coroutines at once: they share fsyncs
        i = c
        while True:
            i += 8
            u, events = batch(i)
            seqs = await store.emit_async(*events)
            print("ACK", seqs[-1], u, flush=True)

    async def emitters():
        await asyncio.gather(*[emitter(c) for c in range(8)])

    if sys.argv[4] == "emit":
        i = 0
        while True:
            i += 1
            u, events = batch(i)
            seqs = store.emit(*events)
            print("ACK", seqs[-1], u, flush=True)
    asyncio.run(emitters())
""")


@pytest.mark.slow
@pytest.mark.parametrize("emitters", ["emit", "emit_async"])
def test_sigkill_mid_append_loses_no_acknowledged_event(tmp_path, emitters):
    events_dir = tmp_path / "events"
    rng = random.Random(1234)
    acked: dict[str, int] = {}
    kills = 30
    for round_ in range(kills):
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(events_dir), "20000", "150", emitters],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        opened = proc.stdout.readline()
        assert opened.startswith("OPEN"), proc.stderr.read()
        for _ in range(rng.randrange(1, 40)):
            line = proc.stdout.readline()
            if line.startswith("ACK"):
                _, seq, uuid = line.split()
                acked[uuid] = int(seq)
        os.kill(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        for line in out.splitlines():  # printed before the kill: acknowledged too
            if line.startswith("ACK") and len(line.split()) == 3:
                _, seq, uuid = line.split()
                acked[uuid] = int(seq)
        assert proc.returncode == -signal.SIGKILL
        with Store.open(events_dir) as store:  # reopens cleanly (repairing a torn tail if any)
            state = store.state
            missing = [u for u in acked if u not in state.submissions]
            assert not missing, f"round {round_}: acknowledged events lost: {missing[:3]}"
            assert state.seq >= max(acked.values())
    errors = [f for f in verify_log(events_dir) if f.severity == "error"]
    assert errors == []
    assert len(acked) > kills

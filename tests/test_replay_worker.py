"""kz_events.log.replay_worker: the second process of a long replay vouches only for what it
checked, and the replay carries on alone when the worker goes away."""
from __future__ import annotations

from kz_events.codec import GENESIS, line_hash
from kz_events.log import replay as replay_module, replay_worker
from kz_events.log.replay import replay_dir
from kz_events.log.segments import segment_name
from kz_events.read.workload import build_log


def _state_parts(state):
    return (state.seq, state.submissions, state.queue, state.kernels, state.status_counts)


def test_a_worker_that_dies_midway_leaves_the_replay_to_this_process(tmp_path, monkeypatch):
    events_dir = tmp_path / "events"
    expected = build_log(events_dir, 3000, 14, segment_bytes=100_000)
    monkeypatch.setattr(replay_module, "PIPELINE_MIN_BYTES", 0)
    monkeypatch.setattr(replay_module, "_cpus", lambda: 2)
    monkeypatch.setattr(replay_worker, "_PIPE_BYTES", 4096)  # so it cannot write far ahead
    real_messages = replay_worker.messages
    seen = []

    def killing_messages(stream):
        for i, msg in enumerate(real_messages(stream)):
            seen.append(msg[0])
            if i == 5:
                proc = spawned[-1]
                proc.kill()
                proc.wait()
            yield msg

    spawned = []
    real_spawn = replay_worker.spawn
    monkeypatch.setattr(replay_worker, "spawn", lambda *a: spawned.append(real_spawn(*a)) or spawned[-1])
    monkeypatch.setattr(replay_worker, "messages", killing_messages)
    state = replay_dir(events_dir)
    assert "E" not in seen  # the worker never reached the end: this process did
    assert _state_parts(state) == _state_parts(expected)


def test_the_worker_vouches_only_for_canonical_chained_lines(tmp_path):
    events_dir = tmp_path / "events"
    build_log(events_dir, 300, 15)
    segment = events_dir / segment_name(1)
    lines = segment.read_bytes().split(b"\n")[:-1]
    sent = []
    replay_worker._run(events_dir, [1], 1, 0, 0, GENESIS.encode(), sent.append)
    assert sent[0] == ("S", 1) and sent[1][0] == "V" and sent[1][4] == len(lines)
    assert sent[1][5] == line_hash(lines[-1]).encode()
    sent.clear()  # a wrong starting hash: the group is not vouched for
    replay_worker._run(events_dir, [1], 1, 0, 0, b"1" * 64, sent.append)
    assert sent[1][:5] == ("U", 1, 0, len(b"\n".join(lines)) + 1, len(lines))

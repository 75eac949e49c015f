"""kz_events.read.story: the sentences ``kz events`` prints for each event."""
from __future__ import annotations

from kz_events import events as E
from kz_events.read import story
from kz_events.read.workload import build_log


def test_every_event_class_has_its_own_sentence(tmp_path):
    events_dir = tmp_path / "events"
    build_log(events_dir, 800, 3)
    seen = {}
    for event in story.iter_events(events_dir):
        seen.setdefault(event["type"], event)
    assert {"submission.received", "job.claimed", "accept.completed"} <= set(seen)
    for word, event in seen.items():
        sentence = story.describe(event)
        # the fallback repeats the raw type and payload; a described event never does
        assert not sentence.startswith(word), (word, sentence)


def test_an_unknown_or_malformed_type_falls_back_to_the_raw_event():
    assert story.describe({"type": "job.teleported", "payload": {"a": 1}}) == "job.teleported {'a': 1}"
    assert story.describe({"type": ["x"], "payload": {}}) == "['x'] {}"
    # a known type whose payload lacks a field is shown raw, not raised
    assert story.describe({"type": E.JobQueued.TYPE, "payload": {}}) == "job.queued {}"


def test_the_sentence_is_made_from_the_payload():
    line = {"type": "job.claimed", "payload": {"uuid": "u", "runner_id": "gpu-7", "lease_id": "L9",
                                               "lease_expires_at": 1.0, "attempt": 2}}
    assert story.describe(line) == "claimed by gpu-7 (attempt 2, lease L9)"

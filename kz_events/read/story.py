"""Reading the log for people: one line per event, a submission's full story.

Read-only helpers for ``kz events``: they take no lock, so they work beside a
running daemon (a line being written is not shown until it is complete).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

from kz_events import events as E
from kz_events.codec import parse_json
from kz_events.log.segments import list_segments, segment_name

__all__ = ["describe", "follow_events", "format_event", "iter_events", "render_story",
           "submission_events", "tail_events"]


def _short(sha: Any) -> str:
    return str(sha)[:12] if sha else "-"


#: one sentence per event class, from the payload.
_DESCRIBE: dict[type[E.Event], Callable[[dict], str]] = {
    E.SubmissionReceived: lambda p: (f"received {p['filename']} ({p['size']} bytes, "
                                     f"sha256 {_short(p['sha256'])}) from {p['submitter_id']} "
                                     f"via {p['source']}"),
    E.SubmissionValidated: lambda p: (f"validated: arch {p['arch']}"
                                      + (", new kernel" if p["new_kernel"] else "")
                                      + (f", warnings {', '.join(p['warnings'])}"
                                         if p["warnings"] else "")),
    E.SubmissionRejected: lambda p: f"rejected at {p['stage']}: {p['code']}: {p['message']}",
    E.JobQueued: lambda p: f"queued for a {p['arch']} runner",
    E.JobClaimed: lambda p: (f"claimed by {p['runner_id']} (attempt {p['attempt']}, "
                             f"lease {p['lease_id']})"),
    E.JobLeaseRenewed: lambda p: f"lease {p['lease_id']} renewed by {p['runner_id']}",
    E.JobLeaseExpired: lambda p: (f"lease {p['lease_id']} of {p['runner_id']} expired "
                                  f"(attempt {p['attempt']}); back in the queue"),
    E.JobReleased: lambda p: (f"released by {p['runner_id']}: {p['reason']}; back in the queue"),
    E.JobCancelled: lambda p: f"cancelled by {p['by']}: {p['reason']}",
    E.JobFailed: lambda p: f"failed: {p['code']}: {p['message']}",
    E.ResultReported: lambda p: (f"result from {p['runner_id']}: "
                                 f"{'accept' if p['overall_accept'] else 'no accept'}, "
                                 f"build {'ok' if p['build_ok'] else 'FAILED'}, "
                                 f"{len(p['cases'])} cases"),
    E.AcceptStarted: lambda p: f"accept saga started on {_short(p['base_head'])}",
    E.AcceptSourceCommitted: lambda p: f"source commit {_short(p['sha_src'])}",
    E.AcceptScorecardCommitted: lambda p: f"scorecard commit {_short(p['sha_br'])}",
    E.AcceptCompleted: lambda p: (f"accepted: source {_short(p['sha_src'])}, "
                                  f"branch {_short(p['sha_br'])}"),
    E.AcceptRolledBack: lambda p: f"accept saga rolled back: {p['reason']}",
    E.IndexUpdated: lambda p: (f"index v{p['version']} at {_short(p['head'])} "
                               f"({p['kernels']} kernels)"),
    E.MirrorPushed: lambda p: (f"mirror {p['remote']} {'<-' if p['ok'] else 'FAILED'} "
                               f"{_short(p['sha'])}" + (f": {p['error']}" if p["error"] else "")),
    E.DaemonStarted: lambda p: f"daemon {p['version']} started (pid {p['pid']})",
    E.LogRepaired: lambda p: (f"log repaired: {p['dropped_bytes']} torn bytes moved to "
                              f"{p['quarantine_file']}"),
    E.SpoolSkipped: lambda p: f"spool: left {p['name']!r} in the inbox alone ({p['reason']})",
    E.HarnessReviewed: lambda p: (f"harness {_short(p['harness_hash'])} of {p['kernel_id']} "
                                  f"{'approved' if p['decision'] == 'approve' else 'approval revoked'} by {p['by']}"
                                  + (f": {p['reason']}" if p["reason"] else "")),
    E.JobConfirmationRequested: lambda p: (f"confirmation run requested ({p['reason']}); "
                                           f"back in the queue, not for {p['runner_id']} at first"),
    E.SubmissionRevoked: lambda p: f"revoked by {p['by']}: {p['reason']}",
    E.RevokeCommitted: lambda p: (f"revocation commit {_short(p['sha'])}"
                                  + ("" if p["best_changed"] else " (best unchanged)")),
    E.RerunRequested: lambda p: (f"rerun {p['rerun_id'][:8]} requested by {p['by']} for a {p['arch']} runner"
                                 + (f" ({p['runner']} only)" if p["runner"] else "")),
    E.RerunClaimed: lambda p: (f"rerun {p['rerun_id'][:8]} claimed by {p['runner_id']} "
                               f"(attempt {p['attempt']}, lease {p['lease_id']})"),
    E.RerunLeaseRenewed: lambda p: f"rerun {p['rerun_id'][:8]}: lease {p['lease_id']} renewed by {p['runner_id']}",
    E.RerunReleased: lambda p: (f"rerun {p['rerun_id'][:8]}: lease of {p['runner_id']} "
                                f"{'expired' if p['expired'] else 'given back'} ({p['reason']}); back in the queue"),
    E.RerunReported: lambda p: (f"rerun {p['rerun_id'][:8]} done on {p['runner_id']}: "
                                + (f"{p['overall']['delta_pct']:+.1f} % against the record"
                                   if isinstance(p["overall"].get("delta_pct"), (int, float)) else "no comparable case")),
    E.RerunFailed: lambda p: f"rerun {p['rerun_id'][:8]} failed: {p['code']}: {p['message']}",
    E.RerunCancelled: lambda p: (f"rerun {p['rerun_id'][:8]} cancelled by {p['by']}"
                                 + (f": {p['reason']}" if p["reason"] else "")),
}


def describe(event: dict) -> str:
    """One human sentence for an event dict (a parsed log line)."""
    word = event.get("type")
    cls = E.EVENT_TYPES.get(word) if isinstance(word, str) else None
    fn = _DESCRIBE.get(cls) if cls is not None else None
    try:
        return fn(event["payload"]) if fn else f"{event.get('type')} {event.get('payload')}"
    except (KeyError, TypeError):
        return f"{event.get('type')} {event.get('payload')}"


def format_event(event: dict) -> str:
    """``seq ts type subject: description`` on one line."""
    subject = event.get("subject") or {}
    who = subject.get("submission", "")
    kid = subject.get("kernel_id", "")
    about = " ".join(x for x in (who[:8] if who else "", kid) if x)
    return (f"{event.get('seq', '?'):>8} {event.get('ts', '?')} {event.get('type', '?'):<26} "
            f"{about + ': ' if about else ''}{describe(event)}")


def _segment_lines(events_dir: Path, first: int, last_segment: bool) -> list[bytes]:
    data = (events_dir / segment_name(first)).read_bytes()
    if last_segment:
        data = data[:data.rfind(b"\n") + 1]
    lines = data.split(b"\n")
    lines.pop()
    return lines


def iter_events(events_dir: Path | str, *, contains: bytes | None = None,
                after_seq: int = 0) -> Iterator[dict]:
    """Parsed events of the log in order (read-only); ``contains`` pre-filters raw lines."""
    events_dir = Path(events_dir)
    segments = list_segments(events_dir)
    for i, first in enumerate(segments):
        if i + 1 < len(segments) and segments[i + 1] <= after_seq + 1:
            continue
        for line in _segment_lines(events_dir, first, i == len(segments) - 1):
            if contains is not None and contains not in line:
                continue
            event = parse_json(line.decode("utf-8"))
            if event.get("seq", 0) > after_seq:
                yield event


def follow_events(events_dir: Path | str, after_seq: int, *, poll_s: float = 0.5,
                  sleep: Callable[[float], None] = time.sleep) -> Iterator[dict]:
    """Events after ``after_seq`` as they are appended, forever (read-only).

    Remembers the byte offset it has read up to, so each poll reads only new
    bytes (a large log costs nothing per poll); follows the writer into new
    segments; a line being written is shown once its newline is there.
    """
    events_dir = Path(events_dir)
    segment, offset = None, 0
    while True:
        segments = list_segments(events_dir)
        if segment is None:  # start in the segment holding after_seq + 1
            candidates = [s for s in segments if s <= after_seq + 1]
            segment = candidates[-1] if candidates else (segments[0] if segments else None)
        if segment is not None:
            offset = yield from _new_events(events_dir, segment, offset, after_seq)
            later = [s for s in segments if s > segment]
            if later:  # the writer moved on; it starts a segment only after finishing the
                segment, offset = later[0], 0  # last, so the read above took all of that one
                continue
        sleep(poll_s)


def _new_events(events_dir: Path, segment: int, offset: int, after_seq: int) -> Generator[dict, None, int]:
    """Complete lines of ``segment`` from ``offset`` with seq > after_seq; returns the new offset."""
    try:
        with open(events_dir / segment_name(segment), "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset
    end = data.rfind(b"\n") + 1
    for line in data[:end].split(b"\n")[:-1]:
        event = parse_json(line.decode("utf-8"))
        if event.get("seq", 0) > after_seq:
            yield event
    return offset + end


def tail_events(events_dir: Path | str, n: int) -> list[dict]:
    """The last ``n`` events of the log."""
    events_dir = Path(events_dir)
    segments = list_segments(events_dir)
    lines: list[bytes] = []
    for i in range(len(segments) - 1, -1, -1):
        lines = _segment_lines(events_dir, segments[i], i == len(segments) - 1) + lines
        if len(lines) >= n:
            break
    return [parse_json(line.decode("utf-8")) for line in (lines[-n:] if n > 0 else [])]


def submission_events(events_dir: Path | str, uuid: str) -> list[dict]:
    """Every event whose subject is submission ``uuid``, in order."""
    return [e for e in iter_events(events_dir, contains=uuid.encode())
            if (e.get("subject") or {}).get("submission") == uuid]


def render_story(uuid: str, events: list[dict], submission: Any | None) -> str:
    """The human-readable story of a submission: a header, then one line per event."""
    if not events:
        return f"no events for submission {uuid}"
    first = events[0]["payload"]
    lines = [f"submission {uuid}",
             f"  kernel     {first.get('kernel_id', '?')}",
             f"  submitter  {first.get('submitter_id', '?')} via {first.get('source', '?')}"]
    if submission is not None:
        lines.append(f"  status     {submission.status} (attempts {submission.attempts})")
        if submission.sha_src:
            lines.append(f"  commit     {submission.sha_src} (scorecard {submission.sha_br})")
        for reason in submission.reasons:
            lines.append(f"  reason     {reason.get('code')}: {reason.get('message')}")
    lines.append("  events:")
    for e in events:
        lines.append(f"    {e['seq']:>8} {e['ts']} {describe(e)}")
    return "\n".join(lines)

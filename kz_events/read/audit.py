"""The audit of an event log: every line checked, every problem a LogFinding with its seq.

``verify_log(events_dir)`` reads all segments (read-only, no lock: it can run
beside the daemon) and checks, for every line: it is JSON, canonical, a valid
event of a known type and version; its seq follows; its ``prev`` is the sha256
of the line before; the reducer accepts it. It never stops at the first
problem and never repairs anything.

Which seq a finding names: a line that was edited in place is named by its own
seq (its position in the log), even when the damage shows up as a broken link
on the next line: an edit of line k's content breaks only link k+1, while an edit
of line k's ``prev`` breaks links k and k+1. A deleted line is named by the
missing seq; unreadable bytes by the first seq they displaced.

Anchors. The hash chain shows an edit inside the log, but not a log rewritten
from some seq on with a fresh chain. For that, the chain head at some moment,
``Store.chain_head()`` = (seq, sha256 hex of line seq's bytes), is kept somewhere
the log's writer does not rewrite (the daemon writes it into its git commit
messages). ``check_anchors(events_dir, [(seq, head), ...])`` then reads the log
(read-only) and returns a LogFinding for each anchor the log no longer matches:
``ANCHOR_MISSING`` (the log ends before that seq) or ``ANCHOR_MISMATCH`` (the
line at that seq hashes differently, or is not the event of that seq). An empty
list means every anchor holds. Seq 0 anchors the empty log (64 zeros).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kz_events.codec import GENESIS, DecodeError, canonical_bytes, decode_dict, parse_json
from kz_events.log.segments import list_segments, segment_name
from kz_events.reducer import ReducerError, handler_for
from kz_events.state import State

__all__ = ["LogFinding", "verify_log", "iter_lines", "check_anchors"]


@dataclass(frozen=True, slots=True)
class LogFinding:
    """One problem in the log."""

    code: str        # BAD_JSON, BAD_SEQ, MISSING_SEQ, CHAIN_BROKEN, NOT_CANONICAL, BAD_EVENT,
                     # REFUSED, SEGMENT_NAME, SEGMENT_END, TORN_TAIL; check_anchors:
                     # ANCHOR_MISSING, ANCHOR_MISMATCH
    seq: int         # the seq of the damaged (or missing) event
    segment: str     # segment file name
    offset: int      # byte offset of the line in the segment
    message: str
    severity: str = "error"   # "warning" for a torn tail (the next open repairs it)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    def __str__(self) -> str:
        return f"seq {self.seq} [{self.code}] {self.segment}@{self.offset}: {self.message}"


def iter_lines(events_dir: Path) -> Iterator[tuple[int, str, int, bytes, bool]]:
    """Yield (segment first seq, segment name, offset, line bytes, terminated) for every line."""
    for first in list_segments(events_dir):
        name = segment_name(first)
        data = (events_dir / name).read_bytes()
        pos = 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            if end < 0:
                yield first, name, pos, data[pos:], False
                break
            yield first, name, pos, data[pos:end], True
            pos = end + 1


class _Auditor:
    def __init__(self) -> None:
        self.findings: list[LogFinding] = []
        self.last_pos = 0             # position seq of the last readable line
        self.last_hash = GENESIS
        self.last_where = ("", 0)
        self.bad: list[tuple[str, int]] = []
        self.pending: tuple[int, str, int] | None = None  # (seq, segment, offset) of a broken link
        self.state = State()
        self.lines = 0

    def add(self, code: str, seq: int, where: tuple[str, int], message: str,
            severity: str = "error") -> None:
        """Record a finding."""
        self.findings.append(LogFinding(code, seq, where[0], where[1], message, severity))

    def resolve_pending(self, next_link_broken: bool) -> None:
        """Name the edited line of a broken link, now that the next link is known."""
        if self.pending is None:
            return
        seq, segment, offset = self.pending
        self.pending = None
        if next_link_broken:
            self.add("CHAIN_BROKEN", seq, (segment, offset),
                     "the line was edited: its prev does not link to the line before "
                     "and the next line does not link to it")
        else:
            self.add("CHAIN_BROKEN", seq - 1, self.prev_where,
                     f"the line was edited: seq {seq} no longer links to it")

    def line(self, first: int, name: str, offset: int, raw: bytes, terminated: bool,
             is_last_segment: bool, at_end: bool) -> None:
        """Check one line (``raw`` without its newline)."""
        where = (name, offset)
        if not terminated and is_last_segment and at_end:
            self.add("TORN_TAIL", self.last_pos + 1, where,
                     f"{len(raw)} bytes without a newline at the end of the log "
                     "(never acknowledged; the next open moves them to quarantine)", "warning")
            return
        self.lines += 1
        if not terminated:
            self.add("SEGMENT_END", self.last_pos + 1, where,
                     "segment does not end with a newline although a later segment exists")
        try:
            d = parse_json(raw.decode("utf-8"))
            if type(d) is not dict:
                raise ValueError("not an object")
        except ValueError:
            self.bad.append(where)
            return
        exp = self.last_pos + 1
        s, prev = d.get("seq"), d.get("prev")
        link_ok = prev == self.last_hash
        if self.bad:
            self.add("BAD_JSON", exp, self.bad[0],
                     f"{len(self.bad)} unreadable line(s) after seq {self.last_pos}")
            self.bad = []
            if self.pending is not None:
                self.resolve_pending(False)
            pos = s if type(s) is int and s > self.last_pos else exp
        elif type(s) is int and s < exp:
            # a line that does not advance the log (inserted, duplicated, or its seq
            # edited downwards): report it and read on as if it were not there
            self.add("BAD_SEQ", exp, where,
                     f"expected seq {exp}, found {s} (an inserted or edited line)")
            return
        else:
            if self.pending is not None:
                self.resolve_pending(not link_ok)
                link_ok = True  # explained by the pending edit
            if s == exp:
                pos = exp
            elif type(s) is int and s > exp and not link_ok:
                self.add("MISSING_SEQ", exp, where,
                         f"seq {exp}..{s - 1} missing (lines deleted) before seq {s}")
                pos, link_ok = s, True
            else:
                self.add("BAD_SEQ", exp, where, f"expected seq {exp}, found {s!r}")
                pos = exp
            if not link_ok:
                if exp == 1:
                    self.add("CHAIN_BROKEN", 1, where, "prev of the first event is not 64 zeros")
                else:
                    self.pending = (pos, name, offset)
        if offset == 0 and pos != first:
            self.add("SEGMENT_NAME", pos, where, f"segment {name} starts with seq {pos}")
        if canonical_bytes(d) != raw:
            self.add("NOT_CANONICAL", pos, where, "the line is not in canonical form")
        try:
            env = decode_dict(d)
        except DecodeError as exc:
            self.add("BAD_EVENT", pos, where, str(exc))
        else:
            try:
                handler_for(env.type)(self.state, pos, env.ts, env.payload)
            except ReducerError as exc:
                self.add("REFUSED", pos, where, f"the reducer refuses it: {exc}")
            except (KeyError, TypeError, AttributeError, ValueError) as exc:
                self.add("REFUSED", pos, where, f"the reducer fails on it: {exc!r}")
            self.state.seq = pos
        self.prev_where = where
        self.last_pos = pos
        self.last_hash = hashlib.sha256(raw).hexdigest()

    def finish(self) -> None:
        """Report what is still open at the end of the log."""
        if self.bad:
            self.add("BAD_JSON", self.last_pos + 1, self.bad[0],
                     f"{len(self.bad)} unreadable line(s) at the end of the log")
        if self.pending is not None:
            seq = self.pending[0]
            self.pending = None
            self.add("CHAIN_BROKEN", seq - 1, self.prev_where,
                     f"seq {seq} does not link to the line before (that line was edited, "
                     f"or the prev of seq {seq})")


def verify_log(events_dir: Path | str) -> list[LogFinding]:
    """Check every line of the log in ``events_dir``; findings sorted by seq (empty: intact)."""
    events_dir = Path(events_dir)
    auditor = _Auditor()
    auditor.prev_where = ("", 0)
    segments = list_segments(events_dir) if events_dir.is_dir() else []
    last_segment = segments[-1] if segments else None
    for first, name, offset, raw, terminated in iter_lines(events_dir):
        auditor.line(first, name, offset, raw, terminated, first == last_segment,
                     not terminated)
    auditor.finish()
    return sorted(auditor.findings, key=lambda f: (f.seq, f.segment, f.offset))


def check_anchors(events_dir: Path | str, anchors: Iterable[tuple[int, str]]) -> list[LogFinding]:
    """Findings for the (seq, chain head) pairs the log in ``events_dir`` no longer matches.

    A pair holds when the line at ``seq`` (counted from its segment's first seq) is
    the event of that seq and its sha256 is ``head``; (0, 64 zeros) always holds.
    Each segment is read once, however many anchors fall in it; a torn last line
    (never acknowledged) is not counted. Findings come in the anchors' seq order.
    """
    events_dir = Path(events_dir)
    segments = list_segments(events_dir) if events_dir.is_dir() else []
    wanted = sorted(set(anchors))
    findings: list[LogFinding] = []
    cached: tuple[int, list[bytes]] | None = None
    for seq, head in wanted:
        if seq <= 0:
            if seq < 0 or head != GENESIS:
                findings.append(LogFinding("ANCHOR_MISMATCH", seq, "", 0,
                                        f"anchor ({seq}, {head}) is not the empty log's"))
            continue
        first = next((s for s in reversed(segments) if s <= seq), None)
        if first is None:
            findings.append(LogFinding("ANCHOR_MISSING", seq, "", 0,
                                    f"the log has no segment holding seq {seq}"))
            continue
        if cached is None or cached[0] != first:
            data = (events_dir / segment_name(first)).read_bytes()
            cached = (first, data[:data.rfind(b"\n") + 1].split(b"\n")[:-1])
        lines = cached[1]
        index = seq - first
        name = segment_name(first)
        if index >= len(lines):
            last = first + len(lines) - 1
            findings.append(LogFinding("ANCHOR_MISSING", seq, name, 0,
                                    f"the log ends at seq {last}, before the anchor's seq {seq}"))
            continue
        line = lines[index]
        actual = hashlib.sha256(line).hexdigest()
        try:
            line_seq = parse_json(line.decode("utf-8")).get("seq")
        except (ValueError, AttributeError):
            line_seq = None
        if actual != head or line_seq != seq:
            offset = sum(len(x) + 1 for x in lines[:index])  # only for a finding: O(lines)
            findings.append(LogFinding("ANCHOR_MISMATCH", seq, name, offset,
                                    f"the line at seq {seq} hashes to {actual} (seq field "
                                    f"{line_seq!r}), the anchor says {head}"))
    return findings

"""The second process of a large replay: it reads the log, cuts and chain-checks the lines.

Replay of a long log (``kz replay``, a daemon start without a usable snapshot)
spends about half its time on work that does not need the State: reading the
segments, cutting each line into its header fields and payload, hashing every
line and checking the hash chain and the seqs. ``kz_events.log.replay`` hands that
half to this worker (``python -m kz_events.log.replay_worker``), which streams one
message per group of lines while the parent parses the payloads and folds
them, so the two halves run on two cores at once.

The worker only ever *vouches* for a group; the parent stays the judge. A
message is one of::

    ("S", segment)                                  # entering a segment (empty ones too)
    ("V", segment, start, end, n, last_hash, last_len, payloads, tss, kinds)
        # n lines at byte offsets [start, end): in the writer's canonical shape, seqs
        # following on, each ``prev`` the sha256 of the line before; payloads is the
        # JSON array text of their payloads, tss their timestamps joined by spaces,
        # kinds their ends (``,"type":"…","v":N}``) joined by newlines
    ("U", segment, start, end, n)                   # lines it could not vouch for
    ("X", reason)                                   # it stopped (e.g. a torn segment)
    ("E",)                                          # the end of the log

For a ``U`` group, a ``V`` group the parent cannot take as it is, an ``X`` or a
worker that dies, the parent reads those bytes itself and runs the in-process
path, which names any damage by seq and byte offset exactly as a replay
without the worker does. Each message is framed as a 4-byte little-endian
length and ``marshal`` bytes.
"""
from __future__ import annotations

import fcntl
import gc
import hashlib
import marshal
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from kz_events.log.segments import EventLog

__all__ = ["check_chain", "cut_group", "main", "messages", "payload_array", "read_group", "spawn", "stop"]

_HEAD = b'{"payload":'
_PREV = b',"prev":"'
_SEQ = b'","seq":'
_TS = b',"ts":"'
_TYPE = b',"type":"'
_PIPE_BYTES = 1 << 20  # a deep pipe lets the worker run ahead of the parent's folds


def cut_group(group: list[bytes]) -> tuple | None:
    """Header fields of a group of lines in the writer's canonical shape, else None.

    The shape is ``{"payload":{...},"prev":"<64 hex>","seq":N,"subject":{...},
    "ts":"<27 chars>","type":"…","v":N}`` (sorted keys, no spaces). Returns
    ``(prevs, seqs, tss, kinds, cuts)`` as tuples of bytes, one per line (a kind is
    the line's end from ``,"type":"``; ``cuts`` the offset of ``,"prev":"``, where
    the payload ends). Whether the payloads are JSON is for the caller to find out.
    """
    cuts = [line.rfind(_PREV) if line.startswith(_HEAD) else -1 for line in group]
    tcuts = [line.rfind(_TYPE, c) for line, c in zip(group, cuts)]
    if not all([c > 0 and line[c + 73:c + 81] == _SEQ and line[t - 35:t - 28] == _TS  # noqa: C419 (a list is faster)
                for line, c, t in zip(group, cuts, tcuts)]):
        return None
    return (
        tuple([line[c + 9:c + 73] for line, c in zip(group, cuts)]),
        tuple([line[c + 81:line.find(b",", c + 81)] for line, c in zip(group, cuts)]),
        tuple([line[t - 28:t - 1] for line, t in zip(group, tcuts)]),
        tuple([line[t:] for line, t in zip(group, tcuts)]),
        cuts,
    )


def payload_array(group: list[bytes], cuts: list[int]) -> bytes:
    """The JSON array text of a cut group's payloads (each runs from byte 11 to its cut)."""
    return b"[" + b",".join([line[11:c] for line, c in zip(group, cuts)]) + b"]"


def check_chain(fields: tuple, group: list[bytes], seq: int, h: bytes) -> list[bytes] | None:
    """The lines' sha256 digests if their prevs chain on from ``h`` and their seqs from ``seq``."""
    sha = hashlib.sha256
    prevs, seqs = fields[0], fields[1]
    # the chain, checked in one comparison: binary digests of lines 1..n-1
    # against the prev fields of lines 2..n (the first prev against h)
    digests = [sha(line).digest() for line in group]
    joined = b"".join(prevs)
    try:  # lower case only, as the writer writes them (else the caller's slow path decides)
        prev_blob = bytes.fromhex(joined.decode("ascii")) if joined.islower() else b""
    except ValueError:
        prev_blob = b""
    try:
        numbers = list(map(int, seqs))
    except ValueError:
        return None
    if (prevs[0] == h and prev_blob[32:] == b"".join(digests[:-1])
            and numbers == list(range(seq + 1, seq + len(group) + 1))):
        return digests
    return None


def read_group(path: Path, start: int, end: int) -> list[bytes]:
    """The whole lines (without newlines) at byte offsets [start, end) of a segment."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    lines = data.split(b"\n")
    if lines[-1] or len(data) != end - start:
        raise OSError(f"{path}: the bytes at [{start}, {end}) changed while replaying")
    lines.pop()
    return lines


# --- the parent's side ------------------------------------------------------------


def spawn(events_dir: Path, segments: list[int], segment: int, offset: int, seq: int,
          h: str) -> subprocess.Popen | None:
    """Start a worker reading from (segment, offset) after ``seq`` with hash ``h``; None if it cannot."""
    if not sys.executable:
        return None
    root = str(Path(__file__).resolve().parent.parent)  # so the child imports this same kz_events
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    args = [sys.executable, "-m", "kz_events.log.replay_worker", str(events_dir),
            ",".join(map(str, segments)), str(segment), str(offset), str(seq), h]
    try:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=env, bufsize=_PIPE_BYTES)
    except OSError:
        return None
    if proc.stdout is not None:  # always: stdout=PIPE
        _deepen_pipe(proc.stdout.fileno())
    return proc


def messages(stream) -> Iterator[tuple]:
    """The worker's messages, in order, until its stream ends (a torn frame ends it too)."""
    read = stream.read
    while True:
        head = read(4)
        if len(head) < 4:
            return
        size = int.from_bytes(head, "little")
        body = read(size)
        if len(body) < size:
            return
        try:
            msg = marshal.loads(body)
        except (ValueError, EOFError, TypeError):
            return
        if type(msg) is not tuple or not msg:
            return
        yield msg


def stop(proc: subprocess.Popen) -> None:
    """End a worker (it may still be writing) and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _deepen_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_BYTES)
    except OSError:
        pass  # a shallow pipe only costs more switches between the two processes


# --- the worker's side ------------------------------------------------------------


def _vouch(group: list[bytes], seq: int, h: bytes) -> tuple[tuple | None, bytes]:
    """(the V message's fields after n, or None) and the hash of the group's last line."""
    fields = cut_group(group)
    digests = check_chain(fields, group, seq, h) if fields is not None else None
    if fields is None or digests is None:
        return None, hashlib.sha256(group[-1]).hexdigest().encode()
    last = digests[-1].hex().encode()
    return (last, len(group[-1]), payload_array(group, fields[4]), b" ".join(fields[2]),
            b"\n".join(fields[3])), last


def _run(events_dir: Path, segments: list[int], segment: int, offset: int, seq: int,
         h: bytes, send) -> None:
    log = EventLog(events_dir, None, segments, None, 0, False, readonly=False)
    for first in segments:
        if first < segment:
            continue
        send(("S", first))
        pos = offset if first == segment else 0
        for group in log.iter_lines(first, pos):
            n = len(group)
            end = pos + sum(map(len, group)) + n
            vouched, h = _vouch(group, seq, h)
            if vouched is None:
                send(("U", first, pos, end, n))
            else:
                send(("V", first, pos, end, n) + vouched)
            seq += n
            pos = end


def main(argv: list[str] | None = None) -> int:
    """``python -m kz_events.log.replay_worker DIR SEGMENTS SEGMENT OFFSET SEQ HASH`` (see above)."""
    gc.disable()  # many short-lived bytes objects and no cycles: collections would only cost
    argv = sys.argv[1:] if argv is None else argv
    out = sys.stdout.buffer
    dumps = marshal.dumps

    def send(msg: tuple) -> None:
        body = dumps(msg)
        out.write(len(body).to_bytes(4, "little"))
        out.write(body)

    try:
        events_dir, segments, segment, offset, seq, h = argv
        _run(Path(events_dir), [int(s) for s in segments.split(",") if s], int(segment),
             int(offset), int(seq), h.encode(), send)
        send(("E",))
    except BrokenPipeError:
        return 1  # the parent stopped reading: nothing more to do
    except Exception as exc:  # noqa: BLE001 - the parent carries on without us and judges
        send(("X", f"{type(exc).__name__}: {exc}"))
    try:
        out.flush()
    except BrokenPipeError:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

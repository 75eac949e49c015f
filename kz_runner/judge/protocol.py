"""Judge <-> worker messages: length-prefixed JSON over a socketpair (AF_UNIX, SOCK_SEQPACKET).

Frame: 4-byte big-endian length, then that many bytes of UTF-8 JSON encoding one
object with a string ``op``; one frame per record, the length checked against
it. No pickle anywhere: the judge parses what the worker sends with
:func:`json.loads` (NaN/Infinity refused, size capped at :data:`MAX_MESSAGE`)
and validates every field before use.

Judge -> worker::

    {"op": "layout", "arrays": [{"name", "offset", "dtype", "shape"}, ...],  # views over the arena
     "arena": {"size": int, "fd": true} | {"size": int, "name": str},       # fd: memfd follows, below
     "out_mode": "return"|"out_kw"|"out_pos"}                                # how calls deliver outputs
    {"op": "load", "module", "function", "src_dir"}                          # import the kernel
    {"op": "batch", "fn": "noop"|"kernel",
     "call_ids": [int, ...],                       # one per call, in call order
     "args": [[ref, ...], ...],                    # per call; ref = "array name" | {"v": json scalar}
     "outs": [[name, ...], ...]}                   # per call: that call's own output slot(s)
    {"op": "exit"}

With ``"fd": true`` the layout frame is followed by one carrier byte holding the
arena's memfd as SCM_RIGHTS ancillary data (:func:`send_fd`), so one worker can be
given a new arena without being respawned.

Worker -> judge::

    {"op": "ready", "pid": int}                    # once, at start (before anything untrusted ran)
    {"op": "ok"}                                   # layout / load done
    {"op": "done", "call_ids": [...], "times_ns": [int, ...]}
    {"op": "error", "code": str, "message": str, "call_id": int|null}

``out_mode`` is how a call delivers its output: ``"return"`` (the function
returns the array, or a tuple of arrays; the worker copies it into the slot,
outside the timed interval), ``"out_kw"`` (``fn(*args, out=slot)``) or
``"out_pos"`` (``fn(*args, slot)``). Worker error codes: ``LOAD_FAILED``,
``CALL_FAILED``, ``BAD_OUTPUT`` (returned shape/dtype differs from the slot),
``BAD_REQUEST``.

No seed, no per-call seed and no reference value ever appears in a message.
"""
from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

HEADER = struct.Struct(">I")
MAX_MESSAGE = 192 << 10  # bytes: one record; a batch of 1024 calls takes ~60 KiB
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # 35 on x86 and arm (asm-generic)

OUT_MODES = ("return", "out_kw", "out_pos")
WORKER_ERROR_CODES = ("LOAD_FAILED", "CALL_FAILED", "BAD_OUTPUT", "BAD_REQUEST")


class JudgeProtocolError(Exception):
    """A malformed frame or message (from the worker: hostile or broken)."""


class ChannelClosed(Exception):
    """The peer closed the socket (or it broke) before a whole message arrived."""


class ChannelTimeout(Exception):
    """No whole message before the deadline."""


def _no_constants(name: str) -> Any:
    raise JudgeProtocolError(f"non-finite JSON constant {name}")


def encode(msg: dict[str, Any]) -> bytes:
    """One frame for ``msg`` (a dict with a string ``op``)."""
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise JudgeProtocolError("a message is a dict with a string 'op'")
    body = json.dumps(msg, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(body) > MAX_MESSAGE:
        raise JudgeProtocolError(f"message of {len(body)} bytes is over {MAX_MESSAGE}")
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> dict[str, Any]:
    """The message in one frame's body; :class:`JudgeProtocolError` unless it is a dict with a string ``op``."""
    try:
        msg = json.loads(body.decode("utf-8"), parse_constant=_no_constants)
    except JudgeProtocolError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise JudgeProtocolError(f"undecodable message: {type(exc).__name__}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise JudgeProtocolError("a message is a JSON object with a string 'op'")
    return msg


def channel_pair() -> tuple[socket.socket, socket.socket]:
    """The judge's end and the worker's end: AF_UNIX SOCK_SEQPACKET, one frame per record.

    Records keep frames whole, and (unlike a stream) carry the kernel's receive
    timestamp, taken when the sender queued the record: the judge's clock stops
    when the reply was sent, not when the judge was next scheduled.
    """
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * (MAX_MESSAGE + HEADER.size))
        except OSError:
            pass
    return a, b


def enable_timestamps(sock: socket.socket) -> bool:
    """Ask the kernel for a receive timestamp (CLOCK_REALTIME, ns) on every record read from ``sock``."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return True
    except OSError:
        return False


def enable_credentials(sock: socket.socket) -> bool:
    """Ask the kernel to attach the sender's credentials to every record read from ``sock``
    (SO_PASSCRED): the sender's pid as this process's pid namespace numbers it, which no sender
    can forge. Set before the peer sends."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        return True
    except (OSError, AttributeError):
        return False


def recv_ready(sock: socket.socket, deadline: float | None) -> tuple[dict[str, Any], int | None]:
    """The worker's first message and the pid the kernel gives its sender (None without credentials).

    The credentials are switched off again afterwards: only the first record, sent before
    any submitted code ran, names the worker.
    """
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ChannelTimeout("no reply before the deadline")
        sock.settimeout(left)
    try:
        data, anc, flags, _ = sock.recvmsg(MAX_MESSAGE + HEADER.size + 1,
                                           socket.CMSG_SPACE(16) + socket.CMSG_SPACE(struct.calcsize("3i")))
    except TimeoutError:
        raise ChannelTimeout("no reply before the deadline") from None
    except OSError as exc:
        raise ChannelClosed(f"socket error: {exc}") from None
    finally:
        sock.settimeout(None)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 0)
        except (OSError, AttributeError):
            pass
    if not data:
        raise ChannelClosed("peer closed the channel")
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(data) < HEADER.size:
        raise JudgeProtocolError("truncated or oversized record")
    (length,) = HEADER.unpack_from(data)
    if length != len(data) - HEADER.size:
        raise JudgeProtocolError(f"frame header says {length} bytes, the record holds {len(data) - HEADER.size}")
    pid = None
    for level, kind, value in anc:
        if level == socket.SOL_SOCKET and kind == getattr(socket, "SCM_CREDENTIALS", -1) and len(value) >= 12:
            pid = struct.unpack_from("3i", value)[0] or None
    return decode(data[HEADER.size:]), pid


def send(sock: socket.socket, msg: dict[str, Any]) -> bytes:
    """Send one message (one record); returns the frame sent (the judge may keep a transcript)."""
    frame = encode(msg)
    sock.sendall(frame)
    return frame


def recv_stamped(sock: socket.socket, deadline: float | None = None) -> tuple[dict[str, Any], int | None]:
    """One message and the kernel's timestamp of it (realtime ns; None without :func:`enable_timestamps`).

    ``deadline`` is a :func:`time.monotonic` value (None: wait forever).
    """
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ChannelTimeout("no reply before the deadline")
        sock.settimeout(left)
    else:
        sock.settimeout(None)
    try:
        data, anc, flags, _ = sock.recvmsg(MAX_MESSAGE + HEADER.size + 1, socket.CMSG_SPACE(16))
    except TimeoutError:
        raise ChannelTimeout("no reply before the deadline") from None
    except OSError as exc:
        raise ChannelClosed(f"socket error: {exc}") from None
    if not data:
        raise ChannelClosed("peer closed the channel")
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(data) < HEADER.size:
        raise JudgeProtocolError("truncated or oversized record")
    (length,) = HEADER.unpack_from(data)
    if length != len(data) - HEADER.size or length > MAX_MESSAGE:
        raise JudgeProtocolError(f"frame header says {length} bytes, the record holds {len(data) - HEADER.size}")
    stamp = None
    for level, kind, value in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(value) >= 16:
            sec, nsec = struct.unpack_from("qq", value)
            stamp = sec * 1_000_000_000 + nsec
    return decode(data[HEADER.size:]), stamp


def recv(sock: socket.socket, deadline: float | None = None) -> dict[str, Any]:
    """Receive one message; ``deadline`` is a :func:`time.monotonic` value (None: wait forever)."""
    return recv_stamped(sock, deadline)[0]


# -- constructors (judge side) -------------------------------------------------------

def send_fd(sock: socket.socket, fd: int) -> None:
    """One carrier byte with ``fd`` attached (SCM_RIGHTS); the peer takes it with ``socket.recv_fds(sock, 1, 1)``."""
    socket.send_fds(sock, [b"F"], [fd])


def layout(arrays: list[dict[str, Any]], out_mode: str, arena: dict[str, Any]) -> dict[str, Any]:
    if out_mode not in OUT_MODES:
        raise ValueError(f"out_mode must be one of {OUT_MODES}")
    return {"op": "layout", "arrays": arrays, "arena": arena, "out_mode": out_mode}


def load(module: str, function: str, src_dir: str) -> dict[str, Any]:
    return {"op": "load", "module": module, "function": function, "src_dir": src_dir}


def batch(fn: str, call_ids: list[int], args: list[list[dict[str, Any]]], outs: list[list[str]]) -> dict[str, Any]:
    if fn not in ("noop", "kernel"):
        raise ValueError("fn is 'noop' or 'kernel'")
    if not (len(call_ids) == len(args) == len(outs)):
        raise ValueError("call_ids, args and outs need one entry per call")
    return {"op": "batch", "fn": fn, "call_ids": call_ids, "args": args, "outs": outs}


# -- validation of what the worker sends (judge side) ------------------------------------

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_ready(msg: dict[str, Any]) -> int:
    if msg.get("op") != "ready" or not _is_int(msg.get("pid")):
        raise JudgeProtocolError(f"expected 'ready', got {msg.get('op')!r}")
    return int(msg["pid"])


def check_error(msg: dict[str, Any]) -> tuple[str, str, int | None]:
    """(code, message, call_id) of an ``error`` message, each validated and bounded."""
    code, message, call_id = msg.get("code"), msg.get("message", ""), msg.get("call_id")
    if code not in WORKER_ERROR_CODES:
        raise JudgeProtocolError(f"unknown worker error code {str(code)[:40]!r}")
    if not isinstance(message, str):
        raise JudgeProtocolError("error message is not a string")
    if call_id is not None and not _is_int(call_id):
        raise JudgeProtocolError("error call_id is not an int")
    return code, message[:2000], call_id


def check_done(msg: dict[str, Any], call_ids: list[int]) -> list[int]:
    """The per-call times of a ``done`` reply to the batch ``call_ids`` (non-negative ints, one per call)."""
    if msg.get("op") != "done":
        raise JudgeProtocolError(f"expected 'done', got {str(msg.get('op'))[:40]!r}")
    if msg.get("call_ids") != call_ids:
        raise JudgeProtocolError("reply names other calls than the batch")
    times = msg.get("times_ns")
    if not isinstance(times, list) or len(times) != len(call_ids):
        raise JudgeProtocolError("times_ns is not a list with one time per call")
    for t in times:
        if not _is_int(t) or t < 0 or t > 1 << 62:
            raise JudgeProtocolError(f"bad time {str(t)[:40]!r}")
    return [int(t) for t in times]

"""The harness ↔ runner channel: the trial seed in, the harness's result document out.

The runner starts ``benchmark.py`` with two inherited pipe ends named by
``KZ_CONTROL_FD`` (the read end of a pipe holding one JSON line
``{"trial_seed": <int 0..2**63-1>}``, fresh per job from :mod:`secrets`, the
runner's end already closed) and ``KZ_RESULT_FD`` (the write end of a pipe the
runner drains while the step runs, beside stdout and stderr). ``kz_runner.bench``
reads the seed at import and, at the end, writes exactly one document to the
result pipe: ``{"kind": "result", "result": <benchmark_output>}`` or
``{"kind": "integrity", "code", "message", "case", "evidence"}``.

:func:`judge` decides what the run produced:

- a ``result`` document is the result; a stdout document that differs from it in
  ``overall`` or ``cases`` is ``INTEGRITY_ERROR`` (the two channels disagree);
- an ``integrity`` document is a failure with the library's code and no result;
- nothing on the channel (a harness that does not use the library) falls back to
  the stdout contract: exactly one JSON document.

``channel`` in the answer says which was used: ``"harness"`` or ``"stdout"``.
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from typing import Any

from kz_runner.contract import checks
from kz_runner.contract.layout import CONTROL_ENV, LIBRARY_CODES, RESULT_ENV
from kz_runner.contract.schema_check import nonfinite_paths

# Bytes of the result channel kept; a document larger than this is not the library's.
RESULT_CAP = 4 * 1024 * 1024

BAD_OUTPUT = "BAD_OUTPUT"
INTEGRITY_ERROR = "INTEGRITY_ERROR"


@dataclass
class Pipes:
    """The two pipes of one benchmark step; the child's ends go to ``pass_fds``."""

    # the child's read end of the control pipe (the seed is already in it)
    control_read: int
    # the child's write end of the result pipe
    result_write: int
    # the runner's read end of the result pipe
    result_read: int
    # the seed written into the control pipe
    trial_seed: int

    @property
    def child_fds(self) -> tuple[int, int]:
        """The ends the child inherits (closed in the runner once the child runs)."""
        return (self.control_read, self.result_write)

    def env(self) -> dict[str, str]:
        """The two variables naming the child's ends."""
        return {CONTROL_ENV: str(self.control_read), RESULT_ENV: str(self.result_write)}

    def close(self) -> None:
        """Close every end still open here (safe to call twice)."""
        for name in ("control_read", "result_write", "result_read"):
            fd = getattr(self, name)
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, name, -1)


def open_pipes(trial_seed: int | None = None) -> Pipes:
    """Both pipes, the seed line written and the runner's write end of the control pipe closed."""
    seed = secrets.randbits(63) if trial_seed is None else trial_seed
    control_read, control_write = os.pipe()
    try:
        # One short line always fits in the pipe buffer: the write cannot block.
        os.write(control_write, json.dumps({"trial_seed": seed}).encode("ascii") + b"\n")
    finally:
        os.close(control_write)
    result_read, result_write = os.pipe()
    os.set_inheritable(result_read, False)
    return Pipes(control_read, result_write, result_read, seed)


@dataclass(frozen=True)
class ChannelVerdict:
    """What a finished benchmark produced, as far as the channels tell."""

    # the result document, None when there is none to report
    result: dict[str, Any] | None
    # None, or the failure code
    code: str | None
    # the failure message, None on success
    message: str | None
    # "harness" or "stdout"
    channel: str
    # extra text for the logs (the library's evidence, the offending stdout), may be empty
    note: str = ""


def _stdout_document(stdout: bytes) -> tuple[Any, str | None]:
    """(document, problem) of stdout under the guide's one-JSON-document contract."""
    doc, problems = checks.parse_output(stdout)
    if problems:
        return None, problems[0].message
    if not isinstance(doc, dict):
        return None, f"stdout is a JSON {type(doc).__name__}, not an object"
    bad = list(nonfinite_paths(doc))
    if bad:
        # JSON has no NaN/Infinity; the document cannot travel as it is.
        return None, f"NaN/Infinity in the result at {', '.join(bad[:5])}"
    return doc, None


def parse_channel(data: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """(protocol document, problem); (None, None) when nothing was written."""
    if not data.strip():
        return None, None
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"the harness's result channel is not one JSON document ({exc})"
    if not isinstance(doc, dict) or doc.get("kind") not in ("result", "integrity", "unjudged"):
        return None, "the harness's result channel carried no result or integrity document"
    return doc, None


def judge(stdout: bytes, channel_data: bytes, *, channel_dropped: int = 0) -> ChannelVerdict:
    """The result of a benchmark step that exited 0 (see the module docstring)."""
    if channel_dropped:
        return ChannelVerdict(None, INTEGRITY_ERROR,
                       f"the harness's result channel carried more than {RESULT_CAP} bytes", "harness")
    doc, problem = parse_channel(channel_data)
    if problem:
        return ChannelVerdict(None, INTEGRITY_ERROR, problem, "harness")
    if doc is None:
        out, problem = _stdout_document(stdout)
        if problem:
            return ChannelVerdict(None, BAD_OUTPUT, problem, "stdout", "stdout (offending)")
        return ChannelVerdict(out, None, None, "stdout")
    if doc["kind"] == "integrity":
        return integrity_verdict(doc)
    if doc["kind"] == "unjudged":  # only the judge's step may say so (kz_runner.worker.job runs it again)
        return ChannelVerdict(None, INTEGRITY_ERROR, "the harness said it needs the source area outside the judge's step",
                       "harness")
    result = doc.get("result")
    if not isinstance(result, dict):
        return ChannelVerdict(None, INTEGRITY_ERROR, "the harness's result document holds no benchmark output", "harness")
    bad = list(nonfinite_paths(result))
    if bad:
        return ChannelVerdict(None, BAD_OUTPUT, f"NaN/Infinity in the result at {', '.join(bad[:5])}", "harness")
    out, _problem = _stdout_document(stdout)
    if out is not None and any(out.get(k) != result.get(k) for k in ("overall", "cases")):
        return ChannelVerdict(None, INTEGRITY_ERROR, "stdout and the harness's result channel disagree", "harness",
                       "stdout (disagreeing with the result channel)")
    return ChannelVerdict(result, None, None, "harness")


def integrity_verdict(doc: dict[str, Any]) -> ChannelVerdict:
    """The failure an ``integrity`` document reports (an unknown code is the runner's own)."""
    code = doc.get("code")
    message = str(doc.get("message") or "").splitlines()[0][:500] if doc.get("message") else ""
    case = doc.get("case")
    if code not in LIBRARY_CODES:
        return ChannelVerdict(None, INTEGRITY_ERROR, f"the harness reported an unknown integrity code {code!r:.60}",
                       "harness")
    text = message or code
    if isinstance(case, str) and case:
        text = f"{text} (case {case[:200]})"
    evidence = json.dumps(doc.get("evidence"), sort_keys=True, default=str)[:4000]
    return ChannelVerdict(None, code, text, "harness", f"harness integrity evidence: {evidence}")

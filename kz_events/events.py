"""The event catalogue: every event kernel_zoo records, as small frozen dataclasses.

This module is the one place where event types are documented. Each class has a
``TYPE`` (the ``type`` word in the log), a ``VERSION`` (the ``v`` in the log) and
one dataclass field per payload key, each with a description in its metadata.
``schemas/event.json`` is generated from these classes (``json_schema()``), and a
test fails when the committed schema is stale.

The subject of an envelope (``{"submission": uuid, "kernel_id": ...}``) is derived
from the payload: ``uuid`` names the submission, ``kernel_id`` the kernel (the
store fills in the kernel from its state when the payload lacks it).

Adding a type: write the class, decorate it with ``@register``, teach the reducer
(``kz_events.reducer``) what it does, regenerate the schema (``python -m
kz_events.events > schemas/event.json``). Changing a payload: bump ``VERSION``,
keep the old shape readable with an upcaster declared in ``kz_events.codec.UPCASTERS``.
"""
from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = [
    "Event", "EVENT_TYPES", "register", "event_class", "json_schema", "doc", "CaseSummary",
    "SubmissionReceived", "SubmissionValidated", "SubmissionRejected",
    "JobQueued", "JobClaimed", "JobLeaseRenewed", "JobLeaseExpired", "JobReleased",
    "JobCancelled", "JobFailed", "ResultReported",
    "SubmissionHeld", "SubmissionReviewed", "HarnessReviewed",
    "JobConfirmationRequested", "SubmissionRevoked", "RevokeCommitted",
    "AcceptStarted", "AcceptSourceCommitted", "AcceptScorecardCommitted",
    "AcceptCompleted", "AcceptRolledBack", "IndexUpdated", "MirrorPushed",
    "DaemonStarted", "LogRepaired", "SpoolSkipped",
    "RerunRequested", "RerunClaimed", "RerunLeaseRenewed", "RerunReleased", "RerunReported", "RerunFailed",
    "RerunCancelled",
]

#: type word -> the class of the current version of that event.
EVENT_TYPES: dict[str, type[Event]] = {}


def doc(text: str, **schema: Any) -> Any:
    """A dataclass field carrying its description (and extra JSON Schema keywords)."""
    return field(metadata={"doc": text, "schema": schema})


class Event:
    """Base of every event: a frozen dataclass with ``TYPE`` and ``VERSION``.

    Construction checks the type of every field (``int`` fields refuse ``bool``;
    ``float`` fields accept an ``int`` and store it as ``float``), so a wrong
    payload fails where it is built, not when the log is read back.
    """

    TYPE: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    #: names of the payload fields, in declaration order (set by ``register``).
    FIELDS: ClassVar[tuple[str, ...]] = ()
    #: field name -> (allowed python types, nullable) (set by ``register``).
    _CHECKS: ClassVar[dict[str, tuple[tuple[type, ...], bool]]] = {}
    #: set by ``dataclass`` in ``register``; declared so type checkers take an Event for a dataclass.
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __post_init__(self) -> None:
        for name, (allowed, nullable) in self._CHECKS.items():
            value = getattr(self, name)
            if value is None:
                if nullable:
                    continue
                raise TypeError(f"{self.TYPE}: field {name!r} must not be None")
            if float in allowed and type(value) is int:
                object.__setattr__(self, name, float(value))
                continue
            if type(value) is bool and bool not in allowed:
                raise TypeError(f"{self.TYPE}: field {name!r} must be {_type_words(allowed)}, got bool")
            if not isinstance(value, allowed):
                raise TypeError(
                    f"{self.TYPE}: field {name!r} must be {_type_words(allowed)}, "
                    f"got {type(value).__name__}"
                )

    def payload(self) -> dict[str, Any]:
        """The payload dict of this event (field name -> value), as the codec writes it."""
        return {name: getattr(self, name) for name in self.FIELDS}


def _type_words(allowed: tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in allowed)


def _checks_for(cls: type) -> dict[str, tuple[tuple[type, ...], bool]]:
    hints = typing.get_type_hints(cls)
    checks: dict[str, tuple[tuple[type, ...], bool]] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        nullable = False
        args = typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            nullable = type(None) in args
            inner = [a for a in args if a is not type(None)]
            hint = inner[0]
        origin = typing.get_origin(hint) or hint
        checks[f.name] = ((origin,), nullable)
    return checks


_E = typing.TypeVar("_E", bound="Event")


# dataclass_transform (PEP 681) tells type checkers that a registered class is a frozen
# dataclass whose fields come from ``doc`` (no default: every payload key is required).
@typing.dataclass_transform(frozen_default=True, field_specifiers=(field, doc))
def register(cls: type[_E]) -> type[_E]:
    """Class decorator: make ``cls`` a frozen dataclass and add it to the catalogue."""
    if not cls.TYPE:
        raise ValueError(f"{cls.__name__} has no TYPE")
    if cls.TYPE in EVENT_TYPES:
        raise ValueError(f"event type {cls.TYPE!r} registered twice")
    cls = dataclass(frozen=True, slots=True)(cls)
    cls.FIELDS = tuple(f.name for f in dataclasses.fields(cls))
    cls._CHECKS = _checks_for(cls)
    EVENT_TYPES[cls.TYPE] = cls
    return cls


def event_class(type_word: str) -> type[Event]:
    """The class of event type ``type_word``; raises KeyError naming the known types."""
    try:
        return EVENT_TYPES[type_word]
    except KeyError:
        raise KeyError(
            f"unknown event type {type_word!r}; known: {', '.join(sorted(EVENT_TYPES))}"
        ) from None


_UUID = "Submission uuid (the subject of the event)."
_KID = "kernel_id: the package path relative to the kernel repo root."
_RUNNER = "Id of the runner (from its token, never from a request body)."
_LEASE = "Id of the lease this runner holds on the job."
_EXPIRES = "Lease expiry, epoch seconds (float)."
_SHA_PATTERN = "^[0-9a-f]{40}([0-9a-f]{24})?$"


# --- submissions --------------------------------------------------------------


@register
class SubmissionReceived(Event):
    """A package arrived in the inbox (HTTP upload or a file dropped in the spool).

    First event of every submission; status becomes ``received``.

    Version 2 added ``idempotency_key`` (version 1 lines read as ``null``).
    """

    TYPE = "submission.received"
    VERSION = 2
    uuid: str = doc(_UUID)
    kernel_id: str = doc(_KID)
    submitter_id: str = doc("Who submitted it (X-Submitter-Id, sidecar, or 'spool').")
    source: str = doc("How it arrived.", enum=["http", "spool"])
    filename: str = doc("Name of the tarball in the inbox.")
    size: int = doc("Size of the tarball in bytes.", minimum=0)
    sha256: str = doc("sha256 hex of the tarball as received.", pattern="^[0-9a-f]{64}$")
    # a default, so that callers written before version 2 still build the event
    idempotency_key: str | None = field(default=None, metadata={"doc": (
        "The upload's Idempotency-Key header (scoped to submitter_id), or null when it had none."),
        "schema": {}})


@register
class SubmissionValidated(Event):
    """The package passed validation; its arch is known. Status stays ``received``.

    Version 2 added ``harness_change`` (version 1 lines read as ``false``).
    """

    TYPE = "submission.validated"
    VERSION = 2
    uuid: str = doc(_UUID)
    kernel_id: str = doc(_KID)
    arch: str = doc("Target arch of the package (e.g. gfx928, sm_90).")
    new_kernel: bool = doc("True when no package with this kernel_id exists in the repo yet.")
    warnings: list = doc("Codes of the validation warnings.", items={"type": "string"})
    # a default, so that callers written before version 2 still build the event
    harness_change: bool = field(default=False, metadata={"doc": (
        "True when a maintainer of an existing kernel changed its locked harness files "
        "(desc.yaml, build_test_env.py, benchmark.py)."), "schema": {}})


@register
class SubmissionRejected(Event):
    """The submission is refused for good (terminal status ``rejected``).

    ``stage`` says where: ``intake`` (validation), ``result`` (a failed hard check
    or the package's own verdict accept=false), ``accept`` (the accept saga found
    the package unacceptable, e.g. a missing reference source).
    """

    TYPE = "submission.rejected"
    uuid: str = doc(_UUID)
    stage: str = doc("Where it was rejected.", enum=["intake", "result", "accept"])
    code: str = doc("Stable machine-readable reason code, e.g. VALIDATION_ERROR.")
    message: str = doc("Human message: what is wrong and what to fix.")
    details: dict = doc("Machine-readable details (e.g. the problems found).")


# --- human review (static rules that hold a submission) -----------------------------


@register
class SubmissionHeld(Event):
    """A static rule asks an admin to look at the package before it runs; status ``held``.

    Follows ``submission.validated``; ``submission.reviewed`` ends the hold.
    """

    TYPE = "submission.held"
    uuid: str = doc(_UUID)
    rules: list = doc("Ids of the rules that hold it.", items={"type": "string"})
    evidence: list = doc("One {rule, file, line, text} per finding.", items={"type": "object"})


@register
class SubmissionReviewed(Event):
    """An admin decided on a held submission: ``approve`` queues it, ``reject`` ends it (``rejected``)."""

    TYPE = "submission.reviewed"
    uuid: str = doc(_UUID)
    decision: str = doc("The admin's decision.", enum=["approve", "reject"])
    by: str = doc("Who decided (the admin token's id).")
    reason: str = doc("Why (may be empty for an approval).")


# --- harness review (a harness a submission brought ranks once a maintainer approved it) ---------


@register
class HarnessReviewed(Event):
    """A maintainer decided on a kernel's harness: ``approve`` lets the kernel rank under it,
    ``revoke`` takes that approval back.

    A harness is the kernel's ``.kernel_package/`` files but the scorecard, named by their
    hash (``harness_hash``, ``kz_daemon.guards.harness_review.harness_digest``); an
    approval names one hash, so a later change of the harness is unreviewed again. A
    harness an accepted submission brought (a new kernel, a maintainer's harness change)
    ranks only while its hash is approved; one no submission brought (the seed, a commit
    outside the accept path) is the maintainers' own and counts as reviewed. When the
    decision was made is the envelope's ``ts``.
    """

    TYPE = "harness.reviewed"
    kernel_id: str = doc(_KID)
    harness_hash: str = doc("The harness's hash: sha256 hex of one line '<git blob id> <name>' per file of "
                            "the kernel's .kernel_package/ but bench_result.yaml, in name order.",
                            pattern="^[0-9a-f]{64}$")
    decision: str = doc("approve: the kernel ranks under this harness; revoke: it no longer does.",
                        enum=["approve", "revoke"])
    commit: str | None = doc("The kernel's record (commit) whose harness was reviewed: the source commit of the "
                             "accept that brought it, or null.", pattern=_SHA_PATTERN)
    by: str = doc("Who decided (the admin token's id).")
    reason: str = doc("Why (may be empty).")


# --- jobs ---------------------------------------------------------------------


@register
class JobQueued(Event):
    """The validated submission waits for a runner of ``arch``; status ``queued``."""

    TYPE = "job.queued"
    uuid: str = doc(_UUID)
    kernel_id: str = doc(_KID)
    arch: str = doc("Arch a runner must have to claim the job.")


@register
class JobClaimed(Event):
    """A runner took the job under a lease; status ``running``.

    At most one job per kernel_id is in flight; ``attempt`` counts claims (1 first).
    """

    TYPE = "job.claimed"
    uuid: str = doc(_UUID)
    runner_id: str = doc(_RUNNER)
    lease_id: str = doc(_LEASE)
    lease_expires_at: float = doc(_EXPIRES)
    attempt: int = doc("Attempt number of this claim: previous attempts + 1.", minimum=1)


@register
class JobLeaseRenewed(Event):
    """The lease holder extended its lease."""

    TYPE = "job.lease_renewed"
    uuid: str = doc(_UUID)
    runner_id: str = doc(_RUNNER)
    lease_id: str = doc(_LEASE)
    lease_expires_at: float = doc("The new lease expiry, epoch seconds (float).")


@register
class JobLeaseExpired(Event):
    """The lease ran out without a result; the job goes back to ``queued`` (attempt counted)."""

    TYPE = "job.lease_expired"
    uuid: str = doc(_UUID)
    runner_id: str = doc(_RUNNER)
    lease_id: str = doc(_LEASE)
    attempt: int = doc("The attempt that expired.", minimum=1)


@register
class JobReleased(Event):
    """The runner gave the job back; it goes back to ``queued`` (attempt counted)."""

    TYPE = "job.released"
    uuid: str = doc(_UUID)
    runner_id: str = doc(_RUNNER)
    lease_id: str = doc(_LEASE)
    reason: str = doc("Why the runner released it.")


@register
class JobCancelled(Event):
    """Someone cancelled the submission before its accept saga started; terminal ``cancelled``."""

    TYPE = "job.cancelled"
    uuid: str = doc(_UUID)
    by: str = doc("Who cancelled it (submitter id, 'operator').")
    reason: str = doc("Why.")


@register
class JobFailed(Event):
    """Infrastructure failure, terminal ``failed`` (e.g. ATTEMPTS_EXHAUSTED)."""

    TYPE = "job.failed"
    uuid: str = doc(_UUID)
    code: str = doc("Stable reason code, e.g. ATTEMPTS_EXHAUSTED.")
    message: str = doc("Human message.")


# --- results and the accept saga ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class CaseSummary:
    """One test case of a reported run, as ``result.reported`` records it and status documents show it.

    ``value`` is the case's primary metric as the run reported it (null when the run did
    not measure it or it was not finite); ``unit`` and ``direction`` come from the case's
    METAS entry at report time (null on lines written before version 2 of the event).
    ``n``, ``lo`` and ``hi`` are the value's spread when the run reported one (the
    harness does for the primary metric it timed: ``n`` timed calls, the value their
    median, ``lo``..``hi`` its 95 % interval); null otherwise.
    """

    test_case_id: str
    correctness: str              # passed | failed | skipped (the run's word)
    accept: bool                  # the case's own verdict
    primary_metric: str | None
    value: float | None
    unit: str | None
    direction: str | None         # lower_better | higher_better
    n: int | None = None          # timed calls the value summarises
    lo: float | None = None       # 95 % interval of the value
    hi: float | None = None

    @classmethod
    def from_json(cls, doc: Any) -> CaseSummary:
        """Read one entry of ``result.reported``'s ``cases`` (missing keys read as null/false)."""
        doc = doc if isinstance(doc, dict) else {}
        n = doc.get("n")
        return cls(str(doc.get("test_case_id", "")), str(doc.get("correctness", "")),
                   bool(doc.get("accept", False)), _str_or_none(doc.get("primary_metric")),
                   _number_or_none(doc.get("value")), _str_or_none(doc.get("unit")),
                   _str_or_none(doc.get("direction")),
                   n if type(n) is int else None, _number_or_none(doc.get("lo")), _number_or_none(doc.get("hi")))

    def to_json(self) -> dict[str, Any]:
        """The entry as it is written in ``result.reported`` and shown in a status document."""
        return {"test_case_id": self.test_case_id, "correctness": self.correctness,
                "accept": self.accept, "primary_metric": self.primary_metric, "value": self.value,
                "unit": self.unit, "direction": self.direction, "n": self.n, "lo": self.lo, "hi": self.hi}


def _number_or_none(value: Any) -> float | None:
    return None if isinstance(value, bool) or not isinstance(value, (int, float)) else value


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


@register
class ResultReported(Event):
    """The lease holder reported the benchmark result; the lease ends, the job stays ``running``.

    Next comes ``accept.started`` (the result said accept) or
    ``submission.rejected`` (stage ``result``).

    Version 2 added each case's ``unit`` and ``direction`` (version 1 lines read them as
    ``null``): the case summaries are what status documents show, without re-reading
    the stored result.
    """

    TYPE = "result.reported"
    VERSION = 2
    uuid: str = doc(_UUID)
    runner_id: str = doc(_RUNNER)
    lease_id: str = doc(_LEASE)
    result_sha256: str = doc("sha256 hex of the stored result.json.", pattern="^[0-9a-f]{64}$")
    overall_accept: bool = doc("The package's own verdict (overall.accept).")
    build_ok: bool = doc("overall.build_ok.")
    cases: list = doc(
        "Per test case (CaseSummary): {test_case_id, correctness, accept, primary_metric, value, "
        "unit, direction, n, lo, hi}.",
        items={"type": "object"},
    )
    env: dict = doc("Runner environment facts (gpu, driver, versions).")


@register
class AcceptStarted(Event):
    """The accept saga began for a reported result; status ``accepting``."""

    TYPE = "accept.started"
    uuid: str = doc(_UUID)
    kernel_id: str = doc(_KID)
    base_head: str | None = doc("Branch SHA before the saga (null for an empty repo).", pattern=_SHA_PATTERN)


@register
class AcceptSourceCommitted(Event):
    """Saga step 1: the source commit (everything but bench_result.yaml) is written."""

    TYPE = "accept.source_committed"
    uuid: str = doc(_UUID)
    sha_src: str = doc("SHA of the source commit (the SHA the API reports).", pattern=_SHA_PATTERN)
    parent: str | None = doc("Its parent commit (null for the first commit).", pattern=_SHA_PATTERN)


@register
class AcceptScorecardCommitted(Event):
    """Saga step 2: the bench_result.yaml commit on top of the source commit is written."""

    TYPE = "accept.scorecard_committed"
    uuid: str = doc(_UUID)
    sha_src: str = doc("SHA of the source commit.", pattern=_SHA_PATTERN)
    sha_br: str = doc("SHA of the scorecard commit (the new branch head).", pattern=_SHA_PATTERN)


@register
class AcceptCompleted(Event):
    """The branch moved to the scorecard commit; terminal ``accepted``.

    Version 2 added ``outcome`` (version 1 lines read as ``null``): what the accept
    changed, computed by the saga when it committed, which the status document shows.
    """

    TYPE = "accept.completed"
    VERSION = 2
    uuid: str = doc(_UUID)
    sha_src: str = doc("SHA of the source commit.", pattern=_SHA_PATTERN)
    sha_br: str = doc("SHA of the scorecard commit.", pattern=_SHA_PATTERN)
    # a default, so that callers written before version 2 still build the event
    outcome: dict | None = field(default=None, metadata={"doc": (
        "What the accept changed (kz_daemon.board.outcome): new_best, cases_improved, speedup, delta_pct, "
        "per case {test_case_id, metric, unit, direction, previous_best, value, best, new_best, delta_pct, "
        "speedup}, and the kernel's rank in its operator before and after; null on version 1 lines."),
        "schema": {}})


@register
class AcceptRolledBack(Event):
    """The saga was undone (branch left at base_head); terminal ``failed``."""

    TYPE = "accept.rolled_back"
    uuid: str = doc(_UUID)
    reason: str = doc("Why the saga was rolled back.")


# --- confirmation runs and revocation -------------------------------------------------


@register
class JobConfirmationRequested(Event):
    """The reported result beats the recorded best by more than ``confirmation.margin``: it is
    run again before anything is committed. The job goes back to ``queued`` (the run counts as
    an attempt) with a confirmation flag; ``runner_id`` may not claim it before ``exclusive_until``.

    The next ``result.reported`` is the confirmation run; ``accept.started`` follows when the
    two agree, ``submission.rejected`` (code ``CONFIRMATION_MISMATCH``) when they do not.
    """

    TYPE = "job.confirmation_requested"
    uuid: str = doc(_UUID)
    runner_id: str = doc("Runner of the first result.")
    lease_id: str = doc("Lease the first result was reported under.")
    result_sha256: str = doc("sha256 hex of the first result (runs/<uuid>/result.json).",
                             pattern="^[0-9a-f]{64}$")
    reason: str = doc("Which case and metric beat the recorded best, and by how much.")
    exclusive_until: float = doc("Until then (epoch seconds) only another runner may claim the "
                                 "confirmation run; afterwards any runner of the arch may.")


@register
class SubmissionRevoked(Event):
    """An admin took an accepted record back; terminal ``revoked``.

    The revocation commit follows (``revoke.committed``); history is never rewritten.
    """

    TYPE = "submission.revoked"
    uuid: str = doc(_UUID)
    by: str = doc("Who revoked it (the admin token's id, or 'operator' for the CLI).")
    reason: str = doc("Why.")


@register
class RevokeCommitted(Event):
    """The revocation commit (trailer ``Revokes: <uuid>``) is on the branch and the index is updated."""

    TYPE = "revoke.committed"
    uuid: str = doc(_UUID)
    sha: str = doc("SHA of the revocation commit.", pattern=_SHA_PATTERN)
    best_changed: bool = doc("Whether the kernel's metrics_best changed (else the commit changes no file).")


# --- reruns of accepted records ----------------------------------------------------------
#
# A rerun measures an accepted record again: its package and harness at its source
# commit, on a runner of its arch (or the one named), as a job of its own kind. It is
# never judged for an accept and never changes the scorecard; it ends ``done`` with
# each case's figure beside the record's, ``failed``, or ``cancelled`` by an admin. Its
# events name the record (``uuid``) and the rerun (``rerun_id``).

_RERUN = "Id of the rerun (a uuid4 the daemon draws)."
_RECORD = "Uuid of the accepted submission the rerun measures again (the subject of the event)."


@register
class RerunRequested(Event):
    """Someone asked for an accepted record to be measured again; the rerun waits for a runner (``queued``)."""

    TYPE = "rerun.requested"
    rerun_id: str = doc(_RERUN)
    uuid: str = doc(_RECORD)
    kernel_id: str = doc(_KID)
    arch: str = doc("Arch a runner must have to claim the rerun (the record's).")
    runner: str | None = doc("The only runner that may claim it, or null for any runner of the arch.")
    by: str = doc("Who asked (the token's id).")


@register
class RerunClaimed(Event):
    """A runner took the rerun under a lease; ``running``."""

    TYPE = "rerun.claimed"
    rerun_id: str = doc(_RERUN)
    uuid: str = doc(_RECORD)
    runner_id: str = doc(_RUNNER)
    lease_id: str = doc(_LEASE)
    lease_expires_at: float = doc(_EXPIRES)
    attempt: int = doc("Attempt number of this claim: previous attempts + 1.", minimum=1)


@register
class RerunLeaseRenewed(Event):
    """The rerun's lease holder extended its lease."""

    TYPE = "rerun.lease_renewed"
    rerun_id: str = doc(_RERUN)
    uuid: str = doc(_RECORD)
    runner_id: str = doc(_RUNNER)
    lease_id: str = doc(_LEASE)
    lease_expires_at: float = doc(_EXPIRES)


@register
class RerunReleased(Event):
    """The rerun's lease ended without a report (given back, or expired); ``queued`` again, attempt counted."""

    TYPE = "rerun.released"
    rerun_id: str = doc(_RERUN)
    uuid: str = doc(_RECORD)
    runner_id: str = doc(_RUNNER)
    lease_id: str = doc(_LEASE)
    reason: str = doc("Why: the runner's reason, or that the lease expired.")
    expired: bool = doc("True when the lease expired (the reaper), false when the runner gave it back.")


@register
class RerunReported(Event):
    """The lease holder reported the rerun's result; ``done``. Nothing is committed.

    ``cases`` put each case's figure beside the record's: the record's committed value
    of the primary metric (``original``), this run's (``value``), both with their
    spread when known, the change in % and whether the two intervals overlap.
    """

    TYPE = "rerun.reported"
    rerun_id: str = doc(_RERUN)
    uuid: str = doc(_RECORD)
    runner_id: str = doc(_RUNNER)
    lease_id: str = doc(_LEASE)
    result_sha256: str = doc("sha256 of the stored result document.", pattern="^[0-9a-f]{64}$")
    cases: list = doc(
        "Per case: {test_case_id, metric, unit, direction, correctness, original, original_spread, value, "
        "spread, delta_pct, speedup, within_noise}.", items={"type": "object"})
    overall: dict = doc("{speedup (geometric mean of the cases' speed-ups against the record), delta_pct, "
                        "correct (every case passed)}.")
    env: dict = doc("The rerun's runner environment facts (gpu, driver, versions).")
    env_changes: list = doc("The environment facts that differ from the record's run: [{key, original, rerun}].",
                            items={"type": "object"})


@register
class RerunFailed(Event):
    """The rerun ended without a figure (the runner's failure, a result the checks refuse, attempts
    spent, or cancelled); ``failed``."""

    TYPE = "rerun.failed"
    rerun_id: str = doc(_RERUN)
    uuid: str = doc(_RECORD)
    code: str = doc("Stable reason code, e.g. BUILD_FAILED, ATTEMPTS_EXHAUSTED, CANCELLED.")
    message: str = doc("What happened.")


@register
class RerunCancelled(Event):
    """An admin cancelled the rerun: a queued one ends ``cancelled`` at once and is never claimed; a running
    one goes ``cancelling``: its runner finishes the job (its lease stays renewable), and when the lease
    ends (report, release, expiry) the rerun ends ``cancelled`` with the report's figures discarded."""

    TYPE = "rerun.cancelled"
    rerun_id: str = doc(_RERUN)
    uuid: str = doc(_RECORD)
    by: str = doc("Who cancelled (the admin token's id).")
    reason: str = doc("Why (may be empty).")


# --- the rest of the system -------------------------------------------------------


@register
class IndexUpdated(Event):
    """index.json was rewritten."""

    TYPE = "index.updated"
    version: int = doc("Index version; increases by one or more with each rewrite.", minimum=1)
    head: str | None = doc("Branch head the index was computed from.", pattern=_SHA_PATTERN)
    kernels: int = doc("Number of kernels in the index.", minimum=0)


@register
class MirrorPushed(Event):
    """A push of the kernel repo to a mirror remote was attempted."""

    TYPE = "mirror.pushed"
    remote: str = doc("Name or URL of the remote.")
    sha: str = doc("The SHA pushed.")
    ok: bool = doc("Whether the push succeeded.")
    error: str | None = doc("The error when it failed, else null.")


@register
class DaemonStarted(Event):
    """The daemon started (after recovery)."""

    TYPE = "daemon.started"
    version: str = doc("kernel_zoo version.")
    pid: int = doc("Process id of the daemon.", minimum=1)


@register
class LogRepaired(Event):
    """Opening the log found a torn final line, truncated it and kept the bytes in quarantine."""

    TYPE = "log.repaired"
    dropped_bytes: int = doc("How many bytes were cut off the last segment.", minimum=1)
    quarantine_file: str = doc("Path of the quarantine file, relative to the events dir.")


@register
class SpoolSkipped(Event):
    """An entry in the spool's inbox that is not a regular file was left alone (logged once per entry)."""

    TYPE = "spool.skipped"
    name: str = doc("The entry's name in the inbox.")
    reason: str = doc("Why it was skipped: directory, symlink, fifo, socket, device or other.")


# --- the schema ------------------------------------------------------------------

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean",
               list: "array", dict: "object"}
SUBJECT_FIELDS = ("submission", "kernel_id")


def _payload_schema(cls: type[Event]) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        (allowed,), nullable = cls._CHECKS[f.name]
        json_type: Any = _JSON_TYPES[allowed]
        if nullable:
            json_type = [json_type, "null"]
        prop = {"type": json_type, "description": f.metadata["doc"]}
        prop.update(f.metadata["schema"])
        props[f.name] = prop
    return {
        "type": "object",
        "description": " ".join((cls.__doc__ or "").split()),
        "additionalProperties": False,
        "required": list(cls.FIELDS),
        "properties": props,
    }


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one event line, generated from the catalogue."""
    defs = {cls.TYPE: _payload_schema(cls) for cls in EVENT_TYPES.values()}
    branches = [
        {
            "if": {"properties": {"type": {"const": t}}, "required": ["type"]},
            "then": {"properties": {"v": {"const": EVENT_TYPES[t].VERSION},
                                    "payload": {"$ref": f"#/$defs/{t}"}}},
        }
        for t in sorted(EVENT_TYPES)
    ]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://kernel-zoo.dev/schemas/event.json",
        "title": "kernel_zoo event (one line of the event log)",
        "description": (
            "One line of DIR/events/*.jsonl: canonical JSON (sorted keys, no spaces, "
            "UTF-8) of this envelope, then a newline. The log is append-only; each "
            "line carries the sha256 of the previous line's bytes, so an edit, an "
            "insertion or a deletion breaks the chain. Payloads per type are in $defs."
        ),
        "type": "object",
        "additionalProperties": False,
        "required": ["seq", "ts", "type", "v", "subject", "payload", "prev"],
        "properties": {
            "seq": {"type": "integer", "minimum": 1,
                    "description": "Position in the log: 1 for the first event, gapless."},
            "ts": {"type": "string",
                   "pattern": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$",
                   "description": "When the event was appended: UTC RFC 3339 with microseconds."},
            "type": {"type": "string", "enum": sorted(EVENT_TYPES),
                     "description": "The event type (see $defs for each payload)."},
            "v": {"type": "integer", "minimum": 1,
                  "description": "Version of the event type's payload shape."},
            "subject": {
                "type": "object",
                "additionalProperties": False,
                "description": "Ids the event is about, for filtering.",
                "properties": {
                    "submission": {"type": "string", "description": "Submission uuid."},
                    "kernel_id": {"type": "string", "description": "kernel_id of the package."},
                },
            },
            "payload": {"type": "object",
                        "description": "The event's data; its shape depends on type and v."},
            "prev": {"type": "string", "pattern": "^[0-9a-f]{64}$",
                     "description": "sha256 hex of the previous line's bytes (without the "
                                    "newline); 64 zeros for seq 1."},
        },
        "allOf": branches,
        "$defs": defs,
    }


if __name__ == "__main__":  # regenerate schemas/event.json
    print(json.dumps(json_schema(), indent=2, ensure_ascii=False))

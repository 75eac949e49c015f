"""Intake: from a claimed spool file to ``queued`` or ``rejected``, before anything touches the repo.

For each file that got its uuid (``spool.claim``), :class:`Intake` decides once:

1. the safe tarball checks and the package validation (the one validator library,
   ``kz_runner.contract``), then the daemon's policies against the repo at HEAD
   (new packages allowed?, ``frozen`` here or at HEAD, nesting with other packages),
   the locked harness and the static rules; the file is read once, into a package
   record (``read_package``), and every check reads that record, so each member is
   decompressed once and desc.yaml and benchmark.py are parsed once;
2. writes the outcome durably: ``pending/<uuid>/submission.json`` + ``package.tar.gz``
   or ``spool/rejected/<uuid>/reason.json`` + ``package.tar.gz`` (the JSON first, the
   tarball renamed in last);
3. emits ``submission.received`` with ``submission.validated`` + ``job.queued`` or
   ``submission.rejected`` (the files of one scan in batches: one durable append each).

A crash between 2 and 3 leaves an outcome folder whose uuid the log lacks:
:meth:`Intake.recover` emits its events from the JSON at start-up. A failed append
while the daemon runs (the log's disk full: ``StorageError``) leaves the same
folders; the next scans emit them the same way (:meth:`Intake.record_outcomes`),
retrying with backoff until the log takes writes again, and the status endpoint
answers ``received`` for them meanwhile (:meth:`Intake.knows`). Nothing is ever
decided twice and no file is lost.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kz_daemon.config.settings import Config, DaemonLimits
from kz_daemon.core.scorecard import desc_is_frozen
from kz_daemon.guards import harness_lock, physics
from kz_daemon.guards.static_rules import screen
from kz_daemon.intake import idempotency, spool
from kz_daemon.intake.spool import Claimed, SpoolDirs
from kz_daemon.storage.gitstore import GitStore
from kz_daemon.storage.pending import PACKAGE_FILE, SUBMISSION_FILE
from kz_events import durable, events as ev
from kz_events.log.store import StorageError, Store, StoreBroken, StoreClosed
from kz_events.reducer import ReducerError
from kz_runner.contract.layout import BENCHMARK, DESC, HARNESS_FILES, KP
from kz_runner.contract.rules.engine import RULES_BY_ID
from kz_runner.contract.rules.pysource import BENCHMARK_FILE, read_metas
from kz_runner.contract.validate import PackageRecord, contract_path, read_package, validate_record

logger = logging.getLogger(__name__)

EMIT_BATCH = 16  # files whose events are appended together
REASON_FILE = "reason.json"
RETRY_MIN_S = 0.5   # first wait after a scan failed on storage ...
RETRY_MAX_S = 10.0  # ... doubled per failure up to this


@dataclass
class Outcome:
    """The intake decision for one file (a value: tests build and compare them)."""

    ok: bool
    kernel_id: str
    arch: str = ""
    new_kernel: bool = False
    harness_change: bool = False     # a maintainer changed an existing kernel's locked harness
    held: list[dict] = field(default_factory=list)   # findings of the hold rules: an admin decides
    warnings: list[str] = field(default_factory=list)
    code: str = ""
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def _problems_json(problems) -> list[dict]:
    return [p.to_json() for p in problems]


def reject(kernel_id: str, code: str, message: str, **details: Any) -> Outcome:
    """A rejecting outcome."""
    return Outcome(False, kernel_id, code=code, message=message, details=details)


def read_spooled(path: Path, limits: DaemonLimits) -> PackageRecord | None:
    """The package record of a spooled file, read once for every check; None when it is not a regular file.

    (:func:`validate_file` says why such a file is refused.)
    """
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
    except FileNotFoundError:
        return None
    return read_package(path, limits.contract_limits)


def validate_file(path: Path, filename: str, limits: DaemonLimits,
                  expected_kernel_id: str | None, record: PackageRecord | None = None) -> tuple[Outcome, dict]:
    """Check one spooled file with the contract library; returns (outcome, facts).

    ``facts`` are the validator's (kernel_id, arch, status, test_case_ids ...) plus ``metas``.
    ``record``: the file as :func:`read_spooled` read it (read here when not given).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return reject(expected_kernel_id or "", "TARBALL_CORRUPT", "the file vanished"), {}
    if not stat.S_ISREG(st.st_mode):
        return reject(expected_kernel_id or "", "TARBALL_CORRUPT",
                      f"{filename} is not a regular file (links and special files are refused)"), {}
    if record is None:
        record = read_package(path, limits.contract_limits)
    report = validate_record(record, filename, kernel_id=expected_kernel_id)
    facts = dict(report.facts)
    kernel_id = facts.get("kernel_id") or expected_kernel_id or ""
    if not report.valid:
        first = report.errors[0]
        return reject(kernel_id, first.code, first.render(),
                      problems=_problems_json(report.problems),
                      codes=[p.code for p in report.errors]), facts
    warnings = [p.code for p in report.warnings]
    if "metas" not in facts:  # the validator gives them when they are plain JSON, as valid ones are
        facts["metas"] = read_package_metas(path, kernel_id, limits, record)
    # the lane is the path's arch: the kernel_id is what git, the index and the runners see (desc.yaml's
    # category must equal it, CATEGORY_MISMATCH otherwise, so a valid package has one arch either way)
    lane = kernel_id.split("/", 1)[0] if kernel_id else str(facts.get("arch") or "")
    return Outcome(True, kernel_id, arch=lane, warnings=warnings,
                   details={"problems": _problems_json(report.problems)}), facts


def read_package_metas(path: Path, kernel_id: str, limits: DaemonLimits,
                       record: PackageRecord | None = None) -> list[dict] | None:
    """KERNEL_ZOO_TEST_CASE_METAS of a submitted tarball, read with ast (never imported).

    ``record``: the tarball as read already, whose parse of benchmark.py is reused.
    """
    if record is None:
        record = read_package(path, limits.contract_limits, source_area=False)
    member = f"{kernel_id}/{KP}/{BENCHMARK}"
    source = record.data(member)
    if source is None:
        return None
    metas, _problems = read_metas(source, BENCHMARK_FILE, record.python(member, BENCHMARK_FILE))
    return metas


def _frozen_at_head(head_desc_raw: bytes, record: PackageRecord | None, kernel_id: str) -> bool:
    """Whether HEAD's desc.yaml says ``status: frozen``; read from the record's parse when the bytes are the same."""
    member = f"{kernel_id}/{KP}/{DESC}"
    if record is None or record.data(member) != head_desc_raw:
        return desc_is_frozen(head_desc_raw)
    ok, desc, _found = record.yaml(member, contract_path(DESC))  # what desc_is_frozen would read from them
    return ok and isinstance(desc, dict) and desc.get("status") == "frozen"


def policy_check(outcome: Outcome, facts: dict, git: GitStore, allow_new: bool,
                 record: PackageRecord | None = None) -> Outcome:
    """Apply the repo-dependent policies to a valid outcome (git reads at HEAD only).

    ``record``: the submitted tarball as read; when HEAD's desc.yaml has the submitted
    bytes (an existing kernel's harness is locked, so it usually does), its parse is reused.
    Keeps HEAD's desc.yaml bytes in ``facts["head_desc"]`` (None: absent) for
    :func:`integrity_check`, which runs under the same lock and so the same HEAD.
    """
    kid = outcome.kernel_id
    parts = kid.split("/")
    for i in range(1, len(parts)):
        outer = "/".join(parts[:i])
        if git.is_dir(f"{outer}/{KP}"):
            return reject(kid, "NESTED_PACKAGE", f"{kid} lies inside the source area of package {outer}; "
                          "choose a kernel_id outside it", outer=outer)
    head_desc_raw = git.read_file(f"{kid}/{KP}/{DESC}")
    facts["head_desc"] = head_desc_raw
    exists = head_desc_raw is not None
    if not exists and git.is_dir(kid):
        return reject(kid, "NESTED_PACKAGE", f"{kid} is a folder that holds other packages; "
                      "a package cannot contain packages", folder=kid)
    if head_desc_raw is not None and _frozen_at_head(head_desc_raw, record, kid):
        return reject(kid, "PACKAGE_FROZEN", f"{kid} is frozen in the repo: it is listed but takes "
                      "no submissions", where="repo")
    if facts.get("status") == "frozen":
        return reject(kid, "PACKAGE_FROZEN", "the submitted desc.yaml has status: frozen; frozen "
                      "packages are never run (use status: normal)", where="submission")
    if not exists and not allow_new:
        return reject(kid, "NEW_PACKAGE_NOT_ALLOWED", f"{kid} is not in the repo and this zoo takes "
                      "no new packages (policy.allow_new_packages is false)")
    outcome.new_kernel = not exists
    if not outcome.arch:
        return reject(kid, "VALIDATION_ERROR", "the kernel_id has no arch segment")
    return outcome


def integrity_check(outcome: Outcome, tarball: Path, facts: dict, git: GitStore, config: Config,
                    verified: dict | None, record: PackageRecord | None = None) -> Outcome:
    """The zoo's own rules on a valid outcome: the locked harness, then the static source rules.

    Call with the git lock held (HEAD's harness files are read). Sets
    ``harness_change`` for a maintainer's change, ``held`` for findings an admin must
    review; rejects HARNESS_LOCKED, RULE_VIOLATION, or NO_FLOOR for a case the physics
    floor cannot bound on this server (nothing it reported could be accepted). Records the desc's
    ``io_signature`` in ``facts`` for the physics floor. ``record``: the tarball as
    :func:`read_spooled` read it, with its source area (read here when not given).
    """
    kid = outcome.kernel_id
    limits = config.limits.contract_limits
    if record is None:
        record = read_package(tarball, limits)
    submitted = {name: record.data(f"{kid}/{KP}/{name}") for name in HARNESS_FILES}
    desc = record.mapping(f"{kid}/{KP}/{DESC}", contract_path(DESC)) or {}
    facts["io_signature"] = desc.get("io_signature")
    no_floor = physics.floorless(facts.get("metas") or [], facts["io_signature"], outcome.arch, config.physics)
    if no_floor is not None:
        return reject(kid, no_floor.code, no_floor.message, **no_floor.details)
    if not outcome.new_kernel:
        known = {DESC: facts["head_desc"]} if "head_desc" in facts else None  # policy_check read it
        changed = harness_lock.changed_files(harness_lock.head_harness(git, kid, known), submitted)
        if changed and not harness_lock.is_maintainer(kid, verified, config.maintainers):
            return reject(kid, "HARNESS_LOCKED", harness_lock.locked_message(kid, changed), files=changed,
                          urls=[f"/api/kernels/{kid}/files/{KP}/{name}" for name in changed])
        outcome.harness_change = bool(changed)
    rejecting, holding = screen(tarball, kid, desc, config.rules, limits, record)
    if rejecting:
        first = rejecting[0]
        return reject(kid, "RULE_VIOLATION", f"rule {first.rule}: {first.file}:{first.line}: {first.text} "
                      f"({RULES_BY_ID[first.rule].reason})", rule=first.rule,
                      evidence=[f.to_json() for f in rejecting + holding])
    outcome.held = [f.to_json() for f in holding]
    return outcome


class Intake:
    """Decides every spooled file; owns no state besides files (the log is the state)."""

    def __init__(self, config: Config, store: Store, git: GitStore, git_lock: Any,
                 clock_iso: Callable[[], str]) -> None:
        self.config = config
        self.store = store
        self.git = git
        self.git_lock = git_lock
        self.clock_iso = clock_iso
        self.dirs = SpoolDirs(config.paths.spool)
        self.pending_dir = config.paths.pending
        self._batch: list[tuple[list, Claimed]] = []  # decided, events not appended yet
        self._unsynced: set[Path] = set()  # folders holding new outcome folders, fsynced once per batch
        self._unsynced_docs: list[Path] = []  # new outcome JSONs: the file and its folder fsynced by flush
        self._batched: set[str] = set()
        self._skipped: set[tuple[str, str]] = set()  # inbox entries already logged as spool.skipped
        self._skip_lock = threading.Lock()
        self.unsettled = 0  # inbox files the last scan left for a writer to finish
        self._owed = False  # outcome folders whose events an append failed to write
        self._owed_lock = threading.Lock()
        self._backoff = 0.0
        self._retry_at = 0.0  # time.monotonic() before which a scan after a storage failure waits
        # one scan at a time: two (the intake thread and a caller of Zoo.scan_inbox) would both
        # claim the same work/ file, and the loser would read a tarball the winner moved on
        self._scan_lock = threading.Lock()

    # -- the scan --------------------------------------------------------------
    def scan_once(self) -> int:
        """Claim and decide every file in work/ and the inbox; returns how many were decided.

        Decisions are written file by file; their events are appended in batches of
        up to EMIT_BATCH files (one durable append instead of one per file). After a
        scan failed on storage (a full disk) the next one waits out a backoff (0 is
        returned meanwhile), then first emits the outcomes whose append failed.
        """
        with self._scan_lock:
            if time.monotonic() < self._retry_at:
                return 0
            try:
                count = self._scan()
            except OSError:  # StorageError included: the disk is full or failing
                self._backoff = min(RETRY_MAX_S, max(RETRY_MIN_S, self._backoff * 2))
                self._retry_at = time.monotonic() + self._backoff
                raise
            self._backoff = 0.0
            self._retry_at = 0.0
            return count

    def _scan(self) -> int:
        count = 0
        try:
            if self._owed:
                count += self.record_outcomes(live=True)
            for claimed in spool.claimed_files(self.dirs):
                self.process_guarded(claimed)
                count += 1
            known = self.store.knows
            unsettled = 0
            now = time.time()
            for path in spool.inbox_files(self.dirs, self._skip):
                if not spool.settled(path, now):  # a writer is still filling it in place
                    unsettled += 1
                    continue
                taken = spool.claim(self.dirs, path, lambda u: known(u) or self._outcome_exists(u)
                                    or u in self._batched, self.clock_iso)
                if taken is not None:
                    self.process_guarded(taken)
                    count += 1
            self.unsettled = unsettled
        finally:
            self.flush()
        return count

    def _skip(self, name: str, reason: str) -> None:
        """Log an inbox entry that is not a regular file, once per entry (name and kind)."""
        key = (name, reason)
        with self._skip_lock:  # the intake thread and a direct scan may meet the same entry
            if key in self._skipped:
                return
            self._skipped.add(key)
        try:
            self.store.emit(ev.SpoolSkipped(name=name, reason=reason))
        except BaseException:
            self._skipped.discard(key)  # not logged: the next scan tries again
            raise
        logger.warning("spool: left %r in the inbox alone: it is a %s, not a regular file", name, reason)

    def flush(self) -> None:
        """Append the events of the decided files in one go, then clean their work/ files."""
        batch, self._batch = self._batch, []
        self._batched.clear()
        if not batch:
            return
        try:
            # the batch's outcomes, durable before their events: each JSON and its folder, then
            # one fsync per parent folder (pending/, rejected/) for the new folders' names. Done
            # here for the batch, not file by file: the first fsync commits the journal with
            # everything the batch wrote, and the rest find little left to do.
            for doc in self._unsynced_docs:
                durable.fsync_path(doc)
                durable.fsync_dir(doc.parent)
            self._unsynced_docs.clear()
            for parent in sorted(self._unsynced):
                durable.fsync_dir(parent)
            self._unsynced.clear()
        except OSError:  # not written: their outcome folders are emitted by a later scan
            self._owed = True
            raise
        try:
            self.store.emit(*[e for events, _c in batch for e in events])
        except StorageError:  # not written: their outcome folders are emitted by a later scan
            self._owed = True
            raise
        except ReducerError:  # one bad apple: append them one by one (the rest still go in)
            for events, _claimed in batch:
                try:
                    self.store.emit(*events)
                except StorageError:
                    self._owed = True
                    raise
                except ReducerError as exc:
                    logger.error("intake events refused: %s", exc)
        for _events, claimed in batch:
            self._cleanup(claimed)

    def process_guarded(self, claimed: Claimed) -> None:
        """:meth:`process`, but a file that makes the checks crash is rejected (INTAKE_FAILED), not retried forever."""
        try:
            self.process(claimed)
        except (StoreBroken, StoreClosed, OSError):
            raise  # the daemon's own trouble: the next scan retries this file
        except Exception as exc:  # a poison file must not block the spool
            if self.store.knows(claimed.uuid):
                raise
            meta = dict(claimed.meta)
            meta.setdefault("sha256", "0" * 64)
            outcome = reject(str(meta.get("kernel_id") or ""), "INTAKE_FAILED",
                             f"the checks failed on this file ({type(exc).__name__}); the operator's log "
                             "has the details", error=f"{type(exc).__name__}: {exc}"[:500])
            self._record(claimed.uuid, meta, outcome, claimed.tarball, {})
            self._queue_events(claimed, meta, outcome)

    def _outcome_exists(self, sub_uuid: str) -> bool:
        return (self.pending_dir / sub_uuid).exists() or (self.dirs.rejected / sub_uuid).exists()

    def process(self, claimed: Claimed) -> None:
        """Decide one claimed file, write its outcome folder, emit its events, clean up."""
        sub_uuid = claimed.uuid
        if self.store.knows(sub_uuid):  # decided before a crash
            self._cleanup(claimed)
            return
        meta = dict(claimed.meta)
        meta["sha256"] = _file_sha256(claimed.tarball) if claimed.tarball.is_file() else "0" * 64
        meta["size"] = claimed.tarball.lstat().st_size if claimed.tarball.exists() else 0
        record = read_spooled(claimed.tarball, self.config.limits)  # the one read of the file
        outcome, facts = validate_file(claimed.tarball, meta.get("filename", ""),
                                       self.config.limits, meta.get("kernel_id"), record)
        if meta.get("sidecar_error") and outcome.ok:
            outcome = reject(outcome.kernel_id, "SIDECAR_INVALID", meta["sidecar_error"])
        if outcome.ok:
            verified = harness_lock.read_verified(self.config.state_dir, sub_uuid)
            with self.git_lock:
                outcome = policy_check(outcome, facts, self.git, self.config.policy.allow_new_packages, record)
                if outcome.ok:
                    outcome = integrity_check(outcome, claimed.tarball, facts, self.git, self.config, verified,
                                              record)
        self._record(sub_uuid, meta, outcome, claimed.tarball, facts)
        self._queue_events(claimed, meta, outcome)

    def _queue_events(self, claimed: Claimed, meta: dict, outcome: Outcome) -> None:
        self._batch.append((self._events(claimed.uuid, meta, outcome), claimed))
        self._batched.add(claimed.uuid)
        if len(self._batch) >= EMIT_BATCH:
            self.flush()

    def _record(self, sub_uuid: str, meta: dict, outcome: Outcome, tarball: Path, facts: dict) -> None:
        doc: dict[str, Any] = {"uuid": sub_uuid, "received": meta, "outcome": outcome.__dict__}
        if outcome.ok:
            folder = self.pending_dir / sub_uuid
            doc["metas"] = facts.get("metas")
            doc["io_signature"] = facts.get("io_signature")
            name = SUBMISSION_FILE
        else:
            folder = self.dirs.rejected / sub_uuid
            doc = {"uuid": sub_uuid, "code": outcome.code, "message": outcome.message,
                   "details": outcome.details, "received": meta, "outcome": outcome.__dict__}
            name = REASON_FILE
        folder.mkdir(parents=True, exist_ok=True)
        # not fsynced here: flush makes the batch durable before its events (a crash before
        # that leaves a folder record_outcomes hands back to work/, to be decided again)
        durable.atomic_write_json(folder / name, doc, fsync=False)
        if tarball.exists() or tarball.is_symlink():
            os.replace(tarball, folder / PACKAGE_FILE)
        self._unsynced_docs.append(folder / name)  # the JSON and the tarball: fsynced by flush
        self._unsynced.add(folder.parent)  # the new folder's own name: fsynced by flush, before the events

    def _emit(self, sub_uuid: str, meta: dict, outcome: Outcome) -> None:
        self.store.emit(*self._events(sub_uuid, meta, outcome))

    def _events(self, sub_uuid: str, meta: dict, outcome: Outcome) -> list:
        received = ev.SubmissionReceived(
            uuid=sub_uuid, kernel_id=outcome.kernel_id, submitter_id=str(meta.get("submitter_id") or "unknown"),
            source="http" if meta.get("source") == "http" else "spool",
            filename=str(meta.get("filename", "")), size=int(meta.get("size", 0)),
            sha256=str(meta.get("sha256", "0" * 64)), idempotency_key=_key_of(meta))
        if outcome.ok:
            validated = ev.SubmissionValidated(uuid=sub_uuid, kernel_id=outcome.kernel_id, arch=outcome.arch,
                                               new_kernel=outcome.new_kernel, warnings=list(outcome.warnings),
                                               harness_change=outcome.harness_change)
            if outcome.held:
                return [received, validated,
                        ev.SubmissionHeld(uuid=sub_uuid, rules=sorted({f["rule"] for f in outcome.held}),
                                          evidence=list(outcome.held))]
            return [received, validated,
                    ev.JobQueued(uuid=sub_uuid, kernel_id=outcome.kernel_id, arch=outcome.arch)]
        return [received,
                ev.SubmissionRejected(uuid=sub_uuid, stage="intake", code=outcome.code,
                                      message=outcome.message, details=outcome.details)]

    def _cleanup(self, claimed: Claimed) -> None:
        (self.dirs.work / f"{claimed.uuid}{spool.SIDECAR_SUFFIX}").unlink(missing_ok=True)
        harness_lock.forget_verified(self.config.state_dir, claimed.uuid)
        if claimed.tarball.exists() and self.store.knows(claimed.uuid):
            claimed.tarball.unlink()

    def knows(self, sub_uuid: str) -> bool:
        """Whether the spool holds ``sub_uuid`` (in the inbox, claimed, or decided) though the log may not yet.

        A few stats, no listing: the status endpoint asks it for a uuid the log lacks.
        """
        if not spool.is_uuid(sub_uuid):
            return False
        candidates = (self.dirs.inbox / f"{sub_uuid}{spool.SIDECAR_SUFFIX}",
                      self.dirs.work / f"{sub_uuid}{spool.TARBALL_SUFFIX}",
                      self.dirs.work / f"{sub_uuid}{spool.SIDECAR_SUFFIX}",
                      self.pending_dir / sub_uuid / SUBMISSION_FILE,
                      self.dirs.rejected / sub_uuid / REASON_FILE)
        return any(path.exists() for path in candidates)

    def record_outcomes(self, live: bool = False) -> int:
        """Emit the events of outcome folders the log lacks; returns how many.

        At start-up they come from a crash between the outcome write and the append;
        while running (``live``), from an append that failed (a full disk), and then
        each one's leftover ``work/`` sidecar goes once its events are written.
        """
        with self._owed_lock:  # the intake thread and a direct scan must not emit one twice
            self._owed = True  # until the whole pass went through
            count = 0
            for base, name in ((self.pending_dir, SUBMISSION_FILE), (self.dirs.rejected, REASON_FILE)):
                if not base.exists():
                    continue
                durable.fsync_dir(base)  # the folders' names are durable before their events
                # finished submissions are in the history projection: ask once, in batches
                for sub_uuid in self.store.unknown(sorted(u for u in os.listdir(base) if spool.is_uuid(u))):
                    doc_path = base / sub_uuid / name
                    if (self.dirs.work / f"{sub_uuid}{spool.TARBALL_SUFFIX}").exists():
                        continue  # the work/ scan decides it (again)
                    doc = _outcome_doc(doc_path)
                    if doc is None:  # the decision never became durable, so no event names it
                        self._undecide(base / sub_uuid)
                        continue
                    durable.fsync_path(doc_path)  # durable before its events, as flush makes them
                    durable.fsync_dir(doc_path.parent)
                    try:
                        self._emit(sub_uuid, doc["received"], Outcome(**doc["outcome"]))
                    except ReducerError as exc:
                        logger.error("intake events of %s refused: %s", sub_uuid, exc)
                        continue
                    count += 1
                    if live:
                        self._cleanup(Claimed(sub_uuid, self.dirs.work / f"{sub_uuid}{spool.TARBALL_SUFFIX}", {}))
            self._owed = False
        return count

    def _undecide(self, folder: Path) -> None:
        """Hand an outcome folder whose decision was not durable back to ``work/`` (its tarball) to be decided again."""
        package = folder / PACKAGE_FILE
        if not (package.exists() or package.is_symlink()):
            return  # the tarball never moved in: it is still in work/ or the inbox
        sub_uuid = folder.name
        logger.warning("intake: the decision on %s was cut short by a crash; deciding it again", sub_uuid)
        os.replace(package, self.dirs.work / f"{sub_uuid}{spool.TARBALL_SUFFIX}")
        durable.fsync_dir(self.dirs.work)
        shutil.rmtree(folder, ignore_errors=True)
        durable.fsync_dir(folder.parent)

    # -- start-up --------------------------------------------------------------
    def recover(self) -> int:
        """Emit the events of outcome folders the log lacks (a crash after the write); returns how many."""
        count = self.record_outcomes()
        spool.remove_orphan_work_meta(self.dirs)
        return count


def _key_of(meta: dict) -> str | None:
    """The sidecar's Idempotency-Key when it is a valid one (a hand-written sidecar may hold anything)."""
    key = meta.get("idempotency_key")
    return key if isinstance(key, str) and idempotency.key_error(key) is None else None


def _outcome_doc(path: Path) -> dict | None:
    """An outcome folder's JSON, or None when it is absent or not a whole JSON object (a crash cut it short)."""
    try:
        doc = json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("received"), dict) \
        and isinstance(doc.get("outcome"), dict) else None


def _file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()

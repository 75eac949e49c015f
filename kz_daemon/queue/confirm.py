"""Confirmation runs: a claimed new best, and every first record, is measured again, beside the reference.

**When.** A reported result that accepts is compared with the kernel's scorecard at HEAD.
It is run a second time before anything is committed when (a) a case's primary metric
beats that case's recorded best (a non-seed ``metrics_best`` record, in the metric's
declared direction) by more than the margin of the submission's lane
(``confirmation.margin`` for GPU arches, ``confirmation.cpu_margin`` for ``cpu``; relative:
new/best beyond 1 + margin for ``higher_better``, best/new for ``lower_better``), or (b) the
kernel has no non-seed record yet: its first record (``confirmation.first_records``), on
every lane. ``job.confirmation_requested`` puts the job back in the queue as a new attempt
of the same submission, and the runner of the first result may not claim it for
``confirmation.exclusive_s`` seconds (then any runner of the arch may, so a zoo with one
runner still makes progress). An unverified result is never confirmed: it never becomes a best.

**Beside the reference.** The confirmation job's package carries the operator's reference
kernel (:mod:`kz_daemon.queue.reference`): the candidate's benchmark times the candidate
and the reference alternately in the same run, with the same harness and the same input
distribution, and reports per case ``reference_ratio`` (the candidate's primary metric over
the reference's). The host's speed is a common factor of both, so it cancels: a ratio
measured on a loaded CPU host means what it means on a quiet one, which is what lets the
CPU lane confirm at all. When the reference's source lacks the candidate's kernel (another
module or function name) the harness times the kernel the reference's own benchmark names;
when there is none the result says ``reference: unavailable`` and the agreement falls back
to the absolute comparison below. When no kernel of the operator is measured yet (a fresh
zoo: the seeded examples hold placeholders), the reference is chosen among the kernels at
HEAD without a record, and the *first* run of the first record carries it as well: both runs
measure a ratio, and those two ratios are compared (``reference.in_first_run``). On the CPU
lane every first run that may be confirmed carries it, recorded or not: the ratio implied by
the first run's figure and the reference's record spans two jobs, and a shared host's speed
moves between jobs by more than the agreement, so only a ratio measured in each run cancels it.

**Agreement.** The confirmation run is stored beside the first
(``runs/<uuid>/confirm-result.json``; the first stays ``runs/<uuid>/result.json``). The two
agree when both accept, every case's correctness is ``passed`` in both (the case's own
correctness tolerance, applied by the package's benchmark, governs the outputs), and for
each case: with a measured ratio, the first run's *implied* ratio (its value over the
reference's recorded value at HEAD, the one kept with the choice) and the confirmation's
measured ratio differ by at most ``confirmation.agreement`` (``cpu_agreement`` on the CPU
lane) relative to the implied one; where both runs measured a ratio (the CPU lane, an
unrecorded reference), the confirmation's ratio and the first run's differ by at most that
much relative to the first's, and this comparison comes first; without any, the two runs' primary metrics differ by at most that much
relative to the first run's value. Only a confirmation *worse* than the first
run (in the metric's direction) can disagree: a confirmation that measured the kernel faster
says the first figure was not inflated, and the slower of the two is committed anyway, so
there is nothing to gain by a slow first run. On a fresh `kz up` on a loaded 2-core host an
unchanged copy of the CPU softmax was refused because its confirmation was three times faster
than its first run (4360 us, then 1355 us). Within each other's noise counts as agreeing
too: the two 95 % intervals of the median (a case summary's ``lo``/``hi``; the ratio's over its
rounds) overlap. An honest CPU case on a loaded 2-core host moved 29 % between two jobs, its
intervals overlapping, and was rejected before this. Otherwise the submission is rejected with
``CONFIRMATION_MISMATCH`` and both results are kept. When they agree the accept saga commits
the slower of the two (see :func:`committed_choice`): the conservative record.

What it catches: a first run whose figure the judge could not see through (a runner that
reported more than it measured, a kernel fast only when it is not looked at twice) against
a second run on another runner. A consistent cheat that fakes speed in ways the judge
cannot see agrees with itself, in ratios as in absolute figures; the ratio is about noise,
not cheats: it lets an honest CPU result be confirmed on a shared host.

Everything here decides from the log and the stored files, so start-up recovery
(:func:`recover`) takes the same decision for a report whose verdict a crash lost.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from kz_daemon.config.ports import Daemon
from kz_daemon.core import scorecard
from kz_daemon.core.verdicts import BenchmarkResult, CaseSummaryDoc, Summarize, Verdict
from kz_daemon.guards import unconfined
from kz_daemon.queue import reference
from kz_daemon.storage.pending import RESULT_FILE, PendingStore, StoredRun
from kz_events import events as ev
from kz_events.state import State, Submission
from kz_events.status import Status
from kz_runner.contract.layout import BENCH_RESULT, KP, is_seed_sha

__all__ = ["CONFIRM_RESULT_FILE", "MISMATCH", "is_confirmation_run", "beyond_margin", "first_record",
           "needs_confirmation", "measured_ratios", "disagreement",
           "committed_choice", "store_run", "load_confirm_result", "committed_result", "verdict_events",
           "excluded", "recover"]

CONFIRM_PREFIX = "confirm-"  # a confirmation run's files sit beside the first run's, so prefixed
CONFIRM_RESULT_FILE = CONFIRM_PREFIX + RESULT_FILE
MISMATCH = "CONFIRMATION_MISMATCH"


def is_confirmation_run(sub: Submission) -> bool:
    """Whether the next report of ``sub`` is its confirmation run (requested, not yet reported)."""
    result = sub.result or {}
    return "confirmation" in result and "first" not in result


def _directions(metas: list[dict]) -> dict[str, tuple[str | None, str]]:
    """test_case_id -> (primary metric, its direction)."""
    out: dict[str, tuple[str | None, str]] = {}
    for meta in metas or []:
        primary = meta.get("primary_metric")
        direction = next((m.get("direction", "lower_better") for m in meta.get("metrics", [])
                          if m.get("name") == primary), "lower_better")
        out[str(meta.get("test_case_id"))] = (primary, str(direction))
    return out


def _ahead(value: float, best: float, direction: str) -> float:
    """How many times better ``value`` is than ``best`` (inf when the ratio has no finite value)."""
    num, den = (best, value) if direction == "lower_better" else (value, best)
    if den <= 0:
        return math.inf if num > 0 else 1.0
    return num / den


def beyond_margin(card: dict | None, metas: list[dict], cases: Sequence[CaseSummaryDoc],
                  margin: float) -> str | None:
    """Why the run needs a confirmation (the first case beyond the margin), or None.

    ``cases`` are the run's per-case summaries (``accept.case_summary``); ``card`` is the
    scorecard at HEAD. Seed records and cases without a value never trigger one.
    """
    if margin <= 0 or not card:
        return None
    primaries = _directions(metas)
    bests = {c.get("test_case_id"): c.get("metrics_best") or {} for c in card.get("cases", []) or []}
    for case in cases:
        cid = case["test_case_id"]
        primary, direction = primaries.get(cid, (None, "lower_better"))
        record = bests.get(cid, {}).get(primary) if primary else None
        value = case.get("value")
        if not isinstance(record, dict) or is_seed_sha(str(record.get("commit_sha", ""))) or value is None:
            continue
        try:
            best = float(record["value"])
        except (KeyError, TypeError, ValueError):
            continue
        ratio = _ahead(float(value), best, direction)
        if ratio > 1.0 + margin:
            return (f"{cid}: {primary} {value} against the recorded best {best} "
                    f"({ratio:.3g}x, more than the {margin:g} margin)")
    return None


def first_record(card: dict | None) -> bool:
    """Whether a kernel's scorecard holds no measurement yet: no scorecard, or only seed records."""
    for case in (card or {}).get("cases") or []:
        for key in ("metrics_best", "metrics_current"):
            for record in (case.get(key) or {}).values():
                if isinstance(record, dict) and not is_seed_sha(str(record.get("commit_sha", ""))):
                    return False
    return True


def needs_confirmation(card: dict | None, metas: list[dict], cases: Sequence[CaseSummaryDoc], margin: float,
                       first_records: bool, kernel_id: str = "") -> str | None:
    """Why the run needs a confirmation run (a first record, or a case beyond the margin), or None."""
    if first_records and first_record(card) and any(c.get("value") is not None for c in cases):
        return f"the first record of {kernel_id or 'the kernel'} (no measured record yet)"
    return beyond_margin(card, metas, cases, margin)


def measured_ratios(result: BenchmarkResult | None, choice: dict | None) -> dict[str, dict]:
    """test_case_id -> the confirmation result's ``reference_ratio``, when it measured the chosen reference.

    Empty when no reference was chosen, the result says ``reference: unavailable``, or it names
    another kernel or commit than the stored choice (a package built before the choice changed).
    """
    if not isinstance(result, dict) or not choice or "unavailable" in choice:
        return {}
    ref = result.get("reference")
    if not isinstance(ref, dict) or ref.get("status") != "measured" or \
            ref.get("kernel_id") != choice.get("kernel_id") or ref.get("commit") != choice.get("commit"):
        return {}
    out = {}
    cases = result.get("cases")
    for case in cases if isinstance(cases, list) else []:
        ratio = case.get("reference_ratio") if isinstance(case, dict) else None
        if isinstance(ratio, dict) and isinstance(ratio.get("value"), (int, float)) and ratio["value"] > 0 \
                and math.isfinite(ratio["value"]):
            out[str(case.get("test_case_id"))] = ratio
    return out


def disagreement(first: Sequence[CaseSummaryDoc], second: Sequence[CaseSummaryDoc], metas: list[dict],
                 agreement: float,
                 ratios: dict[str, dict] | None = None, recorded: dict[str, float] | None = None,
                 first_ratios: dict[str, dict] | None = None, host_spread: float = 1.0) -> list[str]:
    """What keeps two runs' case summaries from agreeing (empty: they agree).

    ``ratios``: the confirmation's measured ``reference_ratio`` per case. Where the first run
    measured one too (``first_ratios``: the reference timed in both runs), the two measured
    ratios are compared; else, with ``recorded`` (the reference's recorded primary value per
    case), the first value over the recorded one (the implied ratio) is compared with the
    measured ratio. Any other case compares the two runs' primary metrics.

    Where both runs measured a ratio, each run's figure over its ratio is the reference's
    figure in that run: the same trusted source timed twice, so it differs only by the host's
    speed. A first run whose figures put the reference more than ``1 + host_spread`` times
    ahead of the confirmation's disagrees: a runner that reports more than it ran, keeping
    the ratio, makes the reference look faster than a host's change between jobs does.
    """
    problems = []
    ratios, recorded, first_ratios = ratios or {}, recorded or {}, first_ratios or {}
    primaries = _directions(metas)
    seconds = {c["test_case_id"]: c for c in second}
    for case in first:
        cid = case["test_case_id"]
        other = seconds.get(cid)
        if other is None:
            problems.append(f"{cid}: missing from the confirmation run")
            continue
        for label, run in (("first", case), ("confirmation", other)):
            if run.get("correctness") != "passed":
                problems.append(f"{cid}: correctness {run.get('correctness')} in the {label} run")
        a, b = case.get("value"), other.get("value")
        primary = primaries.get(cid, (case.get("primary_metric"),))[0]
        if a is None or b is None:
            problems.append(f"{cid}: {primary} not measured in both runs")
            continue
        direction = primaries.get(cid, (None, "lower_better"))[1]
        if cid in ratios and cid in first_ratios:
            before, after = float(first_ratios[cid]["value"]), float(ratios[cid]["value"])
            apart = _worse_by(before, after, direction)
            if apart > agreement and not _overlap(_ratio_range(first_ratios[cid]), _ratio_range(ratios[cid])):
                problems.append(f"{cid}: {primary} measured {before:.4g}x the reference in the first run, "
                                f"{after:.4g}x in the confirmation run ({apart:.3g} apart, agreement {agreement:g})")
            ref_first, ref_second = a / before, b / after
            if (host := _ahead(ref_first, ref_second, direction)) > 1.0 + host_spread:
                problems.append(f"{cid}: the first run's figures put the reference at {ref_first:.4g} {primary}, "
                                f"{host:.3g}x ahead of the {ref_second:.4g} the confirmation run measured (a host "
                                f"changes speed between jobs by at most {1.0 + host_spread:g}x, host_spread)")
        elif cid in ratios and recorded.get(cid):
            implied, measured = a / recorded[cid], float(ratios[cid]["value"])
            apart = _worse_by(implied, measured, direction)
            first_range = _range(case, 1.0 / recorded[cid])
            if apart > agreement and not _overlap(first_range, _ratio_range(ratios[cid])):
                problems.append(f"{cid}: {primary} {a} is {implied:.4g}x the reference's record {recorded[cid]}, "
                                f"but the confirmation measured {measured:.4g}x the reference in one run "
                                f"({apart:.3g} apart, agreement {agreement:g})")
        elif a == b or _overlap(_range(case), _range(other)):
            continue  # within each other's noise: the runs' 95 % intervals of the median overlap
        elif (spread := _worse_by(a, b, direction)) > agreement:
            problems.append(f"{cid}: {primary} {a} then {b} ({spread:.3g} apart, agreement {agreement:g})")
    return problems


def _worse_by(first: float, second: float, direction: str) -> float:
    """How much worse ``second`` is than ``first``, relative to ``first``, in the metric's direction (0 if better)."""
    if first == 0:
        return 0.0 if second == first else math.inf
    worse = second - first if direction == "lower_better" else first - second
    return max(0.0, worse / abs(first))


def _range(case: CaseSummaryDoc, scale: float = 1.0) -> tuple[float, float] | None:
    """A case summary's 95 % interval of its primary value (``lo``, ``hi``), scaled; None without one."""
    lo, hi = case.get("lo"), case.get("hi")
    if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float))) or not lo <= hi:
        return None
    return float(lo) * scale, float(hi) * scale


def _ratio_range(ratio: dict) -> tuple[float, float] | None:
    lo, hi = ratio.get("lo"), ratio.get("hi")
    if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float))) or not lo <= hi:
        return None
    return float(lo), float(hi)


def _overlap(x: tuple[float, float] | None, y: tuple[float, float] | None) -> bool:
    """Whether two intervals share a point (False when either is unknown)."""
    return x is not None and y is not None and x[0] <= y[1] and y[0] <= x[1]


def committed_choice(first: Sequence[CaseSummaryDoc], second: Sequence[CaseSummaryDoc],
                     metas: list[dict]) -> str:
    """'first' or 'confirm': the slower run, whose record is the conservative one.

    Slower means: the geometric mean over cases of its primary metric against the
    other run's, in each metric's direction, is worse; a tie keeps the first run.
    """
    primaries = _directions(metas)
    seconds = {c["test_case_id"]: c for c in second}
    log_sum = 0.0
    for case in first:
        other = seconds.get(case["test_case_id"])
        a, b = case.get("value"), other.get("value") if other is not None else None
        if a is None or b is None or a <= 0 or b <= 0:
            continue
        direction = primaries.get(case["test_case_id"], (None, "lower_better"))[1]
        worse = b / a if direction == "lower_better" else a / b   # > 1: the confirmation is slower
        log_sum += math.log(worse)
    return "confirm" if log_sum > 0 else "first"


# -- the stored runs ----------------------------------------------------------------------
def store_run(pending: PendingStore, sub: Submission, result: dict | None, logs: bytes, env: dict,
              failure: dict | None) -> StoredRun:
    """Store a report: the first run as ``result.json``, the confirmation run beside it."""
    prefix = CONFIRM_PREFIX if is_confirmation_run(sub) else ""
    return pending.store_run(sub.uuid, result, logs, env, failure, prefix)


def load_confirm_result(pending: PendingStore, sub_uuid: str) -> BenchmarkResult | None:
    """The stored confirmation result (FileNotFoundError when there is none)."""
    return pending.load_result(sub_uuid, CONFIRM_PREFIX)


def committed_result(pending: PendingStore, sub_uuid: str, metas: list[dict],
                     summarize: Summarize | None = None) -> BenchmarkResult | None:
    """The result the accept saga commits: the first, or the slower of the two when confirmed.

    A pure function of the two stored files, so a restarted saga commits the same bytes.
    ``summarize(result, metas)`` is ``accept.case_summary`` (passed in: accept imports this module).
    """
    first = pending.load_result(sub_uuid)
    try:
        second = load_confirm_result(pending, sub_uuid)
    except FileNotFoundError:
        return first
    if summarize is None:
        return first
    choice = committed_choice(summarize(first, metas), summarize(second, metas), metas)
    return second if choice == "confirm" else first


# -- the decision after a report -----------------------------------------------------------
def verdict_events(zoo: Daemon, sub: Submission, run: StoredRun, cases: list[CaseSummaryDoc], metas: list[dict],
                   verdict: Verdict, runner_id: str, lease_id: str, confirming: bool,
                   summarize: Summarize) -> list:
    """The events that follow ``result.reported``: accept.started, a confirmation request or a rejection.

    ``verdict`` is ``accept.verdict_of``'s for this
    run; ``cases`` its case summaries; ``confirming`` whether it is the confirmation run.
    Call with ``zoo.lock`` held.
    """
    accepted, code, message, details, _invalid = verdict
    settings = zoo.config.confirmation
    arch = sub.arch or sub.kernel_id.split("/", 1)[0]  # the kernel id starts with the arch
    if confirming:
        first = pending_first(zoo, sub.uuid, metas, summarize)
        choice = reference.load(zoo.pending, sub.uuid)
        ratios = measured_ratios(run.result, choice)
        recorded = {k: float(v) for k, v in ((choice or {}).get("values") or {}).items()} if ratios else {}
        first_ratios = measured_ratios(_first_result(zoo, sub.uuid), choice) if ratios else {}
        problems = [] if accepted else [f"the confirmation run did not accept: {code}: {message}"]
        problems += disagreement(first, cases, metas, settings.agreement_for(arch), ratios, recorded,
                                 first_ratios, settings.host_spread) \
            if first is not None else ["the first result is no longer stored"]
        if problems:
            ref: dict[str, object] = {k: choice[k] for k in ("kernel_id", "commit", "unavailable") if k in choice} \
                if choice else {}
            ref["ratios"] = "measured" if ratios else "unavailable"
            return [ev.SubmissionRejected(
                uuid=sub.uuid, stage="result", code=MISMATCH,
                message="the confirmation run does not agree with the first run: " + "; ".join(problems[:5]),
                details={"problems": problems, "confirmation_code": code or None, "reference": ref,
                         "results": ["result.json", CONFIRM_RESULT_FILE]})]
    elif not accepted:
        return [ev.SubmissionRejected(uuid=sub.uuid, stage="result", code=code or "PACKAGE_REJECTED",
                                      message=message, details=details)]
    else:
        with zoo.git_lock:
            card = scorecard.load(zoo.git.read_file(f"{sub.kernel_id}/{KP}/{BENCH_RESULT}"))
        reason = needs_confirmation(card, metas, cases, settings.margin_for(arch), settings.first_records,
                                    sub.kernel_id)
        # an unverified result never becomes a best: a second run could not change what it records
        unverified = isinstance(run.result, dict) and run.result.get("measurement") == "unverified"
        if reason is not None and not unverified:
            return [ev.JobConfirmationRequested(
                uuid=sub.uuid, runner_id=runner_id, lease_id=lease_id, result_sha256=run.sha256,
                reason=reason, exclusive_until=float(zoo.clock()) + settings.exclusive_s)]
    with zoo.git_lock:
        base = zoo.git.head()
    return [ev.AcceptStarted(uuid=sub.uuid, kernel_id=sub.kernel_id, base_head=base)]


def _first_result(zoo: Daemon, sub_uuid: str) -> BenchmarkResult | None:
    """The first run's stored result document (None when its file is gone or unreadable)."""
    try:
        return zoo.pending.load_result(sub_uuid)
    except (FileNotFoundError, ValueError):
        return None


def pending_first(zoo: Daemon, sub_uuid: str, metas: list[dict], summarize: Summarize) -> list[CaseSummaryDoc] | None:
    """The case summaries of the first run (None when its file is gone)."""
    try:
        return summarize(zoo.pending.load_result(sub_uuid), metas)
    except (FileNotFoundError, ValueError):
        return None


# -- the queue -------------------------------------------------------------------------------
def excluded(state: State, runner_id: str, now: float) -> list[str]:
    """Pending uuids ``runner_id`` may not claim now: kernels whose confirmation run is not yet its to take.

    A confirmation job is back at the front of its kernel's line (its place is its first
    queueing), so only the first pending job of each waiting kernel is looked at.
    """
    out: list[str] = []
    subs = state.submissions
    for kid in state.queue.waiting_kernels:
        pending = state.kernels[kid].pending
        result = subs[pending[0]].result
        if not result or "confirmation" not in result or "first" in result:
            continue
        conf = result["confirmation"]
        if conf["runner_id"] == runner_id and now < conf["exclusive_until"]:
            out.extend(pending)
    return out


# -- start-up recovery --------------------------------------------------------------------------
#: ``accept.verdict_of``: (zoo, submission, result, failure, metas, facts) -> its verdict
JudgeRun = Callable[[Daemon, Submission, BenchmarkResult | None, dict | None, list[dict], dict | None], Verdict]


def recover(zoo: Daemon, judge: JudgeRun, summarize: Summarize) -> list[str]:
    """Give every result logged without its verdict (a torn append) the verdict a live report gives.

    ``judge(zoo, sub, result, failure, metas, facts)`` is ``accept.verdict_of`` (the hard checks
    and the physics floor; passed in: accept imports this module). Step 4 of start-up
    recovery (``kz_daemon.ops.recovery``), before the sagas are finished; returns the uuids decided.
    """
    decided = []
    with zoo.store.lock:
        state = zoo.store.state
        waiting = [s for s in state.submissions.values()
                   if s.status == Status.RUNNING and s.result is not None and s.uuid not in state.queue.in_flight]
    for sub in waiting:
        confirming = "first" in sub.result
        facts = zoo.pending.read_submission(sub.uuid)  # read once: the judge's physics floor needs it too
        metas = facts.get("metas") or []
        run = zoo.pending.load_run(sub.uuid, CONFIRM_PREFIX if confirming else "")
        run = StoredRun(run.result, sub.result["result_sha256"], run.failure)
        verdict = unconfined.refuse(judge(zoo, sub, run.result, run.failure, metas if not run.failure else [], facts),
                                    zoo.pending.load_env(sub.uuid, CONFIRM_PREFIX if confirming else ""))
        cases = summarize(run.result, metas) if isinstance(run.result, dict) else []
        with zoo.lock:
            events = verdict_events(zoo, sub, run, cases, metas, verdict, sub.runner_id, sub.lease_id,
                                    confirming, summarize)
            zoo.store.emit(*events)
        decided.append(sub.uuid)
    return decided

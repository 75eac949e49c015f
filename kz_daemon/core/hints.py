"""What to do about each code a submission's ``reasons[]`` can carry: the fix hint the API sends.

``kz dry-run`` and ``kz validate`` get their advice from the contract's tables
(``kz_runner.contract.codes.CODES`` for package and tarball problems,
``kz_runner.contract.checks.HINTS`` for the checks on the benchmark output). The
daemon answers with the same words for those codes and adds, in :data:`DAEMON_HINTS`,
the codes only a run or the daemon produces (runner failures, the harness library's
integrity codes, intake policies, the queue and the accept saga). :func:`hint_for`
is the one lookup; every ``reasons[]`` entry of a status document goes through it.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kz_runner.contract.checks import HINTS as RESULT_HINTS
from kz_runner.contract.codes import CODES

__all__ = ["DAEMON_HINTS", "PUBLIC_MESSAGES", "hint_for", "public_reason", "with_hint"]

_INTEGRITY = ("Use kz_runner.bench.Harness as shipped and let it time, sync and check the kernel; "
              "run `kz dry-run` locally, which applies the same checks.")

#: code -> what to do, for codes the contract's tables do not hold.
DAEMON_HINTS: dict[str, str] = {
    # runner failures (the wire protocol's failure codes)
    "UNPACK_FAILED": "The runner could not unpack the package: pack it with `kz pack` and check it with "
                     "`kz validate package.tar.gz`.",
    "BUILD_TIMEOUT": "build_test_env.py ran past the build time limit: generate smaller inputs or fewer "
                     "cases, and time it locally with `kz dry-run`.",
    "BENCHMARK_TIMEOUT": "benchmark.py ran past the benchmark time limit: fewer trials or smaller cases; "
                         "time it locally with `kz dry-run`.",
    "BENCHMARK_CRASHED": "benchmark.py exited with an error before printing its JSON: read the benchmark "
                         "log tail (logs_url) and reproduce with `kz dry-run`.",
    "MEMORY_LIMIT": "A step (build_test_env.py or benchmark.py, with every process it started) used more host "
                    "memory than the runner allows and was stopped: generate smaller inputs, free what you no "
                    "longer need, and measure its peak locally (e.g. `/usr/bin/time -v python "
                    ".kernel_package/build_test_env.py DIR`).",
    "INTEGRITY_ERROR": "Do not modify the files build_test_env.py produced or .kernel_package/ during the "
                       "benchmark, and print the same result on stdout as the harness reports.",
    "RUNNER_FAILURE": "The runner reported a failure without a code: read the log tails (logs_url) and "
                      "submit again; tell the operator when it repeats.",
    # the harness library's integrity codes
    "TIMER_TAMPERED": "Do not replace or wrap clocks, events or synchronisation functions; " + _INTEGRITY,
    "UNSYNCED_WORK": "Run all of the kernel's work on the stream the harness times and do not return "
                     "before it finished; " + _INTEGRITY,
    "THREAD_LEAK": "Join every thread and process you start before the timed call returns; " + _INTEGRITY,
    "OUTPUT_TYPE": "Return exactly the expected array type, dtype and shape from the timed call.",
    # the judge's codes (the trusted process that times the kernel from outside it)
    "WRONG_OUTPUT": "The judge compared a secretly chosen sample of the timed calls with the reference and one "
                    "differed: compute every call's output from that call's inputs, never a kept or partial "
                    "result; reproduce with `kz dry-run`.",
    "PROTOCOL_ERROR": "The kernel's worker broke its exchange with the judge (a forged or garbled message): do not "
                      "write to the worker's stdin, sockets or inherited descriptors; " + _INTEGRITY,
    "MACHINE_BUSY": "The runner's host was too loaded for the judge's clock to mean anything, so the timing "
                    "was void: nothing to fix in your source; submit again.",
    "STALE_OUTPUT": "Compute the output on every call; never return a cached or previous trial's result.",
    "TIMED_MISMATCH": "The timed call must compute the same result as the checked call: no shortcuts "
                      "when being timed.",
    "WEAK_TRIALS": "The kernel's benchmark.py cannot tell a kept result from a computed one (its trial "
                   "inputs do not change the expected output, or it gives no reference=): its maintainer "
                   "must pass c.time a reference= and a vary= that changes the result; nothing in your source.",
    "HARNESS_ERROR": "The benchmark harness failed: read the benchmark log tail (logs_url); check the "
                     "inputs you pass to kz_runner.bench and run `kz dry-run`.",
    "HARNESS_LOCKED": "Keep the harness files of an existing package as they are in the repo (or ask "
                      "the operator to review a change to them).",
    "RULE_VIOLATION": "The package breaks one of the zoo's rules named in the message: fix the code it "
                      "points at and run `kz dry-run`.",
    "CONFIRMATION_MISMATCH": "A second run did not confirm the first one's figures: make the benchmark "
                             "deterministic and stable (warm-up, enough trials) and submit again.",
    # intake
    "PACKAGE_FROZEN": "The package is frozen and takes no submissions: submit to another kernel_id, or "
                      "use status: normal in desc.yaml for a new package.",
    "NEW_PACKAGE_NOT_ALLOWED": "This zoo takes no new packages: submit to an existing kernel_id "
                               "(GET /api/kernels lists them) or ask the operator.",
    "VALIDATION_ERROR": "Run `kz validate` on the package and fix each problem it reports.",
    "INTAKE_FAILED": "The server could not read the upload: submit again; tell the operator when it repeats.",
    "SIDECAR_INVALID": "The upload's metadata could not be read: submit with `kz submit` or the curl "
                       "line of the API reference.",
    "PACKAGE_REJECTED": "The package's own benchmark said accept=false: read each case's accept_reason and "
                        "the benchmark log, and reproduce with `kz dry-run --server URL` (judged against "
                        "this server's scorecard).",
    "REVIEW_REJECTED": "An operator rejected the change after review: read the message and submit again "
                       "once it is addressed.",
    # queue and accept
    "ATTEMPTS_EXHAUSTED": "Every runner that took the job gave it back or lost it; the message says how the "
                          "last attempt ended. A crash, timeout or restart: make the build and benchmark "
                          "finish well within the time limits and submit again. MACHINE_BUSY: the runner's "
                          "host was too loaded to time the kernel, or the kernel loaded it itself (threads or "
                          "processes working beside its calls): submit again, without them.",
    "CANCELLED": "The submission was cancelled; submit again when you want it run.",
    "REVOKED": "An operator revoked this result (the message says why) and the bests were recomputed "
               "without it: fix the package and submit again.",
    "ROLLED_BACK": "The server could not finish committing the result: submit again; tell the operator "
                   "when it repeats.",
}

#: code -> the one message a submission's reason shows for it, whatever the event recorded. These
#: codes stand for the server's own trouble: the recorded text is an exception (a class name, a
#: server path), which belongs in the operator's log (stderr, ``kz events show``), never in a
#: public status document or page.
PUBLIC_MESSAGES: dict[str, str] = {
    "ROLLED_BACK": "the server could not commit the accepted result; nothing of it is in the repo, and the "
                   "operator's log has the cause",
    "INTAKE_FAILED": "the server's checks failed on this upload; the operator's log has the cause",
}


def hint_for(code: Any) -> str:
    """The fix hint for ``code`` (the contract's advice first, as ``kz dry-run`` gives it); '' if none."""
    code = str(code or "")
    if code in CODES:
        return CODES[code].hint
    if code in RESULT_HINTS:
        return RESULT_HINTS[code]
    return DAEMON_HINTS.get(code, "")


def with_hint(reason: Any) -> Any:
    """A copy of a ``reasons[]`` entry with ``hint`` set (its own, else its first problem's, else the table's)."""
    if not isinstance(reason, Mapping):
        return reason
    out = dict(reason)
    if out.get("hint"):
        return out
    hint = ""
    details = out.get("details")
    problems = details.get("problems") if isinstance(details, Mapping) else None
    for problem in problems if isinstance(problems, list) else []:
        if isinstance(problem, Mapping) and problem.get("code") == out.get("code") and problem.get("hint"):
            hint = str(problem["hint"])
            break
    out["hint"] = hint or hint_for(out.get("code"))
    return out


def public_reason(reason: Any) -> Any:
    """A ``reasons[]`` entry as the public may see it: the fixed message for a server-trouble code."""
    if not isinstance(reason, Mapping) or reason.get("code") not in PUBLIC_MESSAGES:
        return reason
    out = dict(reason)
    out["message"] = PUBLIC_MESSAGES[str(out["code"])]
    out.pop("details", None)
    return out


def exhausted_message(attempts: int, max_attempts: int, last: str) -> str:
    """ATTEMPTS_EXHAUSTED's message: the count, and how the last attempt ended (the runner's reason)."""
    return (f"{attempts} attempts without a result (queue.max_attempts is {max_attempts}); "
            f"the last: {last[:300]}")


def lease_expired(runner_id: str) -> str:
    """How an attempt ended whose lease ran out (the last attempt of an ATTEMPTS_EXHAUSTED message)."""
    return f"the lease of runner {runner_id} expired (no renewal, no report)"

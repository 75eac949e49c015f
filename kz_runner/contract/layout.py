"""The on-disk layout of a kernel package: one set of names for every part of the project.

A package is a folder whose path in the kernel repo is its kernel_id. Its contract
area ``.kernel_package/`` holds exactly the four ``CONTRACT_FILES``; everything beside
it is the submitter's source area. ``bench_result.yaml`` (the scorecard) is written by
the server only; a seed scorecard marks every record with ``SEED_SHA``.
"""
from __future__ import annotations

__all__ = ["KP", "DESC", "BENCH_RESULT", "BUILD_TEST_ENV", "BENCHMARK", "CONTRACT_FILES",
           "HARNESS_FILES", "SEED_SHA", "SEED_SUBMITTER", "SEED_RECORDED_AT", "PENDING_COMMIT", "is_seed_sha",
           "seed_scorecard", "CONTROL_ENV", "RESULT_ENV", "LIBRARY_CODES", "WORKER_SANDBOX_ENV",
           "WORKER_SOURCE_ENV", "MEASUREMENTS", "REFERENCE_DIR", "REFERENCE_FILE"]

#: the contract area's folder name.
KP = ".kernel_package"
DESC = "desc.yaml"
BENCH_RESULT = "bench_result.yaml"
BUILD_TEST_ENV = "build_test_env.py"
BENCHMARK = "benchmark.py"
#: the four files a valid package's contract area holds.
CONTRACT_FILES = (DESC, BENCH_RESULT, BUILD_TEST_ENV, BENCHMARK)
#: the contract files that define how a package is measured (locked for existing kernels).
HARNESS_FILES = (DESC, BUILD_TEST_ENV, BENCHMARK)

#: the seed sentinel: a record with this commit_sha is a placeholder, never a measurement.
SEED_SHA = "0000000"
SEED_SUBMITTER = "seed"
SEED_RECORDED_AT = "1970-01-01T00:00:00Z"
#: the harness's private channels with the runner: environment variables naming the
#: inherited descriptors of the control message (runner -> harness) and of the result
#: (harness -> runner), and the codes the bench library reports on the result channel
CONTROL_ENV = "KZ_CONTROL_FD"
RESULT_ENV = "KZ_RESULT_FD"
LIBRARY_CODES = ("TIMER_TAMPERED", "UNSYNCED_WORK", "THREAD_LEAK", "OUTPUT_TYPE", "STALE_OUTPUT",
                 "TIMED_MISMATCH", "WEAK_TRIALS", "HARNESS_ERROR", "WRONG_OUTPUT", "PROTOCOL_ERROR",
                 "MACHINE_BUSY")
#: the judge's step: the JSON argv prefix of the sandbox the benchmark starts the kernel's worker
#: in (``[]``: no sandbox), and the package folder whose ``src/`` the worker imports from. Set by
#: the runner (and ``kz dry-run``) for a harness that times through ``bench.kernel``; a
#: benchmark process started without them times in-process, unverified.
WORKER_SANDBOX_ENV = "KZ_WORKER_SANDBOX"
WORKER_SOURCE_ENV = "KZ_WORKER_SOURCE"
#: how a run's figures were measured (``env.measurement``): by the judge, whose process never
#: ran the package's code, or by a harness that ran it in its own process (never ranked).
MEASUREMENTS = ("judged", "unverified")
#: a confirmation run's package carries the operator's reference kernel here, under its own
#: contract area (``.kernel_package/reference/``): its source area, and ``reference.json`` naming
#: it (kernel_id, source commit, the kernels its benchmark declares) or saying why there is none.
#: Only the server puts it there: a submitted package's copy is dropped from every runner package.
REFERENCE_DIR = "reference"
REFERENCE_FILE = "reference.json"
#: the placeholder the accept saga writes into the scorecard before its source commit exists.
PENDING_COMMIT = "__PENDING_COMMIT__"


def is_seed_sha(sha: object) -> bool:
    """True for the seed sentinel (``"0000000"``; any all-zero sha counts)."""
    return isinstance(sha, str) and sha != "" and set(sha) == {"0"}


def seed_scorecard(kernel_id: str, metas, recorded_at: str = SEED_RECORDED_AT) -> dict:
    """The placeholder scorecard of a brand-new kernel_id: a seed record (value 0) for every declared metric.

    The server commits it with a new package; ``kz dry-run`` judges a new package against it.
    """
    def records(meta) -> dict:
        return {m["name"]: {"value": 0, "submitter": SEED_SUBMITTER, "commit_sha": SEED_SHA,
                            "recorded_at": recorded_at} for m in meta.get("metrics", [])}

    cases = []
    for meta in metas:
        cases.append({"test_case_id": meta["test_case_id"], "metrics_best": records(meta),
                      "metrics_current": records(meta), "correctness_current": "unknown"})
    return {"schema_version": "1.0.0", "kernel_id": kernel_id, "cases": cases}

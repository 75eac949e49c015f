"""The local dry run: the guide's §5.2 loop as one library call (``kz dry-run`` prints it).

Steps, in order; the first that fails ends the run and names itself:

1. ``validate``    static checks (:mod:`kz_runner.contract.validate`) and the static source
                   rules with the server's defaults (a reject rule fails the step, a hold
                   rule is a warning: the server would hold it for an admin); for a
                   tarball the tarball rules too;
2. ``unpack``      (tarballs only) safe unpack, then a seed ``bench_result.yaml`` is
                   added as the server does for a package it has never seen;
3. ``build-1``, ``build-2``  ``python .kernel_package/build_test_env.py WORKDIR`` in two
                   fresh workdirs (cwd = package root, own process group, timeout);
4. ``idempotency`` ``inputs/``, ``expected/`` and ``build_manifest.json`` byte for byte;
5. ``benchmark``   ``python .kernel_package/benchmark.py WORKDIR`` (workdir of build 1), as the
                   runner runs it: a harness that names its kernel with ``bench.kernel`` runs
                   from a copy of ``.kernel_package/`` alone (the judge's view: no source area)
                   and times the kernel through the judge, whose worker imports the package's
                   ``src/`` (no sandbox here); one that imports from ``src/`` or never calls
                   ``bench.kernel`` runs in place, its figures unverified (``measurement``);
6. ``output``      stdout is exactly one JSON document;
7. ``checks``      the schema and the server's hard checks (:mod:`.checks`);
8. ``floor``       the physics floor (:mod:`kz_runner.contract.rules.floor`) with the default
                   ceilings of desc.yaml's arch: ``IMPLAUSIBLE_RESULT`` or ``NO_FLOOR`` fail it;
9. ``verdict``     the package's own ``overall.accept`` is true.

Build values first, print last: :func:`dry_run` returns a :class:`DryRun`;
:func:`render_text` and :meth:`DryRun.to_json` format it.

By default the benchmark judges itself against the package's own ``bench_result.yaml``
(a tarball gets the seed). ``scorecard_for`` (``kz dry-run --server``) names another
scorecard, e.g. the server's current one, so the local verdict is the one the server
would reach; the package is then run from a copy holding that scorecard.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from kz_events import defaults
from kz_runner.contract.checks import CheckVerdict, check_result, parse_output
from kz_runner.contract.layout import BENCH_RESULT, BENCHMARK, BUILD_TEST_ENV, DESC, KP, seed_scorecard
from kz_runner.contract.problems import Problem, clip

STEPS = ("validate", "unpack", "build-1", "build-2", "idempotency", "benchmark", "output", "checks", "floor",
         "verdict")
COMPARED = ("inputs", "expected", "build_manifest.json")
STDOUT_CAP = 16 * 1024 * 1024
STDERR_CAP = 1024 * 1024
# The verdict line's detail: whole for the library's findings (their remedy comes last), cut
# only against a package printing an endless reason.
VERDICT_CHARS = 1000


@dataclass(frozen=True)
class DryRunScorecard:
    """The scorecard a dry run judges against instead of the package's own ``bench_result.yaml``."""

    source: str  # one line for the report: where it came from
    document: dict[str, Any] | None = None  # None: the seed the server gives a new kernel


@dataclass
class Step:
    """One step's outcome."""

    name: str
    ok: bool
    seconds: float = 0.0
    detail: str = ""  # one line for the table
    problems: tuple[Problem, ...] = ()
    stderr_tail: str = ""  # the child's last stderr lines (build and benchmark steps)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return {"name": self.name, "ok": self.ok, "seconds": round(self.seconds, 3), "detail": self.detail,
                "problems": [p.to_json() for p in self.problems], "stderr_tail": self.stderr_tail}


@dataclass
class DryRun:
    """Everything a dry run found."""

    path: str
    kernel_id: str | None = None
    steps: list[Step] = field(default_factory=list)
    verdict: CheckVerdict | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)  # the per-case table
    workdirs: list[str] = field(default_factory=list)  # kept with keep=True
    warnings: tuple[Problem, ...] = ()
    judged_against: str | None = None  # set when a DryRunScorecard replaced the package's own
    measurement: str | None = None  # "judged" or "unverified", once the benchmark ran
    unverified_reason: str = ""

    @property
    def ok(self) -> bool:
        """Every step ran and passed."""
        return bool(self.steps) and all(s.ok for s in self.steps) and self.steps[-1].name == "verdict"

    @property
    def held(self) -> tuple[Problem, ...]:
        """The findings of a hold rule: the server would queue the package only after an admin's review."""
        from kz_runner.contract.rules.engine import HOLD, RULES_BY_ID

        return tuple(p for p in self.warnings if p.code in RULES_BY_ID and RULES_BY_ID[p.code].action == HOLD)

    @property
    def failed_step(self) -> str | None:
        """The name of the step that failed, or None."""
        return next((s.name for s in self.steps if not s.ok), None)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document."""
        return {
            "path": self.path,
            "kernel_id": self.kernel_id,
            "ok": self.ok,
            "failed_step": self.failed_step,
            "steps": [s.to_json() for s in self.steps],
            "cases": self.rows,
            "warnings": [p.to_json() for p in self.warnings],
            "verdict": self.verdict.to_json() if self.verdict else None,
            "result": self.verdict.document if self.verdict else None,
            "workdirs": self.workdirs,
            "judged_against": self.judged_against,
            "held": [p.to_json() for p in self.held],
            "measurement": self.measurement,
            "unverified_reason": self.unverified_reason,
        }


def _tail(data: bytes, lines: int = 20) -> str:
    text = data.decode("utf-8", "replace")
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _child_env() -> dict[str, str]:
    """The caller's environment, with this kz_runner first on PYTHONPATH (children run from the package root)."""
    import kz_runner

    env = dict(os.environ)
    here = str(Path(kz_runner.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("KZ_RUNNER_ID", "local")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run_child(script: str, package_dir: Path, workdir: Path, timeout_s: float, python: str,
               extra_env: dict[str, str] | None = None):
    from kz_runner.worker.procs import run_step

    return run_step([python, f"{KP}/{script}", str(workdir)], cwd=package_dir, env={**_child_env(), **(extra_env or {})},
                    timeout_s=timeout_s, stdout_cap=STDOUT_CAP, stderr_cap=STDERR_CAP, kill_grace_s=2.0)


def _run_benchmark(run: DryRun, package_dir: Path, workdir: Path, scratch: Path, timeout_s: float, python: str):
    """The benchmark as the runner runs it (see the module docstring); sets ``run.measurement``."""
    from kz_runner.bench import UNJUDGED_MARK
    from kz_runner.contract.layout import WORKER_SANDBOX_ENV, WORKER_SOURCE_ENV
    from kz_runner.contract.rules.pysource import harness_not_judged

    why = harness_not_judged((package_dir / KP / BENCHMARK).read_bytes())
    if why is None:
        view = scratch / "judge" / package_dir.name  # .kernel_package/ alone: the judge's view
        shutil.copytree(package_dir / KP, view / KP, ignore=shutil.ignore_patterns("__pycache__"))
        res = _run_child(BENCHMARK, view, workdir, timeout_s, python,
                         {WORKER_SANDBOX_ENV: "[]", WORKER_SOURCE_ENV: str(package_dir)})
        marks = [ln for ln in res.stderr.decode("utf-8", "replace").splitlines() if ln.startswith(UNJUDGED_MARK)]
        if not marks:
            run.measurement = "judged"
            return res
        why = marks[-1][len(UNJUDGED_MARK):].strip()
    run.measurement, run.unverified_reason = "unverified", why
    return _run_child(BENCHMARK, package_dir, workdir, timeout_s, python)


def _child_step(name: str, res, timeout_s: float) -> Step:
    tail = _tail(res.stderr)
    if res.start_error:
        return Step(name, False, res.duration_s, f"could not start: {res.start_error}", stderr_tail=tail)
    if res.timed_out:
        return Step(name, False, res.duration_s, f"timed out after {timeout_s:g} s (process group killed)",
                    stderr_tail=tail)
    if res.returncode != 0:
        return Step(name, False, res.duration_s, f"exit status {res.returncode}", stderr_tail=tail)
    return Step(name, True, res.duration_s, "exit 0", stderr_tail=tail)


def _files(root: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for entry in COMPARED:
        path = root / entry
        if path.is_file():
            out[entry] = path
        elif path.is_dir():
            for p in sorted(path.rglob("*")):
                if p.is_file():
                    out[p.relative_to(root).as_posix()] = p
    return out


def _same_bytes(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            ca, cb = fa.read(1 << 20), fb.read(1 << 20)
            if ca != cb:
                return False
            if not ca:
                return True


def compare_builds(first: Path, second: Path) -> tuple[bool, str]:
    """Compare inputs/, expected/ and build_manifest.json of two workdirs; names the first difference."""
    missing = [e for e in COMPARED if not (first / e).exists()]
    if missing:
        return False, f"build_test_env.py did not write {', '.join(missing)}"
    a, b = _files(first), _files(second)
    # data files first, the manifest last: a differing manifest is usually the consequence
    for name in sorted(set(a) | set(b), key=lambda n: (n == "build_manifest.json", n)):
        if name not in b:
            return False, f"{name} only in build 1"
        if name not in a:
            return False, f"{name} only in build 2"
        if not _same_bytes(a[name], b[name]):
            return False, f"{name} differs between the two builds (use a fixed seed, no time or urandom)"
    total = sum(p.stat().st_size for p in a.values())
    return True, f"{len(a)} files identical ({total / 1e6:.1f} MB)"


def _read_metas(package_dir: Path) -> list[dict]:
    from kz_runner.contract.validate import read_metas

    source = (package_dir / KP / BENCHMARK).read_bytes()
    metas, _ = read_metas(source)
    return [m for m in metas or [] if isinstance(m, dict)]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def case_rows(doc: Any, metas: list[dict]) -> list[dict[str, Any]]:
    """One table row per reported case: correctness, errors, primary metric, accept, reason."""
    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list):
        return []
    by_id = {m.get("test_case_id"): m for m in metas}
    rows = []
    for case in doc["cases"]:
        if not isinstance(case, dict):
            continue
        meta = by_id.get(case.get("test_case_id"), {})
        primary = meta.get("primary_metric")
        unit = next((m.get("unit") for m in meta.get("metrics", []) if m.get("name") == primary), "")
        metrics = {m.get("name"): m.get("value") for m in case.get("metrics") or [] if isinstance(m, dict)}
        detail = case.get("correctness_detail")
        detail = detail if isinstance(detail, dict) else {}
        rows.append({
            "test_case_id": case.get("test_case_id"),
            "correctness": case.get("correctness"),
            "max_abs_err": detail.get("max_abs_err"),
            "max_rel_err": detail.get("max_rel_err"),
            "primary_metric": primary,
            "value": metrics.get(primary),
            "unit": unit,
            "accept": case.get("accept"),
            "reason": case.get("error") or case.get("accept_reason") or "",
        })
    return rows


def scorecard_from_kernel_doc(doc: dict[str, Any], kernel_id: str) -> tuple[dict[str, Any] | None, str]:
    """The scorecard in a ``GET /api/kernels/{kernel_id}`` answer, and a note on what was missing from it.

    The answer's ``bench_result`` when it has cases; else one rebuilt from the index
    entry's cases, which carry only each case's primary metric (best and current);
    None (judge against the seed) when it has neither.
    """
    bench = doc.get("bench_result")
    if isinstance(bench, dict) and isinstance(bench.get("cases"), list):
        return bench, ""
    cases = []
    for case in doc.get("cases") or []:
        if not isinstance(case, dict) or not case.get("test_case_id"):
            continue
        primary = case.get("primary_metric")
        entry: dict[str, Any] = {"test_case_id": case["test_case_id"], "metrics_best": {}, "metrics_current": {},
                                 "correctness_current": case.get("correctness_current") or "unknown"}
        for key, side in (("best", "metrics_best"), ("current", "metrics_current")):
            if primary and isinstance(case.get(key), dict):
                entry[side][primary] = case[key]
        cases.append(entry)
    if not cases:
        return None, "the answer has neither bench_result nor cases; judged against the seed"
    return ({"schema_version": "1.0.0", "kernel_id": kernel_id, "cases": cases},
            "the answer has no bench_result; rebuilt from the index entry: primary metrics only")


def dry_run(path: str | os.PathLike, *, build_timeout_s: float = defaults.BUILD_TIMEOUT_S,
            bench_timeout_s: float = defaults.BENCHMARK_TIMEOUT_S,
            keep: bool = False, python: str | None = None, kernel_id: str | None = None,
            scorecard_for: Callable[[str], DryRunScorecard] | None = None) -> DryRun:
    """Run the whole loop on a package directory or a ``.tar.gz``; never raises for a bad package.

    ``kernel_id`` overrides the one validation derives; ``scorecard_for(kernel_id)``, called once
    the package is valid, gives the scorecard to judge against (its errors propagate).
    """
    from kz_runner.contract.validate import validate_package_dir, validate_tarball

    python = python or sys.executable
    src = Path(path)
    run = DryRun(str(src))
    scratch = Path(tempfile.mkdtemp(prefix="kz-dryrun-"))
    try:
        _dry_run(run, src, scratch, build_timeout_s, bench_timeout_s, python, validate_package_dir, validate_tarball,
                 kernel_id, scorecard_for)
    finally:
        if keep:
            run.workdirs = [str(scratch)]
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return run


def _dry_run(run: DryRun, src: Path, scratch: Path, build_timeout_s: float, bench_timeout_s: float,
             python: str, validate_package_dir, validate_tarball, kernel_id: str | None = None,
             scorecard_for: Callable[[str], DryRunScorecard] | None = None) -> None:
    import yaml

    t0 = time.monotonic()
    is_tarball = src.is_file()
    if is_tarball:
        report = validate_tarball(src, src.name, kernel_id=kernel_id, rules=True)
    else:
        report = validate_package_dir(src, kernel_id=kernel_id, rules=True)
    run.kernel_id = report.facts.get("kernel_id")
    run.warnings = report.warnings
    n_warn = f" ({len(report.warnings)} warnings)" if report.warnings else ""
    if not report.valid:
        run.steps.append(Step("validate", False, time.monotonic() - t0,
                              f"{len(report.errors)} errors: {report.errors[0].code}", report.errors))
        return
    run.steps.append(Step("validate", True, time.monotonic() - t0, "valid" + n_warn, report.warnings))

    package_dir = src.resolve()
    if is_tarball:
        from kz_runner.contract.tarball import safe_unpack

        t0 = time.monotonic()
        unpacked = safe_unpack(src, scratch / "unpack")
        if not unpacked.valid:
            run.steps.append(Step("unpack", False, time.monotonic() - t0, unpacked.errors[0].message, unpacked.errors))
            return
        package_dir = Path(unpacked.facts["package_dir"])
        run.kernel_id = unpacked.facts.get("kernel_id", run.kernel_id)
        card = package_dir / KP / BENCH_RESULT
        detail = f"{unpacked.facts.get('files')} files"
        if not card.exists() and scorecard_for is None:
            card.write_text(yaml.safe_dump(seed_scorecard(run.kernel_id, _read_metas(package_dir)),
                                           sort_keys=False), encoding="utf-8")
            detail += "; seed bench_result.yaml added"
        run.steps.append(Step("unpack", True, time.monotonic() - t0, detail))

    metas = _read_metas(package_dir)
    if scorecard_for is not None:
        against = scorecard_for(run.kernel_id or "")
        if not is_tarball:  # never overwrite the author's own scorecard: run a copy
            package_dir = _copy_package(package_dir, scratch / "package")
        document = against.document if against.document is not None else seed_scorecard(run.kernel_id or "", metas)
        (package_dir / KP / BENCH_RESULT).write_text(
            yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        run.judged_against = against.source
    workdirs = [scratch / "work1", scratch / "work2"]
    for i, workdir in enumerate(workdirs, start=1):
        workdir.mkdir(parents=True)
        res = _run_child(BUILD_TEST_ENV, package_dir, workdir, build_timeout_s, python)
        step = _child_step(f"build-{i}", res, build_timeout_s)
        run.steps.append(step)
        if not step.ok:
            return

    t0 = time.monotonic()
    same, detail = compare_builds(*workdirs)
    run.steps.append(Step("idempotency", same, time.monotonic() - t0, detail))
    if not same:
        return

    res = _run_benchmark(run, package_dir, workdirs[0], scratch, bench_timeout_s, python)
    step = _child_step("benchmark", res, bench_timeout_s)
    step.detail += " (judged)" if run.measurement == "judged" else f" (unverified: {run.unverified_reason})"
    run.steps.append(step)
    if not step.ok:
        return

    doc, problems = parse_output(res.stdout)
    if res.stdout_dropped:
        run.steps.append(Step("output", False, 0.0, f"stdout exceeded {STDOUT_CAP} bytes"))
        return
    if problems:
        run.steps.append(Step("output", False, 0.0, problems[0].message, problems))
        return
    run.steps.append(Step("output", True, 0.0, f"one JSON document ({len(res.stdout)} bytes)"))

    # cast: the ids are str once the METAS check passes; a malformed item's None is passed on as before
    verdict = check_result(doc, kernel_id=run.kernel_id or "",
                           case_ids=cast(list[str], [m.get("test_case_id") for m in metas]))
    run.verdict = verdict
    run.rows = case_rows(doc, metas)
    if verdict.problems:
        run.steps.append(Step("checks", False, 0.0, verdict.reason, verdict.problems))
        return
    run.steps.append(Step("checks", True, 0.0, "schema and every server-side hard check passed"))
    if verdict.accepted:  # the server bounds only a result that would be accepted
        refused = _floor(package_dir, doc, metas)
        if refused is not None:
            run.steps.append(Step("floor", False, 0.0, refused.message, (refused.to_problem(),)))
            return
        run.steps.append(Step("floor", True, 0.0, "every figure within the physics of the arch"))
    run.steps.append(Step("verdict", verdict.accepted, 0.0,
                          ("accepted: " if verdict.accepted else "") + verdict.reason))


def _floor(package_dir: Path, doc: Any, metas: list[dict]):
    """The physics floor's refusal of the result (server defaults, desc.yaml's arch), or None."""
    from kz_runner.contract.rules.floor import check_result as floor_check
    from kz_runner.contract.yamlio import load_yaml

    desc = load_yaml((package_dir / KP / DESC).read_bytes())
    desc = desc if isinstance(desc, dict) else {}
    category = desc.get("category")
    category = category if isinstance(category, dict) else {}
    return floor_check(doc, metas, desc.get("io_signature"), str(category.get("arch") or ""))


def _copy_package(package_dir: Path, dest: Path) -> Path:
    """A copy of the package (caches and VCS folders left out) to run with another scorecard."""
    shutil.copytree(package_dir, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".git"))
    return dest


def render_text(run: DryRun) -> str:
    """The human-readable report: steps, the per-case table, warnings and the verdict line."""
    lines = [f"kz dry-run {run.path}" + (f"  (kernel_id {run.kernel_id})" if run.kernel_id else "")]
    if run.judged_against:
        lines.append(f"  judged against {run.judged_against}")
    done = {s.name for s in run.steps}
    for step in run.steps:
        mark = "ok  " if step.ok else "FAIL"
        detail = step.detail if len(step.detail) <= 160 else step.detail[:157] + "..."
        lines.append(f"  {mark} {step.name:<12} {step.seconds:7.2f}s  {detail}")
        if not step.ok:
            for p in step.problems[:10]:
                lines.append(f"         {p.render()}")
            if step.stderr_tail:
                lines.append("         stderr (last lines):")
                lines.extend(f"           {ln}" for ln in step.stderr_tail.splitlines())
    skipped = [s for s in STEPS if s not in done and not (s == "unpack" and not str(run.path).endswith(".tar.gz"))]
    if run.failed_step and skipped:
        lines.append(f"  skipped: {', '.join(skipped)}")
    if run.rows:
        header = ("case", "correctness", "max_abs_err", "max_rel_err", "primary metric", "accept", "reason / error")
        table = [header] + [
            (str(r["test_case_id"]), str(r["correctness"]), _fmt(r["max_abs_err"]), _fmt(r["max_rel_err"]),
             f"{r['primary_metric']}={_fmt(r['value'])} {r['unit']}".strip(), "yes" if r["accept"] else "no",
             str(r["reason"])[:100])
            for r in run.rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
        lines.append("")
        for row in table:
            lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    for p in run.warnings:
        lines.append(f"  {p.render()}")
    if run.workdirs:
        lines.append(f"  kept: {', '.join(run.workdirs)}")
    lines.append("")
    if run.ok:
        held = "".join(f"; held for an admin's review on the server: {p.code} {p.file}:{p.field}"
                       for p in run.held[:1]) + (f" (and {len(run.held) - 1} more)" if len(run.held) > 1 else "")
        unverified = (f"; unverified ({run.unverified_reason}): the server accepts it but never ranks it"
                      if run.measurement == "unverified" else "")
        lines.append(f"verdict: PASS — {run.steps[-1].detail}{held}{unverified}")
    else:
        failed = next((s for s in run.steps if not s.ok), None)
        lines.append(f"verdict: FAIL at step {failed.name}: {clip(failed.detail, VERDICT_CHARS)}" if failed
                     else "verdict: FAIL")
    return "\n".join(lines)

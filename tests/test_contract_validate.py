"""validate_package_dir: one bad package per rule, each asserting its problem code."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from kz_runner.contract.codes import CODES
from kz_runner.contract.rules.pysource import read_metas
from kz_runner.contract.validate import validate_package_dir
from tests.helpers.contract_fixtures import DEFAULT_ID, NEWCOMER, NEWCOMER_ID, copy_newcomer, mark_repo, write_package


@pytest.fixture
def pkg(tmp_path) -> Path:
    """A valid package inside a marked repo."""
    return write_package(mark_repo(tmp_path / "repo"))


def kp(pkg: Path, name: str) -> Path:
    return pkg / ".kernel_package" / name


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, count))


def codes(report) -> list[str]:
    return [p.code for p in report.problems]


def test_generated_package_is_valid(pkg):
    report = validate_package_dir(pkg)
    assert report.valid and report.problems == (), [p.render() for p in report.problems]
    assert report.facts["kernel_id"] == DEFAULT_ID
    assert report.facts["arch"] == "cpu"
    assert report.facts["test_case_ids"] == ["small", "large"]


def test_newcomer_package_written_from_the_guide_is_valid():
    """Valid; its benchmark.py imports src/ as the guide's example does, so kz validate says how to port it
    to the judge (its records would be unverified) and nothing else."""
    report = validate_package_dir(NEWCOMER)
    assert report.valid and codes(report) == ["HARNESS_NOT_JUDGED"], [p.render() for p in report.problems]
    assert "bench.kernel(module, function)" in report.problems[0].message
    assert report.facts["kernel_id"] == NEWCOMER_ID


def test_newcomer_package_valid_when_copied_outside_any_repo(tmp_path):
    # the path still ends with bench_result.yaml's kernel_id: that is enough
    pkg = copy_newcomer(tmp_path)
    report = validate_package_dir(pkg)
    assert report.valid, [p.render() for p in report.problems]


def test_every_problem_has_file_code_and_hint(pkg):
    edit(kp(pkg, "desc.yaml"), "status: normal", "status: normal\nacceptance: {regression_tolerance: 0.05}")
    report = validate_package_dir(pkg)
    (found,) = report.problems
    assert found.code == "DESC_SCHEMA" and found.file == ".kernel_package/desc.yaml"
    assert "acceptance" in found.message and "benchmark.py" in found.hint


# Each rule: (id, mutate(pkg), expected code, package still valid?)
def _bad_kernel_id(pkg: Path) -> None:
    target = pkg.parent / "numpy ref"
    pkg.rename(target)


def _symlink_contract_file(pkg: Path) -> None:
    real = pkg / "src" / "desc_copy.yaml"
    real.write_bytes(kp(pkg, "desc.yaml").read_bytes())
    kp(pkg, "desc.yaml").unlink()
    kp(pkg, "desc.yaml").symlink_to(real)


def _nested(pkg: Path) -> None:
    write_package(pkg / "src", "inner/pkg/a/b/c")


def _outside_ref(pkg: Path) -> None:
    outside = pkg.parent / "secret.py"
    outside.write_text("x = 1\n")
    (pkg / "src" / "escape.py").symlink_to(outside)
    edit(kp(pkg, "desc.yaml"), "[src/axpy.py]", "[src/escape.py]")


RULES = [
    ("kernel_id segment", _bad_kernel_id, "KERNEL_ID_INVALID", False),
    ("no .kernel_package", lambda p: [f.unlink() for f in (p / ".kernel_package").iterdir()]
     and (p / ".kernel_package").rmdir(), "KERNEL_PACKAGE_MISSING", False),
    ("desc.yaml missing", lambda p: kp(p, "desc.yaml").unlink(), "FILE_MISSING", False),
    ("bench_result.yaml missing", lambda p: kp(p, "bench_result.yaml").unlink(), "FILE_MISSING", False),
    ("build_test_env.py missing", lambda p: kp(p, "build_test_env.py").unlink(), "FILE_MISSING", False),
    ("benchmark.py missing", lambda p: kp(p, "benchmark.py").unlink(), "FILE_MISSING", False),
    ("contract file is a link", _symlink_contract_file, "FILE_MISSING", False),
    ("extra file in .kernel_package", lambda p: kp(p, "notes.md").write_text("x"),
     "KERNEL_PACKAGE_EXTRA_FILE", True),
    ("symlink in source area", lambda p: (p / "src" / "link.py").symlink_to("axpy.py"), "PACKAGE_SYMLINK", False),
    ("fifo in source area", lambda p: os.mkfifo(p / "src" / "pipe"), "PACKAGE_SYMLINK", False),
    ("nested package", _nested, "NESTED_PACKAGE", False),
    ("desc too large", lambda p: kp(p, "desc.yaml").write_text("#" * (2 << 20)), "FILE_TOO_LARGE", False),
    ("desc not utf-8", lambda p: kp(p, "desc.yaml").write_bytes("name: caf\u00e9\n".encode("latin-1")),
     "FILE_ENCODING", False),
    ("desc yaml syntax", lambda p: kp(p, "desc.yaml").write_text("name: [unclosed\n"), "YAML_INVALID", False),
    ("desc is a list", lambda p: kp(p, "desc.yaml").write_text("- a\n- b\n"), "DESC_SCHEMA", False),
    ("desc retired acceptance field", lambda p: edit(kp(p, "desc.yaml"), "status: normal",
                                                     "status: normal\nacceptance:\n  regression_tolerance: 0.05"),
     "DESC_SCHEMA", False),
    ("desc summary over 300", lambda p: edit(kp(p, "desc.yaml"), "summary: y", "summary: " + "y" * 301),
     "DESC_SCHEMA", False),
    ("desc URL in reference_sources", lambda p: edit(kp(p, "desc.yaml"), "[src/axpy.py]",
                                                     "[https://github.com/x/y]"), "DESC_SCHEMA", False),
    ("desc missing name", lambda p: edit(kp(p, "desc.yaml"), "name: Axpy numpy_ref\n", ""), "DESC_SCHEMA", False),
    ("desc bad status", lambda p: edit(kp(p, "desc.yaml"), "status: normal", "status: retired"),
     "DESC_SCHEMA", False),
    ("category mismatch", lambda p: edit(kp(p, "desc.yaml"), "arch: cpu", "arch: gfx928"),
     "CATEGORY_MISMATCH", False),
    ("status frozen", lambda p: edit(kp(p, "desc.yaml"), "status: normal", "status: frozen"), "STATUS_FROZEN", True),
    ("status deprecated", lambda p: edit(kp(p, "desc.yaml"), "status: normal", "status: deprecated"),
     "STATUS_DEPRECATED", True),
    ("reference source missing", lambda p: (p / "src" / "axpy.py").unlink(), "REFERENCE_SOURCE_MISSING", False),
    ("reference source through link", _outside_ref, "REFERENCE_SOURCE_OUTSIDE", False),
    ("bench yaml syntax", lambda p: kp(p, "bench_result.yaml").write_text("cases: [\n"), "YAML_INVALID", False),
    ("bench unquoted commit_sha", lambda p: edit(kp(p, "bench_result.yaml"), '"0000000"', "0000000"),
     "BENCH_RESULT_SCHEMA", False),
    ("bench unquoted recorded_at", lambda p: edit(kp(p, "bench_result.yaml"), '"2026-08-02T00:00:00Z"',
                                                  "2026-08-02T00:00:00Z"), "BENCH_RESULT_SCHEMA", False),
    ("bench bad date-time", lambda p: edit(kp(p, "bench_result.yaml"), '"2026-08-02T00:00:00Z"',
                                           '"2026-13-02T00:00:00Z"'), "BENCH_RESULT_SCHEMA", False),
    ("bench bad correctness", lambda p: edit(kp(p, "bench_result.yaml"), "correctness_current: passed",
                                             "correctness_current: ok"), "BENCH_RESULT_SCHEMA", False),
    ("bench kernel_id", lambda p: edit(kp(p, "bench_result.yaml"), f"kernel_id: {DEFAULT_ID}",
                                       "kernel_id: cpu/Elementwise/Axpy/fp32/other"), "BENCH_KERNEL_ID_MISMATCH",
     False),
    ("bench duplicate case", lambda p: edit(kp(p, "bench_result.yaml"), "test_case_id: large",
                                            "test_case_id: small"), "BENCH_DUPLICATE_CASE", False),
    ("bench NaN", lambda p: edit(kp(p, "bench_result.yaml"), "value: 0.5", "value: .nan"), "NONFINITE_VALUE",
     False),
    ("bench Inf", lambda p: edit(kp(p, "bench_result.yaml"), "value: 0.5", "value: -.inf"), "NONFINITE_VALUE",
     False),
    ("cases differ from METAS", lambda p: edit(kp(p, "benchmark.py"), '"test_case_id": "large"',
                                               '"test_case_id": "huge"'), "CASES_MISMATCH", False),
    ("benchmark syntax", lambda p: kp(p, "benchmark.py").write_text("def f(:\n"), "PYTHON_SYNTAX", False),
    ("build_test_env syntax", lambda p: kp(p, "build_test_env.py").write_text("if x\n"), "PYTHON_SYNTAX", False),
    ("build_env missing", lambda p: edit(kp(p, "build_test_env.py"), "def build_env(", "def make_env("),
     "BUILD_ENV_MISSING", False),
    ("build_env signature", lambda p: edit(kp(p, "build_test_env.py"), "def build_env(workdir: Path)",
                                           "def build_env(workdir: Path, seed)"), "BUILD_ENV_SIGNATURE", False),
    ("build_env no main", lambda p: edit(kp(p, "build_test_env.py"), 'if __name__ == "__main__":', "if False:"),
     "BUILD_ENV_NO_MAIN", False),
    ("benchmark no main", lambda p: edit(kp(p, "benchmark.py"), 'if __name__ == "__main__":', "if True:"),
     "BENCHMARK_NO_MAIN", True),
    ("METAS missing", lambda p: edit(kp(p, "benchmark.py"), "KERNEL_ZOO_TEST_CASE_METAS =", "METAS ="),
     "METAS_MISSING", False),
    ("METAS computed", lambda p: edit(kp(p, "benchmark.py"), '"params": {"n": 1024}', '"params": dict(n=1024)'),
     "METAS_NOT_LITERAL", False),
    ("METAS not a list", lambda p: edit(kp(p, "benchmark.py"), "KERNEL_ZOO_TEST_CASE_METAS = [",
                                        "KERNEL_ZOO_TEST_CASE_METAS = 'x'\nOTHER = ["), "METAS_NOT_LITERAL", False),
    ("METAS bad direction", lambda p: edit(kp(p, "benchmark.py"), '"lower_better"', '"lower"'), "METAS_SCHEMA",
     False),
    ("METAS missing tolerance", lambda p: edit(kp(p, "benchmark.py"),
                                               '"tolerance": {"correctness_atol": 1e-6, "correctness_rtol": 1e-6},',
                                               ""), "METAS_SCHEMA", False),
    ("METAS primary not a metric", lambda p: edit(kp(p, "benchmark.py"), '"primary_metric": "latency_ms"',
                                                  '"primary_metric": "latency_us"'), "METAS_PRIMARY_METRIC", False),
    ("METAS duplicate id", lambda p: (edit(kp(p, "benchmark.py"), '"test_case_id": "large"',
                                           '"test_case_id": "small"'),
                                      edit(kp(p, "bench_result.yaml"), "test_case_id: large",
                                           "test_case_id: other")), "METAS_DUPLICATE_ID", False),
    ("METAS duplicate metric", lambda p: edit(kp(p, "benchmark.py"), '"name": "gbps"', '"name": "latency_ms"'),
     "METAS_DUPLICATE_METRIC", False),
]


@pytest.mark.parametrize("rule,mutate,code,still_valid", RULES, ids=[r[0] for r in RULES])
def test_rule(tmp_path, rule, mutate, code, still_valid):
    pkg = write_package(mark_repo(tmp_path / "repo"))
    mutate(pkg)
    target = pkg if pkg.exists() else pkg.parent / "numpy ref"
    report = validate_package_dir(target)
    assert code in codes(report), [p.render() for p in report.problems]
    assert report.valid is still_valid
    found = next(p for p in report.problems if p.code == code)
    assert found.hint and found.message
    assert found.severity == CODES[code].severity


def test_not_a_package(tmp_path):
    (tmp_path / "f").write_text("x")
    assert codes(validate_package_dir(tmp_path / "f")) == ["NOT_A_PACKAGE"]
    assert codes(validate_package_dir(tmp_path / "missing")) == ["NOT_A_PACKAGE"]


def test_path_not_ending_with_bench_kernel_id_outside_a_repo(tmp_path):
    pkg = write_package(tmp_path, "somewhere")
    edit(kp(pkg, "bench_result.yaml"), "kernel_id: somewhere", f"kernel_id: {DEFAULT_ID}")
    report = validate_package_dir(pkg)
    assert "BENCH_KERNEL_ID_MISMATCH" in codes(report) and not report.valid


def test_explicit_kernel_id_wins(pkg):
    report = validate_package_dir(pkg, kernel_id="cpu/Elementwise/Axpy/fp32/renamed")
    assert codes(report) == ["BENCH_KERNEL_ID_MISMATCH"]


def test_errors_come_before_warnings(pkg):
    edit(kp(pkg, "desc.yaml"), "status: normal", "status: frozen")
    kp(pkg, "benchmark.py").unlink()
    report = validate_package_dir(pkg)
    assert codes(report) == ["FILE_MISSING", "STATUS_FROZEN"]


def test_pycache_and_pyc_are_ignored(pkg):
    (pkg / ".kernel_package" / "__pycache__").mkdir()
    (pkg / ".kernel_package" / "__pycache__" / "benchmark.cpython-311.pyc").write_bytes(b"\0")
    (pkg / "src" / "x.pyc").write_bytes(b"\0")
    assert validate_package_dir(pkg).problems == ()


def test_report_json_roundtrip(pkg):
    kp(pkg, "desc.yaml").write_text("name: [\n")
    data = validate_package_dir(pkg).to_json()
    assert data["valid"] is False
    (p,) = [p for p in data["problems"] if p["code"] == "YAML_INVALID"]
    assert re.match(r"line \d+, column \d+", p["message"])


def test_read_metas_public_api():
    metas, problems = read_metas((NEWCOMER / ".kernel_package" / "benchmark.py").read_bytes())
    assert problems == [] and metas[0]["primary_metric"] == "primary_latency_ms"
    metas, problems = read_metas("import os\nKERNEL_ZOO_TEST_CASE_METAS = os.environ['X']\n")
    assert metas is None and [p.code for p in problems] == ["METAS_NOT_LITERAL"]
    metas, problems = read_metas("KERNEL_ZOO_TEST_CASE_METAS: list[dict] = []\n")
    assert metas == [] and [p.code for p in problems] == ["METAS_SCHEMA"]


def test_read_metas_never_executes_code(tmp_path):
    marker = tmp_path / "ran"
    source = f"open({str(marker)!r}, 'w').write('x')\nKERNEL_ZOO_TEST_CASE_METAS = []\n"
    read_metas(source)
    assert not marker.exists()


def test_guide_seed_and_guide_metas_taken_together_disagree(tmp_path):
    """§3.2's seed names its case small_b1_h1_s16_d16, §3.4's METAS example names it small: one clear error."""
    pkg = copy_newcomer(mark_repo(tmp_path))
    edit(kp(pkg, "benchmark.py"), '"test_case_id": "small_b1_h1_s16_d16"', '"test_case_id": "small"')
    report = validate_package_dir(pkg)
    assert codes(report) == ["CASES_MISMATCH", "HARNESS_NOT_JUDGED"]
    message = report.problems[0].message
    assert "only in METAS: ['small']" in message and "only in bench_result.yaml: ['small_b1_h1_s16_d16']" in message


def test_kernel_id_unknown_outside_a_repo_without_scorecard(tmp_path):
    pkg = write_package(tmp_path, "loose")
    kp(pkg, "bench_result.yaml").unlink()
    report = validate_package_dir(pkg)
    assert codes(report) == ["FILE_MISSING", "KERNEL_ID_UNKNOWN"]
    assert "--kernel-id" in report.problems[1].hint

"""The physics floor: bytes from io_signature, ceilings per arch, always on.

Honest results pass; impossible ones are refused (IMPLAUSIBLE_RESULT); a case the floor
cannot bound is refused too (NO_FLOOR): at validation when its desc.yaml names a dim its
params lack, at intake when the server has no ceiling for it, and when a result is
reported. The Softmax example's hard-range case makes a softmax without max subtraction
fail its correctness check through the pipeline.
"""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

from kz_daemon.config.settings import Config
from kz_daemon.core.errors import ZooError
from kz_daemon.guards.physics import Physics, check_result, parse_physics
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from kz_daemon.storage.pending import SUBMISSION_FILE
from kz_runner.contract.rules.floor import case_bytes, resolve_dim, signature_problems
from kz_runner.contract.rules.pysource import read_metas
from kz_runner.contract.validate import validate_package_dir
from tests.helpers.cheats import input_cheat_packages
from tests.helpers.daemon import (
    AXPY_DIR,
    AXPY_ID,
    EXAMPLES,
    SOFTMAX_ID,
    axpy_result,
    axpy_tarball,
    drop_and_decide,
    package_files,
    real_run,
    tarball_bytes,
)

DESC = yaml.safe_load((AXPY_DIR / ".kernel_package/desc.yaml").read_text())
METAS, _ = read_metas((AXPY_DIR / ".kernel_package/benchmark.py").read_text())
SIG = DESC["io_signature"]
SOFTMAX_DIR = EXAMPLES / SOFTMAX_ID
SOFTMAX_METAS, _ = read_metas((SOFTMAX_DIR / ".kernel_package/benchmark.py").read_text())
OLD_SOFTMAX_SHAPES = (b"shape: [rows, cols]", b"shape: [R, C]")  # what the example's desc.yaml said before


def _softmax_files(mutate=None) -> dict[str, bytes]:
    files = package_files(SOFTMAX_DIR)
    if mutate is not None:
        mutate(files)
    return files


def _old_desc(files: dict[str, bytes]) -> None:
    files[".kernel_package/desc.yaml"] = files[".kernel_package/desc.yaml"].replace(*OLD_SOFTMAX_SHAPES)


def _softmax_result(latency: float, gbps: float = 1.0) -> dict:
    return {"schema_version": "1.0.0", "kernel_id": SOFTMAX_ID, "ran_at": "2026-01-01T00:00:00Z",
            "overall": {"accept": True, "build_ok": True, "accept_reason": "test"},
            "cases": [{"test_case_id": m["test_case_id"], "correctness": "passed", "accept": True,
                       "metrics": [{"name": "latency_us", "value": latency}, {"name": "gbps", "value": gbps}]}
                      for m in SOFTMAX_METAS]}


@pytest.fixture
def zoo(tmp_path):
    running = Zoo(init_state_dir(tmp_path / "state"))
    running.start()
    yield running
    running.stop()


def _report(zoo, name: str, data: bytes, result: dict):
    view = drop_and_decide(zoo, name, data)
    assert view.status == "queued", view.reasons
    claim = zoo.claim("r", "cpu", 5)
    return zoo.report_result(view.uuid, "r", claim.lease_id, result, b"", {}, None)


# -- the floor's arithmetic ------------------------------------------------------------------

def test_bytes_come_from_the_signature_and_each_cases_params():
    # a (fp32 scalar), x and y read, out written: 4 + 3 * 4 * n
    assert case_bytes(SIG, {"n": 1024}) == (4 + 3 * 4 * 1024, ["fp32"] * 4)
    assert case_bytes(SIG, {"m": 1024}) is None          # unresolved: no floor
    assert case_bytes([{"name": "x", "kind": "in", "dtype": "weird", "shape": [4]}], {}) is None
    assert case_bytes([{"name": "x", "kind": "inout", "dtype": "bf16", "shape": [2, "K"]}], {"K": 8}) == (64, ["bf16"])


@pytest.mark.parametrize("dim, params, size", [
    (7, {}, 7), ("rows", {"rows": 64}, 64), ("N", {"n": 9}, 9), ("N", {"N": 3, "n": 9}, 3),
    ("N", {"n": 9, "Nn": 1}, 9), ("N", {}, None), ("N", {"n": 1, "N ": 2, "nn": 3}, 1),
    ("N", {"n": 2.0}, None), ("N", {"n": True}, None), ("N", {"n": -1}, None), (-1, {}, None),
])
def test_a_dim_is_an_integer_or_the_name_of_an_integer_param(dim, params, size):
    assert resolve_dim(dim, params) == size


def test_two_params_that_differ_only_in_case_are_ambiguous():
    (found,) = signature_problems([{"name": "x", "kind": "in", "dtype": "fp32", "shape": ["NS"]}],
                                  [{"test_case_id": "c", "params": {"Ns": 2, "nS": 3}}])
    assert "'NS'" in found.message and "'c'" in found.message and "differ only in case" in found.message


def test_a_real_cpu_run_passes_and_a_latency_100x_below_the_floor_is_refused(tmp_path):
    pkg = tmp_path / "axpy.tar.gz"
    files = package_files(AXPY_DIR)
    files[".kernel_package/bench_result.yaml"] = (AXPY_DIR / ".kernel_package/bench_result.yaml").read_bytes()
    pkg.write_bytes(tarball_bytes(AXPY_ID, files))
    real = real_run(pkg, tmp_path / "run")
    assert real["overall"]["accept"] is True
    assert check_result(real, METAS, SIG, "cpu", Physics()) is None
    floors = {}
    for case in real["cases"]:
        n = next(m for m in METAS if m["test_case_id"] == case["test_case_id"])["params"]["n"]
        floors[case["test_case_id"]] = (4 + 12 * n) / (2 * 8e12) / 1e-6  # the cpu lane's cache figure, margin 2
    fake = axpy_result(AXPY_ID)
    for case in fake["cases"]:
        case["metrics"][0]["value"] = floors[case["test_case_id"]] / 100
    refused = check_result(fake, METAS, SIG, "cpu", Physics())
    first = refused.details["findings"][0]
    assert refused.code == "IMPLAUSIBLE_RESULT" and first["kind"] == "latency"
    assert first["test_case_id"] in refused.message and "floor" in refused.message
    assert first["floor"] == pytest.approx(floors[first["test_case_id"]])
    for case in fake["cases"]:
        case["metrics"][0]["value"] = floors[case["test_case_id"]] * 1.01
    assert check_result(fake, METAS, SIG, "cpu", Physics()) is None


def test_a_bandwidth_above_the_ceiling_is_refused_and_an_arch_without_one_has_no_floor():
    fake = axpy_result(AXPY_ID)
    fake["cases"][2]["metrics"][1]["value"] = 40_000.0  # GB/s: 40 TB/s from a CPU
    refused = check_result(fake, METAS, SIG, "cpu", Physics())
    assert refused.code == "IMPLAUSIBLE_RESULT" and refused.details["findings"][0]["kind"] == "bandwidth"
    assert "gbps" in refused.message
    unknown = check_result(axpy_result(AXPY_ID), METAS, SIG, "sm_999", Physics())
    assert unknown.code == "NO_FLOOR" and "sm_999" in unknown.message
    assert check_result(fake, METAS, SIG, "cpu", Physics(enabled=False)) is None


def test_physics_settings_from_kz_yaml(tmp_path):
    physics = parse_physics({"margin": 3, "sm_90": {"hbm_tbps": 5.0, "tflops": {"fp16": 1000}}}, "kz.yaml")
    assert physics.margin == 3.0 and physics.ceilings["sm_90"].hbm_bytes_per_s == 5e12
    assert physics.ceilings["sm_90"].l2_bytes == 60 * 1024 * 1024  # the rest keeps its default
    with pytest.raises(ZooError, match="physics.sm_90.hbm"):
        parse_physics({"sm_90": {"hbm": 1}}, "kz.yaml")
    with pytest.raises(ZooError, match="new arch"):
        parse_physics({"gfx1100": {"hbm_tbps": 1}}, "kz.yaml")
    config = Config.from_dict({"physics": {"enabled": False}}, tmp_path)
    assert config.physics.enabled is False


# -- validation: the package's own part ------------------------------------------------------

def test_validation_names_the_dim_the_case_and_the_params_it_has(tmp_path):
    assert validate_package_dir(SOFTMAX_DIR).valid
    pkg = tmp_path / "repo" / SOFTMAX_ID
    shutil.copytree(SOFTMAX_DIR, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    desc = pkg / ".kernel_package" / "desc.yaml"
    desc.write_bytes(desc.read_bytes().replace(*OLD_SOFTMAX_SHAPES))
    report = validate_package_dir(pkg, kernel_id=SOFTMAX_ID)
    found = [p for p in report.errors if p.code == "NO_FLOOR"]
    assert not report.valid and len(found) == 2 * len(SOFTMAX_METAS)  # R and C, once per case
    first = found[0]
    assert "'R'" in first.message and "'r64_c128'" in first.message and "['cols', 'dtype', 'logit_offset', 'rows']" \
        in first.message and first.field == "io_signature[0].shape[0]"


@pytest.mark.parametrize("change, words", [
    (lambda d: d.replace(b"dtype: fp32, shape: [rows, cols], semantics", b"dtype: fp31, shape: [rows, cols], semantics"),
     "dtype 'fp31'"),
    (lambda d: d.replace(b"shape: [rows, cols], semantics", b"shape: [rows, 0], semantics")
     .replace(b"dtype: fp32, shape: [rows, cols], shape_desc", b"dtype: fp32, shape: [0], shape_desc"), "moves no byte"),
])
def test_a_dtype_the_floor_does_not_know_or_a_case_that_moves_nothing_is_no_floor(change, words, tmp_path):
    pkg = tmp_path / "repo" / SOFTMAX_ID
    shutil.copytree(SOFTMAX_DIR, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    desc = pkg / ".kernel_package" / "desc.yaml"
    desc.write_bytes(change(desc.read_bytes()))
    report = validate_package_dir(pkg, kernel_id=SOFTMAX_ID)
    assert any(p.code == "NO_FLOOR" and words in p.message for p in report.errors), report.errors


def test_a_primary_metric_the_floor_cannot_read_is_no_floor():
    metas = [dict(SOFTMAX_METAS[0], primary_metric="speedup",
                  metrics=[{"name": "speedup", "unit": "x", "direction": "higher_better"}]),
             dict(SOFTMAX_METAS[1], metrics=[{"name": "latency_us", "unit": "us", "direction": "higher_better"}])]
    sig = yaml.safe_load((SOFTMAX_DIR / ".kernel_package/desc.yaml").read_text())["io_signature"]
    found = signature_problems(sig, metas)
    assert [p.field for p in found] == ["r64_c128.primary_metric", "r512_c1024.primary_metric"]


# -- the pipeline on the CPU lane --------------------------------------------------------------

def test_intake_refuses_a_desc_whose_dims_the_params_lack(zoo):
    view = drop_and_decide(zoo, "old.tar.gz", tarball_bytes(SOFTMAX_ID, _softmax_files(_old_desc)))
    assert view.status == "rejected"
    (reason,) = view.reasons
    assert reason["code"] == "NO_FLOOR" and "'R'" in reason["message"] and "r64_c128" in reason["message"]


def test_intake_refuses_an_arch_this_server_has_no_ceiling_for(zoo):
    view = drop_and_decide(zoo, "sm80.tar.gz", axpy_tarball("sm_80/Elementwise/Axpy/fp32/numpy_ref"))
    assert view.status == "rejected"
    (reason,) = view.reasons
    assert reason["code"] == "NO_FLOOR" and "sm_80" in reason["message"] and "physics.sm_80" in reason["message"]


def test_the_softmax_floor_is_on_and_refuses_an_impossible_latency(zoo):
    view = _report(zoo, "fast.tar.gz", tarball_bytes(SOFTMAX_ID, _softmax_files()), _softmax_result(1e-4))
    assert view.status == "rejected"
    (reason,) = view.reasons
    assert reason["code"] == "IMPLAUSIBLE_RESULT" and "below the physics floor" in reason["message"]


def test_a_secondary_bandwidth_above_the_arch_ceiling_is_refused(zoo):
    view = _report(zoo, "gbps.tar.gz", tarball_bytes(SOFTMAX_ID, _softmax_files()),
                   _softmax_result(50.0, gbps=50_000.0))  # 50 TB/s from a CPU; the latency itself is fine
    assert view.status == "rejected"
    (reason,) = view.reasons
    assert reason["code"] == "IMPLAUSIBLE_RESULT" and "gbps" in reason["message"] and "ceiling" in reason["message"]


def test_a_record_admitted_without_a_floor_is_not_accepted(zoo):
    """A submission admitted before the floor was always on (its record has no io_signature)."""
    view = drop_and_decide(zoo, "old-record.tar.gz", tarball_bytes(SOFTMAX_ID, _softmax_files()))
    record = zoo.pending.folder(view.uuid) / SUBMISSION_FILE
    facts = json.loads(record.read_text())
    del facts["io_signature"]
    record.write_text(json.dumps(facts))
    claim = zoo.claim("r", "cpu", 5)
    view = zoo.report_result(view.uuid, "r", claim.lease_id, _softmax_result(50.0), b"", {}, None)
    assert view.status == "rejected"
    (reason,) = view.reasons
    assert reason["code"] == "NO_FLOOR" and "r64_c128" in reason["message"]


def test_the_daemon_rejects_an_impossible_report(zoo):
    view = _report(zoo, "a.tar.gz", axpy_tarball(), axpy_result(AXPY_ID, 0.00001))
    assert view.status == "rejected"
    (reason,) = view.reasons
    assert reason["code"] == "IMPLAUSIBLE_RESULT" and "below the physics floor" in reason["message"]


def test_a_softmax_without_max_subtraction_fails_the_hard_range_case_through_the_pipeline(zoo, tmp_path):
    (cheat,) = input_cheat_packages(tmp_path / "cheats")
    assert cheat.name == "no_max_subtraction" and cheat.layer == "inputs"
    view = drop_and_decide(zoo, "nomax.tar.gz", tarball_bytes(SOFTMAX_ID, package_files(cheat.path)))
    assert view.status == "queued", view.reasons
    claim = zoo.claim("r1", "cpu", 5)
    result = real_run(zoo.runner_package(claim.uuid, "r1"), tmp_path / "run", runner_id="r1")
    correctness = {c["test_case_id"]: c["correctness"] for c in result["cases"]}
    assert correctness == {"r64_c128": "failed", "r512_c1024": "passed", "r2048_c512": "passed"}, result
    view = zoo.report_result(view.uuid, "r1", claim.lease_id, result, b"", {}, None)
    assert view.status == "rejected"
    assert view.reasons[0]["code"] == cheat.expected_code

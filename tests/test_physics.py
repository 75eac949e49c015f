"""The physics floor: bytes from io_signature, ceilings per arch, honest results pass, impossible ones are refused."""
from __future__ import annotations

import pytest
import yaml

from kz_daemon.config.settings import Config
from kz_daemon.core.errors import ZooError
from kz_daemon.guards.physics import Physics, case_bytes, check_result, parse_physics
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from kz_runner.contract.rules.pysource import read_metas
from tests.helpers.daemon import (AXPY_DIR, AXPY_ID, axpy_result, axpy_tarball, drop_and_decide, package_files,
                                  real_run, tarball_bytes)

DESC = yaml.safe_load((AXPY_DIR / ".kernel_package/desc.yaml").read_text())
METAS, _ = read_metas((AXPY_DIR / ".kernel_package/benchmark.py").read_text())
SIG = DESC["io_signature"]


def test_bytes_come_from_the_signature_and_each_cases_params():
    # a (fp32 scalar), x and y read, out written: 4 + 3 * 4 * n
    assert case_bytes(SIG, {"n": 1024}) == (4 + 3 * 4 * 1024, ["fp32"] * 4)
    assert case_bytes(SIG, {"m": 1024}) is None          # unresolved: no floor
    assert case_bytes([{"name": "x", "kind": "in", "dtype": "weird", "shape": [4]}], {}) is None
    assert case_bytes([{"name": "x", "kind": "inout", "dtype": "bf16", "shape": [2, "K"]}], {"K": 8}) == (64, ["bf16"])


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
    message, details = check_result(fake, METAS, SIG, "cpu", Physics())
    first = details["findings"][0]
    assert first["kind"] == "latency" and first["test_case_id"] in message and "floor" in message
    assert first["floor"] == pytest.approx(floors[first["test_case_id"]])
    for case in fake["cases"]:
        case["metrics"][0]["value"] = floors[case["test_case_id"]] * 1.01
    assert check_result(fake, METAS, SIG, "cpu", Physics()) is None


def test_a_bandwidth_above_the_ceiling_is_refused_and_unknown_archs_have_no_floor():
    fake = axpy_result(AXPY_ID)
    fake["cases"][2]["metrics"][1]["value"] = 40_000.0  # GB/s: 40 TB/s from a CPU
    message, details = check_result(fake, METAS, SIG, "cpu", Physics())
    assert details["findings"][0]["kind"] == "bandwidth" and "gbps" in message
    assert check_result(fake, METAS, SIG, "sm_999", Physics()) is None
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


def test_the_daemon_rejects_an_impossible_report(tmp_path):
    config = init_state_dir(tmp_path / "state")
    zoo = Zoo(config)
    zoo.start()
    try:
        view = drop_and_decide(zoo, "a.tar.gz", axpy_tarball())
        claim = zoo.claim("r", "cpu", 5)
        view = zoo.report_result(view.uuid, "r", claim.lease_id, axpy_result(AXPY_ID, 0.00001), b"", {}, None)
        assert view.status == "rejected"
        (reason,) = view.reasons
        assert reason["code"] == "IMPLAUSIBLE_RESULT" and "below the physics floor" in reason["message"]
    finally:
        zoo.stop()

"""The environment document: pure parsers and the collection on this machine."""
from __future__ import annotations

import doctest
import json
import platform

import pytest

from kz_runner import __version__
from kz_runner.worker import envinfo


def test_doctests():
    assert doctest.testmod(envinfo).failed == 0


def test_nvidia_smi_line_with_unreadable_fields_leaves_them_out():
    line = "NVIDIA H200, 570.86.15, 00000000:19:00.0, 34, 1980, 3201, 1980, 3201, [N/A], 700.00, P0, 143771"
    facts = envinfo.parse_nvidia_smi(line)
    assert facts["name"] == "NVIDIA H200" and facts["driver_version"] == "570.86.15"
    assert facts["temperature.gpu"] == 34 and facts["clocks.sm"] == 1980 and facts["power.limit"] == 700
    assert "power.draw" not in facts


def test_nvidia_smi_uses_the_tool_when_present(monkeypatch, tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho \"$@\" > " + str(tmp_path / "args") + "\n"
                    "echo 'NVIDIA H200, 570.1, 0:19:00.0, 40, 345, 2619, 1980, 3201, 75.3, 700, P0, 143771'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    facts = envinfo.nvidia_smi(1)
    assert facts["clocks.sm"] == 345 and facts["power.draw"] == 75.3
    assert "-i 1" in (tmp_path / "args").read_text()


def test_rocm_smi_json_is_flattened(monkeypatch, tmp_path):
    doc = {"card0": {"Card series": "AMD Instinct MI210", "Temperature (Sensor edge) (C)": "41.0"},
           "system": {"Driver version": "6.7.0"}}
    fake = tmp_path / "rocm-smi"
    fake.write_text("#!/bin/sh\ncat <<'X'\n" + json.dumps(doc) + "\nX\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    facts = envinfo.rocm_smi(0)
    assert facts["Card series"] == "AMD Instinct MI210" and facts["system.Driver version"] == "6.7.0"


def test_missing_or_failing_tools_are_left_out(monkeypatch, tmp_path):
    broken = tmp_path / "nvidia-smi"
    broken.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    broken.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert envinfo.nvidia_smi(0) == {}
    assert envinfo.rocm_smi(0) == {}


def test_collect_has_the_basics_and_is_json():
    env = envinfo.collect(None, "cpu", "r1", probe_gpu=False)
    assert env["runner_id"] == "r1" and env["arch"] == "cpu" and env["runner_version"] == __version__
    assert env["python_version"] == platform.python_version() and env["hostname"]
    json.dumps(env)


def test_collect_probes_cupy_in_a_child():
    env = envinfo.collect(0, "cpu", "r1")
    assert "cupy_version" in env["cupy"] or "cupy_error" in env["cupy"]
    json.dumps(env)


@pytest.mark.gpu
def test_collect_on_a_gpu_names_the_device_and_versions():
    from kz_runner.contract.arch import detect_arch

    probe = detect_arch(0)
    env = envinfo.collect(0, probe.arch, "r1")
    assert env["cupy"]["cupy_version"] and env["cupy"]["runtime_version"] > 0
    assert env["gpu_name"] == probe.device_name
    if env.get("nvidia_smi"):
        assert "temperature.gpu" in env["nvidia_smi"] or "clocks.sm" in env["nvidia_smi"]

"""Arch detection: the pure parsers, and the CuPy probe on this machine."""
from __future__ import annotations

import pytest

from kz_runner.contract import arch


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("gfx90a:sramecc+:xnack-", "gfx90a"),
        ("gfx928", "gfx928"),
        ("gfx942:sramecc+:xnack-", "gfx942"),
        (b"gfx1100\x00\x00\x00", "gfx1100"),
        ("  GFX90A:xnack+ ", "gfx90a"),
    ],
)
def test_rocm_arch_drops_feature_suffixes(raw, expected):
    assert arch.parse_rocm_arch(raw) == expected


@pytest.mark.parametrize("raw", ["", "sm_90", ":xnack-", "gfx", "gfx 90a"])
def test_rocm_arch_rejects_non_gfx_names(raw):
    with pytest.raises(ValueError):
        arch.parse_rocm_arch(raw)


@pytest.mark.parametrize(
    "cc, expected",
    [("90", "sm_90"), ("9.0", "sm_90"), (90, "sm_90"), ((9, 0), "sm_90"), ("86", "sm_86"),
     ("100", "sm_100"), ("12.0", "sm_120"), ((8, 9), "sm_89")],
)
def test_cuda_compute_capability_to_sm(cc, expected):
    assert arch.parse_cuda_cc(cc) == expected


@pytest.mark.parametrize("cc", ["", "9", "x90", "9.10", (9,), (0, 5), "sm_90"])
def test_cuda_compute_capability_rejects_garbage(cc):
    with pytest.raises(ValueError):
        arch.parse_cuda_cc(cc)


def test_arch_from_properties_picks_the_field_of_the_backend():
    assert arch.arch_from_properties({"gcnArchName": b"gfx90a:sramecc+:xnack-", "major": 9}, is_hip=True) == "gfx90a"
    assert arch.arch_from_properties({"major": 9, "minor": 0, "gcnArchName": b""}, is_hip=False) == "sm_90"
    with pytest.raises(ValueError):
        arch.arch_from_properties({"gcnArchName": b""}, is_hip=True)


def test_visible_device_env_selects_one_gpu_in_pci_order():
    env = arch.visible_device_env(3, base={"PATH": "/bin"})
    assert env == {"PATH": "/bin", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                   "CUDA_VISIBLE_DEVICES": "3", "HIP_VISIBLE_DEVICES": "3"}


def _has_gpu() -> bool:
    probe = arch.probe_cupy(0)
    return probe.backend != "none"


def test_probe_without_a_gpu_says_cpu_with_a_reason():
    if _has_gpu():
        pytest.skip("this machine has a GPU; the cpu fallback is not observable here")
    for isolated in (True, False):
        probe = arch.detect_arch(0, isolated=isolated)
        assert probe.arch == "cpu"
        assert probe.backend == "none"
        assert probe.reason


@pytest.mark.gpu
def test_probe_on_a_gpu_names_its_arch():
    probe = arch.detect_arch(0)
    assert probe.backend in ("cuda", "rocm")
    assert probe.arch.startswith("sm_" if probe.backend == "cuda" else "gfx")
    assert probe.device_name
    assert arch.detect_arch(0, isolated=False).arch == probe.arch

"""Architecture detection: ``gfx…`` on ROCm, ``sm_XY`` on CUDA, ``cpu`` without a GPU.

The parsing is pure (:func:`parse_rocm_arch`, :func:`parse_cuda_cc`,
:func:`arch_from_properties`) so it is unit-tested without a device. The probe
(:func:`probe_cupy`) asks CuPy about one device. :func:`detect_arch` runs that
probe in a short-lived child process by default: initialising CUDA or HIP in the
long-lived runner would keep a context (and GPU memory) alive next to every
benchmark, and a broken driver would crash the child, not the runner.

Run as ``python -m kz_runner.contract.arch [GPU]`` it prints the probe as one JSON line.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

CPU = "cpu"

_GFX = re.compile(r"^gfx[0-9a-z]+$")
_CC_DOTTED = re.compile(r"^(\d+)\.(\d+)$")
_CC_PLAIN = re.compile(r"^(\d+)$")


@dataclass(frozen=True)
class ArchProbe:
    """What arch detection found for one device."""

    # "gfx90a", "sm_90" or "cpu"
    arch: str
    # "rocm", "cuda" or "none" (no usable device: CuPy missing, no device, probe failed)
    backend: str
    # device name as the runtime reports it ("NVIDIA H200"), or None
    device_name: str | None = None
    # the raw value the arch came from ("gfx90a:sramecc+:xnack-", "90"), or None
    raw: str | None = None
    # why the arch is "cpu" when a GPU may have been expected, else None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of every field."""
        return asdict(self)


def parse_rocm_arch(gcn_arch_name: str | bytes) -> str:
    """``gcnArchName`` without feature suffixes: ``"gfx90a:sramecc+:xnack-"`` → ``"gfx90a"``.

    Raises ValueError for a value that is not a ``gfx`` name.
    """
    if isinstance(gcn_arch_name, bytes):
        gcn_arch_name = gcn_arch_name.split(b"\0", 1)[0].decode("ascii", "replace")
    base = gcn_arch_name.strip().split(":", 1)[0].strip().lower()
    if not _GFX.match(base):
        raise ValueError(f"not a ROCm gfx arch name: {gcn_arch_name!r}")
    return base


def parse_cuda_cc(cc: str | int | tuple[int, int]) -> str:
    """A CUDA compute capability as ``sm_XY``: ``"90"``, ``"9.0"``, ``90`` or ``(9, 0)`` → ``"sm_90"``.

    ``"100"`` (CuPy's form of 10.0) → ``"sm_100"``. Raises ValueError otherwise.
    """
    if isinstance(cc, tuple):
        if len(cc) != 2 or not all(isinstance(x, int) and x >= 0 for x in cc):
            raise ValueError(f"not a compute capability: {cc!r}")
        major, minor = cc
    else:
        text = str(cc).strip()
        dotted = _CC_DOTTED.match(text)
        plain = _CC_PLAIN.match(text)
        if dotted:
            major, minor = int(dotted.group(1)), int(dotted.group(2))
        elif plain and len(text) >= 2:
            # CuPy writes major and minor digits together; the minor is one digit.
            major, minor = int(text[:-1]), int(text[-1])
        else:
            raise ValueError(f"not a compute capability: {cc!r}")
    if major < 1 or minor > 9:
        raise ValueError(f"not a compute capability: {cc!r}")
    return f"sm_{major}{minor}"


def arch_from_properties(props: Mapping[str, Any], is_hip: bool) -> str:
    """The arch from a ``cupy.cuda.runtime.getDeviceProperties`` dict.

    ROCm: ``gcnArchName`` (feature suffixes dropped). CUDA: ``major``/``minor``.
    """
    if is_hip:
        name = props.get("gcnArchName")
        if not name:
            raise ValueError("device properties carry no gcnArchName")
        return parse_rocm_arch(name)
    return parse_cuda_cc((int(props["major"]), int(props["minor"])))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value)


def probe_cupy(index: int = 0) -> ArchProbe:
    """Ask CuPy, in this process, about device ``index``; ``cpu`` when there is none."""
    try:
        import cupy  # noqa: F401
        from cupy.cuda import runtime
    except Exception as exc:  # ImportError, or a CUDA/ROCm library that fails to load
        return ArchProbe(CPU, "none", reason=f"CuPy is not importable ({type(exc).__name__}: {exc})")
    try:
        count = runtime.getDeviceCount()
    except Exception as exc:
        return ArchProbe(CPU, "none", reason=f"CuPy finds no device ({type(exc).__name__}: {exc})")
    if count <= index:
        return ArchProbe(CPU, "none", reason=f"CuPy sees {count} device(s); index {index} is not one of them")
    is_hip = bool(getattr(runtime, "is_hip", False))
    try:
        props = runtime.getDeviceProperties(index)
        arch = arch_from_properties(props, is_hip)
    except Exception as exc:
        return ArchProbe(CPU, "none", reason=f"device {index} properties unreadable ({type(exc).__name__}: {exc})")
    raw = _text(props.get("gcnArchName")) if is_hip else f"{props.get('major')}{props.get('minor')}"
    return ArchProbe(arch, "rocm" if is_hip else "cuda", _text(props.get("name")), raw)


def visible_device_env(gpu: str | int | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with the visibility variables selecting ``gpu``.

    CUDA numbers devices fastest-first unless told otherwise; PCI bus order makes
    the index agree with ``nvidia-smi`` and systemd's ``kz-runner@N``.
    """
    env = dict(os.environ if base is None else base)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        env["HIP_VISIBLE_DEVICES"] = str(gpu)
    return env


def detect_arch(gpu: str | int | None = None, *, isolated: bool = True, timeout_s: float = 60.0) -> ArchProbe:
    """The arch of GPU ``gpu`` (an index as ``nvidia-smi``/``rocm-smi`` number them).

    ``isolated`` (the default) probes in a child process with only that GPU
    visible, so the caller never holds a GPU context; otherwise probes in-process
    at index ``gpu`` (0 when None).
    """
    if not isolated:
        return probe_cupy(int(gpu) if gpu is not None else 0)
    cmd = [sys.executable, "-m", "kz_runner.contract.arch", "0"]
    try:
        done = subprocess.run(
            cmd, env=visible_device_env(gpu), capture_output=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ArchProbe(CPU, "none", reason=f"arch probe did not finish ({type(exc).__name__})")
    try:
        doc = json.loads(done.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        return ArchProbe(**doc)
    except (ValueError, IndexError, TypeError):
        tail = done.stderr.decode("utf-8", "replace")[-300:]
        return ArchProbe(CPU, "none", reason=f"arch probe failed (exit {done.returncode}): {tail}")


def main(argv: list[str] | None = None) -> int:
    """Print the in-process probe of device ``argv[0]`` (default 0) as one JSON line."""
    argv = sys.argv[1:] if argv is None else argv
    index = int(argv[0]) if argv else 0
    print(json.dumps(probe_cupy(index).to_json()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

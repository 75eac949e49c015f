"""The environment a result was measured in, reported with every run.

Everything is optional except the basics (host, python, runner version, arch):
the GPU facts come from a CuPy probe in a child process (the runner holds no GPU
context), and clocks, temperature and driver from ``nvidia-smi`` or ``rocm-smi``
where those tools exist. A tool that is missing, slow or prints something
unexpected leaves its fields out; it never fails a run.
"""
from __future__ import annotations

import json
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from kz_runner import __version__
from kz_runner.contract.arch import visible_device_env

NVIDIA_FIELDS = (
    "name", "driver_version", "pci.bus_id", "temperature.gpu", "clocks.sm", "clocks.mem",
    "clocks.max.sm", "clocks.max.mem", "power.draw", "power.limit", "pstate", "memory.total",
)

# Runs in a child with only the runner's GPU visible (device 0 there).
_CUPY_PROBE = r"""
import json
out = {}
try:
    import cupy
    from cupy.cuda import runtime
    out["cupy_version"] = cupy.__version__
    out["backend"] = "rocm" if getattr(runtime, "is_hip", False) else "cuda"
    out["runtime_version"] = runtime.runtimeGetVersion()
    out["driver_version_api"] = runtime.driverGetVersion()
    if runtime.getDeviceCount() > 0:
        p = runtime.getDeviceProperties(0)
        name = p.get("name", b"")
        out["gpu_name"] = name.split(b"\0")[0].decode() if isinstance(name, bytes) else str(name)
        for key in ("multiProcessorCount", "l2CacheSize", "totalGlobalMem", "clockRate", "memoryClockRate"):
            if key in p:
                out[key] = int(p[key])
except Exception as exc:
    out["cupy_error"] = f"{type(exc).__name__}: {exc}"[:300]
print(json.dumps(out))
"""

Runner = Callable[[list[str], float], str | None]


def _run(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> str | None:
    """stdout of ``cmd`` when it exits 0 within the timeout, else None."""
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=timeout_s, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.decode("utf-8", "replace")


def _number(text: str) -> float | str | None:
    text = text.strip()
    if not text or text.startswith("[") or text.lower() in ("n/a", "[n/a]"):
        return None
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() else value


def parse_nvidia_smi(csv_line: str, fields: tuple[str, ...] = NVIDIA_FIELDS) -> dict[str, Any]:
    """One ``--format=csv,noheader,nounits`` line as ``{field: value}``, unreadable fields left out.

    >>> parse_nvidia_smi("NVIDIA H200, 570.1, 00000000:19:00.0, 31, 345, 2619, 1980, 3201, 75.3, 700.00, P0, 143771",)["clocks.sm"]
    345
    """
    values = [v.strip() for v in csv_line.strip().split(",")]
    out: dict[str, Any] = {}
    for name, raw in zip(fields, values):
        if name in ("name", "driver_version", "pci.bus_id", "pstate"):
            if raw and raw.lower() not in ("n/a", "[n/a]"):
                out[name] = raw
            continue
        value = _number(raw)
        if isinstance(value, (int, float)):
            out[name] = value
    return out


def nvidia_smi(gpu: str | int | None, run: Callable[..., str | None] = _run) -> dict[str, Any]:
    """Facts about GPU ``gpu`` from ``nvidia-smi``; {} when it is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    cmd = [exe, f"--query-gpu={','.join(NVIDIA_FIELDS)}", "--format=csv,noheader,nounits"]
    if gpu is not None:
        cmd += ["-i", str(gpu)]
    text = run(cmd, 15.0)
    if not text or not text.strip():
        return {}
    return parse_nvidia_smi(text.strip().splitlines()[0])


def rocm_smi(gpu: str | int | None, run: Callable[..., str | None] = _run) -> dict[str, Any]:
    """Facts about GPU ``gpu`` from ``rocm-smi --json``; {} when it is absent or fails."""
    exe = shutil.which("rocm-smi")
    if not exe:
        return {}
    cmd = [exe, "--showproductname", "--showtemp", "--showclocks", "--showdriverversion", "--json"]
    if gpu is not None:
        cmd += ["-d", str(gpu)]
    text = run(cmd, 15.0)
    try:
        doc = json.loads(text or "")
    except ValueError:
        return {}
    out: dict[str, Any] = {}
    for card, facts in doc.items() if isinstance(doc, dict) else ():
        if not isinstance(facts, dict):
            continue
        if card == "system":
            out.update({f"system.{k}": v for k, v in facts.items() if isinstance(v, (str, int, float))})
            continue
        out.update({k: v for k, v in facts.items() if isinstance(v, (str, int, float))})
    return out


def cupy_facts(gpu: str | int | None, timeout_s: float = 60.0) -> dict[str, Any]:
    """CuPy version, runtime/driver versions and device properties, from a child process."""
    env = visible_device_env(gpu)
    try:
        done = subprocess.run([sys.executable, "-c", _CUPY_PROBE], capture_output=True, env=env,
                              timeout=timeout_s, check=False)
        lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
        return json.loads(lines[-1]) if lines else {"cupy_error": f"probe exited {done.returncode}"}
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        return {"cupy_error": f"{type(exc).__name__}"}


def collect(gpu: str | int | None, arch: str, runner_id: str, *, probe_gpu: bool = True,
            cupy: dict[str, Any] | None = None) -> dict[str, Any]:
    """The environment document sent with each result (JSON-able).

    ``cupy``: facts from an earlier :func:`cupy_facts` call to reuse (they do not
    change while the runner lives); clocks and temperature are read every time.
    """
    env: dict[str, Any] = {
        "runner_id": runner_id,
        "runner_version": __version__,
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "arch": arch,
        "gpu_index": None if gpu is None else str(gpu),
    }
    if probe_gpu:
        env["cupy"] = cupy if cupy is not None else cupy_facts(gpu)
        if env["cupy"].get("gpu_name"):
            env["gpu_name"] = env["cupy"]["gpu_name"]
        smi = nvidia_smi(gpu)
        if smi:
            env["nvidia_smi"] = smi
            env.setdefault("gpu_name", smi.get("name"))
            env["driver_version"] = smi.get("driver_version")
        rsmi = rocm_smi(gpu)
        if rsmi:
            env["rocm_smi"] = rsmi
    return env

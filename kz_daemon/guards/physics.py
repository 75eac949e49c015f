"""The physics floor: a reported figure no hardware of the arch can reach is refused (IMPLAUSIBLE_RESULT).

The package's benchmark decides (the guide's rule); this module only guards the
conditions under which it decides. From ``desc.yaml``'s ``io_signature`` (dtype and
shape per tensor, symbolic dims resolved from each case's ``params``) a case must
move at least its bytes: every input read once, every output written once (an
``inout`` both). With a per-arch :class:`Ceiling` (``physics:`` in kz.yaml, defaults
below) that gives

- a latency floor (metric unit s/ms/us/ns, ``lower_better``): bytes / (bandwidth x margin),
  where the bandwidth is L2's when the case's bytes fit in L2, else HBM's;
- a bandwidth cap (GB/s, TB/s, ``higher_better``): that bandwidth x margin;
- a compute cap (GFLOPS, TFLOPS, ``higher_better``): the peak of the case's dtypes x margin.

The margin (default 2) keeps honest kernels far from the line: a floor must never
trip a real measurement, so a case whose shape cannot be resolved gets no floor,
and an unknown dtype or arch gets none either. Pure functions over values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from kz_daemon.core.errors import ZooError

__all__ = ["Ceiling", "Physics", "DEFAULT_CEILINGS", "DTYPE_BYTES", "case_bytes", "check_result",
           "parse_physics"]

TB = 1e12
MIB = 1024 * 1024

#: bytes per element of the vendor-neutral dtype names (desc.yaml io_signature).
DTYPE_BYTES: dict[str, float] = {
    "fp64": 8, "float64": 8, "fp32": 4, "float32": 4, "tf32": 4, "fp16": 2, "float16": 2, "half": 2,
    "bf16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int64": 8, "uint64": 8,
    "int32": 4, "uint32": 4, "int16": 2, "uint16": 2, "int8": 1, "uint8": 1, "bool": 1, "int4": 0.5,
    "uint4": 0.5, "fp4": 0.5,
}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_BANDWIDTH_UNITS = {"gb/s": 1e9, "tb/s": 1e12, "gbps": 1e9, "tbps": 1e12}
_COMPUTE_UNITS = {"gflops": 1e9, "tflops": 1e12, "gflop/s": 1e9, "tflop/s": 1e12}


@dataclass(frozen=True)
class Ceiling:
    """The most one device of an arch can do: memory bandwidths (bytes/s), L2 size, peak flop/s per dtype."""

    hbm_bytes_per_s: float
    l2_bytes_per_s: float
    l2_bytes: float
    flops: Mapping[str, float] = field(default_factory=dict)
    note: str = ""


#: Per-arch defaults. sm_90 (H200): device-to-device copy measured at 4.25 TB/s
#: (bytes read + written), datasheet HBM 4.8 TB/s; bf16 dense matrix ~790 TFLOP/s
#: measured, 989 datasheet; L2 60 MiB. gfx928 and the CPU lane: generous vendor-class
#: figures (operators with measurements set their own in kz.yaml).
DEFAULT_CEILINGS: dict[str, Ceiling] = {
    "sm_90": Ceiling(4.8 * TB, 12 * TB, 60 * MIB,
                     {"fp64": 67 * TB, "fp32": 67 * TB, "tf32": 495 * TB, "fp16": 990 * TB, "bf16": 990 * TB,
                      "fp8": 1979 * TB, "fp8_e4m3": 1979 * TB, "fp8_e5m2": 1979 * TB, "int8": 1979 * TB},
                     "H200: HBM 4.8 TB/s datasheet (4.25 measured copy), bf16 dense 989 TFLOP/s datasheet "
                     "(~790 measured), L2 60 MiB"),
    "gfx928": Ceiling(2.0 * TB, 8 * TB, 16 * MIB,
                      {"fp64": 50 * TB, "fp32": 100 * TB, "fp16": 400 * TB, "bf16": 400 * TB, "int8": 800 * TB},
                      "generous upper bounds for the reference DCU (HBM2e class); set measured values in kz.yaml"),
    "cpu": Ceiling(1.0 * TB, 8 * TB, 256 * MIB,
                   {"fp64": 20 * TB, "fp32": 20 * TB, "fp16": 20 * TB, "bf16": 20 * TB, "int8": 40 * TB},
                   "the CPU lane: far above any server socket"),
}


@dataclass(frozen=True)
class Physics:
    """The floors' settings: ``margin`` (the ceiling used is margin x the figure), ceilings per arch."""

    margin: float = 2.0
    ceilings: Mapping[str, Ceiling] = field(default_factory=lambda: dict(DEFAULT_CEILINGS))
    enabled: bool = True


def parse_physics(raw: Any, source: str) -> Physics:
    """``physics:`` of kz.yaml: {enabled, margin, arch: {hbm_tbps, l2_tbps, l2_mib, tflops: {dtype: n}}}.

    An arch given here replaces the figures it names and keeps the defaults of the
    rest; CONFIG_INVALID names a bad key.
    """
    if raw is None:
        return Physics()
    if not isinstance(raw, dict):
        raise _invalid(source, "physics", "'physics' must be a mapping")
    ceilings = dict(DEFAULT_CEILINGS)
    margin, enabled = 2.0, True
    for key, value in raw.items():
        if key == "margin":
            if not _number(value) or value < 1:
                raise _invalid(source, "physics.margin", "physics.margin must be a number >= 1")
            margin = float(value)
        elif key == "enabled":
            if not isinstance(value, bool):
                raise _invalid(source, "physics.enabled", "physics.enabled must be true or false")
            enabled = value
        else:
            ceilings[str(key)] = _parse_ceiling(value, ceilings.get(str(key)), source, f"physics.{key}")
    return Physics(margin=margin, ceilings=ceilings, enabled=enabled)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _parse_ceiling(raw: Any, base: Ceiling | None, source: str, where: str) -> Ceiling:
    if not isinstance(raw, dict):
        raise _invalid(source, where, f"{where} must be a mapping of hbm_tbps, l2_tbps, l2_mib, tflops")
    allowed = {"hbm_tbps", "l2_tbps", "l2_mib", "tflops", "note"}
    for key in raw:
        if key not in allowed:
            raise _invalid(source, f"{where}.{key}", f"unknown key {where}.{key} (allowed here: "
                           f"{', '.join(sorted(allowed))})")
    if base is None and not {"hbm_tbps", "l2_tbps", "l2_mib"} <= set(raw):
        raise _invalid(source, where, f"{where} is a new arch: give hbm_tbps, l2_tbps and l2_mib")
    values = {}
    for key, scale in (("hbm_tbps", TB), ("l2_tbps", TB), ("l2_mib", MIB)):
        if key in raw:
            if not _number(raw[key]):
                raise _invalid(source, f"{where}.{key}", f"{where}.{key} must be a positive number")
            values[key] = float(raw[key]) * scale
    flops = dict(base.flops) if base else {}
    tflops = raw.get("tflops") or {}
    if not isinstance(tflops, dict) or not all(_number(v) for v in tflops.values()):
        raise _invalid(source, f"{where}.tflops", f"{where}.tflops must map dtypes to positive numbers")
    flops.update({str(k): float(v) * TB for k, v in tflops.items()})
    hbm = values.get("hbm_tbps", base.hbm_bytes_per_s if base else 0.0)
    l2 = values.get("l2_tbps", base.l2_bytes_per_s if base else 0.0)
    l2_size = values.get("l2_mib", base.l2_bytes if base else 0.0)
    return Ceiling(hbm, l2, l2_size, flops, str(raw.get("note", base.note if base else "")))


def _invalid(source: str, key: str, message: str) -> ZooError:
    return ZooError("CONFIG_INVALID", f"{source}: {message}", {"path": source, "key": key})


def _dim(value: Any, params: Mapping[str, Any]) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    if not isinstance(value, str):
        return None
    if value in params:
        found = params[value]
    else:  # the guide's examples write N in the shape and n in the params
        matches = [v for k, v in params.items() if isinstance(k, str) and k.lower() == value.lower()]
        if len(matches) != 1:
            return None
        found = matches[0]
    return found if isinstance(found, int) and not isinstance(found, bool) and found >= 0 else None


def case_bytes(io_signature: Any, params: Mapping[str, Any]) -> tuple[float, list[str]] | None:
    """(the least bytes a case moves, its dtypes), or None when any tensor's size cannot be resolved."""
    if not isinstance(io_signature, list) or not io_signature:
        return None
    total = 0.0
    dtypes: list[str] = []
    for tensor in io_signature:
        if not isinstance(tensor, dict):
            return None
        dtype = str(tensor.get("dtype", "")).lower()
        size = DTYPE_BYTES.get(dtype)
        shape = tensor.get("shape")
        if size is None or not isinstance(shape, list):
            return None
        count = 1
        for value in shape:
            dim = _dim(value, params)
            if dim is None:
                return None
            count *= dim
        touches = 2 if tensor.get("kind") == "inout" else 1
        total += count * size * touches
        dtypes.append(dtype)
    return total, dtypes


def _metric_specs(meta: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    out = {}
    for m in meta.get("metrics") or []:
        if isinstance(m, dict) and isinstance(m.get("name"), str):
            out[m["name"]] = (str(m.get("unit", "")).strip().lower(), str(m.get("direction", "")))
    return out


def _case_findings(case: Mapping[str, Any], meta: Mapping[str, Any], io_signature: Any,
                   ceiling: Ceiling, margin: float) -> list[dict]:
    params = meta.get("params") if isinstance(meta.get("params"), dict) else {}
    moved = case_bytes(io_signature, params)
    if moved is None:
        return []
    nbytes, dtypes = moved
    bandwidth = ceiling.l2_bytes_per_s if nbytes <= ceiling.l2_bytes else ceiling.hbm_bytes_per_s
    bandwidth *= margin
    peaks = [ceiling.flops.get(d) for d in dtypes]
    flops_cap = max(peaks) * margin if peaks and all(p is not None for p in peaks) else None
    specs = _metric_specs(meta)
    found = []
    for metric in case.get("metrics") or []:
        if not isinstance(metric, dict) or metric.get("name") not in specs:
            continue
        value = metric.get("value")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            continue
        unit, direction = specs[metric["name"]]
        figure = {"test_case_id": case.get("test_case_id"), "metric": metric["name"], "value": value,
                  "unit": unit, "bytes": nbytes}
        if unit in _TIME_UNITS and direction == "lower_better" and nbytes > 0:
            floor = nbytes / bandwidth / _TIME_UNITS[unit]
            if value < floor:
                found.append(dict(figure, floor=floor, kind="latency"))
        elif unit in _BANDWIDTH_UNITS and direction == "higher_better":
            cap = bandwidth / _BANDWIDTH_UNITS[unit]
            if value > cap:
                found.append(dict(figure, ceiling=cap, kind="bandwidth"))
        elif unit in _COMPUTE_UNITS and direction == "higher_better" and flops_cap is not None:
            cap = flops_cap / _COMPUTE_UNITS[unit]
            if value > cap:
                found.append(dict(figure, ceiling=cap, kind="compute"))
    return found


def check_result(result: Any, metas: list[dict], io_signature: Any, arch: str,
                 physics: Physics) -> tuple[str, dict] | None:
    """(message, details) when a reported figure beats the arch's physics, else None."""
    ceiling = physics.ceilings.get(arch)
    if not physics.enabled or ceiling is None or not isinstance(result, dict):
        return None
    by_id = {m.get("test_case_id"): m for m in metas or [] if isinstance(m, dict)}
    findings: list[dict] = []
    for case in result.get("cases") or []:
        if isinstance(case, dict) and case.get("test_case_id") in by_id:
            findings.extend(_case_findings(case, by_id[case["test_case_id"]], io_signature, ceiling,
                                           physics.margin))
    if not findings:
        return None
    first = findings[0]
    if first["kind"] == "latency":
        what = (f"{first['metric']} = {first['value']:g} {first['unit']} is below the physics floor of "
                f"{first['floor']:.4g} {first['unit']}")
    else:
        what = (f"{first['metric']} = {first['value']:g} {first['unit']} is above the {arch} ceiling of "
                f"{first['ceiling']:.4g} {first['unit']}")
    message = (f"case {first['test_case_id']}: {what} (the case moves at least {first['bytes']:.0f} bytes; "
               f"{physics.margin:g}x the {arch} figures). No {arch} device can do this: the measurement "
               "is broken, not the kernel fast")
    return message, {"findings": findings, "arch": arch, "margin": physics.margin}

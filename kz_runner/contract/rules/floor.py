"""The physics floor: the least a case costs on an arch, so a figure no device can reach is refused.

The package's benchmark decides (the guide's rule); the floor only guards the
conditions under which it decides. From ``desc.yaml``'s ``io_signature`` (dtype and
shape per tensor) and a case's ``params``, a case moves at least its bytes: every
input read once, every output written once (an ``inout`` both). With a per-arch
:class:`Ceiling` (the server's ``physics:`` in kz.yaml, :data:`DEFAULT_CEILINGS`
otherwise) and a margin (default 2) that gives

- a latency floor (unit s/ms/us/ns, ``lower_better``): bytes / (bandwidth x margin),
  where the bandwidth is L2's when the case's bytes fit in L2, else HBM's;
- a bandwidth cap (GB/s, TB/s ..., ``higher_better``): that bandwidth x margin;
- a compute cap (GFLOPS, TFLOPS ..., ``higher_better``): the peak of the case's dtypes x margin.

**How a dim resolves.** Each entry of a tensor's ``shape`` is an integer >= 0, or a
name: the key of the case's ``params`` equal to it, else the one key equal to it
ignoring case (``N`` finds ``n``; two such keys are ambiguous), whose value is an
integer >= 0. Nothing else (no expressions, no defaults): a dim that does not resolve
in every case is a validation error (``NO_FLOOR``), because a floor that silently
switched off would let whoever writes desc.yaml switch it off.

**A case has a floor** when every tensor's dtype is known (:data:`DTYPE_BYTES`), every
dim resolves, it moves at least one byte, and its primary metric is one the floor
reads: a time unit that is ``lower_better``, or a bandwidth or compute unit that is
``higher_better`` (a compute one also needs the arch's peak for every dtype). The
validator checks what the package alone decides (:func:`signature_problems`); the
server checks the rest with its ceilings when a result is reported
(:func:`check_result`), and a case without a floor is not accepted. Pure functions
over values, shared by the daemon and ``kz dry-run``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kz_runner.contract.codes import problem
from kz_runner.contract.problems import Problem

__all__ = ["Ceiling", "Refusal", "DEFAULT_CEILINGS", "DEFAULT_MARGIN", "DTYPE_BYTES", "case_bytes",
           "check_result", "metric_kind", "resolve_dim", "signature_problems"]

TB = 1e12
MIB = 1024 * 1024
DEFAULT_MARGIN = 2.0

#: bytes per element of the vendor-neutral dtype names (desc.yaml io_signature).
DTYPE_BYTES: dict[str, float] = {
    "fp64": 8, "float64": 8, "fp32": 4, "float32": 4, "tf32": 4, "fp16": 2, "float16": 2, "half": 2,
    "bf16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_e4m3fn": 1, "fp8_e4m3fnuz": 1,
    "fp8_e5m2fnuz": 1, "int64": 8, "uint64": 8, "int32": 4, "uint32": 4, "int16": 2, "uint16": 2, "int8": 1,
    "uint8": 1, "bool": 1, "int4": 0.5, "uint4": 0.5, "fp4": 0.5, "complex64": 8, "complex128": 16,
}
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9}
BANDWIDTH_UNITS = {"mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12, "gib/s": 2.0 ** 30, "tib/s": 2.0 ** 40,
                   "gbps": 1e9, "tbps": 1e12}
COMPUTE_UNITS = {"gflops": 1e9, "tflops": 1e12, "pflops": 1e15, "gflop/s": 1e9, "tflop/s": 1e12,
                 "pflop/s": 1e15}


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
#: figures (operators with measurements set their own in kz.yaml). An arch missing here
#: has no floor: the server refuses its packages until kz.yaml names its figures.
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
class Refusal:
    """Why a result cannot be accepted: ``NO_FLOOR`` or ``IMPLAUSIBLE_RESULT``, one line, the figures."""

    code: str
    message: str
    details: dict

    def to_problem(self) -> Problem:
        """The refusal as a problem (``kz dry-run`` lists it among the checks)."""
        return problem(self.code, self.message, file="stdout")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _resolve(value: Any, params: Mapping[str, Any]) -> tuple[int | None, str]:
    """(the dim, '') or (None, why not) for one shape entry, as the module docstring says."""
    if _int(value):
        return (value, "") if value >= 0 else (None, f"{value} is negative")
    if not isinstance(value, str):
        return None, f"{value!r} is neither an integer nor a name"
    if value in params:
        key = value
    else:
        keys = [k for k in params if isinstance(k, str) and k.lower() == value.lower()]
        if len(keys) != 1:
            why = f"params has {sorted(keys)}, which differ only in case" if keys else "params has no such key"
            return None, why
        key = keys[0]
    found = params[key]
    if not _int(found) or found < 0:
        return None, f"params[{key!r}] is {found!r}, not an integer >= 0"
    return found, ""


def resolve_dim(value: Any, params: Mapping[str, Any]) -> int | None:
    """The size one shape entry names in a case's ``params`` (None when it does not resolve)."""
    return _resolve(value, params)[0]


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
            dim = resolve_dim(value, params)
            if dim is None:
                return None
            count *= dim
        touches = 2 if tensor.get("kind") == "inout" else 1
        total += count * size * touches
        dtypes.append(dtype)
    return total, dtypes


def metric_kind(unit: Any, direction: Any) -> str | None:
    """'latency', 'bandwidth' or 'compute' for a metric the floor reads, else None."""
    unit = str(unit or "").strip().lower()
    if unit in TIME_UNITS and direction == "lower_better":
        return "latency"
    if unit in BANDWIDTH_UNITS and direction == "higher_better":
        return "bandwidth"
    if unit in COMPUTE_UNITS and direction == "higher_better":
        return "compute"
    return None


def _primary(meta: Mapping[str, Any]) -> dict:
    for m in meta.get("metrics") or []:
        if isinstance(m, dict) and m.get("name") == meta.get("primary_metric"):
            return m
    return {}


def _params(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    return meta["params"] if isinstance(meta.get("params"), dict) else {}


def signature_problems(io_signature: Any, metas: Any, file: str = ".kernel_package/desc.yaml",
                       metas_file: str = ".kernel_package/benchmark.py") -> list[Problem]:
    """``NO_FLOOR`` problems for what the package alone decides: dtypes, dims, bytes, primary metrics.

    One problem per unknown dtype, per unresolved dim and case, per case that moves no
    byte, and per case whose primary metric the floor cannot read.
    """
    if not isinstance(io_signature, list) or not isinstance(metas, list):
        return []  # the schemas report a missing or malformed field
    out: list[Problem] = []
    tensors = [t for t in io_signature if isinstance(t, dict)]
    for index, tensor in enumerate(io_signature):
        if isinstance(tensor, dict) and str(tensor.get("dtype", "")).lower() not in DTYPE_BYTES:
            out.append(problem("NO_FLOOR", f"io_signature[{index}] ({tensor.get('name')}): dtype "
                               f"{tensor.get('dtype')!r} is not one the floor knows ({', '.join(sorted(DTYPE_BYTES))})",
                               file=file, field=f"io_signature[{index}].dtype"))
    for meta in metas:
        if not isinstance(meta, dict):
            continue
        case_id, params = meta.get("test_case_id"), _params(meta)
        named: set[str] = set()  # a dim shared by several tensors is named once per case
        for index, tensor in enumerate(io_signature):
            if not isinstance(tensor, dict) or not isinstance(tensor.get("shape"), list):
                continue
            for position, value in enumerate(tensor["shape"]):
                dim, why = _resolve(value, params)
                if dim is None and repr(value) not in named:
                    named.add(repr(value))
                    out.append(problem(
                        "NO_FLOOR", f"io_signature[{index}] ({tensor.get('name')}): shape dim {value!r} does not "
                        f"resolve in case {case_id!r}: {why} (its params: {sorted(map(str, params))})",
                        file=file, field=f"io_signature[{index}].shape[{position}]"))
        moved = case_bytes(tensors, params)
        if moved is not None and moved[0] <= 0:
            out.append(problem("NO_FLOOR", f"case {case_id!r} moves no byte by io_signature (a dim is 0), so "
                               "nothing bounds its time", file=file, field="io_signature"))
        primary = _primary(meta)
        if primary and metric_kind(primary.get("unit"), primary.get("direction")) is None:
            out.append(problem(
                "NO_FLOOR", f"case {case_id!r}: primary metric {primary.get('name')!r} ({primary.get('unit')!r}, "
                f"{primary.get('direction')}) is not one the floor reads: a time unit "
                f"({', '.join(TIME_UNITS)}) lower_better, or a bandwidth ({', '.join(BANDWIDTH_UNITS)}) or "
                f"compute ({', '.join(COMPUTE_UNITS)}) unit higher_better", file=metas_file,
                field=f"{case_id}.primary_metric"))
    return out


@dataclass(frozen=True)
class _CaseFloor:
    bytes: float
    bandwidth: float  # bytes/s, margin included
    flops_cap: float | None  # flop/s, margin included; None when a dtype's peak is unknown


def _case_floor(meta: Mapping[str, Any], io_signature: Any, ceiling: Ceiling,
                margin: float) -> _CaseFloor | str:
    """The floor of one case on ``ceiling``, or why it has none."""
    moved = case_bytes(io_signature, _params(meta))
    if moved is None:
        return "its io_signature does not resolve against its params (kz validate names the dim)"
    nbytes, dtypes = moved
    if nbytes <= 0:
        return "it moves no byte by io_signature"
    bandwidth = (ceiling.l2_bytes_per_s if nbytes <= ceiling.l2_bytes else ceiling.hbm_bytes_per_s) * margin
    peaks = [ceiling.flops.get(d) for d in dtypes]
    flops_cap = max(p for p in peaks if p is not None) * margin if peaks and None not in peaks else None
    primary = _primary(meta)
    kind = metric_kind(primary.get("unit"), primary.get("direction"))
    if kind is None:
        return f"its primary metric {primary.get('name')!r} ({primary.get('unit')!r}) is not one the floor reads"
    if kind == "compute" and flops_cap is None:
        return (f"its primary metric is a compute figure and the arch has no peak for "
                f"{sorted({d for d, p in zip(dtypes, peaks) if p is None})}")
    return _CaseFloor(nbytes, bandwidth, flops_cap)


def _findings(case: Mapping[str, Any], meta: Mapping[str, Any], floor: _CaseFloor) -> list[dict]:
    specs = {m["name"]: (str(m.get("unit", "")).strip().lower(), m.get("direction"))
             for m in meta.get("metrics") or [] if isinstance(m, dict) and isinstance(m.get("name"), str)}
    found = []
    for metric in case.get("metrics") or []:
        if not isinstance(metric, dict) or metric.get("name") not in specs:
            continue
        value = metric.get("value")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            continue
        unit, direction = specs[metric["name"]]
        figure = {"test_case_id": case.get("test_case_id"), "metric": metric["name"], "value": value,
                  "unit": unit, "bytes": floor.bytes}
        kind = metric_kind(unit, direction)
        if kind == "latency":
            limit = floor.bytes / floor.bandwidth / TIME_UNITS[unit]
            if value < limit:
                found.append(dict(figure, floor=limit, kind="latency"))
        elif kind == "bandwidth":
            limit = floor.bandwidth / BANDWIDTH_UNITS[unit]
            if value > limit:
                found.append(dict(figure, ceiling=limit, kind="bandwidth"))
        elif kind == "compute" and floor.flops_cap is not None:
            limit = floor.flops_cap / COMPUTE_UNITS[unit]
            if value > limit:
                found.append(dict(figure, ceiling=limit, kind="compute"))
    return found


def check_result(result: Any, metas: Any, io_signature: Any, arch: str,
                 ceilings: Mapping[str, Ceiling] = DEFAULT_CEILINGS,
                 margin: float = DEFAULT_MARGIN) -> Refusal | None:
    """Why a reported result cannot stand against the arch's physics, or None when it can.

    ``IMPLAUSIBLE_RESULT`` when a figure beats the ceiling x margin; else ``NO_FLOOR`` when
    the arch has no ceiling or a case has no floor (a result nothing bounds is not taken).
    """
    ceiling = ceilings.get(arch)
    if ceiling is None:
        return Refusal("NO_FLOOR", f"arch {arch!r} has no physics ceiling, so no result of it can be bounded "
                       f"(known: {', '.join(sorted(ceilings))}; the operator adds physics.{arch} to kz.yaml)",
                       {"arch": arch, "known": sorted(ceilings)})
    by_id = {m.get("test_case_id"): m for m in metas or [] if isinstance(m, dict)}
    floors: dict[Any, _CaseFloor] = {}
    missing: list[dict] = []
    for case_id, meta in by_id.items():
        floor = _case_floor(meta, io_signature, ceiling, margin)
        if isinstance(floor, str):
            missing.append({"test_case_id": case_id, "reason": floor})
        else:
            floors[case_id] = floor
    findings: list[dict] = []
    cases = result.get("cases") if isinstance(result, dict) else None
    for case in cases if isinstance(cases, list) else []:
        if isinstance(case, dict) and case.get("test_case_id") in floors:
            findings.extend(_findings(case, by_id[case["test_case_id"]], floors[case["test_case_id"]]))
    if findings:
        first = findings[0]
        if first["kind"] == "latency":
            what = (f"{first['metric']} = {first['value']:g} {first['unit']} is below the physics floor of "
                    f"{first['floor']:.4g} {first['unit']}")
        else:
            what = (f"{first['metric']} = {first['value']:g} {first['unit']} is above the {arch} ceiling of "
                    f"{first['ceiling']:.4g} {first['unit']}")
        message = (f"case {first['test_case_id']}: {what} (the case moves at least {first['bytes']:.0f} bytes; "
                   f"{margin:g}x the {arch} figures). No {arch} device can do this: the measurement "
                   "is broken, not the kernel fast")
        return Refusal("IMPLAUSIBLE_RESULT", message, {"findings": findings, "arch": arch, "margin": margin})
    if missing:
        first = missing[0]
        return Refusal("NO_FLOOR", f"case {first['test_case_id']} has no physics floor on {arch}: {first['reason']}; "
                       "a result nothing bounds is not taken", {"cases": missing, "arch": arch})
    return None

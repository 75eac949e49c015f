"""The physics floor as the daemon applies it: the operator's figures from kz.yaml, the floor's verdict on a report.

The floor itself (bytes from ``io_signature``, per-arch ceilings, how a dim resolves,
when a case has no floor) is pure and lives in ``kz_runner.contract.rules.floor``, so
``kz dry-run`` gives the server's verdict locally. Here: ``physics:`` in kz.yaml
(:class:`Physics`: the margin, per-arch figures replacing the defaults, the switch an
operator may turn off) and :func:`check_result`, which the accept path calls on every
result that would be accepted (``IMPLAUSIBLE_RESULT``, or ``NO_FLOOR`` when nothing
bounds a case), and :func:`floorless`, which intake calls so a package a case of which
has no floor on this server (an arch without a ceiling, say) is refused before it runs.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kz_daemon.core.errors import ZooError
from kz_runner.contract.rules import floor
from kz_runner.contract.rules.floor import DEFAULT_CEILINGS, DEFAULT_MARGIN, MIB, TB, Ceiling, Refusal

__all__ = ["Ceiling", "Physics", "DEFAULT_CEILINGS", "check_result", "floorless", "parse_physics"]


@dataclass(frozen=True)
class Physics:
    """The floors' settings: ``margin`` (the ceiling used is margin x the figure), ceilings per arch."""

    margin: float = DEFAULT_MARGIN
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
    margin, enabled = DEFAULT_MARGIN, True
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


def check_result(result: Any, metas: list[dict], io_signature: Any, arch: str,
                 physics: Physics) -> Refusal | None:
    """The floor's refusal of a reported result (``IMPLAUSIBLE_RESULT``, ``NO_FLOOR``), or None to let it stand."""
    if not physics.enabled:
        return None
    return floor.check_result(result, metas, io_signature, arch, physics.ceilings, physics.margin)


def floorless(metas: list[dict], io_signature: Any, arch: str, physics: Physics) -> Refusal | None:
    """``NO_FLOOR`` for a package a case of which has no floor on this server (its arch has no ceiling,
    or its primary compute metric no peak), checked at intake so it never runs; else None."""
    if not physics.enabled:
        return None
    return floor.check_result(None, metas, io_signature, arch, physics.ceilings, physics.margin)

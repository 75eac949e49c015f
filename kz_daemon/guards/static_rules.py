"""The static rules as the daemon applies them at intake: settings from kz.yaml, findings from a tarball.

The rules themselves are pure source analysis in ``kz_runner.contract.rules.engine`` (the
rule table is documented there and in docs/architecture.md). Here: ``rules:`` in
kz.yaml (the vendor-call list, the GEMM op classes, rules switched off) and
:func:`screen`, which reads the submitted source area out of a stored tarball and
splits the findings into the ones that reject and the ones that hold.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kz_daemon.core.errors import ZooError
from kz_runner.contract.layout import KP
from kz_runner.contract.rules.engine import (
    DEFAULT_GEMM_OP_CLASSES,
    DEFAULT_VENDOR_CALLS,
    HOLD,
    REJECT,
    RULES_BY_ID,
    RuleFinding,
    check_sources,
)
from kz_runner.contract.tarball import Limits, scan_tarball
from kz_runner.contract.validate import PackageRecord

__all__ = ["RuleSettings", "parse_rules", "screen"]


@dataclass(frozen=True)
class RuleSettings:
    """``rules:`` of kz.yaml: which calls count as vendor calls, which op classes are GEMMs, rules switched off."""

    vendor_calls: tuple[str, ...] = DEFAULT_VENDOR_CALLS
    gemm_op_classes: tuple[str, ...] = DEFAULT_GEMM_OP_CLASSES
    disabled: tuple[str, ...] = ()


def parse_rules(raw: Any, source: str) -> RuleSettings:
    """Parse ``rules:`` ({vendor_calls, gemm_op_classes, disabled}: lists of strings); CONFIG_INVALID otherwise."""
    if raw is None:
        return RuleSettings()
    if not isinstance(raw, dict):
        raise ZooError("CONFIG_INVALID", f"{source}: 'rules' must be a mapping", {"path": source, "key": "rules"})
    values = {}
    for key in raw:
        if key not in ("vendor_calls", "gemm_op_classes", "disabled"):
            raise ZooError("CONFIG_INVALID", f"{source}: unknown key rules.{key} (allowed here: disabled, "
                           "gemm_op_classes, vendor_calls)", {"path": source, "key": f"rules.{key}"})
        value = raw[key]
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ZooError("CONFIG_INVALID", f"{source}: rules.{key} must be a list of strings",
                           {"path": source, "key": f"rules.{key}"})
        values[key] = tuple(value)
    unknown = [r for r in values.get("disabled", ()) if r not in RULES_BY_ID]
    if unknown:
        raise ZooError("CONFIG_INVALID", f"{source}: rules.disabled names unknown rule {unknown[0]} "
                       f"(rules: {', '.join(RULES_BY_ID)})", {"path": source, "key": "rules.disabled"})
    return RuleSettings(**values)


def screen(tarball: Path, kernel_id: str, desc: dict, settings: RuleSettings,
           limits: Limits, record: PackageRecord | None = None) -> tuple[list[RuleFinding], list[RuleFinding]]:
    """(findings that reject, findings that hold) for the source area of a validated tarball.

    ``record``: the tarball as intake read it (with its source area), so it is not read again.
    """
    if record is not None:
        files = record.source_area_of(kernel_id)
    else:
        root = f"{kernel_id}/"
        scan = scan_tarball(tarball, limits, capture=lambda name: name.startswith(root)
                            and not name.startswith(f"{root}{KP}/"), capture_bytes=limits.member_bytes)
        files = {name[len(root):]: data for name, data in scan.captured.items()}
    category = desc.get("category")
    if not isinstance(category, dict):
        category = {}
    references = desc.get("reference_sources")
    if not isinstance(references, list):
        references = []
    found = [f for f in check_sources(files, op_class=str(category.get("op_class") or ""),
                                      reference_sources=[str(r) for r in references],
                                      vendor_calls=settings.vendor_calls,
                                      gemm_op_classes=settings.gemm_op_classes)
             if f.rule not in settings.disabled]
    return [f for f in found if f.action == REJECT], [f for f in found if f.action == HOLD]

"""``kz audit``: verify the event log's hash chain (and, where available, git and index.json)."""
from __future__ import annotations

import argparse
import json
import sys

from kz_events import defaults

NAME = "audit"
HELP = "verify the event log (hash chain, seqs, events) and report every divergence; exit 1 on errors"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``kz audit``."""
    parser.add_argument("--state-dir", default=defaults.STATE_DIR, metavar="DIR",
                        help=f"state directory (default {defaults.STATE_DIR}); the log is DIR/events")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def _as_dict(finding) -> dict:
    if hasattr(finding, "to_dict"):
        return finding.to_dict()
    if isinstance(finding, dict):
        return finding
    return {"code": "FINDING", "severity": "error", "message": str(finding)}


def _daemon_findings(state_dir) -> list[dict] | None:
    """Findings of kz_daemon.ops.repo_audit.audit_state_dir (git and index checks), where it applies.

    None when that module is absent or ``state_dir`` is not a daemon's state
    directory (no kz.yaml: only an event log to check).
    """
    import importlib
    import importlib.util

    if not (state_dir / "kz.yaml").is_file():
        return None
    if importlib.util.find_spec("kz_daemon.ops.repo_audit") is None:
        return None
    module = importlib.import_module("kz_daemon.ops.repo_audit")
    fn = getattr(module, "audit_state_dir", None)
    if fn is None:
        return None
    try:
        return [_as_dict(f) for f in fn(state_dir)]
    except Exception as exc:  # an audit that cannot run is itself a finding, not a crash
        return [{"code": "AUDIT_FAILED", "severity": "error",
                 "message": f"the git/index audit could not run: {type(exc).__name__}: {exc}"}]


def run(args: argparse.Namespace) -> int:
    """0 when nothing is wrong (warnings allowed), 1 on any error finding, 2 without a log."""
    from pathlib import Path

    state_dir = Path(args.state_dir)
    events_dir = state_dir / "events"
    if not events_dir.is_dir():
        print(f"kz audit: no event log at {events_dir} (use --state-dir)", file=sys.stderr)
        return 2
    from kz_events.read.audit import verify_log

    findings = [f.to_dict() for f in verify_log(events_dir)]
    extra = _daemon_findings(state_dir)
    if extra:
        findings.extend(extra)
    errors = [f for f in findings if f.get("severity", "error") == "error"]
    if args.json:
        print(json.dumps({"ok": not errors, "state_dir": str(state_dir),
                          "checked": ["events"] + (["daemon"] if extra is not None else []),
                          "findings": findings}, indent=2, ensure_ascii=False))
    else:
        for f in findings:
            where = f" {f['segment']}@{f['offset']}" if f.get("segment") else ""
            seq = f" seq {f['seq']}" if f.get("seq") is not None else ""
            print(f"{f.get('severity', 'error').upper()}{seq} [{f.get('code')}]{where}: {f.get('message')}")
        print(f"audit of {state_dir}: {len(errors)} error(s), {len(findings) - len(errors)} warning(s)")
    return 1 if errors else 0

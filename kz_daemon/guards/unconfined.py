"""Unconfined runs: a result measured without the runner's sandbox is never accepted (UNCONFINED_RUN).

A runner started with ``kz runner --unconfined-dev`` runs package code without its
sandbox (a development switch) and says so in the report's ``env.containment``
(``"unconfined": true``). Such a run proves nothing about the package and may have
touched the runner host, so whatever its result says, the submission is rejected with
``UNCONFINED_RUN``: nothing is committed and no best moves. Runs without the mark (every
sandboxed runner's) pass untouched.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kz_daemon.core.verdicts import Verdict

CODE = "UNCONFINED_RUN"


def is_unconfined(env: Any) -> bool:
    """Whether a report's ``env`` says its steps ran without a sandbox."""
    containment = env.get("containment") if isinstance(env, Mapping) else None
    return isinstance(containment, Mapping) and containment.get("unconfined") is True


def refuse(verdict: Verdict, env: Any) -> Verdict:
    """``verdict`` unchanged, unless it accepts a run ``env`` marks unconfined: then the rejection
    ``UNCONFINED_RUN``."""
    if not verdict.accepted or not is_unconfined(env):
        return verdict
    reason = env["containment"].get("reason") or "the runner ran without a sandbox"
    message = (f"this run was made without the runner's sandbox ({reason}); the zoo never accepts such a run: "
               "submit again to be measured by a sandboxed runner")
    return Verdict.rejecting(CODE, message, {"containment": dict(env["containment"])})

"""Facts about the machine a benchmark ran on, recorded beside every figure.

Imported by the scripts in this folder (run as ``python benchmarks/<script>.py``, so this
folder is on ``sys.path``).
"""
from __future__ import annotations

import os
import platform


def cpu_model() -> str | None:
    """The CPU model name from /proc/cpuinfo (None where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def machine_facts(**extra: object) -> dict:
    """CPU count and model, Python, platform and the 1-minute load average now, plus ``extra``."""
    facts = {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "python": platform.python_version(),
             "platform": platform.platform(), "loadavg_1m_at_end": round(os.getloadavg()[0], 2)}
    facts.update(extra)
    return facts

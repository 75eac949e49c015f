"""Facts about the host, read one way by the runner, `kz index` and the daemon."""
from __future__ import annotations

import os


def usable_cpus(limit: int | None = None) -> int:
    """The CPUs this process may run on (its scheduler affinity, else the host's count), at
    least 1 and at most ``limit`` when given.

    A container or a `taskset` pin narrows the affinity below ``os.cpu_count()``; workers
    sized by the host's count would then share the pinned cores.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, cpus if limit is None else min(cpus, limit))

"""usable_cpus: the CPUs a process may run on, which a pin narrows below the host's count."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kz_runner.contract.host import usable_cpus


def test_the_count_is_the_affinity_capped_by_the_limit():
    assert 1 <= usable_cpus() <= (os.cpu_count() or 1)
    assert usable_cpus(1) == 1
    assert usable_cpus(10_000) == usable_cpus()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no scheduler affinity on this OS")
def test_a_process_pinned_to_one_cpu_counts_one():
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from kz_runner.contract.host import usable_cpus; from kz_events.log import replay; "
            "print(usable_cpus(), usable_cpus(8), replay._cpus())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["1", "1", "1"]

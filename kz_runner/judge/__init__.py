"""``kz_runner.judge``: time submitted code from a process that never runs it.

The rule: once submitter code runs in a process, nothing in that process is
trusted. So the measurement is split in two processes.

- The JUDGE (:mod:`kz_runner.judge.referee`, trusted) never imports or calls
  anything from the package's ``src/``. It owns a secret seed (``os.urandom``,
  never sent anywhere), draws fresh inputs for every timed call from it, writes
  them into a shared-memory arena it owns (:mod:`kz_runner.judge.shm`), poisons
  every output slot, and keeps the reference side: after a batch returns it picks
  with the secret RNG which calls to compare, regenerates those calls' inputs
  privately (the arena's copy may have been rewritten by the worker), computes
  the reference and compares. It brackets every batch with its own clock and
  checks the worker's reported times against it (``TIMER_TAMPERED``).
- The WORKER (:mod:`kz_runner.judge.serve_kernel`, untrusted once the submitter's
  module is imported) is ``python -m kz_runner.judge.serve_kernel`` with an inherited
  socket and the arena's memfd. It imports the kernel (only it ever does), calls
  it on NumPy views of the arena, times each call with ``perf_counter_ns`` and
  replies with the per-call times. Whatever it forges stays in its own process.

Between batches the worker's process group is stopped (SIGSTOP) so it cannot
run while the judge fills inputs or reads outputs: all of its work happens
inside the judge's wall-clock interval, where the time check sees it.

Messages (:mod:`kz_runner.judge.protocol`) are length-prefixed JSON: the judge
never unpickles anything the worker sends. Findings carry stable codes:
``WRONG_OUTPUT``, ``TIMER_TAMPERED``, ``WORKER_CRASHED``, ``WORKER_TIMEOUT``,
``BAD_OUTPUT``, ``WORKER_ERROR``, ``PROTOCOL_ERROR``, and ``MACHINE_BUSY`` (no
verdict: the machine was too loaded for the timing to mean anything).

Stdlib + NumPy only; nothing here imports the rest of ``kz_runner``.
"""
from __future__ import annotations

__all__ = ["CODES", "Finding", "Judge", "JudgeResult", "fresh_like"]


def __getattr__(name: str):
    # Lazy, so ``python -m kz_runner.judge.serve_kernel`` does not load the judge's side.
    if name in __all__:
        from kz_runner.judge import referee as _judge

        return getattr(_judge, name)
    raise AttributeError(name)

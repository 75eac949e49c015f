"""The judge's device path on a real GPU: honest CuPy kernels pass, the CUDA cheat families are caught.

The judge allocates the inputs and outputs on the device and shares them with the worker by a
CUDA IPC handle; the worker times each call with CUDA events recorded in its own process and
synchronises before it replies; the judge fences each batch by counting the poison left in its
outputs. Each cheat below changes only the kernel module
(what a submitter controls): in the worker it can rewrite CuPy itself, and none of it reaches
the judge. Skipped, with the reason, where CuPy finds no device (``-m gpu`` runs them).
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kz_runner.judge import Judge, fresh_like
from kz_runner.judge.referee import TIMER_TAMPERED, WRONG_OUTPUT

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(sys.platform != "linux", reason="the judge's worker control is Linux-only")]

N = 1 << 22  # 16 MiB of float32 per array: each call ~10 us of an H200's bandwidth, above launch cost


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


@pytest.fixture(scope="module")
def xy(cp):
    rng = cp.random.default_rng(5)
    return rng.standard_normal(N, dtype=cp.float32), rng.standard_normal(N, dtype=cp.float32)


def reference(a, x, y):
    return a * x + y


def time_kernel(tmp_path: Path, xy, name: str, body: str, **options):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / f"{name}.py").write_text(textwrap.dedent(body))
    draw = fresh_like(*xy)

    def inputs_fn(rng: np.random.Generator) -> tuple:
        return (1.5, *draw(rng))

    options.setdefault("arena_max_bytes", 1 << 30)
    judge = Judge.start([], src, name, "axpy", harden=True)
    try:
        return judge.time(inputs_fn, reference, atol=1e-5, rtol=1e-5, budget_s=1.0, first_call_timeout_s=60.0,
                          **options)
    finally:
        judge.close()


def test_honest_kernel_passes_with_event_times(tmp_path, xy, cp):
    r = time_kernel(tmp_path, xy, "honest", """
    def axpy(a, x, y):
        return a * x + y
    """)
    assert r.ok, [f.line() for f in r.findings]
    assert r.compared > 0 and r.batch_size > 1
    # the worker's event times and the judge's own fenced wall agree batch by batch
    assert all(s <= w for s, w in zip(r.sums_ns, r.walls_ns))
    assert r.overhead["idle_probe_cal_ns"] > 0


def test_honest_out_argument_kernel_passes(tmp_path, xy, cp):
    src = tmp_path / "src"
    src.mkdir()
    (src / "outpos.py").write_text("import cupy as cp\n\ndef axpy(a, x, y, out):\n"
                                   "    cp.multiply(x, a, out=out)\n    out += y\n")
    draw = fresh_like(*xy)
    judge = Judge.start([], src, "outpos", "axpy", out_mode="out_pos", harden=True)
    try:
        r = judge.time(lambda rng: (1.5, *draw(rng)), reference, atol=1e-5, rtol=1e-5, budget_s=1.0,
                       arena_max_bytes=1 << 30)
    finally:
        judge.close()
    assert r.ok, [f.line() for f in r.findings]


def test_forged_event_times_gain_nothing(tmp_path, cp):
    """A GPU-bound kernel (64 MiB per array, 21 calls a batch: the shape that drew TIMER_TAMPERED on an H200,
    benchmarks/results/judge_h200/judged_axpy_cheats.jsonl) whose event times are divided by three: its sum
    falls under the judge's fenced wall (TIMER_TAMPERED). Were the batch launch-bound, the worker would report the
    launches' host time instead of the events', so a forged event clock could not lower the figure
    either: whatever the code, the forger's figure is never under the honest one."""
    rng = cp.random.default_rng(6)
    big = (rng.standard_normal(4 * N, dtype=cp.float32), rng.standard_normal(4 * N, dtype=cp.float32))
    honest = time_kernel(tmp_path, big, "honest_big", """
    def axpy(a, x, y):
        return a * x + y
    """, arena_max_bytes=4 << 30)
    assert honest.ok, [f.line() for f in honest.findings]
    r = time_kernel(tmp_path, big, "forge", """
    import cupy as cp
    _real = cp.cuda.get_elapsed_time
    cp.cuda.get_elapsed_time = lambda a, b: _real(a, b) / 3   # every call reported three times faster

    def axpy(a, x, y):
        return a * x + y
    """, arena_max_bytes=4 << 30)
    assert r.codes == [TIMER_TAMPERED] or (r.ok and r.batch_mean_median_ns >= 0.9 * honest.batch_mean_median_ns), \
        ([f.line() for f in r.findings], r.batch_mean_median_ns, honest.batch_mean_median_ns)


def test_work_left_running_after_the_reply_is_caught(tmp_path, xy, cp):
    r = time_kernel(tmp_path, xy, "tail", """
    import types
    import cupy as cp
    # no device sync before the reply, a tiny time claimed, the work queued on a stream of its own
    cp.cuda.Device = lambda *a, **k: types.SimpleNamespace(synchronize=lambda: None)
    cp.cuda.get_elapsed_time = lambda a, b: 0.001
    _s = cp.cuda.Stream(non_blocking=True)

    def axpy(a, x, y):
        with _s:
            out = a * x + y
            for _ in range(20):
                out = a * x + out - a * x
        return out
    """)
    assert r.codes and r.codes[0] in (TIMER_TAMPERED, WRONG_OUTPUT), [f.line() for f in r.findings]


def test_skipped_work_on_most_calls_is_caught(tmp_path, xy, cp):
    r = time_kernel(tmp_path, xy, "lazy", """
    _n = [0]

    def axpy(a, x, y):
        _n[0] += 1
        if _n[0] % 4:          # honest on one call in four: the ones it hopes are compared
            return y.copy()
        return a * x + y
    """)
    assert r.codes == [WRONG_OUTPUT], [f.line() for f in r.findings]


def test_cache_keyed_on_the_buffer_is_caught(tmp_path, xy, cp):
    r = time_kernel(tmp_path, xy, "bufcache", """
    _seen = {}

    def axpy(a, x, y):
        key = (x.data.ptr, y.data.ptr)   # the same slot gets fresh inputs every call
        if key not in _seen:
            _seen[key] = a * x + y
        return _seen[key]
    """)
    assert r.codes == [WRONG_OUTPUT], [f.line() for f in r.findings]


def test_reaching_for_the_judges_state_finds_nothing(tmp_path, xy, cp):
    """The in-process families (the library's result class, its check count, ``__main__``'s globals,
    frames, the trial generator found through ``gc``) have nothing to reach: the worker holds no seed,
    no schedule and no reference. The module looks, and fails its import if it finds any of them."""
    r = time_kernel(tmp_path, xy, "reach", """
    import gc, sys
    found = []
    main = sys.modules.get("__main__")
    for name in ("bench", "judge", "Judge", "trials", "master"):
        if main is not None and hasattr(main, name):
            found.append(name)
    for obj in gc.get_objects():
        if type(obj).__name__ in ("Judge", "Trials", "JudgeResult", "Generator", "PCG64"):
            found.append(type(obj).__name__)
    for frame in sys._current_frames().values():
        while frame is not None:
            if {"master", "_secret_seed", "seeds", "reference_fn"} & set(frame.f_locals):
                found.append("frame " + frame.f_code.co_name)
            frame = frame.f_back
    if found:
        raise RuntimeError(f"reached the judge's state: {found}")

    def axpy(a, x, y):
        return a * x + y
    """)
    assert r.ok, [f.line() for f in r.findings]

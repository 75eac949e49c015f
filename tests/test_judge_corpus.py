"""The public cheat corpus against the judge: every family aimed at the judge/worker split is stopped.

Each cheat (``tests/helpers/judge_cheats.py``, :func:`judge_cheat_packages`) is the Softmax
example with only ``src/`` changed, timed through :class:`kz_runner.judge.Judge` with a
real worker process and no static rules in the way: the judge alone must stop it, with
the code the corpus names. Three have no code: their trick cannot buy anything under
the judge (a content-keyed cache never hits on fresh inputs; front-loading a batch
still does all of the batch's work inside the judge's clock; a helper process that
leaves the worker's process group is stopped with the worker all the same), so they
must come out as honest kernels, timed no faster than a quarter of the honest
example's time.

The binary families (a ``.zip`` on ``sys.path``, a ``.pyc`` beside an honest ``.py``)
hide their code from the static rules, which hold them at intake: that hold is the
defence, and the last tests check it with the rules on.

Shapes are small (2 shared cores); no test needs a GPU.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kz_runner.contract.rules.engine import HOLD, check_sources
from kz_runner.judge import Judge, fresh_like
from kz_runner.judge.referee import MACHINE_BUSY, TIMER_TAMPERED, WRONG_OUTPUT
from tests.helpers.cheats import SOFTMAX
from tests.helpers.judge_cheats import JudgeCheat, judge_cheat_packages

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the judge's worker control is Linux-only")

ROOT = Path(__file__).resolve().parent.parent
HONEST_SRC = ROOT / "examples" / SOFTMAX / "src"
FAST = {"calls": 48, "min_batches": 6, "calibration_batches": 6}
MARKER = "KZ_CORPUS_RUN"  # set in every worker's environment: whatever a cheat leaves running carries it


def reference(x: np.ndarray) -> np.ndarray:
    """The Softmax benchmark's trusted expectation: float64, rounded once to float32."""
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def base_x() -> np.ndarray:
    rng = np.random.default_rng(11)
    offsets = rng.uniform(-50.0, 50.0, size=(128, 1))  # rows far from zero, as the example's first case
    return (3.0 * rng.standard_normal((128, 512)) + offsets).astype(np.float32)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, JudgeCheat]:
    return {c.name: c for c in judge_cheat_packages(tmp_path_factory.mktemp("judge_corpus"))}


def _leftovers(tag: str) -> list[int]:
    """Processes whose environment carries ``MARKER=tag`` (the worker's and anything it forked)."""
    needle = f"{MARKER}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def judge_src(src: Path, x: np.ndarray, tag: str, *, attempts: int = 3, **kw):
    """Time ``softmax.softmax_rows`` from ``src`` through the judge; kill whatever it left behind.

    MACHINE_BUSY is no verdict (the worker waited for a CPU as long as the time it did not
    report): as the judge asks, the timing is run again, up to ``attempts`` times.
    """
    env = {**os.environ, MARKER: tag}
    try:
        for _ in range(attempts):
            with Judge.start([], src, "softmax", "softmax_rows", env=env) as judge:
                r = judge.time(fresh_like(x), reference, atol=1e-6, rtol=1e-5, **{**FAST, **kw})
            if r.codes != [MACHINE_BUSY]:
                break
        return r
    finally:
        deadline = time.monotonic() + 5.0
        while _leftovers(tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in _leftovers(tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def assert_honest(r) -> None:
    """No accusation; MACHINE_BUSY (void, explained by the worker waiting for a CPU) is tolerated."""
    assert set(r.codes) <= {MACHINE_BUSY}, [f.line() for f in r.findings]
    if r.codes:
        assert r.findings[0].evidence["busy"], r.findings[0].evidence


@pytest.fixture(scope="module")
def honest(base_x):
    r = judge_src(HONEST_SRC, base_x, "honest")
    assert_honest(r)
    return r


# -- the corpus as a whole -------------------------------------------------------------------------------------

def test_the_corpus_covers_every_family_once_on_the_softmax_source_area(corpus):
    families = sorted({c.family for c in corpus.values()})
    assert families == list(range(1, 23)), families  # 21 twice: a helper in the group, and one out of it
    for c in corpus.values():
        assert (c.src / "softmax.py").is_file()
        assert (c.path / ".kernel_package" / "benchmark.py").read_bytes() == \
            (ROOT / "examples" / SOFTMAX / ".kernel_package" / "benchmark.py").read_bytes(), \
            f"{c.name}: the harness is locked, a cheat changes src/ only"
        assert set(c.expected) <= {WRONG_OUTPUT, TIMER_TAMPERED}, c.expected


# -- stopped, with its code ------------------------------------------------------------------------------------

STOPPED = ["result_property_alias", "check_count_importlib", "main_globals", "sys_dict_frames", "gc_trial_object",
           "zip_on_path", "latin1_frame_walk", "pyc_beside_py", "ctypes_clock", "seed_prediction",
           "cache_by_identity", "cache_by_shape", "empty_most_calls", "background_thread", "timer_patch",
           "patched_numpy_exp", "expected_files", "rewrite_inputs", "warmup_detection", "forked_helper"]


@pytest.mark.parametrize("name", STOPPED)
def test_the_judge_stops_the_cheat_with_its_code(corpus, base_x, name):
    cheat = corpus[name]
    assert cheat.expected, "a stopped family names its code"
    if name == "expected_files":  # the workdir the harness used to leave beside the source area
        (cheat.path / "expected").mkdir(exist_ok=True)
        np.save(cheat.path / "expected" / "r128_c512_out.npy", reference(base_x))
    r = judge_src(cheat.src, base_x, name)
    if cheat.expected == (TIMER_TAMPERED,) and r.codes == [MACHINE_BUSY]:
        # Three void timings in a row on an overloaded machine: never a pass, but no verdict either.
        assert r.findings[0].evidence["busy"] and not any(r.clean), r.findings[0].evidence
        return
    assert r.codes == list(cheat.expected), (name, [f.line() for f in r.findings])
    if r.codes == [TIMER_TAMPERED]:
        assert "report under" in r.findings[0].message  # caught by the judge's own clock, not by a crash
    else:
        assert r.findings[0].evidence["mismatches"] > 0  # caught by the comparison, on fresh inputs


# -- no finding: the trick buys nothing under the judge ----------------------------------------------------------

def test_a_content_keyed_cache_never_hits_and_is_timed_with_its_hashing(corpus, base_x, honest, capfd):
    cheat = corpus["cache_by_content"]
    assert cheat.expected == ()
    r = judge_src(cheat.src, base_x, "cache_by_content")
    assert_honest(r)
    assert "content cache: 0 hits" in capfd.readouterr().err  # printed by the worker at exit
    assert r.batch_mean_median_ns >= honest.batch_mean_median_ns / 4


def test_front_loading_a_batch_does_all_its_work_inside_the_clock(corpus, base_x, honest):
    # The first call of a batch finds every other call's input in the arena and computes them all; the judge
    # only checks sums, so the time moves between calls and stays in the batch: correct, and not faster.
    cheat = corpus["front_load_batch"]
    assert cheat.expected == ()
    r = judge_src(cheat.src, base_x, "front_load_batch")
    assert_honest(r)
    assert r.compared > 0
    assert r.batch_mean_median_ns >= honest.batch_mean_median_ns / 4


# -- the binary families: the static rules' hold is the defence ---------------------------------------------------

@pytest.mark.parametrize("name", ["zip_on_path", "pyc_beside_py"])
def test_with_the_rules_on_intake_holds_the_binary_families(corpus, name):
    cheat = corpus[name]
    files = {p.relative_to(cheat.path).as_posix(): p.read_bytes()
             for p in cheat.path.rglob("*") if p.is_file() and not p.relative_to(cheat.path).parts[0] == "expected"}
    found = [f for f in check_sources(files) if f.action == HOLD and f.rule == "prebuilt-binary"]
    binary = ".zip" if name == "zip_on_path" else ".pyc"
    assert any(f.file.endswith(binary) for f in found), [(f.rule, f.file) for f in check_sources(files)]
    if name == "pyc_beside_py":  # the .py beside it is the honest example: no rule finds anything there
        assert (cheat.src / "softmax.py").read_bytes() == (HONEST_SRC / "softmax.py").read_bytes()
        assert not [f for f in check_sources(files) if f.file == "src/softmax.py"]


# -- a helper that leaves the worker's process group ----------------------------------------------------------------

def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return chr(data[data.rindex(b")") + 2])


def test_a_helper_in_its_own_session_is_stopped_with_the_worker_and_buys_nothing(corpus, base_x, honest, capfd):
    # The helper calls setsid(), out of the worker's process group, to fill each poisoned output slot while the
    # judge prepares the batch. The judge stops every process below it, not a group: the helper only ever runs
    # inside the judge's clock, where its work is parallel work like any other.
    cheat = corpus["session_daemon"]
    assert cheat.expected == ()
    holder: dict[str, Judge] = {}
    states: list[tuple[str | None, str | None]] = []  # (worker, helper), sampled while the judge compares

    def comparing_reference(x):
        judge = holder.get("judge")
        if judge is not None and judge.loaded and judge.proc is not None:
            worker = judge.proc.pid
            for pid in _leftovers("session"):
                if pid != worker:
                    states.append((_state(worker), _state(pid)))
        return reference(x)

    env = {**os.environ, MARKER: "session"}
    try:
        judge = Judge.start([], cheat.src, "softmax", "softmax_rows", env=env)
        holder["judge"] = judge
        with judge:
            r = judge.time(fresh_like(base_x), comparing_reference, atol=1e-6, rtol=1e-5, **FAST)
    finally:
        time.sleep(0.2)
        for pid in _leftovers("session"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert "helper filled" in capfd.readouterr().err  # it ran, and the worker exited normally
    assert states, "a helper outside the worker's group existed while the judge compared"
    assert all(w in "tT" and h in ("t", "T", None) for w, h in states), states  # both stopped
    assert set(r.codes) <= {MACHINE_BUSY, TIMER_TAMPERED}, [f.line() for f in r.findings]
    if not r.codes:
        assert r.batch_mean_median_ns >= honest.batch_mean_median_ns / 4

"""Helpers for the daemon tests: pack example packages, drop them in the spool, run them for real.

``real_run`` executes the runner package exactly as a runner does on a CPU host:
safe unpack, ``python build_test_env.py <workdir>``, ``python benchmark.py
<workdir>`` as child processes, stdout parsed as the one JSON document.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.submissions import every

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
AXPY_ID = "cpu/Elementwise/Axpy/fp32/numpy_ref"
AXPY_DIR = EXAMPLES / AXPY_ID
SOFTMAX_ID = "cpu/Reduction/Softmax/fp32/numpy_ref"


def package_files(pkg_dir: Path) -> dict[str, bytes]:
    """{relative path: bytes} of a package dir, without bench_result.yaml and caches."""
    out = {}
    for path in sorted(pkg_dir.rglob("*")):
        rel = path.relative_to(pkg_dir).as_posix()
        if path.is_dir() or "__pycache__" in rel or rel == ".kernel_package/bench_result.yaml":
            continue
        out[rel] = path.read_bytes()
    return out


def tarball_bytes(kernel_id: str, files: dict[str, bytes], extra: Callable[[tarfile.TarFile], None] | None = None,
                  ) -> bytes:
    """A guide-style tar.gz: every file under ``<kernel_id>/``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, data in sorted(files.items()):
            info = tarfile.TarInfo(f"{kernel_id}/{rel}")
            info.size = len(data)
            info.mode = 0o755 if rel.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
        if extra is not None:
            extra(tar)
    return buf.getvalue()


def axpy_tarball(kernel_id: str = AXPY_ID, mutate: Callable[[dict], None] | None = None) -> bytes:
    """The CPU Axpy example packed as ``kernel_id`` (desc category rewritten to match), optionally mutated."""
    files = package_files(AXPY_DIR)
    parts = kernel_id.split("/")
    if len(parts) >= 4 and parts[:4] != AXPY_ID.split("/")[:4]:
        desc = files[".kernel_package/desc.yaml"].decode()
        for old, new in zip(AXPY_ID.split("/")[:4], parts[:4]):
            desc = desc.replace(f": {old}\n", f": {new}\n", 1)
        files[".kernel_package/desc.yaml"] = desc.encode()
    if mutate is not None:
        mutate(files)
    return tarball_bytes(kernel_id, files)


def drop_into_inbox(spool_root: Path, name: str, data: bytes, meta: dict | None = None) -> Path:
    """Write via spool/tmp and rename into spool/inbox (sidecar first), as every writer must."""
    tmp, inbox = spool_root / "tmp", spool_root / "inbox"
    stem = name[: -len(".tar.gz")] if name.endswith(".tar.gz") else name
    if meta is not None:
        (tmp / f"{stem}.meta.json").write_text(json.dumps(meta))
        os.replace(tmp / f"{stem}.meta.json", inbox / f"{stem}.meta.json")
    (tmp / name).write_bytes(data)
    os.replace(tmp / name, inbox / name)
    return inbox / name


def real_run(package: Path, workroot: Path, runner_id: str = "test-runner", timeout: float = 120) -> dict:
    """Unpack the runner package safely and run build_test_env.py then benchmark.py; the parsed result."""
    from kz_runner.contract.tarball import safe_unpack

    workroot.mkdir(parents=True, exist_ok=True)
    unpack = workroot / "pkg"
    if unpack.exists():
        shutil.rmtree(unpack)
    report = safe_unpack(package, unpack)
    assert report.valid, report.to_json()
    pkg = Path(report.facts["package_dir"])
    work = workroot / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    env = dict(os.environ, KZ_RUNNER_ID=runner_id)
    kp = pkg / ".kernel_package"
    subprocess.run([sys.executable, str(kp / "build_test_env.py"), str(work)], check=True, env=env,
                   capture_output=True, timeout=timeout)
    out = subprocess.run([sys.executable, str(kp / "benchmark.py"), str(work)], env=env,
                         capture_output=True, timeout=timeout)
    return json.loads(out.stdout)


def wait_for(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.02):
    """Poll ``predicate`` until truthy (returns it) or fail after ``timeout`` (a bound, not a measurement)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(interval)


AXPY_CASES = ("n4k", "n64k", "n1m")


def axpy_result(kernel_id: str, latency: float = 1.0, *, accept: bool = True, correctness: str = "passed",
                case_accept: bool | None = None) -> dict:
    """A benchmark_output document for the CPU Axpy example's three cases, as a runner would report."""
    cases = [{"test_case_id": cid, "correctness": correctness,
              "accept": accept if case_accept is None else case_accept,
              "metrics": [{"name": "latency_us", "value": latency}, {"name": "gbps", "value": 2.0}]}
             for cid in AXPY_CASES]
    return {"schema_version": "1.0.0", "kernel_id": kernel_id, "ran_at": "2026-01-01T00:00:00Z",
            "overall": {"accept": accept, "build_ok": True, "accept_reason": "test"}, "cases": cases}


@contextmanager
def seeded_zoo(tmp_path: Path, kz_yaml: str) -> Iterator:
    """A started in-process Zoo on ``tmp_path/kz``, seeded from the examples, ``kz_yaml`` as its kz.yaml."""
    from kz_daemon.config.settings import Config
    from kz_daemon.ops.runtime import init_state_dir
    from kz_daemon.ops.service import Zoo

    state = tmp_path / "kz"
    init_state_dir(state, seed_from=EXAMPLES)
    (state / "kz.yaml").write_text(kz_yaml)
    zoo = Zoo(Config.load(state))
    zoo.start()
    try:
        yield zoo
    finally:
        zoo.stop()


def drop_and_decide(zoo, name: str, data: bytes, meta: dict | None = None):
    """Drop ``data`` into ``zoo``'s inbox as ``name``; the submission's view once intake decided it."""
    before = set(every(zoo.store))
    drop_into_inbox(zoo.config.paths.spool, name, data, meta)
    (sub_uuid,) = wait_for(lambda: set(every(zoo.store)) - before)
    return zoo.wait_intake(sub_uuid, 30)


def drop_queued_axpy(zoo, kernel_id: str, name: str) -> str:
    """Drop an Axpy tarball for ``kernel_id`` and return its uuid once it is queued."""
    view = drop_and_decide(zoo, f"{name}.tar.gz", axpy_tarball(kernel_id))
    assert view.status == "queued", view.reasons
    return view.uuid


def accept_axpy(zoo, kernel_id: str, name: str, latency: float = 1.0):
    """Drop an Axpy tarball for ``kernel_id``, claim it as runner ``r`` and report an accepting result."""
    sub_uuid = drop_and_decide(zoo, f"{name}.tar.gz", axpy_tarball(kernel_id)).uuid
    claim = zoo.claim("r", "cpu", 5)
    view = zoo.report_result(sub_uuid, "r", claim.lease_id, axpy_result(kernel_id, latency), b"", {}, None)
    assert view.status == "accepted", view.reasons
    return view

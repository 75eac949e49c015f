"""Packages and tarballs for the contract tests (and benchmarks/bench_index.py).

``write_package`` writes a small valid CPU package whose files are the guide's
templates filled in; tests then break exactly one thing. ``NEWCOMER`` points at a
package written literally from the guide (tests/fixtures/contract/newcomer_repo).
"""
from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
NEWCOMER_REPO = ROOT / "tests" / "fixtures" / "contract" / "newcomer_repo"
NEWCOMER_ID = "gfx928/Attention/MHA/fp16/reference_impl"
NEWCOMER = NEWCOMER_REPO / NEWCOMER_ID
DEFAULT_ID = "cpu/Elementwise/Axpy/fp32/numpy_ref"

DESC = """\
schema_version: "1.0.0"
name: {name}
category:
  arch: {arch}
  op_class: {op_class}
  sub_class: {sub_class}
  quant: {quant}
summary: y = a * x + y in fp32 on the CPU.
description: |
  ## Math
  y[i] = a * x[i] + y[i].
io_signature:
  - {{name: x, kind: in, dtype: fp32, shape: [N]}}
  - {{name: y, kind: inout, dtype: fp32, shape: [N]}}
quantization:
  scheme: none
reference_sources: [src/axpy.py]
status: {status}
tags: [{tag}]
"""

RECORD = '{{value: {value}, submitter: {submitter}, commit_sha: "{sha}", recorded_at: "2026-08-02T00:00:00Z"}}'

BENCH_CASE = """\
  - test_case_id: {case}
    metrics_best:
      latency_ms: {best}
      gbps: {best}
    metrics_current:
      latency_ms: {current}
      gbps: {current}
    correctness_current: passed
"""

BUILD_ENV = '''\
from __future__ import annotations
import hashlib, json, sys
from pathlib import Path
import numpy as np

TEST_CASE_PARAMS = {params}
SEED = 0xBEEF


def build_env(workdir: Path) -> None:
    """Write inputs/, expected/ and build_manifest.json for every case."""
    workdir = Path(workdir)
    (workdir / "inputs").mkdir(parents=True, exist_ok=True)
    (workdir / "expected").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    manifest = {{"seed": SEED, "test_cases": {{}}}}
    for tc_id, params in TEST_CASE_PARAMS.items():
        x = rng.standard_normal(params["n"]).astype(np.float32)
        y = rng.standard_normal(params["n"]).astype(np.float32)
        np.save(workdir / "inputs" / f"{{tc_id}}_x.npy", x)
        np.save(workdir / "inputs" / f"{{tc_id}}_y.npy", y)
        np.save(workdir / "expected" / f"{{tc_id}}_y.npy", 2.0 * x + y)
        manifest["test_cases"][tc_id] = {{"params": params}}
    (workdir / "build_manifest.json").write_text(json.dumps(manifest, indent=2))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: build_test_env.py <workdir>", file=sys.stderr); return 2
    build_env(Path(argv[1])); return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
'''

META = """\
    {{
        "test_case_id": "{case}",
        "params": {{"n": {n}}},
        "primary_metric": "latency_ms",
        "metrics": [
            {{"name": "latency_ms", "unit": "ms", "direction": "lower_better"}},
            {{"name": "gbps", "unit": "GB/s", "direction": "higher_better"}},
        ],
        "tolerance": {{"correctness_atol": 1e-6, "correctness_rtol": 1e-6}},
    }},
"""

BENCHMARK = '''\
from __future__ import annotations
import json, sys
from pathlib import Path

from kz_runner import bench

KERNEL_ZOO_TEST_CASE_METAS = [
{metas}]
AXPY = bench.kernel("axpy", "axpy")  # named, never imported: the judge times it


def main(argv: list[str]) -> int:
    workdir = Path(argv[1])
    print(json.dumps({{"schema_version": "1.0.0", "kernel_id": "{kernel_id}", "cases": []}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
'''


def write_package(repo: Path, kernel_id: str = DEFAULT_ID, cases=("small", "large"), status: str = "normal",
                  category: tuple[str, str, str, str] | None = None, best: float = 0.5,
                  current: float | None = None, submitter: str = "seed", sha: str = "0000000",
                  tag: str = "axpy", name: str | None = None) -> Path:
    """Write a valid package at ``repo/kernel_id`` and return its directory."""
    pkg = Path(repo) / kernel_id
    kp = pkg / ".kernel_package"
    kp.mkdir(parents=True, exist_ok=True)
    (pkg / "src").mkdir(exist_ok=True)
    parts = kernel_id.split("/")
    cat = category or tuple((parts + ["x"] * 4)[:4])
    (kp / "desc.yaml").write_text(DESC.format(name=name or f"Axpy {parts[-1]}", arch=cat[0], op_class=cat[1],
                                              sub_class=cat[2], quant=cat[3], status=status, tag=tag))
    best_rec = RECORD.format(value=best, submitter=submitter, sha=sha)
    cur_rec = RECORD.format(value=best if current is None else current, submitter=submitter, sha=sha)
    bench = f'schema_version: "1.0.0"\nkernel_id: {kernel_id}\ncases:\n' + "".join(
        BENCH_CASE.format(case=c, best=best_rec, current=cur_rec) for c in cases)
    (kp / "bench_result.yaml").write_text(bench)
    params = "{" + ", ".join(f'"{c}": {{"n": {1024 * (i + 1)}}}' for i, c in enumerate(cases)) + "}"
    (kp / "build_test_env.py").write_text(BUILD_ENV.format(params=params))
    metas = "".join(META.format(case=c, n=1024 * (i + 1)) for i, c in enumerate(cases))
    (kp / "benchmark.py").write_text(BENCHMARK.format(metas=metas, kernel_id=kernel_id))
    (pkg / "src" / "axpy.py").write_text("def axpy(a, x, y):\n    return a * x + y\n")
    return pkg


def mark_repo(repo: Path) -> Path:
    """Mark ``repo`` as a kernel repo root (so kernel_ids derive from paths under it)."""
    Path(repo).mkdir(parents=True, exist_ok=True)
    (Path(repo) / ".kernel_zoo_root").write_text("")
    return Path(repo)


def copy_newcomer(repo: Path) -> Path:
    """Copy the guide-literal newcomer package into ``repo`` and return its directory."""
    dest = Path(repo) / NEWCOMER_ID
    shutil.copytree(NEWCOMER, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def file_member(name: str, data: bytes = b"x\n", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    """A regular-file member."""
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def dir_member(name: str) -> tuple[tarfile.TarInfo, None]:
    """A directory member."""
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info, None


def special_member(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    """A link, device or FIFO member (``kind`` is a tarfile type constant)."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info, None


def make_tarball(members, fmt: int = tarfile.PAX_FORMAT, compresslevel: int = 6) -> bytes:
    """A .tar.gz holding ``members`` (pairs from the helpers above), in order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=fmt, compresslevel=compresslevel) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def package_members(pkg: Path, kernel_id: str, include_bench: bool = False):
    """Members for every file of a package dir under ``kernel_id/`` (bench_result left out)."""
    out = [dir_member(kernel_id)]
    for path in sorted(pkg.rglob("*")):
        rel = path.relative_to(pkg).as_posix()
        if "__pycache__" in rel or (rel == ".kernel_package/bench_result.yaml" and not include_bench):
            continue
        name = f"{kernel_id}/{rel}"
        out.append(dir_member(name) if path.is_dir() else file_member(name, path.read_bytes()))
    return out

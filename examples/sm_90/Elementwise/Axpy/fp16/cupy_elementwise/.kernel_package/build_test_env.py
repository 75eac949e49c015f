"""Build the fp16 AXPY test environment: inputs/, expected/, build/ and build_manifest.json.

Deterministic: a fixed seed and NumPy's PCG64 generator, so two builds are bit-identical.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

# Must match KERNEL_ZOO_TEST_CASE_METAS in benchmark.py, one entry per case.
TEST_CASE_PARAMS = {
    "n16m": {"n": 16777216, "a": 1.5},
    "n64m": {"n": 67108864, "a": -0.75},
    "n32m": {"n": 33554432, "a": 2.25},
}
SEED = 0xA1F6  # fixed: never derive it from time or the environment


def build_env(workdir: Path) -> None:
    """Write inputs/<case>_{a,x,y}.npy, expected/<case>_out.npy and build_manifest.json."""
    from kz_runner.bench import write_build_manifest

    workdir = Path(workdir)
    inputs, expected = workdir / "inputs", workdir / "expected"
    for folder in (inputs, expected, workdir / "build"):
        folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    for case_id, params in TEST_CASE_PARAMS.items():
        n = params["n"]
        a = np.float32(params["a"])
        x = rng.standard_normal(n, dtype=np.float32).astype(np.float16)
        y = rng.standard_normal(n, dtype=np.float32).astype(np.float16)
        out = (np.float64(a) * x.astype(np.float64) + y.astype(np.float64)).astype(np.float16)
        np.save(inputs / f"{case_id}_a.npy", np.array(a, dtype=np.float32))
        np.save(inputs / f"{case_id}_x.npy", x)
        np.save(inputs / f"{case_id}_y.npy", y)
        np.save(expected / f"{case_id}_out.npy", out)
    write_build_manifest(workdir, seed=SEED, test_cases=TEST_CASE_PARAMS)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: build_test_env.py <workdir>", file=sys.stderr)
        return 2
    build_env(Path(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

"""Build the MHA test environment: inputs/, expected/, build/ and build_manifest.json.

Deterministic: a fixed seed and NumPy's PCG64 generator, so two builds are bit-identical.
The expectation is computed in float64 from the float16 inputs (head by head, to bound memory).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

# Must match KERNEL_ZOO_TEST_CASE_METAS in benchmark.py, one entry per case.
TEST_CASE_PARAMS = {
    "b8_h16_s512_d64": {"batch": 8, "heads": 16, "seq_len": 512, "head_dim": 64},
    "b4_h16_s512_d64": {"batch": 4, "heads": 16, "seq_len": 512, "head_dim": 64},
    "b2_h16_s1024_d128": {"batch": 2, "heads": 16, "seq_len": 1024, "head_dim": 128},
}
SEED = 0x5390  # fixed: never derive it from time or the environment


def reference_mha(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(q k^T / sqrt(D)) v in float64, one (batch, head) at a time; returns float16."""
    b, h, s, d = q.shape
    out = np.empty((b, h, s, d), dtype=np.float16)
    scale = 1.0 / np.sqrt(d)
    for i in range(b):
        for j in range(h):
            qf, kf, vf = (t[i, j].astype(np.float64) for t in (q, k, v))
            scores = qf @ kf.T * scale
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            out[i, j] = (p @ vf).astype(np.float16)
    return out


def build_env(workdir: Path) -> None:
    """Write inputs/<case>_{q,k,v}.npy, expected/<case>_o.npy and build_manifest.json."""
    from kz_runner.bench import write_build_manifest

    workdir = Path(workdir)
    inputs, expected = workdir / "inputs", workdir / "expected"
    for folder in (inputs, expected, workdir / "build"):
        folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    for case_id, p in TEST_CASE_PARAMS.items():
        shape = (p["batch"], p["heads"], p["seq_len"], p["head_dim"])
        q, k, v = (rng.standard_normal(shape, dtype=np.float32).astype(np.float16) for _ in range(3))
        for name, arr in (("q", q), ("k", k), ("v", v)):
            np.save(inputs / f"{case_id}_{name}.npy", arr)
        np.save(expected / f"{case_id}_o.npy", reference_mha(q, k, v))
    write_build_manifest(workdir, seed=SEED, test_cases=TEST_CASE_PARAMS)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: build_test_env.py <workdir>", file=sys.stderr)
        return 2
    build_env(Path(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

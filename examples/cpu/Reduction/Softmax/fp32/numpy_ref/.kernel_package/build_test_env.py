"""Build the softmax test environment: inputs/, expected/, build/ and build_manifest.json.

Deterministic: a fixed seed and NumPy's PCG64 generator, so two builds are bit-identical.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

# Must match KERNEL_ZOO_TEST_CASE_METAS in benchmark.py, one entry per case. logit_offset: each
# row of the case is shifted by its own offset drawn from [-logit_offset, logit_offset]; at
# 1000 most rows lie far outside the range where float32 exp neither overflows (above ~88)
# nor underflows to 0 (below ~-103), so only a max-subtracted softmax gets them right.
TEST_CASE_PARAMS = {
    "r64_c128": {"rows": 64, "cols": 128, "logit_offset": 1000.0},
    "r512_c1024": {"rows": 512, "cols": 1024, "logit_offset": 0.0},
    "r2048_c512": {"rows": 2048, "cols": 512, "logit_offset": 0.0},
}
SEED = 0x50F7  # fixed: never derive it from time or the environment
OFFSET_SEED = SEED + 1  # its own stream: the other cases' inputs do not depend on the offsets


def build_env(workdir: Path) -> None:
    """Write inputs/<case>_x.npy, expected/<case>_out.npy and build_manifest.json."""
    from kz_runner.bench import write_build_manifest

    workdir = Path(workdir)
    inputs, expected = workdir / "inputs", workdir / "expected"
    for folder in (inputs, expected, workdir / "build"):
        folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    offsets = np.random.default_rng(OFFSET_SEED)
    for case_id, params in TEST_CASE_PARAMS.items():
        x = 3.0 * rng.standard_normal((params["rows"], params["cols"]))
        if params["logit_offset"]:
            x += offsets.uniform(-params["logit_offset"], params["logit_offset"], size=(params["rows"], 1))
        x = x.astype(np.float32)
        x64 = x.astype(np.float64)
        e = np.exp(x64 - x64.max(axis=1, keepdims=True))
        out = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
        np.save(inputs / f"{case_id}_x.npy", x)
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

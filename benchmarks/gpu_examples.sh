#!/usr/bin/env bash
# GPU proof for the examples: `kz dry-run` on every sm_90 example and the gfx928
# example (CuPy code runs on CUDA too), kz_runner.bench vs triton do_bench, and
# repeatability of the sm_90 benchmarks (identical resubmissions).
#
#   benchmarks/gpu_examples.sh [OUTDIR]      # OUTDIR defaults to ./gpu-results
#   RUNS=20 benchmarks/gpu_examples.sh       # more repeat runs (default 8)
#
# Run on a GPU host after installing kernel_zoo with its CuPy extra (docs/deploy/README.md),
# plus torch and triton for the agreement check:
#
#   pip install -e '.[cuda13]' torch triton      # or [cuda12]; on ROCm, CuPy for your ROCm release
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-gpu-results}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
command -v kz >/dev/null || { echo "kz is not installed: pip install -e '.[cuda13]'" >&2; exit 2; }

{
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    git rev-parse HEAD 2>/dev/null || true
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv
    python3 - <<'PY'
import sys, numpy, cupy
print("python", sys.version.split()[0], "numpy", numpy.__version__, "cupy", cupy.__version__)
dev = cupy.cuda.Device()
print("device", dev.id, "cc", dev.compute_capability, "L2", dev.attributes.get("L2CacheSize"),
      "SMs", dev.attributes.get("MultiProcessorCount"), "runtime", cupy.cuda.runtime.runtimeGetVersion())
from kz_runner import bench
print("kz_runner.bench arch", bench.detect_arch(), "l2_cache_bytes", bench.l2_cache_bytes(cupy))
PY
} > "$OUTDIR/env.txt" 2>&1
cat "$OUTDIR/env.txt"

run_dry() {  # run_dry OUTFILE PKG...
    local out=$1; shift
    for pkg in "$@"; do
        echo "\$ kz dry-run $pkg"
        kz dry-run "$pkg"
        echo "exit status: $?"
        echo
    done 2>&1 | tee "$OUTDIR/$out"
}
run_dry dry_run_sm90_h200.txt examples/sm_90/*/*/*/*
run_dry dry_run_gfx928_on_h200.txt examples/gfx928/*/*/*/*

echo "\$ python3 benchmarks/bench_agreement.py --out bench_agreement_h200.json" | tee "$OUTDIR/bench_agreement_h200.txt"
python3 benchmarks/bench_agreement.py --out "$OUTDIR/bench_agreement_h200.json" 2>&1 | tee -a "$OUTDIR/bench_agreement_h200.txt"

echo "\$ python3 benchmarks/repeatability.py --runs ${RUNS:-8} --out repeatability_h200.json examples/sm_90/*/*/*/* examples/gfx928/*/*/*/*" \
    | tee "$OUTDIR/repeatability_h200.txt"
python3 benchmarks/repeatability.py --runs "${RUNS:-8}" --out "$OUTDIR/repeatability_h200.json" examples/sm_90/*/*/*/* examples/gfx928/*/*/*/* \
    2>&1 | grep -v ': run [0-9]*/' | tee -a "$OUTDIR/repeatability_h200.txt"

#!/usr/bin/env bash
# GPU proof for the examples: `kz dry-run` on every sm_90 example and the gfx928
# example (CuPy code runs on CUDA too), kz_runner.bench vs triton do_bench, and
# repeatability of the sm_90 benchmarks (identical resubmissions).
#
#   benchmarks/gpu_examples.sh [OUTDIR]      # OUTDIR defaults to $OUT, else ./gpu-results
#   RUNS=20 benchmarks/gpu_examples.sh       # more repeat runs (default 8)
#
# Needs python3 with numpy, pyyaml, cupy, torch+triton (for the agreement check)
# and jsonschema; where jsonschema is missing, wheels in .whl/ are installed to
# /tmp/site first (see /work/.library/device/README.md). The repo need not be
# installed: the repo root goes on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-${OUT:-gpu-results}}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
if ! python3 -c "import jsonschema" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# schemas/ ships as the package kz_schemas (a setuptools package-dir mapping): without an
# install, expose it through a link in a scratch folder on PYTHONPATH.
SHIM=$(mktemp -d /tmp/kz-shim.XXXXXX) && ln -s "$PWD/schemas" "$SHIM/kz_schemas"
export PYTHONPATH=$PWD:$SHIM${PYTHONPATH:+:$PYTHONPATH}

kz() {  # the kz console script, without needing it installed
    python3 -m kz_daemon "$@"
}

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

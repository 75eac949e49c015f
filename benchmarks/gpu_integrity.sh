#!/usr/bin/env bash
# GPU proof for the integrity work: the CUDA-only cheating packages are stopped with their
# codes, and honest resubmissions of the sm_90 examples pass through the whole pipeline with
# no false reject, their medians compared with the harness before the hardening.
#
#   benchmarks/gpu_integrity.sh [OUTDIR]           # OUTDIR defaults to ./gpu-results
#   RESUBMITS=20 OLD_TREE=/path/to/old/checkout benchmarks/gpu_integrity.sh OUTDIR
#
# OLD_TREE (optional) is a checkout of the code before the hardening (e.g.
# `git worktree add ../kz-old 3844496`); each sm_90 example is then dry-run there DRY_RUNS
# times (default 3) for the before-figures. Run on a GPU host after installing kernel_zoo
# with its CuPy extra and the test extra (docs/deploy/README.md):
#
#   pip install -e '.[cuda13,test]'      # or [cuda12]
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-gpu-results}
RESUBMITS=${RESUBMITS:-20}
DRY_RUNS=${DRY_RUNS:-3}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1

echo "== 1. CUDA-only cheats and the honest example with the runner's pipes (pytest -m gpu)"
python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/test_bench_hardening.py tests/test_bench.py \
    2>&1 | tee "$OUTDIR/gpu_cheats_pytest.txt"

echo "== 2. the harness before the hardening: kz dry-run medians"
if [ -n "${OLD_TREE:-}" ]; then
    for pkg in examples/sm_90/*/*/*/*; do
        for i in $(seq "$DRY_RUNS"); do
            (cd "$OLD_TREE" && PYTHONPATH="$OLD_TREE${PYTHONPATH:+:$PYTHONPATH}" \
                python3 -m kz_daemon dry-run --json "$pkg" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))') \
                >> "$OUTDIR/old_dry_run.jsonl" 2>/dev/null || echo "old dry-run of $pkg failed (run $i)"
        done
    done
else
    echo "OLD_TREE not set: skipped"
fi

echo "== 3. honest resubmissions through the whole pipeline"
args=()
for pkg in examples/sm_90/*/*/*/*; do args+=("$pkg:$RESUBMITS"); done
python3 benchmarks/pipeline_proof.py --out "$OUTDIR/pipeline" --concurrent-resubmits 0 "${args[@]}" \
    2>&1 | tee "$OUTDIR/pipeline_proof.txt"

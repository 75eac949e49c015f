#!/usr/bin/env bash
# GPU proof for the integrity work: the CUDA-only cheating packages are stopped with their
# codes, and honest resubmissions of the examples pass through the whole pipeline with
# no false reject, their medians compared with the harness before the hardening.
#
#   benchmarks/gpu_integrity.sh [OUTDIR]           # OUTDIR defaults to ./gpu-results
#   RESUBMITS=20 OLD_TREE=/path/to/old/checkout benchmarks/gpu_integrity.sh OUTDIR
#
# OLD_TREE (optional) is a checkout of the code before the hardening (e.g.
# `git worktree add ../kz-old 3844496`); each example is then dry-run DRY_RUNS times
# (default 3) there and here, interleaved, for the before-figures. EXAMPLES (default: the sm_90 ones) is a list of
# example folders; ARCH_RUNNERS (default: none) starts one more runner per ARCH[:GPU] for
# examples of other arches: `cpu` for examples/cpu, and e.g. `gfx928:0` runs the gfx928
# example's portable code on an NVIDIA GPU (say so when you quote it). CHEATS=0 skips step 1.
# Run on a GPU host after installing kernel_zoo with its CuPy extra and the test extra
# (docs/deploy/README.md):
#
#   pip install -e '.[cuda13,test]'      # or [cuda12]
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-gpu-results}
RESUBMITS=${RESUBMITS:-20}
DRY_RUNS=${DRY_RUNS:-3}
EXAMPLES=${EXAMPLES:-$(echo examples/sm_90/*/*/*/*)}
CHEATS=${CHEATS:-1}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1

echo "== 1. CUDA-only cheats and the honest example with the runner's pipes (pytest -m gpu)"
if [ "$CHEATS" != 0 ]; then
    python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/test_bench_hardening.py tests/test_bench.py \
        2>&1 | tee "$OUTDIR/gpu_cheats_pytest.txt"
else
    echo "CHEATS=0: skipped"
fi

echo "== 2. interleaved kz dry-runs of the harness before the hardening (old) and this one (new)"
if [ -n "${OLD_TREE:-}" ]; then
    here=$PWD
    for i in $(seq "$DRY_RUNS"); do
        for pkg in $EXAMPLES; do
            for side in old new; do
                tree=$here; [ "$side" = old ] && tree=$OLD_TREE
                (cd "$tree" && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" python3 -m kz_daemon dry-run --json "$pkg") \
                    2>/dev/null | SIDE=$side PKG=$pkg ROUND=$i python3 -c 'import json, os, sys
print(json.dumps({"tree": os.environ["SIDE"], "pkg": os.environ["PKG"], "round": int(os.environ["ROUND"]),
                  "doc": json.load(sys.stdin)}))' >> "$OUTDIR/ab_dry_run.jsonl" \
                    || echo "$side dry-run of $pkg failed (round $i)"
            done
        done
    done
else
    echo "OLD_TREE not set: skipped"
fi

echo "== 3. honest resubmissions through the whole pipeline"
args=()
for pkg in $EXAMPLES; do args+=("$pkg:$RESUBMITS"); done
for spec in ${ARCH_RUNNERS:-}; do args+=(--arch-runner "$spec"); done
python3 benchmarks/pipeline_proof.py --out "$OUTDIR/pipeline" --concurrent-resubmits 0 "${args[@]}" \
    2>&1 | tee "$OUTDIR/pipeline_proof.txt"

echo "== 4. the table"
ab=(); [ -s "$OUTDIR/ab_dry_run.jsonl" ] && ab=(--ab "$OUTDIR/ab_dry_run.jsonl")
python3 benchmarks/integrity_table.py "${ab[@]}" "$OUTDIR/pipeline/pipeline_proof.json" | tee "$OUTDIR/table.md"

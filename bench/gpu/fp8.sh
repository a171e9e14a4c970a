#!/usr/bin/env bash
# FP8 outputs at the copy limit (issue "Beyond every peer", item 6): correctness and same-run
# timing of the FP8 merges from the current templates against those of a base commit.
#
#   bench/gpu/fp8.sh build   (here)   builds into .device/fp8/ (git-ignored; carry it): the GPU
#                                       test binary, tests/gpu-extra.toml's kernels (every FP8
#                                       variant, PTX), the two kernels of the exhaustive conversion
#                                       test, and bench/gpu/fp8-bench.toml's kernels from the
#                                       current templates (new) and from BASE's (default: main)
#   bench/gpu/fp8.sh run     (there)  from the repo root, no Rust toolchain needed; writes $OUT/fp8/
#                                       (or .device/out/fp8/): the Rust GPU suite's quick subset on
#                                       generated/ + gpu-extra (FP8 included), the exhaustive FP8
#                                       conversion on all 2^32 float32 (integer path and sm_90
#                                       instruction + NaN fix-up), the group rule's branch-free
#                                       divisions against IEEE division on all 2^32 float32
#                                       (fp8_div_check.cu, built with nvcc there against
#                                       bench-new's group kernels), pytest test_fp8.py, the
#                                       group kernels of base and new compared bit for bit
#                                       (fp8_same_bits.py), then
#                                       bench_families.py's FP8 table base/new/base/new (cold L2,
#                                       copy measured in each call) and fp8_report.py. ~3 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=.device/fp8
case "${1:-}" in
build)
    scripts/install-nvrtc.sh
    rm -rf "$D" && mkdir -p "$D/bin"
    cargo build --release --quiet
    cp target/release/mla-gen "$D/bin/"
    # generated/'s images (build outputs, not in git) for the run there: carry generated/kernels too.
    MLA_GEN_BIN="$D/bin/mla-gen" scripts/images.sh
    scripts/gpu-test-binary.sh gpu "$D/bin/test-gpu"
    "$D/bin/mla-gen" generate tests/gpu-extra.toml --out "$D/extra" --quiet
    "$D/bin/mla-gen" generate tests/gpu-fp8.toml --arch compute_80 --out "$D/conv-integer" --quiet
    "$D/bin/mla-gen" generate tests/gpu-fp8.toml --arch sm_90 --out "$D/conv-instruction" --quiet
    "$D/bin/mla-gen" generate bench/gpu/fp8-bench.toml --arch sm_90 --out "$D/bench-new" --quiet
    base="${BASE:-main}"
    mkdir -p "$D/base-templates/c"
    for f in $(git ls-tree -r --name-only "$base" templates); do
        git show "$base:$f" > "$D/base-templates/${f#templates/}"
    done
    "$D/bin/mla-gen" generate bench/gpu/fp8-bench.toml --templates "$D/base-templates" --arch sm_90 \
        --out "$D/bench-base" --quiet
    echo "base templates: $base ($(git rev-parse --short "$base")); new: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- templates || echo ' + uncommitted template changes')" > "$D/base.txt"
    # SASS instructions on each kernel's blend path (one thread), where cuobjdump is at hand.
    if command -v cuobjdump > /dev/null; then
        for side in base new; do
            for c in "$D/bench-$side"/kernels/*.sm_90.cubin; do
                cuobjdump -sass "$c" > "${c%.sm_90.cubin}.sass"
            done
            python3 bench/gpu/sass_path.py "$D/bench-$side"/kernels/*.sass | sed "s/^/$side: /"
        done | tee "$D/sass-path.txt"
    fi
    echo "built $D ($(du -sh "$D" | cut -f1)); on the GPU machine: bench/gpu/fp8.sh run (carry $D and generated/kernels)"
    ;;
run)
    OUT="${OUT:-.device/out}/fp8"; mkdir -p "$OUT"
    export PYTHONUNBUFFERED=1
    status=0
    { cat "$D/base.txt"; date -u +%Y-%m-%dT%H:%MZ
      nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/report.txt"
    echo "== Rust GPU suite, quick subset: generated/ + gpu-extra (every FP8 variant)" | tee -a "$OUT/report.txt"
    MLA_GEN_GPU_QUICK=1 MLA_GEN_GPU_EXTRA="$D/extra" MLA_GEN_GPU_REPORT="$OUT/report.txt" \
        "$D/bin/test-gpu" --test-threads=1 every_kernel_matches > "$OUT/suite.log" 2>&1 || status=1
    tail -n 3 "$OUT/suite.log"
    echo "== FP8 conversion on every float32 (integer path, sm_90 instruction + NaN fix-up)" | tee -a "$OUT/report.txt"
    MLA_GEN_GPU_FP8="$D/conv-integer:$D/conv-instruction" MLA_GEN_GPU_REPORT="$OUT/report.txt" \
        "$D/bin/test-gpu" --test-threads=1 fp8_conversion > "$OUT/conversion.log" 2>&1 || status=1
    tail -n 3 "$OUT/conversion.log"
    echo "== group scale divisions on every float32 (fp8_div_check.cu, nvcc, against IEEE division)" | tee -a "$OUT/report.txt"
    nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
    mkdir -p "$D/div-check"
    for v in "" _ue8m0; do
        k="$PWD/$D/bench-new/kernels/merge_attn_states_bf16_d128_thr_lse_fp8g128$v.cu"
        { "$nvcc" -O3 -arch=sm_90 -DGROUP_KERNEL="\"$k\"" ${v:+-DUE8M0} -o "$D/div-check/check$v" \
              bench/gpu/fp8_div_check.cu && "$D/div-check/check$v"; } > "$OUT/div-check$v.log" 2>&1 || status=1
        grep -E "^(group_|fp8_div_check)" "$OUT/div-check$v.log" | tee -a "$OUT/report.txt" ||
            { echo "fp8_div_check$v: FAIL (no result, see div-check$v.log)" | tee -a "$OUT/report.txt"; status=1; }
    done
    echo "== pytest test_fp8.py on gpu-extra" | tee -a "$OUT/report.txt"
    (MLA_GEN_KERNELS="$D/extra" PYTHONPATH=python python3 -m pytest -q -p no:cacheprovider \
        python/tests/test_fp8.py > "$OUT/pytest.log" 2>&1) || status=1
    tail -n 1 "$OUT/pytest.log" | tee -a "$OUT/report.txt"
    echo "== group kernels, base templates vs new: the same bits (fp8_same_bits.py)" | tee -a "$OUT/report.txt"
    python3 bench/gpu/fp8_same_bits.py "$D/bench-base" "$D/bench-new" > "$OUT/same-bits.log" 2>&1 || status=1
    tail -n 1 "$OUT/same-bits.log" | tee -a "$OUT/report.txt"
    echo "== timing: base/new/base/new, FP8 table of bench_families.py" | tee -a "$OUT/report.txt"
    for round in 1 2; do
        for side in base new; do
            mkdir -p "$OUT/$side-$round"
            MLA_GEN_KERNELS="$D/bench-$side" python3 bench/bench_families.py --only fp8 \
                --fp8-shapes 4096x32 8192x32 16384x32 32768x32 16384x128 32768x128 --fp8-groups 16 128 \
                --out "$OUT/$side-$round" > "$OUT/$side-$round/bench.log" 2>&1 || status=1
            tail -n 13 "$OUT/$side-$round/bench.log"
        done
    done
    python3 bench/gpu/fp8_report.py "$OUT" | tee -a "$OUT/report.txt" || status=1
    exit $status
    ;;
*)
    echo "usage: bench/gpu/fp8.sh build|run   (see the comment at the top)" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Programmatic dependent launch (spec key pdl) on a GPU, in two halves (the GPU machine has no
# Rust toolchain or compiler):
#
#   bench/gpu/pdl.sh build   (here)  into .device/pdl/: the kernels of tests/gpu-pdl.toml
#                                      (gen/), the producer tests/pdl/producer.cu as sm_90 PTX and
#                                      CUBIN, and the test binary test-gpu-pdl. Run it after
#                                      `scripts/gpu-check.sh build`, which empties .device/.
#   bench/gpu/pdl.sh run     (there) from the repository root, with .device carried: the late-
#                                      write correctness tests, then the producer -> merge bench
#                                      (eager and CUDA graph, with and without PDL). Logs and
#                                      bench.json in $OUT/pdl (default .device/out/pdl). ~1 minute.
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
build)
    scripts/install-nvrtc.sh
    rm -rf .device/pdl && mkdir -p .device/pdl
    cargo build --release --quiet
    target/release/mla-gen generate tests/gpu-pdl.toml --out .device/pdl/gen --quiet
    # The producer: compiled by NVRTC in a test that writes it where MLA_GEN_PDL_OUT says.
    MLA_GEN_PDL_OUT=.device/pdl cargo test --release --quiet --test pdl the_producer_compiles_for_sm_90 > /dev/null
    scripts/gpu-test-binary.sh gpu_pdl .device/pdl/test-gpu-pdl
    ls .device/pdl/producer.sm_90.ptx .device/pdl/producer.sm_90.cubin .device/pdl/gen/manifest.json > /dev/null
    echo "built .device/pdl ($(du -sh .device/pdl | cut -f1)); run 'bench/gpu/pdl.sh run' on the GPU machine with .device carried"
    ;;
run)
    OUT="${OUT:-.device/out}/pdl"; mkdir -p "$OUT"
    export MLA_GEN_PDL_DIR=.device/pdl MLA_GEN_PDL_BENCH_JSON="$OUT/bench.json"
    status=0
    {
        echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed "s/^/gpu: /" || echo "gpu: (no nvidia-smi)"
    } | tee "$OUT/report.txt"
    echo "== late writes: the pdl merge against the float64 reference, and the control" | tee -a "$OUT/report.txt"
    timeout 120 .device/pdl/test-gpu-pdl --test-threads=1 2>&1 | tee "$OUT/correctness.log" | tail -n 20 || status=1
    grep -E "test result|mismatches|SKIPPED|panicked" "$OUT/correctness.log" >> "$OUT/report.txt" || true
    echo "== bench: producer -> merge pairs, us per pair" | tee -a "$OUT/report.txt"
    timeout 150 .device/pdl/test-gpu-pdl --ignored --test-threads=1 pdl_pair_bench 2>&1 | tee "$OUT/bench.log" || status=1
    grep -vE "^(running|test |$)" "$OUT/bench.log" >> "$OUT/report.txt" || true
    exit $status
    ;;
*)
    echo "usage: bench/gpu/pdl.sh build|run   (see the comment at the top)" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Host cost per launch of the C launcher beside the Rust runtime's (issue 23: the checks within
# 0.7 us of a bare cuLaunchKernel), in two halves:
#
#   bench/gpu/check_cost.sh build  (here)  into .device/check-cost/: mla-gen (release) and the C
#                                            launcher of examples/c/spec.toml (bf16, D = 128).
#                                            Carry .device/check-cost (or, instead, the .device of
#                                            `scripts/gpu-check.sh build`: its bin/mla-gen and
#                                            c-example/ serve as well).
#   bench/gpu/check_cost.sh run    (there) builds bench/gpu/check_cost.c with gcc against the
#                                            launcher and the driver, for two kernels, then runs
#                                            both and `mla-gen bench --only bf16:128 --shapes
#                                            4096x16 --l2 cold` (the Rust host line) in
#                                            alternation, twice. Prints each host's lines and one
#                                            table for docs/PERFORMANCE.md: report.txt (and
#                                            raw.log, every log) in $OUT/check-cost (default
#                                            .device/out/check-cost). Under a minute.
#
# Both hosts time back-to-back calls on T = 1, H = 1 (threshold 1, output lse, dense strides) on
# buffers sized for at least 4096 x 16 rows: the median of 20 rounds of 500 calls, the stream
# synchronized before each round. The Rust line times the last kernel `bench` timed: with
# --only bf16:128 merge_attn_states_bf16_d128_thr_lse_dense, called itself (by default f32 D = 128's
# dense twin). The C program times that kernel's launcher the same way, and the general kernel's
# (what an engine calls: its check, then the choice of the dense twin, which it launches).
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
build)
    scripts/install-nvrtc.sh
    rm -rf .device/check-cost && mkdir -p .device/check-cost
    cargo build --release --quiet
    cp target/release/mla-gen .device/check-cost/
    # generated/'s images (build outputs, not in git) for the run there: carry generated/kernels too.
    MLA_GEN_BIN=.device/check-cost/mla-gen scripts/images.sh
    .device/check-cost/mla-gen generate examples/c/spec.toml --out .device/check-cost/gen --emit c --quiet
    echo "built .device/check-cost ($(du -sh .device/check-cost | cut -f1)); run 'bench/gpu/check_cost.sh run' on the GPU machine with it and generated/kernels carried"
    ;;
run)
    OUT="${OUT:-.device/out}/check-cost"; mkdir -p "$OUT"
    work="$(mktemp -d)"  # binaries and logs; $OUT gets report.txt and raw.log (every log)
    trap 'cat "$work"/*.log > "$OUT/raw.log" 2>/dev/null; rm -rf "$work"' EXIT
    if [ -x .device/check-cost/mla-gen ]; then
        mla_gen=.device/check-cost/mla-gen launcher=.device/check-cost/gen/c
    else
        mla_gen=.device/bin/mla-gen launcher=.device/c-example/c
    fi
    [ -x "$mla_gen" ] && [ -f "$launcher/mla_kernels.c" ] ||
        { echo "no $mla_gen or $launcher: run 'bench/gpu/check_cost.sh build' here and carry .device/check-cost and generated/kernels" >&2; exit 1; }
    cuda="${CUDA_HOME:-/usr/local/cuda}"
    # The kernel the Rust line times (the last one `bench` times: the dense twin, called itself)
    # and the general kernel an engine calls (its launcher runs the dense twin at this call).
    kernels="merge_attn_states_bf16_d128_thr_lse_dense merge_attn_states_bf16_d128_thr_lse"
    # Warnings shown, not fatal: another gcc here must not cost the measurement (.ci/c.sh builds
    # this file with -Werror -pedantic).
    for k in $kernels; do
        gcc -std=c11 -O2 -Wall -Wextra -pthread -DCHECK_COST_KERNEL="$k" -I"$cuda/include" -I"$launcher" \
            bench/gpu/check_cost.c -L"$cuda/lib64/stubs" -lcuda -o "$work/check_cost_$k"
    done
    {
        echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed "s/^/gpu: /" || true
    } | tee "$OUT/report.txt"
    for round in 1 2; do
        for k in $kernels; do "$work/check_cost_$k" > "$work/c-$k-$round.log"; done
        "$mla_gen" bench --kernels generated --only bf16:128 --shapes 4096x16 --l2 cold --reps 20 \
            --json "$work/rust-$round.json" > "$work/rust-$round.log"
    done
    {
        echo "== the lines as each host prints them, round 1 then round 2"
        for round in 1 2; do
            for k in $kernels; do grep -E '^(kernel|host cost)' "$work/c-$k-$round.log"; done
            grep '^host cost' "$work/rust-$round.log"
        done
        echo "== for docs: us per call, the median of 20 rounds of 500 calls (C: the minimum in brackets);"
        echo "   T=1 H=1 threshold 1, dense strides, buffers of >= 4096x16 rows; $(grep -h '^device:' "$work"/c-*-1.log | head -n 1)"
        grep -h '^| host' "$work"/c-*-1.log | head -n 1
        echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
        for round in 1 2; do
            for k in $kernels; do
                sed -n "s/^| C launcher: \([^ |]*\) |/| C launcher: \1, round $round |/p" "$work/c-$k-$round.log"
            done
            python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
launch, checks, bare = r["host_us_per_launch"], r["host_us_validation_only"], r["host_us_bare_cu_launch_kernel"]
kernel = r["rows"][-1]["kernel"]  # host_cost times the last kernel bench timed
print(f"| Rust runtime: {kernel}, round {sys.argv[2]} | {launch:.2f} | {checks:.3f} | - | {bare:.2f} | {launch - bare:.2f} | - | - |")' \
                "$work/rust-$round.json" "$round"
        done
    } | tee -a "$OUT/report.txt"
    ;;
*)
    echo "usage: bench/gpu/check_cost.sh build|run   (see the comment at the top)" >&2; exit 2 ;;
esac

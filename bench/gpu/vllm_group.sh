#!/usr/bin/env bash
# vLLM's per-token-group FP8 merge (output_block_scale, quant_group_size, quant_scale_ue8m0)
# beside mla_gen.vllm.patch()'s route to mla-gen's group kernels (issue #34), in two halves:
#
#   bench/gpu/vllm_group.sh build   (here)  into .device/vllm/ (git-ignored; carry .device/vllm):
#                                             kernels/  bench/vllm-group.toml generated
#                                             triton_merge_attn_states.py  vLLM's Triton file with
#                                               merge_attn_states_group_fp8_kernel, copied from
#                                               $VLLM_TRITON_SRC (default .device/vllm-src/): no
#                                               vLLM release on PyPI has it yet, so it comes from a
#                                               vLLM checkout, never from git here
#   bench/gpu/vllm_group.sh run     (there) bench/vllm_group_check.py on those kernels with the
#                                             tree's python/ (torch and Triton installed, no vLLM
#                                             package: its two imports are stubbed). Log, table
#                                             and vllm_group.json in $OUT/vllm-group. ~1 minute,
#                                             mostly Triton compiling one kernel per case.
#
# What passes: exit 0 and a last line "N passed, 0 failed"; the lines "scale mismatches" say how
# often the scales differ and why (both multiply absmax by RN(1/448) since 2026-12-04; mla-gen divided
# by 448 before).
set -euo pipefail
cd "$(dirname "$0")/../.."
V=.device/vllm
case "${1:-}" in
build)
    src="${VLLM_TRITON_SRC:-.device/vllm-src/triton_merge_attn_states.py}"
    if ! grep -q "def merge_attn_states_group_fp8_kernel" "$src" 2>/dev/null; then
        cat >&2 <<EOF
vllm_group.sh: no vLLM Triton file with merge_attn_states_group_fp8_kernel at $src.
Copy it there (or point VLLM_TRITON_SRC at it) from a vLLM checkout that has the group-FP8 merge
(its merge_attn_states takes output_block_scale, quant_group_size, quant_scale_ue8m0):
vllm/v1/attention/ops/triton_merge_attn_states.py (vllm/attention/ops/ in older trees). It is
Apache-2.0 code of another project: keep it under .device/ (git-ignored), never commit it.
EOF
        exit 1
    fi
    scripts/install-nvrtc.sh >/dev/null
    cargo build --quiet
    rm -rf "$V" && mkdir -p "$V"
    cp "$src" "$V/triton_merge_attn_states.py"
    target/debug/mla-gen generate bench/vllm-group.toml --out "$V/kernels" --quiet
    echo "vLLM file sha256 $(sha256sum "$V/triton_merge_attn_states.py" | cut -c1-16); mla-gen $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- templates src || echo ' + uncommitted changes')" > "$V/built.txt"
    echo "built $V ($(du -sh "$V" | cut -f1)); on the GPU machine: bench/gpu/vllm_group.sh run (carry .device/vllm)"
    ;;
run)
    OUT="${OUT:-.device/out}/vllm-group"
    mkdir -p "$OUT"
    cat "$V/built.txt"
    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 bench/vllm_group_check.py --kernels "$V/kernels" \
        --vllm "$V/triton_merge_attn_states.py" --out "$OUT" ${VLLM_GROUP_ARGS:-} 2>&1 | tee "$OUT/vllm_group.log"
    ;;
*)
    echo "usage: bench/gpu/vllm_group.sh build|run   (see the comment at the top)" >&2; exit 2 ;;
esac

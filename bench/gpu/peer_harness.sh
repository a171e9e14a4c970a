#!/usr/bin/env bash
# bench/gpu/peer_harness.cu on the GPU machine (carry .device after `bench/gpu/peers.sh build`,
# which extracts FlashInfer's headers): generated/'s kernels (scripts/images.sh; carry generated/kernels)
# (or $HARNESS_KERNELS, a folder generated with the same names) beside FlashInfer's MergeState, hot, from C++ only, at the small
# and middle shapes where the peer table's hot verdicts are closest; each producer of
# $HARNESS_PRODUCERS (grid, linear, attention; default: linear attention) twice.
set -euo pipefail
cd "$(dirname "$0")/../.."
work="$(mktemp -d)"
nvcc -O3 -arch=sm_90 -std=c++17 -use_fast_math -I.device/peers/include -o "$work/harness" \
    bench/gpu/peer_harness.cu -lcuda 2>&1 | grep -v -i warning || true
K="${HARNESS_KERNELS:-generated}"
for producer in ${HARNESS_PRODUCERS:-linear attention}; do
    for pass in 1 2; do
        unset VEC_PRODUCER ATTN_PRODUCER
        case "$producer" in linear) export VEC_PRODUCER=1 ;; attention) export ATTN_PRODUCER=1 ;; esac
        echo "== producer $producer, pass $pass"
        for shape in 64x16x64 256x8x64 512x32x64 1024x16x64 4096x16x64 64x16x128 256x8x128 512x32x128 \
                     1024x16x128 4096x16x128 64x16x256 256x8x256 1024x16x256; do
            IFS=x read -r T H D <<< "$shape"
            # The kernel the hosts launch for this call: the size rule's range, its all-context twin.
            read -r name tpb hpb threads < <(python3 - "$K" "$T" "$H" "$D" <<'PY'
import json, sys
folder, T, H, D = sys.argv[1], *map(int, sys.argv[2:])
kernels = {k["name"]: k for k in json.load(open(f"{folder}/manifest.json"))["kernels"]}
name = f"merge_attn_states_bf16_d{D}_thr_lse"
rule = kernels[name]["launch"].get("size_rule")
if rule:
    name = next((r["kernel"] for r in rule["ranges"] if T * H < r["below_rows"]), name)
name = kernels[name]["launch"]["specializations"][0]
l = kernels[name]["launch"]
print(name, l["tokens_per_block"] * l["rows_per_thread"], l["heads_per_block"], l["block_threads"])
PY
)
            "$work/harness" "$K/kernels/$name.sm_90.cubin" "$name" "$tpb" "$hpb" "$threads" "$T" "$H" "$D"
        done
    done
done

#!/usr/bin/env bash
# On the GPU machine: bench/peers/peers.cu compiled twice with nvcc, in parallel, into
# LIB/libpeers_vllm.so (the vLLM-style baseline and the access floor, no fast math, as torch
# extensions build) and LIB/libpeers_fi.so (FlashInfer's entry points, with the -O3 -use_fast_math
# of FlashInfer's JIT), FlashInfer's headers from INCLUDE (bench/gpu/flashinfer_headers.sh).
#
#   bench/gpu/peers_libs.sh INCLUDE LIB
set -euo pipefail
cd "$(dirname "$0")/../.."
include="${1:?usage: bench/gpu/peers_libs.sh INCLUDE LIB}"
lib="${2:?usage: bench/gpu/peers_libs.sh INCLUDE LIB}"
mkdir -p "$lib"
nvcc -arch=sm_90 -O3 -std=c++17 -Xcompiler -fPIC -shared -o "$lib/libpeers_vllm.so" bench/peers/peers.cu &
vllm=$!
nvcc -arch=sm_90 -O3 -std=c++17 -use_fast_math -DPEERS_FLASHINFER -I"$include" -Xcompiler -fPIC -shared \
    -o "$lib/libpeers_fi.so" bench/peers/peers.cu 2>&1 | { grep -v -i warning || true; }
wait "$vllm"
[[ -f "$lib/libpeers_fi.so" && -f "$lib/libpeers_vllm.so" ]] || { echo "peers_libs.sh: nvcc failed" >&2; exit 1; }

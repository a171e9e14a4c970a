#!/usr/bin/env bash
# Issue #34, items 2 and 5, in one GPU run of under 8 minutes, in two halves:
#
#   bench/gpu/families.sh build   (here: Rust, NVRTC, and torch for the twin cases: $PYTHON, else
#                                    ~/.cache/mla-gen/torch-env/bin/python, else python3)
#                                    into .device/families (git-ignored; carry .device/families):
#                                      default   the default spec for sm_90, CUBIN and PTX
#                                      ptx80     its kernels of head sizes 64, 128, 576 as sm_80
#                                                PTX (ptx = "every", CUBINs deleted)
#                                      kway      runtime-K merge_states (bf16, D 64/128/256,
#                                                lse base 2: as mla_gen.flashinfer runs it)
#                                      inplace   merge_state_in_place, base 2, token-major,
#                                                mask = [false, true]
#                                      no-size-rule  the default spec's same-dtype unmasked tables
#                                                with size_rule = false, for sm_90 (the size
#                                                rules' "without" in the twin table)
#                                      include   FlashInfer's headers (flashinfer_headers.sh)
#                                      twin-cases.json   bench/twins.py cases on `default`: the
#                                                engine calls each twin class serves, and the
#                                                kernel each runs with and without the class
#   bench/gpu/families.sh run     (there: torch, nvcc; no network, no Rust) writes $OUT/families/:
#                                      twins.log, twins.json      the twin table (bench/twins.py)
#                                      ptx_jit.log, ptx_jit.json  CUBIN against PTX (bench/ptx_jit.py,
#                                                                 CUDA_CACHE_DISABLE=1)
#                                      kway.log, kway.json        the family peer table
#                                                                 (bench/kway_peers.py --tables family)
#                                      nvcc.log                   bench/peers/peers.cu's build
#
# What passes: exit 0; twins.log ends with the class table (a row per class: dense, nothr, flat,
# size_rule, then one per kernel with a size rule, each with shapes > 0 and a verdict) and no
# "checks failed"; ptx_jit.log has a line per
# call and the "# ptx90:" and "# ptx80:" summaries; kway.log has "family" summary lines and no
# "check failed". Caps (seconds, when a part stops starting shapes): TWINS_CAP (150), FAMILY_CAP
# (110); each part also has a timeout, so the run ends within about 7.5 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
F=.device/families
case "${1:-}" in
build)
    scripts/install-nvrtc.sh >/dev/null
    cargo build --quiet
    M=target/debug/mla-gen
    py="${PYTHON:-}"
    if [[ -z "$py" ]]; then
        py=python3
        for p in "$HOME/.cache/mla-gen/torch-env/bin/python" python3; do
            if "$p" -c "import torch" 2>/dev/null; then py="$p" && break; fi
        done
    fi
    rm -rf "$F" && mkdir -p "$F"
    bench/gpu/flashinfer_headers.sh "$F/include"
    "$M" generate --arch sm_90 --out "$F/default" --quiet
    # specs/default.toml with lines `KEY = ...` replaced: default_with OUT KEY=VALUE...
    default_with() {
        local out="$1" kv
        shift
        cp specs/default.toml "$out"
        for kv in "$@"; do
            grep -q "^${kv%%=*} = " "$out" || { echo "families.sh: specs/default.toml has no line '${kv%%=*} = ...' to replace" >&2; exit 2; }
            sed -i "s|^${kv%%=*} = .*|${kv%%=*} = ${kv#*=}|" "$out"
        done
    }
    default_with "$F/spec-ptx80.toml" 'arch=["sm_80"]' 'ptx="every"' 'head_size=[64, 128, 576]'
    "$M" generate "$F/spec-ptx80.toml" --out "$F/ptx80" --quiet
    rm -f "$F"/ptx80/kernels/*.cubin
    default_with "$F/spec-no-size-rule.toml" 'arch=["sm_90"]' 'output="same"' 'mask_empty_context=false'
    echo 'size_rule = false' >> "$F/spec-no-size-rule.toml"  # into the last table, [[merge_attn_states]]
    "$M" generate "$F/spec-no-size-rule.toml" --out "$F/no-size-rule" --quiet
    printf '%s\n' 'arch = ["sm_90"]' '[[merge_states]]' 'dtype = "bf16"' 'head_size = [64, 128, 256]' \
        'num_states = "runtime"' 'lse_base = "2"' > "$F/spec-kway.toml"
    "$M" generate "$F/spec-kway.toml" --out "$F/kway" --quiet
    printf '%s\n' 'arch = ["sm_90"]' '[[merge_state_in_place]]' 'dtype = "bf16"' 'head_size = [64, 128, 256]' \
        'lse_layout = "token_major"' 'lse_base = "2"' 'mask = [false, true]' > "$F/spec-inplace.toml"
    "$M" generate "$F/spec-inplace.toml" --out "$F/inplace" --quiet
    find "$F" -name '*.cu' -delete
    "$py" bench/twins.py cases --kernels "$F/default" --no-size-rule "$F/no-size-rule" --out "$F/twin-cases.json"
    bench/gpu/built.sh families "$F" 40
    ;;
run)
    OUT="${OUT:-.device/out}/families"
    mkdir -p "$OUT"
    export PYTHONUNBUFFERED=1
    cat "$F/built.txt"
    lib="$(mktemp -d)"
    # nvcc (CPU) while the first two parts time the GPU: their times are CUDA events, not host clocks.
    bench/gpu/peers_libs.sh "$F/include" "$lib" > "$OUT/nvcc.log" 2>&1 &
    nvcc=$!
    status=0
    timeout 200 python3 bench/twins.py run --kernels "$F/default" --no-size-rule "$F/no-size-rule" --cases "$F/twin-cases.json" \
        --cap "${TWINS_CAP:-150}" --out "$OUT" 2>&1 | tee "$OUT/twins.log" || status=1
    CUDA_CACHE_DISABLE=1 timeout 90 python3 bench/ptx_jit.py --kernels "$F/default" --ptx80 "$F/ptx80" \
        --out "$OUT" 2>&1 | tee "$OUT/ptx_jit.log" || status=1
    if wait "$nvcc"; then
        timeout 160 python3 bench/kway_peers.py --peers "$lib" --kernels "new=$F/kway" --inplace "$F/inplace" \
            --tables family --cap "${FAMILY_CAP:-110}" --out "$OUT" 2>&1 | tee "$OUT/kway.log" || status=1
    else
        echo "families.sh: building bench/peers/peers.cu failed (nvcc.log); no family table" | tee "$OUT/kway.log"
        status=1
    fi
    exit $status
    ;;
*)
    echo "usage: bench/gpu/families.sh build|run   (see the comment at the top)" >&2; exit 2 ;;
esac

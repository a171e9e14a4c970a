#!/usr/bin/env bash
# The K-way merge beside FlashInfer's MergeStates and a vLLM-style chunk loop, and the in-place
# merge beside MergeStateInPlace (issue #34, items 4 and 5), in two halves:
#
#   bench/gpu/kway.sh build   (here)  FlashInfer's headers (bench/gpu/flashinfer_headers.sh:
#                                       from .whl/ or pip) and the kernel folders into .device/kway
#                                       (git-ignored; carry .device/kway):
#                                         new      specs/kway-candidates-3.toml, templates/ (runtime
#                                                  and fixed K, bf16, D 64/128/256, lse base 2)
#                                         old      the same spec from BASE's templates (default
#                                                  1d8fd14, before the branch-free bodies)
#                                         candidates, runtime K only (the list below): one
#                                                  `{%- set kway_* %}` of merge_states.cu.tera changed
#                                                  (4 unrolled K; chunks of 8; IEEE math) or schedule
#                                                  keys (min_blocks_per_sm 8, 12: at most 64, 40
#                                                  registers). Run 2026-12-04 (GPU-VERIFICATION.md)
#                                                  tried two passes, chunks of 2, 256-thread blocks and
#                                                  16 heads per block too: all slower
#                                         inplace  base-2 token-major merge_state_in_place
#                                         check    bench/kway-check.toml (semantic cases)
#                                         flashinfer-api   tests/gpu-flashinfer.toml (KWAY_FI_CHECK=1)
#   bench/gpu/kway.sh run     (there) compiles bench/peers/peers.cu (bench/gpu/peers_libs.sh),
#                                       then bench/kway_peers.py: the semantic checks, the
#                                       candidates, states 1-16, the in-place table and the target
#                                       grid, stopping new shapes after KWAY_CAP seconds (default
#                                       240). Log, table and JSON in $OUT/kway/.
#                                       KWAY_FI_CHECK=1 then runs bench/flashinfer_check.py
#                                       (mla_gen.flashinfer against FlashInfer's own kernels, K = 1
#                                       included) on the flashinfer-api folder.
#
# What passes: the log ends with "# semantic checks: 0 failures" above, no "check failed", exit 0;
# the summary lines "grid cold|hot new: x fi ... min" >= 0.98 and "x loop (K >= 4): min" >= 2.
set -euo pipefail
cd "$(dirname "$0")/../.."
K=.device/kway
case "${1:-}" in
build)
    scripts/install-nvrtc.sh >/dev/null
    cargo build --quiet
    M=target/debug/mla-gen
    rm -rf "$K" && mkdir -p "$K"
    bench/gpu/flashinfer_headers.sh "$K/include"
    gen() { "$M" generate "$1" --templates "$2" --out "$K/$3" --quiet; }
    runtime_spec() {  # the runtime-K kernels of specs/kway-candidates-3.toml, plus schedule keys
        local spec="$K/spec-$1.toml"
        shift
        printf '%s\n' 'arch = ["sm_90"]' '[[merge_states]]' 'dtype = "bf16"' 'head_size = [64, 128, 256]' \
            'num_states = "runtime"' 'lse_base = "2"' "$@" > "$spec"
        echo "$spec"
    }
    gen specs/kway-candidates-3.toml templates new
    base="${BASE:-1d8fd14}"
    mkdir -p "$K/templates-old/c"
    for f in $(git ls-tree -r --name-only "$base" templates); do
        git show "$base:$f" > "$K/templates-old/${f#templates/}"
    done
    gen specs/kway-candidates-3.toml "$K/templates-old" old
    # label | sed expression for merge_states.cu.tera (none: templates/ as is) | schedule keys (;)
    # r2*: two tokens per thread (K <= 4: both rows' loads in flight together; larger K one row
    # after the other), so K = 2-3 keep as many bytes in flight per SM as the fixed-K kernels at
    # the runtime kernel's occupancy; registers (no spills): r2 80 (6 blocks/SM), r2m7 72 (7),
    # r2m8 64 (8, as the default's 1 row).
    candidates=(
        'r2||rows_per_thread = 2'
        'r2m7||rows_per_thread = 2;min_blocks_per_sm = 7'
        'r2m8||rows_per_thread = 2;min_blocks_per_sm = 8'
    )
    labels="new old"
    for item in "${candidates[@]}"; do
        IFS='|' read -r label edit keys <<< "$item"
        tpl=templates
        if [[ -n "$edit" ]]; then
            tpl="$K/templates-$label"
            cp -r templates "$tpl"
            sed -i "$edit" "$tpl/merge_states.cu.tera"
            if cmp -s templates/merge_states.cu.tera "$tpl/merge_states.cu.tera"; then
                echo "kway.sh: candidate $label changed nothing in merge_states.cu.tera ($edit)" >&2
                exit 2
            fi
        fi
        IFS=';' read -r -a key_lines <<< "$keys"
        gen "$(runtime_spec "$label" "${key_lines[@]}")" "$tpl" "$label"
        labels="$labels $label"
    done
    printf '%s\n' 'arch = ["sm_90"]' '[[merge_state_in_place]]' 'dtype = "bf16"' 'head_size = [64, 128, 256]' \
        'lse_layout = "token_major"' 'lse_base = "2"' > "$K/spec-inplace.toml"
    gen "$K/spec-inplace.toml" templates inplace
    gen bench/kway-check.toml templates check
    gen tests/gpu-flashinfer.toml templates flashinfer-api
    find "$K" -name '*.cu' -delete
    rm -rf "$K"/templates-*
    dirty="$(git diff --quiet HEAD -- templates || echo ' + uncommitted templates')"
    echo "base templates: $(git rev-parse --short "$base"); new: $(git rev-parse --short HEAD)$dirty" > "$K/built.txt"
    echo "$labels" > "$K/labels.txt"
    echo "built $K ($(du -sh "$K" | cut -f1)); on the GPU machine: bench/gpu/kway.sh run (carry .device/kway)"
    ;;
run)
    OUT="${OUT:-.device/out}/kway"
    mkdir -p "$OUT"
    export PYTHONUNBUFFERED=1
    cat "$K/built.txt"
    lib="$(mktemp -d)"
    bench/gpu/peers_libs.sh "$K/include" "$lib"
    kernels=()
    for label in $(cat "$K/labels.txt"); do  # new and old first: the default and the base
        kernels+=(--kernels "$label=$K/$label")
    done
    python3 bench/kway_peers.py --peers "$lib" "${kernels[@]}" --inplace "$K/inplace" \
        --check-kernels "$K/check" --unchecked old --tables "${KWAY_TABLES:-check,candidates,states,inplace,grid}" \
        --cap "${KWAY_CAP:-240}" --out "$OUT" 2>&1 | tee "$OUT/kway.log"
    if [[ "${KWAY_FI_CHECK:-0}" == 1 ]]; then
        MLA_GEN_KERNELS="$K/flashinfer-api" PYTHONPATH=python python3 bench/flashinfer_check.py \
            --peers "$lib" --out "$OUT" 2>&1 | tail -40 | tee "$OUT/flashinfer_check.log"
    fi
    ;;
*)
    echo "usage: bench/gpu/kway.sh build|run   (see the comment at the top)" >&2; exit 2 ;;
esac

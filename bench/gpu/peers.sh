#!/usr/bin/env bash
# mla-gen against the peers engines run (issue #21: FlashInfer's MergeState, a vLLM-style CUDA op,
# a same-size copy), hot and cold L2, in two halves:
#
#   bench/gpu/peers.sh build   (here)  FlashInfer's headers from the flashinfer-python wheel (pip
#                                        download, never committed) and the kernel folders into
#                                        .device/peers/ (git-ignored; carry .device/peers):
#                                        `new` is the default spec for sm_90 only (what
#                                        generated/ holds, without the other archs' images: the
#                                        device carries 64 MiB), `base` BASE's kernels of it
#                                        (default none; BASE=REV builds REV's, sm_90),
#                                        `new-tm` token-major twins for FlashInfer's layout, and one
#                                        folder per LABEL=DIR of $PEERS_TEMPLATES (experiments:
#                                        the default spec, or $PEERS_SPEC's, rendered from DIR), and
#                                        one per schedule b<threads>h<heads>v<vecs> of
#                                        $PEERS_CANDIDATES (bench/peer_rules.py), rendered
#                                        from $PEERS_CANDIDATE_TEMPLATES (default templates/);
#                                        built.txt records both lists for `run`
#   bench/gpu/peers.sh run     (there) compiles bench/peers/peers.cu with nvcc, then
#                                        bench/peers.py over the issue's table, cold and hot,
#                                        with every folder `build` made (built.txt; PEERS_TEMPLATES
#                                        or PEERS_CANDIDATES set here, even empty, replace its list)
#                                        ($PEERS_SHAPES to narrow it), and Nsight Compute side by side
#                                        at three shapes (~13, 25 and 50 MB). Results in $OUT/peers/.
#
# The table's verdicts (x peer = the faster peer's time / the default kernel's) are in peers.log;
# docs/PERFORMANCE.md keeps the latest.
set -euo pipefail
cd "$(dirname "$0")/../.."
P=.device/peers
case "${1:-}" in
build)
    scripts/install-nvrtc.sh >/dev/null
    cargo build --release --quiet
    M=target/release/mla-gen
    mkdir -p "$P"
    bench/gpu/flashinfer_headers.sh "$P/include"
    rm -rf "$P/kernels" && mkdir -p "$P/kernels"
    base="${BASE:-none}"
    # `new`: the default spec as this checkout generates it, sm_90 only. `base`: the same from
    # BASE, built in a worktree of it (cargo and NVRTC, minutes); BASE=none (the default) leaves
    # it out.
    "$M" generate --arch sm_90 --out "$P/kernels/new" --quiet
    if [[ "$base" != none ]]; then
        wt="$(mktemp -d)/base" && abs="$PWD/$P/kernels/base" && target="$PWD/target/peers-base"
        git worktree add --quiet --detach "$wt" "$base"
        (cd "$wt" && CARGO_TARGET_DIR="$target" cargo build --release --quiet &&
            "$target/release/mla-gen" generate --arch sm_90 --out "$abs" --quiet)
        git worktree remove --force "$wt"
    fi
    "$M" generate bench/peers/token-major.toml --templates templates --out "$P/kernels/new-tm" --quiet
    for item in ${PEERS_TEMPLATES:-}; do
        "$M" generate ${PEERS_SPEC:-} --templates "${item#*=}" --arch sm_90 --out "$P/kernels/${item%%=*}" --quiet
    done
    # Schedule candidates b<threads>h<heads>v<vecs> (bench/peer_rules.py reads their times):
    # the groups of the peer table with that schedule, their first dense specializations alone.
    for label in ${PEERS_CANDIDATES:-}; do
        [[ "$label" =~ ^b([0-9]+)h([0-9]+)v([0-9]+)$ ]] || { echo "PEERS_CANDIDATES: $label is not b<threads>h<heads>v<vecs>" >&2; exit 2; }
        spec="$(mktemp)"
        printf '%s\n' 'arch = ["sm_90"]' '[[merge_attn_states]]' 'dtype = ["bf16", "f16"]' \
            'head_size = [64, 128, 256, 512]' 'rows_per_thread = 1' 'min_blocks_per_sm = 1' \
            "block_threads = ${BASH_REMATCH[1]}" "heads_per_block = ${BASH_REMATCH[2]}" \
            "vecs_per_thread = ${BASH_REMATCH[3]}" > "$spec"
        "$M" generate "$spec" --templates "${PEERS_CANDIDATE_TEMPLATES:-templates}" --out "$P/kernels/all-$label" --quiet && rm -f "$spec"
        python3 bench/gpu/dense_only.py "$P/kernels/all-$label" "$P/kernels/$label" >/dev/null
        rm -rf "$P/kernels/all-$label"
    done
    find "$P/kernels" -name '*.cu' -delete
    { echo "base: $([[ "$base" == none ]] && echo none || git rev-parse --short "$base")"; echo "new: the default spec, sm_90, at $(git rev-parse --short HEAD)";
      echo "experiments: ${PEERS_TEMPLATES:-none}"; echo "candidates: ${PEERS_CANDIDATES:-none}"; } > "$P/built.txt"
    echo "built $P ($(du -sh "$P" | cut -f1)); on the GPU machine: bench/gpu/peers.sh run (carry .device/peers)"
    ;;
run)
    OUT="${OUT:-.device/out}/peers"; mkdir -p "$OUT"
    export PYTHONUNBUFFERED=1
    cat "$P/built.txt"
    lib="$(mktemp -d)"
    bench/gpu/peers_libs.sh "$P/include" "$lib"
    kernels=(--kernels "new=$P/kernels/new")
    [[ -d "$P/kernels/base" ]] && kernels+=(--kernels "base=$P/kernels/base")
    # The experiments and candidates `build` made, as built.txt lists them (a session once ran
    # the table without its experiment when `run` read only the variables).
    built_list() { sed -n "s/^$1: //p" "$P/built.txt" | grep -vx none || true; }
    for item in ${PEERS_TEMPLATES-$(built_list experiments)} ${PEERS_CANDIDATES-$(built_list candidates)}; do
        [[ -d "$P/kernels/${item%%=*}" ]] || { echo "peers.sh run: no folder $P/kernels/${item%%=*} (run build with it)" >&2; exit 2; }
        kernels+=(--kernels "${item%%=*}=$P/kernels/${item%%=*}")
    done
    kernels+=(--tm-kernels "new-tm=$P/kernels/new-tm")
    shapes=()
    [[ -n "${PEERS_SHAPES:-}" ]] && shapes=(--shapes "$PEERS_SHAPES")
    status=0
    timeout "${PEERS_CAP:-400}" python3 bench/peers.py --peers "$lib" "${kernels[@]}" "${shapes[@]}" \
        --l2 both --rounds "${PEERS_ROUNDS:-3}" --out "$OUT" 2>&1 | tee "$OUT/peers.log" || status=1
    if [[ "${PEERS_NCU:-1}" == 1 ]]; then
        # Hot: no cache flush between kernels (--cache-control none), each kernel right after its producer.
        ncu --clock-control none --cache-control none --kernel-name 'regex:merge_attn|MergeState|vllm_style' \
            ${PEERS_NCU_SECTIONS:---section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
            --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis} \
            --csv --page details \
            python3 bench/peers.py --profile --peers "$lib" "${kernels[@]}" \
            --shapes "${PEERS_NCU_SHAPES:-bf16:1024x16x128,bf16:4096x16x64,bf16:4096x16x128}" > "$OUT/ncu.csv" 2> "$OUT/ncu.err" || status=1
        python3 bench/ncu_summary.py "$OUT/ncu.csv" | tee "$OUT/ncu-summary.txt" || status=1
    fi
    exit $status
    ;;
*)
    echo "usage: bench/gpu/peers.sh build|run   (see the comment at the top)" >&2; exit 2 ;;
esac

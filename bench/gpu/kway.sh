#!/usr/bin/env bash
# The K-way merge as the default ships it beside FlashInfer's MergeStates (issue #34, item 4: the
# target grid, states {2,3,4,5,8,9,16} x T {256,2048,8192,32768} x H {8,16,32} x D {64,128,256},
# bf16, hot and cold), in two halves:
#
#   bench/gpu/kway.sh build   (here)  into .device/kway (git-ignored; carry .device/kway, ~27 MB):
#                                       include   FlashInfer's headers (flashinfer_headers.sh:
#                                                 from .whl/ or pip)
#                                       shipped   the default spec for sm_90 (specs/default.toml:
#                                                 its K-way kernels fixed at K = 2, 3, 4, 5, 8 and
#                                                 with runtime K), the folder
#                                                 mla_gen.flashinfer.merge_states selects from
#                                       inplace   base-2 token-major merge_state_in_place (the
#                                                 inplace and family tables)
#                                       flashinfer-api   tests/gpu-flashinfer.toml (KWAY_FI_CHECK=1)
#                                     BASE=REV also builds `old`: specs/kway-candidates-3.toml from
#                                     REV's templates, runtime and fixed K launched by name
#                                     (KWAY_OLD=1 at run time times it beside). The rows_per_thread
#                                     candidates of runs 122-127 (not adopted) are in git history.
#                                     KWAY_INPLACE_VARIANTS="warpsync b512h32 ..." builds
#                                     inplace-NAME (bench/kway_variants.py's in-place ideas and
#                                     schedule keys over spec-inplace.toml); `run` times each
#                                     beside `inplace` in the inplace and family tables
#                                     (KWAY_TABLES=inplace,family).
#                                     KWAY_VARIANTS="noplace noplace+i32 ..." also builds var-cur
#                                     (templates/) and var-NAME ('+' as '_'; the templates of
#                                     bench/kway_variants.py NAME: the K-way kernel stripped or
#                                     changed, or schedule keys, one idea each), each from
#                                     specs/kway-candidates-3.toml; `run` then times them first.
#   bench/gpu/kway.sh run     (there) compiles bench/peers/peers.cu (bench/gpu/peers_libs.sh) while
#                                       bench/kway_check.py checks every K-way kernel of `shipped`
#                                       against float64 (docs/SEMANTICS.md's rules), then
#                                       bench/kway_peers.py --shipped: each shape through
#                                       mla_gen.flashinfer.merge_states's own call path (the row
#                                       names the kernel: k2..k8 or kvar), FlashInfer, a copy of
#                                       the same bytes; tables $KWAY_TABLES (default grid; also
#                                       states, inplace, family), no chunk loop unless KWAY_LOOP=1,
#                                       no new shape after KWAY_CAP seconds (default 170: the run
#                                       takes at most about 4 minutes). JSON in $OUT/kway/, the
#                                       logs (the tables as printed) in $OUT/kway/logs.tar.gz.
#                                       KWAY_SHIPPED=DIR takes the default's kernels from DIR
#                                       instead of `shipped` (an unpacked wheel's
#                                       mla_gen/kernels: the same images, so .device/kway need
#                                       not carry its 31 MB beside .device/smoke's wheel).
#                                       Built variants run first: the candidates table at
#                                       $KWAY_VARIANT_SHAPES (default `small`: the grid's merges of
#                                       at most 20 MiB of states), each folder's runtime-K kernel
#                                       (NAME) and fixed-K one (NAME-k) beside the shipped call and
#                                       FlashInfer, for at most $KWAY_VARIANT_CAP s (default 180);
#                                       variants.log and variants/kway.json.
#                                       KWAY_PLACEMENTS=N times each grid shape with its buffers
#                                       in N places (6 MiB apart), the median of them (session 27:
#                                       a placement moved one kernel's time 8.45 -> 10.7 us).
#                                       KWAY_FLUSH=read: cold L2 by reading the 512 MB flush
#                                       buffer, not writing it (no dirty lines left: as ncu's
#                                       --cache-control all), for the cold losses (session 31).
#                                       KWAY_BY_NAME=1 times the kernel the call selects launched
#                                       by name too (shipped-name), the kernel apart from the path.
#                                       KWAY_REPEAT=1 runs those tables a second time (repeat/)
#                                       and lists the grid's losses both runs show (repeated.txt:
#                                       the ones that count, 2% noise rule).
#                                       KWAY_FI_CHECK=1 then runs bench/flashinfer_check.py on the
#                                       shipped default (KWAY_FI_KERNELS=.device/kway/flashinfer-api:
#                                       the f32 kernels of tests/gpu-flashinfer.toml too).
#                                       KWAY_NCU=1 then profiles the default and FlashInfer's
#                                       MergeStates with Nsight Compute, hot (KWAY_NCU_CACHE=all:
#                                       cold), at $KWAY_NCU_SHAPES
#                                       (K:TxHxD, default the grid's worst: 5:256x16x128,
#                                       2:2048x16x128, 3:2048x16x128, 8:32768x16x128):
#                                       ncu.csv and ncu-summary.txt (bench/ncu_summary.py).
#                                       KWAY_NCU=duration instead times each kernel alone, one
#                                       metric (gpu__time_duration), so one pass: no replay
#                                       restores memory between passes, and each kernel meets the
#                                       L2 its producer left, as in the graph (the sections above
#                                       replay, so their "hot" is not the graph's: session 22's
#                                       suspect for runs 139-140's hot losses that ncu did not
#                                       show). Default shapes: the repeated hot losses. ncu-duration.csv.
#
# What passes (the logs in logs.tar.gz): check.log ends with "K-way cases pass" with equal counts
# and no "FAIL"; kway.log has no "check failed" (each timed call also equals
# mla_gen.flashinfer.merge_states's own result bit for bit) and its "# grid K=.. shipped [k2] (36
# shapes): x fi cold median .. min .., N below 0.98" lines (one per K) show the target: min >= 0.98
# cold and hot, or with KWAY_REPEAT=1 repeated.txt's "0 of 252" in both modes; exit 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
K=.device/kway
case "${1:-}" in
build)
    scripts/install-nvrtc.sh >/dev/null
    cargo build --quiet --bin mla-gen
    M=target/debug/mla-gen
    mkdir -p "$K"  # all but FlashInfer's headers, which need no second download
    find "$K" -mindepth 1 -maxdepth 1 ! -name include -exec rm -rf {} +
    bench/gpu/flashinfer_headers.sh "$K/include"
    gen() { "$M" generate "$1" --templates "$2" --out "$K/$3" --quiet; }
    "$M" generate --arch sm_90 --out "$K/shipped" --quiet
    rm -f "$K"/shipped/kernels/*.ptx  # the H200 loads the sm_90 CUBINs; 20 MB less to carry
    printf '%s\n' 'arch = ["sm_90"]' '[[merge_state_in_place]]' 'dtype = "bf16"' 'head_size = [64, 128, 256]' \
        'lse_layout = "token_major"' 'lse_base = "2"' 'mask = [false, true]' > "$K/spec-inplace.toml"
    gen "$K/spec-inplace.toml" templates inplace
    gen tests/gpu-flashinfer.toml templates flashinfer-api
    if [[ -n "${BASE:-}" ]]; then
        mkdir -p "$K/templates-old/c"
        for f in $(git ls-tree -r --name-only "$BASE" templates); do
            git show "$BASE:$f" > "$K/templates-old/${f#templates/}"
        done
        gen specs/kway-candidates-3.toml "$K/templates-old" old
        rm -rf "$K/templates-old"
    fi
    if [[ -n "${KWAY_VARIANTS:-}" ]]; then
        : > "$K/variants.txt"
        for name in cur $KWAY_VARIANTS; do
            templates=templates spec=specs/kway-candidates-3.toml
            if [[ "$name" != cur ]]; then
                templates="$K/templates-$name" spec="$K/templates-$name/spec.toml"
                python3 bench/kway_variants.py "$name" templates "$templates" specs/kway-candidates-3.toml
            fi
            gen "$spec" "$templates" "var-${name//+/_}"  # '+': '_' in paths
            rm -rf "$K/templates-$name" "$K/var-${name//+/_}"/kernels/*.ptx
            echo "$name" >> "$K/variants.txt"
        done
    fi
    if [[ -n "${KWAY_INPLACE_VARIANTS:-}" ]]; then  # in-place candidates beside `inplace`
        : > "$K/inplace-variants.txt"
        for name in $KWAY_INPLACE_VARIANTS; do
            python3 bench/kway_variants.py "$name" templates "$K/templates-$name" "$K/spec-inplace.toml"
            gen "$K/templates-$name/spec.toml" "$K/templates-$name" "inplace-${name//+/_}"
            rm -rf "$K/templates-$name" "$K/inplace-${name//+/_}"/kernels/*.ptx
            echo "$name" >> "$K/inplace-variants.txt"
        done
    fi
    find "$K" -name '*.cu' -delete
    bench/gpu/built.sh kway "$K" 45 "${BASE:+; old: $BASE}${KWAY_VARIANTS:+; variants: $KWAY_VARIANTS}${KWAY_INPLACE_VARIANTS:+; in-place variants: $KWAY_INPLACE_VARIANTS}"
    ;;
run)
    OUT="${OUT:-.device/out}/kway"
    SHIPPED="${KWAY_SHIPPED:-$K/shipped}"  # or an installed wheel's mla_gen/kernels (its sm_90 CUBINs)
    mkdir -p "$OUT"
    export PYTHONUNBUFFERED=1
    cat "$K/built.txt"
    lib="$(mktemp -d)"
    # nvcc (CPU) while the semantic checks use the GPU
    bench/gpu/peers_libs.sh "$K/include" "$lib" > "$OUT/nvcc.log" 2>&1 &
    nvcc=$!
    status=0
    python3 bench/kway_check.py "$SHIPPED" 2>&1 | tee "$OUT/check.log" || status=1
    wait "$nvcc" || { echo "kway.sh: building bench/peers/peers.cu failed (nvcc.log)" >&2; exit 1; }
    if [[ -f "$K/variants.txt" ]]; then
        variants=()
        while read -r name; do variants+=(--kernels "$name=$K/var-${name//+/_}"); done < "$K/variants.txt"
        python3 bench/kway_peers.py --peers "$lib" --shipped "$SHIPPED" "${variants[@]}" --tables candidates \
            --candidate-shapes "${KWAY_VARIANT_SHAPES:-small}" --cap "${KWAY_VARIANT_CAP:-180}" --placements "${KWAY_PLACEMENTS:-1}" \
            --flush "${KWAY_FLUSH:-memset}" --out "$OUT/variants" 2>&1 | tee "$OUT/variants.log" || status=1
    fi
    extra=()
    [[ "${KWAY_LOOP:-0}" == 1 ]] || extra+=(--no-loop)
    [[ "${KWAY_OLD:-0}" == 1 ]] && extra+=(--kernels "old=$K/old")
    [[ "${KWAY_BY_NAME:-0}" == 1 ]] && extra+=(--by-name)
    inplace=(--inplace "mla-gen=$K/inplace")
    if [[ -f "$K/inplace-variants.txt" ]]; then
        while read -r name; do inplace+=(--inplace "$name=$K/inplace-${name//+/_}"); done < "$K/inplace-variants.txt"
    fi
    tables() {  # the tables into folder $1, the log as $2
        python3 bench/kway_peers.py --peers "$lib" --shipped "$SHIPPED" "${inplace[@]}" "${extra[@]}" \
            --tables "${KWAY_TABLES:-grid}" --cap "${KWAY_CAP:-170}" --placements "${KWAY_PLACEMENTS:-1}" \
            --flush "${KWAY_FLUSH:-memset}" --out "$1" 2>&1 | tee "$2" || status=1
    }
    tables "$OUT" "$OUT/kway.log"
    if [[ "${KWAY_REPEAT:-0}" == 1 ]]; then  # the same tables again: the losses both runs show count
        tables "$OUT/repeat" "$OUT/kway-repeat.log"
        python3 bench/kway_tables.py --repeated "$OUT/kway.json" "$OUT/repeat/kway.json" | tee "$OUT/repeated.txt" \
            || status=1
        if [[ "${KWAY_BY_NAME:-0}" == 1 ]]; then  # the selected kernels by name, the same rule
            python3 bench/kway_tables.py --repeated "$OUT/kway.json" "$OUT/repeat/kway.json" --label shipped-name \
                | tee -a "$OUT/repeated.txt" || status=1
        fi
    fi
    if [[ "${KWAY_FI_CHECK:-0}" == 1 ]]; then
        MLA_GEN_KERNELS="${KWAY_FI_KERNELS:-$SHIPPED}" PYTHONPATH=python python3 bench/flashinfer_check.py \
            --peers "$lib" --out "$OUT" 2>&1 | tail -40 | tee "$OUT/flashinfer_check.log"
    fi
    if [[ "${KWAY_NCU:-0}" == 1 ]]; then
        # Hot: no cache flush between kernels (--cache-control none), each kernel right after its
        # producer; KWAY_NCU_CACHE=all: cold, every cache flushed before each pass.
        ncu --clock-control none --cache-control "${KWAY_NCU_CACHE:-none}" --kernel-name 'regex:merge_states|MergeStates' \
            --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
            --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis --csv --page details \
            python3 bench/kway_peers.py --peers "$lib" --shipped "$SHIPPED" \
            --profile "${KWAY_NCU_SHAPES:-5:256x16x128,2:2048x16x128,3:2048x16x128,8:32768x16x128}" \
            > "$OUT/ncu.csv" 2> "$OUT/ncu.err" || status=1
        python3 bench/ncu_summary.py "$OUT/ncu.csv" | tee "$OUT/ncu-summary.txt" || status=1
    elif [[ "${KWAY_NCU:-0}" == duration ]]; then
        ncu --clock-control none --cache-control none --kernel-name 'regex:merge_states|MergeStates' \
            --metrics gpu__time_duration.sum --csv \
            python3 bench/kway_peers.py --peers "$lib" --shipped "$SHIPPED" \
            --profile "${KWAY_NCU_SHAPES:-9:2048x8x128,16:2048x8x128,2:2048x16x64,9:2048x16x128,5:2048x16x64}" \
            > "$OUT/ncu-duration.csv" 2> "$OUT/ncu.err" || status=1
        python3 - "$OUT/ncu-duration.csv" <<'PY' || status=1
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
cols = rows[head]
for r in rows[head + 1:]:
    if len(r) == len(cols) and r[cols.index("Metric Name")] == "gpu__time_duration.sum":
        print(r[cols.index("Kernel Name")][:60], r[cols.index("Metric Value")], r[cols.index("Metric Unit")])
PY
    fi
    # The device tool returns at most 8 files: the logs go back as one archive beside the JSON.
    (cd "$OUT" && find . -name '*.log' -print0 | tar czf logs.tar.gz --null -T - --remove-files)
    exit $status
    ;;
*)
    echo "usage: bench/gpu/kway.sh build|run   (see the comment at the top)" >&2; exit 2 ;;
esac

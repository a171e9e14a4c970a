#!/usr/bin/env bash
# Hot-L2 timing for the issue "Beyond every peer", item 1 (engine conditions), in two halves:
#
#   bench/gpu/hot.sh build  (here)  mla-gen (release) and the tune candidates of specs/tune.toml
#                                     into .device/hot/ (git-ignored: carry .device/hot and generated/kernels, the images scripts/images.sh builds)
#   bench/gpu/hot.sh run    (there) in under 5 minutes, each part capped, results under
#                                     $OUT/hot/ (default .device/out/hot/):
#     1. tune.{log,json}    mla-gen tune --l2 both on the candidates (12 schedules per group):
#                           per shape the best schedule cold and hot, the current and plain
#                           schedules' ratio to it, one schedule within 2% everywhere or a
#                           proposed size rule on rows = T x H. Groups in priority order (a cap
#                           keeps the finished ones): bf16 d128, d96, d256, d64, f16 d128, bf16
#                           d512, d80, d192, f32 d128; shapes T in 256, 613, 1024, 2048, 4096,
#                           8192, 32768 x H in 16, 64, 128, without and with threshold T/2
#     2. sweep.{log,json}   the same for bf16 d128, d64, d256 at H = 16 over 1-512 MB (powers of 2)
#     3. bench.log, bench-rust.json  mla-gen bench --l2 both on generated/ (the shipped kernels): cold and
#                           hot time, % of a same-size copy cold and hot, on the bench's shapes
#                           plus 2048x16; then bench-sweep.* at the sweep shapes
#     4. python.log, bench.json  bench/bench.py --l2 both: the Python drop-in, copy and the
#                           Triton baseline, the issue's shapes and four sweep sizes
#   The last lines printed are summary.txt: each part's exit status and the verdict lines.
set -euo pipefail
cd "$(dirname "$0")/../.."
HOT=.device/hot
# bf16 d128 rows per MB of merge (no threshold): 780 bytes a row; H = 16.
SWEEP=$(python3 -c 'print(",".join(f"{max(1, round(m * 2**20 / (16 * 780)))}x16" for m in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)))')
case "${1:-}" in
build)
    scripts/install-nvrtc.sh
    cargo build --release --quiet
    rm -rf "$HOT" && mkdir -p "$HOT/bin"
    cp target/release/mla-gen "$HOT/bin/"
    # generated/'s images (build outputs, not in git) for the run there: carry generated/kernels too.
    MLA_GEN_BIN="$HOT/bin/mla-gen" scripts/images.sh
    # specs/tune.toml's candidates for the groups the run tunes only (all of them would pass the
    # carry limit): bf16 at seven head sizes, f16 and f32 at 128; the .cu sources stay here.
    {
        sed -e 's/^dtype = .*/dtype = ["bf16"]/' -e 's/^head_size = .*/head_size = [64, 80, 96, 128, 192, 256, 512]/' specs/tune.toml
        echo
        sed -n '/^\[\[merge_attn_states\]\]/,$p' specs/tune.toml |
            sed -e 's/^dtype = .*/dtype = ["f16", "f32"]/' -e 's/^head_size = .*/head_size = [128]/'
    } > "$HOT/tune-hot.toml"
    "$HOT/bin/mla-gen" generate "$HOT/tune-hot.toml" --out "$HOT/tune-candidates" --quiet
    find "$HOT/tune-candidates/kernels" -name '*.cu' -delete
    git rev-parse --short HEAD > "$HOT/commit.txt"
    echo "built $HOT ($(du -sh "$HOT" | cut -f1)); on the GPU machine: bench/gpu/hot.sh run (carry .device/hot and generated/kernels)"
    ;;
run)
    OUT="${OUT:-.device/out}/hot"; mkdir -p "$OUT"
    export PYTHONUNBUFFERED=1
    status=0
    : > "$OUT/summary.txt"
    note() { echo "$*" | tee -a "$OUT/summary.txt"; }
    part() {  # name, cap in seconds, command...: run it under a cap, record how it ended
        local name=$1 cap=$2; shift 2
        local t0=$SECONDS rc=0
        timeout --signal=INT --kill-after=10 "$cap" "$@" > "$OUT/$name.log" 2>&1 || rc=$?
        note "== $name: exit $rc in $((SECONDS - t0)) s (cap $cap s)$([[ $rc == 124 || $rc == 130 ]] && echo ', CUT: partial results')"
        [[ $rc == 0 ]] || status=1
    }
    {
        echo "date: $(date -u +%Y-%m-%dT%H:%MZ); commit built: $(cat "$HOT/commit.txt" 2>/dev/null)"
        nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | sed 's/^/gpu: /' || true
    } | tee -a "$OUT/summary.txt"
    M="$HOT/bin/mla-gen"
    shapes=$(python3 -c 'print(",".join(f"{t}x{h}{s}" for t in (256, 613, 1024, 2048, 4096, 8192, 32768) for h in (16, 64, 128) for s in ("", "/2")))')
    part tune 125 "$M" tune --candidates "$HOT/tune-candidates" --out "$OUT/tuned.toml" --l2 both \
        --reps 20 --graph-reps 15 --shapes "$shapes" --json "$OUT/tune.json" \
        --only bf16:128,bf16:96,bf16:256,bf16:64,f16:128,bf16:512,bf16:80,bf16:192,f32:128
    part sweep 20 "$M" tune --candidates "$HOT/tune-candidates" --out "$OUT/tuned-sweep.toml" --l2 both \
        --reps 20 --graph-reps 15 --shapes "$SWEEP" --json "$OUT/sweep.json" --only bf16:128,bf16:64,bf16:256
    part bench 60 "$M" bench --kernels generated --l2 both --reps 50 --graph-reps 20 \
        --shapes "$shapes" --json "$OUT/bench-rust.json"
    part bench-sweep 10 "$M" bench --kernels generated --l2 both --reps 50 --graph-reps 20 \
        --shapes "$SWEEP" --only bf16:128,bf16:64,bf16:256 --json "$OUT/bench-sweep.json"
    py_shapes="bf16:613x16x128,bf16:613x16x256,bf16:613x64x96,bf16:613x64x128,bf16:256x64x256,bf16:4096x16x96"
    py_shapes+=",bf16:2048x16x128,bf16:4096x16x64,bf16:8192x16x80,bf16:8192x16x128/2,f16:4096x16x128,f32:613x16x128"
    py_shapes+=",bf16:80x16x128,bf16:641x16x128,bf16:5128x16x128,bf16:41025x16x128"
    part python 45 python3 bench/bench.py --l2 both --shapes "$py_shapes" --impls mla-gen,copy,triton \
        --graph-reps 30 --no-host --out "$OUT"
    # Verdicts: the tuner's per-group conclusions, the benches' summary lines.
    {
        echo "== tune verdicts"
        grep -hE "^== |one schedule|proposed size rule|no candidate within|^  (current|plain) " "$OUT/tune.log" "$OUT/sweep.log" || true
        echo "== mla-gen bench summaries"
        grep -hE "^(cold, shapes|hot \()" "$OUT/bench.log" "$OUT/bench-sweep.log" || true
        echo "== python bench summaries"
        grep -hE "^# (cold, shapes|hot \()" "$OUT/python.log" || true
        echo "== errors"
        grep -hiE "^error|Traceback|Error:" "$OUT"/*.log | head -n 20 || true
    } >> "$OUT/summary.txt"
    echo "== summary ($OUT)"; cat "$OUT/summary.txt"
    exit $status
    ;;
*)
    echo "usage: bench/gpu/hot.sh build|run   (see the comment at the top)" >&2; exit 2 ;;
esac

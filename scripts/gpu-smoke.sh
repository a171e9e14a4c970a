#!/usr/bin/env bash
# Every user-facing path in its final form, on a GPU, in one device call of a few minutes: run it
# before saying a change that touches a host, a template or the manifest is done.
#
#   scripts/gpu-smoke.sh build   (here: Rust, NVRTC, the torch env of .ci/python.sh)
#       builds into .device/smoke/ the example engine, the quick GPU suite's binary, the C
#       examples' launchers and the platform wheel (scripts/build-wheel.sh)
#   scripts/gpu-smoke.sh run     (there, with .device carried: `run` with carry [".device"])
#       1. the example engine (build.rs bindings, select, every family step)
#       2. the C examples (merge.c, families.c, devices.c) against their generated launchers
#       3. the wheel installed into a temporary folder: python/examples/*.py, then pytest
#          python/tests against it (the compiled op required)
#       4. the quick Rust GPU suite (MLA_GEN_GPU_QUICK=1) and the Rust fault suite
#          (tests/gpu_faults.rs) on the installed wheel's kernels
#    Each step's last non-empty line goes to $OUT/smoke.txt (default .device/smoke/out), every
#    log into $OUT/logs.tar.gz (the device tool returns at most 8 files). Exit status 1 when any
#    step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
S=.device/smoke
case "${1:-}" in
build)
    scripts/install-nvrtc.sh
    rm -rf "$S" && mkdir -p "$S/bin"
    cargo build --release --quiet --bin mla-gen
    for t in gpu gpu_faults; do scripts/gpu-test-binary.sh "$t" "$S/bin/test-$t"; done
    CARGO_TARGET_DIR=target/engine cargo build --release --quiet --manifest-path examples/engine/Cargo.toml
    cp target/engine/release/mla-gen-example-engine "$S/bin/example-engine"
    strip "$S"/bin/*
    target/release/mla-gen generate examples/c/spec.toml --out "$S/c-example" --emit c --quiet
    target/release/mla-gen generate examples/c/families.toml --out "$S/c-families" --emit c --quiet
    scripts/build-wheel.sh --out "$S/wheel" >/dev/null
    git rev-parse --short HEAD > "$S/commit.txt"
    echo "built $S ($(du -sh "$S" | cut -f1)) at $(cat "$S/commit.txt"); run 'scripts/gpu-smoke.sh run' there with .device carried"
    ;;
run)
    OUT="${OUT:-$S/out}"; mkdir -p "$OUT"
    REPORT="$OUT/smoke.txt"; : > "$REPORT"
    LOGS="$(mktemp -d)"
    export PYTHONUNBUFFERED=1
    status=0
    say() { echo "$*" | tee -a "$REPORT"; }
    # A step: its label, then the command; its last output line goes to the report.
    last() { grep -v '^[[:space:]]*$' "$1" | tail -n 1; }
    step() {
        local label="$1"; shift
        echo "== $label"
        if "$@" > "$LOGS/$label.log" 2>&1; then
            say "$label: $(last "$LOGS/$label.log")"
        else
            say "$label: FAILED ($(last "$LOGS/$label.log"); see $label.log)"; status=1
            tail -n 20 "$LOGS/$label.log"
        fi
    }
    say "commit: $(cat "$S/commit.txt"), run $(date -u +%Y-%m-%dT%H:%MZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
    step example-engine "$S/bin/example-engine"
    c_example() {  # source, launcher folder, binary
        gcc -std=c11 -O2 -I/usr/local/cuda/include -I"$2/c" "$1" "$2/c/mla_kernels.c" \
            -L/usr/local/cuda/lib64/stubs -lcuda -pthread -lm -o "$LOGS/$3" && "$LOGS/$3"
    }
    step c-merge c_example examples/c/merge.c "$S/c-example" c-merge
    step c-families c_example examples/c/families.c "$S/c-families" c-families
    step c-devices c_example examples/c/devices.c "$S/c-example" c-devices
    site="$(mktemp -d)"
    trap 'rm -rf "$site" "$LOGS"' EXIT
    wheel="$(ls "$S"/wheel/mla_gen-*.whl | head -n 1)"
    step wheel-install python3 -m pip install --no-deps --target "$site" "$wheel"
    for ex in python/examples/*.py; do
        name="python-$(basename "$ex" .py)"
        step "$name" env PYTHONPATH="$site" python3 -c '
import runpy, sys
result = runpy.run_path(sys.argv[1], run_name="__main__")
print("ran", sys.argv[1], "without error")' "$ex"
    done
    repo="$PWD"
    step wheel-pytest bash -c "cd '$site' && PYTHONPATH='$site' MLA_GEN_EXPECT_COMPILED=1 timeout 500 python3 -m pytest -q -p no:cacheprovider '$repo/python/tests'"
    step rust-quick env MLA_GEN_GPU_QUICK=1 MLA_GEN_GPU_KERNELS="$site/mla_gen/kernels" MLA_GEN_GPU_REPORT="$LOGS/rust-quick-report.txt" \
        "$S/bin/test-gpu" --test-threads=1
    step rust-faults env MLA_GEN_GPU_KERNELS="$site/mla_gen/kernels" "$S/bin/test-gpu_faults" --test-threads=1 --nocapture
    tar -czf "$OUT/logs.tar.gz" -C "$LOGS" .
    echo "== smoke"; cat "$REPORT"
    exit $status
    ;;
*)
    echo "usage: scripts/gpu-smoke.sh build|run   (see the comment at the top)" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Every user-facing path in its final form, on a GPU: run it before saying a change that touches a
# host, a template or the manifest is done.
#
#   scripts/gpu-smoke.sh build   (here: Rust, NVRTC, the torch env of .ci/python.sh)
#       builds into .device/smoke/ the example engine, the quick GPU suite's binary, the C
#       examples' launchers and the platform wheel (scripts/build-wheel.sh), and packs the first
#       three into .device/smoke/engine.tar.xz (~1.2 MB; `run` unpacks it where they are missing)
#   scripts/gpu-smoke.sh run [engine|wheel|cost|engine,wheel|sanitize|suite]   (there, with .device/smoke
#       carried; it and the tracked tree pass the 64 MiB a device call carries, so carry
#       .device/smoke/wheel, .device/smoke/engine.tar.xz and .device/smoke/commit.txt)
#       1. the example engine (build.rs bindings, select, every family step)             engine
#       2. the C examples (merge.c, families.c, devices.c) against their launchers       engine
#       3. the wheel installed into a temporary folder (both parts), then
#          python/examples/*.py against it                                                engine
#          pytest python/tests against it (the compiled op required)                      wheel
#       4. the quick Rust GPU suite (MLA_GEN_GPU_QUICK=1) and the Rust fault suite
#          (tests/gpu_faults.rs) on the installed wheel's kernels                         engine
#       5. the compiled op's builds: bench/host_cost.py with the native build (the one the wheel
#          loads where it has one for this torch, _C_torch<M>_<m>), the stable one
#          (MLA_GEN_NATIVE_OP=0) and the native one again (JSON to $OUT/native, stable,
#          native-2); test_compiled_gpu.py with the stable one                            cost
#       6. compute-sanitizer on the wheel's kernels: memcheck on the quick merge suite and the
#          boundary shapes, initcheck and racecheck on the quick merge suite (~380 s)     sanitize
#       7. the Rust merge suite at full shapes (every case, not the quick subset) on the
#          wheel's kernels, a sixteenth of them a step: ~90 s each on an H100 (runs
#          208-209), ~24 min for all, so SUITE_SHARDS names a call's shards (default
#          "1 2 ... 16") and none starts after SUITE_CAP s (default 380)                  suite
#    `run` alone does the first three parts in that order (sanitize, suite only when named); on the
#    default's 1227 kernels that is more than one device call's 600 s (the wheel's pytest alone took
#    260 s, run 145), so give each part its own call, or `run engine,wheel` (463 s on an H100, run
#    194: one machine start, where machines are scarce), then `run cost`. Each part prints the same
#    lines as `run` for its steps.
#    Each step's last non-empty line goes to $OUT/smoke.txt (smoke-engine.txt, smoke-wheel.txt,
#    smoke-cost.txt, smoke-engine-wheel.txt, smoke-sanitize.txt for a part; default OUT
#    .device/smoke/out), every log into $OUT/logs.tar.gz (logs-engine, ...; the device tool returns
#    at most 8 files), both written after each step, so a cut call keeps what ran. Exit status 1
#    when any step fails.
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
    tar -cJf "$S/engine.tar.xz" -C "$S" bin c-example c-families
    git rev-parse --short HEAD > "$S/commit.txt"
    echo "built $S ($(du -sh "$S" | cut -f1)) at $(cat "$S/commit.txt"); there, carrying $S/wheel, $S/engine.tar.xz and $S/commit.txt: 'scripts/gpu-smoke.sh run engine,wheel', then 'run cost'"
    ;;
run)
    PART="${2:-all}"
    [[ "$PART" == wheel,engine ]] && PART=engine,wheel
    case "$PART" in
    all) suffix= ;;
    engine|wheel|cost|engine,wheel|sanitize|suite) suffix="-${PART/,/-}" ;;
    *) echo "scripts/gpu-smoke.sh run: unknown part '$PART'; the parts are engine, wheel, cost, engine,wheel, sanitize and suite (none: engine, wheel and cost)" >&2; exit 2 ;;
    esac
    part() { [[ ("$PART" == all && "$1" != sanitize && "$1" != suite) || ",$PART," == *",$1,"* ]]; }
    # The engine's binaries and the C launchers travel packed (see build).
    if [[ ! -d "$S/bin" && -f "$S/engine.tar.xz" ]]; then tar -xJf "$S/engine.tar.xz" -C "$S"; fi
    OUT="${OUT:-$S/out}"; mkdir -p "$OUT"
    REPORT="$OUT/smoke$suffix.txt"; : > "$REPORT"
    LOGS="$(mktemp -d)"
    # A GPU test that finds no GPU fails instead of skipping (tests/gpu/common.rs).
    export PYTHONUNBUFFERED=1 MLA_GEN_EXPECT_GPU=1
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
        # after every step, so a call cut by its time limit still brings back the logs so far
        tar -czf "$OUT/logs$suffix.tar.gz.part" -C "$LOGS" . && mv "$OUT/logs$suffix.tar.gz.part" "$OUT/logs$suffix.tar.gz"
    }
    say "commit: $(cat "$S/commit.txt"), run $(date -u +%Y-%m-%dT%H:%MZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)${suffix:+, part $PART}"
    if part engine; then
        step example-engine "$S/bin/example-engine"
        c_example() {  # source, launcher folder, binary
            gcc -std=c11 -O2 -I/usr/local/cuda/include -I"$2/c" "$1" "$2/c/mla_kernels.c" \
                -L/usr/local/cuda/lib64/stubs -lcuda -pthread -lm -o "$LOGS/$3" && "$LOGS/$3"
        }
        step c-merge c_example examples/c/merge.c "$S/c-example" c-merge
        step c-families c_example examples/c/families.c "$S/c-families" c-families
        step c-devices c_example examples/c/devices.c "$S/c-example" c-devices
    fi
    # Both parts run against the installed wheel (its Python, its kernels).
    site="$(mktemp -d)"
    trap 'rm -rf "$site" "$LOGS"' EXIT
    wheel="$(ls "$S"/wheel/mla_gen-*.whl | head -n 1)"
    step wheel-install python3 -m pip install --no-deps --target "$site" "$wheel"
    if part engine; then
        for ex in python/examples/*.py; do
            name="python-$(basename "$ex" .py)"
            step "$name" env PYTHONPATH="$site" python3 -c '
import runpy, sys
result = runpy.run_path(sys.argv[1], run_name="__main__")
print("ran", sys.argv[1], "without error")' "$ex"
        done
    fi
    if part wheel; then
        repo="$PWD"
        # Its cap keeps the part inside one device call; beside the engine part's ~170 s, a shorter one.
        cap=500; [[ "$PART" == engine,wheel ]] && cap=380
        step wheel-pytest bash -c "cd '$site' && PYTHONPATH='$site' MLA_GEN_EXPECT_COMPILED=1 timeout $cap python3 -m pytest -q -p no:cacheprovider '$repo/python/tests'"
    fi
    if part engine; then
        step rust-quick env MLA_GEN_GPU_QUICK=1 MLA_GEN_GPU_KERNELS="$site/mla_gen/kernels" MLA_GEN_GPU_REPORT="$LOGS/rust-quick-report.txt" \
            "$S/bin/test-gpu" --test-threads=1
        step rust-faults env MLA_GEN_GPU_KERNELS="$site/mla_gen/kernels" "$S/bin/test-gpu_faults" --test-threads=1 --nocapture
    fi
    if part cost; then
        repo="$PWD"
        # The timeouts keep the part under one device call's 600 s. The first host_cost.py compiles
        # the vLLM-launcher bar with nvcc (cached for the later ones: >= 150 s before it prints);
        # the native build twice, as issue #36 asks for two runs.
        step host-cost-native env PYTHONPATH="$site" OUT="$OUT/native" timeout 220 python3 bench/host_cost.py
        step host-cost-stable env PYTHONPATH="$site" OUT="$OUT/stable" MLA_GEN_NATIVE_OP=0 timeout 100 python3 bench/host_cost.py
        step compiled-gpu-stable bash -c "cd '$site' && PYTHONPATH='$site' MLA_GEN_EXPECT_COMPILED=1 MLA_GEN_NATIVE_OP=0 timeout 150 python3 -m pytest -q -p no:cacheprovider '$repo/python/tests/test_compiled_gpu.py'"
        step host-cost-native-2 env PYTHONPATH="$site" OUT="$OUT/native-2" timeout 100 python3 bench/host_cost.py
    fi
    if part sanitize; then
        # compute-sanitizer on the installed wheel's kernels (runs 196-198, H100: 115 s, 188 s, 32 s
        # and 116 s; the caps keep the part inside one device call). --report-api-errors no: on a
        # driver without cuFuncGetParamCount the loader asks cuFuncGetParamInfo for the parameter one
        # past the contract's count, which must fail (src/host/load.rs), and memcheck would count
        # every such answer as an error.
        export MLA_GEN_GPU_KERNELS="$site/mla_gen/kernels" MLA_GEN_GPU_REPORT=/dev/null
        san() {  # cap in s, tool, test-gpu's arguments (the quick subset of each test)
            local cap=$1 tool=$2; shift 2
            MLA_GEN_GPU_QUICK=1 timeout "$cap" compute-sanitizer --tool "$tool" --report-api-errors no \
                --error-exitcode 99 "$S/bin/test-gpu" --test-threads=1 "$@"
        }
        step memcheck-merge san 150 memcheck every_kernel_matches
        step memcheck-boundary san 220 memcheck boundary_shapes
        step initcheck-merge san 60 initcheck every_kernel_matches
        step racecheck-merge san 140 racecheck every_kernel_matches
    fi
    if part suite; then
        t0=$SECONDS n=16
        for k in ${SUITE_SHARDS:-$(seq 1 $n)}; do
            if (( SECONDS - t0 > ${SUITE_CAP:-380} )); then say "suite: SUITE_CAP reached; not started: shard $k/$n and the rest of SUITE_SHARDS"; break; fi
            # the test's report (its one summary line: cases, passed, failed) is the step's last line
            step "suite-$k-of-$n" env MLA_GEN_GPU_KERNELS="$site/mla_gen/kernels" MLA_GEN_GPU_SHARD="$k/$n" \
                MLA_GEN_GPU_REPORT="$LOGS/suite-$k-report.txt" bash -c '"$@" && cat "$MLA_GEN_GPU_REPORT"' suite \
                "$S/bin/test-gpu" --test-threads=1 every_kernel_matches
        done
    fi
    echo "== smoke"; cat "$REPORT"
    exit $status
    ;;
-h|--help|help)
    # The comment at the top of this file.
    sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0" ;;
*)
    echo "usage: scripts/gpu-smoke.sh build | run [engine|wheel|cost|engine,wheel|sanitize|suite]   (run alone: engine, wheel, cost; --help: what each does)" >&2; exit 2 ;;
esac

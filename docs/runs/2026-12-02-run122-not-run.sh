#!/usr/bin/env bash
# Run 122 (prepared in session 15, not run: device time ran out): the committed flat twins for every dtype (generated/, 459 kernels): the Rust suite's
# quick subset and boundary shapes with compute-sanitizer memcheck, module loads; pytest from the
# tree (the Python selection with the new bounds); run 120-121's shapes through the final
# selection, hot and cold, one round.
cd "$(git rev-parse --show-toplevel)"  # needs .device/bin/test-gpu (scripts/gpu-check.sh build)
OUT="${OUT:-.device/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
date -u
MLA_GEN_GPU_QUICK=1 timeout 60 compute-sanitizer --tool memcheck --error-exitcode 99 .device/bin/test-gpu --test-threads=1 every_kernel_matches every_ptx > "$OUT/memcheck-quick.log" 2>&1
echo "quick memcheck rc=$? $(grep -Eo 'ERROR SUMMARY: [0-9]* errors' "$OUT/memcheck-quick.log" | tail -1) $(grep -Eo '(merge suite|module load).*' "$OUT/memcheck-quick.log" | tr '\n' ' ')"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 99 .device/bin/test-gpu --test-threads=1 boundary_shapes > "$OUT/memcheck-boundary.log" 2>&1
echo "boundary memcheck rc=$? $(grep -Eo 'ERROR SUMMARY: [0-9]* errors' "$OUT/memcheck-boundary.log" | tail -1) $(grep -Eo 'boundary shapes:.*' "$OUT/memcheck-boundary.log")"
PYTHONPATH=python timeout 90 python3 -m pytest -q -p no:cacheprovider python/tests > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? $(tail -n 1 "$OUT/pytest.log")"
grep -E "^FAILED" "$OUT/pytest.log" | head
S=bf16:131072x1x96,bf16:4096x1x96,bf16:1024x2x96,bf16:8192x1x64,bf16:2048x2x64,bf16:16384x2x80,f16:65536x1x576,f16:1024x1x192,f32:4096x1x192,f32:65536x2x192
timeout 50 python3 python/bench/bench.py --shapes $S --impls mla-gen,copy --reps 50 --graph-reps 15 --no-host --out "$OUT/final" > "$OUT/bench-final.log" 2>&1
echo "bench rc=$?"; grep -vE "^\s*$" "$OUT/bench-final.log" | tail -n 14

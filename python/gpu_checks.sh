#!/usr/bin/env bash
# The Python package on a GPU machine (no network, no Rust needed), in one go, under ~5 minutes:
#   1. install the wheel carried from the CPU machine ($MLA_GEN_WHEEL or .device/wheel/*.whl, with
#      the compiled op; its tests then require it), else build one from the tree (setuptools, no
#      compiled op), with pip --no-deps --target into a temp folder (torch comes from the machine);
#   2. pytest python/tests against the installed package (GPU tests: drop-in vs float64
#      reference, ops: opcheck / torch.compile / CUDA graphs, foreign context and two GPUs;
#      CPU tests too); with .device/gpu-extra (scripts/gpu-check.sh build), also the FP8,
#      K-way and in-place tests and the ops' opcheck against those kernels;
#   3. with .device/ctxmask (tests/gpu-ctxmask.toml, generated before the run: nothing is generated
#      here), python/tests/test_ctxmask.py (each fused `_ctxmask` merge bit for bit against
#      mask_empty_context_lse + the plain merge) and bench/bench_ctxmask.py (fused vs the pair,
#      cold L2 and hot in a CUDA graph); without it, a line saying they were skipped;
#   4. bench/host_cost.py (host cost per call: function, op (compiled where installed), the
#      pure-Python op and function, Triton launcher, zero_).
# Logs and host_cost.json go to $OUT (default .device/py-out); the last lines sum up.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-.device/py-out}"; mkdir -p "$OUT"
rm -f "$OUT/pytest-ctxmask.log" "$OUT/bench_ctxmask.txt" "$OUT/ctxmask-skipped.txt" "$OUT/pytest-pdl.log" \
      "$OUT/pdl-skipped.txt"  # no stale summary lines
PY="${PYTHON:-python3}"
site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT
status=0
# A wheel built on the CPU machine (scripts/build-wheel.sh, with the compiled op), carried as
# $MLA_GEN_WHEEL or .device/wheel/: installed as it is; else one built here from the tree (no Rust
# here, so without the compiled op; needs setuptools >= 77).
wheel="${MLA_GEN_WHEEL:-$(ls .device/wheel/mla_gen-*.whl 2>/dev/null | head -n 1)}"
expect_compiled=0
if [ -n "$wheel" ]; then
    echo "== install $wheel (pip --no-deps --target)"
    "$PY" -m pip install --quiet --no-deps --target "$site" "$wheel" > "$OUT/install.log" 2>&1 \
        || { cat "$OUT/install.log"; exit 1; }
    case "$wheel" in *abi3*) expect_compiled=1 ;; esac
else
    echo "== install the wheel built from the tree (pip --no-deps --no-build-isolation --target)"
    MLA_GEN_WHEEL_KERNELS="$PWD/generated" "$PY" -m pip install --quiet --no-deps --no-build-isolation --target "$site" ./python > "$OUT/install.log" 2>&1 \
        || { cat "$OUT/install.log"; exit 1; }
fi
export PYTHONPATH="$site" PYTHONUNBUFFERED=1 MLA_GEN_EXPECT_COMPILED="$expect_compiled"
"$PY" -c 'import mla_gen, sys; from mla_gen import ops, _ext; print("mla_gen", mla_gen.__version__, "from", mla_gen.__file__, "kernels", mla_gen.kernels_dir(), "compiled op:", f"{_ext.build} build ({_ext.loaded.name})" if ops.compiled else _ext.reason)' \
    | tee "$OUT/compiled.txt"
echo "== pytest python/tests (installed package, default kernels)"
(cd "$site" && timeout 900 "$PY" -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests" 2>&1) \
    | tee "$OUT/pytest.log" | tail -n 15
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if [ -d .device/gpu-extra ]; then
    echo "== pytest with MLA_GEN_KERNELS=.device/gpu-extra (FP8, K-way, in-place, lse mask)"
    (cd "$site" && MLA_GEN_KERNELS="$OLDPWD/.device/gpu-extra" timeout 900 "$PY" -m pytest -q -p no:cacheprovider \
        "$OLDPWD/python/tests/test_fp8.py" "$OLDPWD/python/tests/test_families.py" "$OLDPWD/python/tests/test_ops.py" 2>&1) \
        | tee "$OUT/pytest-extra.log" | tail -n 5
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ -d .device/ctxmask ]; then
    echo "== pytest with MLA_GEN_KERNELS=.device/ctxmask (fused empty-context mask vs mask + merge, bit for bit)"
    (cd "$site" && MLA_GEN_KERNELS="$OLDPWD/.device/ctxmask" timeout 600 "$PY" -m pytest -q -p no:cacheprovider \
        "$OLDPWD/python/tests/test_ctxmask.py" "$OLDPWD/python/tests/test_chunked_prefill_example.py" 2>&1) | tee "$OUT/pytest-ctxmask.log" | tail -n 6
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    echo "== fused mask vs mask + merge (bench/bench_ctxmask.py)"
    MLA_GEN_KERNELS="$PWD/.device/ctxmask" OUT="$OUT" timeout 300 "$PY" bench/bench_ctxmask.py 2>&1 \
        | tee "$OUT/bench_ctxmask.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
    echo "== .device/ctxmask missing: test_ctxmask.py and bench_ctxmask.py skipped" \
         "(mla-gen generate tests/gpu-ctxmask.toml --out .device/ctxmask, before the run)" | tee "$OUT/ctxmask-skipped.txt"
fi
if [ -n "${MLA_GEN_PDL_PRODUCER:-}" ] && [ -n "${MLA_GEN_PDL_KERNELS:-}" ]; then
    echo "== pytest test_pdl.py (pdl merge behind a late producer: MLA_GEN_PDL_PRODUCER, MLA_GEN_PDL_KERNELS)"
    (cd "$site" && MLA_GEN_PDL_PRODUCER="$(realpath "$MLA_GEN_PDL_PRODUCER")" \
        MLA_GEN_PDL_KERNELS="$(realpath "$MLA_GEN_PDL_KERNELS")" timeout 300 "$PY" -m pytest -q -p no:cacheprovider \
        -rs "$OLDPWD/python/tests/test_pdl.py" 2>&1) | tee "$OUT/pytest-pdl.log" | tail -n 5
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
    echo "== MLA_GEN_PDL_PRODUCER / MLA_GEN_PDL_KERNELS unset: test_pdl.py skipped" | tee "$OUT/pdl-skipped.txt"
fi
echo "== host cost (bench/host_cost.py)"
OUT="$OUT" "$PY" bench/host_cost.py 2>&1 | tee "$OUT/host_cost.txt" || status=1
echo "== summary"
cat "$OUT/compiled.txt"
echo "pytest: $(tail -n 1 "$OUT/pytest.log")"
[ -f "$OUT/pytest-extra.log" ] && echo "pytest (gpu-extra kernels): $(tail -n 1 "$OUT/pytest-extra.log")"
if [ -f "$OUT/pytest-ctxmask.log" ]; then
    echo "pytest (ctxmask kernels): $(tail -n 1 "$OUT/pytest-ctxmask.log")"
    grep -E "^ctxmask: " "$OUT/pytest-ctxmask.log" || echo "ctxmask: no summary line (see pytest-ctxmask.log)"
    grep -E "^target " "$OUT/bench_ctxmask.txt" || echo "bench_ctxmask: no target line (see bench_ctxmask.txt)"
else
    cat "$OUT/ctxmask-skipped.txt" 2>/dev/null || true
fi
[ -f "$OUT/pytest-pdl.log" ] && echo "pytest (pdl): $(tail -n 1 "$OUT/pytest-pdl.log")"
cat "$OUT/pdl-skipped.txt" 2>/dev/null || true
grep -E "function|op\)|\.default" "$OUT/host_cost.txt" || true
exit $status

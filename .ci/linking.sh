#!/usr/bin/env bash
# CI: an engine choosing cudarc's `dynamic-linking` builds with mla-gen's runtime (tests/linking,
# a library crate: nothing is linked, so no CUDA toolkit is needed). Its own lock file and target
# folder; the first run resolves its dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== cudarc dynamic-linking: tests/linking builds"
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/linking}" cargo build --quiet --manifest-path tests/linking/Cargo.toml
echo "1 passed, 0 failed: linking modes"

#!/usr/bin/env bash
# The test suite on a fresh machine: install the pinned NVRTC (the compile, snapshot and CLI tests
# need it), build generated/'s images when they are absent or stale (scripts/images.sh: the GPU
# tests and the Python drop-in run them), then run every test. GPU tests skip with a message where
# there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-nvrtc.sh
scripts/images.sh
cargo test --all-targets "$@"

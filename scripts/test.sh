#!/usr/bin/env bash
# The test suite on a fresh machine: install the pinned NVRTC (the compile, snapshot and CLI tests
# need it), then run every test. GPU tests skip with a message where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-nvrtc.sh
cargo test --all-targets "$@"

#!/usr/bin/env bash
# The main job on a fresh machine: install the pinned NVRTC, build mla-gen, and generate the
# embedded default spec into generated/ (extra arguments go to `mla-gen generate`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-nvrtc.sh
cargo run --release --quiet -- generate "$@"

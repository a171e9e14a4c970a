#!/usr/bin/env bash
# The main job on a fresh machine: install the pinned NVRTC, build mla-gen, and generate the
# embedded default spec into generated/ (extra arguments go to `mla-gen generate`). Git holds
# generated/manifest.json; the images it hashes (generated/kernels/) are what this builds, byte
# for byte (generated/README.md). After a change to the templates or the spec, commit the
# manifest it rewrites.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-nvrtc.sh
cargo run --release --quiet -- generate "$@"

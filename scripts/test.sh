#!/usr/bin/env bash
# The test suite on a fresh machine: install the pinned NVRTC (the compile, snapshot and CLI tests
# need it), build generated/'s images when they are absent or stale (scripts/images.sh: the GPU
# tests and the Python drop-in run them), then run every test. GPU tests skip with a message where
# there is no GPU. First, in a second, the module structure (scripts/structure.py): no circle and
# no layer importing one above it in src/ and python/mla_gen, no circle in bench/, and nothing of
# the product importing the lab.
set -euo pipefail
cd "$(dirname "$0")/.."
structure="$(python3 scripts/structure.py)" || { echo "$structure"; exit 1; }
tail -n 1 <<<"$structure"
scripts/install-nvrtc.sh
scripts/images.sh
cargo test --all-targets "$@"

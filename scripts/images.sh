#!/usr/bin/env bash
# Make generated/'s images (kernels/*.cubin, *.ptx) present and byte for byte the ones
# generated/manifest.json hashes: nothing to do when they are (`mla-gen verify`, a second, compiles
# nothing); else `mla-gen generate` builds them (minutes: every kernel through NVRTC; a
# generation writes nothing when nothing changed, but it compiles everything first). The images
# are build outputs, not in git (generated/README.md). Needs the pinned NVRTC
# (scripts/install-nvrtc.sh). MLA_GEN_BIN: the mla-gen binary to run (default: `cargo run`).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${MLA_GEN_BIN:-}" ]; then mla_gen=("$MLA_GEN_BIN"); else mla_gen=(cargo run --quiet --); fi
if "${mla_gen[@]}" verify --quiet 2>/dev/null; then
    exit 0
fi
echo "generated/: images absent or not the ones manifest.json hashes; building them (mla-gen generate)" >&2
"${mla_gen[@]}" generate
"${mla_gen[@]}" verify

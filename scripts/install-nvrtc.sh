#!/usr/bin/env bash
# Install the pinned NVRTC (no GPU needed) into python3's site-packages, where mla-gen finds it
# without LD_LIBRARY_PATH. 13.0.88 emits PTX ISA 9.0, which CUDA 13.0 drivers (r580) can JIT.
set -euo pipefail
PIN="nvidia-cuda-nvrtc==13.0.88"
PY="${MLA_GEN_PYTHON:-python3}"
installed="$("$PY" -m pip show nvidia-cuda-nvrtc 2>/dev/null || true)"
if grep -qx "Version: 13.0.88" <<<"$installed"; then
    exit 0
fi
echo "installing $PIN (about 90 MB) ..." >&2
"$PY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "$PIN"

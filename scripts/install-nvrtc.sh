#!/usr/bin/env bash
# Install the pinned NVRTC (no GPU needed) into python3's site-packages, where mla-gen finds it
# without LD_LIBRARY_PATH. 13.0.88 emits PTX ISA 9.0, which CUDA 13.0 drivers (r580) can JIT.
# Also the CUDA runtime wheel, for cuda.h (the C launcher's tests compile against it).
set -euo pipefail
PY="${MLA_GEN_PYTHON:-python3}"
for pin in nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96; do
    name="${pin%%==*}"; version="${pin##*==}"
    installed="$("$PY" -m pip show "$name" 2>/dev/null || true)"
    if grep -qx "Version: $version" <<<"$installed"; then
        continue
    fi
    echo "installing $pin ..." >&2
    "$PY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "$pin"
done

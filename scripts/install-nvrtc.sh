#!/usr/bin/env bash
# Install the pinned NVRTC (no GPU needed) where mla-gen finds it without LD_LIBRARY_PATH.
# 13.0.88 emits PTX ISA 9.0, which CUDA 13.0 drivers (r580) can JIT. Also the CUDA runtime wheel,
# for cuda.h (the C launcher's tests compile against it).
#
# Where: python3's own site-packages (or $VIRTUAL_ENV's, when one is active). When that Python is
# externally managed (PEP 668: Debian's and Ubuntu's system Python refuse `pip install`), a venv
# of its own at ~/.local/share/mla-gen/nvrtc-venv, which mla-gen also searches. Needs python3
# with pip (and the venv module for the fallback: Debian's python3-venv).
set -euo pipefail
PY="${MLA_GEN_PYTHON:-python3}"
PINS=(nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96)
VENV="${HOME}/.local/share/mla-gen/nvrtc-venv"

if [[ -z "${VIRTUAL_ENV:-}" && -n "$("$PY" -c 'import sys,sysconfig,os; print(os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) and "yes" or "")')" ]]; then
    if [[ ! -x "$VENV/bin/python" ]]; then
        echo "python3 is externally managed (PEP 668): installing NVRTC into a venv at $VENV" >&2
        "$PY" -m venv "$VENV"
    fi
    PY="$VENV/bin/python"
fi

for pin in "${PINS[@]}"; do
    name="${pin%%==*}"; version="${pin##*==}"
    installed="$("$PY" -m pip show "$name" 2>/dev/null || true)"
    if grep -qx "Version: $version" <<<"$installed"; then
        continue
    fi
    echo "installing $pin ..." >&2
    "$PY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "$pin"
done

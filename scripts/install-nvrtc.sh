#!/usr/bin/env bash
# Install the pinned NVRTC (no GPU needed) where mla-gen finds it without LD_LIBRARY_PATH.
# 13.0.88 emits PTX ISA 9.0, which CUDA 13.0 drivers (r580) can JIT. Also the CUDA runtime wheel,
# for cuda.h (the C launcher's tests compile against it).
#
# Where: python3's own site-packages (or $VIRTUAL_ENV's, when one is active). When that Python is
# externally managed (PEP 668: Debian's and Ubuntu's system Python refuse `pip install`), a venv
# of its own at ~/.local/share/mla-gen/nvrtc-venv, which mla-gen also searches. Needs python3
# with pip (and the venv module for the fallback: Debian's python3-venv).
#
# `--cuda 12.X` instead installs the CUDA 12 NVRTC whose PTX an older driver can JIT (12.2 for
# r535, 12.4 for r550, 12.8 for r570, 12.9 for r575) into a venv of its own, and prints the
# MLA_GEN_NVRTC setting that selects it (CUBIN needs no JIT: this matters for PTX only).
set -euo pipefail
PY="${MLA_GEN_PYTHON:-python3}"
PINS=(nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96)
VENV="${HOME}/.local/share/mla-gen/nvrtc-venv"

if [[ "${1:-}" == "--cuda" ]]; then
    case "${2:-}" in
        13.0) ;;
        12.2) cu12=12.2.140 ;;
        12.4) cu12=12.4.127 ;;
        12.8) cu12=12.8.93 ;;
        12.9) cu12=12.9.86 ;;
        *) echo "usage: $0 [--cuda 12.2|12.4|12.8|12.9|13.0]" >&2; exit 2 ;;
    esac
    if [[ -n "${cu12:-}" ]]; then
        venv="${HOME}/.local/share/mla-gen/nvrtc-cu${2}"
        [[ -x "$venv/bin/python" ]] || "$PY" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "nvidia-cuda-nvrtc-cu12==$cu12"
        lib="$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib)"
        echo "NVRTC $cu12 installed. Select it with:" >&2
        echo "export MLA_GEN_NVRTC=$lib"
        exit 0
    fi
fi

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

#!/usr/bin/env bash
# The C++ headers of one torch release, for building the compiled op against the oldest torch it
# serves (the stable ABI of torch 2.10: one binary for 2.10 and every later torch).
#
#   scripts/torch-headers.sh [VERSION]     (default 2.10.0)
#
# Downloads that torch's wheel for this Python from PyPI (`pip download --no-deps`: ~915 MB for
# 2.10.0 on Linux x86_64; PyPI has no CPU-only or headers-only torch) and extracts its
# torch/include/ into $MLA_GEN_CACHE (default ~/.cache/mla-gen)/torch-headers-VERSION, once; the
# wheel is deleted after. Prints the include folder (MLA_GEN_TORCH_INCLUDE for python/setup.py).
set -euo pipefail
version="${1:-2.10.0}"
PY="${MLA_GEN_PYTHON:-python3}"
cache="${MLA_GEN_CACHE:-$HOME/.cache/mla-gen}/torch-headers-$version"
if [ ! -f "$cache/include/torch/csrc/stable/library.h" ]; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps "torch==$version" -d "$tmp" >&2
    rm -rf "$cache.partial"
    mkdir -p "$cache.partial"
    "$PY" - "$tmp" "$cache.partial" <<'PYEOF'
import sys, zipfile
from pathlib import Path
wheel = next(Path(sys.argv[1]).glob("torch-*.whl"))
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("torch/include/")]
    for n in names:
        dest = Path(sys.argv[2], "include", n[len("torch/include/"):])
        if n.endswith("/"):
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(z.read(n))
print(f"{wheel.name}: {len(names)} header files", file=sys.stderr)
PYEOF
    rm -rf "$cache"
    mv "$cache.partial" "$cache"
fi
echo "$cache/include"

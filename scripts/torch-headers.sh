#!/usr/bin/env bash
# The C++ headers of one torch release, and with --libs the libraries an op built for exactly that
# release links against (libc10, libtorch, libtorch_cpu, libtorch_cuda).
#
#   scripts/torch-headers.sh [VERSION] [--libs]     (default 2.10.0)
#
# Without --libs: the headers for the stable-ABI op (_C.abi3.so, built against 2.10's: one binary
# for 2.10 and every later torch). With --libs: headers and libraries for a native op of that
# release (_C_torch<M>_<m>.abi3.so, python/setup.py's MLA_GEN_TORCH_NATIVE: TORCH_LIBRARY, which
# the dispatcher calls without the stable ABI's per-argument boxing).
#
# Downloads that torch's wheel from PyPI (`pip download --no-deps`: 0.5-0.9 GB on Linux x86_64;
# PyPI has no CPU-only or headers-only torch) unless $MLA_GEN_TORCH_WHEEL names one, and
# extracts torch/include/ (and torch/lib/'s four libraries) into $MLA_GEN_CACHE (default
# ~/.cache/mla-gen)/torch-headers-VERSION, once; a downloaded wheel is deleted after. Prints the
# include folder (MLA_GEN_TORCH_INCLUDE for python/setup.py); its sibling lib/ holds the libraries.
set -euo pipefail
version="2.10.0" libs=0
for a in "$@"; do
    case "$a" in
    --libs) libs=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) version="$a" ;;
    esac
done
PY="${MLA_GEN_PYTHON:-python3}"
cache="${MLA_GEN_CACHE:-$HOME/.cache/mla-gen}/torch-headers-$version"
have=1
[ -f "$cache/include/torch/csrc/stable/library.h" ] || have=0
[ "$libs" = 0 ] || [ -f "$cache/lib/libtorch_cpu.so" ] || have=0
if [ "$have" = 0 ]; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    wheel="${MLA_GEN_TORCH_WHEEL:-}"
    if [ -n "$wheel" ]; then
        case "$(basename "$wheel")" in
        "torch-$version-"*|"torch-$version+"*) ;;
        *) echo "torch-headers.sh: MLA_GEN_TORCH_WHEEL=$wheel is not torch $version's wheel" >&2; exit 1 ;;
        esac
    else
        # any Python's wheel: the headers and libraries are the same, only the Python module differs
        "$PY" -m pip download --quiet --disable-pip-version-check --no-deps "torch==$version" -d "$tmp" >&2
        wheel="$(ls "$tmp"/torch-*.whl)"
    fi
    rm -rf "$cache.partial"
    mkdir -p "$cache.partial"
    "$PY" - "$wheel" "$cache.partial" "$libs" <<'PYEOF'
import shutil, sys, zipfile
from pathlib import Path
wheel, dest, libs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"
keep = {"libc10.so", "libtorch.so", "libtorch_cpu.so", "libtorch_cuda.so"} if libs else set()
n = 0
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.endswith("/"):
            continue
        if name.startswith("torch/include/"):
            out = dest / "include" / name[len("torch/include/"):]
        elif name.startswith("torch/lib/") and name[len("torch/lib/"):] in keep:
            out = dest / "lib" / name[len("torch/lib/"):]
        else:
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        with z.open(name) as src, open(out, "wb") as f:
            shutil.copyfileobj(src, f)
        n += 1
missing = keep - {p.name for p in (dest / "lib").glob("*.so")} if libs else set()
if missing:
    sys.exit(f"{wheel.name} has no torch/lib/{sorted(missing)[0]}: not a CUDA build of torch for Linux")
print(f"{wheel.name}: {n} files", file=sys.stderr)
PYEOF
    rm -rf "$cache"
    mv "$cache.partial" "$cache"
fi
echo "$cache/include"

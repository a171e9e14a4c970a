#!/usr/bin/env bash
# FlashInfer's cascade.cuh and the headers it includes (nvcc -M on bench/peers/peers.cu lists
# them), extracted from the flashinfer-python wheel into DEST/flashinfer/ (git-ignored: never
# committed). The wheel comes from .whl/ when one is there, else `pip download` (here, not on the
# GPU machine, which has no network). Used by bench/gpu/peers.sh and bench/gpu/kway.sh build.
#
#   bench/gpu/flashinfer_headers.sh DEST
set -euo pipefail
cd "$(dirname "$0")/../.."
FLASHINFER=flashinfer-python==0.7.2.post1
dest="${1:?usage: bench/gpu/flashinfer_headers.sh DEST}"
[[ -f "$dest/flashinfer/attention/cascade.cuh" ]] && exit 0
wheel="$(ls .whl/flashinfer_python-0.7.2.post1-*.whl 2>/dev/null | head -1 || true)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [[ -z "$wheel" ]]; then
    python3 -m pip download --quiet --no-deps "$FLASHINFER" -d "$tmp"
    wheel="$(ls "$tmp"/flashinfer_python-*.whl)"
fi
python3 - "$wheel" "$dest" <<'PY'
import sys, zipfile
from pathlib import Path
wanted = ["attention/cascade.cuh", "attention/state.cuh", "cp_async.cuh", "exception.h", "math.cuh",
          "utils.cuh", "vec_dtypes.cuh"]
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in wanted:
        target = Path(sys.argv[2], "flashinfer", name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(z.read(f"flashinfer/data/include/flashinfer/{name}"))
PY
echo "FlashInfer headers in $dest/flashinfer"

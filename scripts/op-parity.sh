#!/usr/bin/env bash
# The compiled op (python/csrc) against the Python path in about two minutes, without the wheel's
# full build (scripts/build-wheel.sh generates all 1227 kernels for four archs and downloads
# torch 2.10's headers): for a change to op_core.h, setup.py or a torch-layer check.
#
#   scripts/op-parity.sh [pytest args]
#
# 1. the default spec cut to one head size per table, sm_90 only (target/op-parity/spec.toml), generated
#    with its C launcher (~30 s; Rust and the pinned NVRTC: scripts/install-nvrtc.sh);
# 2. the package built against it with the compiled op (stable ABI build only), against the headers
#    of the torch in $MLA_GEN_TORCH_ENV (default ~/.cache/mla-gen/torch-env, as .ci/python.sh
#    installs it), python/build removed first (setuptools does not see a change to a header);
# 3. python/tests/test_extension_cpu.py against it: ext/compare_cpu.py's calls launch the same
#    kernel with the same parameters, or are refused with the same text, in both. Its thread test
#    is left out (it calls head sizes the cut folder lacks); the full check is .ci/python.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_ENV="${MLA_GEN_TORCH_ENV:-$HOME/.cache/mla-gen/torch-env}"
PY="$TORCH_ENV/bin/python"
W="$PWD/target/op-parity"
"$PY" -c 'import torch' 2>/dev/null || { echo "no torch in $TORCH_ENV: run .ci/python.sh once (it installs it), or set MLA_GEN_TORCH_ENV" >&2; exit 2; }
rm -rf "$W" python/build && mkdir -p "$W"
python3 - "$W/spec.toml" <<'EOF'
import re, sys
spec = open("specs/default.toml").read()
spec = re.sub(r"(?m)^arch = .*$", 'arch = ["sm_90"]', spec)
def one(m):  # 128 where the table has it, else its first head size
    sizes = [int(x) for x in re.findall(r"\d+", m.group(1))]
    return f"head_size = [{128 if 128 in sizes else sizes[0]}]"
open(sys.argv[1], "w").write(re.sub(r"(?m)^head_size = (.*)$", one, spec))
EOF
cargo build --release --quiet --bin mla-gen
target/release/mla-gen generate "$W/spec.toml" --out "$W/gen" --emit c --quiet
TORCH="$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
(cd python && MLA_GEN_WHEEL_KERNELS="$W/gen" MLA_GEN_C_LAUNCHER="$W/gen/c" MLA_GEN_TORCH_INCLUDE="$TORCH/include" \
    MLA_GEN_TORCH_LIB="$TORCH/lib" MLA_GEN_EXTENSION=1 MLA_GEN_TORCH_NATIVE=0 \
    "$PY" -m pip wheel --quiet --no-deps -w "$W/dist" .)
rm -rf python/build
"$PY" -m pip install --quiet --no-deps --target "$W/site" "$W"/dist/*.whl
mkdir -p "$W/cwd" && cd "$W/cwd"
PYTHONPATH="$W/site" MLA_GEN_EXPECT_COMPILED=1 "$PY" -m pytest -q -p no:cacheprovider \
    "$OLDPWD/python/tests/test_extension_cpu.py" -k "not threads" "$@"

#!/usr/bin/env bash
# The compiled op against the Python path for every family, without a GPU: the default wheel has
# only merge_attn_states kernels, so there the other ops can only be refused alike. This builds a
# wheel of tests/contract/spec.toml (a kernel of every family and option; scripts/build-wheel.sh,
# ~1 minute), installs it into a fresh venv that sees the torch environment
# ($MLA_GEN_TORCH_ENV, default ~/.cache/mla-gen/torch-env), and runs compare_cpu.py there (every
# op launching what the Python path launches, or refused with the same text). Last line on
# success: "N cases agree".
set -euo pipefail
cd "$(dirname "$0")/../../.."
TORCH_ENV="${MLA_GEN_TORCH_ENV:-$HOME/.cache/mla-gen/torch-env}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
wheel="$(scripts/build-wheel.sh tests/contract/spec.toml --out "$work/dist" | tail -n 1)"
python3 -m venv --without-pip "$work/venv"
site="$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$TORCH_ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/torch_env.pth"
"$TORCH_ENV/bin/python" -m pip --python "$work/venv/bin/python" install --quiet --disable-pip-version-check \
    --no-index --no-deps "$wheel"
gcc -shared -fPIC -O1 python/tests/ext/stub_driver.c -o "$work/libcuda_stub.so"
cd "$work"  # python/ off sys.path: the installed package
MLA_GEN_EXT_CPU=1 MLA_GEN_LIBCUDA="$work/libcuda_stub.so" "$work/venv/bin/python" "$OLDPWD/python/tests/ext/compare_cpu.py" \
    | tail -n 1

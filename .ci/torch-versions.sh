#!/usr/bin/env bash
# One built wheel under another torch: the wheel .ci/python.sh built (against torch 2.10's
# headers) installed unchanged beside torch 2.10.0, the oldest torch its compiled op serves, and
# python/tests run there with the compiled op required (registration, schemas, fake tensors,
# torch.compile on meta tensors, the compiled op's launches into a stand-in driver) and once
# with the pure-Python fallback. .ci/python.sh runs the same tests under the newest torch of
# $MLA_GEN_TORCH_ENV.
#
#   .ci/torch-versions.sh WHEEL [VERSION]      (default 2.10.0)
#
# torch VERSION and its CUDA 12 nvidia-* wheels come from PyPI once into
# ~/.cache/mla-gen/torch-VERSION-env (~3.5 GB download; about 2 minutes here) and are reused.
set -euo pipefail
cd "$(dirname "$0")/.."
wheel="$1"
version="${2:-2.10.0}"
PY="${MLA_GEN_PYTHON:-python3}"
env_dir="${MLA_GEN_CACHE:-$HOME/.cache/mla-gen}/torch-$version-env"
if ! "$env_dir/bin/python" -c "import torch, pytest, numpy; assert torch.__version__.startswith('$version')" 2>/dev/null; then
    rm -rf "$env_dir"
    "$PY" -m venv "$env_dir"
    "$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$version" pytest numpy
fi
"$env_dir/bin/python" -c 'import torch; print("torch", torch.__version__)'
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PY" -m venv --without-pip "$work/venv"
VPY="$work/venv/bin/python"
site="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$env_dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/mla_gen_ci_torch.pth"
"$env_dir/bin/python" -m pip --python "$VPY" install --quiet --disable-pip-version-check --no-index "$wheel"
tests="$PWD/python/tests"
cd "$work"
status=0
echo "== torch $version: pytest python/tests, the compiled op"
MLA_GEN_EXPECT_INSTALLED=1 MLA_GEN_EXPECT_COMPILED=1 MLA_GEN_EXPECT_NATIVE=1 "$VPY" -m pytest -q -p no:cacheprovider "$tests" 2>&1 | tail -n 15
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== torch $version: pytest python/tests, the pure-Python fallback"
MLA_GEN_EXPECT_INSTALLED=1 MLA_GEN_PURE_PYTHON=1 "$VPY" -m pytest -q -p no:cacheprovider "$tests" 2>&1 | tail -n 5
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit "$status"

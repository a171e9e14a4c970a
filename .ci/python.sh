#!/usr/bin/env bash
# CI for the Python package, no GPU: build the platform wheel (scripts/build-wheel.sh: kernels as
# package data and the compiled op, cp39-abi3-manylinux), install it into a fresh venv with torch,
# check its package data and metadata, then run python/tests against the installed package twice:
# with the compiled op serving torch.ops.mla_gen.merge_attn_states (MLA_GEN_EXPECT_COMPILED: the
# op must load; its CPU test drives it into a stand-in driver and compares every launch with the
# Python path's) and with the pure-Python fallback (MLA_GEN_PURE_PYTHON=1). GPU tests skip. Then
# .ci/torch-versions.sh: the same wheel under torch 2.10, the oldest it serves. Prints pytest's
# summaries; non-zero on failure.
#
# torch: PyPI has no CPU-only torch for Linux x86_64; `pip install torch` brings the CUDA build
# and its nvidia-* wheels (~3 GB download, 5.4 GB installed, ~1.5 min here). It runs on a machine
# without a GPU. It is installed once into $MLA_GEN_TORCH_ENV (default ~/.cache/mla-gen/torch-env)
# and reused; each run's venv is fresh and sees it through a .pth file.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${MLA_GEN_PYTHON:-python3}"
TORCH_ENV="${MLA_GEN_TORCH_ENV:-$HOME/.cache/mla-gen/torch-env}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "== python: torch environment ($TORCH_ENV)"
if ! "$TORCH_ENV/bin/python" -c 'import torch, pytest, numpy' 2>/dev/null; then
    rm -rf "$TORCH_ENV"
    "$PY" -m venv "$TORCH_ENV"
    "$TORCH_ENV/bin/python" -m pip install --quiet --disable-pip-version-check torch pytest numpy
fi
"$TORCH_ENV/bin/python" -c 'import torch; print("torch", torch.__version__, "cuda available:", torch.cuda.is_available())'

# The wheel build generates the default spec's kernels (their manifest must be generated/'s byte
# for byte) and fills generated/kernels when it lacks them: python/tests read them there too.
echo "== python: build the wheel (scripts/build-wheel.sh: the compiled op against torch 2.10's headers)"
wheel="$(scripts/build-wheel.sh --out "$work/dist" | tail -n 1)"
echo "$wheel"
case "$(basename "$wheel")" in
*-cp39-abi3-manylinux_*_x86_64.whl) ;;
*) echo "not a cp39-abi3 manylinux x86_64 wheel: $wheel"; exit 1 ;;
esac
# torch's own wheels need glibc 2.28: the op (each build) must not need more
glibc="$(basename "$wheel" | sed -n 's/.*manylinux_2_\([0-9]*\)_x86_64.whl/\1/p')"
if [ "$glibc" -gt 28 ]; then
    echo "the wheel is manylinux_2_$glibc: an op build needs a glibc symbol newer than 2.28, which torch's wheels do not"
    echo "(objdump -T mla_gen/_C*.so | grep GLIBC_ names it; python/csrc/mla_gen_ops_native.cpp's __libc_single_threaded)"
    exit 1
fi
# The size budget (issue #34): the default kernels, each image once, in <= 40 MB (10^6 bytes).
WHEEL_BUDGET=40000000
wheel_bytes="$(stat -c %s "$wheel")"
echo "wheel size: $wheel_bytes bytes ($((wheel_bytes / 1000000)) MB; budget $((WHEEL_BUDGET / 1000000)) MB)"
if [ "$wheel_bytes" -gt "$WHEEL_BUDGET" ]; then
    echo "the wheel is over its budget: $wheel_bytes > $WHEEL_BUDGET bytes; shrink specs/default.toml (its header"
    echo "counts the kernels) or check that the package holds each image once (unzip -l the wheel)"
    exit 1
fi

echo "== python: install into a fresh venv"
# A venv without pip or setuptools of its own (they would shadow torch's requirements), torch
# through a .pth file, and the wheel installed with its dependencies resolved (--no-index: torch
# must be found installed, nothing is downloaded) by the torch environment's pip.
"$PY" -m venv --without-pip "$work/venv"
VPY="$work/venv/bin/python"
site="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$TORCH_ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/mla_gen_ci_torch.pth"
"$TORCH_ENV/bin/python" -m pip --python "$VPY" install --quiet --disable-pip-version-check --no-index "$wheel"

echo "== python: package data"
"$VPY" - "$wheel" <<'PYEOF'
import json, sys, zipfile
from pathlib import Path
import mla_gen
from importlib import resources
pkg = Path(mla_gen.__file__).parent
assert "site-packages" in str(pkg), f"mla_gen imported from {pkg}, not the installed wheel"
kernels = resources.files("mla_gen").joinpath("kernels")
repo = json.loads(Path("generated/manifest.json").read_text())
shipped = kernels.joinpath("manifest.json").read_bytes()
assert shipped == Path("generated/manifest.json").read_bytes(), "the wheel's manifest differs from generated/manifest.json"
files = [a[k]["file"] for kern in repo["kernels"] for a in kern["archs"] for k in ("ptx", "cubin") if a.get(k)]
missing = [f for f in files if not kernels.joinpath(*f.split("/")).is_file()]
assert not missing, f"missing from the wheel: {missing[:5]}"
assert mla_gen.__version__ == repo["generator"]["version"], (mla_gen.__version__, repo["generator"]["version"])
assert str(mla_gen.kernels_dir()) == str(kernels), mla_gen.kernels_dir()
names = zipfile.ZipFile(sys.argv[1]).namelist()
assert not any(n.endswith(".cu") for n in names)
assert "mla_gen/_C.abi3.so" in names, "the compiled op is missing from the wheel"
assert "mla_gen/_launch.abi3.so" in names, "the C launch (python/csrc/launch.c) is missing from the wheel"
natives = sorted(n for n in names if n.startswith("mla_gen/_C_torch"))
for release in ("2_10", "2_11"):  # scripts/build-wheel.sh's MLA_GEN_WHEEL_NATIVE
    assert f"mla_gen/_C_torch{release}.abi3.so" in natives, f"no native build for torch {release}: {natives}"
assert not any("libtorch" in n for n in names), "torch's libraries were copied into the wheel"
meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
meta = zipfile.ZipFile(sys.argv[1]).read(meta).decode()
for field in ("License-Expression: MIT OR Apache-2.0", "License-File: LICENSE-MIT", "License-File: LICENSE-APACHE",
              "Requires-Python: >=3.9", "Requires-Dist: torch", "Classifier: Operating System :: POSIX :: Linux",
              "Description-Content-Type: text/markdown"):
    assert field in meta, f"METADATA lacks {field!r}"
assert any(n.endswith("licenses/LICENSE-MIT") for n in names) and any(n.endswith("licenses/LICENSE-APACHE") for n in names)
print(f"1 passed, 0 failed: package data ({len(files)} kernel files, manifest equal to generated/manifest.json, "
      f"the compiled op and its native builds {[n.split('/')[1] for n in natives]}, metadata, version {mla_gen.__version__})")
PYEOF
cargo_version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)"
"$VPY" -c "import mla_gen, sys; v = mla_gen.__version__; sys.exit(0 if v == '$cargo_version' else f'mla_gen {v} != Cargo.toml $cargo_version')"

echo "== python: pytest python/tests, the compiled op (installed package; GPU tests skip without a GPU)"
cd "$work"  # so that python/ is not on sys.path: the tests import the installed package
status=0
MLA_GEN_EXPECT_INSTALLED=1 MLA_GEN_EXPECT_COMPILED=1 MLA_GEN_EXPECT_NATIVE=1 "$VPY" -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests" 2>&1 \
    | tail -n 25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== python: pytest python/tests, the pure-Python fallback (MLA_GEN_PURE_PYTHON=1)"
MLA_GEN_EXPECT_INSTALLED=1 MLA_GEN_PURE_PYTHON=1 "$VPY" -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests" 2>&1 \
    | tail -n 25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
cd "$OLDPWD"
echo "== python: the same wheel under torch 2.10 (.ci/torch-versions.sh)"
.ci/torch-versions.sh "$wheel" || status=1
exit "$status"

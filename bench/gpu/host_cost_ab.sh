#!/usr/bin/env bash
# Host cost per call of two wheels in one GPU session, alternated (A B A B): whether a change to
# the package moved the cost of a launch (issue #33: the image check must stay off the launch
# path). Each wheel is installed into its own temporary folder; bench/host_cost.py times
# it there (function, op, the vLLM-launcher bar), and the rows of each round are printed with the
# wheel's label. Needs the GPU machine (torch, a GPU).
#
#   bench/gpu/host_cost_ab.sh A.whl B.whl [ROUNDS]      (default 2 rounds of each)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: bench/gpu/host_cost_ab.sh A.whl B.whl [ROUNDS]" >&2; exit 2; }
a="$1" b="$2" rounds="${3:-2}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for w in a b; do
    python3 -m pip install --quiet --no-deps --target "$tmp/$w" "${!w}"
done
for r in $(seq "$rounds"); do
    for w in a b; do
        echo "== round $r, wheel $w: $(basename "${!w}")"
        PYTHONPATH="$tmp/$w" OUT="$tmp/out-$w-$r" python3 bench/host_cost.py 2>&1 |
            grep -E "^# bar|min us|function|op|TORCH_LIBRARY" || true
    done
done

#!/usr/bin/env bash
# The last step of a build half (bench/gpu/NAME.sh build): DIR/built.txt names the commit its
# kernels came from (and any uncommitted change to templates, specs or src), and DIR must fit in
# what a GPU run carries.
#
#   bench/gpu/built.sh NAME DIR MAX_MB [NOTE]
set -euo pipefail
cd "$(dirname "$0")/../.."
name="$1" dir="$2" max="$3" note="${4:-}"
dirty="$(git diff --quiet HEAD -- templates src specs || echo ' + uncommitted changes')"
echo "$name: templates and specs at $(git rev-parse --short HEAD)$dirty$note" > "$dir/built.txt"
size="$(du -sm --apparent-size "$dir" | cut -f1)"  # bytes, as the carry limit counts them
if (( size > max )); then
    echo "$name.sh: $dir is $size MB, over the $max MB a run carries" >&2
    exit 1
fi
echo "built $dir (${size} MB); on the GPU machine: bench/gpu/$name.sh run (carry $dir)"

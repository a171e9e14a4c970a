#!/usr/bin/env bash
# CI for the C launcher, beyond `cargo test` (tests/c_launcher.rs, tests/c_contract.rs):
#   1. docs/C.md's CMake snippet, verbatim, builds the launcher library from examples/c/spec.toml
#      with mla-gen at build time (CMake from Debian's package), and a program linked to it runs;
#      the CUDA "toolkit" is a stand-in root: the cuda.h the tests use (nvidia-cuda-runtime wheel,
#      or CUDA_HOME) and tests/c/driver_stub.h built as lib64/stubs/libcuda.so (no GPU here);
#   2. the C checks of tests/c run under ThreadSanitizer and under AddressSanitizer + UBSan;
#   3. bench/gpu/check_cost.c (the launcher's host cost on a GPU) compiles, and runs on the stub.
# Needs the nvidia-cuda-runtime wheel (scripts/install-nvrtc.sh) or CUDA_HOME, gcc, and cmake
# (installed with apt-get when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake >/dev/null; }
cargo build --quiet --bin mla-gen
mla_gen="$root/target/debug/mla-gen"

include=""
for dir in "${CUDA_HOME:+$CUDA_HOME/include}" \
           $(python3 -c 'import nvidia; print("\n".join(p + "/cu13/include" for p in nvidia.__path__))' 2>/dev/null) \
           /usr/local/cuda/include; do
    if [ -n "$dir" ] && [ -f "$dir/cuda.h" ]; then include="$dir"; break; fi
done
[ -n "$include" ] || { echo "cuda.h not found: run scripts/install-nvrtc.sh"; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "== C launcher: docs/C.md's CMake snippet (cuda.h from $include, stub driver)"
toolkit="$work/cuda"
mkdir -p "$toolkit/lib64/stubs" "$toolkit/bin"
ln -s "$include" "$toolkit/include"
version=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$include/cuda.h")
echo "CUDA Version $((version / 1000)).$((version % 1000 / 10)).0" > "$toolkit/version.txt"
# FindCUDAToolkit wants a cudart it will not link here: an empty one will do.
echo 'void mla_ci_no_cudart(void) {}' > "$work/cudart.c"
gcc -shared -fPIC "$work/cudart.c" -o "$toolkit/lib64/libcudart.so"
gcc -std=c11 -shared -fPIC -I"$include" -Itests/c tests/c/libcuda_stub.c -o "$toolkit/lib64/stubs/libcuda.so"
project="$work/project"
mkdir -p "$project"
cp examples/c/spec.toml "$project/engine.toml"
cp tests/c/cmake_smoke.c "$project/smoke.c"
{
    echo 'cmake_minimum_required(VERSION 3.18)'
    echo 'project(mla_gen_c_ci C)'
    awk '/^```cmake$/ { on = 1; next } /^```$/ { on = 0 } on' docs/C.md
    echo 'add_executable(smoke smoke.c)'
    echo 'target_compile_options(smoke PRIVATE -Wall -Wextra -Werror)'
    echo 'target_compile_options(mla_kernels PRIVATE -Wall -Wextra -Werror -pedantic)'
    echo 'target_link_libraries(smoke PRIVATE mla_kernels)'
} > "$project/CMakeLists.txt"
grep -q 'add_library(mla_kernels' "$project/CMakeLists.txt" || { echo "no CMake snippet in docs/C.md"; exit 1; }
cmake -S "$project" -B "$work/build" -DCUDAToolkit_ROOT="$toolkit" -DMLA_GEN="$mla_gen" > "$work/cmake.log" ||
    { cat "$work/cmake.log"; exit 1; }
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
LD_LIBRARY_PATH="$toolkit/lib64/stubs" "$work/build/smoke" | tee "$work/smoke.log"
grep -q "1 passed, 0 failed" "$work/smoke.log"

echo "== C launcher checks under sanitizers"
sanitize() {  # name, spec, check file[, the header it includes: special_expect.h]
    local dir="$work/$1"
    mkdir -p "$dir"
    printf '%b' "$2" > "$dir/s.toml"
    "$mla_gen" generate "$dir/s.toml" --out "$dir/gen" --emit c --quiet
    [ -z "${4:-}" ] || printf '%b' "$4" > "$dir/gen/c/special_expect.h"
    for flags in "-fsanitize=thread" "-fsanitize=address,undefined -fno-sanitize-recover=all"; do
        # shellcheck disable=SC2086
        gcc -std=c11 -g -O1 -pthread $flags -I"$include" -Itests/c -I"$dir/gen/c" "tests/c/$3" \
            "$dir/gen/c/mla_kernels.c" -o "$dir/check"
        "$dir/check" | tail -n 1 | sed "s/^/$3 ($flags): /"
        "$dir/check" | grep -q "1 passed, 0 failed"
    done
}
sanitize pairwise 'arch = ["sm_80", "sm_90"]\n[[merge_attn_states]]\ndtype = ["bf16", "f32"]\nhead_size = [128, 100]\nsize_rule = false\ndense = false\n' launcher_check.c
sanitize dense 'arch = "sm_90"\n[[merge_attn_states]]\ndtype = "bf16"\nhead_size = 128\nprefix_threshold = false\noutput_lse = false\nsize_rule = false\n' special_check.c \
    '#define D 128\n#define KERNEL "merge_attn_states_bf16_d128"\n#define LAUNCH mla_merge_attn_states_bf16_d128\n#define DENSE "merge_attn_states_bf16_d128_dense"\n#define DENSE_LAUNCH mla_merge_attn_states_bf16_d128_dense\n'
sanitize families 'arch = "sm_90"\n[[merge_states]]\ndtype = "bf16"\nhead_size = 128\nnum_states = [4, "runtime"]\n[[merge_state_in_place]]\ndtype = "bf16"\nhead_size = 128\nmask = true\n[[mask_empty_context_lse]]\n' families_check.c
sanitize prepared 'arch = "sm_90"\n[[merge_attn_states]]\ndtype = "bf16"\nhead_size = 128\n' prepared_check.c
sanitize group 'arch = "sm_90"\n[[merge_attn_states]]\ndtype = "bf16"\nhead_size = 128\noutput = "fp8_e4m3_group"\ngroup_size = 64\nue8m0 = true\n[[merge_attn_states]]\ndtype = "bf16"\nhead_size = 128\noutput = "fp8_e4m3"\n' group_check.c

echo "== bench/gpu/check_cost.c (the C launcher's host cost, run on a GPU by bench/gpu/check_cost.sh)"
# Built as the GPU machine builds it (compiled, not linked: no driver here), then against the stub
# driver under AddressSanitizer + UBSan and run: its loops go through the launcher with no GPU.
dir="$work/check-cost"
mkdir -p "$dir"
"$mla_gen" generate examples/c/spec.toml --out "$dir/gen" --emit c --quiet
for k in merge_attn_states_bf16_d128_thr_lse merge_attn_states_bf16_d128_thr_lse_dense; do
    gcc -std=c11 -O2 -Wall -Wextra -Werror -pedantic -pthread -DCHECK_COST_KERNEL="$k" -I"$include" -I"$dir/gen/c" \
        -c bench/gpu/check_cost.c -o "$dir/gpu.o"
    gcc -std=c11 -g -O1 -Wall -Wextra -Werror -pedantic -pthread -fsanitize=address,undefined -fno-sanitize-recover=all \
        -DCHECK_COST_STUB -DCHECK_COST_KERNEL="$k" -I"$include" -Itests/c -I"$dir/gen/c" bench/gpu/check_cost.c \
        -o "$dir/check_cost"
    "$dir/check_cost" --rounds 3 --calls 100 > "$dir/log" || { cat "$dir/log"; exit 1; }
    tail -n 1 "$dir/log" | sed "s/^/check_cost.c ($k, stub driver): /"
    grep -q "1 passed, 0 failed" "$dir/log"
done
echo "1 passed, 0 failed: C launcher (CMake, sanitizers, check_cost.c)"

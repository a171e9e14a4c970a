/* Host cost of one call of the generated C launcher alone (its contract check, size rule,
 * specialization and the driver call), the part of the compiled op's cost (python/csrc) that is
 * the launcher's: 1M calls of the default spec's bf16 D=128 merge on a 1-token, 1-head call, into
 * a stand-in driver whose functions return at once (stub_libcuda.c), no GPU. Build and run:
 *
 *   target/debug/mla-gen generate --out /tmp/k --emit c --quiet
 *   gcc -O2 -Ipython/csrc/driver -I/tmp/k/c bench/c_launcher_cost.c python/csrc/driver/driver.c \
 *       /tmp/k/c/mla_kernels.c -ldl -lpthread -o /tmp/c_launcher_cost
 *   gcc -O2 -shared -fPIC bench/stub_libcuda.c -o /tmp/stub_libcuda.so
 *   MLA_GEN_LIBCUDA=/tmp/stub_libcuda.so /tmp/c_launcher_cost
 */
#include "mla_kernels.h"

#include <stdio.h>
#include <time.h>

int main(void) {
    if (mla_gen_driver_open() != 0) {
        printf("driver: %s\n", mla_gen_driver_error());
        return 1;
    }
    static _Alignas(16) char rows[3][256];
    static _Alignas(16) float lse[2][4];
    mla_merge_attn_states_args a = MLA_MERGE_ATTN_STATES_ARGS_INIT;
    a.output = rows[0];
    a.prefix_output = rows[1];
    a.suffix_output = rows[2];
    a.output_numel = a.prefix_output_numel = a.suffix_output_numel = 128;
    a.prefix_lse = lse[0];
    a.suffix_lse = lse[1];
    a.prefix_lse_numel = a.suffix_lse_numel = 1;
    a.num_tokens = a.num_heads = 1;
    a.output_token_stride = a.output_head_stride = a.prefix_token_stride = a.prefix_head_stride = 128;
    a.suffix_token_stride = a.suffix_head_stride = 128;
    a.prefill_tokens_with_context = 1;
    if (mla_merge_attn_states_bf16_d128_thr_lse(NULL, &a) != MLA_OK) {
        printf("refused: %s\n", mla_last_error());
        return 1;
    }
    const int n = 1000000;
    double best = 1e9;
    for (int round = 0; round < 5; ++round) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int i = 0; i < n; ++i) mla_merge_attn_states_bf16_d128_thr_lse(NULL, &a);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double us = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / n / 1e3;
        best = us < best ? us : best;
    }
    printf("C launcher, check + size rule + specialization + stub launch: %.3f us per call (min of 5 x %d)\n",
           best, n);
    return 0;
}

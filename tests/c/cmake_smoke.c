/* Linked by .ci/c.sh through docs/C.md's CMake snippet, against the stand-in libcuda.so
 * (tests/c/libcuda_stub.c): the library target builds, links and runs. One launch of the pairwise
 * merge of examples/c/spec.toml, one refusal. Prints "1 passed, 0 failed". */
#include "mla_kernels.h"

#include <stdio.h>
#include <string.h>

enum { T = 4, H = 2, D = 128 };
static _Alignas(16) unsigned short out[T * H * D], prefix[T * H * D], suffix[T * H * D];
static float plse[T * H], slse[T * H];

int main(void) {
    int failures = 0;
    mla_merge_attn_states_args a = MLA_MERGE_ATTN_STATES_ARGS_INIT;
    a.output = out; a.output_numel = T * H * D;
    a.prefix_output = prefix; a.prefix_output_numel = T * H * D; a.prefix_lse = plse; a.prefix_lse_numel = T * H;
    a.suffix_output = suffix; a.suffix_output_numel = T * H * D; a.suffix_lse = slse; a.suffix_lse_numel = T * H;
    a.num_tokens = T; a.num_heads = H;
    a.output_token_stride = a.prefix_token_stride = a.suffix_token_stride = H * D;
    a.output_head_stride = a.prefix_head_stride = a.suffix_head_stride = D;
    failures += mla_load() != MLA_OK;
    failures += mla_merge_attn_states_bf16_d128_thr_lse(NULL, &a) != MLA_OK;
    a.suffix_lse_numel = T * H - 1;
    failures += mla_merge_attn_states_bf16_d128_thr_lse(NULL, &a) != MLA_INVALID_ARGUMENT;
    failures += strcmp(mla_last_error(), "merge_attn_states_bf16_d128_thr_lse: suffix_lse: [H=2, T=4] with strides "
                                         "(4, 1) needs 8 elements, it has 7") != 0;
    failures += mla_unload() != MLA_OK;
    printf("mla-gen %s C launcher: %d passed, %d failed\n", MLA_VERSION_STRING, failures ? 0 : 1, failures);
    return failures != 0;
}

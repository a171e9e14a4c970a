#include "mla_kernels.h"

/* Merge two attention states: [T, H, 128] bf16 rows, dense; lse [H, T] float32. */
mla_status merge_states(CUstream stream, CUdeviceptr out, CUdeviceptr prefix, CUdeviceptr prefix_lse,
                        CUdeviceptr suffix, CUdeviceptr suffix_lse, int64_t T, int64_t H, int64_t n_ctx) {
    const int64_t D = 128, N = T * H * D;
    mla_merge_attn_states_args a = MLA_MERGE_ATTN_STATES_ARGS_INIT;
    a.output = (void*)out;                         a.output_numel = N;
    a.prefix_output = (const void*)prefix;         a.prefix_output_numel = N;
    a.prefix_lse = (const float*)prefix_lse;       a.prefix_lse_numel = T * H;
    a.suffix_output = (const void*)suffix;         a.suffix_output_numel = N;
    a.suffix_lse = (const float*)suffix_lse;       a.suffix_lse_numel = T * H;
    a.num_tokens = T;                              a.num_heads = H;
    a.output_token_stride = H * D;                 a.output_head_stride = D;
    a.prefix_token_stride = H * D;                 a.prefix_head_stride = D;
    a.suffix_token_stride = H * D;                 a.suffix_head_stride = D;
    a.prefill_tokens_with_context = n_ctx;         /* MLA_DEFAULT: every token has context */
    return mla_merge_attn_states_bf16_d128_thr_lse(stream, &a); /* not MLA_OK: see mla_last_error() */
}

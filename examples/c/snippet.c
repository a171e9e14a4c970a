#include "mla_kernels.h"

/* Merge two attention states: [T, H, 128] bf16 rows, dense; lse [H, T] float32. */
CUresult merge_states(CUstream stream, CUdeviceptr out, CUdeviceptr prefix, CUdeviceptr prefix_lse,
                      CUdeviceptr suffix, CUdeviceptr suffix_lse, int64_t T, int64_t H, int64_t n_ctx) {
    const int64_t D = 128, N = T * H * D;
    mla_merge_args a = {
        .output = (void*)out, .output_numel = N,
        .prefix_output = (const void*)prefix, .prefix_numel = N,
        .prefix_lse = (const float*)prefix_lse, .prefix_lse_numel = T * H,
        .suffix_output = (const void*)suffix, .suffix_numel = N,
        .suffix_lse = (const float*)suffix_lse, .suffix_lse_numel = T * H,
        .num_tokens = T, .num_heads = H,
        .output_token_stride = H * D, .output_head_stride = D,
        .prefix_token_stride = H * D, .prefix_head_stride = D,
        .suffix_token_stride = H * D, .suffix_head_stride = D,
        .prefill_tokens_with_context = n_ctx,
    };
    return mla_merge_attn_states_bf16_d128_thr_lse(stream, &a); /* after mla_load() */
}

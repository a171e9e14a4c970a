/* A valid pairwise merge call for the checks of tests/c (include after mla_kernels.h): T tokens,
 * H heads of D elements (defined by the includer), contiguous bf16 rows, head-major lse, output
 * lse, half the tokens with context. The buffers are host memory: the stub driver never reads them. */
#ifndef MLA_MERGE_CALL_H
#define MLA_MERGE_CALL_H

#define N (T * H * D)
static _Alignas(16) unsigned short out[N], prefix[N], suffix[N];
static float plse[T * H], slse[T * H], olse[T * H];

static mla_merge_attn_states_args good(void) {
    mla_merge_attn_states_args a = MLA_MERGE_ATTN_STATES_ARGS_INIT;
    a.output = out; a.output_numel = N;
    a.output_lse = olse; a.output_lse_numel = T * H;
    a.prefix_output = prefix; a.prefix_output_numel = N;
    a.prefix_lse = plse; a.prefix_lse_numel = T * H;
    a.suffix_output = suffix; a.suffix_output_numel = N;
    a.suffix_lse = slse; a.suffix_lse_numel = T * H;
    a.num_tokens = T; a.num_heads = H;
    a.output_token_stride = H * D; a.output_head_stride = D;
    a.prefix_token_stride = H * D; a.prefix_head_stride = D;
    a.suffix_token_stride = H * D; a.suffix_head_stride = D;
    a.prefill_tokens_with_context = T / 2;
    return a;
}

#endif /* MLA_MERGE_CALL_H */

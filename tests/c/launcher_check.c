/* Exercises the generated C launcher without a GPU: the driver functions it calls are stubs
 * here, so the argument checks, the image choice and the launch parameters can be asserted.
 * Built and run by tests/c_launcher.rs against a spec with merge_attn_states_bf16_d128_thr_lse. */
#include "mla_kernels.h"

#include <stdio.h>
#include <string.h>

#include "driver_stub.h"

#define T 100
#define H 8
#define D 128
static _Alignas(16) unsigned short out[T * H * D], prefix[T * H * D], suffix[T * H * D];
static float plse[T * H], slse[T * H], olse[T * H];

static mla_merge_args good(void) {
    mla_merge_args a = {
        out, T * H * D, olse, T * H, prefix, T * H * D, plse, T * H, suffix, T * H * D, slse, T * H,
        T, H, H * D, D, H * D, D, H * D, D, T / 2, NULL,
    };
    return a;
}

static int failures;
#define EXPECT(cond) do { if (!(cond)) { printf("FAILED line %d: %s\n", __LINE__, #cond); failures++; } } while (0)

static void refused(mla_merge_args a, const char* needle) {
    CUresult r = mla_merge_attn_states_bf16_d128_thr_lse(NULL, &a);
    if (r != MLA_ERROR_INVALID_ARGUMENT || !strstr(mla_last_error(), needle)) {
        printf("FAILED: expected refusal containing '%s', got %d '%s'\n", needle, (int)r, mla_last_error());
        failures++;
    }
}

int main(void) {
    /* Before mla_load: a valid call is refused by the driver-side state, not launched. */
    mla_merge_args a = good();
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse(NULL, &a) == CUDA_ERROR_NOT_INITIALIZED);
    EXPECT(mla_load() == CUDA_SUCCESS);
    EXPECT(loaded_images == 4); /* 4 kernels on an sm_90 device: each its CUBIN, no PTX */

    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse(NULL, &a) == CUDA_SUCCESS);
    EXPECT(launches == 1);
    EXPECT(last_params[0] == (long long)(uintptr_t)out);
    EXPECT(last_params[6] == T && last_params[7] == H);
    EXPECT(last_params[14] == T / 2);
    EXPECT(last_grid[2] == 1 && last_grid[0] >= 1 && last_grid[1] >= 1);
    EXPECT(last_block >= 32);

    a.prefill_tokens_with_context = -1;
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse(NULL, &a) == CUDA_SUCCESS);
    EXPECT(last_params[14] == T);

    a = good(); a.num_tokens = 0; a.prefill_tokens_with_context = -1;
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse(NULL, &a) == CUDA_SUCCESS);
    EXPECT(launches == 2); /* nothing launched for T = 0 */

    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse(NULL, NULL) == MLA_ERROR_INVALID_ARGUMENT);
    a = good(); a.prefix_output = NULL; refused(a, "NULL");
    a = good(); a.suffix_numel -= 1; refused(a, "suffix_output: [T=100, H=8, D=128]");
    a = good(); a.prefix_lse_numel = T * H - 1; refused(a, "lse buffer");
    a = good(); a.output_head_stride = 120; refused(a, "head stride 120 < head size 128");
    a = good(); a.prefix_head_stride = 132; a.prefix_token_stride = H * 132; refused(a, "multiples of 8");
    a = good(); a.suffix_output = (const char*)suffix + 2; refused(a, "not aligned to 16 bytes");
    a = good(); a.prefill_tokens_with_context = T + 1; refused(a, "exceeds num_tokens");
    a = good(); a.output = prefix; refused(a, "overlaps");
    a = good(); a.output_token_stride = D; refused(a, "rows would overlap");
    a = good(); a.num_tokens = (int64_t)1 << 62; a.output_numel = a.prefix_numel = a.suffix_numel = INT64_MAX; refused(a, "needs more");
    a = good(); a.num_heads = -1; refused(a, "negative");
    a = good(); a.output_scale = plse; refused(a, "output is not FP8");
    EXPECT(launches == 2);

    /* An sm_75 device has neither a CUBIN nor a PTX it can JIT in this file. */
    mla_unload();
    stub_cc_major = 7;
    EXPECT(mla_load() == CUDA_ERROR_NO_BINARY_FOR_GPU);
    /* An sm_100 device JITs the newest PTX. */
    mla_unload();
    stub_cc_major = 10; loaded_images = 0;
    EXPECT(mla_load() == CUDA_SUCCESS);
    EXPECT(loaded_images == 4000);

    mla_unload();
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures);
    return failures != 0;
}

/* Exercises the generated C launcher of a per-token-group FP8 kernel without a GPU (stub driver
 * functions): valid calls in row-major and column-major scale layouts launch with the scales'
 * pointer and strides in manifest order, and every unsafe call is refused before any launch.
 * Built and run by tests/c_launcher.rs against merge_attn_states bf16 d128, group size 64, UE8M0. */
#include "mla_kernels.h"

#include <stdio.h>
#include <string.h>

#include "driver_stub.h"

#define T 100
#define H 8
#define D 128
#define G 64
#define GROUPS (H * D / G)
static _Alignas(16) unsigned short prefix[T * H * D], suffix[T * H * D];
static _Alignas(16) unsigned char codes[T * H * D];
static float plse[T * H], slse[T * H], olse[T * H], scales[T * (GROUPS + 8)], one_scale = 1.0f;

static int failures;
#define EXPECT(cond) do { if (!(cond)) { printf("FAILED line %d: %s\n", __LINE__, #cond); failures++; } } while (0)

static mla_group_fp8_args good(void) {
    mla_group_fp8_args g;
    memset(&g, 0, sizeof g);
    mla_merge_args a = {
        codes, T * H * D, olse, T * H, prefix, T * H * D, plse, T * H, suffix, T * H * D, slse, T * H,
        T, H, H * D, D, H * D, D, H * D, D, T / 2, NULL,
    };
    g.merge = a;
    g.output_scales = scales;
    g.output_scales_numel = T * GROUPS;
    g.scale_token_stride = GROUPS; /* row-major [T, groups] */
    g.scale_group_stride = 1;
    return g;
}

static void refused(mla_group_fp8_args g, const char* needle) {
    CUresult r = mla_merge_attn_states_bf16_d128_thr_lse_fp8g64_ue8m0(NULL, &g);
    if (r != MLA_ERROR_INVALID_ARGUMENT || !strstr(mla_last_error(), needle)) {
        printf("FAILED: expected refusal containing '%s', got %d '%s'\n", needle, (int)r, mla_last_error());
        failures++;
    }
}

int main(void) {
    EXPECT(mla_load() == CUDA_SUCCESS);
    /* Parameters: output, output_lse, prefix, prefix_lse, suffix, suffix_lse, output_scales, T, H,
       six row strides, scale token stride, scale group stride, threshold (the stub keeps 16). */
    param_count = 16;
    mla_group_fp8_args g = good();
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse_fp8g64_ue8m0(NULL, &g) == CUDA_SUCCESS);
    EXPECT(launches == 1);
    EXPECT(last_params[0] == (long long)(uintptr_t)codes && last_params[6] == (long long)(uintptr_t)scales);
    EXPECT(last_params[7] == T && last_params[8] == H && last_params[15] == GROUPS);

    /* Column-major scales ([groups, T] in memory) and padded rows are layouts, not errors. */
    g = good(); g.scale_token_stride = 1; g.scale_group_stride = T;
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse_fp8g64_ue8m0(NULL, &g) == CUDA_SUCCESS);
    EXPECT(last_params[15] == 1);
    g = good(); g.scale_token_stride = GROUPS + 8; g.output_scales_numel = (T - 1) * (GROUPS + 8) + GROUPS;
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse_fp8g64_ue8m0(NULL, &g) == CUDA_SUCCESS);
    EXPECT(last_params[15] == GROUPS + 8);
    EXPECT(launches == 3);

    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse_fp8g64_ue8m0(NULL, NULL) == MLA_ERROR_INVALID_ARGUMENT);
    g = good(); g.output_scales = NULL; refused(g, "output_scales is required");
    g = good(); g.merge.output_scale = &one_scale; refused(g, "one scale per token group");
    g = good(); g.output_scales = (float*)((char*)scales + 2); refused(g, "not 4-byte aligned");
    g = good(); g.output_scales_numel = T * GROUPS - 1; refused(g, "needs more than its");
    g = good(); g.scale_token_stride = -1; refused(g, "negative stride");
    g = good(); g.scale_token_stride = GROUPS - 1; refused(g, "map two (token, group) pairs to one element");
    g = good(); g.scale_token_stride = 1; g.scale_group_stride = T - 1; refused(g, "map two");
    g = good(); g.output_scales = plse; refused(g, "overlaps another buffer");
    g = good(); g.output_scales = (float*)codes; refused(g, "overlaps another buffer");
    g = good(); g.merge.output_lse = scales; refused(g, "overlaps another buffer");
    EXPECT(launches == 3);

    /* Nothing to launch for T = 0: no scale check can fail, nothing is written. */
    g = good(); g.merge.num_tokens = 0; g.merge.prefill_tokens_with_context = -1; g.output_scales = NULL;
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse_fp8g64_ue8m0(NULL, &g) == CUDA_SUCCESS);
    EXPECT(launches == 3);

    mla_unload();
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures);
    return failures ? 1 : 0;
}

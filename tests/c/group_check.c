/* Exercises the generated C launcher of a per-token-group FP8 kernel without a GPU (stub driver
 * functions): valid calls in row-major and column-major scale layouts launch with the scales'
 * pointer and strides in manifest order, and every unsafe call is refused, with the contract's
 * text, before any launch; the per-tensor FP8 kernel of the same family (same struct) refuses
 * group scales, the group kernel a per-tensor scale. Built and run by tests/c_launcher.rs against
 * merge_attn_states bf16 d128 into FP8 with group size 64 (UE8M0) and with one scale. */
#include "mla_kernels.h"

#include <stdio.h>
#include <string.h>

#include "driver_stub.h"

#define T 100
#define H 8
#define D 128
#define G 64
#define GROUPS (H * D / G)
#define KERNEL "merge_attn_states_bf16_d128_thr_lse_fp8g64_ue8m0"
static _Alignas(16) unsigned short prefix[T * H * D], suffix[T * H * D];
static _Alignas(16) unsigned char codes[T * H * D];
static float plse[T * H], slse[T * H], olse[T * H], scales[T * (GROUPS + 8)], one_scale = 1.0f;

static int failures;
#define EXPECT(cond) do { if (!(cond)) { printf("FAILED line %d: %s\n", __LINE__, #cond); failures++; } } while (0)

static mla_merge_attn_states_args good(void) {
    mla_merge_attn_states_args a = MLA_MERGE_ATTN_STATES_ARGS_INIT;
    a.output = codes; a.output_numel = T * H * D; a.output_lse = olse; a.output_lse_numel = T * H;
    a.prefix_output = prefix; a.prefix_output_numel = T * H * D; a.prefix_lse = plse; a.prefix_lse_numel = T * H;
    a.suffix_output = suffix; a.suffix_output_numel = T * H * D; a.suffix_lse = slse; a.suffix_lse_numel = T * H;
    a.num_tokens = T; a.num_heads = H;
    a.output_token_stride = H * D; a.output_head_stride = D;
    a.prefix_token_stride = H * D; a.prefix_head_stride = D;
    a.suffix_token_stride = H * D; a.suffix_head_stride = D;
    a.prefill_tokens_with_context = T / 2;
    a.output_scales = scales; a.output_scales_numel = T * GROUPS;
    a.scale_token_stride = GROUPS; /* row-major [T, groups] */
    a.scale_group_stride = 1;
    return a;
}

static mla_status launch(mla_merge_attn_states_args a) { return mla_merge_attn_states_bf16_d128_thr_lse_fp8g64_ue8m0(NULL, &a); }

static void refused(mla_merge_attn_states_args a, const char* problem) {
    char want[256];
    snprintf(want, sizeof want, KERNEL ": %s", problem);
    mla_status s = launch(a);
    if (s != MLA_INVALID_ARGUMENT || strcmp(mla_last_error(), want) != 0) {
        printf("FAILED: expected '%s', got %s '%s'\n", want, mla_status_string(s), mla_last_error());
        failures++;
    }
}

int main(void) {
    /* Parameters: output, output_lse, prefix, prefix_lse, suffix, suffix_lse, output_scales, T, H,
       six row strides, scale token stride, scale group stride, threshold. */
    mla_merge_attn_states_args g = good();
    EXPECT(launch(g) == MLA_OK);
    EXPECT(launches == 1);
    EXPECT(last_params[0] == (long long)(uintptr_t)codes && last_params[6] == (long long)(uintptr_t)scales);
    EXPECT(last_params[7] == T && last_params[8] == H && last_params[15] == GROUPS && last_params[16] == 1);
    EXPECT(last_params[17] == T / 2 && last_param_count == 18);

    /* Column-major scales ([groups, T] in memory) and padded rows are layouts, not errors. */
    g = good(); g.scale_token_stride = 1; g.scale_group_stride = T;
    EXPECT(launch(g) == MLA_OK);
    EXPECT(last_params[15] == 1 && last_params[16] == T);
    g = good(); g.scale_token_stride = GROUPS + 8; g.output_scales_numel = (T - 1) * (GROUPS + 8) + GROUPS;
    EXPECT(launch(g) == MLA_OK);
    EXPECT(last_params[15] == GROUPS + 8);
    EXPECT(launches == 3);

    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse_fp8g64_ue8m0(NULL, NULL) == MLA_INVALID_ARGUMENT);
    g = good(); g.output_scales = NULL; refused(g, "output_scales is a null pointer");
    g = good(); g.output_scales = (float*)((char*)scales + 2);
    {
        char problem[128];
        snprintf(problem, sizeof problem, "output_scales: pointer 0x%llx is not aligned to 4 bytes",
                 (unsigned long long)(uintptr_t)g.output_scales);
        refused(g, problem);
    }
    g = good(); g.output_scales_numel = T * GROUPS - 1;
    refused(g, "output_scales: [T=100, G=16] with strides (16, 1) needs 1600 elements, it has 1599");
    g = good(); g.scale_token_stride = -1; refused(g, "scale_token_stride = -1 is below its minimum 0");
    g = good(); g.scale_token_stride = GROUPS - 1;
    refused(g, "output_scales: [T=100, G=16] with strides (15, 1) maps two elements to one address");
    g = good(); g.scale_token_stride = 1; g.scale_group_stride = T - 1;
    refused(g, "output_scales: [T=100, G=16] with strides (1, 99) maps two elements to one address");
    g = good(); g.output_scales = (float*)suffix;
    refused(g, "suffix_output overlaps output_scales: the kernel writes output_scales, which may share memory with no other argument");
    g = good(); g.output_scales = (float*)codes;
    refused(g, "output overlaps output_scales: the kernel writes output, which may share memory with no other argument");
    g = good(); g.output_lse = scales;
    refused(g, "output_lse overlaps output_scales: the kernel writes output_lse, which may share memory with no other argument");
    EXPECT(launches == 3);

    /* One struct for the family: each kernel refuses what only the other takes. A zero-initialized
     * stride is "not given"; any other value is refused. */
    g = good(); g.output_scale = &one_scale; g.output_scale_numel = 1;
    refused(g, "output_scale given, but this kernel takes no output_scale");
    g.output_scales = NULL; g.output_scales_numel = 0;
    g.scale_token_stride = 0; g.scale_group_stride = MLA_DEFAULT;
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse_fp8(NULL, &g) == MLA_OK);
    EXPECT(launches == 4 && last_params[6] == (long long)(uintptr_t)&one_scale && last_param_count == 16);
    g.scale_group_stride = 1;
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse_fp8(NULL, &g) == MLA_INVALID_ARGUMENT);
    EXPECT(strcmp(mla_last_error(),
                  "merge_attn_states_bf16_d128_thr_lse_fp8: scale_group_stride given, but this kernel takes no scale_group_stride") == 0);
    g = good(); g.output_scale = &one_scale; g.output_scale_numel = 1;
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse_fp8(NULL, &g) == MLA_INVALID_ARGUMENT);
    EXPECT(strcmp(mla_last_error(),
                  "merge_attn_states_bf16_d128_thr_lse_fp8: output_scales given, but this kernel takes no output_scales") == 0);
    EXPECT(launches == 4);

    /* Nothing to launch for T = 0: nothing is written, so the sizes of the buffers do not matter
     * (their presence does: step 2 comes before the grid). */
    g = good(); g.num_tokens = 0; g.prefill_tokens_with_context = 0; g.output_scales_numel = 0;
    EXPECT(launch(g) == MLA_OK);
    g.output_scales = NULL; refused(g, "output_scales is a null pointer");
    EXPECT(launches == 4);

    EXPECT(mla_unload() == MLA_OK && libraries_live == 0);
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures);
    return failures != 0;
}

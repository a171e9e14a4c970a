/* The C launcher's programmatic dependent launch, against the stub driver: a pdl kernel goes
 * through cuLaunchKernelEx with programmatic stream serialization on devices of compute
 * capability 9.0 and newer, through a plain cuLaunchKernel below; a kernel without pdl always
 * launches plainly; the check and statuses are unchanged. Built and run by tests/pdl.rs against
 * merge_attn_states bf16 d128 with pdl = [false, true] for sm_80 and sm_90. */
#include "mla_kernels.h"

#include <stdio.h>
#include <string.h>

#include "driver_stub.h"

#define T 64
#define H 4
#define D 128
#include "merge_call.h"

static int failures;
#define EXPECT(cond) do { if (!(cond)) { printf("FAILED line %d: %s\n", __LINE__, #cond); failures++; } } while (0)

int main(void) {
    const mla_merge_attn_states_args a = good();
    /* Device 0, cc 9.0: the pdl kernel's sm_90 CUBIN, launched programmatically. */
    stub_device = 0;
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse_pdl(NULL, &a) == MLA_OK);
    EXPECT(launches == 1 && launches_ex == 1 && last_launch_ex == 1 && last_pss == 1);
    EXPECT(last_loaded_arch == 90 && last_grid[1] == H && last_block > 0 && last_param_count == 15);
    EXPECT(last_params[0] == (long long)(uintptr_t)out && last_params[14] == T / 2);
    /* The same launch without pdl: plain. */
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse(NULL, &a) == MLA_OK);
    EXPECT(launches == 2 && launches_ex == 1 && last_launch_ex == 0 && last_pss == -1);
    /* Device 2, cc 8.6: the sm_80 CUBIN, which has no wait: plain. */
    stub_device = 2;
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse_pdl(NULL, &a) == MLA_OK);
    EXPECT(launches == 3 && launches_ex == 1 && last_launch_ex == 0 && last_loaded_arch == 80);
    /* Device 4, cc 10.0: the compute_90 PTX, compiled by the driver: programmatic. */
    stub_device = 4;
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse_pdl(NULL, &a) == MLA_OK);
    EXPECT(launches == 4 && launches_ex == 2 && last_launch_ex == 1 && last_pss == 1 && last_loaded_arch == 90);
    /* A refusal is the contract's, before any launch. */
    mla_merge_attn_states_args bad = good();
    bad.output_numel = N - 1;
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse_pdl(NULL, &bad) == MLA_INVALID_ARGUMENT && launches == 4);
    EXPECT(strstr(mla_last_error(), "merge_attn_states_bf16_d128_thr_lse_pdl: output: ") == mla_last_error());
    /* A driver failure names cuLaunchKernelEx. */
    stub_device = 0;
    stub_launch_result = CUDA_ERROR_LAUNCH_FAILED;
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse_pdl(NULL, &a) == MLA_CUDA_ERROR);
    EXPECT(strcmp(mla_last_error(), "merge_attn_states_bf16_d128_thr_lse_pdl: cuLaunchKernelEx: CUDA_ERROR_LAUNCH_FAILED" STICKY) == 0);
    EXPECT(mla_last_cuda_result() == CUDA_ERROR_LAUNCH_FAILED);
    /* No tokens: nothing launched, no driver call. */
    mla_merge_attn_states_args empty = good();
    empty.num_tokens = 0;
    empty.prefill_tokens_with_context = 0;
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse_pdl(NULL, &empty) == MLA_OK && launches == 4);
    printf("%d passed, %d failed\n", failures == 0, failures);
    return failures != 0;
}

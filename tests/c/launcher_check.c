/* Exercises the generated C launcher without a GPU: the driver functions it calls are stubs
 * (driver_stub.h), so the argument checks, the image each device gets, the loading rules and the
 * launch parameters can be asserted. Built and run by tests/c_launcher.rs against merge_attn_states
 * bf16/f32 x head size 128/100 (threshold, output lse) for sm_80 and sm_90. */
#include "mla_kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "driver_stub.h"

#define T 100
#define H 8
#define D 128
#define KERNEL "merge_attn_states_bf16_d128_thr_lse"
#include "merge_call.h"

static int failures;
#define EXPECT(cond) do { if (!(cond)) { printf("FAILED line %d: %s\n", __LINE__, #cond); failures++; } } while (0)
/* The call returns `status` with exactly the detail `text`. */
#define FAILS(call, status, text) do { mla_status s_ = (call); \
    if (s_ != (status) || strcmp(mla_last_error(), (text)) != 0) { \
        printf("FAILED line %d: expected %s '%s', got %s '%s'\n", __LINE__, mla_status_string(status), (text), \
               mla_status_string(s_), mla_last_error()); \
        failures++; } } while (0)
#define REFUSED(args, text) FAILS(merge(args), MLA_INVALID_ARGUMENT, KERNEL ": " text)

static mla_status merge(mla_merge_attn_states_args a) { return mla_merge_attn_states_bf16_d128_thr_lse(NULL, &a); }

/* Many threads launch one kernel whose image nobody has loaded yet. */
static atomic_int thread_failures;
static void* hammer(void* arg) {
    stub_device = 1; /* this thread's context is on device 1 (cc 9.0, as device 0) */
    mla_merge_attn_states_args a = good();
    for (int i = 0; i < 200; ++i)
        if (merge(a) != MLA_OK) atomic_fetch_add(&thread_failures, 1);
    a.num_heads = -(long)(intptr_t)arg; /* each thread's own refusal */
    char want[128];
    snprintf(want, sizeof want, KERNEL ": num_heads = %ld is below its minimum 0", -(long)(intptr_t)arg);
    if (merge(a) != MLA_INVALID_ARGUMENT || strcmp(mla_last_error(), want) != 0) atomic_fetch_add(&thread_failures, 1);
    return NULL;
}

int main(void) {
    mla_merge_attn_states_args a = good();

    /* Statuses and their strings; a value outside the enum still gets one. */
    EXPECT(MLA_OK == 0 && MLA_INVALID_ARGUMENT == 1 && MLA_NO_IMAGE_FOR_DEVICE == 2 && MLA_CUDA_ERROR == 3);
    EXPECT(strcmp(mla_status_string(MLA_OK), "success") == 0);
    EXPECT(strcmp(mla_status_string(MLA_INVALID_ARGUMENT), "invalid argument") == 0);
    EXPECT(strcmp(mla_status_string((mla_status)42), "unknown status") == 0);
    EXPECT(strcmp(mla_last_error(), "") == 0 && mla_last_cuda_result() == CUDA_SUCCESS);
    EXPECT(strcmp(MLA_VERSION_STRING, "") != 0 && MLA_VERSION_MAJOR >= 0 && MLA_DEFAULT == INT64_MIN);

    /* No mla_load(): the first launch loads the kernel's image, the CUBIN for the device's sm_90. */
    EXPECT(merge(a) == MLA_OK);
    EXPECT(launches == 1 && cubins_loaded == 1 && ptx_loaded == 0 && last_loaded_arch == 90);
    EXPECT(last_params[0] == (long long)(uintptr_t)out && last_params[2] == (long long)(uintptr_t)prefix);
    EXPECT(last_params[6] == T && last_params[7] == H && last_params[8] == H * D);
    EXPECT(last_params[14] == T / 2 && last_param_count == 15); /* output .. suffix_lse, T, H, 6 strides, n */
    EXPECT(last_grid[0] == (T + 31) / 32 && last_grid[1] == H && last_grid[2] == 1 && last_block == 512 && last_shared == 0);
    EXPECT(merge(a) == MLA_OK && launches == 2 && cubins_loaded == 1); /* loaded once */

    /* The threshold: MLA_DEFAULT is "every token has context"; a designated initializer that
     * leaves it out gives 0, "no token has context" (docs/C.md). */
    a.prefill_tokens_with_context = MLA_DEFAULT;
    EXPECT(merge(a) == MLA_OK && last_params[14] == T);
    mla_merge_attn_states_args z = {
        .output = out, .output_numel = N, .prefix_output = prefix, .prefix_output_numel = N,
        .prefix_lse = plse, .prefix_lse_numel = T * H, .suffix_output = suffix, .suffix_output_numel = N,
        .suffix_lse = slse, .suffix_lse_numel = T * H, .num_tokens = T, .num_heads = H,
        .output_token_stride = H * D, .output_head_stride = D, .prefix_token_stride = H * D,
        .prefix_head_stride = D, .suffix_token_stride = H * D, .suffix_head_stride = D,
    };
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse(NULL, &z) == MLA_OK);
    EXPECT(last_params[14] == 0 && last_params[1] == 0); /* threshold 0, no output lse */
    z.head_size = 128; /* a constant may be stated, and must be right */
    EXPECT(mla_merge_attn_states_bf16_d128_thr_lse(NULL, &z) == MLA_OK);
    z.head_size = 64;
    FAILS(mla_merge_attn_states_bf16_d128_thr_lse(NULL, &z), MLA_INVALID_ARGUMENT,
          KERNEL ": head_size = 64, but this kernel is built for head_size = 128");
    EXPECT(launches == 5);

    /* Nothing to launch for T = 0: OK, no driver call, so no context is needed either. */
    a = good(); a.num_tokens = 0; a.prefill_tokens_with_context = 0;
    stub_no_context = 1;
    EXPECT(merge(a) == MLA_OK && launches == 5);
    stub_no_context = 0;

    /* Refusals: the contract's exact texts, nothing launched. */
    FAILS(mla_merge_attn_states_bf16_d128_thr_lse(NULL, NULL), MLA_INVALID_ARGUMENT, KERNEL ": args is a null pointer");
    a = good(); a.prefix_output = NULL; REFUSED(a, "prefix_output is a null pointer");
    a = good(); a.suffix_output_numel -= 1;
    REFUSED(a, "suffix_output: [T=100, H=8, D=128] with strides (1024, 128, 1) needs 102400 elements, it has 102399");
    a = good(); a.prefix_lse_numel = T * H - 1;
    REFUSED(a, "prefix_lse: [H=8, T=100] with strides (100, 1) needs 800 elements, it has 799");
    a = good(); a.output_head_stride = 120;
    REFUSED(a, "output: [T=100, H=8, D=128] with strides (1024, 120, 1) maps two elements to one address");
    a = good(); a.prefix_head_stride = 132; a.prefix_token_stride = H * 132;
    REFUSED(a, "prefix_output: prefix_head_stride = 132 is not a multiple of 8 elements (the kernel's 16-byte access)");
    a = good(); a.suffix_output = (const char*)suffix + 2;
    {
        char want[160];
        snprintf(want, sizeof want, KERNEL ": suffix_output: pointer 0x%llx is not aligned to 16 bytes",
                 (unsigned long long)(uintptr_t)a.suffix_output);
        FAILS(merge(a), MLA_INVALID_ARGUMENT, want);
    }
    a = good(); a.prefill_tokens_with_context = T + 1;
    REFUSED(a, "prefill_tokens_with_context = 101 exceeds its maximum num_tokens = 100");
    a = good(); a.output = prefix;
    REFUSED(a, "output overlaps prefix_output: the kernel writes output, which may share memory with no other argument");
    a = good(); a.output_token_stride = D;
    REFUSED(a, "output: [T=100, H=8, D=128] with strides (128, 128, 1) maps two elements to one address");
    a = good(); a.num_tokens = (int64_t)1 << 62; a.prefill_tokens_with_context = 0;
    REFUSED(a, "num_tokens = 4611686018427387904 needs 144115188075855872 blocks in grid x, over CUDA's limit 2147483647");
    a = good(); a.output_token_stride = (INT64_MAX / 64) & ~(int64_t)7; a.output_numel = INT64_MAX;
    {
        char want[200];
        snprintf(want, sizeof want, KERNEL ": output: [T=100, H=8, D=128] with strides (%lld, 128, 1) overflows 64 bits",
                 (long long)a.output_token_stride);
        FAILS(merge(a), MLA_INVALID_ARGUMENT, want);
    }
    a = good(); a.num_heads = -1; REFUSED(a, "num_heads = -1 is below its minimum 0");
    /* The macro leaves every integer "not given": a forgotten stride or size is refused, not
     * taken as 0 (a broadcast row, an empty launch). */
    {
        const mla_merge_attn_states_args init = MLA_MERGE_ATTN_STATES_ARGS_INIT;
        a = good(); a.prefix_token_stride = init.prefix_token_stride;
        REFUSED(a, "prefix_token_stride is required");
        a = good(); a.num_heads = init.num_heads;
        REFUSED(a, "num_heads is required");
    }
    EXPECT(launches == 5);

    /* Driver errors: the call and the CUresult's name; the CUresult itself on this thread. */
    a = good();
    stub_launch_result = CUDA_ERROR_LAUNCH_FAILED;
    FAILS(merge(a), MLA_CUDA_ERROR, KERNEL ": cuLaunchKernel: CUDA_ERROR_LAUNCH_FAILED" STICKY);
    EXPECT(mla_last_cuda_result() == CUDA_ERROR_LAUNCH_FAILED);
    stub_launch_result = (CUresult)999;
    FAILS(merge(a), MLA_CUDA_ERROR, KERNEL ": cuLaunchKernel: CUresult 999");
    stub_no_context = 1;
    FAILS(merge(a), MLA_CUDA_ERROR, KERNEL ": cuCtxGetDevice: CUDA_ERROR_INVALID_CONTEXT" NO_CONTEXT);
    FAILS(mla_load(), MLA_CUDA_ERROR, "mla_load: cuCtxGetDevice: CUDA_ERROR_INVALID_CONTEXT" NO_CONTEXT);
    stub_no_context = 0;
    EXPECT(launches == 5);

    /* Devices: images are loaded per compute capability, not per device or context. */
    stub_device = 1; /* cc 9.0 too: the loaded image serves it */
    EXPECT(merge(a) == MLA_OK && cubins_loaded == 1 && ptx_loaded == 0);
    stub_device = 2; /* cc 8.6: the sm_80 CUBIN (same major, older minor) */
    EXPECT(merge(a) == MLA_OK && cubins_loaded == 2 && last_loaded_arch == 80);
    stub_device = 4; /* cc 10.0: no CUBIN of its major; the newest PTX, compute 9.0, JIT-compiled */
    EXPECT(merge(a) == MLA_OK && ptx_loaded == 1 && last_loaded_arch == 90);
    stub_device = 3; /* cc 7.5: nothing in this file runs on it */
    FAILS(merge(a), MLA_NO_IMAGE_FOR_DEVICE,
          KERNEL ": no image runs on compute capability 7.5 (this file holds sm_80, sm_90)");
    FAILS(mla_load(), MLA_NO_IMAGE_FOR_DEVICE,
          KERNEL ": no image runs on compute capability 7.5 (this file holds sm_80, sm_90)");
    EXPECT(libraries_live == 3);
    stub_device = 0;
    EXPECT(launches == 8);

    /* mla_load: every kernel's image for the device, once; a second call loads nothing. */
    EXPECT(mla_load() == MLA_OK && cubins_loaded == 5 && libraries_live == 6);
    EXPECT(mla_load() == MLA_OK && cubins_loaded == 5);
    /* mla_unload unloads everything; the next launch loads again. */
    EXPECT(mla_unload() == MLA_OK && libraries_live == 0);
    EXPECT(merge(a) == MLA_OK && cubins_loaded == 6 && libraries_live == 1);
    EXPECT(mla_unload() == MLA_OK && libraries_live == 0);
    /* A load that fails part-way leaves nothing it loaded behind, and loads nothing another
     * launch could hold. */
    atomic_store(&stub_fail_load, 2); /* the third library load fails */
    mla_status s = mla_load();
    EXPECT(s == MLA_CUDA_ERROR && mla_last_cuda_result() == CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(strstr(mla_last_error(), ": cuLibraryLoadData: CUDA_ERROR_OUT_OF_MEMORY") != NULL);
    EXPECT(libraries_live == 0);
    EXPECT(mla_load() == MLA_OK && libraries_live == 4);
    EXPECT(mla_unload() == MLA_OK && libraries_live == 0);

    /* Threads: 8 threads launch at once, all needing the same unloaded image: it is loaded
     * exactly once, every launch goes through, and each thread sees its own last error. */
    a = good(); a.num_heads = -7; merge(a);
    char mine[160];
    snprintf(mine, sizeof mine, "%s", mla_last_error());
    const int before = cubins_loaded, launched = launches;
    stub_load_spin = 2000000;
    pthread_t threads[8];
    for (intptr_t i = 0; i < 8; ++i) EXPECT(pthread_create(&threads[i], NULL, hammer, (void*)(i + 1)) == 0);
    for (int i = 0; i < 8; ++i) pthread_join(threads[i], NULL);
    stub_load_spin = 0;
    EXPECT(thread_failures == 0);
    EXPECT(cubins_loaded == before + 1 && libraries_live == 1);
    EXPECT(launches == launched + 8 * 200);
    EXPECT(strcmp(mla_last_error(), mine) == 0);

    EXPECT(mla_unload() == MLA_OK && libraries_live == 0);
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures);
    return failures != 0;
}

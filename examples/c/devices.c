/* One C launcher, every GPU, one thread each: no mla_load(), no handle per context. Each thread
 * makes its device's primary context current and merges its own states, several threads per
 * device at once; the kernel's image is loaded once per compute capability and serves every
 * context. Checked on the CPU: tokens t >= n copy the suffix bit for bit, the others merge within
 * the bf16 tolerance of examples/c/merge.c.
 *
 *   mla-gen generate examples/c/spec.toml --out examples/c/gen --emit c
 *   gcc -std=c11 -O2 -I$CUDA_INCLUDE -Iexamples/c/gen/c examples/c/devices.c \
 *       examples/c/gen/c/mla_kernels.c -lcuda -pthread -lm -o devices && ./devices
 *
 * Prints "N passed, M failed" and exits non-zero on any mismatch or error. */
#include "mla_kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { T = 301, H = 16, D = 128, THREADS_PER_DEVICE = 3, MAX_DEVICES = 16 };
#define N ((long long)T * H * D)

static float bf16_to_float(unsigned short b) { unsigned u = (unsigned)b << 16; float f; memcpy(&f, &u, 4); return f; }
static unsigned short float_to_bf16(float f) { unsigned u; memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u); return (unsigned short)(u >> 16); }
static double uniform(unsigned long long* s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return (double)(*s >> 11) / 9007199254740992.0; }

typedef struct job {
    int device, index;
    long long passed, failed;
    char error[600];
} job;

#define TRY(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { const char* s_ = NULL; cuGetErrorName(r_, &s_); \
    snprintf(j->error, sizeof j->error, "%s: %s", #call, s_ ? s_ : "?"); goto done; } } while (0)

static void* run(void* arg) {
    job* j = arg;
    CUdevice dev;
    CUcontext ctx = NULL;
    CUdeviceptr d_prefix = 0, d_suffix = 0, d_out = 0, d_plse = 0, d_slse = 0;
    unsigned short *prefix = malloc(N * 2), *suffix = malloc(N * 2), *out = malloc(N * 2);
    float *plse = malloc(T * H * 4), *slse = malloc(T * H * 4);
    unsigned long long seed = 0x9e3779b97f4a7c15ull + (unsigned long long)(j->device * 131 + j->index);
    for (long long i = 0; i < N; ++i) {
        prefix[i] = float_to_bf16((float)(uniform(&seed) * 8 - 4));
        suffix[i] = float_to_bf16((float)(uniform(&seed) * 8 - 4));
    }
    for (int i = 0; i < T * H; ++i) {
        plse[i] = (float)(uniform(&seed) * 30 - 15);
        slse[i] = (float)(uniform(&seed) * 30 - 15);
    }
    const long long n_ctx = (T * (j->index + 1)) / (THREADS_PER_DEVICE + 1);
    TRY(cuDeviceGet(&dev, j->device));
    TRY(cuDevicePrimaryCtxRetain(&ctx, dev));
    TRY(cuCtxSetCurrent(ctx));
    TRY(cuMemAlloc(&d_prefix, N * 2)); TRY(cuMemAlloc(&d_suffix, N * 2)); TRY(cuMemAlloc(&d_out, N * 2));
    TRY(cuMemAlloc(&d_plse, T * H * 4)); TRY(cuMemAlloc(&d_slse, T * H * 4));
    TRY(cuMemcpyHtoD(d_prefix, prefix, N * 2)); TRY(cuMemcpyHtoD(d_suffix, suffix, N * 2));
    TRY(cuMemcpyHtoD(d_plse, plse, T * H * 4)); TRY(cuMemcpyHtoD(d_slse, slse, T * H * 4));
    TRY(cuMemsetD16(d_out, 0x7fa5, N));

    mla_merge_attn_states_args a = MLA_MERGE_ATTN_STATES_ARGS_INIT;
    a.output = (void*)d_out; a.output_numel = N;
    a.prefix_output = (const void*)d_prefix; a.prefix_output_numel = N;
    a.prefix_lse = (const float*)d_plse; a.prefix_lse_numel = T * H;
    a.suffix_output = (const void*)d_suffix; a.suffix_output_numel = N;
    a.suffix_lse = (const float*)d_slse; a.suffix_lse_numel = T * H;
    a.num_tokens = T; a.num_heads = H;
    a.output_token_stride = a.prefix_token_stride = a.suffix_token_stride = H * D;
    a.output_head_stride = a.prefix_head_stride = a.suffix_head_stride = D;
    a.prefill_tokens_with_context = n_ctx;
    for (int rep = 0; rep < 20; ++rep) {
        const mla_status s = mla_merge_attn_states_bf16_d128_thr_lse(NULL, &a);
        if (s != MLA_OK) {
            snprintf(j->error, sizeof j->error, "launch: %s: %s", mla_status_string(s), mla_last_error());
            goto done;
        }
    }
    TRY(cuCtxSynchronize());
    TRY(cuMemcpyDtoH(out, d_out, N * 2));
    for (int t = 0; t < T; ++t) for (int h = 0; h < H; ++h) {
        const int li = h * T + t; /* head-major lse */
        const double p = plse[li], s = slse[li], m = p > s ? p : s;
        const double wp = exp(p - m) / (exp(p - m) + exp(s - m)), ws = 1 - wp;
        for (int e = 0; e < D; ++e) {
            const long long i = ((long long)t * H + h) * D + e;
            if (t >= n_ctx) { if (out[i] == suffix[i]) j->passed++; else j->failed++; continue; }
            const double pv = bf16_to_float(prefix[i]), sv = bf16_to_float(suffix[i]);
            const double want = pv * wp + sv * ws, got = bf16_to_float(out[i]);
            if (out[i] != 0x7fa5 && fabs(got - want) <= 8e-3 * (fabs(pv * wp) + fabs(sv * ws)) + fabs(want) / 128.0) j->passed++;
            else j->failed++;
        }
    }
done:
    if (d_prefix) cuMemFree(d_prefix);
    if (d_suffix) cuMemFree(d_suffix);
    if (d_out) cuMemFree(d_out);
    if (d_plse) cuMemFree(d_plse);
    if (d_slse) cuMemFree(d_slse);
    if (ctx) cuDevicePrimaryCtxRelease(dev);
    free(prefix); free(suffix); free(out); free(plse); free(slse);
    return NULL;
}

int main(void) {
    int devices = 0;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&devices) != CUDA_SUCCESS || devices < 1) {
        fprintf(stderr, "no CUDA device\n");
        return 1;
    }
    if (devices > MAX_DEVICES) devices = MAX_DEVICES;
    static job jobs[MAX_DEVICES * THREADS_PER_DEVICE];
    pthread_t threads[MAX_DEVICES * THREADS_PER_DEVICE];
    const int n = devices * THREADS_PER_DEVICE;
    for (int i = 0; i < n; ++i) {
        jobs[i].device = i % devices;
        jobs[i].index = i / devices;
        if (pthread_create(&threads[i], NULL, run, &jobs[i]) != 0) return 1;
    }
    long long passed = 0, failed = 0;
    for (int i = 0; i < n; ++i) {
        pthread_join(threads[i], NULL);
        if (jobs[i].error[0]) { fprintf(stderr, "device %d thread %d: %s\n", jobs[i].device, jobs[i].index, jobs[i].error); failed++; }
        passed += jobs[i].passed;
        failed += jobs[i].failed;
    }
    printf("%d device(s) x %d threads; %lld passed, %lld failed\n", devices, THREADS_PER_DEVICE, passed, failed);
    return failed != 0 || mla_unload() != MLA_OK;
}

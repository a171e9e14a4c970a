/* A C engine's use of mla-gen: merge two attention states on the GPU through the generated
 * launcher and check every element against a float64 reference on the CPU.
 *
 *   mla-gen generate examples/c/spec.toml --out examples/c/gen --emit c
 *   gcc -std=c11 -O2 -I$CUDA_INCLUDE -Iexamples/c/gen/c examples/c/merge.c \
 *       examples/c/gen/c/mla_kernels.c -lcuda -pthread -lm -o merge && ./merge
 *
 * Prints "N passed, M failed" and exits non-zero on any mismatch. */
#include "mla_kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    const char* s_ = NULL; cuGetErrorString(r_, &s_); \
    fprintf(stderr, "%s failed: %s\n", #call, s_ ? s_ : ""); \
    exit(1); } } while (0)
/* The launcher's calls: a status and, when it is not MLA_OK, the detail. */
#define MLA_CHECK(call) do { mla_status s_ = (call); if (s_ != MLA_OK) { \
    fprintf(stderr, "%s failed: %s: %s\n", #call, mla_status_string(s_), mla_last_error()); \
    exit(1); } } while (0)

static float bf16_to_float(unsigned short b) { unsigned u = (unsigned)b << 16; float f; memcpy(&f, &u, 4); return f; }
static unsigned short float_to_bf16(float f) { /* round to nearest even; inputs are finite */
    unsigned u; memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
static double uniform(unsigned long long* s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return (double)(*s >> 11) / 9007199254740992.0; }

int main(void) {
    enum { T = 613, H = 16, D = 128 };
    const long long n_ctx = T / 2, N = (long long)T * H * D;
    unsigned short *prefix = malloc(N * 2), *suffix = malloc(N * 2), *out = malloc(N * 2);
    float *plse = malloc(T * H * 4), *slse = malloc(T * H * 4), *olse = malloc(T * H * 4);
    unsigned long long seed = 0x9e3779b97f4a7c15ull;
    for (long long i = 0; i < N; ++i) {
        prefix[i] = float_to_bf16((float)(uniform(&seed) * 8 - 4));
        suffix[i] = float_to_bf16((float)(uniform(&seed) * 8 - 4));
    }
    for (int i = 0; i < T * H; ++i) {
        double u = uniform(&seed);
        plse[i] = u < 0.1 ? INFINITY : u < 0.2 ? -INFINITY : (float)(uniform(&seed) * 30 - 15);
        slse[i] = (float)(uniform(&seed) * 30 - 15);
    }

    CUdevice dev; CUcontext ctx; CUdeviceptr d_prefix, d_suffix, d_out, d_plse, d_slse, d_olse;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    MLA_CHECK(mla_load()); /* optional: each kernel's first launch would load it */
    CHECK(cuMemAlloc(&d_prefix, N * 2)); CHECK(cuMemAlloc(&d_suffix, N * 2)); CHECK(cuMemAlloc(&d_out, N * 2));
    CHECK(cuMemAlloc(&d_plse, T * H * 4)); CHECK(cuMemAlloc(&d_slse, T * H * 4)); CHECK(cuMemAlloc(&d_olse, T * H * 4));
    CHECK(cuMemcpyHtoD(d_prefix, prefix, N * 2)); CHECK(cuMemcpyHtoD(d_suffix, suffix, N * 2));
    CHECK(cuMemcpyHtoD(d_plse, plse, T * H * 4)); CHECK(cuMemcpyHtoD(d_slse, slse, T * H * 4));
    CHECK(cuMemsetD16(d_out, 0x7fa5, N)); /* poison: NaN bits the kernel never writes */

    mla_merge_attn_states_args a = MLA_MERGE_ATTN_STATES_ARGS_INIT;
    a.output = (void*)d_out; a.output_numel = N;
    a.output_lse = (float*)d_olse; a.output_lse_numel = T * H;
    a.prefix_output = (const void*)d_prefix; a.prefix_output_numel = N;
    a.prefix_lse = (const float*)d_plse; a.prefix_lse_numel = T * H;
    a.suffix_output = (const void*)d_suffix; a.suffix_output_numel = N;
    a.suffix_lse = (const float*)d_slse; a.suffix_lse_numel = T * H;
    a.num_tokens = T; a.num_heads = H;
    a.output_token_stride = H * D; a.output_head_stride = D;
    a.prefix_token_stride = H * D; a.prefix_head_stride = D;
    a.suffix_token_stride = H * D; a.suffix_head_stride = D;
    a.prefill_tokens_with_context = n_ctx;
    MLA_CHECK(mla_merge_attn_states_bf16_d128_thr_lse(NULL, &a));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH(out, d_out, N * 2));
    CHECK(cuMemcpyDtoH(olse, d_olse, T * H * 4));

    long long passed = 0, failed = 0;
    for (int t = 0; t < T; ++t) for (int h = 0; h < H; ++h) {
        const int li = h * T + t; /* head-major lse */
        double p = plse[li] == INFINITY ? -INFINITY : plse[li], s = slse[li] == INFINITY ? -INFINITY : slse[li];
        double m = p > s ? p : s, wp = 0, ws = 1, lse = slse[li];
        if (t < n_ctx) {
            if (m == -INFINITY) { wp = 1; ws = 0; lse = -INFINITY; }
            else { double x = exp(p - m), y = exp(s - m); wp = x / (x + y); ws = y / (x + y); lse = log(x + y) + m; }
        }
        for (int e = 0; e < D; ++e) {
            const long long i = ((long long)t * H + h) * D + e;
            const double pv = bf16_to_float(prefix[i]), sv = bf16_to_float(suffix[i]);
            const double want = pv * wp + sv * ws, got = bf16_to_float(out[i]);
            const double slack = 8e-3 * (fabs(pv * wp) + fabs(sv * ws)) + fabs(want) / 128.0;
            if (out[i] != 0x7fa5 && fabs(got - want) <= slack) passed++; else failed++;
        }
        if (!(olse[li] == lse || fabs(olse[li] - lse) <= 1e-5)) failed++; else passed++;
    }
    printf("%lld passed, %lld failed\n", passed, failed);
    MLA_CHECK(mla_unload());
    cuMemFree(d_prefix); cuMemFree(d_suffix); cuMemFree(d_out); cuMemFree(d_plse); cuMemFree(d_slse); cuMemFree(d_olse);
    cuDevicePrimaryCtxRelease(dev);
    free(prefix); free(suffix); free(out); free(plse); free(slse); free(olse);
    return failed != 0;
}

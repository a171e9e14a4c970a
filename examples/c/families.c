/* The other kernel families through the generated C launcher, each checked on the CPU against a
 * float64 reference: a merge into FP8 e4m3 with per-token-group UE8M0 scales, a K-way merge of 4
 * states, the lse mask for requests without context, and an in-place merge with a token mask.
 *
 *   mla-gen generate examples/c/families.toml --out examples/c/gen-families --emit c
 *   gcc -std=c11 -O2 -I$CUDA_INCLUDE -Iexamples/c/gen-families/c examples/c/families.c \
 *       examples/c/gen-families/c/mla_kernels.c -lcuda -pthread -lm -o families && ./families
 *
 * No mla_load(): each kernel's image loads at its first launch.
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

enum { T = 257, H = 8, D = 128, K = 4, G = 64, GROUPS = H * D / G, B = 3 };
#define N ((long long)T * H * D)
#define POISON 0x7fa5 /* bf16 NaN bits no kernel writes */

static long long passed, failed;
static void tally(int ok) { if (ok) passed++; else failed++; }

static float bf16_to_float(unsigned short b) { unsigned u = (unsigned)b << 16; float f; memcpy(&f, &u, 4); return f; }
static unsigned short float_to_bf16(float f) { /* round to nearest even; inputs are finite */
    unsigned u; memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
static unsigned float_bits(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static double uniform(unsigned long long* s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return (double)(*s >> 11) / 9007199254740992.0; }
static double no_keys_as_minus_inf(float lse) { return lse == INFINITY ? -INFINITY : lse; }

/* A merged bf16 element: within the float32 merge's rounding of the terms' magnitude plus one
 * bf16 step of the value. */
static int bf16_matches(unsigned short got_bits, double want, double magnitude) {
    const double got = bf16_to_float(got_bits);
    return got_bits != POISON && fabs(got - want) <= 8e-3 * magnitude + fabs(want) / 128.0;
}

/* float32 -> e4m3 the way the kernels convert (saturating, nearest even, NaN 0x7f). */
static unsigned char e4m3(float x) {
    const unsigned bits = float_bits(x), sign = (bits >> 31) << 7;
    const float a = fabsf(x);
    if (a != a) return 0x7f;
    if (a >= 448.0f) return (unsigned char)(sign | 0x7e);
    if (a < 0.015625f) return (unsigned char)(sign | (unsigned)rintf(a * 512.0f));
    unsigned code = ((((bits >> 23) & 0xffu) - 127u + 7u) << 3) | ((bits & 0x7fffffu) >> 20);
    const unsigned rest = bits & 0xfffffu;
    if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) code += 1;
    return (unsigned char)(sign | (code < 0x7eu ? code : 0x7eu));
}
/* e4m3 codes on a line where neighbouring values are neighbouring integers. */
static int e4m3_order(unsigned char c) { return c >= 128 ? -(c - 128) : c; }
/* A group's UE8M0 scale from its absmax: max(absmax, 1e-10) / 448 rounded up to a power of two. */
static float ue8m0_scale(float absmax) {
    const float s = fmaxf(absmax, 1e-10f) / 448.0f;
    unsigned bits = float_bits(s);
    if (bits & 0x7fffffu) bits = (bits & 0xff800000u) + 0x800000u;
    float out; memcpy(&out, &bits, 4);
    return out;
}

/* The pairwise rule for a row: weights of prefix and suffix and the merged lse; copies get weight
 * exactly 1 and report copy = 1. */
typedef struct { double wp, ws, lse; int copy; } row_merge;
static row_merge merge_rule(float plse, float slse, int has_context) {
    row_merge r = { 0, 1, slse, 1 };
    if (!has_context) return r;
    const double p = no_keys_as_minus_inf(plse), s = no_keys_as_minus_inf(slse), m = p > s ? p : s;
    if (m == -INFINITY) { r.wp = 1; r.ws = 0; r.lse = -INFINITY; return r; }
    const double x = exp(p - m), y = exp(s - m);
    r.wp = x / (x + y); r.ws = y / (x + y); r.lse = log(x + y) + m; r.copy = 0;
    return r;
}

static CUdeviceptr upload(const void* host, size_t bytes) {
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, bytes));
    CHECK(cuMemcpyHtoD(d, host, bytes));
    return d;
}

int main(void) {
    unsigned long long seed = 0x2545f4914f6cdd1dull;
    unsigned short *prefix = malloc(N * 2), *suffix = malloc(N * 2), *states = malloc(N * K * 2), *out = malloc(N * 2);
    unsigned char *codes = malloc(N), mask[T];
    float plse[T * H], slse[T * H], states_lse[T * K * H], olse[T * H], scales[T * GROUPS], lse_after[T * H];
    for (long long i = 0; i < N; ++i) {
        prefix[i] = float_to_bf16((float)(uniform(&seed) * 80 - 40));
        suffix[i] = float_to_bf16((float)(uniform(&seed) * 80 - 40));
    }
    for (long long i = 0; i < N * K; ++i) states[i] = float_to_bf16((float)(uniform(&seed) * 8 - 4));
    for (int i = 0; i < T * H; ++i) {
        const double u = uniform(&seed);
        plse[i] = u < 0.1 ? INFINITY : u < 0.2 ? -INFINITY : (float)(uniform(&seed) * 30 - 15);
        slse[i] = u > 0.95 ? -INFINITY : (float)(uniform(&seed) * 30 - 15);
    }
    for (int i = 0; i < T * K * H; ++i) {
        const double u = uniform(&seed);
        states_lse[i] = u < 0.1 ? INFINITY : u < 0.2 ? -INFINITY : (float)(uniform(&seed) * 30 - 15);
    }
    for (int t = 0; t < T; t += 50) for (int i = 0; i < K * H; ++i) states_lse[t * K * H + i] = -INFINITY;

    CUdevice dev; CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    const CUdeviceptr d_prefix = upload(prefix, N * 2), d_suffix = upload(suffix, N * 2), d_states = upload(states, N * K * 2);
    const CUdeviceptr d_plse = upload(plse, sizeof plse), d_slse = upload(slse, sizeof slse), d_states_lse = upload(states_lse, sizeof states_lse);
    CUdeviceptr d_out, d_olse, d_codes, d_scales;
    CHECK(cuMemAlloc(&d_out, N * 2)); CHECK(cuMemAlloc(&d_olse, sizeof olse));
    CHECK(cuMemAlloc(&d_codes, N)); CHECK(cuMemAlloc(&d_scales, sizeof scales));

    /* 1. Per-token-group FP8: tokens past n_ctx copy the suffix; scales row-major [T, H*D/G]. */
    const long long n_ctx = T / 2;
    CHECK(cuMemsetD8(d_codes, 0xff, N)); /* poison: 0xff (a NaN) is never written */
    CHECK(cuMemsetD32(d_scales, 0x7fc00000u, T * GROUPS));
    mla_merge_attn_states_args g = MLA_MERGE_ATTN_STATES_ARGS_INIT;
    g.output = (void*)d_codes; g.output_numel = N;
    g.prefix_output = (const void*)d_prefix; g.prefix_output_numel = N;
    g.prefix_lse = (const float*)d_plse; g.prefix_lse_numel = T * H;
    g.suffix_output = (const void*)d_suffix; g.suffix_output_numel = N;
    g.suffix_lse = (const float*)d_slse; g.suffix_lse_numel = T * H;
    g.num_tokens = T; g.num_heads = H;
    g.output_token_stride = H * D; g.output_head_stride = D;
    g.prefix_token_stride = H * D; g.prefix_head_stride = D;
    g.suffix_token_stride = H * D; g.suffix_head_stride = D;
    g.prefill_tokens_with_context = n_ctx;
    g.output_scales = (float*)d_scales; g.output_scales_numel = T * GROUPS;
    g.scale_token_stride = GROUPS; g.scale_group_stride = 1;
    MLA_CHECK(mla_merge_attn_states_bf16_d128_thr_lse_fp8g64_ue8m0(NULL, &g));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH(codes, d_codes, N));
    CHECK(cuMemcpyDtoH(scales, d_scales, sizeof scales));
    for (int t = 0; t < T; ++t) for (int h = 0; h < H; ++h) {
        const int li = h * T + t; /* head-major lse */
        const row_merge r = merge_rule(plse[li], slse[li], t < n_ctx);
        for (int grp = 0; grp < D / G; ++grp) {
            const float scale = scales[t * GROUPS + h * (D / G) + grp];
            const long long first = ((long long)t * H + h) * D + (long long)grp * G;
            double absmax = 0;
            for (long long i = first; i < first + G; ++i) {
                const double v = bf16_to_float(prefix[i]) * r.wp + bf16_to_float(suffix[i]) * r.ws;
                absmax = fmax(absmax, fabs(v));
            }
            /* Copies: the float32 values are exact, so are the scale and every code. Merges: the
             * scale of the absmax within its float32 rounding, each code within one e4m3 step. */
            if (r.copy) tally(float_bits(scale) == float_bits(ue8m0_scale((float)absmax)));
            else tally(scale >= ue8m0_scale((float)(absmax * (1 - 1e-5))) && scale <= ue8m0_scale((float)(absmax * (1 + 1e-5))));
            for (long long i = first; i < first + G; ++i) {
                const double v = bf16_to_float(prefix[i]) * r.wp + bf16_to_float(suffix[i]) * r.ws;
                const unsigned char want = r.copy ? e4m3((float)v / scale) : e4m3((float)(v / scale));
                const int steps = abs(e4m3_order(codes[i]) - e4m3_order(want));
                tally(codes[i] != 0xff && (r.copy ? steps == 0 : steps <= 1));
            }
        }
    }

    /* 2. K-way merge of 4 states per token, [T, 4, H, D]; every 50th token has no keys at all. */
    CHECK(cuMemsetD16(d_out, POISON, N));
    mla_merge_states_args s = MLA_MERGE_STATES_ARGS_INIT; /* num_states: the kernel's K */
    s.output = (void*)d_out; s.output_numel = N; s.output_lse = (float*)d_olse; s.output_lse_numel = T * H;
    s.states = (const void*)d_states; s.states_numel = N * K;
    s.states_lse = (const float*)d_states_lse; s.states_lse_numel = T * K * H;
    s.num_tokens = T; s.num_heads = H;
    s.output_token_stride = H * D; s.output_head_stride = D;
    s.states_token_stride = K * H * D; s.states_state_stride = H * D; s.states_head_stride = D;
    MLA_CHECK(mla_merge_states_bf16_d128_k4_lse(NULL, &s));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH(out, d_out, N * 2));
    CHECK(cuMemcpyDtoH(olse, d_olse, sizeof olse));
    for (int t = 0; t < T; ++t) for (int h = 0; h < H; ++h) {
        double x[K], m = -INFINITY, sum = 0;
        for (int k = 0; k < K; ++k) { x[k] = no_keys_as_minus_inf(states_lse[(t * K + k) * H + h]); m = x[k] > m ? x[k] : m; }
        for (int k = 0; k < K; ++k) sum += m == -INFINITY ? 0 : exp(x[k] - m);
        for (int e = 0; e < D; ++e) {
            const long long o = ((long long)t * H + h) * D + e;
            if (m == -INFINITY) { tally(out[o] == states[((long long)t * K * H + h) * D + e]); continue; } /* state 0's row */
            double want = 0, magnitude = 0;
            for (int k = 0; k < K; ++k) {
                const double term = bf16_to_float(states[(((long long)t * K + k) * H + h) * D + e]) * exp(x[k] - m) / sum;
                want += term; magnitude += fabs(term);
            }
            tally(bf16_matches(out[o], want, magnitude));
        }
        const double lse = m == -INFINITY ? -INFINITY : log(sum) + m;
        tally(olse[t * H + h] == lse || fabs(olse[t * H + h] - lse) <= 1e-5);
    }

    /* 3. Three requests; the second has no context: its tokens' prefix lse becomes -inf. */
    const int32_t qsl[B + 1] = { 0, 100, 180, T }, csl[B + 1] = { 0, 50, 50, 90 };
    const CUdeviceptr d_qsl = upload(qsl, sizeof qsl), d_csl = upload(csl, sizeof csl);
    CUdeviceptr d_state_lse = upload(plse, sizeof plse);
    mla_mask_empty_context_lse_args ml = MLA_MASK_EMPTY_CONTEXT_LSE_ARGS_INIT;
    ml.lse = (float*)d_state_lse; ml.lse_numel = T * H;
    ml.query_start_loc = (const int32_t*)d_qsl; ml.query_start_loc_numel = B + 1;
    ml.context_start_loc = (const int32_t*)d_csl; ml.context_start_loc_numel = B + 1;
    ml.num_requests = B; ml.num_tokens = T; ml.num_heads = H;
    MLA_CHECK(mla_mask_empty_context_lse(NULL, &ml));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH(lse_after, d_state_lse, sizeof lse_after));
    float masked[T * H];
    for (int t = 0; t < T; ++t) for (int h = 0; h < H; ++h) {
        const int li = h * T + t, empty = t >= qsl[1] && t < qsl[2]; /* request 1: csl[2] == csl[1] */
        masked[li] = empty ? -INFINITY : plse[li];
        tally(float_bits(lse_after[li]) == float_bits(masked[li]));
    }

    /* 4. state := merge(state, other) in place, for the tokens whose mask byte is nonzero. */
    for (int t = 0; t < T; ++t) mask[t] = (unsigned char)(t % 3 != 0);
    const CUdeviceptr d_mask = upload(mask, sizeof mask);
    const CUdeviceptr d_state = upload(prefix, N * 2);
    mla_merge_state_in_place_args ip = MLA_MERGE_STATE_IN_PLACE_ARGS_INIT;
    ip.state = (void*)d_state; ip.state_numel = N; ip.state_lse = (float*)d_state_lse; ip.state_lse_numel = T * H;
    ip.other = (const void*)d_suffix; ip.other_numel = N; ip.other_lse = (const float*)d_slse; ip.other_lse_numel = T * H;
    ip.mask = (const unsigned char*)d_mask; ip.mask_numel = T;
    ip.num_tokens = T; ip.num_heads = H;
    ip.state_token_stride = H * D; ip.state_head_stride = D; ip.other_token_stride = H * D; ip.other_head_stride = D;
    MLA_CHECK(mla_merge_state_in_place_bf16_d128_mask(NULL, &ip));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH(out, d_state, N * 2));
    CHECK(cuMemcpyDtoH(lse_after, d_state_lse, sizeof lse_after));
    for (int t = 0; t < T; ++t) for (int h = 0; h < H; ++h) {
        const int li = h * T + t;
        const row_merge r = merge_rule(masked[li], slse[li], 1);
        for (int e = 0; e < D; ++e) {
            const long long i = ((long long)t * H + h) * D + e;
            const double pv = bf16_to_float(prefix[i]), sv = bf16_to_float(suffix[i]);
            /* Masked tokens and rows without keys keep their bits. */
            if (!mask[t] || r.copy) tally(out[i] == prefix[i]);
            else tally(bf16_matches(out[i], pv * r.wp + sv * r.ws, fabs(pv * r.wp) + fabs(sv * r.ws)));
        }
        if (!mask[t]) tally(float_bits(lse_after[li]) == float_bits(masked[li]));
        else tally(lse_after[li] == r.lse || fabs(lse_after[li] - r.lse) <= 1e-5);
    }

    printf("%lld passed, %lld failed\n", passed, failed);
    MLA_CHECK(mla_unload());
    const CUdeviceptr all[] = { d_prefix, d_suffix, d_states, d_plse, d_slse, d_states_lse, d_out, d_olse, d_codes,
                                d_scales, d_qsl, d_csl, d_state_lse, d_mask, d_state };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) cuMemFree(all[i]);
    cuDevicePrimaryCtxRelease(dev);
    free(prefix); free(suffix); free(states); free(out); free(codes);
    return failed != 0;
}

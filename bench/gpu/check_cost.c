/* Host cost of one launch through the generated C launcher, measured as `mla-gen bench` measures
 * the Rust runtime's (src/host/bench/mod.rs, host_cost): back-to-back calls on a tiny shape
 * (T = 1, H = 1, threshold 1, output lse, dense strides) over buffers sized for a larger one,
 * the stream synchronized before each round of launches; microseconds per call, the median of
 * the rounds (and their minimum). Four loops:
 *
 *   checked launch     the public launcher, mla_<kernel>(stream, &args): the check, the choice of
 *                      specialization (the dense twin at this shape), the image lookup, and
 *                      cuLaunchKernel;
 *   checks alone       the argument struct gathered and checked (docs/MANIFEST.md steps 1-8), as
 *                      the Rust line's "argument checks alone" names and checks its arguments;
 *   launcher w/o launch the public launcher with its cuLaunchKernel made a no-op: everything the
 *                      launcher adds to the driver's call;
 *   cuLaunchKernel     the driver call alone, with the function, grid, block and parameter values
 *                      the launcher last passed it;
 *   prepared launch    mla_launch_prepared(&plan, stream, &args) on a plan mla_prepare made of the
 *                      same call (the checks its layout leaves open, then cuLaunchKernel), with
 *                      and without its cuLaunchKernel (the compiled torch op launches so).
 *
 * The generated header has no check-only entry, so this file includes mla_kernels.c (a unity
 * build) and calls its internal mla_gather_merge_attn_states and mla_check on the kernel's table
 * (mla_kernel_<kernel>): if the launcher template renames them, this is the place to follow.
 *
 * Build and run on a GPU machine: bench/gpu/check_cost.sh. Built with -DCHECK_COST_STUB it runs
 * against tests/c/driver_stub.h instead of a driver (no GPU: the times mean nothing; .ci/c.sh
 * does this so the file keeps compiling). Options: --rounds N (20), --calls N (500), --rows N
 * (the rows the buffers hold: 65536, 4096x16). -DCHECK_COST_KERNEL=name and
 * -DCHECK_COST_HEAD_SIZE=D pick another pairwise kernel of the launcher (default
 * merge_attn_states_bf16_d128_thr_lse, 128). */
#define _POSIX_C_SOURCE 200809L

#include <cuda.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The launcher's cuLaunchKernel goes through check_cost_launch (below): one more function call
 * than the launcher makes, a few nanoseconds. */
static CUresult check_cost_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned shmem, CUstream stream, void** params, void** extra);
#define cuLaunchKernel check_cost_launch
/* gcc 12 at -O1 and above finds `fn` (mla_run) and `extent` (mla_check) "maybe uninitialized" in
 * the launcher, wrongly: each is set on every path that reaches its use. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "mla_kernels.c"
#pragma GCC diagnostic pop
#undef cuLaunchKernel

#ifdef CHECK_COST_STUB
#include "driver_stub.h"
#endif

#ifndef CHECK_COST_KERNEL
#define CHECK_COST_KERNEL merge_attn_states_bf16_d128_thr_lse
#endif
#ifndef CHECK_COST_HEAD_SIZE
#define CHECK_COST_HEAD_SIZE 128
#endif
#define CC_CAT_(a, b) a##b
#define CC_CAT(a, b) CC_CAT_(a, b)
#define CC_STR_(x) #x
#define CC_STR(x) CC_STR_(x)
#define LAUNCHER CC_CAT(mla_, CHECK_COST_KERNEL)         /* the public launcher */
#define TABLE CC_CAT(mla_kernel_, CHECK_COST_KERNEL)     /* its internal table */
#define NAME CC_STR(CHECK_COST_KERNEL)
#define N_FIELDS ((int)(sizeof mla_fields_merge_attn_states / sizeof mla_fields_merge_attn_states[0]))

/* ---- the launch hook ---------------------------------------------------------------------- */

/* What the launcher's cuLaunchKernel does: call the driver (PASS), call it and keep the launch
 * (RECORD: the warm-up call), or nothing (SKIP). */
static enum { PASS, RECORD, SKIP } hook = RECORD;
static struct {
    CUfunction f;
    unsigned grid[3], block[3], shmem;
    CUstream stream;
    uint64_t values[MLA_MAX_PARAMS];
    size_t bytes;
    void* extra[5];  /* the values as the launcher passes them: one buffer through `extra` */
} last;

static CUresult check_cost_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned shmem, CUstream stream, void** params, void** extra) {
    if (hook == SKIP) return CUDA_SUCCESS;
    if (hook == RECORD) {
        int n = 0;
        last.f = f;
        last.grid[0] = gx; last.grid[1] = gy; last.grid[2] = gz;
        last.block[0] = bx; last.block[1] = by; last.block[2] = bz;
        last.shmem = shmem;
        last.stream = stream;
        /* Every parameter is 8 bytes, in one buffer through extra (BUFFER_POINTER, the buffer,
         * BUFFER_SIZE, &its size, END), or through kernelParams ending with NULL. */
        if (params) {
            for (; n < MLA_MAX_PARAMS && params[n]; ++n) memcpy(&last.values[n], params[n], sizeof last.values[0]);
            last.bytes = (size_t)n * sizeof last.values[0];
        } else {
            last.bytes = *(const size_t*)extra[3];
            memcpy(last.values, extra[1], last.bytes);
        }
        last.extra[0] = CU_LAUNCH_PARAM_BUFFER_POINTER;
        last.extra[1] = last.values;
        last.extra[2] = CU_LAUNCH_PARAM_BUFFER_SIZE;
        last.extra[3] = &last.bytes;
        last.extra[4] = CU_LAUNCH_PARAM_END;
    }
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

/* ---- the machine: a real driver, or the stub -------------------------------------------------- */

static void die(const char* what, CUresult r) {
    const char* name = NULL;
    cuGetErrorName(r, &name);
    fprintf(stderr, "check_cost: %s: %s\n", what, name ? name : "unknown CUresult");
    exit(1);
}

#ifdef CHECK_COST_STUB
static void setup(char* device, size_t n) { snprintf(device, n, "stub driver, no GPU: the times mean nothing"); }
/* Addresses nothing dereferences, 1 GiB apart. */
static uint64_t device_alloc(size_t bytes) {
    static uint64_t next = 1ull << 40;
    const uint64_t p = next;
    next += (bytes | ((1ull << 30) - 1)) + 1;
    return p;
}
static void synchronize(CUstream s) { (void)s; }
#else
static void setup(char* device, size_t n) {
    CUdevice dev;
    CUcontext ctx;
    CUresult r;
    int version = 0;
    char name[128] = "";
    if ((r = cuInit(0)) != CUDA_SUCCESS) die("cuInit", r);
    if ((r = cuDeviceGet(&dev, 0)) != CUDA_SUCCESS) die("cuDeviceGet", r);
    /* The primary context, as cudarc's CudaContext::new(0) (the Rust line's) takes it. */
    if ((r = cuDevicePrimaryCtxRetain(&ctx, dev)) != CUDA_SUCCESS) die("cuDevicePrimaryCtxRetain", r);
    if ((r = cuCtxSetCurrent(ctx)) != CUDA_SUCCESS) die("cuCtxSetCurrent", r);
    cuDeviceGetName(name, sizeof name, dev);
    cuDriverGetVersion(&version);
    snprintf(device, n, "%s, CUDA driver %d.%d", name, version / 1000, version % 1000 / 10);
}
static uint64_t device_alloc(size_t bytes) {
    CUdeviceptr p;
    CUresult r = cuMemAlloc(&p, bytes);
    if (r != CUDA_SUCCESS) die("cuMemAlloc", r);
    if ((r = cuMemsetD8(p, 0, bytes)) != CUDA_SUCCESS) die("cuMemsetD8", r);
    return (uint64_t)p;
}
static void synchronize(CUstream s) {
    const CUresult r = cuStreamSynchronize(s);
    if (r != CUDA_SUCCESS) die("cuStreamSynchronize", r);
}
#endif

/* ---- timing ------------------------------------------------------------------------------- */

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int by_value(const void* a, const void* b) {
    const double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

typedef struct {
    double median, min;
} cost;

/* The median and minimum of `rounds` per-call times (sorts them). */
static cost summarize(double* us, int rounds) {
    qsort(us, (size_t)rounds, sizeof us[0], by_value);
    return (cost){ us[rounds / 2], us[0] };
}

static int failed; /* calls that did not return MLA_OK / CUDA_SUCCESS */

static void expect_ok(mla_status s) {
    if (s != MLA_OK && failed++ == 0) fprintf(stderr, "check_cost: %s: %s\n", mla_status_string(s), mla_last_error());
}

/* The public launcher, `calls` times per round; the stream synchronized before each round. */
static cost time_launcher(const mla_merge_attn_states_args* a, CUstream stream, int rounds, int calls, double* us) {
    for (int r = 0; r < rounds; ++r) {
        synchronize(stream);
        const double start = now_us();
        for (int i = 0; i < calls; ++i) expect_ok(LAUNCHER(stream, a));
        us[r] = (now_us() - start) / calls;
    }
    synchronize(stream);
    return summarize(us, rounds);
}

/* mla_launch_prepared on a plan of the same call. */
static cost time_prepared(const mla_prepared* plan, const mla_merge_attn_states_args* a, CUstream stream, int rounds,
                          int calls, double* us) {
    for (int r = 0; r < rounds; ++r) {
        synchronize(stream);
        const double start = now_us();
        for (int i = 0; i < calls; ++i) expect_ok(mla_launch_prepared(plan, stream, a));
        us[r] = (now_us() - start) / calls;
    }
    synchronize(stream);
    return summarize(us, rounds);
}

/* Gather and check only; `a` is read through a volatile pointer so no call is left out. */
static cost time_checks(const mla_merge_attn_states_args* a, int rounds, int calls, double* us) {
    const mla_merge_attn_states_args* volatile args = a;
    volatile uint64_t sink = 0;
    for (int r = 0; r < rounds; ++r) {
        const double start = now_us();
        for (int i = 0; i < calls; ++i) {
            mla_value v[N_FIELDS];
            uint64_t values[MLA_MAX_PARAMS];
            unsigned grid[2];
            mla_gather_merge_attn_states(args, v);
            expect_ok(mla_check(&TABLE, v, values, grid));
            sink = sink + values[0] + grid[0];
        }
        us[r] = (now_us() - start) / calls;
    }
    (void)sink;
    return summarize(us, rounds);
}

/* cuLaunchKernel with what the launcher last passed it. */
static cost time_bare(int rounds, int calls, double* us) {
    for (int r = 0; r < rounds; ++r) {
        synchronize(last.stream);
        const double start = now_us();
        for (int i = 0; i < calls; ++i) {
            const CUresult res = cuLaunchKernel(last.f, last.grid[0], last.grid[1], last.grid[2], last.block[0],
                                                last.block[1], last.block[2], last.shmem, last.stream, NULL, last.extra);
            if (res != CUDA_SUCCESS) die("cuLaunchKernel", res);
        }
        us[r] = (now_us() - start) / calls;
    }
    synchronize(last.stream);
    return summarize(us, rounds);
}

/* Which kernel the launcher launched: its own, or one of its specializations. */
static const char* launched_name(void) {
    CUfunction f;
    if (mla_function(&TABLE, &f) == MLA_OK && f == last.f) return TABLE.name;
    for (int j = 0; j < TABLE.n_specials; ++j)
        if (mla_function(TABLE.specials[j].kernel, &f) == MLA_OK && f == last.f) return TABLE.specials[j].kernel->name;
    return "another kernel";
}

static long option(int argc, char** argv, const char* name, long dflt) {
    for (int i = 1; i + 1 < argc; ++i)
        if (strcmp(argv[i], name) == 0) return strtol(argv[i + 1], NULL, 10);
    return dflt;
}

int main(int argc, char** argv) {
    const int rounds = (int)option(argc, argv, "--rounds", 20), calls = (int)option(argc, argv, "--calls", 500);
    const long rows = option(argc, argv, "--rows", 4096 * 16);
    const int64_t t = 1, h = 1, d = CHECK_COST_HEAD_SIZE, elem = TABLE.params[0].elem_bytes;
    if (rounds < 1 || calls < 1 || rows < 1) {
        fprintf(stderr, "usage: check_cost [--rounds N] [--calls N] [--rows N]   (N >= 1)\n");
        return 2;
    }
    double* us = malloc((size_t)rounds * sizeof *us);
    char device[256];
    setup(device, sizeof device);
    CUstream stream = NULL; /* the default stream, as the Rust line's */

    /* Buffers sized for `rows` rows; a call on T = 1, H = 1 with dense strides and threshold 1. */
    mla_merge_attn_states_args a = MLA_MERGE_ATTN_STATES_ARGS_INIT;
    const int64_t n = rows * d;
    a.output = (void*)(uintptr_t)device_alloc((size_t)(n * elem));
    a.prefix_output = (const void*)(uintptr_t)device_alloc((size_t)(n * elem));
    a.suffix_output = (const void*)(uintptr_t)device_alloc((size_t)(n * elem));
    a.output_lse = (float*)(uintptr_t)device_alloc((size_t)rows * 4);
    a.prefix_lse = (const float*)(uintptr_t)device_alloc((size_t)rows * 4);
    a.suffix_lse = (const float*)(uintptr_t)device_alloc((size_t)rows * 4);
    a.output_numel = a.prefix_output_numel = a.suffix_output_numel = n;
    a.output_lse_numel = a.prefix_lse_numel = a.suffix_lse_numel = rows;
    a.num_tokens = t;
    a.num_heads = h;
    a.output_token_stride = a.prefix_token_stride = a.suffix_token_stride = h * d;
    a.output_head_stride = a.prefix_head_stride = a.suffix_head_stride = d;
    a.prefill_tokens_with_context = 1;

    /* Warm up: the image loads at the first launch; keep what it passes cuLaunchKernel. */
    expect_ok(LAUNCHER(stream, &a));
    synchronize(stream);
    if (failed) return 1;
    hook = PASS;

    const cost launch = time_launcher(&a, stream, rounds, calls, us);
    const cost checks = time_checks(&a, rounds, calls, us);
    hook = SKIP;
    const cost no_launch = time_launcher(&a, stream, rounds, calls, us);
    /* The prepared launch is the launcher's: the same function, grid, block and values. */
    mla_prepared plan;
    expect_ok(mla_prepare(NAME, &a, &plan));
    const __typeof__(last) checked = last;
    hook = RECORD;
    expect_ok(mla_launch_prepared(&plan, stream, &a));
    if (checked.f != last.f || memcmp(checked.grid, last.grid, sizeof last.grid) != 0 ||
        memcmp(checked.block, last.block, sizeof last.block) != 0 ||
        memcmp(checked.values, last.values, sizeof last.values) != 0) {
        fprintf(stderr, "check_cost: the prepared launch is not the launcher's\n");
        ++failed;
    }
    hook = SKIP;
    const cost prepared_no_launch = time_prepared(&plan, &a, stream, rounds, calls, us);
    hook = PASS;
    const cost prepared = time_prepared(&plan, &a, stream, rounds, calls, us);
    const cost bare = time_bare(rounds, calls, us);
    free(us);

    printf("device: %s\n", device);
    printf("kernel: %s (launches %s), T=%lld H=%lld threshold 1 on buffers of %ld rows; median of %d rounds x %d "
           "calls (min in brackets)\n",
           NAME, launched_name(), (long long)t, (long long)h, rows, rounds, calls);
    printf("host cost per launch (C launcher, validation included): %.2f us, of which the argument checks alone: "
           "%.2f us; cuLaunchKernel alone (any launcher's floor here): %.2f us\n",
           launch.median, checks.median, bare.median);
    printf("| host: kernel called | checked launch | argument checks alone | launcher without cuLaunchKernel "
           "| cuLaunchKernel alone | checked - bare | prepared launch | prepared without cuLaunchKernel |\n");
    printf("| C launcher: %s | %.2f (%.2f) | %.3f (%.3f) | %.3f (%.3f) | %.2f (%.2f) | %.2f | %.2f (%.2f) | %.3f (%.3f) |\n",
           NAME, launch.median, launch.min, checks.median, checks.min, no_launch.median, no_launch.min, bare.median,
           bare.min, launch.median - bare.median, prepared.median, prepared.min, prepared_no_launch.median,
           prepared_no_launch.min);
    printf("%d passed, %d failed: C launcher host cost\n", failed ? 0 : 1, failed ? 1 : 0);
    return failed ? 1 : 0;
}

/* Prepared launches (mla_prepare, mla_launch_prepared) do what the kernel's own launcher does:
 * for each call below, the launch through a plan prepared for another call of the same layout
 * and the launch through the launcher give the same status and message, or launch the same
 * kernel with the same grid, block and parameters. Calls that differ from the prepared one only
 * in their pointers or their threshold within its bounds take the short path; any other call
 * (another size, stride or _numel, a threshold out of bounds or left out, a misaligned or
 * overlapping pointer) takes the full check. Which path ran shows through a marked plan, whose
 * kept token strides are off by one: only a short-path launch passes them (they decide nothing
 * else there). Built by
 * tests/c_launcher.rs with the launcher of bf16 D = 128 with its threshold, output lse, size rule
 * and dense specializations (the default schedule). Several threads launch through one plan at
 * once (.ci/c.sh runs this under ThreadSanitizer). */
#include "mla_kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "driver_stub.h"

#define D 128
#define KERNEL "merge_attn_states_bf16_d128_thr_lse"
#define LAUNCH mla_merge_attn_states_bf16_d128_thr_lse
#define H 16
#define MARK (H * D) /* the token strides; no other parameter below has this value */

static int failures;
#define EXPECT(cond) do { if (!(cond)) { printf("FAILED line %d: %s\n", __LINE__, #cond); failures++; } } while (0)

/* Addresses nothing dereferences (the stub launches nothing), 2^40 apart. */
static uint64_t at(int i) { return (uint64_t)i << 40; }

static mla_merge_attn_states_args args(long long T, long long threshold) {
    mla_merge_attn_states_args a = MLA_MERGE_ATTN_STATES_ARGS_INIT;
    const long long n = T * H * D;
    a.output = (void*)(uintptr_t)at(1); a.output_numel = n;
    a.output_lse = (float*)(uintptr_t)at(2); a.output_lse_numel = T * H;
    a.prefix_output = (const void*)(uintptr_t)at(3); a.prefix_output_numel = n;
    a.prefix_lse = (const float*)(uintptr_t)at(4); a.prefix_lse_numel = T * H;
    a.suffix_output = (const void*)(uintptr_t)at(5); a.suffix_output_numel = n;
    a.suffix_lse = (const float*)(uintptr_t)at(6); a.suffix_lse_numel = T * H;
    a.num_tokens = T; a.num_heads = H;
    a.output_token_stride = a.prefix_token_stride = a.suffix_token_stride = H * D;
    a.output_head_stride = a.prefix_head_stride = a.suffix_head_stride = D;
    a.prefill_tokens_with_context = threshold;
    return a;
}

typedef struct {
    mla_status status;
    char message[512];
    const char* kernel;
    unsigned grid[3], block;
    int n, launches;
    long long params[32];
} outcome;

static outcome record(mla_status s, int before) {
    outcome o;
    memset(&o, 0, sizeof o);
    o.status = s;
    if (s != MLA_OK) snprintf(o.message, sizeof o.message, "%s", mla_last_error());
    o.launches = launches - before;
    if (s == MLA_OK && o.launches) {
        o.kernel = last_kernel;
        memcpy(o.grid, last_grid, sizeof o.grid);
        o.block = last_block;
        o.n = last_param_count;
        memcpy(o.params, last_params, sizeof o.params);
    }
    return o;
}

/* 1 where `a` through the marked plan does what LAUNCH does; *fast: whether it took the short
 * path (the marked strides). *kernel: the kernel launched (or NULL). */
static int same(const mla_prepared* marked, mla_merge_attn_states_args a, int* fast, const char** kernel) {
    int before = launches;
    const outcome full = record(LAUNCH(NULL, &a), before);
    before = launches;
    outcome prep = record(mla_launch_prepared(marked, NULL, &a), before);
    *fast = 0;
    *kernel = full.kernel;
    for (int i = 0; i < prep.n; ++i)
        if (prep.params[i] == MARK + 1 && full.params[i] == MARK) {
            prep.params[i] = MARK;
            *fast = 1;
        }
    return full.status == prep.status && strcmp(full.message, prep.message) == 0 && full.launches == prep.launches &&
           (!full.launches || (strcmp(full.kernel, prep.kernel) == 0 && memcmp(full.grid, prep.grid, sizeof full.grid) == 0 &&
                               full.block == prep.block && full.n == prep.n &&
                               memcmp(full.params, prep.params, sizeof full.params) == 0));
}

/* A plan of `a` whose kept token strides are one more. */
static mla_prepared marked_plan(mla_merge_attn_states_args a) {
    mla_prepared plan;
    EXPECT(mla_prepare(KERNEL, &a, &plan) == MLA_OK);
    int marks = 0;
    for (int i = 0; i < 32; ++i)
        if (plan.values[i] == MARK) {
            plan.values[i] = MARK + 1;
            ++marks;
        }
    EXPECT(marks == 3);
    return plan;
}

/* Launches through a shared plan, each with its own buffers and threshold: all succeed. */
static void* hammer(void* plan) {
    intptr_t refused = 0;
    for (int i = 0; i < 200; ++i) {
        mla_merge_attn_states_args a = args(5, i % 6);
        a.output = (void*)(uintptr_t)at(10 + i % 7);
        refused += mla_launch_prepared((const mla_prepared*)plan, NULL, &a) != MLA_OK;
    }
    return (void*)refused;
}

int main(void) {
    const long long T = 5;
    int fast;
    const char *kernel, *general;
    const mla_prepared plan = marked_plan(args(T, 3));
    mla_merge_attn_states_args a = args(T, 3);

    /* The prepared call, and calls of its layout with other pointers: the short path. */
    EXPECT(same(&plan, a, &fast, &general) && fast);
    a.output = (void*)(uintptr_t)at(9);
    a.prefix_lse = (const float*)(uintptr_t)(at(8) + 4);
    EXPECT(same(&plan, a, &fast, &kernel) && fast && strcmp(kernel, general) == 0);
    /* Another threshold within 0..=T: the short path, and the specialization it selects (every
     * token with context: the _dense_nothr twin). */
    a = args(T, 0);
    EXPECT(same(&plan, a, &fast, &kernel) && fast && strcmp(kernel, general) == 0);
    a = args(T, T);
    EXPECT(same(&plan, a, &fast, &kernel) && fast && strcmp(kernel, general) != 0 && strstr(kernel, "_nothr"));
    /* Out of its bounds, or left out: the full check (a refusal, or the default). */
    a = args(T, T + 1);
    EXPECT(same(&plan, a, &fast, &kernel) && !fast && strstr(mla_last_error(), "exceeds its maximum"));
    a = args(T, -1);
    EXPECT(same(&plan, a, &fast, &kernel) && !fast && strstr(mla_last_error(), "below its minimum"));
    a = args(T, MLA_DEFAULT);
    EXPECT(same(&plan, a, &fast, &kernel) && !fast && kernel && strstr(kernel, "_nothr"));
    /* Pointers: misaligned, overlapping a written buffer, NULL, or a buffer left out. */
    a = args(T, 3);
    a.output = (void*)(uintptr_t)(at(1) + 2);
    EXPECT(same(&plan, a, &fast, &kernel) && !fast && strstr(mla_last_error(), "is not aligned to 16 bytes"));
    a = args(T, 3);
    a.prefix_output = (const void*)(uintptr_t)(at(1) + 64);
    EXPECT(same(&plan, a, &fast, &kernel) && !fast && strstr(mla_last_error(), "overlaps"));
    a = args(T, 3);
    a.suffix_lse = (const float*)(uintptr_t)(at(2) + 4 * (T * H - 1)); /* output_lse's last element */
    EXPECT(same(&plan, a, &fast, &kernel) && !fast && strstr(mla_last_error(), "overlaps"));
    a = args(T, 3);
    a.suffix_lse = (const float*)(uintptr_t)(at(2) + 4 * T * H); /* just past it */
    EXPECT(same(&plan, a, &fast, &kernel) && fast);
    a = args(T, 3);
    a.prefix_output = NULL;
    EXPECT(same(&plan, a, &fast, &kernel) && !fast && strstr(mla_last_error(), "is a null pointer"));
    a = args(T, 3);
    a.output_lse = NULL;
    a.output_lse_numel = 0;
    EXPECT(same(&plan, a, &fast, &kernel) && !fast && kernel);
    /* The layout: another size, stride or _numel. */
    a = args(T + 1, 3);
    EXPECT(same(&plan, a, &fast, &kernel) && !fast && kernel);
    a = args(T, 3);
    a.prefix_token_stride += 8;
    a.prefix_output_numel += 8 * T;
    EXPECT(same(&plan, a, &fast, &kernel) && !fast && kernel && strcmp(kernel, general) != 0);
    a = args(T, 3);
    a.suffix_output_numel -= 1;
    EXPECT(same(&plan, a, &fast, &kernel) && !fast && strstr(mla_last_error(), "needs"));
    a = args(T, 3);
    a.output_numel += 1;
    EXPECT(same(&plan, a, &fast, &kernel) && !fast && kernel);

    /* A plan of the default threshold takes the default only; a plan of no tokens launches
     * nothing and checks no pointer, as the launcher. */
    const mla_prepared dflt = marked_plan(args(T, MLA_DEFAULT));
    a = args(T, MLA_DEFAULT);
    a.output = (void*)(uintptr_t)at(7);
    EXPECT(same(&dflt, a, &fast, &kernel) && fast && strstr(kernel, "_nothr"));
    a = args(T, T);
    EXPECT(same(&dflt, a, &fast, &kernel) && !fast && strstr(kernel, "_nothr"));
    mla_prepared empty;
    a = args(0, 0);
    EXPECT(mla_prepare(KERNEL, &a, &empty) == MLA_OK);
    a.output = (void*)(uintptr_t)(at(1) + 2);
    EXPECT(same(&empty, a, &fast, &kernel) && !kernel);
    a = args(0, 1);
    EXPECT(same(&empty, a, &fast, &kernel) && strstr(mla_last_error(), "exceeds its maximum"));

    /* A refused call prepares nothing: the launcher's status and message; the plan launches
     * nothing. Unknown kernels and null arguments are named. */
    mla_prepared refused;
    a = args(T, 3);
    a.output = (void*)(uintptr_t)(at(1) + 2);
    EXPECT(mla_prepare(KERNEL, &a, &refused) == MLA_INVALID_ARGUMENT &&
           strstr(mla_last_error(), KERNEL ": output: pointer 0x") == mla_last_error());
    EXPECT(mla_launch_prepared(&refused, NULL, &a) == MLA_INVALID_ARGUMENT &&
           strcmp(mla_last_error(), "mla_launch_prepared: the plan is not prepared") == 0);
    EXPECT(mla_prepare("no_such_kernel", &a, &refused) == MLA_INVALID_ARGUMENT &&
           strcmp(mla_last_error(), "no_such_kernel: no such kernel in this launcher") == 0);
    EXPECT(mla_prepare(KERNEL, NULL, &refused) == MLA_INVALID_ARGUMENT &&
           strcmp(mla_last_error(), KERNEL ": args is a null pointer") == 0);
    EXPECT(mla_launch_prepared(&plan, NULL, NULL) == MLA_INVALID_ARGUMENT &&
           strcmp(mla_last_error(), KERNEL ": args is a null pointer") == 0);
    mla_prepared shared;
    a = args(T, 3);
    EXPECT(mla_prepare(KERNEL, &a, &shared) == MLA_OK);
    pthread_t threads[4];
    for (int i = 0; i < 4; ++i) EXPECT(pthread_create(&threads[i], NULL, hammer, &shared) == 0);
    for (int i = 0; i < 4; ++i) {
        void* refused;
        pthread_join(threads[i], &refused);
        EXPECT(refused == NULL);
    }
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures);
    return failures != 0;
}

/* The C launcher applies specializations (docs/MANIFEST.md, "Specializations"): a launch whose
 * checked values meet the dense specialization's contract (every stride the dense one, tokens x
 * heads below 2^31) runs the _dense kernel, with the same parameter values and its own grid and
 * block; any other launch runs the kernel called. With a size rule, the rule chooses first and the
 * chosen kernel's own specialization applies. Called by its own launcher, a specialization runs
 * its whole, stricter check. The stub driver records which kernel ran (last_kernel). Built by
 * tests/c_launcher.rs, which writes special_expect.h from the generated manifest: D, KERNEL, LAUNCH
 * (the kernel called), DENSE, DENSE_LAUNCH (its specialization); with a rule also BELOW (the
 * range's bound), SMALL (the range's kernel) and SMALL_DENSE (its specialization). */
#include "mla_kernels.h"

#include <stdio.h>
#include <string.h>

#include "driver_stub.h"
#include "special_expect.h"


static int failures;
#define EXPECT(cond) do { if (!(cond)) { printf("FAILED line %d: %s\n", __LINE__, #cond); failures++; } } while (0)

/* The buffers are never touched (the stub launches nothing): addresses 2^44 apart, so that
 * tensors of 2^32 rows fit without overlapping. */
static void* at(int i) { return (void*)(uintptr_t)((uint64_t)i << 44); }

/* T tokens of H heads; each head of every [T, H, D] tensor `head_pad` elements longer than D and
 * each token `token_pad` elements more than its heads: 0 and 0 is the dense layout. */
static mla_merge_attn_states_args args(long long T, long long H, long long token_pad, long long head_pad) {
    mla_merge_attn_states_args a = MLA_MERGE_ATTN_STATES_ARGS_INIT;
    const long long hs = D + head_pad, ts = H * hs + token_pad, n = (T - 1) * ts + (H - 1) * hs + D;
    a.output = at(1); a.output_numel = n; a.prefix_output = at(2); a.prefix_output_numel = n;
    a.suffix_output = at(3); a.suffix_output_numel = n;
    a.prefix_lse = at(4); a.prefix_lse_numel = T * H; a.suffix_lse = at(5); a.suffix_lse_numel = T * H;
    a.num_tokens = T; a.num_heads = H;
    a.output_token_stride = a.prefix_token_stride = a.suffix_token_stride = ts;
    a.output_head_stride = a.prefix_head_stride = a.suffix_head_stride = hs;
    return a;
}

/* The kernel a launch through LAUNCH ran, "refused" where it was not launched. */
static const char* ran(mla_merge_attn_states_args a) {
    return LAUNCH(NULL, &a) == MLA_OK ? last_kernel : "refused";
}

/* A launch through LAUNCH is the one `direct` (the specialization's launcher) makes: the same
 * kernel, grid, block and parameter values. */
static int same_as_direct(mla_merge_attn_states_args a, mla_status (*direct)(CUstream, const mla_merge_attn_states_args*)) {
    if (LAUNCH(NULL, &a) != MLA_OK) return 0;
    const unsigned grid[3] = { last_grid[0], last_grid[1], last_grid[2] }, block = last_block;
    long long params[32];
    const int n = last_param_count;
    memcpy(params, last_params, sizeof params);
    const char* kernel = last_kernel;
    return direct(NULL, &a) == MLA_OK && strcmp(kernel, last_kernel) == 0 && n == last_param_count &&
           memcmp(params, last_params, (size_t)n * sizeof *params) == 0 && memcmp(grid, last_grid, sizeof grid) == 0 &&
           block == last_block;
}

int main(void) {
#ifdef BELOW
    const long long T = (BELOW) / 16 + 1, T_SMALL = (BELOW) / 16 - 1; /* 16 heads: rows above and below */
#else
    const long long T = 64;
#endif
    mla_merge_attn_states_args a = args(T, 16, 0, 0);
    EXPECT(strcmp(ran(a), DENSE) == 0);
    EXPECT(same_as_direct(a, DENSE_LAUNCH));
    /* Padded tokens, padded heads, one padded tensor: the kernel itself. */
    EXPECT(strcmp(ran(args(T, 16, 8, 0)), KERNEL) == 0);
    EXPECT(strcmp(ran(args(T, 16, 0, 8)), KERNEL) == 0);
    a = args(T, 16, 0, 0);
    a.suffix_token_stride += 8;
    a.suffix_output_numel += 8 * T;
    EXPECT(strcmp(ran(a), KERNEL) == 0);
    /* Tokens x heads: up to 2^31 - 1 rows run the dense kernel, 2^31 do not. */
    EXPECT(strcmp(ran(args(8388607, 256, 0, 0)), DENSE) == 0);
    a = args(8388608, 256, 0, 0);
    EXPECT(strcmp(ran(a), KERNEL) == 0);
    /* Launched by its own name, a specialization checks its own contract, its limit included. */
    EXPECT(DENSE_LAUNCH(NULL, &a) == MLA_INVALID_ARGUMENT &&
           strcmp(mla_last_error(), DENSE ": num_tokens*num_heads = 2147483648 exceeds 2147483647: this kernel "
                                   "numbers rows (tokens x heads) in 32 bits") == 0);
    a = args(T, 16, 8, 0);
    char padded[160];
    snprintf(padded, sizeof padded, "%s: output_token_stride = %d exceeds its maximum num_heads*%d = %d", DENSE,
             16 * D + 8, D, 16 * D);
    EXPECT(DENSE_LAUNCH(NULL, &a) == MLA_INVALID_ARGUMENT && strcmp(mla_last_error(), padded) == 0);
    /* A refusal through the kernel names the kernel called. */
    a = args(T, 16, 0, 0);
    a.num_heads = -1;
    EXPECT(strcmp(ran(a), "refused") == 0 && strcmp(mla_last_error(), KERNEL ": num_heads = -1 is below its minimum 0") == 0);
#ifdef BELOW
    /* Below the rule's bound: the range's kernel, then its own specialization. */
    EXPECT(strcmp(ran(args(T_SMALL, 16, 0, 0)), SMALL_DENSE) == 0);
    EXPECT(strcmp(ran(args(T_SMALL, 16, 8, 0)), SMALL) == 0);
    EXPECT(strcmp(ran(args(T_SMALL, 16, 0, 8)), SMALL) == 0);
#endif
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures);
    return failures != 0;
}

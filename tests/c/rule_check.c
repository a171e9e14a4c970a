/* The C launcher applies a size rule (docs/MANIFEST.md, "Size rules"): a launch of the rule's
 * kernel with rows = tokens x heads below the bound runs the range's kernel, with that kernel's
 * grid and block and the same parameter values; at or above it, the kernel itself. Built by
 * tests/c_launcher.rs, which writes rule_expect.h from the generated manifest (D, KERNEL, LAUNCH,
 * ALT, BELOW and each kernel's tokens and heads per block and block size). */
#include "mla_kernels.h"

#include <stdio.h>
#include <string.h>

#include "driver_stub.h"
#include "rule_expect.h"

#define H 16
#define T_MAX ((BELOW) / H + 64)
static _Alignas(16) unsigned short out[T_MAX * H * D], prefix[T_MAX * H * D], suffix[T_MAX * H * D];
static float plse[T_MAX * H], slse[T_MAX * H];

static int failures;
#define EXPECT(cond) do { if (!(cond)) { printf("FAILED line %d: %s\n", __LINE__, #cond); failures++; } } while (0)

static mla_merge_attn_states_args args(long long T) {
    mla_merge_attn_states_args a = MLA_MERGE_ATTN_STATES_ARGS_INIT;
    const long long n = T * H * D;
    a.output = out; a.output_numel = n; a.prefix_output = prefix; a.prefix_output_numel = n;
    a.prefix_lse = plse; a.prefix_lse_numel = T * H; a.suffix_output = suffix; a.suffix_output_numel = n;
    a.suffix_lse = slse; a.suffix_lse_numel = T * H; a.num_tokens = T; a.num_heads = H;
    a.output_token_stride = a.prefix_token_stride = a.suffix_token_stride = H * D;
    a.output_head_stride = a.prefix_head_stride = a.suffix_head_stride = D;
    return a;
}

/* Launch through the rule's kernel; the grid and block the driver got match (tpb, hpb, block). */
static int ran(long long T, unsigned tpb, unsigned hpb, unsigned block) {
    mla_merge_attn_states_args a = args(T);
    if (LAUNCH(NULL, &a) != MLA_OK) return 0;
    return last_grid[0] == (T + tpb - 1) / tpb && last_grid[1] == (H + hpb - 1) / hpb && last_block == block;
}

int main(void) {
    EXPECT(BELOW % H == 0 && (BELOW) / H + 1 <= T_MAX);
    const long long below = (BELOW) / H; /* tokens at the bound */
    EXPECT(ran(1, ALT_TPB, ALT_HPB, ALT_BLOCK));
    EXPECT(ran(below - 1, ALT_TPB, ALT_HPB, ALT_BLOCK));
    EXPECT(ran(below, MAIN_TPB, MAIN_HPB, MAIN_BLOCK)); /* rows == bound: the kernel itself */
    EXPECT(ran(below + 1, MAIN_TPB, MAIN_HPB, MAIN_BLOCK));
    /* Two images loaded: the rule's kernel and its range's. */
    EXPECT(libraries_live == 2);
    /* Refusals name the kernel called, whichever would have run. */
    mla_merge_attn_states_args bad = args(1);
    bad.num_heads = -1;
    EXPECT(LAUNCH(NULL, &bad) == MLA_INVALID_ARGUMENT &&
           strcmp(mla_last_error(), KERNEL ": num_heads = -1 is below its minimum 0") == 0);
    /* The range's kernel is a launcher of its own too, without a rule: its schedule at any size. */
    mla_merge_attn_states_args big = args(below + 1);
    EXPECT(ALT(NULL, &big) == MLA_OK && last_block == ALT_BLOCK);
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures);
    return failures != 0;
}

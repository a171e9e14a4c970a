/* Exercises the generated C launchers of the K-way merge, the in-place merge and the lse mask
 * without a GPU (stub driver functions): valid calls launch with their parameters in manifest
 * order, and every unsafe call is refused, with the contract's text, before any launch. Built and
 * run by tests/c_launcher.rs against merge_states bf16 d128 (K = 4 and runtime K),
 * merge_state_in_place bf16 d128 with a mask, and mask_empty_context_lse. */
#include "mla_kernels.h"

#include <stdio.h>
#include <string.h>

#include "driver_stub.h"

#define T 100
#define H 8
#define D 128
#define K 4
static _Alignas(16) unsigned short out[T * H * D], states[T * K * H * D], state[T * H * D], other[T * H * D];
static float olse[T * H], states_lse[T * K * H], state_lse[T * H], other_lse[T * H];
static unsigned char mask[T];
static int32_t qsl[3] = { 0, 40, T }, csl[3] = { 0, 0, 7 };

static int failures;
#define EXPECT(cond) do { if (!(cond)) { printf("FAILED line %d: %s\n", __LINE__, #cond); failures++; } } while (0)
#define REFUSED(call, kernel, text) do { mla_status s_ = (call); \
    if (s_ != MLA_INVALID_ARGUMENT || strcmp(mla_last_error(), kernel ": " text) != 0) { \
        printf("FAILED line %d: expected '%s', got %s '%s'\n", __LINE__, kernel ": " text, mla_status_string(s_), \
               mla_last_error()); \
        failures++; } } while (0)

#define K4 "merge_states_bf16_d128_k4_lse"
#define KVAR "merge_states_bf16_d128_kvar_lse"
#define IN_PLACE "merge_state_in_place_bf16_d128_mask"
#define MASK_LSE "mask_empty_context_lse"

static mla_merge_states_args good_states(void) {
    mla_merge_states_args a = MLA_MERGE_STATES_ARGS_INIT;
    a.output = out; a.output_numel = T * H * D; a.output_lse = olse; a.output_lse_numel = T * H;
    a.states = states; a.states_numel = T * K * H * D; a.states_lse = states_lse; a.states_lse_numel = T * K * H;
    a.num_tokens = T; a.num_heads = H;
    a.output_token_stride = H * D; a.output_head_stride = D;
    a.states_token_stride = K * H * D; a.states_state_stride = H * D; a.states_head_stride = D;
    return a; /* num_states: MLA_DEFAULT, which a fixed-K kernel takes as its own K */
}

static mla_merge_state_in_place_args good_in_place(void) {
    mla_merge_state_in_place_args a = MLA_MERGE_STATE_IN_PLACE_ARGS_INIT;
    a.state = state; a.state_numel = T * H * D; a.state_lse = state_lse; a.state_lse_numel = T * H;
    a.other = other; a.other_numel = T * H * D; a.other_lse = other_lse; a.other_lse_numel = T * H;
    a.mask = mask; a.mask_numel = T;
    a.num_tokens = T; a.num_heads = H;
    a.state_token_stride = H * D; a.state_head_stride = D; a.other_token_stride = H * D; a.other_head_stride = D;
    return a;
}

static mla_mask_empty_context_lse_args good_mask(void) {
    mla_mask_empty_context_lse_args a = MLA_MASK_EMPTY_CONTEXT_LSE_ARGS_INIT;
    a.lse = state_lse; a.lse_numel = T * H;
    a.query_start_loc = qsl; a.query_start_loc_numel = 3; a.context_start_loc = csl; a.context_start_loc_numel = 3;
    a.num_requests = 2; a.num_tokens = T; a.num_heads = H;
    return a;
}

static mla_status k4(mla_merge_states_args a) { return mla_merge_states_bf16_d128_k4_lse(NULL, &a); }
static mla_status kvar(mla_merge_states_args a) { return mla_merge_states_bf16_d128_kvar_lse(NULL, &a); }
static mla_status in_place(mla_merge_state_in_place_args a) { return mla_merge_state_in_place_bf16_d128_mask(NULL, &a); }
static mla_status mask_lse(mla_mask_empty_context_lse_args a) { return mla_mask_empty_context_lse(NULL, &a); }

int main(void) {
    EXPECT(mla_load() == MLA_OK && cubins_loaded == 4);

    /* K-way: output, output_lse, states, states_lse, [K], T, H, strides. */
    mla_merge_states_args s = good_states();
    EXPECT(k4(s) == MLA_OK);
    EXPECT(launches == 1);
    EXPECT(last_params[0] == (long long)(uintptr_t)out && last_params[2] == (long long)(uintptr_t)states);
    EXPECT(last_params[4] == T && last_params[5] == H && last_params[9] == H * D && last_param_count == 11);
    EXPECT(last_grid[0] == T && last_grid[1] == H / 8 && last_block == 128);
    s.num_states = K; /* the kernel's K may be stated */
    EXPECT(k4(s) == MLA_OK);
    s.num_states = 3;
    EXPECT(kvar(s) == MLA_OK); /* runtime K: 3 of the 4 states the buffer holds */
    EXPECT(last_params[4] == 3 && last_params[5] == T && last_param_count == 12);
    REFUSED(k4(s), K4, "num_states = 3, but this kernel is built for num_states = 4");
    s = good_states(); REFUSED(kvar(s), KVAR, "num_states is required");
    s = good_states(); s.num_states = 0; REFUSED(kvar(s), KVAR, "num_states = 0 is below its minimum 1");
    EXPECT(k4(s) == MLA_OK); /* 0 never is a K: to a fixed-K kernel it means "not given" */
    s = good_states(); s.states_numel -= 1;
    REFUSED(k4(s), K4, "states: [T=100, K=4, H=8, D=128] with strides (4096, 1024, 128, 1) needs 409600 elements, it has 409599");
    s = good_states(); s.states_lse_numel -= 1;
    REFUSED(k4(s), K4, "states_lse: [T=100, K=4, H=8] with strides (32, 8, 1) needs 3200 elements, it has 3199");
    s = good_states(); s.states_state_stride += 1;
    REFUSED(k4(s), K4, "states: states_state_stride = 1025 is not a multiple of 8 elements (the kernel's 16-byte access)");
    s = good_states(); s.output = states;
    REFUSED(k4(s), K4, "output overlaps states: the kernel writes output, which may share memory with no other argument");
    s = good_states(); s.output_token_stride = D;
    REFUSED(k4(s), K4, "output: [T=100, H=8, D=128] with strides (128, 128, 1) maps two elements to one address");
    s = good_states(); s.states = NULL; REFUSED(k4(s), K4, "states is a null pointer");
    EXPECT(launches == 4);

    /* In place: state, state_lse, other, other_lse, mask, T, H, strides. */
    mla_merge_state_in_place_args p = good_in_place();
    EXPECT(in_place(p) == MLA_OK);
    EXPECT(launches == 5);
    EXPECT(last_params[0] == (long long)(uintptr_t)state && last_params[4] == (long long)(uintptr_t)mask);
    EXPECT(last_params[5] == T && last_params[6] == H && last_param_count == 11);
    p.mask = NULL;
    EXPECT(in_place(p) == MLA_OK);
    EXPECT(last_params[4] == 0);
    p = good_in_place(); p.mask_numel = T - 1;
    REFUSED(in_place(p), IN_PLACE, "mask: [T=100] with strides (1) needs 100 elements, it has 99");
    p = good_in_place(); p.other = state;
    REFUSED(in_place(p), IN_PLACE, "state overlaps other: the kernel writes state, which may share memory with no other argument");
    p = good_in_place(); p.mask = (const unsigned char*)state_lse;
    REFUSED(in_place(p), IN_PLACE, "state_lse overlaps mask: the kernel writes state_lse, which may share memory with no other argument");
    p = good_in_place(); p.state_lse = (float*)state;
    REFUSED(in_place(p), IN_PLACE, "state overlaps state_lse: the kernel writes state, which may share memory with no other argument");
    p = good_in_place(); p.state_head_stride = 120;
    REFUSED(in_place(p), IN_PLACE, "state: [T=100, H=8, D=128] with strides (1024, 120, 1) maps two elements to one address");
    EXPECT(launches == 6);

    /* The lse mask: lse, query_start_loc, context_start_loc, B, T, H; grid (ceil(T / 256),
       ceil(H / 16)): each thread masks 16 heads of its token. */
    mla_mask_empty_context_lse_args m = good_mask();
    EXPECT(mask_lse(m) == MLA_OK);
    EXPECT(launches == 7);
    EXPECT(last_params[0] == (long long)(uintptr_t)state_lse && last_params[3] == 2 && last_params[4] == T);
    EXPECT(last_param_count == 6);
    EXPECT(last_grid[0] == 1 && last_grid[1] == (H + 15) / 16);
    m = good_mask(); m.lse_numel = T * H - 1;
    REFUSED(mask_lse(m), MASK_LSE, "lse: [H=8, T=100] with strides (100, 1) needs 800 elements, it has 799");
    m = good_mask(); m.query_start_loc = (const int32_t*)(state_lse + 4);
    REFUSED(mask_lse(m), MASK_LSE, "lse overlaps query_start_loc: the kernel writes lse, which may share memory with no other argument");
    m = good_mask(); m.num_requests = -1; REFUSED(mask_lse(m), MASK_LSE, "num_requests = -1 is below its minimum 0");
    m = good_mask(); m.num_requests = 2147483647;
    REFUSED(mask_lse(m), MASK_LSE, "num_requests = 2147483647 exceeds its maximum 2147483646");
    m = good_mask(); m.context_start_loc_numel = 2;
    REFUSED(mask_lse(m), MASK_LSE, "context_start_loc: [B+1=3] with strides (1) needs 3 elements, it has 2");
    EXPECT(launches == 7);

    EXPECT(mla_unload() == MLA_OK && libraries_live == 0);
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures);
    return failures != 0;
}

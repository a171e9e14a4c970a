/* Exercises the generated C launchers of the K-way merge, the in-place merge and the lse mask
 * without a GPU (stub driver functions): valid calls launch with their parameters in manifest
 * order, and every unsafe call is refused before any launch. Built and run by tests/c_launcher.rs
 * against merge_states bf16 d128 (K = 4 and runtime K), merge_state_in_place bf16 d128 with a
 * mask, and mask_empty_context_lse. */
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
#define REFUSED(call, needle) do { CUresult r_ = (call); \
    if (r_ != MLA_ERROR_INVALID_ARGUMENT || !strstr(mla_last_error(), needle)) { \
        printf("FAILED line %d: expected refusal containing '%s', got %d '%s'\n", __LINE__, needle, (int)r_, mla_last_error()); \
        failures++; } } while (0)

static mla_states_args good_states(void) {
    mla_states_args a = {
        out, T * H * D, olse, T * H, states, T * K * H * D, states_lse, T * K * H,
        T, H, K, H * D, D, K * H * D, H * D, D,
    };
    return a;
}

static mla_in_place_args good_in_place(void) {
    mla_in_place_args a = {
        state, T * H * D, state_lse, T * H, other, T * H * D, other_lse, T * H, mask, T,
        T, H, H * D, D, H * D, D,
    };
    return a;
}

static mla_mask_lse_args good_mask(void) {
    mla_mask_lse_args a = { state_lse, T * H, qsl, csl, 2, T, H };
    return a;
}

int main(void) {
    mla_states_args s = good_states();
    EXPECT(mla_merge_states_bf16_d128_k4_lse(NULL, &s) == CUDA_ERROR_NOT_INITIALIZED);
    EXPECT(mla_load() == CUDA_SUCCESS);

    /* K-way: parameters in manifest order (output, output_lse, states, states_lse, [K], T, H, ...). */
    param_count = 11;
    EXPECT(mla_merge_states_bf16_d128_k4_lse(NULL, &s) == CUDA_SUCCESS);
    EXPECT(launches == 1);
    EXPECT(last_params[0] == (long long)(uintptr_t)out && last_params[2] == (long long)(uintptr_t)states);
    EXPECT(last_params[4] == T && last_params[5] == H && last_params[9] == H * D);
    param_count = 12;
    s.num_states = 3;
    EXPECT(mla_merge_states_bf16_d128_kvar_lse(NULL, &s) == CUDA_SUCCESS);
    EXPECT(last_params[4] == 3 && last_params[5] == T);
    REFUSED(mla_merge_states_bf16_d128_k4_lse(NULL, &s), "merges exactly 4 states");
    s = good_states(); s.num_states = 0; REFUSED(mla_merge_states_bf16_d128_kvar_lse(NULL, &s), "nothing to merge");
    s = good_states(); s.states_numel -= 1; REFUSED(mla_merge_states_bf16_d128_k4_lse(NULL, &s), "states: its shape");
    s = good_states(); s.states_lse_numel -= 1; REFUSED(mla_merge_states_bf16_d128_k4_lse(NULL, &s), "num_tokens * num_states * num_heads");
    s = good_states(); s.states_state_stride += 1; REFUSED(mla_merge_states_bf16_d128_k4_lse(NULL, &s), "multiples of 8");
    s = good_states(); s.output = states; REFUSED(mla_merge_states_bf16_d128_k4_lse(NULL, &s), "overlaps");
    s = good_states(); s.output_token_stride = D; REFUSED(mla_merge_states_bf16_d128_k4_lse(NULL, &s), "rows would overlap");
    s = good_states(); s.states = NULL; REFUSED(mla_merge_states_bf16_d128_k4_lse(NULL, &s), "NULL");
    EXPECT(launches == 2);

    /* In place: state, state_lse, other, other_lse, mask, T, H, strides. */
    param_count = 11;
    mla_in_place_args p = good_in_place();
    EXPECT(mla_merge_state_in_place_bf16_d128_mask(NULL, &p) == CUDA_SUCCESS);
    EXPECT(launches == 3);
    EXPECT(last_params[0] == (long long)(uintptr_t)state && last_params[4] == (long long)(uintptr_t)mask);
    EXPECT(last_params[5] == T && last_params[6] == H);
    p.mask = NULL;
    EXPECT(mla_merge_state_in_place_bf16_d128_mask(NULL, &p) == CUDA_SUCCESS);
    EXPECT(last_params[4] == 0);
    p = good_in_place(); p.mask_numel = T - 1; REFUSED(mla_merge_state_in_place_bf16_d128_mask(NULL, &p), "fewer than num_tokens bytes");
    p = good_in_place(); p.other = state; REFUSED(mla_merge_state_in_place_bf16_d128_mask(NULL, &p), "overlaps state");
    p = good_in_place(); p.mask = (const unsigned char*)state_lse; REFUSED(mla_merge_state_in_place_bf16_d128_mask(NULL, &p), "overlaps state");
    p = good_in_place(); p.state_lse = (float*)state; REFUSED(mla_merge_state_in_place_bf16_d128_mask(NULL, &p), "state overlaps state_lse");
    p = good_in_place(); p.state_head_stride = 120; REFUSED(mla_merge_state_in_place_bf16_d128_mask(NULL, &p), "head stride 120 < head size 128");
    EXPECT(launches == 4);

    /* The lse mask: lse, query_start_loc, context_start_loc, B, T, H; grid (ceil(T / 256),
       ceil(H / 16)): each thread masks 16 heads of its token. */
    param_count = 6;
    mla_mask_lse_args m = good_mask();
    EXPECT(mla_mask_empty_context_lse(NULL, &m) == CUDA_SUCCESS);
    EXPECT(launches == 5);
    EXPECT(last_params[0] == (long long)(uintptr_t)state_lse && last_params[3] == 2 && last_params[4] == T);
    EXPECT(last_grid[0] == 1 && last_grid[1] == (H + 15) / 16);
    m = good_mask(); m.lse_numel = T * H - 1; REFUSED(mla_mask_empty_context_lse(NULL, &m), "fewer than num_tokens * num_heads");
    m = good_mask(); m.query_start_loc = (const int32_t*)(state_lse + 4); REFUSED(mla_mask_empty_context_lse(NULL, &m), "overlaps");
    m = good_mask(); m.num_requests = -1; REFUSED(mla_mask_empty_context_lse(NULL, &m), "negative");
    EXPECT(launches == 5);

    mla_unload();
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures);
    return failures != 0;
}

// The speed peers of the benchmark (bench/peers.py), compiled on the GPU machine with nvcc
// into a shared library called through ctypes. Nothing here ships; nothing of FlashInfer is
// committed: bench/gpu/peers.sh extracts its headers from the flashinfer-python wheel into the
// git-ignored .device/peers/include.
//
//   fi_*      FlashInfer's MergeState, MergeStateInPlace and MergeStates
//             (include/flashinfer/attention/cascade.cuh), launched by FlashInfer's own host
//             functions: lse base 2, token-major [T, H], contiguous tensors. Built with the flags
//             FlashInfer's JIT uses (-O3 -use_fast_math), as its wheels run it.
//   vllm_*    a baseline written here the way vLLM's CUDA op (csrc/attention/merge_attn_states.cu)
//             works, labelled "vLLM-style": one 16-byte pack per thread, 128-thread blocks, 32-bit
//             indices, one head stride shared by prefix and suffix, lse [H, T] in base e,
//             expf/logf/IEEE division, the threshold copies the suffix, +-inf lse read as -inf and
//             both sides empty copying the prefix. Built without fast math, as torch extensions
//             build by default.
//   access_floor  no merge: the same bytes read and written with no arithmetic (what moving a
//             merge's bytes costs, to within what another schedule would save), in three
//             schedules.
//
// One source, two libraries (bench/gpu/peers.sh): -DPEERS_FLASHINFER with fast math gives
// libpeers_fi.so (FlashInfer only), without it libpeers_vllm.so (the baseline only). Every entry
// point returns the cudaError_t of its launch (0 = success).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#ifdef PEERS_FLASHINFER
#include <flashinfer/attention/cascade.cuh>
#endif

#ifndef PEERS_FLASHINFER
namespace {

// ---- vLLM-style baseline ----
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void from_f(float& d, float s) { d = s; }
__device__ __forceinline__ void from_f(__half& d, float s) { d = __float2half_rn(s); }
__device__ __forceinline__ void from_f(__nv_bfloat16& d, float s) { d = __float2bfloat16_rn(s); }

constexpr unsigned VLLM_THREADS = 128;

template <typename T>
__global__ void vllm_style_merge(T* out, float* out_lse, const T* prefix, const float* prefix_lse,
                                 const T* suffix, const float* suffix_lse, unsigned num_tokens,
                                 unsigned num_heads, unsigned head_size, unsigned head_stride,
                                 unsigned out_head_stride, unsigned tokens_with_context) {
    constexpr unsigned PACK = 16 / sizeof(T);
    const unsigned packs_per_head = head_size / PACK;
    const unsigned idx = blockIdx.x * VLLM_THREADS + threadIdx.x;
    if (idx >= num_tokens * num_heads * packs_per_head) return;
    const unsigned row = idx / packs_per_head, pack = idx % packs_per_head;
    const unsigned t = row / num_heads, h = row % num_heads;
    const unsigned src = (t * num_heads + h) * head_stride + pack * PACK;
    const unsigned dst = (t * num_heads + h) * out_head_stride + pack * PACK;
    const unsigned at = h * num_tokens + t;
    if (t >= tokens_with_context) {
        *reinterpret_cast<uint4*>(out + dst) = *reinterpret_cast<const uint4*>(suffix + src);
        if (out_lse != nullptr && pack == 0) out_lse[at] = suffix_lse[at];
        return;
    }
    float p = prefix_lse[at], s = suffix_lse[at];
    p = isinf(p) ? -INFINITY : p;
    s = isinf(s) ? -INFINITY : s;
    const float m = fmaxf(p, s);
    if (isinf(m)) {
        *reinterpret_cast<uint4*>(out + dst) = *reinterpret_cast<const uint4*>(prefix + src);
        if (out_lse != nullptr && pack == 0) out_lse[at] = m;
        return;
    }
    const float pe = expf(p - m), se = expf(s - m), sum = pe + se;
    const float pw = pe / sum, sw = se / sum;
    const uint4 pv = *reinterpret_cast<const uint4*>(prefix + src);
    const uint4 sv = *reinterpret_cast<const uint4*>(suffix + src);
    const T* pa = reinterpret_cast<const T*>(&pv);
    const T* sa = reinterpret_cast<const T*>(&sv);
    uint4 ov;
    T* oa = reinterpret_cast<T*>(&ov);
#pragma unroll
    for (unsigned i = 0; i < PACK; ++i) from_f(oa[i], to_f(pa[i]) * pw + to_f(sa[i]) * sw);
    *reinterpret_cast<uint4*>(out + dst) = ov;
    if (out_lse != nullptr && pack == 0) out_lse[at] = logf(sum) + m;
}

template <typename T>
cudaError_t vllm_style(void* out, float* out_lse, const void* prefix, const float* prefix_lse,
                       const void* suffix, const float* suffix_lse, unsigned num_tokens,
                       unsigned num_heads, unsigned head_size, unsigned tokens_with_context,
                       cudaStream_t stream) {
    const unsigned long long threads =
        1ull * num_tokens * num_heads * (head_size / (16 / sizeof(T)));
    if (threads == 0) return cudaSuccess;
    if (threads > 0xffffffffull) return cudaErrorInvalidValue;  // its indices are 32-bit
    const unsigned blocks = static_cast<unsigned>((threads + VLLM_THREADS - 1) / VLLM_THREADS);
    vllm_style_merge<T><<<blocks, VLLM_THREADS, 0, stream>>>(
        static_cast<T*>(out), out_lse, static_cast<const T*>(prefix), prefix_lse,
        static_cast<const T*>(suffix), suffix_lse, num_tokens, num_heads, head_size, head_size,
        head_size, tokens_with_context);
    return cudaGetLastError();
}

}  // namespace

#define VLLM_ENTRY(NAME, T)                                                                     \
    extern "C" int NAME(void* out, float* out_lse, const void* prefix, const float* prefix_lse, \
                        const void* suffix, const float* suffix_lse, unsigned num_tokens,       \
                        unsigned num_heads, unsigned head_size, unsigned tokens_with_context,   \
                        void* stream) {                                                         \
        return vllm_style<T>(out, out_lse, prefix, prefix_lse, suffix, suffix_lse, num_tokens, \
                             num_heads, head_size, tokens_with_context,                         \
                             static_cast<cudaStream_t>(stream));                                \
    }
VLLM_ENTRY(vllm_merge_f32, float)
VLLM_ENTRY(vllm_merge_f16, __half)
VLLM_ENTRY(vllm_merge_bf16, __nv_bfloat16)

// ---- the access floor: a merge's bytes with no merge ----
// Reads both outputs and both lse and writes one output and one lse, as a merge of contiguous
// tensors does, with only an XOR between loads and stores (so that no load can be dropped): what
// the traffic alone costs in these schedules, before any merge arithmetic. Not a merge: its
// output is never checked. VECS 16-byte vectors per thread, THREADS per block, rows of
// `vecs_per_row` vectors (a multiple of VECS), 32-bit indices. NARROW: 8 bytes written per 16
// read from each input, the traffic of an FP8 output from 16-bit inputs (no group scales).
namespace {
template <unsigned THREADS, unsigned VECS, bool NARROW>
__global__ void __launch_bounds__(THREADS)
    floor_kernel(void* out, float* out_lse, const uint4* a, const float* a_lse, const uint4* b,
                 const float* b_lse, unsigned vecs, unsigned vecs_per_row) {
    const unsigned first = (blockIdx.x * THREADS + threadIdx.x) * VECS;
    if (first >= vecs) return;
    uint4 va[VECS], vb[VECS];
    const bool row_start = first % vecs_per_row == 0;
    float la = 0.f, lb = 0.f;
    if (row_start) la = a_lse[first / vecs_per_row], lb = b_lse[first / vecs_per_row];
#pragma unroll
    for (unsigned i = 0; i < VECS; ++i) va[i] = a[first + i], vb[i] = b[first + i];
#pragma unroll
    for (unsigned i = 0; i < VECS; ++i) {
        if (NARROW)
            static_cast<uint2*>(out)[first + i] =
                make_uint2(va[i].x ^ vb[i].x ^ va[i].z ^ vb[i].z, va[i].y ^ vb[i].y ^ va[i].w ^ vb[i].w);
        else
            static_cast<uint4*>(out)[first + i] = make_uint4(
                va[i].x ^ vb[i].x, va[i].y ^ vb[i].y, va[i].z ^ vb[i].z, va[i].w ^ vb[i].w);
    }
    if (row_start && out_lse != nullptr) out_lse[first / vecs_per_row] = la + lb;
}

template <unsigned THREADS, unsigned VECS, bool NARROW>
cudaError_t launch_floor(void* out, float* out_lse, const void* a, const float* a_lse,
                         const void* b, const float* b_lse, unsigned rows, unsigned row_bytes,
                         cudaStream_t stream) {
    const unsigned vecs_per_row = row_bytes / 16;
    const unsigned long long vecs = 1ull * rows * vecs_per_row;
    if (row_bytes % (16 * VECS) != 0 || vecs > 0xffffffffull) return cudaErrorInvalidValue;
    if (vecs == 0) return cudaSuccess;
    const unsigned blocks = static_cast<unsigned>((vecs / VECS + THREADS - 1) / THREADS);
    floor_kernel<THREADS, VECS, NARROW><<<blocks, THREADS, 0, stream>>>(
        out, out_lse, static_cast<const uint4*>(a), a_lse,
        static_cast<const uint4*>(b), b_lse, static_cast<unsigned>(vecs), vecs_per_row);
    return cudaGetLastError();
}
}  // namespace

// schedule 0: 256 threads x 1 vector (FlashInfer's and vLLM's mapping), 1: 128 x 2 (mla-gen's
// shipped bf16 schedules), 2: 512 x 1. row_bytes: one input row's bytes.
#define FLOOR_ENTRY(NAME, NARROW)                                                                  \
    extern "C" int NAME(void* out, float* out_lse, const void* a, const float* a_lse,             \
                        const void* b, const float* b_lse, unsigned rows, unsigned row_bytes,     \
                        unsigned schedule, void* stream) {                                        \
        auto s = static_cast<cudaStream_t>(stream);                                                \
        switch (schedule) {                                                                        \
            case 0: return launch_floor<256, 1, NARROW>(out, out_lse, a, a_lse, b, b_lse, rows, row_bytes, s); \
            case 1: return launch_floor<128, 2, NARROW>(out, out_lse, a, a_lse, b, b_lse, rows, row_bytes, s); \
            case 2: return launch_floor<512, 1, NARROW>(out, out_lse, a, a_lse, b, b_lse, rows, row_bytes, s); \
            default: return cudaErrorInvalidValue;                                                 \
        }                                                                                          \
    }
FLOOR_ENTRY(access_floor, false)
FLOOR_ENTRY(access_floor_fp8, true)
#else
// ---- FlashInfer (its host functions; head sizes 64, 128, 256, 512) ----
#define FI_ENTRIES(SUFFIX, T)                                                                      \
    extern "C" int fi_merge_state_##SUFFIX(void* v_a, float* s_a, void* v_b, float* s_b,          \
                                           void* v_merged, float* s_merged, unsigned seq_len,     \
                                           unsigned num_heads, unsigned head_dim, void* stream) { \
        return flashinfer::MergeState<T, T>(static_cast<T*>(v_a), s_a, static_cast<T*>(v_b), s_b, \
                                            static_cast<T*>(v_merged), s_merged, seq_len,         \
                                            num_heads, head_dim,                                  \
                                            static_cast<cudaStream_t>(stream));                   \
    }                                                                                              \
    extern "C" int fi_merge_state_in_place_##SUFFIX(void* v, float* s, void* v_other,             \
                                                    float* s_other, unsigned seq_len,             \
                                                    unsigned num_heads, unsigned head_dim,        \
                                                    uint8_t* mask, void* stream) {                \
        return flashinfer::MergeStateInPlace<T>(static_cast<T*>(v), s, static_cast<T*>(v_other),  \
                                                s_other, seq_len, num_heads, head_dim, mask,      \
                                                static_cast<cudaStream_t>(stream));               \
    }                                                                                              \
    extern "C" int fi_merge_states_##SUFFIX(void* v, float* s, void* v_merged, float* s_merged,   \
                                            unsigned num_index_sets, unsigned seq_len,            \
                                            unsigned num_heads, unsigned head_dim, void* stream) { \
        return flashinfer::MergeStates<T, T>(static_cast<T*>(v), s, static_cast<T*>(v_merged),    \
                                             s_merged, num_index_sets, seq_len, num_heads,        \
                                             head_dim, static_cast<cudaStream_t>(stream));        \
    }
FI_ENTRIES(f16, half)
FI_ENTRIES(bf16, nv_bfloat16)
#endif

// One of mla-gen's CUBIN kernels (driver API) beside FlashInfer's MergeState (its host function,
// from the headers bench/gpu/peers.sh extracts into .device/peers/include), hot in one CUDA graph
// after a producer that rewrites the inputs, from C++ only, on the same buffers: 100 interleaved
// rounds, medians of (graph[producer, X] - graph[producer]) / 20. Without Python and torch between
// them, it measures the kernels alone (docs/HISTORY.md, session 11). bf16, dense [T, H, D],
// lse [H, T] for mla-gen and base-2 [T, H] for FlashInfer.
//
//   peer_harness CUBIN KERNEL TOKENS_PER_BLOCK HEADS_PER_BLOCK BLOCK_THREADS T H D
//
// The kernel's launch shape comes from its manifest entry (bench/gpu/peer_harness.sh reads it).
// Switches, from the environment: VEC_PRODUCER=1 a linear 16-byte copy (one piece per thread, as
// torch's elementwise kernels write), ATTN_PRODUCER=1 a block per 64-token tile and head (as
// prefill attention writes its output), else a grid-stride int copy; LIB_LOAD=1 loads the CUBIN
// with cuLibraryLoadFromFile (as the Python and C hosts do) instead of cuModuleLoad (Rust);
// NOSTRIDES=1 launches a kernel rendered without its six stride parameters (an experiment).
#include <cuda.h>
#include <cuda_runtime.h>
#include <flashinfer/attention/cascade.cuh>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
__global__ void producer(int* dst, const int* src, size_t n) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) dst[i] = src[i];
}
__global__ void producer_vec(int4* dst, const int4* src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}
// Attention-like producer: a block per (64-token tile, head), as prefill attention kernels write
// their output [T, H, D] and lse (FlashAttention's grid is (query tiles, heads, batch)); each
// thread copies 16-byte pieces of its block's rows of both inputs and their lse.
__global__ void producer_attn(char* dst, const char* src, long long T, long long H, long long D, size_t vb) {
    const long long t0 = (long long)blockIdx.x * 64, h = blockIdx.y;
    const long long row_bytes = D * 2, pieces = row_bytes / 16;
    for (long long i = threadIdx.x; i < 64 * pieces; i += blockDim.x) {
        long long t = t0 + i / pieces, k = i % pieces;
        if (t >= T) break;
        size_t off = ((size_t)(t * H + h)) * row_bytes + k * 16;
        *(int4*)(dst + off) = *(const int4*)(src + off);
        *(int4*)(dst + vb + off) = *(const int4*)(src + vb + off);
    }
    const size_t rows = (size_t)T * H;
    for (long long i = threadIdx.x; i < 64; i += blockDim.x) {
        long long t = t0 + i;
        if (t >= T) break;
        for (int k = 0; k < 4; ++k) {  // hm prefix, hm suffix, tm prefix (b2), tm suffix (b2)
            size_t at = k < 2 ? (size_t)(h * T + t) : (size_t)(t * H + h);
            ((float*)(dst + 2 * vb))[k * rows + at] = ((const float*)(src + 2 * vb))[k * rows + at];
        }
    }
}
#define CK(...) do { auto ck_status_ = (__VA_ARGS__); if (ck_status_) { printf("%s failed %d line %d\n", #__VA_ARGS__, (int)ck_status_, __LINE__); exit(1); } } while (0)
int main(int argc, char** argv) {
    const char* cubin = argv[1]; const char* name = argv[2];
    unsigned tpb = atoi(argv[3]), hpb = atoi(argv[4]), threads = atoi(argv[5]);
    long long T = atoll(argv[6]), H = atoll(argv[7]), D = atoll(argv[8]);
    CK(cudaFree(0));
    CUmodule mod; CUfunction fn;
    if (getenv("LIB_LOAD")) {
        CUlibrary lib; CUkernel kern;
        CK(cuLibraryLoadFromFile(&lib, cubin, nullptr, nullptr, 0, nullptr, nullptr, 0));
        CK(cuLibraryGetKernel(&kern, lib, name)); CK(cuKernelGetFunction(&fn, kern));
    } else {
        CK(cuModuleLoad(&mod, cubin)); CK(cuModuleGetFunction(&fn, mod, name));
    }
    size_t rows = T * H, vb = rows * D * 2, lb = rows * 4;
    size_t total = 2 * vb + 4 * lb;
    char *arena, *src; void *out; float* out_lse;
    CK(cudaMalloc(&arena, total)); CK(cudaMalloc(&src, total)); CK(cudaMalloc(&out, vb)); CK(cudaMalloc(&out_lse, lb));
    CK(cudaMemset(src, 0, total));
    void* p = arena; void* s = arena + vb; float* pl = (float*)(arena + 2 * vb); float* sl = pl + rows;
    float* pl2 = sl + rows; float* sl2 = pl2 + rows;
    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    long long ts = H * D, hs = D, n = T;
    void* args_all[] = {&out, &out_lse, &p, &pl, &s, &sl, &T, &H, &ts, &hs, &ts, &hs, &ts, &hs, &n};
    void* args_nostrides[] = {&out, &out_lse, &p, &pl, &s, &sl, &T, &H, &n};
    void** args = getenv("NOSTRIDES") ? args_nostrides : args_all;
    unsigned gx = (T + tpb - 1) / tpb, gy = (H + hpb - 1) / hpb;
    const int R = 20;
    auto graph = [&](int which) {
        cudaGraph_t g; cudaGraphExec_t e;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < R; ++i) {
            if (getenv("ATTN_PRODUCER")) producer_attn<<<dim3((T + 63) / 64, H), 128, 0, st>>>(arena, src, T, H, D, vb);
            else if (getenv("VEC_PRODUCER")) producer_vec<<<(total / 16 + 127) / 128, 128, 0, st>>>((int4*)arena, (const int4*)src, total / 16);
            else producer<<<264, 256, 0, st>>>((int*)arena, (const int*)src, total / 4);
            if (which == 1) CK(cuLaunchKernel(fn, gx, gy, 1, threads, 1, 1, 0, st, args, nullptr));
            if (which == 2) CK(flashinfer::MergeState<nv_bfloat16, nv_bfloat16>((nv_bfloat16*)p, pl2, (nv_bfloat16*)s, sl2, (nv_bfloat16*)out, out_lse, T, H, D, st));
        }
        CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&e, g, 0)); return e;
    };
    cudaGraphExec_t gs[3] = {graph(0), graph(1), graph(2)};
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    std::vector<float> t[3];
    for (int round = 0; round < 100; ++round)
        for (int w0 = 0; w0 < 3; ++w0) {
            int w = (w0 + round) % 3;
            CK(cudaGraphLaunch(gs[w], st));
            cudaEventRecord(a, st); CK(cudaGraphLaunch(gs[w], st)); cudaEventRecord(b, st);
            cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); t[w].push_back(ms * 1e3f / R);
        }
    float med[3];
    for (int w = 0; w < 3; ++w) { std::sort(t[w].begin(), t[w].end()); med[w] = t[w][t[w].size() / 2]; }
    printf("%s T=%lld H=%lld D=%lld grid %ux%u x %u: producer %.3f; mla-gen %.3f us; flashinfer %.3f us; fi/mla %.3f\n",
           name, T, H, D, gx, gy, threads, med[0], med[1] - med[0], med[2] - med[0], (med[2] - med[0]) / (med[1] - med[0]));
    CK(cudaGetLastError());
}

// The hot-L2 bench's producer (mla-gen bench/tune --l2 hot): copies up to four byte ranges, one
// per blockIdx.y, so one launch writes every input of a merge just before the merge reads them,
// as the attention kernels before it would. 16-byte loads and stores over a grid-stride loop; a
// range's last (bytes % 16) bytes as 4-byte words (every range the bench copies is a multiple
// of 4 bytes, and every address a multiple of 16). The bench compiles this file with NVRTC for the
// GPU it runs on (src/host/bench/graph.rs).
typedef unsigned long long u64;

__device__ __forceinline__ void copy_range(const char* src, char* dst, u64 bytes) {
    const u64 n16 = bytes >> 4;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += stride) {
        d[i] = s[i];
    }
    const u64 words = (bytes & 15) >> 2;
    if (blockIdx.x == 0 && threadIdx.x < words) {
        const unsigned int* s4 = reinterpret_cast<const unsigned int*>(src + (n16 << 4));
        unsigned int* d4 = reinterpret_cast<unsigned int*>(dst + (n16 << 4));
        d4[threadIdx.x] = s4[threadIdx.x];
    }
}

extern "C" __global__ void __launch_bounds__(256) mla_gen_bench_copy(
    const char* src0, char* dst0, u64 bytes0,
    const char* src1, char* dst1, u64 bytes1,
    const char* src2, char* dst2, u64 bytes2,
    const char* src3, char* dst3, u64 bytes3) {
    switch (blockIdx.y) {
        case 0: copy_range(src0, dst0, bytes0); break;
        case 1: copy_range(src1, dst1, bytes1); break;
        case 2: copy_range(src2, dst2, bytes2); break;
        case 3: copy_range(src3, dst3, bytes3); break;
        default: break;
    }
}

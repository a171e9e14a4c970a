// Producers for the programmatic dependent launch (PDL) tests and bench: kernels that write a
// merge's inputs just before the merge runs on the same stream. Self-contained (no headers), for
// NVRTC; compiled for sm_90 by tests/pdl.rs (bench/gpu/pdl.sh build). Every copy is of 32-bit
// words, grid-stride.

__device__ __forceinline__ void trigger_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Lets a PDL-launched dependent start at once, then waits about delay_ns, then copies n_words
// from src to dst: the writes a dependent must not read come late. A dependent that reads before
// its griddepcontrol.wait sees whatever dst held before.
extern "C" __global__ void pdl_late_writer(unsigned int* dst, const unsigned int* src, long long n_words,
                                           long long delay_ns) {
    trigger_dependents();
    const unsigned long long start = global_ns();
    while (global_ns() - start < static_cast<unsigned long long>(delay_ns)) {
        asm volatile("nanosleep.u32 1000;");
    }
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_words; i += stride) {
        dst[i] = src[i];
    }
}

// The bench's producer: copies n_words from src to dst, with trigger != 0 letting a PDL-launched
// dependent begin launching first (as a producer that triggers early does), else not (the
// dependent then launches as this grid ends).
extern "C" __global__ void pdl_writer(unsigned int* dst, const unsigned int* src, long long n_words,
                                      long long trigger) {
    if (trigger != 0) trigger_dependents();
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_words; i += stride) {
        dst[i] = src[i];
    }
}

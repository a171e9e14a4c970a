// The group FP8 rule's branch-free arithmetic (templates/prelude.cu.tera: group_scale, and
// group_reciprocal without UE8M0) against the rule written plainly, on every float32 bit pattern.
// Built by bench/gpu/fp8.sh run with nvcc, once per generated group kernel it includes:
//
//   nvcc -arch=sm_90 -DGROUP_KERNEL='"K.cu"' [-DUE8M0] bench/gpu/fp8_div_check.cu
//
// 1. group_scale(max(x, 1e-10)) for all 2^32 x (the kernels' absmax starts at 1e-10, so this is
//    every value group_scale can see, +inf included) against the rule: scale = max(x, 1e-10) x
//    RN(1/448) (__fmul_rn, vLLM's rule), with UE8M0 2^ceil(log2f(scale)) taken plainly (the
//    kernel calls log2f only for mantissas below 2^7: this checks that bound on every input),
//    and inverse = __frcp_rn(scale). Both must match bit for bit.
// 2. Without UE8M0, group_reciprocal(x) against __frcp_rn(x) for all 2^32 x: every difference
//    inside [2^-43, 2^120] and +inf (the scales' range) is a failure; those outside it are only
//    counted (the kernels never pass such a value).
// Prints the counts; exits 1 on a failure. (Under NVRTC only the device part is compiled: a
// check of the source where no nvcc is at hand.)
#ifndef __CUDACC_RTC__
#include <cstdio>
#endif
#include GROUP_KERNEL

#ifdef UE8M0
constexpr bool kUe8m0 = true;
#else
constexpr bool kUe8m0 = false;
#endif

// counts: inputs, scale differs, inverse differs, reciprocal inputs in range, differs in range,
// differs outside the range
__global__ void check(unsigned long long* counts) {
    unsigned long long c[6] = {0, 0, 0, 0, 0, 0};
    const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i <= 0xffffffffull; i += stride) {
        const float x = __uint_as_float(static_cast<unsigned int>(i));
        const float floored = fmaxf(x, 1e-10f);
        const GroupScale got = group_scale(floored);
        float scale = __fmul_rn(floored, 1.0f / 448.0f);
        if (kUe8m0) {
            const unsigned int bits = __float_as_uint(scale);
            const float l = log2f(scale);  // 2^ceil(log2f(scale)), as vLLM rounds up
            if (bits & 0x7fffffu) scale = __uint_as_float((bits & 0xff800000u) + (l == truncf(l) ? 0u : 0x800000u));
        }
        const float inverse = __frcp_rn(scale);
        c[0] += 1;
        c[1] += __float_as_uint(got.scale) != __float_as_uint(scale);
        c[2] += __float_as_uint(got.inverse) != __float_as_uint(inverse);
#ifndef UE8M0
        const bool in_range = (x >= 0x1p-43f && x <= 0x1p120f) || x == INF;
        const bool differs = __float_as_uint(group_reciprocal(x)) != __float_as_uint(__frcp_rn(x));
        c[3] += in_range;
        c[4] += in_range && differs;
        c[5] += !in_range && differs;
#endif
    }
    for (int k = 0; k < 6; ++k) atomicAdd(&counts[k], c[k]);
}

#ifndef __CUDACC_RTC__
int main() {
    unsigned long long* d;
    unsigned long long h[6];
    if (cudaMalloc(&d, sizeof h) != cudaSuccess || cudaMemset(d, 0, sizeof h) != cudaSuccess) {
        std::printf("fp8_div_check: no device\n");
        return 1;
    }
    check<<<132 * 16, 256>>>(d);
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess || cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) {
        std::printf("fp8_div_check: %s\n", cudaGetErrorString(err));
        return 1;
    }
    const bool all = h[0] == 0x100000000ull;
    std::printf("group_scale (%s): %llu float32 inputs, scale differs %llu, inverse differs %llu\n",
                kUe8m0 ? "ue8m0" : "float32 scale", h[0], h[1], h[2]);
    bool ok = all && h[1] == 0 && h[2] == 0;
    if (!kUe8m0) {
        std::printf("group_reciprocal: %llu inputs in [2^-43, 2^120] or +inf, differ %llu; "
                    "outside that range (never a scale) %llu differ\n", h[3], h[4], h[5]);
        ok = ok && h[3] > 0 && h[4] == 0;
    }
    std::printf("fp8_div_check %s: %s\n", kUe8m0 ? "ue8m0" : "f32", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
#endif

/* Stub CUDA driver functions for the C launcher checks (no GPU): they record which image was
 * loaded and the last launch's grid, block and first 16 parameters (each 8 bytes). Include it in
 * exactly one file of a test program. */
#ifndef MLA_DRIVER_STUB_H
#define MLA_DRIVER_STUB_H

#include <string.h>

static int loaded_images, launches;
static unsigned last_grid[3], last_block;
static long long last_params[16];
static int stub_cc_major = 9;
/* How many parameters the next launch has (the stub cannot know). */
static int param_count = 15;

CUresult cuCtxGetDevice(CUdevice* d) { *d = 0; return CUDA_SUCCESS; }
CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
    (void)d;
    *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? stub_cc_major : 0;
    return CUDA_SUCCESS;
}
CUresult cuModuleLoadData(CUmodule* m, const void* image) {
    /* A CUBIN is an ELF image; PTX is text. The stub records which one was chosen. */
    loaded_images += memcmp(image, "\x7f" "ELF", 4) == 0 ? 1 : 1000;
    *m = (CUmodule)(uintptr_t)1;
    return CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
    (void)m; (void)name;
    *f = (CUfunction)(uintptr_t)2;
    return CUDA_SUCCESS;
}
CUresult cuModuleUnload(CUmodule m) { (void)m; return CUDA_SUCCESS; }
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shmem, CUstream s, void** params, void** extra) {
    (void)f; (void)by; (void)bz; (void)shmem; (void)s; (void)extra;
    launches++;
    last_grid[0] = gx; last_grid[1] = gy; last_grid[2] = gz; last_block = bx;
    for (int i = 0; i < param_count; ++i) last_params[i] = *(long long*)params[i];
    return CUDA_SUCCESS;
}

#endif /* MLA_DRIVER_STUB_H */

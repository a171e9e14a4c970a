/* A stand-in libcuda.so.1 for python/tests/test_extension_cpu.py and test_faults_cpu.py: the
 * driver functions the compiled op (python/csrc/driver/cuda.h) and the Python path (mla_gen/_cuda.py)
 * open, on no GPU. One device of compute capability 9.0 whose primary context is always current; a
 * kernel's handle (and its function's) is a copy of its name, so each launch records which kernel
 * ran, its grid, block and parameters (8 bytes each; the launcher ends the array with NULL), in the
 * exported globals below, read by the tests with ctypes. Faults on demand: a nonzero
 * stub_load_error / stub_launch_error is what every cuLibraryLoadData / launch returns. */
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
int stub_launches, stub_grid[2], stub_block, stub_nparams, stub_loads;
int stub_load_error, stub_launch_error;
long long stub_params[32];
char stub_kernel[256];

CUresult cuGetErrorName(CUresult r, const char** name) {
    switch (r) {
    case 2: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case 200: *name = "CUDA_ERROR_INVALID_IMAGE"; break;
    case 222: *name = "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"; break;
    case 700: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    default: *name = "CUDA_ERROR_STUB";
    }
    return 0;
}
/* The few more the Python path opens, so that both paths can share this driver in one process. */
CUresult cuInit(unsigned flags) { (void)flags; return 0; }
CUresult cuDriverGetVersion(int* v) { *v = 12080; return 0; } /* CUDA 12.8 */
CUresult cuGetErrorString(CUresult r, const char** s) { (void)r; *s = "stub driver"; return 0; }
CUresult cuDeviceGet(int* d, int ordinal) { *d = ordinal; return 0; }
CUresult cuCtxGetDevice(int* d) { *d = 0; return 0; }
CUresult cuCtxGetCurrent(void** c) { *c = (void*)0xC0; return 0; }
CUresult cuCtxPushCurrent_v2(void* c) { (void)c; return 0; }
CUresult cuCtxPopCurrent_v2(void** c) { *c = (void*)0xC0; return 0; }
CUresult cuDevicePrimaryCtxRetain(void** c, int d) { (void)d; *c = (void*)0xC0; return 0; }
CUresult cuDeviceGetAttribute(int* v, int attr, int d) { (void)d; *v = attr == 75 ? 9 : 0; return 0; }
CUresult cuLibraryLoadData(void** lib, const void* code, void* a, void* b, unsigned c, void* e, void* f,
                           unsigned g) {
    (void)code; (void)a; (void)b; (void)c; (void)e; (void)f; (void)g;
    if (stub_load_error) return stub_load_error;
    *lib = (void*)0x1000;
    stub_loads++;
    return 0;
}
/* A copy: the caller's name may not outlive the call (Python's bytes). */
CUresult cuLibraryGetKernel(void** k, void* lib, const char* name) { (void)lib; *k = strdup(name); return 0; }
CUresult cuKernelGetFunction(void** f, void* k) { *f = k; return 0; }
CUresult cuLibraryUnload(void* lib) { (void)lib; return 0; }
/* The values through kernelParams (ending with NULL) or through extra: {BUFFER_POINTER (1), the
 * buffer, BUFFER_SIZE (2), &bytes, END (0)}, as the launcher passes them; else an error. */
static CUresult record(void* f, unsigned gx, unsigned gy, unsigned bx, void** params, void** extra) {
    if (params ? extra != NULL
               : !extra || extra[0] != (void*)1 || extra[2] != (void*)2 || extra[4] != (void*)0 ||
                     *(size_t*)extra[3] % 8 != 0 || *(size_t*)extra[3] > sizeof stub_params)
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    if (stub_launch_error) return stub_launch_error;
    /* a handle below 64K is not a name (a test's fake function, e.g. the Python path's 0xF00) */
    strncpy(stub_kernel, (unsigned long)f < 0x10000 ? "?" : (const char*)f, sizeof stub_kernel - 1);
    stub_grid[0] = (int)gx; stub_grid[1] = (int)gy; stub_block = (int)bx;
    if (params) {
        for (stub_nparams = 0; stub_nparams < 32 && params[stub_nparams]; ++stub_nparams)
            stub_params[stub_nparams] = *(long long*)params[stub_nparams];
    } else {
        memcpy(stub_params, extra[1], *(size_t*)extra[3]);
        stub_nparams = (int)(*(size_t*)extra[3] / 8);
    }
    stub_launches++;
    return 0;
}
CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, void* s, void** params, void** extra) {
    (void)gz; (void)by; (void)bz; (void)shmem; (void)s;
    return record(f, gx, gy, bx, params, extra);
}
CUresult cuLaunchKernelEx(const unsigned* config, void* f, void** params, void** extra) {
    return record(f, config[0], config[1], config[3], params, extra);
}

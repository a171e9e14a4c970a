/* A stand-in libcuda.so.1 for the Rust runtime's fault tests (tests/faults.rs), no GPU: the
 * module API the runtime uses through cudarc (cuModuleLoadData, cuModuleGetFunction,
 * cuFuncGetParamInfo, cuFuncGetParamCount, cuLaunchKernel[Ex]) on one device of compute
 * capability stub_cc.
 *
 * Like a driver, cuModuleLoadData reads only the header of what it is given (an ELF CUBIN, or PTX
 * text whose .version it checks against ISA 9.0, a CUDA 13.0 driver's); it cannot know where the
 * buffer ends, which is why the runtime must check the size first. Faults are injected through
 * the stub_* functions, which the test resolves from this library: a failing load or launch, a
 * sticky error (every later load and launch fails until cleared, as in a context a kernel faulted
 * in), the parameter count cuFuncGetParamInfo reports (-1: a driver that cannot say), and
 * whether cuFuncGetParamCount answers (0 by default: as a CUDA 13.0 driver, which lacks it). Every
 * parameter query that fails is counted (stub_failed_queries): compute-sanitizer reports each. */
#include <cuda.h>

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_int stub_cc = 90;
static atomic_int stub_params = -1;
static atomic_int stub_counts = 0;
static atomic_int stub_sticky = CUDA_SUCCESS;
static atomic_int stub_load_countdown = -1; /* loads before one fails with stub_load_error */
static atomic_int stub_load_error = CUDA_SUCCESS;
static atomic_int stub_launch_error = CUDA_SUCCESS; /* what the next launch returns */
static atomic_int loads, live, launches, failed_queries;
static _Thread_local CUcontext current;
static int the_context;

void stub_set_cc(int cc) { atomic_store(&stub_cc, cc); }
void stub_set_params(int n) { atomic_store(&stub_params, n); }
void stub_set_counts(int on) { atomic_store(&stub_counts, on); }
void stub_set_sticky(int r) { atomic_store(&stub_sticky, r); }
void stub_fail_load(int after, int r) {
    atomic_store(&stub_load_error, r);
    atomic_store(&stub_load_countdown, after);
}
void stub_fail_launch(int r) { atomic_store(&stub_launch_error, r); }
int stub_loads(void) { return atomic_load(&loads); }
int stub_live(void) { return atomic_load(&live); }
int stub_launches(void) { return atomic_load(&launches); }
int stub_failed_queries(void) { return atomic_load(&failed_queries); }

CUresult cuInit(unsigned flags) { return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

CUresult cuDriverGetVersion(int* v) {
    *v = 13000;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) *v = atomic_load(&stub_cc) / 10;
    else if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) *v = atomic_load(&stub_cc) % 10;
    else if (a == CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) *v = 1;
    else *v = 0;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
    (void)d;
    *c = (CUcontext)&the_context;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    (void)d;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* c) {
    *c = current;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext c) {
    current = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) { return (CUresult)atomic_load(&stub_sticky); }

CUresult cuGetErrorName(CUresult r, const char** name) {
    switch (r) {
#define NAME(e) case e: *name = #e; return CUDA_SUCCESS;
    NAME(CUDA_SUCCESS)
    NAME(CUDA_ERROR_INVALID_VALUE)
    NAME(CUDA_ERROR_OUT_OF_MEMORY)
    NAME(CUDA_ERROR_INVALID_IMAGE)
    NAME(CUDA_ERROR_INVALID_CONTEXT)
    NAME(CUDA_ERROR_INVALID_PTX)
    NAME(CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
    NAME(CUDA_ERROR_NOT_FOUND)
    NAME(CUDA_ERROR_NOT_SUPPORTED)
    NAME(CUDA_ERROR_ILLEGAL_ADDRESS)
    NAME(CUDA_ERROR_LAUNCH_FAILED)
#undef NAME
    default: *name = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult cuGetErrorString(CUresult r, const char** s) { return cuGetErrorName(r, s); }

CUresult cuModuleLoadData(CUmodule* m, const void* image) {
    const CUresult sticky = (CUresult)atomic_load(&stub_sticky);
    if (sticky != CUDA_SUCCESS) return sticky;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    /* Count down while >= 0; the load that finds it at 0 fails. */
    int left = atomic_load(&stub_load_countdown);
    while (left >= 0 && !atomic_compare_exchange_weak(&stub_load_countdown, &left, left - 1)) {}
    if (left == 0) return (CUresult)atomic_load(&stub_load_error);
    if (memcmp(image, "\x7f" "ELF", 4) != 0) {
        const char* v = strstr((const char*)image, ".version ");
        int major = 0, minor = 0;
        if (!v || sscanf(v, ".version %d.%d", &major, &minor) != 2) return CUDA_ERROR_INVALID_PTX;
        if (major * 10 + minor > 90) return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
    }
    *m = (CUmodule)malloc(1);
    atomic_fetch_add(&loads, 1);
    atomic_fetch_add(&live, 1);
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule m) {
    free(m);
    atomic_fetch_sub(&live, 1);
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
    const CUresult sticky = (CUresult)atomic_load(&stub_sticky);
    if (sticky != CUDA_SUCCESS) return sticky;
    if (!name[0]) return CUDA_ERROR_NOT_FOUND;
    *f = (CUfunction)m;
    return CUDA_SUCCESS;
}

static CUresult query(CUresult r) {
    if (r != CUDA_SUCCESS) atomic_fetch_add(&failed_queries, 1);
    return r;
}

CUresult cuFuncGetParamInfo(CUfunction f, size_t index, size_t* offset, size_t* size) {
    const int n = atomic_load(&stub_params);
    if (!f) return query(CUDA_ERROR_INVALID_VALUE);
    if (n < 0) return query(CUDA_ERROR_NOT_SUPPORTED);
    if (index >= (size_t)n) return query(CUDA_ERROR_INVALID_VALUE);
    *offset = 8 * index;
    *size = 8;
    return CUDA_SUCCESS;
}

CUresult cuFuncGetParamCount(CUfunction f, size_t* count) {
    const int n = atomic_load(&stub_params);
    /* Off: stands for a driver without the function, so the refusal is not counted. */
    if (!atomic_load(&stub_counts)) return CUDA_ERROR_NOT_SUPPORTED;
    if (n < 0) return query(CUDA_ERROR_NOT_SUPPORTED);
    if (!f) return query(CUDA_ERROR_INVALID_VALUE);
    *count = (size_t)n;
    return CUDA_SUCCESS;
}

static CUresult stub_launch(CUfunction f, void** params) {
    const CUresult sticky = (CUresult)atomic_load(&stub_sticky);
    if (sticky != CUDA_SUCCESS) return sticky;
    if (!f || !params || !current) return CUDA_ERROR_INVALID_VALUE;
    const CUresult once = (CUresult)atomic_exchange(&stub_launch_error, CUDA_SUCCESS);
    if (once != CUDA_SUCCESS) return once;
    atomic_fetch_add(&launches, 1);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shmem, CUstream s, void** params, void** extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)s; (void)extra;
    return stub_launch(f, params);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
    (void)c; (void)extra;
    return stub_launch(f, params);
}

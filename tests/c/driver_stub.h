/* Stub CUDA driver functions for the C launcher checks (no GPU). Include it, after cuda.h, in
 * exactly one file of a test program (or build it into a stand-in libcuda.so, as .ci/c.sh does).
 *
 * It simulates STUB_DEVICES devices of the compute capabilities in stub_cc; the current context's
 * device is per thread (stub_device), as a real current context is. It counts libraries loaded
 * (CUBIN or PTX, and for which arch) and live, and launches, and keeps the last launch's kernel,
 * grid, block and parameters (each 8 bytes, through kernelParams ending with NULL or extra's one
 * buffer, as the launcher passes them; anything else fails the launch), and whether it
 * came through cuLaunchKernelEx with programmatic stream serialization. Failures can be
 * injected: no current context, the Nth library load, the next kernel lookup in a loaded library,
 * the next launch, and a sticky error (every
 * load and launch fails with it until cleared, as in a context a kernel faulted in). */
#ifndef MLA_DRIVER_STUB_H
#define MLA_DRIVER_STUB_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define STUB_DEVICES 5
/* Device ordinal -> major * 10 + minor. */
static int stub_cc[STUB_DEVICES] = { 90, 90, 86, 75, 100 };
static _Thread_local int stub_device = 0;
static _Thread_local int stub_no_context = 0;   /* 1: no current context on this thread */
static atomic_int stub_fail_load = -1;          /* loads before one fails; -1 = none fails */
static CUresult stub_launch_result = CUDA_SUCCESS; /* what the next launch returns */
static _Atomic CUresult stub_sticky = CUDA_SUCCESS; /* what every load and launch returns while set */
static atomic_int stub_fail_get_kernel = 0;     /* 1: the next cuLibraryGetKernel fails */

/* The hint the launcher appends where no context is current. */
#define NO_CONTEXT " (no CUDA context is current on this thread: make one current first, e.g. cudaSetDevice, or " \
                   "cuInit, cuDevicePrimaryCtxRetain and cuCtxSetCurrent)"

/* The hint the launcher appends to a sticky error's message. */
#define STICKY " (a sticky error: a kernel faulted earlier in this CUDA context, which is now unusable; every later " \
               "call in it fails the same way: recreate the context, or restart the process)"

static atomic_int cubins_loaded, ptx_loaded, libraries_live, launches;
static int last_loaded_arch;                   /* 90 for sm_90: the arch of the last image loaded */
static unsigned last_grid[3], last_block, last_shared;
static const char* last_kernel = "";          /* the name of the kernel last launched */
static long long last_params[32];
static int last_param_count; /* the launcher ends its parameter array with NULL */
static long stub_load_spin;  /* busy-wait in each library load: widens races in thread tests */
static atomic_flag stub_record = ATOMIC_FLAG_INIT; /* launches from many threads record one by one */

CUresult cuGetErrorName(CUresult r, const char** name) {
    switch (r) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; return CUDA_SUCCESS;
    case CUDA_ERROR_LAUNCH_FAILED: *name = "CUDA_ERROR_LAUNCH_FAILED"; return CUDA_SUCCESS;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; return CUDA_SUCCESS;
    default: *name = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult cuCtxGetDevice(CUdevice* d) {
    if (stub_no_context) return CUDA_ERROR_INVALID_CONTEXT;
    *d = stub_device;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
    if (d < 0 || d >= STUB_DEVICES) return CUDA_ERROR_INVALID_VALUE;
    if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) *v = stub_cc[d] / 10;
    else if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) *v = stub_cc[d] % 10;
    else return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* A CUBIN is an ELF image whose e_flags carry its SM (bits 8-15); PTX is text with ".target sm_XY". */
static int stub_image_arch(const unsigned char* image, int* cubin) {
    *cubin = memcmp(image, "\x7f" "ELF", 4) == 0;
    if (*cubin) {
        uint32_t flags;
        memcpy(&flags, image + 48, 4);
        return (int)((flags >> 8) & 0xff);
    }
    const char* t = strstr((const char*)image, ".target sm_");
    return t ? atoi(t + strlen(".target sm_")) : -1;
}

CUresult cuLibraryLoadData(CUlibrary* lib, const void* code, CUjit_option* jo, void** jv, unsigned nj,
                           CUlibraryOption* lo, void** lv, unsigned nl) {
    (void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
    if (stub_sticky != CUDA_SUCCESS) return stub_sticky;
    /* Decrement the countdown while it is >= 0; the load that finds it at 0 fails. */
    int left = atomic_load(&stub_fail_load);
    while (left >= 0 && !atomic_compare_exchange_weak(&stub_fail_load, &left, left - 1)) {}
    if (left == 0) return CUDA_ERROR_OUT_OF_MEMORY;
    for (volatile long spin = 0; spin < stub_load_spin; spin = spin + 1) {}
    int cubin;
    last_loaded_arch = stub_image_arch((const unsigned char*)code, &cubin);
    atomic_fetch_add(cubin ? &cubins_loaded : &ptx_loaded, 1);
    *lib = (CUlibrary)(uintptr_t)(0x1000 + 16 * atomic_fetch_add(&libraries_live, 1));
    return CUDA_SUCCESS;
}

/* A kernel's handle is its name (the launcher's, which lives as long as the program): a launch
 * records which kernel it ran. */
CUresult cuLibraryGetKernel(CUkernel* k, CUlibrary lib, const char* name) {
    (void)lib;
    if (atomic_exchange(&stub_fail_get_kernel, 0)) return CUDA_ERROR_INVALID_VALUE;
    *k = (CUkernel)(uintptr_t)name;
    return CUDA_SUCCESS;
}

CUresult cuLibraryUnload(CUlibrary lib) {
    (void)lib;
    atomic_fetch_sub(&libraries_live, 1);
    return CUDA_SUCCESS;
}

/* One launch, plain (ex = 0) or through cuLaunchKernelEx with its programmatic stream
 * serialization attribute's value (pss; -1 when the attribute is absent). */
static int last_launch_ex, last_pss;
static atomic_int launches_ex;
static CUresult stub_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned shmem,
                            void** params, void** extra, int ex, int pss) {
    if (!f || stub_no_context) return CUDA_ERROR_INVALID_CONTEXT;
    if (stub_sticky != CUDA_SUCCESS) return stub_sticky;
    /* The values come one way: kernelParams, or extra as the driver reads it (the buffer of
     * 8-byte values and its size, each behind its key, then the end). */
    if (params ? extra != NULL
               : !extra || extra[0] != CU_LAUNCH_PARAM_BUFFER_POINTER || extra[2] != CU_LAUNCH_PARAM_BUFFER_SIZE ||
                     extra[4] != CU_LAUNCH_PARAM_END || *(const size_t*)extra[3] % 8 != 0 ||
                     *(const size_t*)extra[3] > sizeof last_params)
        return CUDA_ERROR_INVALID_VALUE;
    if (stub_launch_result != CUDA_SUCCESS) {
        const CUresult r = stub_launch_result;
        stub_launch_result = CUDA_SUCCESS;
        return r;
    }
    while (atomic_flag_test_and_set(&stub_record)) {}
    atomic_fetch_add(&launches, 1);
    if (ex) atomic_fetch_add(&launches_ex, 1);
    last_launch_ex = ex; last_pss = pss;
    last_kernel = (const char*)(uintptr_t)f;
    last_grid[0] = gx; last_grid[1] = gy; last_grid[2] = gz; last_block = bx; last_shared = shmem;
    if (params) {
        for (last_param_count = 0; last_param_count < 32 && params[last_param_count]; ++last_param_count)
            last_params[last_param_count] = *(long long*)params[last_param_count];
    } else {
        const size_t bytes = *(const size_t*)extra[3];
        memcpy(last_params, extra[1], bytes);
        last_param_count = (int)(bytes / 8);
    }
    atomic_flag_clear(&stub_record);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shmem, CUstream s, void** params, void** extra) {
    (void)by; (void)bz; (void)s;
    return stub_launch(f, gx, gy, gz, bx, shmem, params, extra, 0, -1);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
    int pss = -1;
    for (unsigned i = 0; i < c->numAttrs; ++i)
        if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
            pss = c->attrs[i].value.programmaticStreamSerializationAllowed;
    return stub_launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->sharedMemBytes, params, extra, 1, pss);
}

#endif /* MLA_DRIVER_STUB_H */

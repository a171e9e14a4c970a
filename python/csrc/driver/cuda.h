/* A stand-in for the CUDA toolkit's cuda.h, for the mla_gen extension: the few driver types,
 * constants and functions the generated C launcher (mla_kernels.c) and the op use, so that the
 * extension builds without a CUDA toolkit. The functions are pointers that driver.c fills from
 * libcuda.so.1 with dlopen at the first launch (never at import: the extension loads, and its ops
 * register, on machines without a GPU). Values and layouts are the CUDA driver API's (12.0+);
 * python/tests/test_extension_cpu.py compares them with a real cuda.h where one exists. */
#ifndef MLA_GEN_DRIVER_CUDA_H
#define MLA_GEN_DRIVER_CUDA_H

#include <stddef.h>

#define CUDA_VERSION 12000 /* the API level the launcher needs (cuLibraryLoadData) */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_CONTEXT = 201
} CUresult;

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;
typedef struct CUfunc_st* CUfunction;
typedef struct CUlib_st* CUlibrary;
typedef struct CUkern_st* CUkernel;

typedef enum CUdevice_attribute_enum {
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
} CUdevice_attribute;

typedef enum CUjit_option_enum { CU_JIT_MAX_REGISTERS = 0 } CUjit_option;
typedef enum CUlibraryOption_enum { CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE = 0 } CUlibraryOption;

typedef enum CUlaunchAttributeID_enum {
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
} CUlaunchAttributeID;

typedef union CUlaunchAttributeValue_union {
    char pad[64];
    int programmaticStreamSerializationAllowed;
} CUlaunchAttributeValue;

typedef struct CUlaunchAttribute_st {
    CUlaunchAttributeID id;
    char pad[8 - sizeof(CUlaunchAttributeID)];
    CUlaunchAttributeValue value;
} CUlaunchAttribute;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute* attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* cuLaunchKernel's `extra`: the parameters as one buffer, its size, the end of the list. */
#define CU_LAUNCH_PARAM_END ((void*)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void*)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void*)0x02)

/* Every driver function used, as (name, return, parameters): the pointers, their declarations
 * and driver.c's lookups all come from this one list. The names are libcuda's exported symbols
 * (the _v2 ones are what cuda.h's macros name). */
#define MLA_GEN_DRIVER_FUNCTIONS(X)                                                                        \
    X(cuGetErrorName, (CUresult error, const char** name))                                                 \
    X(cuCtxGetDevice, (CUdevice * device))                                                                 \
    X(cuCtxGetCurrent, (CUcontext * ctx))                                                                  \
    X(cuCtxPushCurrent_v2, (CUcontext ctx))                                                                \
    X(cuCtxPopCurrent_v2, (CUcontext * ctx))                                                               \
    X(cuDevicePrimaryCtxRetain, (CUcontext * ctx, CUdevice device))                                        \
    X(cuDeviceGetAttribute, (int* value, CUdevice_attribute attribute, CUdevice device))                   \
    X(cuLibraryLoadData, (CUlibrary * library, const void* code, CUjit_option* jit_options,                \
                          void** jit_values, unsigned int n_jit, CUlibraryOption* library_options,          \
                          void** library_values, unsigned int n_library))                                  \
    X(cuLibraryGetKernel, (CUkernel * kernel, CUlibrary library, const char* name))                        \
    X(cuLibraryUnload, (CUlibrary library))                                                                \
    X(cuLaunchKernel, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,     \
                       unsigned int by, unsigned int bz, unsigned int shared_bytes, CUstream stream,        \
                       void** params, void** extra))                                                       \
    X(cuLaunchKernelEx, (const CUlaunchConfig* config, CUfunction f, void** params, void** extra))

#define MLA_GEN_DRIVER_DECLARE(name, params) extern CUresult(*mla_gen_##name) params;
MLA_GEN_DRIVER_FUNCTIONS(MLA_GEN_DRIVER_DECLARE)
#undef MLA_GEN_DRIVER_DECLARE

/* The launcher calls the driver by its API names; here they are the pointers. */
#define cuGetErrorName mla_gen_cuGetErrorName
#define cuCtxGetDevice mla_gen_cuCtxGetDevice
#define cuCtxGetCurrent mla_gen_cuCtxGetCurrent
#define cuCtxPushCurrent mla_gen_cuCtxPushCurrent_v2
#define cuCtxPopCurrent mla_gen_cuCtxPopCurrent_v2
#define cuDevicePrimaryCtxRetain mla_gen_cuDevicePrimaryCtxRetain
#define cuDeviceGetAttribute mla_gen_cuDeviceGetAttribute
#define cuLibraryLoadData mla_gen_cuLibraryLoadData
#define cuLibraryGetKernel mla_gen_cuLibraryGetKernel
#define cuLibraryUnload mla_gen_cuLibraryUnload
#define cuLaunchKernel mla_gen_cuLaunchKernel
#define cuLaunchKernelEx mla_gen_cuLaunchKernelEx

/* Open the driver once (thread-safe; later calls return the first result at the cost of one
 * atomic load). 0: every function found. Otherwise -1 and the reason in `mla_gen_driver_error()`.
 * $MLA_GEN_LIBCUDA names another library to open (tests: a stand-in driver). */
int mla_gen_driver_open(void);
const char* mla_gen_driver_error(void);

#ifdef __cplusplus
}
#endif

#endif /* MLA_GEN_DRIVER_CUDA_H */

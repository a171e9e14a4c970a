/* The CUDA driver for the mla_gen extension: libcuda.so.1 opened with dlopen at the first launch,
 * its functions looked up once (cuda.h here declares them as pointers). No toolkit is needed to
 * build, and the extension loads where there is no driver (its ops then fail at launch only). */
#include "cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(__GLIBC__) && defined(__x86_64__)
/* The dl functions' first versions, which every glibc has (in libdl.so.2 before 2.34, in libc
 * after): bound to the 2.34 ones the binary would need glibc 2.34, not torch's 2.28. */
__asm__(".symver dlopen,dlopen@GLIBC_2.2.5");
__asm__(".symver dlsym,dlsym@GLIBC_2.2.5");
__asm__(".symver dlerror,dlerror@GLIBC_2.2.5");
#endif

#define MLA_GEN_DRIVER_DEFINE(name, params) CUresult(*mla_gen_##name) params = NULL;
MLA_GEN_DRIVER_FUNCTIONS(MLA_GEN_DRIVER_DEFINE)
#undef MLA_GEN_DRIVER_DEFINE

/* 0: not tried yet, 1: open, -1: failed (the reason in mla_gen_driver_message). */
static atomic_int mla_gen_driver_state;
static pthread_mutex_t mla_gen_driver_lock = PTHREAD_MUTEX_INITIALIZER;
static char mla_gen_driver_message[512];

static int mla_gen_driver_try(void) {
    const char* path = getenv("MLA_GEN_LIBCUDA");
    if (!path || !*path) path = "libcuda.so.1";
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(mla_gen_driver_message, sizeof mla_gen_driver_message,
                 "cannot open the CUDA driver (%s): %s; install the NVIDIA driver (it provides libcuda.so.1; the "
                 "kernels need a GPU and its driver), or set $MLA_GEN_LIBCUDA to the driver library's path",
                 path, dlerror());
        return -1;
    }
#define MLA_GEN_DRIVER_LOOKUP(name, params)                                                                     \
    *(void**)&mla_gen_##name = dlsym(h, #name);                                                                 \
    if (!mla_gen_##name) {                                                                                      \
        snprintf(mla_gen_driver_message, sizeof mla_gen_driver_message,                                         \
                 "the CUDA driver %s has no %s: a driver of CUDA 12.0 or newer is needed", path, #name);        \
        return -1;                                                                                              \
    }
    MLA_GEN_DRIVER_FUNCTIONS(MLA_GEN_DRIVER_LOOKUP)
#undef MLA_GEN_DRIVER_LOOKUP
    return 1;
}

int mla_gen_driver_open(void) {
    int state = atomic_load_explicit(&mla_gen_driver_state, memory_order_acquire);
    if (state == 0) {
        pthread_mutex_lock(&mla_gen_driver_lock);
        state = atomic_load_explicit(&mla_gen_driver_state, memory_order_relaxed);
        if (state == 0) {
            state = mla_gen_driver_try();
            atomic_store_explicit(&mla_gen_driver_state, state, memory_order_release);
        }
        pthread_mutex_unlock(&mla_gen_driver_lock);
    }
    return state == 1 ? 0 : -1;
}

const char* mla_gen_driver_error(void) { return mla_gen_driver_message; }

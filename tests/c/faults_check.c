/* Faults never crash the C launcher (issue #33), on the stub driver (driver_stub.h): each case ends
 * in a status whose message names the kernel (or file) and the fix, or in a launch, and a good call
 * works afterwards. Built twice by tests/c_faults.rs against merge_attn_states bf16 d128 (sm_90 CUBIN
 * and PTX, no size rule):
 * - as generated (images embedded): driver failures: out of memory at a first load, a failed
 *   launch, a sticky error, 32 threads making their first call at once (with and without a failing
 *   load);
 * - with -DMLA_IMAGES_FROM_FILES and -DFOLDERS="<dir>": images read from <dir>/<case>/ (folders the
 *   test wrote: good, truncated, flipped, empty, missing, longer, ptx_truncated), each checked
 *   against the manifest's size and sha256 before the driver sees it. */
#include "mla_kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "driver_stub.h"

#define T 100
#define H 8
#define D 128
#define KERNEL "merge_attn_states_bf16_d128_thr_lse"
#define CUBIN "kernels/" KERNEL ".sm_90.cubin"
#define PTX "kernels/" KERNEL ".sm_90.ptx"
#define FIX "mla-gen generate SPEC --out DIR"
#include "merge_call.h"

static int failures;
#define EXPECT(cond) do { if (!(cond)) { printf("FAILED line %d: %s (last error: %s)\n", __LINE__, #cond, mla_last_error()); failures++; } } while (0)
/* The last error holds every one of the texts given. */
#define SAYS(...) do { const char* want_[] = { __VA_ARGS__ }; \
    for (size_t i_ = 0; i_ < sizeof want_ / sizeof want_[0]; ++i_) \
        if (!strstr(mla_last_error(), want_[i_])) { \
            printf("FAILED line %d: '%s' not in '%s'\n", __LINE__, want_[i_], mla_last_error()); failures++; } } while (0)

static mla_status merge(void) {
    mla_merge_attn_states_args a = good();
    return mla_merge_attn_states_bf16_d128_thr_lse(NULL, &a);
}

/* 32 threads make their first call at once; each records its status. */
static mla_status thread_status[32];
static void* first_call(void* slot) {
    *(mla_status*)slot = merge();
    return NULL;
}
static void first_calls_at_once(void) {
    pthread_t threads[32];
    stub_load_spin = 200000;
    for (int i = 0; i < 32; ++i) EXPECT(pthread_create(&threads[i], NULL, first_call, &thread_status[i]) == 0);
    for (int i = 0; i < 32; ++i) pthread_join(threads[i], NULL);
    stub_load_spin = 0;
}
static int count_status(mla_status s) {
    int n = 0;
    for (int i = 0; i < 32; ++i) n += thread_status[i] == s;
    return n;
}

#ifndef MLA_IMAGES_FROM_FILES
static void driver_faults(void) {
    EXPECT(mla_set_image_dir("/tmp") == MLA_INVALID_ARGUMENT);
    SAYS("mla_set_image_dir: this launcher embeds its images", "-DMLA_IMAGES_FROM_FILES");
    /* Out of memory at a kernel's first load: the kernel and the driver's error, then a retry works. */
    atomic_store(&stub_fail_load, 0);
    EXPECT(merge() == MLA_CUDA_ERROR && mla_last_cuda_result() == CUDA_ERROR_OUT_OF_MEMORY);
    SAYS(KERNEL ": cuLibraryLoadData: CUDA_ERROR_OUT_OF_MEMORY", "free some and call again");
    EXPECT(libraries_live == 0 && launches == 0);
    EXPECT(merge() == MLA_OK && cubins_loaded == 1 && launches == 1);
    /* A launch the driver fails: named, then the next launch goes through. */
    stub_launch_result = CUDA_ERROR_LAUNCH_FAILED;
    EXPECT(merge() == MLA_CUDA_ERROR);
    SAYS(KERNEL ": cuLaunchKernel: CUDA_ERROR_LAUNCH_FAILED", "sticky");
    EXPECT(merge() == MLA_OK && launches == 2);
    /* A kernel elsewhere faulted: every call reports the sticky error, none hangs; loads too. */
    stub_sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
    for (int i = 0; i < 3; ++i) {
        EXPECT(merge() == MLA_CUDA_ERROR && mla_last_cuda_result() == CUDA_ERROR_ILLEGAL_ADDRESS);
        SAYS(KERNEL ": cuLaunchKernel: CUDA_ERROR_ILLEGAL_ADDRESS", "recreate the context");
    }
    EXPECT(mla_unload() == MLA_OK && libraries_live == 0);
    EXPECT(mla_load() == MLA_CUDA_ERROR);
    SAYS(": cuLibraryLoadData: CUDA_ERROR_ILLEGAL_ADDRESS", "sticky");
    EXPECT(libraries_live == 0);
    stub_sticky = CUDA_SUCCESS; /* a new context */
    EXPECT(merge() == MLA_OK && launches == 3);
    EXPECT(mla_unload() == MLA_OK);

    /* 32 first calls at once: one load, 32 launches. */
    const int loaded = cubins_loaded, launched = launches;
    first_calls_at_once();
    EXPECT(count_status(MLA_OK) == 32 && cubins_loaded == loaded + 1 && launches == launched + 32);
    EXPECT(mla_unload() == MLA_OK);
    /* ... and when that first load runs out of memory: one call says so, the next thread's load
     * succeeds, every other call launches; nothing waits forever. */
    atomic_store(&stub_fail_load, 0);
    first_calls_at_once();
    EXPECT(count_status(MLA_CUDA_ERROR) == 1 && count_status(MLA_OK) == 31);
    EXPECT(cubins_loaded == loaded + 2 && libraries_live == 1);
    EXPECT(mla_unload() == MLA_OK && libraries_live == 0);
    /* The image loads but the kernel lookup fails: the library is unloaded there, once, and
     * mla_unload does not unload it again (libraries_live would go below 0). */
    atomic_store(&stub_fail_get_kernel, 1);
    EXPECT(merge() == MLA_CUDA_ERROR && mla_last_cuda_result() == CUDA_ERROR_INVALID_VALUE);
    SAYS(KERNEL ": cuLibraryGetKernel: CUDA_ERROR_INVALID_VALUE");
    EXPECT(libraries_live == 0);
    EXPECT(mla_unload() == MLA_OK && libraries_live == 0);
    EXPECT(merge() == MLA_OK && libraries_live == 1);
    EXPECT(mla_unload() == MLA_OK && libraries_live == 0);
}
#else
/* Point the launcher at FOLDERS/<name>. */
static void use(const char* name) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", FOLDERS, name);
    EXPECT(mla_set_image_dir(dir) == MLA_OK);
}

/* The folder `name` holds a damaged or missing image: refused with the file and the fix, the
 * driver never handed it; then the good folder loads. */
static void refused(const char* name, const char* file, const char* detail) {
    const int before = cubins_loaded + ptx_loaded;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", FOLDERS, name, file);
    use(name);
    EXPECT(merge() == MLA_BAD_IMAGE);
    SAYS(KERNEL ": ", path, detail, FIX);
    printf("refused: %s\n", mla_last_error());
    EXPECT(mla_load() == MLA_BAD_IMAGE && libraries_live == 0);
    EXPECT(cubins_loaded + ptx_loaded == before);
    use("good");
    EXPECT(merge() == MLA_OK && cubins_loaded + ptx_loaded == before + 1);
    EXPECT(mla_unload() == MLA_OK && libraries_live == 0);
}

static void image_faults(void) {
    /* No folder set yet. */
    EXPECT(merge() == MLA_BAD_IMAGE);
    SAYS(KERNEL ": this launcher reads its images from files and no folder is set", "mla_set_image_dir()");
    EXPECT(mla_set_image_dir(NULL) == MLA_INVALID_ARGUMENT && mla_set_image_dir("") == MLA_INVALID_ARGUMENT);
    /* The good folder: its sha256 (computed here in C) matches the manifest's. */
    use("good");
    EXPECT(merge() == MLA_OK && cubins_loaded == 1 && launches == 1);
    EXPECT(mla_unload() == MLA_OK);
    const char* mismatch = "is not the image the manifest records";
    refused("truncated", CUBIN, mismatch);
    refused("flipped", CUBIN, mismatch);
    refused("empty", CUBIN, "0 bytes, sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    refused("longer", CUBIN, "more than");
    refused("missing", CUBIN, "the kernel folder is incomplete");
    /* A device of cc 10.0 runs the PTX (JIT), read and checked the same way. */
    stub_device = 4;
    refused("ptx_truncated", PTX, mismatch);
    EXPECT(ptx_loaded == 1);
    stub_device = 0;
    /* 32 first calls at once: the image read, checked and loaded once. */
    use("good");
    const int loaded = cubins_loaded;
    first_calls_at_once();
    EXPECT(count_status(MLA_OK) == 32 && cubins_loaded == loaded + 1);
    EXPECT(mla_unload() == MLA_OK && libraries_live == 0);
}
#endif

int main(void) {
#ifndef MLA_IMAGES_FROM_FILES
    driver_faults();
#else
    image_faults();
#endif
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures);
    return failures != 0;
}

/* A stand-in for libcuda.so.1 for bench/host_cost_stub.py --driver-stub: every function
 * the package calls on the launch path returns CUDA_SUCCESS at once, so the bench times the
 * package's ctypes calls (argument conversion, the parameter buffer) and not the driver; with
 * --compiled also the compiled op's (the C launcher's loads: cuCtxGetDevice, cuLibrary*).
 * The current context is 0xC0, the primary context the bench's stub hands out. */
int mla_gen_stub_driver = 1;
int cuInit(unsigned flags) { (void)flags; return 0; }
int cuGetErrorName(int err, const char **s) { (void)err; *s = "CUDA_ERROR_STUB"; return 0; }
int cuGetErrorString(int err, const char **s) { (void)err; *s = "stub driver"; return 0; }
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return 0; }
int cuDeviceGetAttribute(int *v, int attr, int dev) { (void)dev; *v = attr == 75 ? 9 : 0; return 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = (void *)0xC0; return 0; }
int cuCtxGetCurrent(void **ctx) { *ctx = (void *)0xC0; return 0; }
int cuCtxGetDevice(int *dev) { *dev = 0; return 0; }
int cuLibraryLoadData(void **lib, const void *code, void *a, void *b, unsigned n, void *c, void *d, unsigned m) {
    (void)code; (void)a; (void)b; (void)n; (void)c; (void)d; (void)m;
    *lib = (void *)0x1000;
    return 0;
}
int cuLibraryGetKernel(void **k, void *lib, const char *name) { (void)lib; (void)name; *k = (void *)0xF00; return 0; }
int cuLibraryUnload(void *lib) { (void)lib; return 0; }
int cuCtxPushCurrent_v2(void *ctx) { (void)ctx; return 0; }
int cuCtxPopCurrent_v2(void **ctx) { *ctx = 0; return 0; }
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shmem, void *stream, void **params, void **extra) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)stream;
    (void)params; (void)extra;
    return 0;
}
int cuLaunchKernelEx(const void *config, void *f, void **params, void **extra) {
    (void)config; (void)f; (void)params; (void)extra;
    return 0;
}

/* mla_gen._launch: a planned call's launch in one C call (python/mla_gen/_cuda.py, "the C
 * launch"). The Python launch path packs the configuration and the values into a buffer under a
 * lock, then makes two ctypes calls (cuCtxGetCurrent, cuLaunchKernelEx), each converting its
 * arguments and releasing and retaking the GIL: on the CPU machine with a driver that returns at
 * once, 1.3 of the 3.0 us the plain function costs (bench/host_cost_stub.py). Here the
 * values go to the stack and both driver calls are made with the GIL held, as a C extension's
 * launch is: on an H200 the function's path costs 5.2-5.4 us instead of 6.5-6.7 (host_cost.py,
 * docs/PYTHON.md).
 *
 * The driver's functions come from Python as addresses (ctypes resolved them in the libcuda the
 * package opened, or a test's stand-in), so this module links nothing and opens nothing. The
 * Python limited API of 3.9: one binary (abi3) for every Python the package supports. */
#define Py_LIMITED_API 0x03090000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The most kernel parameters a launch passes (the manifest's bound, src/host/check.rs). */
#define MAX_PARAMS 32

/* CUlaunchConfig of cuda.h (CUDA >= 12.0), as _cuda.LaunchConfig lays it out: 56 bytes. */
typedef struct {
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_mem_bytes;
    void* stream;
    void* attrs;
    unsigned num_attrs;
} LaunchConfig;

typedef int (*CtxGetCurrent)(void** ctx);
typedef int (*LaunchKernelEx)(const LaunchConfig* config, void* function, void** params, void** extra);

static CtxGetCurrent ctx_get_current;
static LaunchKernelEx launch_kernel_ex;

/* init(cuCtxGetCurrent address, cuLaunchKernelEx address): the driver this module calls. */
static PyObject* init(PyObject* self, PyObject* args) {
    unsigned long long get_current, launch_ex;
    (void)self;
    if (!PyArg_ParseTuple(args, "KK", &get_current, &launch_ex)) return NULL;
    ctx_get_current = (CtxGetCurrent)(uintptr_t)get_current;
    launch_kernel_ex = (LaunchKernelEx)(uintptr_t)launch_ex;
    Py_RETURN_NONE;
}

/* The fields before the values: function, grid x, grid y, block, shared memory, stream,
 * attributes pointer, attribute count, the launcher's context. */
enum { FUNCTION, GRID_X, GRID_Y, BLOCK, SHARED_MEM, STREAM, ATTRS, NUM_ATTRS, CONTEXT, FIELDS };

/* launch(function, gx, gy, block, shmem, stream, attrs, nattrs, ctx, *values) -> the driver's
 * CUresult, or -1 (launching nothing) where the current context is not `ctx`: the caller then
 * takes the path that pushes it. Values are 8 bytes each, an int's two's complement bits. */
static PyObject* launch(PyObject* self, PyObject* args) {
    unsigned long long field[FIELDS];
    uint64_t values[MAX_PARAMS];
    size_t bytes;
    void* extra[5];
    void* current = NULL;
    Py_ssize_t n = PyTuple_Size(args), i;
    int err;
    (void)self;
    if (n < 0) return NULL;
    if (n < FIELDS || n - FIELDS > MAX_PARAMS) {
        PyErr_Format(PyExc_TypeError, "launch takes %d fields and at most %d values, got %zd arguments",
                     (int)FIELDS, MAX_PARAMS, n);
        return NULL;
    }
    if (launch_kernel_ex == NULL || ctx_get_current == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "mla_gen._launch: init() has not been called");
        return NULL;
    }
    for (i = 0; i < n; ++i) {
        unsigned long long v = PyLong_AsUnsignedLongLongMask(PyTuple_GetItem(args, i));
        if (v == (unsigned long long)-1 && PyErr_Occurred()) return NULL;  /* not an int */
        if (i < FIELDS) {
            field[i] = v;
        } else {
            values[i - FIELDS] = v;
        }
    }
    /* The values as the kernel's parameter buffer (8 bytes each at 8-byte offsets), passed whole
     * through `extra`: BUFFER_POINTER (1), the buffer, BUFFER_SIZE (2), its size, END (0). */
    bytes = (size_t)(n - FIELDS) * sizeof values[0];
    extra[0] = (void*)(uintptr_t)1;
    extra[1] = values;
    extra[2] = (void*)(uintptr_t)2;
    extra[3] = &bytes;
    extra[4] = NULL;
    err = ctx_get_current(&current);
    if (err != 0) return PyLong_FromLong(err);
    if ((uintptr_t)current != (uintptr_t)field[CONTEXT]) return PyLong_FromLong(-1);
    {
        LaunchConfig config;
        memset(&config, 0, sizeof config);  /* the padding too, as the Python path writes it */
        config.grid_x = (unsigned)field[GRID_X];
        config.grid_y = (unsigned)field[GRID_Y];
        config.grid_z = 1u;
        config.block_x = (unsigned)field[BLOCK];
        config.block_y = config.block_z = 1u;
        config.shared_mem_bytes = (unsigned)field[SHARED_MEM];
        config.stream = (void*)(uintptr_t)field[STREAM];
        config.attrs = (void*)(uintptr_t)field[ATTRS];
        config.num_attrs = (unsigned)field[NUM_ATTRS];
        err = launch_kernel_ex(&config, (void*)(uintptr_t)field[FUNCTION], NULL, extra);
    }
    return PyLong_FromLong(err);
}

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "init(cuCtxGetCurrent address, cuLaunchKernelEx address)"},
    {"launch", launch, METH_VARARGS,
     "launch(function, gx, gy, block, shmem, stream, attrs, nattrs, ctx, *values) -> CUresult, or -1 where "
     "the current context is not ctx (nothing launched)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_launch", "A planned call's launch in one C call (mla_gen._cuda).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__launch(void) { return PyModule_Create(&module); }

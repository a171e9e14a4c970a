/* tests/c/driver_stub.h as a shared library, a stand-in libcuda.so for builds on machines
 * without a GPU driver (.ci/c.sh links the CMake example against it). */
#include <cuda.h>

#include "driver_stub.h"

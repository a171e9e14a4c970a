"""The CUDA driver through ctypes: libcuda is opened at the first load or launch, never at import.

Kernels are loaded once per process with cuLibraryLoadData (context-independent, CUDA >= 12.0
drivers), each image checked against its manifest entry (size, sha256) first, so a truncated or
corrupt file is an ImageError, never a driver crash; each device gets its function with
cuKernelGetFunction in that device's primary context, which this module retains. A launch runs in
the primary context of the tensors' device: when another context is current on the calling thread
(another device's, or one made with cuCtxCreate), the primary context is pushed around the launch
and popped after it.

Nothing is cached until it fully succeeded (a failed or interrupted load is retried by the next
call). In a child forked after this module opened the driver, every call raises CudaError (CUDA
is not fork-safe): the parent's handles are forgotten, never reused.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
import sys
import threading

from .errors import KernelFolderError

CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222

_lib = None
_lock = threading.RLock()
_primary: dict = {}  # device ordinal -> primary context (int)
stats = {"module_loads": 0, "launches": 0}
_forked = False  # this process was forked from one that had opened the driver


class CudaError(RuntimeError):
    """A CUDA driver call failed; ``code`` is its CUresult. The message names the call, the
    error and, for the usual causes, what to do."""

    def __init__(self, what: str, code: int, detail: str):
        super().__init__(f"{what} failed: {detail}")
        self.code = code


# What the user can do about the driver errors a load or launch meets (appended to the message).
_OOM_HINT = ("the GPU is out of memory: free some (e.g. torch.cuda.empty_cache()) and call again; nothing of this "
             "attempt was kept, so the next call loads afresh")
_STICKY_HINT = ("the CUDA context was left unusable by an earlier fault on this device (a kernel that ran before "
                "this call, not necessarily mla-gen's); every later CUDA call in this process fails the same way: "
                "find the faulting kernel (CUDA_LAUNCH_BLOCKING=1, compute-sanitizer) and restart the process")
_IMAGE_HINT = ("the image matched its manifest entry but this device or driver cannot run it: the kernel folder was "
               "built for other archs (see the manifest's archs) or for a newer driver")
_INIT_HINT = ("the driver is not usable in this process (a child forked after CUDA was used in its parent needs the "
              "'spawn' start method instead)")
_HINTS = {2: _OOM_HINT, 3: _INIT_HINT, 4: _INIT_HINT, 200: _IMAGE_HINT, 209: _IMAGE_HINT, 218: _IMAGE_HINT,
          **dict.fromkeys((700, 710, 714, 715, 716, 717, 718, 719), _STICKY_HINT)}
_FORK_DETAIL = ("this process was forked from one that had already used CUDA through mla_gen, and the CUDA driver "
                "cannot be used again in a forked child (CUDA is not fork-safe; the parent's modules and contexts "
                "mean nothing here). Start such workers with the 'spawn' method (multiprocessing.set_start_method("
                "'spawn')), or make the first mla_gen call in the children")


def lib():
    """libcuda, opened and initialized at first use."""
    global _lib
    if _lib is None:
        if _forked:
            raise CudaError("mla_gen in a forked child", CUDA_ERROR_NOT_INITIALIZED, _FORK_DETAIL)
        with _lock:
            if _lib is None:
                # $MLA_GEN_LIBCUDA: another library (tests: a stand-in driver), as the compiled op reads it
                default = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
                name = os.environ.get("MLA_GEN_LIBCUDA") or default
                try:
                    cuda = ctypes.CDLL(name)
                except OSError as e:
                    # No CUresult without a driver: NOT_INITIALIZED, as for a forked child's.
                    raise CudaError(f"opening the CUDA driver ({name})", CUDA_ERROR_NOT_INITIALIZED,
                                    f"{e}; install the NVIDIA driver (it provides {default}; the kernels need a GPU "
                                    "and its driver), or set $MLA_GEN_LIBCUDA to the driver library's path") from e
                _install(cuda)
                _check(cuda, cuda.cuInit(0), "cuInit")
                _lib = cuda
    return _lib


def _install(cuda):
    """Declares the driver functions this module calls, and takes the launch path's own handles.

    The launch path calls handles without ``argtypes`` (``cuda[name]`` is a fresh function
    object, not the one ``cuda.name`` caches): ctypes then converts nothing but Python ints (to C
    int: the grid and block sizes, the shared memory) and passes ctypes objects as they are (the
    function, stream and parameter pointers as ``c_void_p``), about 0.9 us less per launch than
    the same call with 11 argtypes. Tests hand in a stand-in driver through here too."""
    global _cu_launch, _cu_launch_ex, _cu_get_current, _cu_push, _cu_pop
    for fn in ("cuInit", "cuGetErrorName", "cuGetErrorString", "cuDeviceGet", "cuDeviceGetAttribute",
               "cuDevicePrimaryCtxRetain", "cuCtxGetCurrent", "cuCtxPushCurrent_v2",
               "cuCtxPopCurrent_v2", "cuLaunchKernel", "cuModuleLoadData", "cuModuleGetFunction",
               "cuLibraryLoadData", "cuLibraryGetKernel", "cuKernelGetFunction", "cuLaunchKernelEx"):
        f = getattr(cuda, fn, None)
        if f is not None:
            f.restype = ctypes.c_int
    c_vp = ctypes.c_void_p
    cuda.cuLaunchKernel.argtypes = [c_vp, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                    ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, c_vp, c_vp, c_vp]
    cuda.cuCtxGetCurrent.argtypes = [c_vp]
    cuda.cuCtxPushCurrent_v2.argtypes = [c_vp]
    cuda.cuCtxPopCurrent_v2.argtypes = [c_vp]

    def raw(name):
        try:
            f = cuda[name]
        except (AttributeError, TypeError, KeyError):
            return None
        f.restype = ctypes.c_int
        return f

    _cu_launch, _cu_launch_ex = raw("cuLaunchKernel"), raw("cuLaunchKernelEx")
    _cu_get_current, _cu_push, _cu_pop = raw("cuCtxGetCurrent"), raw("cuCtxPushCurrent_v2"), raw("cuCtxPopCurrent_v2")
    use_c_launch(os.environ.get("MLA_GEN_C_LAUNCH", "1") != "0")


def use_c_launch(on: bool) -> bool:
    """Launch through mla_gen._launch (python/csrc/launch.c: the values on the stack and both driver
    calls in one C call, with the GIL held) instead of the struct and two ctypes calls, where the
    package has that module (a platform wheel) and the driver has cuLaunchKernelEx; returns whether
    it does. On by default where the module loads; ``MLA_GEN_C_LAUNCH=0`` when the driver is opened
    keeps the Python launch. Plans made before keep the path they were made with."""
    global _c_launch
    _c_launch = None
    if on and _cu_launch_ex is not None and _cu_get_current is not None:
        try:
            from . import _launch
        except ImportError:
            return False
        address = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
        _launch.init(address(_cu_get_current), address(_cu_launch_ex))
        _c_launch = _launch.launch
    return _c_launch is not None


# The launch path's handles (see _install); None until the driver is opened. _c_launch:
# mla_gen._launch.launch where use_c_launch turned it on.
_cu_launch = _cu_launch_ex = _cu_get_current = _cu_push = _cu_pop = _c_launch = None


def _check(cuda, err: int, what: str, nvrtc: dict | None = None):
    if err == 0:
        return
    name = ctypes.c_char_p()
    detail = f"CUresult {err}"
    if cuda.cuGetErrorName(err, ctypes.byref(name)) == 0 and name.value:
        detail = name.value.decode()
    text = ctypes.c_char_p()
    if cuda.cuGetErrorString(err, ctypes.byref(text)) == 0 and text.value:
        detail += f" ({text.value.decode()})"
    if err == CUDA_ERROR_UNSUPPORTED_PTX_VERSION and nvrtc:
        detail += (f": PTX ISA {nvrtc.get('ptx_isa')} from NVRTC {nvrtc.get('release')} needs a CUDA "
                   f"{nvrtc.get('oldest_driver_cuda')} driver{_driver_version(cuda)}; use CUBIN or the pinned "
                   "NVRTC 13.0.88")
    elif err in _HINTS:
        detail += f": {_HINTS[err]}"
    raise CudaError(what, err, detail)


def _driver_version(cuda) -> str:
    """", this one is CUDA X.Y" from cuDriverGetVersion, or "" where it cannot say."""
    version = ctypes.c_int()
    get = getattr(cuda, "cuDriverGetVersion", None)
    if get is None or get(ctypes.byref(version)) != 0 or version.value <= 0:
        return ""
    return f", this one is CUDA {version.value // 1000}.{version.value % 1000 // 10}"


def primary_context(device: int) -> int:
    """The device's primary context, retained (once per process)."""
    ctx = _primary.get(device)
    if ctx is None:
        cuda = lib()
        with _lock:
            ctx = _primary.get(device)
            if ctx is None:
                dev = ctypes.c_int()
                _check(cuda, cuda.cuDeviceGet(ctypes.byref(dev), device), f"cuDeviceGet({device})")
                handle = ctypes.c_void_p()
                _check(cuda, cuda.cuDevicePrimaryCtxRetain(ctypes.byref(handle), dev),
                       f"cuDevicePrimaryCtxRetain({device})")
                ctx = _primary[device] = handle.value
    return ctx


_cc: dict = {}  # device ordinal -> compute capability (major * 10 + minor)


def compute_capability(device: int) -> int:
    cc = _cc.get(device)
    if cc is not None:
        return cc
    cuda = lib()
    dev = ctypes.c_int()
    _check(cuda, cuda.cuDeviceGet(ctypes.byref(dev), device), f"cuDeviceGet({device})")
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(cuda, cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev), "cuDeviceGetAttribute")  # MAJOR
    _check(cuda, cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev), "cuDeviceGetAttribute")  # MINOR
    cc = _cc[device] = major.value * 10 + minor.value
    return cc


def uses_pdl(meta: dict, device: int) -> bool:
    """Whether a kernel launches with programmatic dependent launch on `device`: its manifest
    says ``launch.pdl`` (built with ``pdl = true``: it waits on griddepcontrol.wait first) and
    the device is sm_90 or newer. The device is asked only for such kernels."""
    from .manifest import launch_pdl
    return launch_pdl(meta) and compute_capability(device) >= 90 and _cu_launch_ex is not None


class _Current:
    """Makes `ctx` current on this thread for a block when it is not already."""

    def __init__(self, ctx: int):
        self.ctx = ctx
        self.pushed = False

    def __enter__(self):
        cuda = lib()
        cur = ctypes.c_void_p()
        _check(cuda, cuda.cuCtxGetCurrent(ctypes.byref(cur)), "cuCtxGetCurrent")
        if cur.value != self.ctx:
            _check(cuda, cuda.cuCtxPushCurrent_v2(self.ctx), "cuCtxPushCurrent")
            self.pushed = True
        return self

    def __exit__(self, *exc):
        if self.pushed:
            popped = ctypes.c_void_p()
            lib().cuCtxPopCurrent_v2(ctypes.byref(popped))


class Kernel:
    """One kernel of a folder: its image loaded once (per process), its function per device."""

    def __init__(self, folder, meta: dict):
        self.folder = folder
        self.meta = meta
        self.name = meta["name"]
        self.libraries: dict = {}  # image file -> (CUlibrary, CUkernel)
        self.functions: dict = {}  # device -> CUfunction (int)
        self.modules: dict = {}  # device -> CUmodule, where the driver has no cuLibraryLoadData
        self.images: dict = {}  # image file -> checked bytes, for those modules

    def function(self, device: int) -> int:
        f = self.functions.get(device)
        if f is not None:
            return f
        with _lock:
            f = self.functions.get(device)
            if f is None:
                f = self.functions[device] = self._load(device)
        return f

    def _entry(self, device: int) -> dict:
        from .manifest import pick_image
        cc = compute_capability(device)
        entry = pick_image(self.meta, cc)
        if entry is None:
            archs = ", ".join(a["arch"] for a in self.meta["archs"]) or "none"
            raise KernelFolderError(f"{self.name}: no CUBIN or PTX in {self.folder.label} runs on sm_{cc} (its "
                                    f"archs: {archs}); generate a folder for it, `mla-gen generate SPEC --arch "
                                    f"sm_{cc} --out DIR`, and set $MLA_GEN_KERNELS=DIR")
        return entry

    def _image(self, entry: dict) -> bytes:
        """The image's bytes, checked against the manifest entry (KernelFolder.image: ImageError
        on any difference) before the driver may see them; PTX NUL-terminated."""
        data = self.folder.image(entry, self.name)
        cubin = self.folder.is_cubin(entry, self.name)
        if cubin is None:  # an entry the manifest does not list (a test's): its file says
            cubin = not entry["file"].endswith(".ptx")
        return data if cubin else data + b"\0"

    def _load(self, device: int) -> int:
        cuda = lib()
        nvrtc = self.folder.manifest.get("nvrtc")
        entry = self._entry(device)
        choice = entry["file"]
        ctx = primary_context(device)
        name = self.name.encode()
        handle = ctypes.c_void_p()
        with _Current(ctx):
            if hasattr(cuda, "cuLibraryLoadData"):
                # One library per image (devices of different archs pick different images).
                loaded = self.libraries.get(choice)
                if loaded is None:
                    data = self._image(entry)
                    library, kern = ctypes.c_void_p(), ctypes.c_void_p()
                    _check(cuda, cuda.cuLibraryLoadData(ctypes.byref(library), data, None, None, 0, None, None, 0),
                           f"cuLibraryLoadData({choice})", nvrtc)
                    try:
                        _check(cuda, cuda.cuLibraryGetKernel(ctypes.byref(kern), library, name),
                               f"cuLibraryGetKernel({self.name})")
                    except BaseException:  # KeyboardInterrupt too: no library left behind unrecorded
                        unload = getattr(cuda, "cuLibraryUnload", None)
                        if unload is not None:
                            unload(library)
                        raise
                    loaded = self.libraries[choice] = (library, kern)
                    stats["module_loads"] += 1
                _check(cuda, cuda.cuKernelGetFunction(ctypes.byref(handle), loaded[1]),
                       f"cuKernelGetFunction({self.name}) on device {device}", nvrtc)
            else:  # drivers before CUDA 12.0: one module per context (the image checked once)
                data = self.images.get(choice)
                if data is None:
                    data = self.images[choice] = self._image(entry)
                module = ctypes.c_void_p()
                _check(cuda, cuda.cuModuleLoadData(ctypes.byref(module), data), f"cuModuleLoadData({choice})", nvrtc)
                _check(cuda, cuda.cuModuleGetFunction(ctypes.byref(handle), module, name),
                       f"cuModuleGetFunction({self.name})")
                self.modules[device] = module
                stats["module_loads"] += 1
        return handle.value


_kernels: dict = {}


def _forget_after_fork():
    """In a forked child: the parent's driver, contexts, modules and locks are not this process's
    (a lock another thread held at the fork would never be released). Where the parent had opened
    the driver, every call now raises (lib())."""
    global _lib, _forked, _lock, _launch_lock
    _forked = _forked or _lib is not None
    _lib = None
    _primary.clear()
    _kernels.clear()
    _cc.clear()
    _lock = threading.RLock()
    _launch_lock = threading.Lock()


def kernel(folder, meta: dict) -> Kernel:
    key = (id(folder), meta["name"])
    k = _kernels.get(key)
    if k is None or k.folder is not folder:
        with _lock:
            k = _kernels.get(key)
            if k is None or k.folder is not folder:
                k = _kernels[key] = Kernel(folder, meta)
    return k


# cuLaunchKernelEx's configuration (cuda.h): CUlaunchAttribute is {CUlaunchAttributeID id; char
# pad[8 - sizeof(int)]; CUlaunchAttributeValue value (a union of 64 bytes)}, 72 bytes;
# CUlaunchConfig is {unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
# sharedMemBytes; CUstream hStream; CUlaunchAttribute *attrs; unsigned numAttrs}: hStream at 32,
# attrs at 40, numAttrs at 48, 56 bytes (x86-64 and aarch64 alike).
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("programmatic_stream_serialization_allowed", ctypes.c_int),
                ("_align", ctypes.c_void_p)]


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", LaunchAttributeValue)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


class Launcher:
    """One function with a fixed block, shared memory and parameter layout. Its buffer holds a
    CUlaunchConfig (56 bytes) followed by the parameter values (8 bytes each: ``q`` for an i64,
    ``Q`` for a pointer); `launch` fills it under a lock (the values of two threads' launches must
    not mix) with one precompiled struct and passes it to cuLaunchKernelEx: four arguments for
    ctypes to convert where cuLaunchKernel takes eleven. The values are the kernel's parameter
    buffer as they stand (every parameter 8 bytes at an 8-byte offset), so they go whole through
    `extra` (BUFFER_POINTER, the values, BUFFER_SIZE, their size, END), not as an array of a
    pointer per value: one copy in the driver instead of one per parameter (on an H200 0.26 us
    less per launch at best, within noise in other runs: docs/PYTHON.md). With ``pdl`` the
    configuration carries programmatic stream serialization (the kernel may start before the
    previous one on the stream ends; it waits for it with griddepcontrol.wait); without, no
    attribute, which is cuLaunchKernel's launch. A driver without cuLaunchKernelEx (before CUDA
    12.0) gets cuLaunchKernel with the values at the same place."""

    __slots__ = ("function", "ctx", "block", "shmem", "buffer", "size", "extra", "pack", "pack_params", "cur", "cur_ref",
                 "popped_ref", "nvrtc", "name", "pdl", "ex", "config_ref", "attribute", "attrs", "nattrs")

    def __init__(self, function: int, ctx: int, count: int, block: int, shmem: int, nvrtc, name,
                 kinds: str | None = None, pdl: bool = False):
        self.function = ctypes.c_void_p(function)
        self.ctx = ctx
        self.block = block
        self.shmem = shmem
        n = max(count, 1)
        self.buffer = (ctypes.c_uint64 * (_CONFIG_WORDS + n))()
        base = ctypes.addressof(self.buffer)
        self.size = ctypes.c_size_t(8 * count)
        self.extra = (ctypes.c_void_p * 5)(1, base + 8 * _CONFIG_WORDS, 2, ctypes.addressof(self.size), None)
        kinds = kinds if kinds is not None else "q" * count
        self.pack = struct.Struct(_CONFIG_FORMAT + kinds).pack_into  # the configuration, then the values
        self.pack_params = struct.Struct("=" + kinds).pack_into  # the values alone, at 8 * _CONFIG_WORDS
        self.config_ref = ctypes.byref(self.buffer)
        self.cur = ctypes.c_void_p()
        self.cur_ref = ctypes.byref(self.cur)
        self.popped_ref = ctypes.byref(ctypes.c_void_p())
        self.nvrtc = nvrtc
        self.name = name
        self.ex = _cu_launch_ex is not None
        self.pdl = bool(pdl) and self.ex
        self.attribute, self.attrs, self.nattrs = None, 0, 0
        if self.pdl:
            self.attribute = LaunchAttribute(id=CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
            self.attribute.value.programmatic_stream_serialization_allowed = 1
            self.attrs, self.nattrs = ctypes.addressof(self.attribute), 1


# CUlaunchConfig as the struct module writes it (see LaunchConfig): grid x, y, z, block x, y, z,
# shared memory, (pad), stream, attributes pointer, attribute count, (pad): 56 bytes, 7 words.
_CONFIG_FORMAT = "=7I4xQQI4x"
_CONFIG_WORDS = 7
assert struct.calcsize(_CONFIG_FORMAT) == 8 * _CONFIG_WORDS == ctypes.sizeof(LaunchConfig)


def param_kinds(params) -> str:
    """The struct codes of a kernel's parameters, in order: ``Q`` for a pointer, ``q`` for an i64."""
    return "".join("Q" if p["kind"] == "pointer" else "q" for p in params)


_launch_lock = threading.Lock()
_void_p = ctypes.c_void_p


def _submit(launcher: Launcher, gx: int, gy: int, stream: int) -> int:
    """The driver call proper (the buffer packed, the launcher's context current)."""
    if launcher.ex:
        return _cu_launch_ex(launcher.config_ref, launcher.function, None, launcher.extra)
    return _cu_launch(launcher.function, gx, gy, 1, launcher.block, 1, 1, launcher.shmem, _void_p(stream),
                      None, launcher.extra)


def _foreign(launcher: Launcher, gx: int, gy: int, stream: int) -> int:
    """The launch where another context is current: the launcher's (its device's primary
    context) pushed around it."""
    err = _cu_push(_void_p(launcher.ctx))
    if err:
        return err
    try:
        return _submit(launcher, gx, gy, stream)
    finally:  # the caller's context current again, whatever happened
        _cu_pop(launcher.popped_ref)


def _failed(launcher: Launcher, err: int):
    _check(_lib, err, f"{'cuLaunchKernelEx' if launcher.ex else 'cuLaunchKernel'}({launcher.name})", launcher.nvrtc)


def launch(launcher: Launcher, values, gx: int, gy: int, stream: int):
    """Launch with `values` (parameter values in signature order) on `stream`, in the primary
    context of the launcher's device (pushed around the launch when another one is current).
    The planned calls run this body inlined (launch_source, _fastpath)."""
    if _c_launch is not None and launcher.ex:
        err = _c_launch(launcher.function.value, gx, gy, launcher.block, launcher.shmem, stream, launcher.attrs,
                        launcher.nattrs, launcher.ctx, *values)
        if err == 0:
            stats["launches"] += 1
            return
        if err != -1:
            _failed(launcher, err)
        # -1: another context is current; the path below pushes the launcher's around the launch.
    # `with`, not acquire(); try: CPython 3.11 can raise KeyboardInterrupt right after acquire()
    # returns, before the try guards the release (a probe: a third of the interrupts of a tight
    # loop left the lock held, every later launch then hanging); `with` left none. The planned
    # calls' text (_INLINE) does the same, ~0.1 us dearer than acquire/try on the CPU machine.
    with _launch_lock:
        if launcher.ex:
            launcher.pack(launcher.buffer, 0, gx, gy, 1, launcher.block, 1, 1, launcher.shmem, stream, launcher.attrs,
                          launcher.nattrs, *values)
        else:
            launcher.pack_params(launcher.buffer, 8 * _CONFIG_WORDS, *values)
        _cu_get_current(launcher.cur_ref)
        if launcher.cur.value == launcher.ctx:
            err = _submit(launcher, gx, gy, stream)
        else:
            err = _foreign(launcher, gx, gy, stream)
    if err:
        _failed(launcher, err)
    stats["launches"] += 1


_LAUNCH = launch

# launch()'s body for one launcher, for the code generated per plan (_fastpath): the launcher's
# fields are bound as L_* names (the text does not depend on their values, so one compiled text
# serves every plan of a shape). {pack} and {submit}: cuLaunchKernelEx's or cuLaunchKernel's.
_INLINE = """\
L_s = {stream}
with L_lock:
    {pack}
    L_get(L_cur_ref)
    L_err = {submit} if L_cur.value == L_ctx else L_foreign(L_launcher, L_gx, L_gy, L_s)
if L_err:
    L_failed(L_launcher, L_err)
L_stats["launches"] += 1
"""
_PACK_EX = "L_pack(L_buf, 0, L_gx, L_gy, 1, L_block, 1, 1, L_shmem, L_s, L_attrs, L_nattrs, {values})"
_SUBMIT_EX = "L_ex(L_cfg, L_fn, None, L_extra)"
_PACK_PLAIN = "L_pack(L_buf, %d, {values})" % (8 * _CONFIG_WORDS)
_SUBMIT_PLAIN = "L_plain(L_fn, L_gx, L_gy, 1, L_block, 1, 1, L_shmem, L_vp(L_s), None, L_extra)"
# Where launch() has been replaced (a test's recorder), the text calls the replacement.
_INLINE_CALL = "L_launch(L_launcher, ({values},), L_gx, L_gy, {stream})\n"
# The C launch (use_c_launch): one call; -1 (another context current) takes launch()'s path.
_INLINE_C = """\
L_err = L_c(L_fnv, L_gx, L_gy, L_block, L_shmem, {stream}, L_attrs, L_nattrs, L_ctx, {values})
if L_err:
    if L_err != -1:
        L_failed(L_launcher, L_err)
    L_launch(L_launcher, ({values},), L_gx, L_gy, {stream})
else:
    L_stats["launches"] += 1
"""


def launch_source(launcher: Launcher, gx: int, gy: int, stream: str, values: str) -> tuple:
    """(text, names, bindings): the statements that launch `launcher` on a grid (gx, gy) on the
    stream the expression `stream` gives, with the parameter values the expression `values`
    lists, as `launch` does; the text's free names are `names`, to be bound to `bindings`."""
    if launch is not _LAUNCH:
        text = _INLINE_CALL.format(stream=stream, values=values)
    elif _c_launch is not None and launcher.ex:
        text = _INLINE_C.format(stream=stream, values=values)
    else:
        pack, submit = (_PACK_EX, _SUBMIT_EX) if launcher.ex else (_PACK_PLAIN, _SUBMIT_PLAIN)
        text = _INLINE.format(stream=stream, pack=pack.format(values=values), submit=submit)
    every = {"L_launcher": launcher, "L_gx": gx, "L_gy": gy, "L_lock": _launch_lock,
             "L_pack": launcher.pack if launcher.ex else launcher.pack_params, "L_buf": launcher.buffer,
             "L_block": launcher.block, "L_shmem": launcher.shmem, "L_attrs": launcher.attrs,
             "L_nattrs": launcher.nattrs, "L_get": _cu_get_current, "L_cur_ref": launcher.cur_ref,
             "L_cur": launcher.cur, "L_ctx": launcher.ctx, "L_ex": _cu_launch_ex, "L_plain": _cu_launch,
             "L_vp": _void_p, "L_cfg": launcher.config_ref, "L_fn": launcher.function, "L_extra": launcher.extra,
             "L_foreign": _foreign, "L_failed": _failed, "L_stats": stats, "L_launch": launch, "L_c": _c_launch,
             "L_fnv": launcher.function.value}
    used = set(re.findall(r"\bL_\w+", text)) - {"L_s", "L_err"}
    names = tuple(n for n in every if n in used)
    return text, names, tuple(every[n] for n in names)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)

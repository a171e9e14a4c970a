"""The launch path without a GPU: the real ``_cuda.launch`` into a stand-in driver made of
ctypes callbacks (what the driver receives is read back from memory, as libcuda would read it).
Every launch goes through cuLaunchKernelEx (four arguments for ctypes, the configuration
packed with the values): a kernel whose manifest entry says ``launch.pdl`` with one
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION attribute on sm_90 and newer, any other
without attributes; a driver without cuLaunchKernelEx gets cuLaunchKernel; a foreign current
context is pushed and popped around the launch."""

import ctypes
import json
import struct

import pytest

torch = pytest.importorskip("torch")

import mla_gen  # noqa: E402
from mla_gen import _cuda, _torch, manifest  # noqa: E402

from conftest import ROOT  # noqa: E402

PRIMARY, FOREIGN, STREAM = 0xC0, 0xF0, 0x7F00C0DE0000
KERNEL = "merge_attn_states_bf16_d128_thr_lse"
c_int, c_uint, c_vp = ctypes.c_int, ctypes.c_uint, ctypes.c_void_p


class FakeDriver:
    """libcuda's launch-path functions as ctypes callbacks; ``cuda[name]`` gives a fresh function
    object at the same address, like ctypes.CDLL."""

    def __init__(self, cc: int, nparams: int, current: int = PRIMARY, ex: bool = True):
        self.cc, self.nparams, self.current, self.calls = cc, nparams, current, []
        self._keep = []
        self._def("cuInit", [c_uint], lambda flags: 0)
        self._def("cuGetErrorName", [c_int, c_vp], lambda e, s: 1)
        self._def("cuGetErrorString", [c_int, c_vp], lambda e, s: 1)
        self._def("cuDeviceGet", [c_vp, c_int], self._device_get)
        self._def("cuDeviceGetAttribute", [c_vp, c_int, c_int], self._attribute)
        self._def("cuCtxGetCurrent", [c_vp], self._get_current)
        self._def("cuCtxPushCurrent_v2", [c_vp], lambda ctx: self._record("push", ctx))
        self._def("cuCtxPopCurrent_v2", [c_vp], lambda out: self._record("pop", out))
        self._def("cuLaunchKernel", [c_vp] + [c_uint] * 7 + [c_vp, c_vp, c_vp], self._launch)
        if ex:  # drivers before CUDA 12.0 have none
            self._def("cuLaunchKernelEx", [c_vp, c_vp, c_vp, c_vp], self._launch_ex)

    def _def(self, name, argtypes, body):
        proto = ctypes.CFUNCTYPE(c_int, *argtypes)
        fn = proto(body)
        self._keep.append(fn)
        setattr(self, name, proto(ctypes.cast(fn, c_vp).value))

    def __getitem__(self, name):
        f = getattr(self, name)
        return type(f)(ctypes.cast(f, c_vp).value)

    def _record(self, what, *args):
        self.calls.append((what,) + args)
        return 0

    def _device_get(self, out, ordinal):
        c_int.from_address(out).value = ordinal
        return 0

    def _attribute(self, out, attr, dev):
        c_int.from_address(out).value = {75: self.cc // 10, 76: self.cc % 10}.get(attr, 0)
        return 0

    def _get_current(self, out):
        c_vp.from_address(out).value = self.current
        return 0

    def _params(self, params, extra):
        """The parameter values as the driver reads them at the call: the package passes them
        through `extra` (BUFFER_POINTER, the buffer, BUFFER_SIZE, &its size, END), not
        kernelParams; the buffer holds every value, 8 bytes each. None (the launch then fails
        with CUDA_ERROR_INVALID_VALUE, as the driver's would) for anything else: an exception
        would not leave a ctypes callback."""
        if params or not extra:
            return None
        keys = [c_vp.from_address(extra + 8 * i).value for i in range(5)]
        if (keys[0], keys[2], keys[4]) != (1, 2, None) or ctypes.c_size_t.from_address(keys[3]).value != 8 * self.nparams:
            return None
        return [ctypes.c_int64.from_address(keys[1] + 8 * i).value for i in range(self.nparams)]

    def _launch(self, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        values = self._params(params, extra)
        if values is None:
            return 1
        return self._record("cuLaunchKernel", f, (gx, gy, gz), (bx, by, bz), shmem, stream, values)

    def _launch_ex(self, config, f, params, extra):
        values = self._params(params, extra)
        if values is None:
            return 1
        cfg = ctypes.string_at(config, 56)
        attrs, num = struct.unpack_from("=QI", cfg, 40)
        return self._record("cuLaunchKernelEx", cfg, ctypes.string_at(attrs, 72 * num), f, values)


def _has_c_launch():
    try:
        from mla_gen import _launch  # noqa: F401  (built into a platform wheel: python/csrc/launch.c)
    except ImportError:
        return False
    return True


@pytest.fixture(params=["python", "c"])
def driver(request, monkeypatch, tmp_path):
    """The torch layer on CPU tensors with the real _cuda.launch into a FakeDriver; yields a
    function that installs a driver of a given compute capability over a manifest whose
    KERNEL has the given launch.pdl (None: the field absent). Each test runs twice: the launch
    path of Python (the struct and ctypes calls) and mla_gen._launch's (use_c_launch), which the
    driver must see alike; the second skips where the package has no _launch (a source tree)."""
    if request.param == "c" and not _has_c_launch():
        pytest.skip("no mla_gen._launch here (built into the platform wheel; .ci/python.sh tests that)")
    m = json.loads((ROOT / "generated/manifest.json").read_text())
    for name in ("_lib", "_cu_launch", "_cu_launch_ex", "_cu_get_current", "_cu_push", "_cu_pop", "_c_launch"):
        monkeypatch.setattr(_cuda, name, getattr(_cuda, name))
    monkeypatch.setattr(_cuda, "_cc", {})
    monkeypatch.setattr(_torch, "_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(_torch, "_plans", {})
    for slot in ("_last_pair", "_last_pair_op", "_last_ctx"):
        monkeypatch.setattr(_torch, slot, [None] * 4)
    monkeypatch.setattr(_torch, "_stream", lambda device: STREAM)
    monkeypatch.setattr(_cuda, "primary_context", lambda device: PRIMARY)

    class Kern:
        def function(self, device):
            return 0xF00

    monkeypatch.setattr(_cuda, "kernel", lambda folder, meta: Kern())

    def install(cc, pdl, current=PRIMARY, ex=True):
        for k in m["kernels"]:
            k["launch"].pop("pdl", None)
            # KERNEL itself launches (test_size_rule_cpu.py: rules; test_specialization_cpu.py)
            k["launch"].pop("size_rule", None)
            k["launch"].pop("specializations", None)
            if k["name"] == KERNEL and pdl is not None:
                k["launch"]["pdl"] = pdl
        folder = tmp_path / f"cc{cc}-{pdl}"
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps(m))
        monkeypatch.setenv("MLA_GEN_KERNELS", str(folder))
        fake = FakeDriver(cc, len(next(k for k in m["kernels"] if k["name"] == KERNEL)["params"]), current, ex)
        _cuda._install(fake)
        _cuda._lib = fake
        _cuda._cc.clear()
        # The C launch where the driver has cuLaunchKernelEx (without it, the Python path's cuLaunchKernel).
        fake.c_launch = request.param == "c" and ex
        assert _cuda.use_c_launch(request.param == "c") == fake.c_launch
        return fake

    c_launch_was_on = _cuda._c_launch is not None
    yield install
    # monkeypatch puts _cuda's names back, but _launch keeps the driver addresses init() gave it
    # last, the fake's, whose callbacks die with it: a real driver's C launch would call into
    # them (the GPU suite runs these tests before the launches of test_merge.py). So the names
    # first, then use_c_launch gives _launch the real driver again.
    if c_launch_was_on:
        monkeypatch.undo()
        assert _cuda.use_c_launch(True)


def call():
    T, H, D = 8, 4, 128
    p, s, out = (torch.zeros(T, H, D, dtype=torch.bfloat16) for _ in range(3))
    pl, sl, ol = (torch.zeros(H, T) for _ in range(3))
    mla_gen.merge_attn_states(out, p, pl, s, sl, ol, 5)
    mla_gen.merge_attn_states(out, p, pl, s, sl, ol, 6)  # the plan looked up: its per-call checks and launch
    mla_gen.merge_attn_states(out, p, pl, s, sl, ol, 7)  # the previous call's plan (its guard first)
    return out, ol, T, H


def test_struct_layouts_match_cuda_h():
    assert ctypes.sizeof(_cuda.LaunchAttribute) == 72 and _cuda.LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(_cuda.LaunchAttributeValue) == 64
    assert ctypes.sizeof(_cuda.LaunchConfig) == 56
    offsets = {f[0]: getattr(_cuda.LaunchConfig, f[0]).offset for f in _cuda.LaunchConfig._fields_}
    assert offsets == {"gridDimX": 0, "gridDimY": 4, "gridDimZ": 8, "blockDimX": 12, "blockDimY": 16,
                       "blockDimZ": 20, "sharedMemBytes": 24, "hStream": 32, "attrs": 40, "numAttrs": 48}


def test_pdl_kernel_on_sm90_goes_through_cuLaunchKernelEx(driver):
    fake = driver(90, True)
    out, ol, T, H = call()
    launches = [c for c in fake.calls if c[0].startswith("cuLaunchKernel")]
    assert [c[0] for c in launches] == ["cuLaunchKernelEx"] * 3
    meta = manifest.folder().kernel(KERNEL)
    lc = meta["launch"]
    gx, gy = -(-T // lc["grid_x"]["per_block"]), -(-H // lc["grid_y"]["per_block"])
    for n, (_, cfg, attrs, f, params) in zip((5, 6, 7), launches):
        fields = struct.unpack("=7I4xQQI4x", cfg)
        assert fields[:8] == (gx, gy, 1, lc["block_threads"], 1, 1, lc["shared_mem_bytes"], STREAM)
        assert fields[9] == 1, "one attribute"
        assert attrs == struct.pack("=i4xi60x", _cuda.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1)
        assert _cuda.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION == 6
        assert f == 0xF00
        values = dict(zip([p["name"] for p in meta["params"]], params))
        assert values["output"] == out.data_ptr() and values["output_lse"] == ol.data_ptr()
        assert values["prefill_tokens_with_context"] == n and values["num_tokens"] == T


@pytest.mark.parametrize("cc, pdl", [(80, True), (90, False), (90, None), (89, True)])
def test_otherwise_cuLaunchKernelEx_without_attributes(driver, cc, pdl):
    fake = driver(cc, pdl)
    out, ol, T, H = call()
    # The planned calls' text launches through the C launch exactly where it is on.
    preps = [p for ps in _torch._plans.values() for p in ps]
    assert preps and all(("L_c" in p.run.__code__.co_freevars) == fake.c_launch for p in preps)
    launches = [c for c in fake.calls if c[0].startswith("cuLaunchKernel")]
    assert [c[0] for c in launches] == ["cuLaunchKernelEx"] * 3
    meta = manifest.folder().kernel(KERNEL)
    lc = meta["launch"]
    gx, gy = -(-T // lc["grid_x"]["per_block"]), -(-H // lc["grid_y"]["per_block"])
    for n, (_, cfg, attrs, f, params) in zip((5, 6, 7), launches):
        fields = struct.unpack("=7I4xQQI4x", cfg)
        assert fields[:8] == (gx, gy, 1, lc["block_threads"], 1, 1, lc["shared_mem_bytes"], STREAM)
        assert fields[9] == 0 and attrs == b"", "no attribute"
        assert f == 0xF00
        values = dict(zip([p["name"] for p in meta["params"]], params))
        assert values["output"] == out.data_ptr() and values["prefill_tokens_with_context"] == n


@pytest.mark.parametrize("pdl", [True, None])
def test_a_driver_without_cuLaunchKernelEx_gets_cuLaunchKernel(driver, pdl):
    fake = driver(90, pdl, ex=False)
    out, ol, T, H = call()
    launches = [c for c in fake.calls if c[0].startswith("cuLaunchKernel")]
    assert [c[0] for c in launches] == ["cuLaunchKernel"] * 3
    meta = manifest.folder().kernel(KERNEL)
    for n, (_, f, grid, block, shmem, stream, params) in zip((5, 6, 7), launches):
        assert f == 0xF00 and stream == STREAM and grid[2] == 1
        assert block == (meta["launch"]["block_threads"], 1, 1) and shmem == meta["launch"]["shared_mem_bytes"]
        values = dict(zip([p["name"] for p in meta["params"]], params))
        assert values["output"] == out.data_ptr() and values["prefill_tokens_with_context"] == n


@pytest.mark.parametrize("pdl, ex", [(True, True), (False, True), (False, False)])
def test_a_foreign_current_context_is_pushed_and_popped(driver, pdl, ex):
    fake = driver(90, pdl, current=FOREIGN, ex=ex)
    call()
    kinds = [c[0] for c in fake.calls]
    launch = "cuLaunchKernelEx" if ex else "cuLaunchKernel"
    assert kinds == ["push", launch, "pop"] * 3
    assert fake.calls[0][1] == PRIMARY and fake.calls[3][1] == PRIMARY and fake.calls[6][1] == PRIMARY


def test_the_manifest_flag():
    assert manifest.launch_pdl({"launch": {"pdl": True}}) is True
    assert manifest.launch_pdl({"launch": {}}) is False and manifest.launch_pdl({}) is False

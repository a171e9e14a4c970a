"""Faults of the Python path without a GPU: CPU tensors stand for CUDA ones and the real
mla_gen._cuda opens the stand-in driver (ext/stub_driver.c, through $MLA_GEN_LIBCUDA), so the
kernel folder, the image check, the load and the launch are the package's own. Each case ends in
an exception that names the fault and its fix, and the next good call launches (the process stays
usable): corrupt, truncated, empty and missing images (CUBIN and PTX), manifests truncated, from a
newer schema, naming files outside the folder or without hashes; no driver library; the driver
failing the load (out of memory, a sticky context error) or the launch; KeyboardInterrupt anywhere
in a first call's load; 32 threads making their first calls at once; os.fork() after the first
call."""

from __future__ import annotations

import json
import linecache
import sys
import threading

import pytest

torch = pytest.importorskip("torch")

import mla_gen  # noqa: E402
from mla_gen import _cuda, _torch, manifest  # noqa: E402
from mla_gen.errors import ImageError, ManifestError, MissingImageError  # noqa: E402

from conftest import launched  # noqa: E402
from faults import KERNEL, Stub, build_stub, edit_manifest, make_folder, run_child  # noqa: E402

BF16 = torch.bfloat16
T, H, D, N = 8, 4, 128, 5


@pytest.fixture(scope="module")
def stub_path(tmp_path_factory):
    return build_stub(tmp_path_factory.mktemp("stub"))


@pytest.fixture
def driver(monkeypatch, stub_path):
    """The torch layer on CPU tensors with _cuda's real load and launch into the stand-in driver
    (opened fresh by _cuda.lib()); its counters start at zero."""
    for name in ("_lib", "_cu_launch", "_cu_launch_ex", "_cu_get_current", "_cu_push", "_cu_pop", "_c_launch",
                 "_forked"):
        monkeypatch.setattr(_cuda, name, getattr(_cuda, name))
    monkeypatch.setattr(_cuda, "_lib", None)
    for name in ("_cc", "_primary", "_kernels"):
        monkeypatch.setattr(_cuda, name, {})
    monkeypatch.setenv("MLA_GEN_LIBCUDA", str(stub_path))
    monkeypatch.setattr(_torch, "_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(_torch, "_plans", {})
    for slot in ("_last_pair", "_last_pair_op", "_last_ctx"):
        monkeypatch.setattr(_torch, slot, [None] * 4)
    monkeypatch.setattr(_torch, "_stream", lambda device: 0)
    c_launch_was_on = _cuda._c_launch is not None
    yield Stub(stub_path)
    if c_launch_was_on:  # _launch keeps the stub's addresses: give it the real driver's again (test_launch_cpu.py)
        monkeypatch.undo()
        assert _cuda.use_c_launch(True)


def test_no_driver_library_is_a_cuda_error_naming_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(_cuda, "_lib", None)
    monkeypatch.setattr(_cuda, "_forked", False)
    monkeypatch.setenv("MLA_GEN_LIBCUDA", str(tmp_path / "libcuda.so.1"))
    with pytest.raises(mla_gen.CudaError, match=r"^opening the CUDA driver \(.*libcuda\.so\.1\) failed: .*; install "
                                                r"the NVIDIA driver .*, or set \$MLA_GEN_LIBCUDA to the driver "
                                                r"library's path$") as e:
        _cuda.lib()
    assert e.value.code == _cuda.CUDA_ERROR_NOT_INITIALIZED and _cuda._lib is None


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """$MLA_GEN_KERNELS: KERNEL and its twins with synthetic sm_90 CUBINs; yields (folder, the
    launched kernel's image)."""
    images = make_folder(tmp_path)
    monkeypatch.setenv("MLA_GEN_KERNELS", str(tmp_path))
    image = images[launched(KERNEL, T, H, threshold=N)]
    # launched() read the manifest: the folder as a new process first sees it, nothing read yet
    monkeypatch.setattr(manifest, "_folders", {})
    monkeypatch.setattr(manifest, "_by_path_cache", {})
    return tmp_path, image


def call(dtype=BF16, d=D):
    out, p, s = (torch.zeros(T, H, d, dtype=dtype) for _ in range(3))
    pl, sl, ol = (torch.zeros(H, T) for _ in range(3))
    mla_gen.merge_attn_states(out, p, pl, s, sl, ol, N)


def works(stub, dtype=BF16, d=D, kernel=KERNEL):
    """A good call launches the kernel it should."""
    before = stub.launches
    call(dtype, d)
    assert stub.launches == before + 1 and stub.kernel() == launched(kernel, T, H, threshold=N)


# ---- images ----

CORRUPTIONS = {
    "truncated": lambda b: b[: len(b) // 2],
    "bit-flipped": lambda b: b[:100] + bytes([b[100] ^ 0x10]) + b[101:],
    "zero-length": lambda b: b"",
    "padded": lambda b: b + b"\0",
}


@pytest.mark.parametrize("kind", ["cubin", "ptx"])
@pytest.mark.parametrize("how", CORRUPTIONS)
def test_a_corrupt_image_is_refused_before_the_driver_and_the_fix_is_named(driver, tmp_path, monkeypatch, kind, how):
    images = make_folder(tmp_path, kind=kind)
    monkeypatch.setenv("MLA_GEN_KERNELS", str(tmp_path))
    image = images[launched(KERNEL, T, H, threshold=N)]
    good = image.read_bytes()
    image.write_bytes(CORRUPTIONS[how](good))
    with pytest.raises(ImageError) as e:
        call()
    text = str(e.value)
    bad = image.read_bytes()
    import hashlib
    assert image.name in text and "does not match manifest.json" in text
    assert f"expected {len(good)} bytes, sha256 {hashlib.sha256(good).hexdigest()}" in text
    assert f"found {len(bad)} bytes, sha256 {hashlib.sha256(bad).hexdigest()}" in text
    assert f"mla-gen generate SPEC --out {tmp_path}" in text, "the fix for a $MLA_GEN_KERNELS folder"
    assert ("truncated or padded" in text) == (how != "bit-flipped")
    assert e.value.expected == (len(good), hashlib.sha256(good).hexdigest()) and e.value.kernel in text
    assert driver.loads == 0, "the driver never saw the image"
    image.write_bytes(good)  # fixed: the next call loads and launches
    works(driver)
    assert driver.loads == 1


@pytest.mark.parametrize("kind, listed, said", [("cubin", "ptx", "PTX text"), ("ptx", "cubin", "an ELF CUBIN")])
def test_an_image_of_another_kind_than_the_manifest_says_is_refused(driver, tmp_path, monkeypatch, kind, listed,
                                                                     said):
    """Size and sha256 right, the manifest wrong about the kind: a CUBIN listed as PTX (it would
    get a NUL and be parsed as text) or PTX listed as a CUBIN, refused before the driver."""
    images = make_folder(tmp_path, kind=kind)
    path = tmp_path / "manifest.json"
    m = json.loads(path.read_text())
    for k in m["kernels"]:
        k["archs"] = [{"arch": a["arch"], listed: a[kind]} for a in k["archs"]]
    path.write_text(json.dumps(m))
    monkeypatch.setenv("MLA_GEN_KERNELS", str(tmp_path))
    with pytest.raises(ImageError, match=f"is not {said}, which manifest.json says it is") as e:
        call()
    assert images[launched(KERNEL, T, H, threshold=N)].name in str(e.value)
    assert driver.loads == 0, "the driver never saw the image"


def test_a_missing_image_names_the_kernel_and_the_incomplete_folder(driver, folder):
    path, image = folder
    good = image.read_bytes()
    image.unlink()
    with pytest.raises(MissingImageError) as e:
        call()
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, mla_gen.KernelFolderError)
    text = str(e.value)
    name = launched(KERNEL, T, H, threshold=N)
    assert text.startswith(f"{name} needs ") and image.name in text and "the kernel folder is incomplete" in text
    assert "mla-gen generate SPEC --out" in text and e.value.found is None
    image.write_bytes(good)
    works(driver)


@pytest.mark.parametrize("origin, fix", [("package", "pip install --force-reinstall --no-deps ./python, or the mla_gen wheel"),
                                         ("source", "scripts/generate.sh"),
                                         ("env", "mla-gen generate SPEC --out")])
def test_the_fix_follows_where_the_folder_came_from(tmp_path, origin, fix):
    images = make_folder(tmp_path)
    kf = manifest.KernelFolder(tmp_path, str(tmp_path), origin)
    entry = kf.kernel(KERNEL)["archs"][0]["cubin"]
    images[KERNEL].write_bytes(b"x")
    with pytest.raises(ImageError, match=fix.replace(".", r"\.")):
        kf.image(entry, KERNEL)
    images[KERNEL].unlink()
    with pytest.raises(MissingImageError, match=fix.replace(".", r"\.")):
        kf.image(entry, KERNEL)


def test_each_image_is_checked_once_per_process(driver, folder, monkeypatch):
    checked = []
    real = manifest.KernelFolder.image
    monkeypatch.setattr(manifest.KernelFolder, "image",
                        lambda self, e, k: checked.append(e["file"]) or real(self, e, k))
    for _ in range(3):
        works(driver)
    assert len(checked) == 1 and driver.loads == 1


# ---- manifests ----

def test_a_truncated_manifest_names_the_file_and_the_fix(driver, folder):
    path, _ = folder
    good = (path / "manifest.json").read_bytes()
    (path / "manifest.json").write_bytes(good[: len(good) // 3])
    with pytest.raises(ManifestError, match=r"manifest\.json is not valid JSON .*truncated or corrupt; regenerate it"):
        call()
    (path / "manifest.json").write_bytes(good)
    works(driver)


def test_a_manifest_from_a_newer_schema_says_so(driver, folder):
    path, _ = folder
    good = edit_manifest(path, lambda m: m.update(schema_version=manifest.SCHEMA_VERSION + 1))
    with pytest.raises(ManifestError, match=f"schema_version {manifest.SCHEMA_VERSION + 1}; this package reads "
                                            f"{manifest.SCHEMA_VERSION} \\(written by a newer mla-gen"):
        call()
    (path / "manifest.json").write_bytes(good)
    works(driver)


@pytest.mark.parametrize("escape", ["../outside.cubin", "kernels/../../outside.cubin", "/abs/outside.cubin",
                                    "kernels\\..\\..\\outside.cubin"])
def test_images_outside_the_folder_are_refused(driver, folder, escape):
    path, image = folder
    (path.parent / "outside.cubin").write_bytes(image.read_bytes())  # a matching file is there: still refused

    def point_outside(m):
        art = next(k["archs"][0]["cubin"] for k in m["kernels"] if k["archs"][0]["cubin"]["file"].endswith(image.name))
        art["file"] = escape

    good = edit_manifest(path, point_outside)
    with pytest.raises(ManifestError, match="refused \\(an image must lie inside its kernel folder\\)") as e:
        call()
    assert repr(escape) in str(e.value)
    assert driver.loads == 0
    (path / "manifest.json").write_bytes(good)
    works(driver)
    # The folder refuses such a path on its own too, whatever the manifest held.
    kf = manifest.folder()
    with pytest.raises(ValueError, match="not a plain relative path"):
        kf.read_bytes(escape)


def test_an_image_without_size_and_hash_is_refused(driver, folder):
    path, _ = folder
    good = edit_manifest(path, lambda m: m["kernels"][0]["archs"][0]["cubin"].pop("sha256"))
    with pytest.raises(ManifestError, match="lacks a valid size and sha256"):
        call()
    (path / "manifest.json").write_bytes(good)
    works(driver)


# ---- the driver failing ----

@pytest.mark.parametrize("code, name, hint", [
    (2, "CUDA_ERROR_OUT_OF_MEMORY", "the GPU is out of memory: free some"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS", "left unusable by an earlier fault"),
])
def test_a_failed_load_raises_and_the_next_call_loads(driver, folder, code, name, hint):
    driver.set("load_error", code)
    for _ in range(2):  # nothing kept: each call tries again
        with pytest.raises(mla_gen.CudaError) as e:
            call()
        assert e.value.code == code and name in str(e.value) and hint in str(e.value)
        assert str(e.value).startswith("cuLibraryLoadData(kernels/")
    assert driver.loads == 0 and not _torch._plans
    driver.set("load_error", 0)
    works(driver)
    assert driver.loads == 1 and _cuda.stats["module_loads"] >= 1


def test_a_ptx_newer_than_the_driver_names_both_versions(driver, folder):
    driver.set("load_error", 222)
    with pytest.raises(mla_gen.CudaError) as e:
        call()
    nvrtc = manifest.folder().manifest["nvrtc"]
    want = (f"CUDA_ERROR_UNSUPPORTED_PTX_VERSION (stub driver): PTX ISA {nvrtc['ptx_isa']} from NVRTC "
            f"{nvrtc['release']} needs a CUDA {nvrtc['oldest_driver_cuda']} driver, this one is CUDA 12.8")
    assert want in str(e.value)
    driver.set("load_error", 0)
    works(driver)


def test_a_folder_built_for_other_archs_names_them(driver, folder, monkeypatch):
    path, _ = folder

    def other_arch(m):
        for k in m["kernels"]:
            k["archs"][0]["arch"] = "sm_120"

    good = edit_manifest(path, other_arch)
    with pytest.raises(mla_gen.KernelFolderError,
                       match=r"no CUBIN or PTX in .* runs on sm_90 \(its archs: sm_120\); generate a folder for it, "
                             r"`mla-gen generate SPEC --arch sm_90 --out DIR`, and set \$MLA_GEN_KERNELS=DIR"):
        call()
    assert driver.loads == 0
    (path / "manifest.json").write_bytes(good)  # a valid manifest stays read: the fixed folder as a new process sees it
    monkeypatch.setattr(manifest, "_folders", {})
    monkeypatch.setattr(manifest, "_by_path_cache", {})
    works(driver)


def test_a_failed_launch_raises_and_the_next_call_launches(driver, folder):
    works(driver)
    driver.set("launch_error", 700)
    for _ in range(2):
        with pytest.raises(mla_gen.CudaError, match="CUDA_ERROR_ILLEGAL_ADDRESS.*restart the process"):
            call()
    driver.set("launch_error", 0)
    works(driver)
    assert driver.loads == 1


class Interrupting:
    """The driver, with one function raising KeyboardInterrupt right after it succeeded (as a
    Ctrl-C arriving there would)."""

    def __init__(self, real, at: str):
        self.real, self.at, self.armed = real, at, True

    def __getattr__(self, name):
        f = getattr(self.real, name)
        if name != self.at or not self.armed:
            return f

        def interrupted(*args):
            err = f(*args)
            self.armed = False
            raise KeyboardInterrupt

        return interrupted

    def __getitem__(self, name):
        return self.real[name]


@pytest.mark.parametrize("at", ["image check", "cuDevicePrimaryCtxRetain", "cuDeviceGetAttribute",
                                "cuLibraryLoadData", "cuLibraryGetKernel", "cuKernelGetFunction"])
def test_an_interrupted_first_call_leaves_the_next_one_working(driver, folder, monkeypatch, at):
    real = _cuda.lib()
    if at == "image check":
        image = manifest.KernelFolder.image

        def interrupted(self, entry, kernel):
            monkeypatch.setattr(manifest.KernelFolder, "image", image)
            raise KeyboardInterrupt

        monkeypatch.setattr(manifest.KernelFolder, "image", interrupted)
    else:
        monkeypatch.setattr(_cuda, "_lib", Interrupting(real, at))
    with pytest.raises(KeyboardInterrupt):
        call()
    assert not _torch._plans
    works(driver)
    works(driver)
    # A library loaded before the interrupt and not kept (unrecorded, or unloaded) is loaded again, once.
    assert driver.loads == 1 + (at in ("cuLibraryLoadData", "cuLibraryGetKernel"))


def test_an_interrupt_at_any_line_of_a_first_call_leaves_the_next_one_working(driver, folder, monkeypatch):
    """KeyboardInterrupt raised at the n-th line the first call runs in _cuda and manifest (the
    driver opened, the manifest read, the image checked and loaded, the plan's launcher made, the
    launch), for every n until a call runs through: each time the next call launches, with at
    most one more load of the image, and no lock is left held. Lines holding a `with` or a `try:`
    are not interrupted: a trace function can raise there where CPython's signal handling cannot
    (after a `with`'s __enter__; at a `try:`'s no-op, where CPython 3.11 then skips the enclosing
    `with`'s exit), and would leave locks held that no Ctrl-C could."""
    files = {_cuda.__file__, manifest.__file__}
    lines = [0]
    stop_at = [0]

    def line_tracer(frame, event, arg):
        if event == "line" and not linecache.getline(frame.f_code.co_filename, frame.f_lineno).lstrip().startswith(
                ("with ", "try:")):
            lines[0] += 1
            if lines[0] == stop_at[0]:
                raise KeyboardInterrupt
        return line_tracer

    def tracer(frame, event, arg):
        return line_tracer if frame.f_code.co_filename in files else None

    for n in range(1, 10_000):
        # A process that has done nothing yet: no driver, contexts, kernels, plans or manifest.
        monkeypatch.setattr(_cuda, "_lib", None)
        for name in ("_cc", "_primary", "_kernels"):
            monkeypatch.setattr(_cuda, name, {})
        monkeypatch.setattr(_torch, "_plans", {})
        for slot in ("_last_pair", "_last_pair_op", "_last_ctx"):
            monkeypatch.setattr(_torch, slot, [None] * 4)
        monkeypatch.setattr(manifest, "_folders", {})
        monkeypatch.setattr(manifest, "_by_path_cache", {})
        lines[0], stop_at[0], loads = 0, n, driver.loads
        sys.settrace(tracer)
        try:
            call()
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        finally:
            sys.settrace(None)
        works(driver)
        assert driver.loads - loads <= 2, f"interrupted at line {n}: loaded {driver.loads - loads} times"
        held = [lock for lock in (_cuda._lock, _cuda._launch_lock, manifest.folder()._lock) if not free(lock)]
        assert not held, f"interrupted at line {n}: {held} left held"
        if not interrupted:
            break
    assert n > 100, f"only {n} lines traced: the sweep did not cover the load"


def free(lock) -> bool:
    """Whether another thread can take `lock` now."""
    got = []

    def take():
        if lock.acquire(timeout=5):
            got.append(True)
            lock.release()

    t = threading.Thread(target=take)
    t.start()
    t.join()
    return bool(got)


def test_32_threads_making_their_first_calls_load_each_module_once(driver, tmp_path, monkeypatch):
    shapes = [(BF16, 128, KERNEL), (torch.float16, 64, "merge_attn_states_f16_d64_thr_lse"),
              (torch.float32, 256, "merge_attn_states_f32_d256_thr_lse"),
              (BF16, 576, "merge_attn_states_bf16_d576_thr_lse")]
    make_folder(tmp_path, [s[2] for s in shapes])
    monkeypatch.setenv("MLA_GEN_KERNELS", str(tmp_path))
    start, errors, kernels = threading.Barrier(32), [], set()

    def first_call(k):
        dtype, d, _ = shapes[k % len(shapes)]
        try:
            start.wait()
            call(dtype, d)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=first_call, args=(k,)) for k in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert driver.launches == 32
    kernels = {launched(name, T, H, threshold=N) for _, _, name in shapes}
    assert driver.loads == len(kernels) == 4, "each module loaded once"
    for dtype, d, name in shapes:  # and every shape's next call is served too
        works(driver, dtype, d, name)
    assert driver.loads == 4


_FORK = """
import os, torch, mla_gen
from mla_gen import _torch
_torch._DEVICE_TYPE = "cpu"
_torch._stream = lambda device: 0
T, H, D = 8, 4, 128
out, p, s = (torch.zeros(T, H, D, dtype=torch.bfloat16) for _ in range(3))
pl, sl = torch.zeros(H, T), torch.zeros(H, T)
def call():
    mla_gen.merge_attn_states(out, p, pl, s, sl, None, 5)
if {parent_calls}:
    call()
pid = os.fork()
if pid == 0:
    code = 0
    for _ in range(2):
        try:
            call()
            code = 3
        except mla_gen.CudaError as e:
            code = 0 if "forked from one that had already used CUDA" in str(e) and "'spawn'" in str(e) else 4
            print(e, flush=True)
        if code:
            break
    os._exit(code)
_, status = os.waitpid(pid, 0)
call()
print("child", os.waitstatus_to_exitcode(status), "parent launches", mla_gen.stats()["launches"])
"""


def test_fork_after_the_first_call_gives_the_child_a_clear_error_and_the_parent_goes_on(stub_path, tmp_path):
    make_folder(tmp_path)
    r = run_child(_FORK.format(parent_calls=True), {"MLA_GEN_LIBCUDA": str(stub_path),
                                                     "MLA_GEN_KERNELS": str(tmp_path)}, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "child 0 parent launches 2" in r.stdout, r.stdout + r.stderr
    assert "mla_gen in a forked child failed" in r.stdout


def test_fork_before_any_call_leaves_the_child_free_to_use_the_driver(stub_path, tmp_path):
    make_folder(tmp_path)
    r = run_child(_FORK.format(parent_calls=False), {"MLA_GEN_LIBCUDA": str(stub_path),
                                                      "MLA_GEN_KERNELS": str(tmp_path)}, timeout=120)
    # The child's calls launch (exit 3: no error), the parent's too.
    assert "child 3 parent launches 1" in r.stdout, r.stdout + r.stderr

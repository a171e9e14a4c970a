"""The compiled op (mla_gen/_C.abi3.so) and the choice between it and the Python implementation,
without a GPU.

- Where the imported package has the compiled op: in a child process with a stand-in driver
  (ext/stub_driver.c) and the op also registered for CPU tensors ($MLA_GEN_EXT_CPU), every call
  of ext/compare_cpu.py launches what the Python path launches (kernel, grid, parameters) or is
  refused by both; and the package falls back to Python with the file removed or
  $MLA_GEN_PURE_PYTHON set.
- Always: the ops' schemas are the same whichever implementation serves them, and the driver
  stand-in header (python/csrc/driver/cuda.h) agrees with a real cuda.h where one is found.

Without a compiled op these skip, unless $MLA_GEN_EXPECT_COMPILED=1 (CI's installed wheel),
where they fail instead; so do the native build's without one for the running torch, unless
$MLA_GEN_EXPECT_NATIVE=1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import mla_gen  # noqa: E402
from mla_gen import _ext, ops  # noqa: E402

HERE = Path(__file__).resolve().parent
CSRC = HERE.parents[0] / "csrc"
EXPECT = os.environ.get("MLA_GEN_EXPECT_COMPILED", "") not in ("", "0")
EXPECT_NATIVE = os.environ.get("MLA_GEN_EXPECT_NATIVE", "") not in ("", "0")


def _need_compiled():
    if _ext.candidate() is None:
        if EXPECT:
            pytest.fail("MLA_GEN_EXPECT_COMPILED is set, but the package has no compiled op")
        pytest.skip("this mla_gen has no compiled op (a pure-Python build)")


def _gcc():
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler")
    return gcc


def _child(code_or_file, env_extra, cwd=None):
    env = dict(os.environ)
    for name in ("MLA_GEN_KERNELS", "MLA_GEN_PURE_PYTHON"):  # the child chooses as a plain import would
        env.pop(name, None)
    env.update(env_extra)
    pkg_parent = str(Path(mla_gen.__file__).resolve().parents[1])
    env["PYTHONPATH"] = pkg_parent + os.pathsep + env.get("PYTHONPATH", "")
    args = [sys.executable, str(code_or_file)] if isinstance(code_or_file, Path) else [sys.executable, "-c", code_or_file]
    # cwd: the imported package's parent, so that `-c` code imports that package (not python/'s)
    return subprocess.run(args, env=env, capture_output=True, text=True, cwd=cwd or pkg_parent, timeout=300)


def _stub(tmp_path):
    stub = tmp_path / "libcuda_stub.so"
    subprocess.run([_gcc(), "-shared", "-fPIC", "-O1", str(HERE / "ext" / "stub_driver.c"), "-o", str(stub)],
                   check=True)
    return stub


def _package_copy(tmp_path, *ignore):
    """A copy of the imported package under tmp_path/site, without `ignore` (glob patterns)."""
    copy = tmp_path / "site" / "mla_gen"
    shutil.copytree(Path(mla_gen.__file__).resolve().parent, copy,
                    ignore=shutil.ignore_patterns("__pycache__", *ignore))
    return copy


def _run_copy(copy, code, env_extra=None):
    """`code` in a child that imports the package copy (its folder first on the path)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLA_GEN_KERNELS", "MLA_GEN_PURE_PYTHON")}
    env.update(env_extra or {}, PYTHONPATH=str(copy.parent))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=str(copy.parents[1]), timeout=300)


def test_the_choice_is_reported():
    # ops.compiled and _ext.reason say which implementation serves torch.ops.mla_gen.merge_attn_states.
    assert ops.compiled == (_ext.loaded is not None)
    assert ops.compiled == (_ext.reason is None), _ext.reason  # a reason exactly where it did not load
    if EXPECT:
        assert ops.compiled, _ext.reason


def _build_env(build):
    """The child's environment for a build of the op: the stable one ($MLA_GEN_NATIVE_OP=0), or the
    native one for this torch's release (skipped where the package has none)."""
    if build == "stable":
        return {"MLA_GEN_NATIVE_OP": "0"}
    _need_native()
    return {}


def _need_native():
    if _ext.native_candidate() is None:
        if EXPECT_NATIVE:
            pytest.fail(f"MLA_GEN_EXPECT_NATIVE is set, but the package has no native build for torch {torch.__version__}")
        pytest.skip(f"the package has no native build for torch {torch.__version__}")


@pytest.mark.parametrize("build", ["stable", "native"])
def test_compiled_op_launches_what_the_python_path_launches(tmp_path, build):
    # Each build of the op (they share python/csrc/op_core.h; each reads its stack its own way).
    _need_compiled()
    env = _build_env(build)
    stub = _stub(tmp_path)
    r = _child(HERE / "ext" / "compare_cpu.py", {"MLA_GEN_EXT_CPU": "1", "MLA_GEN_LIBCUDA": str(stub), **env})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cases agree" in r.stdout and f"({build} build:" in r.stdout, r.stdout


@pytest.mark.parametrize("build", ["stable", "native"])
def test_a_copy_on_write_output_gets_its_own_storage(tmp_path, build):
    # An output that still shares its storage (torch._lazy_clone) is materialized before the kernel
    # writes it, as torch's own ops do: the original keeps its values.
    _need_compiled()
    if not hasattr(torch, "_lazy_clone"):
        pytest.skip("this torch has no copy-on-write tensors")
    env = _build_env(build)
    stub = _stub(tmp_path)
    code = ("import torch, mla_gen\n"
            "from mla_gen import ops, _ext\n"
            "assert ops.compiled and _ext.build == %r, (_ext.build, _ext.reason)\n"
            "v0, l0 = torch.zeros(4, 2, 128, dtype=torch.bfloat16), torch.zeros(4, 2)\n"
            "v, s = torch._lazy_clone(v0), torch._lazy_clone(l0)\n"
            "torch.ops.mla_gen.merge_state_in_place(v, s, torch.zeros_like(v0), torch.zeros_like(l0))\n"
            "assert not torch._C._is_cow_tensor(v) and not torch._C._is_cow_tensor(s)\n"
            "assert v.data_ptr() != v0.data_ptr() and s.data_ptr() != l0.data_ptr()\n"
            "print('own storage')\n") % build
    r = _child(code, {"MLA_GEN_EXT_CPU": "1", "MLA_GEN_LIBCUDA": str(stub), **env})
    assert r.returncode == 0 and "own storage" in r.stdout, r.stdout + r.stderr


def test_the_native_build_serves_its_torch_release_only():
    # The native build (a TORCH_LIBRARY op of one torch release) loads under that release; another
    # release, or $MLA_GEN_NATIVE_OP=0, gets the stable one.
    _need_compiled()
    _need_native()
    native = _ext.native_candidate()
    code = ("import torch\n"
            "{fake}"
            "import mla_gen\n"
            "from mla_gen import ops, _ext\n"
            "assert ops.compiled, _ext.reason\n"
            "print(_ext.build, _ext.loaded.name)\n")
    assert _child(code.format(fake=""), {}).stdout.split() == ["native", native.name]
    assert _child(code.format(fake=""), {"MLA_GEN_NATIVE_OP": "0"}).stdout.split() == ["stable", _ext.candidate().name]
    other = _child(code.format(fake="torch.__version__ = '2.99.0'\n"), {})
    assert other.stdout.split() == ["stable", _ext.candidate().name], other.stdout + other.stderr


_SCHEMAS = ("import torch, mla_gen, json\n"
            "from mla_gen import ops\n"
            "print(json.dumps({'compiled': ops.compiled, 'schemas': {n: str(getattr(torch.ops.mla_gen, n).default._schema)"
            " for n in ops.SCHEMAS}}))\n")


def test_pure_python_is_chosen_when_asked_and_registers_the_same_schemas():
    import json
    here = json.loads(_child(_SCHEMAS, {}).stdout)
    pure = json.loads(_child(_SCHEMAS, {"MLA_GEN_PURE_PYTHON": "1"}).stdout)
    assert pure["compiled"] is False
    assert here["schemas"] == pure["schemas"]


def test_a_torch_below_the_stable_abi_gets_the_python_path():
    # torch 2.9 and older lack the stable ABI the op needs: the version decides before any load.
    _need_compiled()
    code = ("import torch\n"
            "torch.__version__ = '2.9.1+cu128'\n"
            "import mla_gen\n"
            "from mla_gen import ops, _ext\n"
            "assert not ops.compiled and 'predates' in _ext.reason, _ext.reason\n"
            "assert _ext.loaded is None\n"
            "print('python path ok')\n")
    r = _child(code, {})
    assert r.returncode == 0 and "python path ok" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("build", ["stable", "native"])
def test_threads_share_the_compiled_op(tmp_path, build):
    # Launches from many threads at once, each its own shapes: every one the Python path's kernel.
    _need_compiled()
    env = _build_env(build)
    stub = _stub(tmp_path)
    code = ("import threading, torch, mla_gen\n"
            "from mla_gen import ops\n"
            "assert ops.compiled\n"
            "errors = []\n"
            "def work(k):\n"
            "    D = (64, 128, 576)[k % 3]\n"
            "    dt = (torch.float16, torch.bfloat16, torch.float32)[k % 3]\n"
            "    o, p, s = (torch.zeros(k + 1, 2, D, dtype=dt) for _ in range(3))\n"
            "    l = torch.zeros(2, k + 1)\n"
            "    try:\n"
            "        for n in range(200):\n"
            "            torch.ops.mla_gen.merge_attn_states(o, None, p, l, s, l.clone(), n % (k + 2))\n"
            "    except Exception as e:\n"
            "        errors.append(repr(e))\n"
            "ts = [threading.Thread(target=work, args=(k,)) for k in range(8)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
            "assert not errors, errors\n"
            "assert mla_gen.stats()['launches'] >= 8 * 200 - 8\n"
            "print('threads ok')\n")
    r = _child(code, {"MLA_GEN_EXT_CPU": "1", "MLA_GEN_LIBCUDA": str(stub), **env})
    assert r.returncode == 0 and "threads ok" in r.stdout, r.stdout + r.stderr


def test_without_the_extension_file_the_python_path_serves(tmp_path):
    _need_compiled()
    copy = _package_copy(tmp_path, "_C*.so")
    code = ("import mla_gen, torch\n"
            "from mla_gen import ops, _ext\n"
            "assert mla_gen.__file__.startswith(%r), mla_gen.__file__\n"
            "assert not ops.compiled and 'no compiled op' in _ext.reason, _ext.reason\n"
            "from torch._subclasses.fake_tensor import FakeTensorMode\n"
            "with FakeTensorMode():\n"
            "    o = torch.empty(4, 2, 128, dtype=torch.bfloat16, device='cuda')\n"
            "    l = torch.empty(2, 4, device='cuda')\n"
            "    torch.ops.mla_gen.merge_attn_states(o, l, o.clone(), l.clone(), o.clone(), l.clone(), 3)\n"
            "print('fallback ok')\n") % str(copy)
    r = _run_copy(copy, code)
    assert r.returncode == 0 and "fallback ok" in r.stdout, r.stdout + r.stderr


def test_the_compiled_op_embeds_no_image():
    # Each image once in the wheel: the op's library holds none of the package's PTX (a run of
    # text from the middle of each of a few files is not in it).
    _need_compiled()
    pkg = Path(mla_gen.__file__).resolve().parent
    ptx = sorted((pkg / "kernels").rglob("*.ptx"))[:5]
    if not ptx:
        pytest.skip("the package's kernels have no PTX")
    for build in sorted(pkg.glob("_C*.so")):  # the stable op and every native build
        library = build.read_bytes()
        for f in ptx:
            text = f.read_bytes()
            middle = text[len(text) // 2:len(text) // 2 + 200]
            assert len(middle) == 200 and middle not in library, f"{f.name}'s text is inside {build.name}"


def test_the_compiled_op_reads_and_checks_the_package_images(tmp_path):
    # A copy of the package whose images are damaged: the op refuses to load the one it needs
    # (size and sha256 against the manifest, before the driver sees it), naming the file; and it
    # reads the copy's own kernels/, not the installed package's.
    _need_compiled()
    stub = _stub(tmp_path)
    copy = _package_copy(tmp_path)
    for f in (copy / "kernels").rglob("*"):
        if f.suffix in (".cubin", ".ptx"):
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    code = ("import torch, mla_gen\n"
            "from mla_gen import ops\n"
            "assert ops.compiled and mla_gen.__file__.startswith(%r), mla_gen.__file__\n"
            "o, p, s = (torch.zeros(4, 2, 128, dtype=torch.bfloat16) for _ in range(3))\n"
            "l = torch.zeros(2, 4)\n"
            "try:\n"
            "    torch.ops.mla_gen.merge_attn_states(o, None, p, l, s, l.clone(), 2)\n"
            "except RuntimeError as e:\n"
            "    print('refused:', str(e).splitlines()[0])\n") % str(copy)
    r = _run_copy(copy, code, {"MLA_GEN_EXT_CPU": "1", "MLA_GEN_LIBCUDA": str(stub)})
    assert "refused:" in r.stdout, r.stdout + r.stderr
    line = r.stdout.split("refused:", 1)[1]
    assert str(copy / "kernels") in line and "is not the image the manifest records" in line, line


def test_without_the_kernel_folder_the_python_path_serves(tmp_path):
    _need_compiled()
    copy = _package_copy(tmp_path, "kernels")
    code = ("import mla_gen\n"
            "from mla_gen import ops, _ext\n"
            "assert not ops.compiled and 'images are missing' in _ext.reason, _ext.reason\n"
            "print('fallback ok')\n")
    r = _run_copy(copy, code)
    assert r.returncode == 0 and "fallback ok" in r.stdout, r.stdout + r.stderr


def test_driver_header_agrees_with_a_real_cuda_h(tmp_path):
    # The stand-in cuda.h carries the values and layouts of the toolkit's; compare the two where a
    # real one is at hand ($CUDA_HOME, the nvidia-cuda-runtime wheels of CUDA 13 and 12).
    places = [Path(os.environ["CUDA_HOME"]) / "include"] if os.environ.get("CUDA_HOME") else []
    try:
        import nvidia
        places += [Path(p) / sub / "include" for p in nvidia.__path__ for sub in ("cu13", "cuda_runtime")]
    except ImportError:
        pass
    places.append(Path("/usr/local/cuda/include"))
    real = next((p for p in places if (p / "cuda.h").is_file()), None)
    if real is None:
        pytest.skip("no real cuda.h here")
    probe = tmp_path / "probe.c"
    probe.write_text(
        "#include <cuda.h>\n#include <stddef.h>\n#include <stdio.h>\n"
        "int main(void) {\n"
        "  printf(\"%d %d %d %d %d\\n\", (int)CUDA_SUCCESS, (int)CUDA_ERROR_INVALID_CONTEXT,\n"
        "         (int)CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, (int)CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,\n"
        "         (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);\n"
        "  printf(\"%zu %zu %zu %zu %zu\\n\", sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value),\n"
        "         sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, numAttrs));\n"
        "  CUlaunchAttributeValue v; printf(\"%zu %zu\\n\", sizeof v,\n"
        "         (size_t)((char*)&v.programmaticStreamSerializationAllowed - (char*)&v));\n"
        "  return 0;\n}\n")
    outs = []
    for inc in (real, CSRC / "driver"):
        exe = tmp_path / f"probe_{len(outs)}"
        subprocess.run([_gcc(), "-std=c11", f"-I{inc}", str(probe), "-o", str(exe)], check=True)
        outs.append(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)
    assert outs[0] == outs[1], f"real cuda.h:\n{outs[0]}stand-in:\n{outs[1]}"

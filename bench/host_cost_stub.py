"""Host cost of the Python layer alone, without a GPU: the torch layer on CPU tensors with the
driver stubbed out as in the tests (python/tests/conftest.py, ``cpu_launch``): no kernel is
loaded, ``_cuda.launch`` is a no-op, so what is timed is the package's per-call Python work (the
plan lookup, the per-call pointer checks, the parameter gathering) and nothing of CUDA.

Cases: the plain ``merge_attn_states`` call (with an output lse and a threshold, and without
either), the package's op registered again for the CPU key (torch.ops.mla_gen_stub, called as
the packet and as ``.default``: the dispatcher's cost over the function), and, where the kernel folder has the kernel, the same call with the empty-context mask
(``query_start_loc``/``context_start_loc``), and the pair it replaces
(``mask_empty_context_lse``, then the plain call). Back-to-back calls timed with perf_counter, the
cases interleaved round by round; the minimum over rounds is the least disturbed (the median is
printed too). Compare two trees by running this with each on PYTHONPATH.

With ``--driver-stub`` the launch is not dropped: ``_cuda.launch`` runs as on a GPU (the
parameter buffer, the context check, the ctypes call) into ``stub_libcuda.c``, compiled here with
``cc`` and loaded as libcuda.so.1 (the script re-executes itself with LD_LIBRARY_PATH set), whose
functions return at once: the package's whole host cost but the driver's. Works with any tree
that opens "libcuda.so.1" (so it compares old and new trees alike).

With ``MLA_GEN_C_LAUNCH=1`` and a package that has ``mla_gen._launch`` (a built wheel on
PYTHONPATH: scripts/build-wheel.sh), the launch goes through that C call instead (docs/PYTHON.md,
"The C launch").

With ``--compiled`` (implies --driver-stub; an installed wheel with the compiled op on
PYTHONPATH) the compiled op is registered for CPU tensors too ($MLA_GEN_EXT_CPU) and calls the
C launcher into the same stub: rows for it as the op, and for the plain function's arguments sent
to it (plain_via_compiled: the function itself does not call it), and for an op of its schema on
the stable ABI doing nothing (stable_floor/, compiled here with c++), beside the Python path's.

Usage: python3 bench/host_cost_stub.py [--calls N] [--rounds R] [--ctx-kernels DIR] [--driver-stub] [--compiled]
       (MLA_GEN_KERNELS: the folder for the plain calls; --ctx-kernels: the folder holding the
       _ctxmask kernels, e.g. the output of `mla-gen generate tests/gpu-ctxmask.toml`)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

if "mla_gen" not in sys.modules and not any(Path(p, "mla_gen").is_dir() for p in sys.path if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mla_gen  # noqa: E402
from mla_gen import _cuda, _torch  # noqa: E402


class _FakeKernel:
    def function(self, device):
        return 0xF00


def stub_driver(driver: bool = False):
    """What conftest's cpu_launch does, for a script: CPU tensors, no kernel loaded, launches
    dropped; with `driver`, launches go through _cuda.launch into the stub libcuda instead."""
    _torch._DEVICE_TYPE = "cpu"
    _cuda.kernel = lambda folder, meta: _FakeKernel()
    _cuda.primary_context = lambda device: 0xC0
    _torch._stream = lambda device: 0x7F00C0DE0000
    if driver:
        import ctypes
        if not hasattr(ctypes.CDLL("libcuda.so.1"), "mla_gen_stub_driver"):
            sys.exit("libcuda.so.1 here is not the stub (run with --driver-stub)")
        _cuda.lib()
    else:
        _cuda.launch = lambda launcher, values, gx, gy, stream: None


def stub_op():
    """torch.ops.mla_gen_stub.merge_attn_states: the package's op (schema, implementation, fake)
    registered the same way for the CPU key, so the dispatcher's cost shows on CPU tensors."""
    from mla_gen import ops
    lib = torch.library.Library("mla_gen_stub", "DEF")
    lib.define(ops.SCHEMAS["merge_attn_states"])
    lib.impl("merge_attn_states", ops.IMPLS["merge_attn_states"], "CPU")
    torch.library.register_fake("mla_gen_stub::merge_attn_states", ops.FAKES["merge_attn_states"], lib=lib)
    stub_op.lib = lib  # the op lives as long as the library object
    return torch.ops.mla_gen_stub.merge_attn_states


def floor_op():
    """torch.ops.mla_gen_stub_floor.merge_attn_states: the op's schema for the CPU key with an
    implementation that does nothing (the dispatcher's own share, as host_cost.py's floor row)."""
    from mla_gen import ops
    lib = torch.library.Library("mla_gen_stub_floor", "DEF")
    lib.define(ops.SCHEMAS["merge_attn_states"])
    lib.impl("merge_attn_states", lambda *args: None, "CPU")
    floor_op.lib = lib
    return torch.ops.mla_gen_stub_floor.merge_attn_states


_STUB_DIR = "MLA_GEN_STUB_LIBCUDA_DIR"


def plain_via_compiled(op_default):
    """The plain function sending the calls the compiled op serves to `op_default`
    (torch.ops.mla_gen.merge_attn_states.default) and the others to its Python path: what it
    costs routed so, with the test it made when it was (before session 9)."""
    env_get, env_key, plain = _torch._env_get, _torch._ENV_KEY, mla_gen.merge_attn_states

    def merge(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None,
              prefill_tokens_with_context=None, output_scale=None, *, output_group_scales=None, ue8m0=False,
              lse_layout="head_major", query_start_loc=None, context_start_loc=None):
        if (output_group_scales is None and query_start_loc is None and context_start_loc is None
                and lse_layout == "head_major" and env_get(env_key) is None
                and (prefill_tokens_with_context is None or type(prefill_tokens_with_context) is int)):
            return op_default(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse,
                              prefill_tokens_with_context, output_scale)
        return plain(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
                     prefill_tokens_with_context, output_scale, output_group_scales=output_group_scales, ue8m0=ue8m0,
                     lse_layout=lse_layout, query_start_loc=query_start_loc, context_start_loc=context_start_loc)

    return merge


_libraries = []  # the torch.library.Library objects of the ops defined here: they live while defined


def stable_floor():
    """torch.ops.mla_gen_bench_floor.merge_attn_states (stable_floor/stable_floor.cpp: the compiled
    op's schema on the stable ABI, doing nothing), compiled now with c++ against this torch's
    headers; None, the reason printed, where it cannot be."""
    import shutil
    import subprocess
    import tempfile
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if cxx is None:
        print("# no C++ compiler: no stable-ABI floor")
        return None
    root = Path(torch.__file__).parent
    out = Path(tempfile.mkdtemp(prefix="mla-gen-floor-")) / "stable_floor.so"
    src = Path(__file__).with_name("stable_floor") / "stable_floor.cpp"
    r = subprocess.run([cxx, "-std=c++17", "-O2", "-shared", "-fPIC", f"-I{root / 'include'}", str(src),
                        f"-L{root / 'lib'}", "-ltorch_cpu", "-o", str(out)], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"# the stable-ABI floor did not build: {r.stderr.strip()[-300:]}")
        return None
    lib = torch.library.Library("mla_gen_bench_floor", "DEF")
    lib.define(mla_gen.ops.SCHEMAS["merge_attn_states"])
    _libraries.append(lib)
    torch.ops.load_library(str(out))
    return torch.ops.mla_gen_bench_floor.merge_attn_states


def _reexec_with_stub_driver(compiled: bool = False):
    """Compile stub_libcuda.c as libcuda.so.1 into a temporary folder and rerun this script with
    that folder first on LD_LIBRARY_PATH (the loader reads it at process start only)."""
    import shutil
    import subprocess
    import tempfile
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        sys.exit("--driver-stub needs a C compiler (cc, or $CC)")
    d = tempfile.mkdtemp(prefix="mla-gen-stub-libcuda-")
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", os.path.join(d, "libcuda.so.1"),
                    str(Path(__file__).with_name("stub_libcuda.c"))], check=True)
    env = dict(os.environ, **{_STUB_DIR: d, "LD_LIBRARY_PATH": d + os.pathsep + os.environ.get("LD_LIBRARY_PATH", "")})
    if compiled:  # read by the compiled op as it loads
        env.update(MLA_GEN_EXT_CPU="1", MLA_GEN_LIBCUDA=os.path.join(d, "libcuda.so.1"))
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--ctx-kernels", default=None, help="a kernel folder with _ctxmask kernels")
    ap.add_argument("--driver-stub", action="store_true", help="launch through ctypes into a stub libcuda")
    ap.add_argument("--compiled", action="store_true", help="also the compiled op, on CPU tensors, into the stub")
    args = ap.parse_args()
    args.driver_stub |= args.compiled
    if args.driver_stub and _STUB_DIR not in os.environ:
        _reexec_with_stub_driver(args.compiled)
    if args.compiled and not mla_gen.ops.compiled:
        sys.exit(f"--compiled: this mla_gen's compiled op is not in use ({mla_gen._ext.reason})")
    stub_driver(args.driver_stub)
    T, H, D = 1, 1, 128
    bf = torch.bfloat16
    p, s, out = (torch.zeros(T, H, D, dtype=bf) for _ in range(3))
    pl, sl, ol = (torch.zeros(H, T) for _ in range(3))
    qsl = torch.tensor([0, T], dtype=torch.int32)
    csl = torch.tensor([0, 0], dtype=torch.int32)
    f = mla_gen.merge_attn_states
    op = stub_op()
    floor = floor_op()
    cases = {
        "plain: output_lse, threshold": lambda: f(out, p, pl, s, sl, ol, 1),
        "plain: no output_lse, no threshold": lambda: f(out, p, pl, s, sl),
        "plain: no output_lse, threshold (host_cost.py's call)": lambda: f(out, p, pl, s, sl, None, 1),
        "op (CPU copy), packet: output_lse, threshold": lambda: op(out, ol, p, pl, s, sl, 1),
        "op (CPU copy), .default: output_lse, threshold": lambda: op.default(out, ol, p, pl, s, sl, 1),
        "op (CPU copy), packet: no output_lse, threshold": lambda: op(out, None, p, pl, s, sl, 1),
        "floor: op of the same schema doing nothing": lambda: floor(out, None, p, pl, s, sl, 1),
    }
    env = os.environ.get("MLA_GEN_KERNELS")
    if args.ctx_kernels:
        def ctx():
            os.environ["MLA_GEN_KERNELS"] = args.ctx_kernels
            try:
                f(out, p, pl, s, sl, ol, 1, query_start_loc=qsl, context_start_loc=csl)
            finally:
                if env is None:
                    del os.environ["MLA_GEN_KERNELS"]
                else:
                    os.environ["MLA_GEN_KERNELS"] = env

        def in_ctx_folder(body):
            def timer(calls):
                os.environ["MLA_GEN_KERNELS"] = args.ctx_kernels
                try:
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        body()
                    return time.perf_counter() - t0
                finally:
                    if env is None:
                        del os.environ["MLA_GEN_KERNELS"]
                    else:
                        os.environ["MLA_GEN_KERNELS"] = env
            return timer

        def pair():
            mla_gen.mask_empty_context_lse(pl, qsl, csl)
            f(out, p, pl, s, sl, ol, 1)

        ctx()  # fails here, before any timing, where the package or the folder has no such kernel

    def loop(fn, calls):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return time.perf_counter() - t0

    timers = {name: (lambda calls, fn=fn: loop(fn, calls)) for name, fn in cases.items()}
    if args.compiled:
        cop = torch.ops.mla_gen.merge_attn_states
        timers["compiled op, packet: no output_lse, threshold"] = lambda calls: loop(
            lambda: cop(out, None, p, pl, s, sl, 1), calls)
        timers["compiled op, packet: output_lse, threshold"] = lambda calls: loop(
            lambda: cop(out, ol, p, pl, s, sl, 1), calls)
        timers["compiled op, .default: no output_lse, threshold"] = lambda calls: loop(
            lambda: cop.default(out, None, p, pl, s, sl, 1), calls)
        sfloor = stable_floor()
        if sfloor is not None:
            timers["floor: stable-ABI op doing nothing (C++)"] = lambda calls: loop(
                lambda: sfloor(out, None, p, pl, s, sl, 1), calls)
        via_op = plain_via_compiled(cop.default)
        timers["plain's arguments -> compiled op .default"] = lambda calls: loop(
            lambda: via_op(out, p, pl, s, sl, None, 1), calls)
    if args.ctx_kernels:
        timers["ctxmask: output_lse, threshold, start locations"] = in_ctx_folder(
            lambda: f(out, p, pl, s, sl, ol, 1, query_start_loc=qsl, context_start_loc=csl))
        timers["pair: mask_empty_context_lse + plain call"] = in_ctx_folder(pair)
    samples = {name: [] for name in timers}
    for timer in timers.values():
        timer(1000)
    for _ in range(args.rounds):
        for name, timer in timers.items():
            samples[name].append(timer(args.calls) / args.calls * 1e6)
    res = {name: {"min_us": min(v), "median_us": statistics.median(v)} for name, v in samples.items()}
    what = "ctypes launch into a stub libcuda" if args.driver_stub else "launch dropped"
    print(f"# {what}, CPU tensors; torch {torch.__version__}, python {sys.version.split()[0]}, "
          f"mla_gen from {Path(mla_gen.__file__).parent}; {args.rounds} rounds x {args.calls} calls")
    for name, r in res.items():
        print(f"{name:52} min {r['min_us']:6.3f} us   median {r['median_us']:6.3f} us")
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        Path(out_dir, "host_cost_stub.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

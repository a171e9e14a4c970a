"""Per-call host cost, in one process: mla-gen's plain function, its registered op
(torch.ops.mla_gen.merge_attn_states, called as the packet and as its .default overload), a Triton kernel launched the way vLLM launches its Triton
merge_attn_states (vLLM's signature, a JIT launcher call per merge), and torch.Tensor.zero_() on
one element (a floor: one torch op, one kernel launch), and three floors of the op: an op of the
same schema whose implementation does nothing (in Python; and in C++ on the stable ABI, as the
compiled op is: host_cost_stub.stable_floor), and a Python function doing nothing; the
function's path with each launch (ctypes, and mla_gen._launch's one C call: the default where the
package has it); then the launch alone, as ctypes calls of cuLaunchKernelEx with the values as one
buffer (`extra`: what the package passes) and as a pointer per value (kernelParams), and of
cuLaunchKernel, with the same kernel, parameters and stream.

Method: a tiny shape (1 token, 1 head, D = 128, bf16) so the GPU never holds the host back;
back-to-back calls timed with perf_counter, the implementations interleaved round by round;
the minimum over rounds is the least disturbed (the median is reported too), and each ratio is
given for both (min over min, median over median).
Targets: function <= 0.5x the Triton launcher, op <= 0.6x (the packet call: what callers write).

With the wheel's compiled op (mla_gen.ops.compiled; its native build for this torch where the
wheel has one, $MLA_GEN_NATIVE_OP=0 for the stable one: run twice to compare) the op rows time it, and two rows time the
pure-Python implementation in the same process (the op's Python implementation under another
namespace, the function's Python path); each against issue 22's bar, a compiled TORCH_LIBRARY op
with vLLM's launcher (7.6 us on the H200). The plain function runs its Python fast path either
way; one more row times what it would cost sending its calls to the compiled op instead (its
signature and the test the function made when it did so, then the op's .default). An installed mla_gen is used where
there is one (PYTHONPATH), else the tree's python/.

Usage: python3 bench/host_cost.py [--calls N] [--rounds R]  (JSON to $OUT/host_cost.json)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
# An installed mla_gen (the wheel, with its compiled op) wins over the tree's python/.
sys.path.append(str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
import mla_gen  # noqa: E402
from bench import triton_merge  # noqa: E402  the repository's Triton baseline kernel
from host_cost_stub import plain_via_compiled, stable_floor  # noqa: E402

# A compiled TORCH_LIBRARY op with vLLM's launcher, measured on the H200 (DESIGN.md, 2026-12-01):
# the bar for the compiled op and for the function (issue 22) where this run cannot build its own
# (vllm_op/vllm_op.cu, with nvcc: the bar measured in the same run).
VLLM_OP_US = 7.6
VLLM_OP_ROW = "TORCH_LIBRARY op, vLLM's launcher (built here)"
# The plain function runs its Python fast path whether or not the compiled op loaded (_torch.py).
FUNCTION = "mla_gen.merge_attn_states (function, Python fast path)"
PLAIN_VIA_OP = "the function's arguments sent to the compiled op"
PY_LAUNCH_ROW = "pure-Python function path, ctypes launch"
C_LAUNCH_ROW = "pure-Python function path, C launch"
EXTRA_ROW = "ctypes cuLaunchKernelEx alone (same launch: extra, one buffer)"
PARAMS_ROW = "ctypes cuLaunchKernelEx alone, kernelParams (a pointer per value)"
PLAIN_ROW = "ctypes cuLaunchKernel alone (same launch values, extra)"


def build_vllm_op():
    """torch.ops.mla_gen_bench_vllm.merge_attn_states, compiled now; None (with the reason
    printed) where it cannot be."""
    try:
        from torch.utils import cpp_extension
        cpp_extension.load(name="mla_gen_bench_vllm_op", sources=[str(HERE / "vllm_op" / "vllm_op.cu")],
                           extra_cuda_cflags=["-O3", "-std=c++17"], is_python_module=False, verbose=False)
        return torch.ops.mla_gen_bench_vllm.merge_attn_states
    except Exception as e:  # noqa: BLE001  (no nvcc, no headers: the constant bar)
        print(f"# the vLLM-launcher op could not be built here ({type(e).__name__}: {str(e)[:200]}); "
              f"bar = {VLLM_OP_US} us measured before")
        return None


def vllm_triton_merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None,
                                  prefill_tokens_with_context=None):
    """vLLM's Triton path as it is called: the dispatcher's signature, one JIT launcher call."""
    n = output.shape[0] if prefill_tokens_with_context is None else prefill_tokens_with_context
    triton_merge(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    T, H, D, dtype = 1, 1, 128, torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    p = torch.empty(T, H, D, device="cuda", dtype=dtype).uniform_(-4, 4, generator=g)
    s = torch.empty(T, H, D, device="cuda", dtype=dtype).uniform_(-4, 4, generator=g)
    pl = torch.empty(H, T, device="cuda").uniform_(-4, 4, generator=g)
    sl = torch.empty(H, T, device="cuda").uniform_(-4, 4, generator=g)
    out = torch.empty_like(p)
    one = torch.empty(1, device="cuda")
    op = torch.ops.mla_gen.merge_attn_states
    op_default = op.default
    # The dispatcher's own share: an op of the same schema whose CUDA implementation does
    # nothing, beside a Python function that does nothing with the same arguments.
    floor_lib = torch.library.Library("mla_gen_host_cost_floor", "DEF")
    floor_lib.define(mla_gen.ops.SCHEMAS["merge_attn_states"])

    def nothing(*args):
        return None

    floor_lib.impl("merge_attn_states", nothing, "CUDA")
    floor_op = torch.ops.mla_gen_host_cost_floor.merge_attn_states.default
    # The pure-Python implementation beside the compiled one, in the same process: the op's Python
    # implementation registered under another namespace, and the function's Python path (its own
    # slot, as the function uses when the compiled op is absent).
    compiled = mla_gen.ops.compiled
    py_lib = torch.library.Library("mla_gen_host_cost_py", "DEF")
    py_lib.define(mla_gen.ops.SCHEMAS["merge_attn_states"])
    py_lib.impl("merge_attn_states", mla_gen.functions.merge_attn_states_op, "CUDA")
    py_op = torch.ops.mla_gen_host_cost_py.merge_attn_states
    py_slot = [None, None, None, None]
    py_merge = mla_gen.functions._merge
    suffix = " (compiled)" if compiled else " (Python: no compiled op)"
    impls = {
        FUNCTION: lambda: mla_gen.merge_attn_states(out, p, pl, s, sl, None, 1),
        "torch.ops.mla_gen.merge_attn_states (op)" + suffix: lambda: op(out, None, p, pl, s, sl, 1),
        "torch.ops.mla_gen.merge_attn_states.default" + suffix: lambda: op_default(out, None, p, pl, s, sl, 1),
        "pure-Python op (same schema)": lambda: py_op(out, None, p, pl, s, sl, 1),
        PY_LAUNCH_ROW: lambda: py_merge(py_slot, "head_major", out, None, p, pl, s, sl, None, 1),
        "triton, vLLM-style launcher": lambda: vllm_triton_merge_attn_states(out, p, pl, s, sl, None, 1),
        "torch.Tensor.zero_ (1 element)": lambda: one.zero_(),
        "floor: op of the same schema doing nothing": lambda: floor_op(out, None, p, pl, s, sl, 1),
    }
    sfloor = stable_floor()  # what the stable ABI's boxing costs any op of this schema
    if sfloor is not None:
        impls["floor: stable-ABI op doing nothing (C++)"] = lambda: sfloor(out, None, p, pl, s, sl, 1)
    if compiled:
        via_op = plain_via_compiled(op_default)
        impls[PLAIN_VIA_OP] = lambda: via_op(out, p, pl, s, sl, None, 1)
    vllm_op = build_vllm_op()
    if vllm_op is not None:
        impls[VLLM_OP_ROW] = lambda: vllm_op(out, None, p, pl, s, sl, 1)
        vfloor = torch.ops.mla_gen_bench_vllm.nothing  # the bar's floor: its schema, unboxed, no work
        impls["floor: TORCH_LIBRARY op doing nothing (C++)"] = lambda: vfloor(out, None, p, pl, s, sl, 1)
    impls |= {
        "floor: Python function doing nothing": lambda: nothing(out, None, p, pl, s, sl, 1),
    }
    # The function's path with each launch: the struct and two ctypes calls, and one call of
    # mla_gen._launch (python/csrc/launch.c; the default where the package has it). Each slot is
    # planned while its launch is the one in force (a plan keeps the path it was made with); the
    # difference of the two rows is the launch's. The default is restored for every other row.
    cuda = mla_gen._cuda
    cuda.lib()  # the driver opened: its launch path is the default from here on
    c_default = cuda._c_launch is not None
    def plan(slot, c_launch):
        """The slot holding a plan made with that launch (a layout's first call launches
        unplanned; the second takes the plan into the slot)."""
        cuda.use_c_launch(c_launch)
        mla_gen._torch._plans.clear()
        for _ in range(2):
            py_merge(slot, "head_major", out, None, p, pl, s, sl, None, 1)
        assert ("L_c" in slot[2].run.__code__.co_freevars) == c_launch, "the slot's plan launches as asked"

    plan(py_slot, False)
    c_slot = [None, None, None, None]
    if cuda.use_c_launch(True):
        plan(c_slot, True)
        impls[C_LAUNCH_ROW] = lambda: py_merge(c_slot, "head_major", out, None, p, pl, s, sl, None, 1)
    cuda.use_c_launch(c_default)
    mla_gen._torch._plans.clear()
    # The driver call alone, on the function's plan (its buffer as the last launch packed it):
    # what ctypes and the driver cost for each entry point, the package's Python aside.
    for _ in range(3):
        py_merge(py_slot, "head_major", out, None, p, pl, s, sl, None, 1)
    launcher = py_slot[2].launcher
    # The package passes the values as one buffer (`extra`); the same values through kernelParams
    # (an array of a pointer per value, as cudarc and vLLM's launches pass them) beside it.
    base = ctypes.addressof(launcher.buffer) + 8 * cuda._CONFIG_WORDS
    count = launcher.size.value // 8
    pointers = (ctypes.c_void_p * count)(*[base + 8 * i for i in range(count)])
    if launcher.ex:
        impls[EXTRA_ROW] = lambda: cuda._cu_launch_ex(launcher.config_ref, launcher.function, None, launcher.extra)
        impls[PARAMS_ROW] = lambda: cuda._cu_launch_ex(launcher.config_ref, launcher.function, pointers, None)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    gx, gy = py_slot[2].gx, py_slot[2].gy
    impls[PLAIN_ROW] = (
        lambda: cuda._cu_launch(launcher.function, gx, gy, 1, launcher.block, 1, 1, launcher.shmem, stream,
                                None, launcher.extra))
    for name in (EXTRA_ROW, PARAMS_ROW, PLAIN_ROW):
        if name in impls:
            err = impls[name]()
            assert err == 0, f"{name}: CUresult {err}"
    samples = {name: [] for name in impls}
    for fn in impls.values():
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    for _ in range(args.rounds):
        for name, fn in impls.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            samples[name].append((time.perf_counter() - t0) / args.calls * 1e6)
    torch.cuda.synchronize()
    res = {name: {"min_us": min(v), "median_us": statistics.median(v)} for name, v in samples.items()}
    tri = res["triton, vLLM-style launcher"]
    targets = {FUNCTION: 0.5, "torch.ops.mla_gen.merge_attn_states (op)" + suffix: 0.6,
               "torch.ops.mla_gen.merge_attn_states.default" + suffix: 0.6}
    prop = torch.cuda.get_device_properties(0)
    print(f"# host cost per call, {prop.name}, torch {torch.__version__}, {args.rounds} rounds x {args.calls} calls, "
          f"interleaved; mla_gen from {Path(mla_gen.__file__).parent}, compiled op: "
          f"{'yes, ' + str(mla_gen._ext.build) + ' build' if compiled else 'no (' + str(mla_gen._ext.reason) + ')'}; the function's launch: "
          f"{'C (mla_gen._launch)' if c_default else 'ctypes'}")
    measured = VLLM_OP_ROW in res
    bar = res[VLLM_OP_ROW]["min_us"] if measured else VLLM_OP_US
    print(f"# bar (issue 22): op and function <= {bar:.2f} us, a TORCH_LIBRARY op with vLLM's launcher "
          + ("(built and timed in this run, min of rounds)" if measured else "(DESIGN.md, H200 2026-12-01)"))
    print(f"{'':62} {'min us':>8} {'median us':>10} {'x triton (min)':>15} {'x triton (median)':>18}  target")
    for name, r in res.items():
        r["x_triton"] = r["min_us"] / tri["min_us"]
        r["x_triton_median"] = r["median_us"] / tri["median_us"]
        target = targets.get(name)
        r["target"] = target
        verdict = ""
        if target is not None:
            verdict = (f"<= {target}: min {'met' if r['x_triton'] <= target else 'MISSED'}, "
                       f"median {'met' if r['x_triton_median'] <= target else 'MISSED'}")
        if name in (FUNCTION, PLAIN_VIA_OP, PY_LAUNCH_ROW, C_LAUNCH_ROW) or name.startswith("torch.ops.mla_gen.merge_attn_states"):
            r["x_vllm_op"] = r["min_us"] / bar
            verdict += f"; {r['x_vllm_op']:.2f}x vLLM's op ({'met' if r['min_us'] <= bar else 'MISSED'})"
            if measured:
                r["x_vllm_op_median"] = r["median_us"] / res[VLLM_OP_ROW]["median_us"]
                verdict += f", median {r['x_vllm_op_median']:.2f}x"
        print(f"{name:62} {r['min_us']:>8.2f} {r['median_us']:>10.2f} {r['x_triton']:>15.2f} "
              f"{r['x_triton_median']:>18.2f}  {verdict}")
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        import triton
        Path(out_dir, "host_cost.json").write_text(json.dumps(
            {"device": prop.name, "torch": torch.__version__, "triton": triton.__version__,
             "mla_gen": mla_gen.__version__, "compiled_op": compiled, "op_build": mla_gen._ext.build, "c_launch": c_default, "vllm_op_us": bar, "vllm_op_measured": measured, "calls": args.calls, "rounds": args.rounds, "results": res}, indent=1))


if __name__ == "__main__":
    main()

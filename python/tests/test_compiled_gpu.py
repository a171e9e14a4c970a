"""GPU tests of the compiled op (mla_gen/_C.abi3.so: torch.ops.mla_gen.merge_attn_states in C++
through the generated C launcher): the op and the plain function that calls it match the float64
reference and, bit for bit, the pure-Python implementation (the same kernels); opcheck passes; a
refused call launches nothing and the plain function still raises the typed error. Skipped
without a GPU, and where the package has no compiled op (unless $MLA_GEN_EXPECT_COMPILED=1)."""

from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU (run python/gpu_checks.sh on a GPU machine)", allow_module_level=True)

import mla_gen  # noqa: E402
from mla_gen import _ext, _torch, ops  # noqa: E402
from test_merge import check, lse_check, make, reference  # noqa: E402

if not ops.compiled:
    if os.environ.get("MLA_GEN_EXPECT_COMPILED", "") not in ("", "0"):
        raise AssertionError(f"MLA_GEN_EXPECT_COMPILED is set, but the compiled op did not load: {_ext.reason}")
    pytest.skip(f"the compiled op is not in use: {_ext.reason}", allow_module_level=True)

OP = torch.ops.mla_gen.merge_attn_states


def _python_op(*args):
    """The pure-Python implementation of the op (what serves it without the compiled op)."""
    _torch.merge_attn_states_op(*args)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("T,H,D,pad", [(1, 1, 128, 0), (7, 3, 64, 0), (1000, 16, 128, 0), (300, 4, 128, 64),
                                       (64, 2, 576, 0), (4096, 8, 64, 0)])
@pytest.mark.parametrize("with_lse,n", [(True, None), (False, None), (True, "half")])
def test_compiled_op_matches_reference_and_python(dtype, T, H, D, pad, with_lse, n):
    prefix, plse, suffix, slse = make(T, H, D, dtype, pad=pad, seed=T + H + D)
    if T > 2:  # edge cases: +inf / -inf / both empty / NaN lse
        plse[0, 0], slse[0, 1 % T] = math.inf, -math.inf
        plse[0, 2 % T] = slse[0, 2 % T] = -math.inf
        plse[-1, -1] = math.nan
    thr = T // 2 if n == "half" else None
    ref, ref_lse, mag, copy = reference(prefix, plse, suffix, slse, T if thr is None else thr)
    outs = {}
    for how in ("op", "function", "python"):
        out = torch.full((T, H, D), math.nan, device="cuda", dtype=dtype)
        out_lse = torch.full((H, T), math.nan, device="cuda") if with_lse else None
        if how == "op":
            OP(out, out_lse, prefix, plse, suffix, slse, thr)
        elif how == "function":
            mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, out_lse, thr)
        else:
            _python_op(out, out_lse, prefix, plse, suffix, slse, thr)
        outs[how] = (out, out_lse)
    torch.cuda.synchronize()
    out, out_lse = outs["op"]
    check(out, ref, mag, copy, dtype)
    if with_lse:
        lse_check(out_lse, ref_lse)
    for how in ("function", "python"):
        o, ol = outs[how]
        assert torch.equal(o.view(torch.uint8 if dtype != torch.float32 else torch.int32),
                           out.view(torch.uint8 if dtype != torch.float32 else torch.int32)), how
        if with_lse:
            assert torch.equal(ol.view(torch.int32), out_lse.view(torch.int32)), how


def test_the_op_counts_its_launches():
    prefix, plse, suffix, slse = make(8, 2, 128, torch.bfloat16)
    out = torch.empty_like(prefix)
    before = mla_gen.stats()["launches"]
    for n in range(5):
        OP(out, None, prefix, plse, suffix, slse, n)
    assert mla_gen.stats()["launches"] == before + 5


def test_opcheck_compiled_merge_attn_states():
    prefix, plse, suffix, slse = make(64, 4, 128, torch.bfloat16)
    out, out_lse = torch.empty_like(prefix), torch.empty_like(plse)
    torch.library.opcheck(OP.default, (out, out_lse, prefix, plse, suffix, slse, 40, None))
    torch.library.opcheck(OP.default, (out, None, prefix, plse, suffix, slse, None, None))


def test_refusals_launch_nothing_and_the_function_raises_the_typed_error():
    prefix, plse, suffix, slse = make(8, 2, 128, torch.bfloat16)
    out = torch.full_like(prefix, math.nan)
    before = mla_gen.stats()["launches"]
    with pytest.raises(RuntimeError, match="prefill_tokens_with_context = 9 exceeds its maximum num_tokens = 8"):
        OP(out, None, prefix, plse, suffix, slse, 9)
    with pytest.raises(RuntimeError, match="output overlaps prefix_output"):
        OP(prefix, None, prefix, plse, suffix, slse, None)
    with pytest.raises(RuntimeError, match="no generated merge_attn_states kernel"):
        OP(out[..., :100].contiguous(), None, prefix[..., :100].contiguous(), plse, suffix[..., :100].contiguous(),
           slse, None)
    with pytest.raises(mla_gen.ArgumentError, match="exceeds its maximum num_tokens = 8"):
        mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, None, 9)
    with pytest.raises(TypeError, match="must be a Python int"):
        mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, None, 2.5)
    torch.cuda.synchronize()
    assert mla_gen.stats()["launches"] == before
    assert out.isnan().all(), "a refused call wrote the output"


def test_cuda_graph_and_a_side_stream():
    prefix, plse, suffix, slse = make(512, 8, 128, torch.float16, seed=5)
    out = torch.empty_like(prefix)
    OP(out, None, prefix, plse, suffix, slse, 100)  # warm
    stream = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(g, stream=stream):
            OP(out, None, prefix, plse, suffix, slse, 100)
    out.fill_(math.nan)
    g.replay()
    torch.cuda.synchronize()
    ref, _, mag, copy = reference(prefix, plse, suffix, slse, 100)
    check(out, ref, mag, copy, torch.float16)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_the_tensors_device_whatever_the_current_one():
    with torch.cuda.device(1):
        prefix, plse, suffix, slse = make(64, 4, 128, torch.bfloat16, seed=9)
    out = torch.empty_like(prefix)
    with torch.cuda.device(0):
        OP(out, None, prefix, plse, suffix, slse, 10)
    torch.cuda.synchronize(1)
    ref, _, mag, copy = reference(prefix, plse, suffix, slse, 10)
    check(out, ref, mag, copy, torch.bfloat16)

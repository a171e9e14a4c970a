"""GPU tests of the compiled op (mla_gen/_C.abi3.so: every torch.ops.mla_gen op in C++
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
from mla_gen import _ext, functions, ops  # noqa: E402
from test_merge import check, lse_check, make, reference  # noqa: E402

if not ops.compiled:
    if os.environ.get("MLA_GEN_EXPECT_COMPILED", "") not in ("", "0"):
        raise AssertionError(f"MLA_GEN_EXPECT_COMPILED is set, but the compiled op did not load: {_ext.reason}")
    pytest.skip(f"the compiled op is not in use: {_ext.reason}", allow_module_level=True)

OP = torch.ops.mla_gen.merge_attn_states


def _python_op(*args):
    """The pure-Python implementation of the op (what serves it without the compiled op)."""
    functions.merge_attn_states_op(*args)


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


def _family_cases():
    """(op, its arguments) for every op of torch.ops.mla_gen beside the plain merge, on CUDA."""
    T, H, D, bf = 37, 4, 128, torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(3)

    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    def i32(*v):
        return torch.tensor(v, dtype=torch.int32, device="cuda")

    fp8 = torch.float8_e4m3fn
    cases = [("merge_states", [r(T, K, H, D, dtype=bf), r(T, K, H)]) for K in (1, 3, 4)]
    cases += [("merge_state_in_place", [r(T, H, D, dtype=bf), r(T, H), r(T, H, D, dtype=bf), r(T, H), mask,
                                        "token_major"]) for mask in (None, (r(T) > 0).to(torch.uint8))]
    cases.append(("merge_state_in_place", [r(T, H, D, dtype=bf), r(H, T), r(T, H, D, dtype=bf), r(H, T), None,
                                           "head_major"]))
    cases += [("mask_empty_context_lse", [r(H, T), i32(0, 10, 30, 37), i32(0, 0, 5, 5), "head_major"]),
              ("mask_empty_context_lse", [r(T, H), i32(0, 10, 30, 37), i32(0, 0, 5, 5), "token_major"])]
    for group in (64, 128):
        for ue8m0 in (False, True):
            cases.append(("merge_attn_states_fp8_group",
                          [torch.empty(T, H, D, dtype=fp8, device="cuda"), torch.empty(T, H * D // group, device="cuda"),
                           r(H, T), r(T, H, D, dtype=bf), r(H, T), r(T, H, D, dtype=bf), r(H, T), 20, ue8m0, None, None]))
    cases.append(("merge_attn_states", [torch.empty(T, H, D, dtype=bf, device="cuda"), r(H, T), r(T, H, D, dtype=bf),
                                        r(H, T), r(T, H, D, dtype=bf), r(H, T), 20, None, i32(0, 10, 30, 37),
                                        i32(0, 0, 5, 5)]))
    return cases


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t.contiguous().view(torch.int16 if t.element_size() == 2
                                                                                 else torch.int32)


def test_every_family_matches_the_python_implementation():
    # The compiled op serves every op from the table the Python path reads: where the kernel
    # folder has the family's kernel, each op writes what the Python implementation writes, bit
    # for bit (the same kernels); where it has none, both refuse.
    served = 0
    for name, args in _family_cases():
        mine = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        theirs = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        try:
            python_result = ops.IMPLS[name](*theirs)
        except ValueError as e:  # the same refusal (where no kernel serves, each names its own folder)
            with pytest.raises(RuntimeError) as refused:
                getattr(torch.ops.mla_gen, name)(*mine)
            assert str(refused.value).split(" in ")[0] == str(e).split(" in ")[0], (name, refused.value, e)
            continue
        result = getattr(torch.ops.mla_gen, name)(*mine)
        torch.cuda.synchronize()
        served += 1
        for a, b in zip(mine + list(result or ()), theirs + list(python_result or ())):
            if isinstance(a, torch.Tensor):
                assert torch.equal(_bits(a), _bits(b)), name
        # opcheck runs the op on copies (its own outputs for merge_states); its schema test
        # multiplies the outputs, which torch does not implement for float8_e4m3fn.
        if name not in ("merge_states", "merge_attn_states_fp8_group"):
            torch.library.opcheck(getattr(torch.ops.mla_gen, name).default, tuple(mine))
    print(f"{served} calls served by both")
    assert served, "every call was refused: the folder serves none of the families"

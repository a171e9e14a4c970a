"""The fused empty-context mask (``query_start_loc``/``context_start_loc`` of merge_attn_states)
without a GPU: the op's schema and fake, kernel selection, num_requests from the start
locations' shape, the generic check's verdicts on the new arguments, and the errors the package
raises itself (one start location without the other, no `_ctxmask` kernel for the call).
The launch is replaced by a recorder (conftest's `cpu_launch`); `contract_kernels` is the
contract table's folder, which holds merge_attn_states_bf16_d128_thr_lse_ctxmask."""

import re

import pytest

torch = pytest.importorskip("torch")

import mla_gen  # noqa: E402

from conftest import launched  # noqa: E402
from mla_gen import ArgumentError, manifest  # noqa: E402

BF16 = torch.bfloat16
T, H, D = 8, 4, 128
CTX = "merge_attn_states_bf16_d128_thr_lse_ctxmask"
PLAIN = "merge_attn_states_bf16_d128_thr_lse"


def pair(dtype=BF16, t=T, h=H, d=D):
    g = torch.Generator().manual_seed(1)
    prefix = torch.randn(t, h, d, generator=g).to(dtype)
    suffix = torch.randn(t, h, d, generator=g).to(dtype)
    plse, slse = torch.randn(h, t, generator=g), torch.randn(h, t, generator=g)
    return torch.empty(t, h, d, dtype=dtype), prefix, plse, suffix, slse


def locs(*qsl, ctx=None, dtype=torch.int32):
    q = torch.tensor(qsl, dtype=dtype)
    c = torch.tensor(ctx if ctx is not None else [0] * len(qsl), dtype=dtype)
    return q, c


# ---- the operator ----

def test_the_op_takes_the_start_locations_after_vllms_arguments():
    args = torch.ops.mla_gen.merge_attn_states.default._schema.arguments
    assert [a.name for a in args] == ["output", "output_lse", "prefix_output", "prefix_lse", "suffix_output",
                                      "suffix_lse", "prefill_tokens_with_context", "output_scale",
                                      "query_start_loc", "context_start_loc"]
    for a in args[-2:]:
        assert str(a.type) == "Optional[Tensor]" and a.default_value is None
        assert a.alias_info is None, "the start locations are read, never written"
    group = [a.name for a in torch.ops.mla_gen.merge_attn_states_fp8_group.default._schema.arguments]
    assert group[-2:] == ["query_start_loc", "context_start_loc"]


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def meta_pair():
    return (meta(T, H, D, dtype=BF16), meta(H, T), meta(T, H, D, dtype=BF16), meta(H, T),
            meta(T, H, D, dtype=BF16), meta(H, T))


def test_the_fake_takes_the_start_locations_both_or_neither():
    out, out_lse, p, pl, s, sl = meta_pair()
    q, c = meta(3, dtype=torch.int32), meta(3, dtype=torch.int32)
    op = torch.ops.mla_gen.merge_attn_states
    assert op(out, out_lse, p, pl, s, sl, 5, None, q, c) is None
    assert op(out, out_lse, p, pl, s, sl, query_start_loc=q, context_start_loc=c) is None
    assert op(out, out_lse, p, pl, s, sl, 5) is None
    with pytest.raises(ValueError, match="query_start_loc given without context_start_loc"):
        op(out, out_lse, p, pl, s, sl, 5, None, q, None)
    with pytest.raises(ValueError, match="context_start_loc given without query_start_loc"):
        op(out, out_lse, p, pl, s, sl, context_start_loc=c)
    fp8 = meta(T, H, D, dtype=torch.float8_e4m3fn)
    assert torch.ops.mla_gen.merge_attn_states_fp8_group(fp8, meta(T, H * D // 64), None, p, pl, s, sl, None, False,
                                                         q, c) is None
    with pytest.raises(ValueError, match="query_start_loc given without context_start_loc"):
        torch.ops.mla_gen.merge_attn_states_fp8_group(fp8, meta(T, H * D // 64), None, p, pl, s, sl,
                                                      query_start_loc=q)


def test_compile_traces_the_op_with_start_locations():
    def f(out, p, pl, s, sl, out_lse, q, c):
        torch.ops.mla_gen.merge_attn_states(out, out_lse, p, pl, s, sl, 3, None, q, c)
        return out

    out, out_lse, p, pl, s, sl = meta_pair()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(out, p, pl, s, sl, out_lse,
                                                                meta(3, dtype=torch.int32), meta(3, dtype=torch.int32))
    assert got.shape == (T, H, D)


def test_the_op_forwards_the_start_locations(cpu_launch, contract_kernels):
    from mla_gen import ops
    out, p, pl, s, sl = pair()
    q, c = locs(0, 3, 8, ctx=[0, 0, 5])
    ops._merge_attn_states(out, None, p, pl, s, sl, 6, None, q, c)
    name, v, _ = cpu_launch.last()
    assert name == launched(CTX, T, H, threshold=6)
    assert v["query_start_loc"] == q.data_ptr() and v["context_start_loc"] == c.data_ptr()
    ops._merge_attn_states(out, None, p, pl, s, sl, 6, None)
    assert cpu_launch.last()[0] == launched("merge_attn_states_bf16_d128_thr", T, H, threshold=6)  # no output lse, no mask


# ---- supports() and kernel selection ----

def test_supports_knows_the_fused_mask(contract_kernels):
    assert mla_gen.supports(BF16, 128, output_lse=True, threshold=True, mask_empty_context=True)
    assert mla_gen.supports(BF16, 128, mask_empty_context=True)
    assert mla_gen.supports(BF16, 128, output_lse=True, threshold=True)
    assert not mla_gen.supports(torch.float16, 128, mask_empty_context=True)
    assert not mla_gen.supports(BF16, 128, output="fp8_e4m3", mask_empty_context=True)


def test_supports_asks_for_any_tensor_by_its_name(contract_kernels):
    """A tensor of the family's calls (binding.json), named with True, is asked for as the
    keyword that names it: the next option's tensor needs no keyword of supports()."""
    for dtype in (BF16, torch.float16):
        for d in (64, 128):
            assert (mla_gen.supports(dtype, d, query_start_loc=True, context_start_loc=True, output_lse=True)
                    == mla_gen.supports(dtype, d, mask_empty_context=True, output_lse=True)), (dtype, d)
    assert mla_gen.supports(BF16, 128, query_start_loc=True, context_start_loc=True)
    assert not mla_gen.supports(BF16, 128, query_start_loc=True)  # the kernels take both or neither
    assert mla_gen.supports(BF16, 128, query_start_loc=False)  # not given: the plain kernel
    assert not mla_gen.supports(BF16, 128, no_such_tensor=True)  # an unknown name stays a select key


def test_the_default_kernels_have_the_fused_mask():
    """The default kernels (generated/) carry a _ctxmask kernel of every default dtype and head
    size, with the inputs' dtype and with per-tensor FP8 output, as they carry the plain ones."""
    if manifest.load()["spec"]["source"] != "<embedded default spec>":
        pytest.skip("this kernel folder is not the default spec's")
    for dtype in (torch.float16, BF16, torch.float32):
        for d in (64, 80, 96, 112, 128, 192, 256, 512, 576):
            for output in ("same", "fp8_e4m3"):
                for mask in (False, True):
                    assert mla_gen.supports(dtype, d, output_lse=True, threshold=True, output=output,
                                            mask_empty_context=mask), (dtype, d, output, mask)
    assert not mla_gen.supports(BF16, 100, mask_empty_context=True)


def test_the_start_locations_pick_the_ctxmask_kernel(cpu_launch, contract_kernels):
    out, p, pl, s, sl = pair()
    out_lse = torch.empty(H, T)
    q, c = locs(0, 3, 5, 7, ctx=[0, 0, 4, 4])  # B = 3; requests 0 and 2 have no context; token 7 in none
    mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, 6, query_start_loc=q, context_start_loc=c)
    name, v, grid = cpu_launch.last()
    ctx, plain = launched(CTX, T, H, threshold=6), launched(PLAIN, T, H, threshold=6)  # dense tensors: the twins
    assert name == ctx
    assert v["num_requests"] == 3 == q.numel() - 1
    assert (v["query_start_loc"], v["context_start_loc"]) == (q.data_ptr(), c.data_ptr())
    assert (v["num_tokens"], v["num_heads"], v["prefill_tokens_with_context"]) == (T, H, 6)
    assert v["output"] == out.data_ptr() and v["output_lse"] == out_lse.data_ptr()
    assert v["prefix_lse"] == pl.data_ptr()
    launch = manifest.folder().kernel(ctx)["launch"]
    assert grid == (-(-T // launch["grid_x"]["per_block"]), -(-H // launch["grid_y"]["per_block"]))
    # The same layouts: a planned call; the plain call beside it keeps its own kernel and plan.
    plans = mla_gen.stats()["plans"]
    for n in (0, 2):
        mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, n, query_start_loc=q, context_start_loc=c)
        assert cpu_launch.last()[0] == ctx and cpu_launch.last()[1]["prefill_tokens_with_context"] == n
    assert mla_gen.stats()["plans"] == plans
    # n = T: the dense plan leaves it to the all-context twin, planned once.
    for _ in range(2):
        mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, T, query_start_loc=q, context_start_loc=c)
        assert cpu_launch.last()[0] == launched(CTX, T, H) and cpu_launch.last()[1]["prefill_tokens_with_context"] == T
    assert mla_gen.stats()["plans"] == plans + 1
    mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, 6)
    assert cpu_launch.last()[0] == plain and "num_requests" not in cpu_launch.last()[1]
    mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, 6, query_start_loc=q, context_start_loc=c)
    assert cpu_launch.last()[0] == ctx
    # No threshold: n = T. Another B: another plan, num_requests follows.
    mla_gen.merge_attn_states(out, p, pl, s, sl, query_start_loc=q, context_start_loc=c)
    assert cpu_launch.last()[1]["prefill_tokens_with_context"] == T and cpu_launch.last()[1]["output_lse"] == 0
    q1, c1 = locs(0, 8, ctx=[0, 0])
    mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, 6, query_start_loc=q1, context_start_loc=c1)
    assert cpu_launch.last()[0] == ctx and cpu_launch.last()[1]["num_requests"] == 1
    q0, c0 = locs(0)  # B = 0: nothing is masked, the kernel still runs the merge
    mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, 6, query_start_loc=q0, context_start_loc=c0)
    assert cpu_launch.last()[0] == ctx and cpu_launch.last()[1]["num_requests"] == 0
    # A view into a larger buffer: its own pointer and length.
    big = torch.tensor([9, 0, 3, 5, 7, 9], dtype=torch.int32)
    mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, 6, query_start_loc=big[1:5], context_start_loc=c)
    assert cpu_launch.last()[1]["query_start_loc"] == big.data_ptr() + 4


def test_the_planned_path_still_checks_pointers(cpu_launch, contract_kernels):
    out, p, pl, s, sl = pair()
    out_lse = torch.empty(H, T)
    q, c = locs(0, 3, 8, ctx=[0, 0, 5])
    mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, 6, query_start_loc=q, context_start_loc=c)
    # Start locations inside output_lse's memory: the same layout, so the planned path sees it.
    inside = out_lse.view(-1)[:3].view(torch.int32)
    with pytest.raises(ArgumentError, match="output_lse overlaps query_start_loc"):
        mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, 6, query_start_loc=inside, context_start_loc=c)
    with pytest.raises(ArgumentError, match="prefill_tokens_with_context = 9 exceeds its maximum num_tokens = 8"):
        mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, 9, query_start_loc=q, context_start_loc=c)
    assert len(cpu_launch.launches) == 1


def test_fp8_outputs_with_the_mask(cpu_launch, contract_kernels):
    """The contract table has no FP8 `_ctxmask` kernel: a clear error, not the unmasked kernel."""
    _, p, pl, s, sl = pair()
    fp8 = torch.empty(T, H, D, dtype=torch.float8_e4m3fn)
    q, c = locs(0, 8, ctx=[0, 0])
    with pytest.raises(ValueError, match="no generated merge_attn_states kernel .*output=fp8_e4m3.* with the "
                                         r"empty-context mask \(mask_empty_context = true\)"):
        mla_gen.merge_attn_states(fp8, p, pl, s, sl, output_scale=torch.ones(1), query_start_loc=q,
                                  context_start_loc=c)
    with pytest.raises(ValueError, match="no generated merge_attn_states kernel .*fp8_e4m3_group.* with the "
                                         "empty-context mask"):
        mla_gen.merge_attn_states(fp8, p, pl, s, sl, output_group_scales=torch.empty(T, H * D // 64),
                                  query_start_loc=q, context_start_loc=c)
    with pytest.raises(ValueError, match="context_start_loc given without query_start_loc"):
        mla_gen.merge_attn_states_fp8_group(fp8, torch.empty(T, H * D // 64), p, pl, s, sl, context_start_loc=c)
    assert not cpu_launch.launches


# ---- errors ----

def test_one_start_location_without_the_other(cpu_launch, contract_kernels):
    out, p, pl, s, sl = pair()
    q, c = locs(0, 8, ctx=[0, 0])
    with pytest.raises(ValueError, match=r"^query_start_loc given without context_start_loc: the empty-context "
                                         r"mask needs both start locations \(int32 \[B \+ 1\] each\), or neither$"):
        mla_gen.merge_attn_states(out, p, pl, s, sl, query_start_loc=q)
    with pytest.raises(ValueError, match="^context_start_loc given without query_start_loc"):
        mla_gen.merge_attn_states(out, p, pl, s, sl, None, 4, context_start_loc=c)
    assert not cpu_launch.launches


def test_no_ctxmask_kernel_for_the_call(cpu_launch, contract_kernels):
    q, c = locs(0, 8, ctx=[0, 0])
    out, p, pl, s, sl = pair(dtype=torch.float16)
    with pytest.raises(ValueError, match=r"^no generated merge_attn_states kernel for dtype=torch.float16, "
                                         r"head_size=128, output=same, lse_layout=head_major with the "
                                         r"empty-context mask \(mask_empty_context = true\) in .*; add it to a spec "
                                         r"as a \[\[merge_attn_states\]\] table, with `include_default = true` to "
                                         r"keep every default kernel \(docs/SPEC.md\), generate it \(`mla-gen "
                                         r"generate SPEC --out DIR`\) and set MLA_GEN_KERNELS=DIR$"):
        mla_gen.merge_attn_states(out, p, pl, s, sl, query_start_loc=q, context_start_loc=c)
    out, p, pl, s, sl = pair(d=64)
    with pytest.raises(ValueError, match="head_size=64, .* with the empty-context mask"):
        mla_gen.merge_attn_states(out, p, pl, s, sl, query_start_loc=q, context_start_loc=c)
    out, p, pl, s, sl = pair()
    with pytest.raises(ValueError, match="lse_layout=token_major with the empty-context mask"):
        mla_gen.merge_attn_states(out, p, pl.t().contiguous(), s, sl.t().contiguous(), lse_layout="token_major",
                                  query_start_loc=q, context_start_loc=c)
    assert not cpu_launch.launches


def test_the_default_kernels_run_the_fused_call(cpu_launch):
    if manifest.load()["spec"]["source"] != "<embedded default spec>":
        pytest.skip("this kernel folder is not the default spec's")
    out, p, pl, s, sl = pair()
    q, c = locs(0, 8, ctx=[0, 0])
    mla_gen.merge_attn_states(out, p, pl, s, sl, torch.empty(H, T), 3, query_start_loc=q, context_start_loc=c)
    assert cpu_launch.last()[0] == launched(CTX, T, H, threshold=3)
    mla_gen.merge_attn_states(out, p, pl, s, sl, torch.empty(H, T), 3)  # the plain call is unaffected
    assert cpu_launch.last()[0] == launched(PLAIN, T, H, threshold=3)


@pytest.mark.parametrize("case", ["i64", "rank", "lengths", "empty", "device", "overlap", "tensor"])
def test_the_generic_checks_judge_the_start_locations(cpu_launch, contract_kernels, case):
    out, p, pl, s, sl = pair()
    out_lse = torch.empty(H, T)
    q, c = locs(0, 3, 8, ctx=[0, 0, 5])
    if case == "i64":
        q = q.long()
        exc, want = ArgumentError, f"{CTX}: query_start_loc is i64, the kernel takes i32"
    elif case == "rank":
        c = c.view(1, 3)
        exc, want = ValueError, r"context_start_loc must have 1 dimensions \[B\+1\], got shape \(1, 3\)"
    elif case == "lengths":  # B comes from query_start_loc; context_start_loc must have B + 1 entries too
        c = torch.zeros(4, dtype=torch.int32)
        exc, want = ValueError, r"context_start_loc has B\+1=4 where query_start_loc has B\+1=3"
    elif case == "empty":
        q = c = torch.zeros(0, dtype=torch.int32)
        # named as the tensor that holds too few, not as the integer it would give (num_requests = -1)
        exc, want = ValueError, re.escape("query_start_loc must hold at least 1 along B+1 = num_requests + 1 "
                                          "(num_requests >= 0), got shape (0,)")
    elif case == "device":
        c = c.to("meta")
        exc, want = ValueError, "context_start_loc is on meta; the kernels run on a CUDA device"
    elif case == "overlap":
        q = out_lse.view(-1)[4:7].view(torch.int32)
        exc, want = ArgumentError, f"{CTX}: output_lse overlaps query_start_loc"
    elif case == "tensor":
        q = [0, 3, 8]
        exc, want = TypeError, "query_start_loc must be a torch.Tensor, got list"
    with pytest.raises(exc, match=want):
        mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, 6, query_start_loc=q, context_start_loc=c)
    assert not cpu_launch.launches

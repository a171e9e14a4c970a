"""The torch layer without a GPU: CPU tensors, the launch replaced by a recorder (conftest's
`cpu_launch`). Tensors become the contract's arguments, the one checker decides, and the launch
gets the parameter values in signature order."""

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import mla_gen  # noqa: E402
from mla_gen import ArgumentError, manifest  # noqa: E402

from conftest import launched  # noqa: E402

BF16, F32 = torch.bfloat16, torch.float32
T, H, D = 8, 4, 128


def pair(dtype=BF16, t=T, h=H, d=D):
    g = torch.Generator().manual_seed(0)
    prefix = torch.randn(t, h, d, generator=g).to(dtype)
    suffix = torch.randn(t, h, d, generator=g).to(dtype)
    plse, slse = torch.randn(h, t, generator=g), torch.randn(h, t, generator=g)
    return torch.empty(t, h, d, dtype=dtype), prefix, plse, suffix, slse


def grid_of(kernel, t, h):
    launch = manifest.folder().kernel(kernel)["launch"]
    return (-(-t // launch["grid_x"]["per_block"]), -(-h // launch["grid_y"]["per_block"]))


def test_values_in_signature_order_and_the_grid(cpu_launch):
    out, p, pl, s, sl = pair()
    out_lse = torch.empty(H, T)
    mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, 5)
    name, v, grid = cpu_launch.last()
    assert name == launched("merge_attn_states_bf16_d128_thr_lse", T, H, threshold=5)
    assert v["output"] == out.data_ptr() and v["output_lse"] == out_lse.data_ptr()
    assert v["prefix_output"] == p.data_ptr() and v["suffix_lse"] == sl.data_ptr()
    assert (v["num_tokens"], v["num_heads"], v["prefill_tokens_with_context"]) == (T, H, 5)
    assert (v["output_token_stride"], v["output_head_stride"]) == (H * D, D)
    assert grid == grid_of(name, T, H)


def test_a_new_threshold_is_an_argument_not_a_plan(cpu_launch):
    out, p, pl, s, sl = pair()
    mla_gen.merge_attn_states(out, p, pl, s, sl, None, 0)
    plans = mla_gen.stats()["plans"]
    for n in range(1, T + 1):
        mla_gen.merge_attn_states(out, p, pl, s, sl, None, n)
        assert cpu_launch.last()[1]["prefill_tokens_with_context"] == n
        assert cpu_launch.last()[1]["output_lse"] == 0, "no output lse: a null pointer"
    # One plan more, at n = T: that value launches the all-context twin (the next test).
    assert mla_gen.stats()["plans"] == plans + 1
    mla_gen.merge_attn_states(out, p, pl, s, sl)
    assert cpu_launch.last()[1]["prefill_tokens_with_context"] == T, "None: every token has context"


def test_a_threshold_below_t_leaves_the_all_context_twin(cpu_launch):
    """A plan made without a threshold launches `_dense_nothr` (its contract: n = T only). Calls
    that pass one get a plan of their own (its first n < T: the plain dense twin), which keeps
    its kernel while n meets that kernel's bounds, but for n = T, which it leaves to the twin
    (faster, and tried first); a plan's fast path never launches a kernel whose bounds the
    call's n breaks."""
    out, p, pl, s, sl = pair()
    main = "merge_attn_states_bf16_d128_thr_lse"
    nothr, dense = launched(main, T, H), launched(main, T, H, threshold=0)
    assert (nothr, dense) == (dense + "_nothr", dense)
    for n in (None, 3, T, 0, None):
        mla_gen.merge_attn_states(out, p, pl, s, sl, None, n)
        assert cpu_launch.last()[1]["prefill_tokens_with_context"] == (T if n is None else n)
    assert [n for n, _, _ in cpu_launch.launches][-5:] == [nothr, dense, nothr, dense, nothr]
    out, p, pl, s, sl = pair(t=2 * T)  # new layouts: a plan made with n = 2T launches the twin,
    first = len(cpu_launch.launches)
    mla_gen.merge_attn_states(out, p, pl, s, sl, None, 2 * T)
    mla_gen.merge_attn_states(out, p, pl, s, sl, None, 2)  # and its fast path refuses n = 2
    assert [n for n, _, _ in cpu_launch.launches][first:] == [launched(main, 2 * T, H), launched(main, 2 * T, H, threshold=2)]
    assert cpu_launch.launches[-1][0].endswith("_dense") and cpu_launch.last()[1]["prefill_tokens_with_context"] == 2


def test_a_layout_keeps_a_plan_per_kernel_its_threshold_launches(cpu_launch):
    """After a first call with n = T (its plan launches `_dense_nothr`, whose fast path takes n = T
    only), calls with n < T get a second plan of the same layout, kept: no full check per call
    (before, every such call made a plan anew), whichever kind of call comes first or next. And a
    plan of `_dense` leaves n = T to the twin (before, it launched the slower `_dense` for it)."""
    out, p, pl, s, sl = pair()
    main = "merge_attn_states_bf16_d128_thr_lse"
    nothr, dense = launched(main, T, H), launched(main, T, H, threshold=0)
    for first in (T, 3):
        mla_gen._torch._plans.clear()
        seen = []
        for n in (first, 3, 5, 3, T, T, 2, None, 0, T):
            before = mla_gen.stats()["plans"]
            mla_gen.merge_attn_states(out, p, pl, s, sl, None, n)
            seen.append((cpu_launch.last()[0], mla_gen.stats()["plans"] - before))
            assert cpu_launch.last()[1]["prefill_tokens_with_context"] == (T if n is None else n)
        # Each kernel planned once: the first n = T after a dense plan plans the twin (when the
        # first call did not), every later one finds it.
        twin_planned = 1 if first == 3 else 0
        assert seen == [(nothr if first == T else dense, 1), (dense, 1 - twin_planned), (dense, 0), (dense, 0),
                        (nothr, twin_planned), (nothr, 0), (dense, 0), (nothr, 1), (dense, 0), (nothr, 0)]
    # Another entry point of the same kind and layouts (no slot of its own here): found by key.
    before = mla_gen.stats()["plans"]
    for n in (T, 1, T):
        mla_gen._torch._call(mla_gen._binding.KINDS["pair"], ("head_major",), (out, None, p, pl, s, sl, None), (n,))
    assert mla_gen.stats()["plans"] == before


def test_per_head_padding_and_own_strides(cpu_launch):
    out, p, pl, s, sl = pair()
    padded = torch.zeros(T, H, D + 64, dtype=BF16)[..., :D]  # a V of 128 inside 192
    mla_gen.merge_attn_states(out, padded, pl, s, sl)
    v = cpu_launch.last()[1]
    assert (v["prefix_token_stride"], v["prefix_head_stride"]) == (H * (D + 64), D + 64)
    assert (v["suffix_token_stride"], v["suffix_head_stride"]) == (H * D, D)


def _problem(excinfo):
    return str(excinfo.value).split(": ", 1)[1]


@pytest.mark.parametrize("case", ["threshold", "dtype", "overlap", "stride", "align", "negative"])
def test_the_contract_decides(cpu_launch, case):
    out, p, pl, s, sl = pair()
    n = None
    if case == "threshold":
        n, want = T + 1, f"prefill_tokens_with_context = {T + 1} exceeds its maximum num_tokens = {T}"
    elif case == "negative":
        n, want = -1, "prefill_tokens_with_context = -1 is below its minimum 0"
    elif case == "dtype":
        out, want = out.half(), "output is f16, the kernel takes bf16"
    elif case == "overlap":
        out, want = p, "output overlaps prefix_output: the kernel writes output, which may share memory with no other argument"
    elif case == "stride":
        p = torch.zeros(T, H, D + 2, dtype=BF16)[..., :D]
        want = "prefix_output: prefix_head_stride = 130 is not a multiple of 8 elements (the kernel's 16-byte access)"
    elif case == "align":
        out = torch.empty(T * H * D + 1, dtype=BF16)[1:].view(T, H, D)
        want = f"output: pointer {out.data_ptr():#x} is not aligned to 16 bytes"
    with pytest.raises(ArgumentError) as e:
        mla_gen.merge_attn_states(out, p, pl, s, sl, None, n)
    assert isinstance(e.value, ValueError)
    assert e.value.kernel == "merge_attn_states_bf16_d128_thr_lse"
    assert e.value.problem == want
    assert not cpu_launch.launches


@pytest.fixture(params=["TensorGuards", "layout key"])
def guard_kind(request, monkeypatch):
    """Both guards of the plain call's fast path: torch's TensorGuards and the Python fallback."""
    from mla_gen import _plan
    if request.param == "layout key" or _plan.TensorGuards is None:
        monkeypatch.setattr(_plan, "TensorGuards", None)
    return request.param


def test_planned_layouts_still_check_pointers_every_call(cpu_launch, guard_kind):
    big = torch.zeros(3 * T * H * D + 64, dtype=BF16)
    n = T * H * D
    out, p = big[:n].view(T, H, D), big[n:2 * n].view(T, H, D)
    _, _, pl, s, sl = pair()
    mla_gen.merge_attn_states(out, p, pl, s, sl, None, 2)
    plans = mla_gen.stats()["plans"]
    shifted = big[64:64 + n].view(T, H, D)  # same layout, now over prefix_output
    with pytest.raises(ArgumentError, match="output overlaps prefix_output"):
        mla_gen.merge_attn_states(shifted, p, pl, s, sl, None, 2)
    odd = big[1:1 + n].view(T, H, D)
    with pytest.raises(ArgumentError, match=re.escape(f"output: pointer {odd.data_ptr():#x} is not aligned")):
        mla_gen.merge_attn_states(odd, big[2 * n + 8:3 * n + 8].view(T, H, D), pl, s, sl, None, 2)
    with pytest.raises(ArgumentError, match="exceeds its maximum"):
        mla_gen.merge_attn_states(out, p, pl, s, sl, None, T + 1)
    with pytest.raises(TypeError, match="must be a Python int"):
        mla_gen.merge_attn_states(out, p, pl, s, sl, None, 2.0)
    mla_gen.merge_attn_states(out, p, pl, s, sl, None, 3)
    assert len(cpu_launch.launches) == 2
    assert mla_gen.stats()["plans"] == plans


def test_the_guard_tells_layouts_apart(cpu_launch, guard_kind):
    """A planned layout serves only tensors of that layout: another dtype, shape, stride or a
    None where a tensor was gets its own plan (or its own error), never the previous one's."""
    out, p, pl, s, sl = pair()
    ol = torch.empty(H, T)
    mla_gen.merge_attn_states(out, p, pl, s, sl, ol, 2)
    mla_gen.merge_attn_states(out, p, pl, s, sl, ol, 2)
    plans = mla_gen.stats()["plans"]
    mla_gen.merge_attn_states(out, p, pl, s, sl, None, 2)  # no output lse: a null pointer
    assert cpu_launch.last()[1]["output_lse"] == 0
    padded = torch.zeros(T, H, D + 64, dtype=BF16)[..., :D]
    mla_gen.merge_attn_states(out, padded, pl, s, sl, ol, 2)
    assert cpu_launch.last()[1]["prefix_head_stride"] == D + 64
    mla_gen.merge_attn_states(out, p, pl, s, sl, ol)  # no threshold: num_tokens
    assert cpu_launch.last()[1]["prefill_tokens_with_context"] == T
    with pytest.raises(ArgumentError, match="output is f16"):
        mla_gen.merge_attn_states(out.half(), p, pl, s, sl, ol, 2)
    o2, p2, pl2, s2, sl2 = pair(t=T - 1)
    mla_gen.merge_attn_states(o2, p2, pl2, s2, sl2, None, 2)
    assert cpu_launch.last()[1]["num_tokens"] == T - 1
    assert mla_gen.stats()["plans"] == plans + 4
    mla_gen.merge_attn_states(out, p, pl, s, sl, ol, 3)  # back to the first layout: its plan
    assert mla_gen.stats()["plans"] == plans + 4 and cpu_launch.last()[1]["prefill_tokens_with_context"] == 3


def test_what_the_contract_cannot_say(cpu_launch):
    out, p, pl, s, sl = pair()
    with pytest.raises(ValueError, match="has shape"):  # the head dim must be contiguous
        mla_gen.merge_attn_states(out, torch.zeros(T, H, D, 2, dtype=BF16)[..., 0], pl, s, sl)
    # lse [T, H] where [H, T] is addressed: the layout, not a size disagreement; the function takes
    # lse_layout, and its refusal says which to pass
    with pytest.raises(ValueError, match=re.escape('prefix_lse has shape (8, 4); the kernel addresses it as [H=4, T=8] '
                                                   '(for an lse laid out [T, H], pass lse_layout="token_major")')):
        mla_gen.merge_attn_states(out, p, pl.t().contiguous(), s, sl)
    with pytest.raises(ValueError, match="3 dimensions"):
        mla_gen.merge_attn_states(out, p, pl, s.view(T, H * D), sl)
    with pytest.raises(TypeError, match="must be a Python int"):
        mla_gen.merge_attn_states(out, p, pl, s, sl, None, torch.tensor(3))
    with pytest.raises(TypeError, match="must be a Python int"):
        mla_gen.merge_attn_states(out, p, pl, s, sl, None, True)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        mla_gen.merge_attn_states(out, p, pl.tolist(), s, sl)
    with pytest.raises(ValueError, match="no generated merge_attn_states kernel"):
        o, p2, pl2, s2, sl2 = pair(d=100)
        mla_gen.merge_attn_states(o, p2, pl2, s2, sl2)
    assert not cpu_launch.launches


def test_tensors_that_disagree_are_named_not_called_a_missing_kernel(cpu_launch):
    """A head size or dtype the call's own tensors disagree on: the kernel the described tensors
    (prefix_output's dtype and head size; the states') select names the tensor that differs and
    what it takes, where "no generated kernel" would send the caller to generate one."""
    out, p, pl, s, sl = pair()
    s64 = s[..., :64].contiguous()
    for call, named in [
        (lambda: mla_gen.merge_attn_states(torch.empty(T, H, 64, dtype=BF16), p, pl, s, sl),
         "output has shape (8, 4, 64); the kernel addresses it as [T=8, H=4, D=128]"),
        (lambda: mla_gen.merge_attn_states(out, p, pl, s64, sl), "suffix_output has shape (8, 4, 64)"),
        (lambda: mla_gen.merge_attn_states(out.half(), p, pl, s, sl), "output is f16, the kernel takes bf16"),
        (lambda: mla_gen.merge_state_in_place(p, pl, s64, sl, lse_layout="head_major"), "v_other has shape (8, 4, 64)"),
        (lambda: mla_gen.merge_states(torch.randn(T, 3, H, D).to(BF16), torch.randn(T, 3, H),
                                      output=torch.empty(T, H, 64, dtype=BF16)), "output has shape (8, 4, 64)"),
    ]:
        with pytest.raises(ValueError, match=re.escape(named)):
            call()
    # A group size no kernel has: named as such, not as the group-128 kernel's scale layout.
    fp8 = torch.empty(T, H, D, dtype=torch.float8_e4m3fn)
    for g in (32, 512):
        with pytest.raises(ValueError, match=f"no generated merge_attn_states kernel .*group_size = {g},"):
            mla_gen.merge_attn_states(fp8, p, pl, s, sl, output_group_scales=torch.empty(T, H * D // g))
    assert not cpu_launch.launches


def test_a_size_two_tensors_give_differently_is_named_with_both(cpu_launch):
    """The token count, heads or requests that one tensor gives and another contradicts: the
    error names both tensors and their shapes, the tensor that describes the call (prefix_output,
    the states, the state) as the one given (an output of the wrong length was once reported as
    "prefix_output ... needs N elements"). Sizes that are the addressed ones reordered (an lse
    [T, H] for [H, T]) are a layout, and named as one."""
    out, p, pl, s, sl = pair()
    loc = torch.tensor([0, 4, 8], dtype=torch.int32)
    v, vl = torch.randn(T, 3, H, D).to(BF16), torch.randn(T, 3, H)
    for call, named in [
        (lambda: mla_gen.merge_attn_states(torch.empty(16, H, D, dtype=BF16), p, pl, s, sl),
         "output has T=16 where prefix_output has T=8 (the tensors of one call must agree on every size): "
         "output has shape (16, 4, 128) for [T, H, D], prefix_output (8, 4, 128) for [T, H, D]"),
        (lambda: mla_gen.merge_attn_states(out, p, torch.randn(H, 6), s, sl),
         "prefix_lse has T=6 where prefix_output has T=8"),
        (lambda: mla_gen.merge_attn_states(out, p, pl, s, torch.randn(2, T)),
         "suffix_lse has H=2 where prefix_output has H=4"),
        (lambda: mla_gen.merge_attn_states(out, p, pl, s, sl, query_start_loc=loc,
                                           context_start_loc=loc[:2].contiguous()),
         "context_start_loc has B+1=2 where query_start_loc has B+1=3 (the tensors of one call must agree on "
         "every size): context_start_loc has shape (2,) for [B+1], query_start_loc (3,) for [B+1]"),
        # (each tensor by the name the function gives it: merge_states's v and s, not the kernel's states)
        (lambda: mla_gen.merge_states(v, torch.randn(T + 1, 3, H)), "s has T=9 where v has T=8"),
        (lambda: mla_gen.merge_state_in_place(p, pl, s, torch.randn(H, T + 1), lse_layout="head_major"),
         "s_other has T=9 where v has T=8"),
        (lambda: mla_gen.merge_state_in_place(p, pl.t().contiguous(), s, sl, lse_layout="head_major"),
         "s has shape (8, 4); the kernel addresses it as [H=4, T=8]"),
    ]:
        with pytest.raises(ValueError, match=re.escape(named)):
            call()
    assert not cpu_launch.launches


def test_every_integer_a_tensor_dim_reads_is_one_a_required_tensor_gives():
    """The torch layers check layouts before the contract by the integers the tensors give
    (python/mla_gen/_plan.py and the compiled op alike): so in every kernel of the package's
    folder, each integer a tensor's dims read is given by a tensor the call must pass (a size that
    is that integer, or a stride)."""
    from mla_gen._select import bound_param
    from mla_gen.contract import plan_for

    missing = []
    for k in manifest.load()["kernels"]:
        plan = plan_for(k["name"], k)
        shaped = [p for p in plan.params if p.pointer and p.dims]
        given = {bound_param(size) for p in shaped if not p.nullable for _, size, _ in p.dims}
        given |= {stride.param() for p in shaped if not p.nullable for _, _, stride in p.dims}
        for p in shaped:
            for _, size, stride in p.dims:
                missing += [(k["name"], p.name, plan.names[f]) for f in size.factors + stride.factors
                            if f not in given]
    assert not missing, missing[:5]


def test_the_merge_states_fake_refuses_states_of_another_rank_as_the_call_does():
    """Meta tensors run the fake: it allocates [T, H, D] and [T, H], and refuses v of another rank
    with the call's text (not Python's unpacking error)."""
    v, s = torch.empty(8, 3, 4, 128, device="meta", dtype=BF16), torch.empty(8, 3, 4, device="meta")
    out, lse = torch.ops.mla_gen.merge_states(v, s)
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == ((8, 4, 128), BF16, (8, 4), F32)
    with pytest.raises(ValueError, match=re.escape("v must have 4 dimensions, got shape (8, 4, 128)")):
        torch.ops.mla_gen.merge_states(v[:, 0], s)


def test_nothing_to_launch(cpu_launch):
    out, p, pl, s, sl = pair(t=0)
    mla_gen.merge_attn_states(out, p, pl, s, sl, torch.empty(H, 0), 0)
    mla_gen.merge_attn_states(out, p, pl, s, sl, torch.empty(H, 0), 0)
    assert not cpu_launch.launches


def test_cpu_tensors_are_refused_by_the_real_layer():
    out, p, pl, s, sl = pair()
    with pytest.raises(ValueError, match="output is on cpu; the kernels run on a CUDA device"):
        mla_gen.merge_attn_states(out, p, pl, s, sl)


def test_the_kernel_folder_is_read_per_lookup(cpu_launch, contract_kernels, monkeypatch):
    out, p, pl, s, sl = pair()
    mla_gen.merge_attn_states(out, p, pl, s, sl)
    assert cpu_launch.last()[0] == launched("merge_attn_states_bf16_d128", T, H)  # the table's, without options
    monkeypatch.delenv("MLA_GEN_KERNELS")
    mla_gen.merge_attn_states(out, p, pl, s, sl)
    assert cpu_launch.last()[0] == launched("merge_attn_states_bf16_d128_thr_lse", T, H)  # the default kernels again
    monkeypatch.setenv("MLA_GEN_KERNELS", str(contract_kernels))
    mla_gen.merge_attn_states(out, p, pl, s, sl, None, 5)
    assert cpu_launch.last()[0] == launched("merge_attn_states_bf16_d128_thr", T, H, threshold=5)


def test_a_kernel_without_the_threshold_takes_only_n_equal_to_t(cpu_launch, tmp_path, monkeypatch):
    import json
    from pathlib import Path
    m = json.loads((Path(mla_gen.__file__).parent / "kernels" / "manifest.json").read_text()) \
        if (Path(mla_gen.__file__).parent / "kernels" / "manifest.json").is_file() else manifest.load()
    m = {k: v for k, v in m.items() if not k.startswith("_")}
    contracts = json.loads((Path(__file__).resolve().parents[2] / "tests/contract/contracts.json").read_text())
    entry = dict(next(k for k in m["kernels"] if k["name"] == "merge_attn_states_bf16_d128_thr_lse"))
    entry.update(name="merge_attn_states_bf16_d128", **contracts["merge_attn_states_bf16_d128"])
    entry["launch"] = {k: v for k, v in entry["launch"].items() if k != "specializations"}  # not in this folder
    entry["variant"] = dict(entry["variant"], prefix_threshold=False, output_lse=False)
    m["kernels"] = [entry]
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    monkeypatch.setenv("MLA_GEN_KERNELS", str(tmp_path))
    out, p, pl, s, sl = pair()
    assert not mla_gen.supports(BF16, D, threshold=True) and mla_gen.supports(BF16, D)
    mla_gen.merge_attn_states(out, p, pl, s, sl, None, T)
    with pytest.raises(ArgumentError, match="prefill_tokens_with_context = 5, but this kernel is built for "
                                            "prefill_tokens_with_context = num_tokens = 8"):
        mla_gen.merge_attn_states(out, p, pl, s, sl, None, 5)
    # An output lse no kernel writes: none serves the call (selection never drops a buffer given).
    with pytest.raises(ValueError, match="no generated merge_attn_states kernel"):
        mla_gen.merge_attn_states(out, p, pl, s, sl, torch.empty(H, T))
    assert len(cpu_launch.launches) == 1


def test_fp8_outputs(cpu_launch, contract_kernels):
    out, p, pl, s, sl = pair()
    fp8 = torch.empty(T, H, D, dtype=torch.float8_e4m3fn)
    scale = torch.ones(1)
    mla_gen.merge_attn_states(fp8, p, pl, s, sl, output_scale=scale)
    name, v, _ = cpu_launch.last()
    assert name == launched("merge_attn_states_bf16_d128_thr_lse_fp8", T, H) and v["output_scale"] == scale.data_ptr()
    with pytest.raises(ArgumentError, match="output_scale is f16, the kernel takes f32"):
        mla_gen.merge_attn_states(fp8, p, pl, s, sl, output_scale=scale.half())
    with pytest.raises(ArgumentError, match="output is bf16, the kernel takes fp8_e4m3"):
        mla_gen.merge_attn_states(out, p, pl, s, sl, output_scale=scale)
    scales = torch.empty(H * D // 64, T).t()  # column-major group scales
    mla_gen.merge_attn_states(fp8, p, pl, s, sl, output_group_scales=scales)
    name, v, _ = cpu_launch.last()
    assert name == launched("merge_attn_states_bf16_d128_thr_lse_fp8g64", T, H)
    assert (v["scale_token_stride"], v["scale_group_stride"]) == (1, T)
    with pytest.raises(ArgumentError, match="output_group_scales: .* maps two elements to one address"):
        mla_gen.merge_attn_states(fp8, p, pl, s, sl, output_group_scales=torch.empty(T, 1).expand(T, H * D // 64))
    with pytest.raises(ValueError, match="no generated merge_attn_states kernel"):
        mla_gen.merge_attn_states(fp8, p, pl, s, sl, output_group_scales=torch.empty(T, H * D // 16))


def test_a_misspelt_lse_layout_is_named_not_looked_up(cpu_launch, contract_kernels):
    """merge_attn_states and merge_attn_states_fp8_group refuse a layout that is neither, as the
    other functions do, instead of reporting a kernel the spec lacks."""
    out, p, pl, s, sl = pair()
    fp8 = torch.empty(T, H, D, dtype=torch.float8_e4m3fn)
    scales = torch.empty(T, H * D // 64)
    q, c = torch.tensor([0, T], dtype=torch.int32), torch.tensor([0, 0], dtype=torch.int32)
    mla_gen.merge_attn_states(out, p, pl, s, sl)  # the fast path's slot holds a plan
    bad = 'lse_layout must be "token_major" or "head_major", got "tokenmajor"'
    for call in (lambda: mla_gen.merge_attn_states(out, p, pl, s, sl, lse_layout="tokenmajor"),
                 lambda: mla_gen.merge_attn_states(out, p, pl, s, sl, lse_layout="tokenmajor", query_start_loc=q,
                                                   context_start_loc=c),
                 lambda: mla_gen.merge_attn_states(fp8, p, pl, s, sl, output_group_scales=scales,
                                                   lse_layout="tokenmajor"),
                 lambda: mla_gen.merge_attn_states_fp8_group(fp8, scales, p, pl, s, sl, lse_layout="tokenmajor")):
        launches = len(cpu_launch.launches)
        with pytest.raises(ValueError, match=f"^{re.escape(bad)}$"):
            call()
        assert len(cpu_launch.launches) == launches


def test_other_families(cpu_launch, contract_kernels):
    K = 4
    v = torch.randn(T, K, H, D).to(BF16)
    lse = torch.randn(T, K, H)
    out, out_lse = mla_gen.merge_states(v, lse)
    name, vals, _ = cpu_launch.last()
    assert name == "merge_states_bf16_d128_k4_lse" and out.shape == (T, H, D) and out_lse.shape == (T, H)
    assert vals["output_lse"] == out_lse.data_ptr() and vals["states_state_stride"] == H * D
    mla_gen.merge_states(v[:, :3], lse[:, :3].contiguous())
    name, vals, _ = cpu_launch.last()
    assert name == "merge_states_bf16_d128_kvar_lse" and vals["num_states"] == 3
    with pytest.raises(ValueError, match="has shape"):  # the lse of 3 states inside a 4-state buffer
        mla_gen.merge_states(v[:, :3], lse[:, :3])

    state, other = torch.randn(T, H, D).to(BF16), torch.randn(T, H, D).to(BF16)
    s, so = torch.randn(H, T), torch.randn(H, T)
    mask = torch.rand(T) > 0.5
    mla_gen.merge_state_in_place(state, s, other, so, mask, lse_layout="head_major")
    name, vals, _ = cpu_launch.last()
    assert name == "merge_state_in_place_bf16_d128_mask" and vals["mask"] == mask.data_ptr()
    with pytest.raises(ArgumentError, match="v overlaps v_other: the kernel writes v, which may share memory with no "
                                            "other argument"):
        mla_gen.merge_state_in_place(state, s, state, so, lse_layout="head_major")
    with pytest.raises(ValueError, match="no generated merge_state_in_place kernel"):
        mla_gen.merge_state_in_place(state, s.t(), other, so.t(), mask)  # token-major: none in this folder

    qsl = torch.tensor([0, 3, 8], dtype=torch.int32)
    csl = torch.tensor([0, 0, 5], dtype=torch.int32)
    lse_hd = torch.randn(H, T)
    mla_gen.mask_empty_context_lse(lse_hd, qsl, csl)
    name, vals, _ = cpu_launch.last()
    assert name == "mask_empty_context_lse" and vals["num_requests"] == 2
    with pytest.raises(ArgumentError, match="query_start_loc is i64, the kernel takes i32"):
        mla_gen.mask_empty_context_lse(lse_hd, qsl.long(), csl)


def test_the_plain_call_keeps_torchs_guard(cpu_launch):
    """The fast path's guard is torch's C++ TensorGuards where torch has it, with and without the
    optional tensors (a None slot stands in as its own empty tensor); a tensor given twice (the
    guard refuses aliases) falls back to the layout key and still launches."""
    from mla_gen import _plan, _torch
    if _plan.TensorGuards is None:
        pytest.skip("this torch has no torch._C._dynamo.guards.TensorGuards")
    out, p, pl, s, sl = pair()
    for args in ((out, p, pl, s, sl), (out, p, pl, s, sl, torch.empty(H, T), 3)):
        mla_gen.merge_attn_states(*args)
        mla_gen.merge_attn_states(*args)
        assert isinstance(_torch._last_pair[2].guard, _plan.TensorGuards)
    mla_gen.merge_attn_states(out, p, pl, p, pl)
    mla_gen.merge_attn_states(out, p, pl, p, pl)
    assert isinstance(_torch._last_pair[2].guard, _plan.LayoutKey)
    assert cpu_launch.last()[1]["suffix_output"] == p.data_ptr()


def test_the_function_and_the_operator_share_one_fast_path(cpu_launch):
    """The op's implementation runs the function's fast path with its own slot: the same plan
    (from the cache), the same launch, each slot kept while the other changes layouts."""
    from mla_gen import _torch, functions
    out, p, pl, s, sl = pair()
    mla_gen.merge_attn_states(out, p, pl, s, sl, None, 2)
    mla_gen.merge_attn_states(out, p, pl, s, sl, None, 2)
    via_function = cpu_launch.last()
    functions.merge_attn_states_op(out, None, p, pl, s, sl, 2)
    assert cpu_launch.last() == via_function
    functions.merge_attn_states_op(out, None, p, pl, s, sl, 2)
    assert _torch._last_pair_op[2] is _torch._last_pair[2]
    plans = mla_gen.stats()["plans"]
    mla_gen.merge_attn_states(out, p, pl, s, sl, torch.empty(H, T), 2)  # another layout, the function's slot
    mla_gen.merge_attn_states(out, p, pl, s, sl, torch.empty(H, T), 2)
    functions.merge_attn_states_op(out, None, p, pl, s, sl, 4)
    assert _torch._last_pair_op[2] is not _torch._last_pair[2] and cpu_launch.last()[1]["output_lse"] == 0
    assert mla_gen.stats()["plans"] == plans + 1


def test_the_fast_path_source_prints_once_with_the_switch(cpu_launch, monkeypatch, capfd):
    """MLA_GEN_SHOW_FASTPATH=1: each generated text to stderr when first compiled (plans of one
    shape share it); without it, nothing."""
    from mla_gen import _fastpath
    monkeypatch.setattr(_fastpath, "_compiled", {})
    monkeypatch.setenv("MLA_GEN_SHOW_FASTPATH", "1")
    out, p, pl, s, sl = pair()
    mla_gen.merge_attn_states(out, p, pl, s, sl, None, 2)
    mla_gen.merge_attn_states(*pair(t=T - 1), None, 2)  # another plan of the same shape: the same text
    err = capfd.readouterr().err
    assert err.count("def make(") == 1 and "# mla_gen fast path (first compiled for merge_attn_states_bf16" in err
    assert "prefill_tokens_with_context_max" in err and "output_ptr = output.data_ptr()" in err
    mla_gen.merge_attn_states(out, p, pl, s, sl, torch.empty(H, T), 2)  # an output lse: another text
    assert capfd.readouterr().err.count("def make(") == 1
    monkeypatch.setattr(_fastpath, "_compiled", {})
    monkeypatch.delenv("MLA_GEN_SHOW_FASTPATH")
    mla_gen.merge_attn_states(*pair(t=T - 2), None, 2)
    assert capfd.readouterr().err == ""


def test_a_free_integers_bound_that_overflows_binds_nothing_on_the_fast_path(cpu_launch, tmp_path, monkeypatch):
    # The full check lets a bound that overflows 64 bits bind nothing (contract.py); the planned
    # calls after it must do the same, not compare with a missing value.
    m = {k: v for k, v in manifest.load().items() if not k.startswith("_")}
    entry = json.loads(json.dumps(next(k for k in m["kernels"] if k["name"] == "merge_attn_states_bf16_d128_thr_lse")))
    entry["launch"] = {k: v for k, v in entry["launch"].items() if k not in ("specializations", "size_rule")}
    threshold = next(p for p in entry["params"] if p["name"] == "prefill_tokens_with_context")
    threshold["bounds"] = dict(threshold["bounds"], max="num_tokens*4611686018427387904")  # 8 * 2^62
    m["kernels"] = [entry]
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    monkeypatch.setenv("MLA_GEN_KERNELS", str(tmp_path))
    out, p, pl, s, sl = pair()
    for n in (5, 6, 7):  # the full check, the plan looked up, the slot's plan
        mla_gen.merge_attn_states(out, p, pl, s, sl, None, n)
    assert [values["prefill_tokens_with_context"] for _, values, _ in cpu_launch.launches] == [5, 6, 7]

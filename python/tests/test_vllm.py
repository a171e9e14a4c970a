"""mla_gen.vllm.patch against a stand-in of vLLM's dispatcher (its module path and newest
signature, fake functions, no GPU): supported calls go to mla-gen, the rest to the original,
per-token-group FP8 (output_block_scale, quant_group_size, quant_scale_ue8m0) included."""

import sys
import types

import pytest

torch = pytest.importorskip("torch")

import mla_gen  # noqa: E402
import mla_gen.vllm as mv  # noqa: E402

MODULE = "vllm.v1.attention.ops.merge_attn_states"


@pytest.fixture
def standin(monkeypatch):
    """vllm.v1.attention.ops.merge_attn_states with a recording dispatcher, a backend module that
    imported it by name, and mla-gen's merge recorded instead of launched."""
    calls = {"vllm": [], "mla_gen": []}

    def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None,
                          prefill_tokens_with_context=None, output_scale=None, output_block_scale=None,
                          quant_group_size=None, quant_scale_ue8m0=None):  # vLLM's newest signature
        calls["vllm"].append((output, output_lse, prefill_tokens_with_context, output_scale, prefix_lse,
                              output_block_scale, quant_group_size, quant_scale_ue8m0))

    names = ["vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.ops", MODULE, "vllm_backend_standin"]
    mods = {n: types.ModuleType(n) for n in names}
    mods[MODULE].merge_attn_states = merge_attn_states
    mods["vllm_backend_standin"].merge_attn_states = merge_attn_states  # `from ... import merge_attn_states`
    for n, m in mods.items():
        monkeypatch.setitem(sys.modules, n, m)

    def fake_merge(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, n, scale, **keywords):
        calls["mla_gen"].append((output, output_lse, n, scale, keywords))

    monkeypatch.setattr(mv, "_merge", fake_merge)
    monkeypatch.setattr(mv, "_on_cuda", lambda t: t.device.type == "cpu")  # CPU stands for CUDA here
    yield calls, mods, merge_attn_states


def tensors(dtype=torch.bfloat16, D=128, T=8, H=4):
    return (torch.empty(T, H, D, dtype=dtype), torch.empty(T, H, D, dtype=dtype), torch.empty(H, T),
            torch.empty(T, H, D, dtype=dtype), torch.empty(H, T))


def test_patch_routes_supported_calls_and_falls_back(standin):
    calls, mods, original = standin
    handle = mv.patch()
    dispatch = mods[MODULE].merge_attn_states
    assert dispatch is not original and mods["vllm_backend_standin"].merge_attn_states is dispatch
    assert mv.patch() .wrapper is dispatch, "idempotent"

    out, p, pl, s, sl = tensors()
    dispatch(out, p, pl, s, sl)                                 # bf16 d128: mla-gen
    dispatch(out, p, pl, s, sl, torch.empty(4, 8), 5)           # with output lse and a threshold
    dispatch(out, p, pl, s, sl, None, prefill_tokens_with_context=3)
    assert [c[2] for c in calls["mla_gen"]] == [None, 5, 3] and not calls["vllm"]

    o2, p2, pl2, s2, sl2 = tensors(D=100)                       # no kernel for d100: vLLM's own
    dispatch(o2, p2, pl2, s2, sl2, None, 4)
    fp8 = torch.empty(8, 4, 100, dtype=torch.float8_e4m3fn)     # FP8 output, but no kernel for d100
    dispatch(fp8, p2, pl2, s2, sl2, None, None, torch.ones(1))
    dispatch(out.half(), p, pl, s, sl)                          # output dtype differs from the inputs'
    meta = [t.to("meta") for t in (out, p, pl, s, sl)]          # not on the (stand-in) CUDA device
    dispatch(*meta)
    assert len(calls["vllm"]) == 4 and len(calls["mla_gen"]) == 3
    assert calls["vllm"][0][2] == 4 and calls["vllm"][1][3] is not None, "fallback gets the arguments as given"

    handle.undo()
    assert mods[MODULE].merge_attn_states is original and mods["vllm_backend_standin"].merge_attn_states is original


REFUSALS = {  # what mla-gen's checks raise before a launch, each handed back unless strict
    "contract": mla_gen.ArgumentError("merge_attn_states_bf16_d128_thr_lse", "output: pointer 0x2 is not aligned"),
    "layout": ValueError("prefix_lse has shape (4, 8) and strides (1, 4); the kernel addresses it as [H=4, T=8]"),
    "type": TypeError("prefill_tokens_with_context must be a Python int"),
}


@pytest.mark.parametrize("refusal", REFUSALS)
def test_a_refused_call_falls_back_unless_strict(standin, monkeypatch, refusal):
    calls, mods, original = standin
    refused = []

    def refuse(*args, **keywords):
        refused.append(keywords)
        raise REFUSALS[refusal]

    monkeypatch.setattr(mv, "_merge", refuse)
    monkeypatch.setitem(mv.stats, "fallbacks", 0)
    handle = mv.patch()
    mods[MODULE].merge_attn_states(*tensors())
    fp8, p, pl, s, sl, block = group_call()
    group = (fp8, p, pl, s, sl, None, None, None, block, 64, False)
    mods[MODULE].merge_attn_states(*group)  # group FP8
    # Both routed to mla-gen, refused there, then handed to vLLM and counted.
    assert len(refused) == 2 and "output_group_scales" in refused[1]
    assert len(calls["vllm"]) == 2 and not calls["mla_gen"] and mv.stats["fallbacks"] == 2
    handle.undo()
    handle = mv.patch(MODULE, strict=True)
    for call in (tensors(), group):
        with pytest.raises(type(REFUSALS[refusal])):
            mods[MODULE].merge_attn_states(*call)
    assert len(refused) == 4 and len(calls["vllm"]) == 2
    handle.undo()


def test_patching_again_with_the_other_strict_installs_that_one(standin, monkeypatch):
    # patch(strict=True) after patch() once kept the non-strict wrapper, silently.
    calls, mods, original = standin

    def refuse(*args, **keywords):
        raise ValueError("refused")

    monkeypatch.setattr(mv, "_merge", refuse)
    first = mv.patch()
    assert mv.patch().wrapper is first.wrapper  # the same strict: the wrapper installed stays
    strict = mv.patch(strict=True)
    assert strict.wrapper is not first.wrapper and strict.original is original
    for module in (MODULE, "vllm_backend_standin"):  # wherever the first was, the imported name too
        assert mods[module].merge_attn_states is strict.wrapper
        with pytest.raises(ValueError, match="refused"):
            mods[module].merge_attn_states(*tensors())
    assert not calls["vllm"]
    lenient = mv.patch(strict=False)
    mods[MODULE].merge_attn_states(*tensors())
    assert len(calls["vllm"]) == 1
    lenient.undo()
    assert mods[MODULE].merge_attn_states is original and mods["vllm_backend_standin"].merge_attn_states is original


def test_a_non_tensor_after_a_plan_of_one_tensor_twice_goes_to_vllm(cpu_launch, patched):
    # The plan of a call passing one tensor twice checks layouts by its key; an int lse then is the
    # check's TypeError (it was an AttributeError, which the wrapper does not hand back).
    calls, mods, handle = patched
    out, p, pl, s, sl = tensors()
    mods[MODULE].merge_attn_states(out, p, pl, p, pl)
    mods[MODULE].merge_attn_states(out, p, pl, p, pl)
    assert len(cpu_launch.launches) == 2 and not calls["vllm"]
    mods[MODULE].merge_attn_states(out, p, pl, p, 3)
    assert len(calls["vllm"]) == 1 and mv.stats["fallbacks"] == 1 and len(cpu_launch.launches) == 2
    handle.undo()


def test_a_transposed_lse_goes_to_vllm(cpu_launch, patched):
    """An lse view vLLM's Triton kernel takes (its strides) but mla-gen's kernel cannot address:
    the real check refuses it before any launch and the call goes to vLLM, counted."""
    calls, mods, handle = patched
    out, p, pl, s, sl = tensors()
    mods[MODULE].merge_attn_states(out, p, torch.empty(8, 4).t(), s, sl)
    assert len(calls["vllm"]) == 1 and mv.stats["fallbacks"] == 1
    handle.undo()


def test_route_follows_supports(monkeypatch):
    out, p, pl, s, sl = tensors()
    assert not mv.route(out, p, pl, s, sl), "CPU tensors are not routed"
    monkeypatch.setattr(mv, "_on_cuda", lambda t: t.device.type == "cpu")  # CPU stands for CUDA here
    asked = []
    real = mv.supports

    def recorded(*args, **keywords):
        asked.append(keywords.get("head_size", args[1] if len(args) > 1 else None))
        return real(*args, **keywords)

    monkeypatch.setattr(mv, "supports", recorded)
    monkeypatch.setattr(mv, "_routes", {})  # route() keeps each answer; ask afresh
    assert mv.route(out, p, pl, s, sl), "bf16 d128: a kernel of the default folder"
    assert not mv.route(*tensors(D=100)), "d100: none"
    assert asked == [128, 100], asked


# ---- the default kernels serve vLLM's FP8 and fused calls (generated/, launches recorded) ----

REAL_MERGE = mv._merge


@pytest.fixture
def patched(standin, monkeypatch):
    """The stand-in dispatcher patched with mla-gen's real merge over generated/, fallbacks
    counted from 0: (calls, modules, the patch handle)."""
    from conftest import ROOT

    calls, mods, _ = standin
    monkeypatch.setenv("MLA_GEN_KERNELS", str(ROOT / "generated"))
    monkeypatch.setattr(mv, "_merge", REAL_MERGE)
    monkeypatch.setitem(mv.stats, "fallbacks", 0)
    return calls, mods, mv.patch()
DEFAULT_HEADS = (64, 80, 96, 112, 128, 192, 256, 512, 576)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_the_default_kernels_take_fp8_and_fused_calls_with_no_fallback(cpu_launch, patched, dtype):
    """Every default (dtype, head size) through the patched dispatcher against generated/: plain,
    FP8 per-tensor (output_scale), fused mask (start locations), and both; none handed back, each
    launched by the FP8 / `_ctxmask` kernel it names."""
    from conftest import launched

    calls, mods, handle = patched
    dispatch = mods[MODULE].merge_attn_states
    T, H, n = 8, 4, 6
    q = torch.tensor([0, 3, 5, 8], dtype=torch.int32)
    c = torch.tensor([0, 0, 4, 4], dtype=torch.int32)  # requests 0 and 2 without context
    scale = torch.ones(1)
    dt = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}[dtype]
    for d in DEFAULT_HEADS:
        out, p, pl, s, sl = tensors(dtype, D=d, T=T, H=H)
        fp8 = torch.empty(T, H, d, dtype=torch.float8_e4m3fn)
        out_lse = torch.empty(H, T)
        base = f"merge_attn_states_{dt}_d{d}_thr_lse"
        for name, call in [
            (base, lambda: dispatch(out, p, pl, s, sl, out_lse, n)),
            (base + "_fp8", lambda: dispatch(fp8, p, pl, s, sl, out_lse, n, scale)),
            (base + "_fp8", lambda: dispatch(fp8, p, pl, s, sl, None, prefill_tokens_with_context=n,
                                             output_scale=scale)),
            (base + "_ctxmask", lambda: dispatch(out, p, pl, s, sl, out_lse, n, query_start_loc=q,
                                                 context_start_loc=c)),
            (base + "_ctxmask_fp8", lambda: dispatch(fp8, p, pl, s, sl, out_lse, n, scale, query_start_loc=q,
                                                     context_start_loc=c)),
        ]:
            call()
            got, values, _ = cpu_launch.last()
            assert got == launched(name, T, H, threshold=n), (name, got)
            if "_ctxmask" in name:
                assert (values["query_start_loc"], values["context_start_loc"]) == (q.data_ptr(), c.data_ptr())
                assert values["num_requests"] == 3
            if "_fp8" in name:
                assert values["output"] == fp8.data_ptr() and values["output_scale"] == scale.data_ptr()
    assert not calls["vllm"]
    assert mv.stats["fallbacks"] == 0 and mla_gen.stats()["fallbacks"] == 0
    assert len(cpu_launch.launches) == 5 * len(DEFAULT_HEADS)
    handle.undo()


def test_a_fused_call_handed_back_masks_the_prefix_lse_first(standin):
    calls, mods, original = standin
    handle = mv.patch()
    dispatch = mods[MODULE].merge_attn_states
    out, p, pl, s, sl = tensors(D=100)  # no d100 kernel: vLLM's own, the mask on a copy first
    pl.copy_(torch.arange(32.0).view(4, 8))
    q = torch.tensor([0, 3, 5, 8], dtype=torch.int32)
    c = torch.tensor([0, 0, 4, 4], dtype=torch.int32)
    before = pl.clone()
    dispatch(out, p, pl, s, sl, None, 6, query_start_loc=q, context_start_loc=c)
    masked = calls["vllm"][-1][4]
    assert torch.equal(pl, before), "the caller's prefix_lse is not written"
    want = before.clone()
    want[:, 0:3] = float("-inf")  # request 0: tokens 0-2; request 2: tokens 5-7
    want[:, 5:8] = float("-inf")
    assert torch.equal(masked, want)
    with pytest.raises(ValueError, match="query_start_loc given without context_start_loc"):
        dispatch(out, p, pl, s, sl, None, 6, query_start_loc=q)
    handle.undo()


def test_the_torch_mask_matches_the_semantics():
    """mask_empty_context against a loop over SEMANTICS.md's rule: tokens outside every request
    keep their lse, empty requests (equal query starts) hold no token, B = 0 masks nothing."""
    g = torch.Generator().manual_seed(3)
    for qsl, csl in [([0, 2, 2, 7], [0, 5, 5, 5]), ([1, 4, 6], [3, 3, 9]), ([0], [0]), ([2, 9], [1, 1])]:
        lse = torch.randn(3, 9, generator=g)
        got = mv.mask_empty_context(lse, torch.tensor(qsl, dtype=torch.int32), torch.tensor(csl, dtype=torch.int32))
        want = lse.clone()
        for b in range(len(qsl) - 1):
            if csl[b + 1] == csl[b]:
                want[:, qsl[b]:qsl[b + 1]] = float("-inf")
        assert torch.equal(got, want), (qsl, csl)


# ---- vLLM's newest signature: per-token-group FP8 ----

def group_call(dtype=torch.bfloat16, D=128, layout="row-major", groups=None, T=8, H=4):
    """An FP8 output, the inputs and a float32 scale tensor addressed as [T, groups] (groups =
    H*D/64 unless given): row-major, column-major (the transpose's storage) or padded rows."""
    out, p, pl, s, sl = tensors(dtype, D=D, T=T, H=H)
    fp8 = torch.empty(T, H, D, dtype=torch.float8_e4m3fn)
    g = groups or H * D // 64
    block = {"row-major": lambda: torch.empty(T, g), "column-major": lambda: torch.empty(g, T).t(),
             "padded": lambda: torch.empty(T, g + 3)[:, :g]}[layout]()
    return fp8, p, pl, s, sl, block


@pytest.mark.parametrize("layout", ["row-major", "column-major", "padded"])
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("style", ["positional", "keywords"])
def test_group_fp8_calls_launch_the_group_kernel_with_the_scales_strides_as_given(standin, cpu_launch, select_folder,
                                                                                  monkeypatch, layout, ue8m0, style):
    from conftest import launched

    calls, mods, original = standin
    monkeypatch.setattr(mv, "_merge", REAL_MERGE)
    handle = mv.patch()
    dispatch = mods[MODULE].merge_attn_states
    fp8, p, pl, s, sl, block = group_call(layout=layout)
    out_lse, n = torch.empty(4, 8), 6
    if style == "positional":
        dispatch(fp8, p, pl, s, sl, out_lse, n, None, block, 64, ue8m0)
    else:
        dispatch(fp8, p, pl, s, sl, output_lse=out_lse, prefill_tokens_with_context=n, output_block_scale=block,
                 quant_group_size=64, quant_scale_ue8m0=ue8m0)
    assert not calls["vllm"], "routed, not handed back"
    name, values, _ = cpu_launch.last()
    base = "merge_attn_states_bf16_d128_thr_lse_fp8g64" + ("_ue8m0" if ue8m0 else "")
    assert name == launched(base, 8, 4, threshold=n), name
    assert values["output"] == fp8.data_ptr() and values["output_lse"] == out_lse.data_ptr()
    assert values["output_scales"] == block.data_ptr() and values["prefill_tokens_with_context"] == n
    assert (values["scale_token_stride"], values["scale_group_stride"]) == block.stride()
    handle.undo()


def test_group_fp8_arguments_map_onto_mla_gens(standin, monkeypatch):
    calls, mods, original = standin
    monkeypatch.setattr(mv, "supports", lambda *args, **kwargs: True)  # the mapping alone: any folder serves
    monkeypatch.setattr(mv, "_routes", {})
    handle = mv.patch()
    fp8, p, pl, s, sl, block = group_call(layout="column-major")
    with_mask = {"query_start_loc": torch.tensor([0, 8], dtype=torch.int32),
                 "context_start_loc": torch.tensor([0, 3], dtype=torch.int32)}
    for keywords in ({}, with_mask):
        mods[MODULE].merge_attn_states(fp8, p, pl, s, sl, None, 5, None, block, 64, None, **keywords)
        output, lse, n, scale, given = calls["mla_gen"][-1]
        assert output is fp8 and lse is None and n == 5 and scale is None
        assert given.pop("output_group_scales") is block and given.pop("ue8m0") is False
        assert given == keywords
    assert not calls["vllm"]
    # A scale tensor of another shape is addressed by its own two strides, as vLLM's kernel does.
    odd = torch.empty(64)
    view = mv.group_scales(fp8, odd.as_strided((8, 4), (1, 8)), 64)
    assert view.shape == (8, 8) and view.stride() == (1, 8) and view.data_ptr() == odd.data_ptr()
    handle.undo()


@pytest.mark.parametrize("case", ["no kernel for the group size", "output_scale too", "no group size",
                                  "float16 scales", "group size not dividing D", "no kernel for the dtype",
                                  "an unknown keyword"])
def test_group_fp8_calls_mla_gen_cannot_take_go_to_vllm_as_given(standin, select_folder, case):
    calls, mods, original = standin
    handle = mv.patch()
    dtype = torch.float16 if case == "no kernel for the dtype" else torch.bfloat16
    fp8, p, pl, s, sl, block = group_call(dtype, groups=16 if case == "no kernel for the group size" else None)
    group = {"no kernel for the group size": 32, "no group size": None, "group size not dividing D": 48}.get(case, 64)
    scale = torch.ones(1) if case == "output_scale too" else None
    if case == "float16 scales":
        block = block.half()
    if case == "an unknown keyword":  # vLLM's to judge: this stand-in has no such argument
        with pytest.raises(TypeError, match="quant_col_major"):
            mods[MODULE].merge_attn_states(fp8, p, pl, s, sl, None, 5, scale, block, group, True, quant_col_major=True)
        assert not calls["mla_gen"] and not calls["vllm"]
        return handle.undo()
    mods[MODULE].merge_attn_states(fp8, p, pl, s, sl, None, 5, scale, block, group, True)
    assert not calls["mla_gen"] and len(calls["vllm"]) == 1
    _, _, n, got_scale, _, got_block, got_group, ue8m0 = calls["vllm"][0]
    assert (n, got_scale, got_block, got_group, ue8m0) == (5, scale, block, group, True), "as given"
    handle.undo()

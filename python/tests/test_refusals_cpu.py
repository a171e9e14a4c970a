"""Calls the torch layer refuses, without a GPU (conftest's `cpu_launch`): an argument that is not
a tensor, one of the wrong dtype, layout or device, keywords that do not go together. Each refusal
names the argument as its caller wrote it and says what to pass, before anything launches."""

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import mla_gen  # noqa: E402
from mla_gen import ArgumentError, manifest  # noqa: E402

from test_torch_cpu import BF16, D, H, T, pair  # noqa: E402


def test_a_required_tensor_that_is_not_one_is_a_type_error_naming_the_callers_argument(cpu_launch):
    """None (or another non-tensor) where a call needs a tensor: a TypeError naming the argument as
    the caller wrote it, before any kernel is selected (it once read as a kernel the folder lacks),
    whether or not an earlier call left a plan."""
    from mla_gen import flashinfer
    out, p, pl, s, sl = pair()
    fp8, scales = torch.empty(T, H, D, dtype=torch.float8_e4m3fn), torch.empty(T, H * D // 128)
    v, vl = torch.randn(T, 3, H, D).to(BF16), torch.randn(T, 3, H)
    lt = torch.randn(T, H)
    q, c = torch.tensor([0, 3, T], dtype=torch.int32), torch.tensor([0, 0, 5], dtype=torch.int32)
    calls = [
        (lambda: mla_gen.merge_attn_states(None, p, pl, s, sl), "output", "NoneType"),
        (lambda: mla_gen.merge_attn_states(out, p, pl, None, sl), "suffix_output", "NoneType"),
        (lambda: mla_gen.merge_attn_states(out, p, pl, s, 3), "suffix_lse", "int"),
        (lambda: mla_gen.merge_attn_states(out, p, None, s, sl, query_start_loc=q, context_start_loc=c),
         "prefix_lse", "NoneType"),
        (lambda: mla_gen.merge_attn_states_fp8_group(fp8, None, p, pl, s, sl), "output_group_scales", "NoneType"),
        (lambda: mla_gen.merge_attn_states_fp8_group(fp8, scales, p, None, s, sl), "prefix_lse", "NoneType"),
        (lambda: mla_gen.merge_states(v, None), "s", "NoneType"),
        (lambda: mla_gen.merge_states(v, vl, output="out"), "output", "str"),
        (lambda: mla_gen.merge_state_in_place(p, None, s, lt), "s", "NoneType"),
        (lambda: mla_gen.merge_state_in_place(p, lt, None, lt), "v_other", "NoneType"),
        (lambda: mla_gen.mask_empty_context_lse(None, q, c), "lse", "NoneType"),
        (lambda: mla_gen.mask_empty_context_lse(pl.clone(), None, c), "query_start_loc", "NoneType"),
        (lambda: flashinfer.merge_state(p, lt, None, lt), "v_b", "NoneType"),
        (lambda: flashinfer.merge_state_in_place(None, lt, s, lt), "v", "NoneType"),
    ]
    for round_ in range(2):
        for call, name, typ in calls:
            with pytest.raises(TypeError, match=f"^{name} must be a torch.Tensor, got {typ}$"):
                call()
        mla_gen.merge_attn_states(out, p, pl, s, sl)  # the slot and the cache hold a plan for the next round
        mla_gen.merge_attn_states(out, p, pl, s, sl)
    assert len(cpu_launch.launches) == 4


def test_a_mask_lse_of_another_dtype_is_named_with_the_dtype_it_takes(cpu_launch):
    # Not "no generated mask_empty_context_lse kernel" (no spec makes one for another lse dtype).
    q, c = torch.tensor([0, 3, T], dtype=torch.int32), torch.tensor([0, 0, 5], dtype=torch.int32)
    for dtype, elem in [(torch.float16, "f16"), (BF16, "bf16"), (torch.float64, "f64")]:
        with pytest.raises(ArgumentError, match=f"^mask_empty_context_lse: lse is {elem}, the kernel takes f32$"):
            mla_gen.mask_empty_context_lse(torch.randn(H, T).to(dtype), q, c)
    assert not cpu_launch.launches
    mla_gen.mask_empty_context_lse(torch.randn(H, T), q, c)
    assert cpu_launch.last()[0] == "mask_empty_context_lse"


def test_refusals_name_the_functions_arguments_not_the_kernels_parameters(cpu_launch):
    """merge_attn_states_fp8_group's output_group_scales, merge_states's v and s,
    merge_state_in_place's v, s, v_other, s_other: the argument check's problem (the
    ArgumentError's ``problem`` too) names them, as the caller wrote them."""
    out, p, pl, s, sl = pair()
    fp8 = torch.empty(T, H, D, dtype=torch.float8_e4m3fn)
    v, lt = torch.randn(T, 3, H, D).to(BF16), torch.randn(T, H)
    for call, named, kernels in [
        (lambda: mla_gen.merge_attn_states_fp8_group(fp8, torch.empty(T, H * D // 128).half(), p, pl, s, sl),
         "output_group_scales is f16, the kernel takes f32", "output_scales"),
        (lambda: mla_gen.merge_attn_states(fp8, p, pl, s, sl, output_group_scales=torch.empty(T, H * D // 128).half()),
         "output_group_scales is f16, the kernel takes f32", "output_scales"),
        (lambda: mla_gen.merge_states(v, torch.randn(T, 3, H).half()), "s is f16, the kernel takes f32", "states_lse"),
        (lambda: mla_gen.merge_state_in_place(p, lt.half(), s, lt), "s is f16, the kernel takes f32", "state_lse"),
        (lambda: mla_gen.merge_state_in_place(p, lt, s, lt.half()), "s_other is f16, the kernel takes f32",
         "other_lse"),
        (lambda: mla_gen.merge_state_in_place(p, lt, p, lt), "v overlaps v_other", "other"),
    ]:
        with pytest.raises(ArgumentError) as e:
            call()
        assert e.value.problem.startswith(named) and str(e.value) == f"{e.value.kernel}: {e.value.problem}", e.value
        assert not re.search(rf"(?<![\w.]){kernels}\b(?! argument)", e.value.problem), e.value
    assert not cpu_launch.launches


def test_a_non_tensor_after_a_plan_of_one_tensor_in_two_places_is_a_type_error(cpu_launch):
    """One tensor in two places plans under the layout key (TensorGuards refuses aliases); a later
    call with an int where a tensor goes is the full check's TypeError, not an AttributeError of
    the key (mla_gen.vllm hands a TypeError back to vLLM)."""
    from mla_gen import _plan
    out, p, pl, s, sl = pair()
    mla_gen.merge_attn_states(out, p, pl, p, pl)
    mla_gen.merge_attn_states(out, p, pl, p, pl)
    with pytest.raises(TypeError, match="^suffix_lse must be a torch.Tensor, got int$"):
        mla_gen.merge_attn_states(out, p, pl, p, 3)
    assert _plan.LayoutKey((p, pl)).check(p, 3) is False and _plan.LayoutKey((p, pl)).check(p, pl) is True
    assert len(cpu_launch.launches) == 2


def test_an_empty_call_judges_its_threshold_whatever_ran_before(cpu_launch):
    """T = 0 launches nothing, but the threshold is still an int within [0, T]: the planned call
    refuses what the full check refuses (a plan with nothing to launch once took any value)."""
    out, p, pl, s, sl = pair(t=0)
    bad = [(5, ArgumentError, "prefill_tokens_with_context = 5 exceeds its maximum num_tokens = 0"),
           (-3, ArgumentError, "prefill_tokens_with_context = -3 is below its minimum 0"),
           ("x", TypeError, "prefill_tokens_with_context must be a Python int"),
           (1.0, TypeError, "prefill_tokens_with_context must be a Python int")]
    for round_ in range(2):
        for n, exc, text in bad:
            with pytest.raises(exc, match=re.escape(text)):
                mla_gen.merge_attn_states(out, p, pl, s, sl, None, n)
        mla_gen.merge_attn_states(out, p, pl, s, sl, None, 0)  # a plan, with nothing to launch
        mla_gen.merge_attn_states(out, p, pl, s, sl, None, 0)
    assert not cpu_launch.launches


def test_ue8m0_without_group_scales_is_refused(cpu_launch):
    # ue8m0 rounds the per-group scales: without output_group_scales it was silently ignored.
    out, p, pl, s, sl = pair()
    mla_gen.merge_attn_states(out, p, pl, s, sl)  # the slot holds a plan of this layout
    with pytest.raises(ValueError, match=r"^ue8m0=True rounds the per-group scales of an e4m3 output, but no "
                                         r"output_group_scales is given: pass output_group_scales"):
        mla_gen.merge_attn_states(out, p, pl, s, sl, ue8m0=True)
    assert len(cpu_launch.launches) == 1


def test_an_lse_given_transposed_names_the_layout_to_pass(cpu_launch):
    """The functions that take lse_layout say which to pass for an lse laid out the other way;
    the entry points with a fixed layout (the merge_attn_states op, FlashInfer's) say no such thing."""
    from mla_gen import functions
    out, p, pl, s, sl = pair()
    hint = ' (for an lse laid out [{}], pass lse_layout="{}")'
    for call, named, labels, layout in [
        (lambda: mla_gen.merge_attn_states(out, p, pl, s, sl.t().contiguous()), "suffix_lse", "T, H", "token_major"),
        (lambda: mla_gen.merge_attn_states(out, p, pl, s, sl, torch.empty(T, H)), "output_lse", "T, H", "token_major"),
        (lambda: mla_gen.merge_state_in_place(p, pl, s, sl, lse_layout="token_major"), "s", "H, T", "head_major"),
        (lambda: mla_gen.merge_state_in_place(p, pl, s, sl), "s", "H, T", "head_major"),  # token-major by default
    ]:
        with pytest.raises(ValueError, match=f"^{named} has shape .*{re.escape(hint.format(labels, layout))}$"):
            call()
    with pytest.raises(ValueError, match=r"^suffix_lse has shape \(8, 4\); the kernel addresses it as \[H=4, T=8\]$"):
        functions.merge_attn_states_op(out, None, p, pl, s, sl.t().contiguous())
    assert not cpu_launch.launches


def test_a_group_fp8_lse_given_transposed_names_the_layout_to_pass(cpu_launch, contract_kernels):
    # (The contract table's folder: group FP8 in groups of 64 only.)
    from mla_gen import ops
    out, p, pl, s, sl = pair()
    fp8, scales = torch.empty(T, H, D, dtype=torch.float8_e4m3fn), torch.empty(T, H * D // 64)
    hint = ' (for an lse laid out [T, H], pass lse_layout="token_major")'
    for call in (lambda: mla_gen.merge_attn_states_fp8_group(fp8, scales, p, pl.t().contiguous(), s, sl),
                 lambda: mla_gen.merge_attn_states(fp8, p, pl.t().contiguous(), s, sl, output_group_scales=scales)):
        with pytest.raises(ValueError, match=f"^prefix_lse has shape .*{re.escape(hint)}$"):
            call()
    with pytest.raises(ValueError, match=r"^prefix_lse has shape \(8, 4\); the kernel addresses it as \[H=4, T=8\]$"):
        ops.IMPLS["merge_attn_states_fp8_group"](fp8, scales, None, p, pl.t().contiguous(), s, sl)  # no lse_layout
    assert not cpu_launch.launches


def test_empty_start_locations_say_how_many_they_need(cpu_launch):
    # Not "num_requests = -1 is below its minimum 0": an integer the caller never wrote.
    lse = torch.randn(H, T)
    empty = torch.zeros(0, dtype=torch.int32)
    with pytest.raises(ValueError, match=re.escape("query_start_loc must hold at least 1 along B+1 = num_requests + 1 "
                                                   "(num_requests >= 0), got shape (0,)")):
        mla_gen.mask_empty_context_lse(lse, empty, empty)
    mla_gen.mask_empty_context_lse(lse, torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    assert cpu_launch.last()[1]["num_requests"] == 0


def test_the_merge_states_op_refuses_a_kernel_without_an_output_lse_before_launching(cpu_launch, tmp_path,
                                                                                    monkeypatch):
    # torch.ops.mla_gen.merge_states returns the merged lse: a folder whose kernel writes none is
    # refused before anything runs, as the compiled op refuses it (the plain function allocates none).
    from mla_gen import ops
    m = {k: v for k, v in manifest.load().items() if not k.startswith("_")}
    contracts = json.loads((Path(__file__).resolve().parents[2] / "tests/contract/contracts.json").read_text())
    entry = {"name": "merge_states_bf16_d128_k4", "family": "merge_states", "archs": [],
             "variant": {"family": {"merge_states": {"num_states": 4}}, "dtype": "bf16", "head_size": 128,
                         "output_lse": False}, **json.loads(json.dumps(contracts["merge_states_bf16_d128_k4_lse"]))}
    entry["params"] = [p for p in entry["params"] if p["name"] != "output_lse"]
    m["kernels"] = [entry]
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    monkeypatch.setenv("MLA_GEN_KERNELS", str(tmp_path))
    v, s = torch.randn(T, 4, H, D).to(BF16), torch.randn(T, 4, H)
    with pytest.raises(ValueError, match="^torch.ops.mla_gen.merge_states returns the merged lse: "):
        ops.IMPLS["merge_states"](v, s)
    assert not cpu_launch.launches
    out, lse = mla_gen.merge_states(v, s)
    assert lse is None and cpu_launch.last()[0] == "merge_states_bf16_d128_k4"


def test_launch_kernel_checks_the_devices(cpu_launch):
    """launch_kernel's tensors are on one device of the kernels' type, and `device`, where given,
    is theirs (the plain functions' checks; it once launched whatever it was given)."""
    out, p, pl, s, sl = pair()
    args = dict(output=out, prefix_output=p, prefix_lse=pl, suffix_output=s, suffix_lse=sl, num_tokens=T,
                num_heads=H, prefill_tokens_with_context=T, output_token_stride=H * D, output_head_stride=D,
                prefix_token_stride=H * D, prefix_head_stride=D, suffix_token_stride=H * D, suffix_head_stride=D)
    kernel = "merge_attn_states_bf16_d128_thr_lse"
    with pytest.raises(ValueError, match=r"^launch_kernel\(device=1\): output is on cpu, as every tensor of the call; "
                                         r"pass device=0, or leave device out$"):
        mla_gen.launch_kernel(kernel, args, device=1)
    with pytest.raises(ValueError, match="^suffix_lse is on meta; the kernels run on a CUDA device$"):
        mla_gen.launch_kernel(kernel, dict(args, suffix_lse=sl.to("meta")))
    assert not cpu_launch.launches
    mla_gen.launch_kernel(kernel, args, device=0)
    mla_gen.launch_kernel(kernel, args)
    assert len(cpu_launch.launches) == 2


def test_launch_kernel_refuses_cpu_tensors():
    out, p, pl, s, sl = pair()
    with pytest.raises(ValueError, match="^output is on cpu; the kernels run on a CUDA device$"):
        mla_gen.launch_kernel("merge_attn_states_bf16_d128_thr_lse", dict(output=out, prefix_output=p, prefix_lse=pl,
                                                                       suffix_output=s, suffix_lse=sl), device=0)

"""mla_gen.vllm.patch against a stand-in of vLLM's dispatcher (its module path and signature,
fake functions, no GPU): supported calls go to mla-gen, the rest to the original."""

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
                          prefill_tokens_with_context=None, output_scale=None):
        calls["vllm"].append((output, output_lse, prefill_tokens_with_context, output_scale))

    names = ["vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.ops", MODULE, "vllm_backend_standin"]
    mods = {n: types.ModuleType(n) for n in names}
    mods[MODULE].merge_attn_states = merge_attn_states
    mods["vllm_backend_standin"].merge_attn_states = merge_attn_states  # `from ... import merge_attn_states`
    for n, m in mods.items():
        monkeypatch.setitem(sys.modules, n, m)

    def fake_merge(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, n, scale):
        calls["mla_gen"].append((output, output_lse, n, scale))

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
    fp8 = torch.empty(8, 4, 128, dtype=torch.float8_e4m3fn)     # no FP8 kernels in the default folder
    dispatch(fp8, p, pl, s, sl, None, None, torch.ones(1))
    dispatch(out.half(), p, pl, s, sl)                          # output dtype differs from the inputs'
    meta = [t.to("meta") for t in (out, p, pl, s, sl)]          # not on the (stand-in) CUDA device
    dispatch(*meta)
    assert len(calls["vllm"]) == 4 and len(calls["mla_gen"]) == 3
    assert calls["vllm"][0][2] == 4 and calls["vllm"][1][3] is not None, "fallback gets the arguments as given"

    handle.undo()
    assert mods[MODULE].merge_attn_states is original and mods["vllm_backend_standin"].merge_attn_states is original


def test_a_refused_call_falls_back_unless_strict(standin, monkeypatch):
    calls, mods, original = standin

    def refuse(*args):
        raise mla_gen.ArgumentError("merge_attn_states_bf16_d128_thr_lse", "output: pointer 0x2 is not aligned")

    monkeypatch.setattr(mv, "_merge", refuse)
    handle = mv.patch()
    mods[MODULE].merge_attn_states(*tensors())
    assert len(calls["vllm"]) == 1
    handle.undo()
    handle = mv.patch(MODULE, strict=True)
    with pytest.raises(mla_gen.ArgumentError):
        mods[MODULE].merge_attn_states(*tensors())
    handle.undo()


def test_route_follows_supports():
    out, p, pl, s, sl = tensors()
    assert not mv.route(out, p, pl, s, sl), "CPU tensors are not routed"

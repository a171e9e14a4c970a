"""mla_gen.flashinfer without a GPU: FlashInfer's signatures select the base-2, token-major
kernels (the selection table's folder, tests/contract/select.toml), allocate what FlashInfer's
functions return, and a call no base-2 kernel serves names lse_base. Launches are recorded
(conftest's `cpu_launch`); the GPU check against FlashInfer's own kernels is
bench/flashinfer_check.py."""

import re

import pytest

torch = pytest.importorskip("torch")

from mla_gen import ArgumentError, flashinfer  # noqa: E402

BF16 = torch.bfloat16
T, H, D = 8, 4, 128


def test_merge_state_runs_the_base_2_token_major_kernel_and_returns_new_tensors(select_folder, cpu_launch):
    v_a, v_b = torch.randn(T, H, D).to(BF16), torch.randn(T, H, D).to(BF16)
    s_a, s_b = torch.randn(T, H), torch.randn(T, H).to(torch.float16)  # any float lse: read as float32
    v, s = flashinfer.merge_state(v_a, s_a, v_b, s_b)
    name, values, _ = cpu_launch.last()
    assert name.startswith("merge_attn_states_bf16_d128_") and "_tm_base2" in name, name
    assert (v.shape, v.dtype, s.shape, s.dtype) == ((T, H, D), BF16, (T, H), torch.float32)
    assert values["output"] == v.data_ptr() and values["output_lse"] == s.data_ptr()
    assert values["prefix_output"] == v_a.data_ptr() and values["prefix_lse"] == s_a.data_ptr()


def test_merge_state_in_place_takes_the_mask(select_folder, cpu_launch):
    v, v_other = torch.randn(T, H, D).to(BF16), torch.randn(T, H, D).to(BF16)
    s, s_other = torch.randn(T, H), torch.randn(T, H)
    flashinfer.merge_state_in_place(v, s, v_other, s_other)
    assert cpu_launch.last()[0] == "merge_state_in_place_bf16_d128_tm_base2"
    flashinfer.merge_state_in_place(v, s, v_other, s_other, mask=torch.ones(T, dtype=torch.bool))
    assert cpu_launch.last()[0] == "merge_state_in_place_bf16_d128_mask_tm_base2"


def test_merge_states_returns_the_merged_state_and_its_lse(select_folder, cpu_launch):
    v, s = torch.randn(T, 4, H, D).to(BF16), torch.randn(T, 4, H)
    out, lse = flashinfer.merge_states(v, s)
    assert cpu_launch.last()[0] == "merge_states_bf16_d128_k4_lse_base2"
    assert (out.shape, lse.shape, lse.dtype) == ((T, H, D), (T, H), torch.float32)


def test_a_call_no_base_2_kernel_serves_names_the_base(select_folder, cpu_launch):
    v = torch.randn(T, H, D).to(torch.float16)  # the table's base-2 kernels are bf16
    with pytest.raises(ValueError, match="lse_base = 2"):
        flashinfer.merge_state(v, torch.randn(T, H), v, torch.randn(T, H))
    assert not cpu_launch.launches


def test_sglang_merge_state_v2_runs_the_base_e_token_major_kernel_and_writes_given_outputs(select_folder,
                                                                                           cpu_launch):
    from mla_gen import sglang
    v_a, v_b = torch.randn(T, H, D).to(BF16), torch.randn(T, H, D).to(BF16)
    s_a, s_b = torch.randn(T, H), torch.randn(T, H)
    v, s = sglang.merge_state_v2(v_a, s_a, v_b, s_b)
    name, values, _ = cpu_launch.last()
    assert name.startswith("merge_attn_states_bf16_d128_") and "_tm" in name and "base2" not in name, name
    assert (v.shape, s.shape, s.dtype) == ((T, H, D), (T, H), torch.float32)
    given = torch.empty(T, H, D, dtype=BF16), torch.empty(T, H)
    r = sglang.merge_state_v2(v_a, s_a, v_b, s_b, *given)
    assert r[0] is given[0] and r[1] is given[1]
    assert cpu_launch.last()[1]["output"] == given[0].data_ptr()


def test_one_state_launches_the_runtime_kernel_where_the_folder_has_it(select_folder, cpu_launch):
    """FlashInfer's K = 1 with more tokens than states: the base-2 runtime-K kernel, which copies
    the state's rows and lse in one launch (GPU run 128: two torch copies cost 1.1-1.2x FlashInfer's
    kernel); the strided state is passed as it is."""
    base = torch.randn(T, 1, H, D + 16).to(BF16)
    v = base[..., :D]  # a padded state: strided rows
    s = torch.randn(T, 1, H)
    out, lse = flashinfer.merge_states(v, s)
    ((name, values, _),) = cpu_launch.launches
    assert name.startswith("merge_states_bf16_d128_kvar") and name.endswith("_base2"), name
    assert values["states"] == v.data_ptr() and values["output"] == out.data_ptr()
    assert values["output_lse"] == lse.data_ptr() and values["num_states"] == 1


def _no_kernel(*args, **kwargs):
    raise ValueError("no generated merge_states kernel (simulated folder without one)")


def test_merge_states_of_one_state_returns_it_unchanged(cpu_launch, monkeypatch):
    """FlashInfer's K = 1 in a folder without a runtime-K kernel: the state's rows and lse as they
    are, empty rows (-inf) included, in new contiguous tensors, copied by torch."""
    monkeypatch.setattr(flashinfer._torch, "_call", _no_kernel)
    base = torch.randn(T, 1, H, D + 16).to(BF16)
    v = base[..., :D]  # a padded state: strided rows
    s = torch.randn(T, 1, H)
    s[0, 0, :] = float("-inf")  # an empty row: FlashInfer returns the row (here random), not zeros
    s[1, 0, 1], s[2, 0, 2] = float("inf"), float("nan")
    out, lse = flashinfer.merge_states(v, s)
    assert not cpu_launch.launches
    assert out.is_contiguous() and out.data_ptr() != v.data_ptr() and lse.data_ptr() != s.data_ptr()
    assert torch.equal(out.view(torch.int16), v[:, 0].contiguous().view(torch.int16)), "rows bit for bit"
    assert torch.equal(lse.view(torch.int32), s[:, 0].contiguous().view(torch.int32)), "lse bit for bit"
    assert lse[0].eq(float("-inf")).all() and lse.dtype == torch.float32
    half = s.half()  # any float lse, read as float32
    got = flashinfer.merge_states(v, half)[1]
    assert torch.equal(got.view(torch.int32), half[:, 0].float().view(torch.int32))
    with pytest.raises(ValueError, match=r"s must be \[T, K, H\]"):
        flashinfer.merge_states(v, s[:, :, :1])  # would broadcast
    with pytest.raises(ValueError, match="the kernels run on a CUDA device"):
        flashinfer.merge_states(v.to("meta"), s.to("meta"))


def test_one_state_is_copied_or_merged_as_flashinfer_dispatches(cpu_launch, monkeypatch):
    """K = 1: FlashInfer's MergeStates copies the state (rows without keys too) when tokens
    outnumber states; with one token its kernel for states >= tokens merges, and a row without
    keys becomes zeros. Without a runtime-K kernel in the folder no kernel runs either way."""
    monkeypatch.setattr(flashinfer._torch, "_call", _no_kernel)
    g = torch.Generator().manual_seed(3)
    v = torch.randn(3, 1, 2, 64, generator=g).to(torch.bfloat16)
    s = torch.randn(3, 1, 2, generator=g) * 4
    s[1, 0, 0] = -float("inf")
    out, lse = flashinfer.merge_states(v, s)
    assert torch.equal(out, v[:, 0]) and torch.equal(lse, s[:, 0])
    s1 = s[1:2].clone()
    out, lse = flashinfer.merge_states(v[1:2], s1)
    assert torch.equal(out[0, 0], torch.zeros_like(out[0, 0])), "one token: no keys gives zeros"
    assert torch.equal(out[0, 1], v[1, 0, 1]) and torch.equal(lse, s1[:, 0])
    assert cpu_launch.launches == []


def test_refusals_name_the_callers_arguments(select_folder, cpu_launch):
    """FlashInfer's and sgl-kernel's argument names in the errors (v_a, s_b ...), not the kinds'
    (prefix_output, suffix_lse ...) that the caller never wrote."""
    from mla_gen import sglang
    v_a, v_b = torch.randn(T, H, D).to(BF16), torch.randn(T, H, D).to(BF16)
    s = torch.randn(T, H)
    for call, bad, name in [
        (lambda: flashinfer.merge_state(v_a, torch.randn(H, T + 1), v_b, s), "s_a", "prefix_lse"),
        (lambda: flashinfer.merge_state(v_a, s, v_b.half(), s), "v_b", "suffix_output"),
        (lambda: flashinfer.merge_state_in_place(v_a, s.to(BF16), v_b, s), "s", "state_lse"),
        (lambda: flashinfer.merge_states(torch.randn(T, 4, H, D).to(BF16), torch.randn(T, 3, H)), "s",
         "states_lse"),
        (lambda: sglang.merge_state_v2(v_a, s, v_b, s, None, torch.empty(T, H, dtype=BF16)), "s_merged",
         "output_lse"),
        (lambda: sglang.merge_state_v2(v_a, None, v_b, s), "s_a", "prefix_lse"),
        (lambda: flashinfer.merge_state(v_a, None, v_b, s), "s_a", "prefix_lse"),
        (lambda: flashinfer.merge_state(v_a, s, None, s), "v_b", "suffix_output"),
        (lambda: flashinfer.merge_state_in_place(v_a, s, v_a, s), "v_other", "other"),
    ]:
        with pytest.raises((TypeError, ValueError)) as e:
            call()
        text = str(e.value)
        # The engine's own name, as a word (not inside another name or a dotted path), and not the
        # kind's (as a word: "other" is also English, in the overlap text's "no other argument").
        kinds = re.compile(rf"(?<![\w.]){re.escape(name)}\b(?! argument)")
        assert not kinds.search(text) and re.search(rf"(?<![\w.]){re.escape(bad)}\b", text), (bad, text)
        if isinstance(e.value, ArgumentError):  # its problem too, not only its text
            assert not kinds.search(e.value.problem) and str(e.value) == f"{e.value.kernel}: {e.value.problem}", e.value
    assert not cpu_launch.launches


def test_flashinfer_calls_take_the_dtypes_the_docs_name():
    """FlashInfer's calls run the base-2 kernels, f16/bf16 in the default folder (no f32): the
    docstring and python/README.md say so, and the default folder has exactly those."""
    from conftest import ROOT
    import mla_gen
    for dtype, served in [(torch.float16, True), (BF16, True), (torch.float32, False)]:
        assert mla_gen.supports(dtype, 128, lse_layout="token_major", lse_base="2", output_lse=True) == served
        assert mla_gen.supports(dtype, 128, family="merge_states", lse_base="2") == served
    assert "f16/bf16/f32" not in flashinfer.merge_state.__doc__ and "f16/bf16" in flashinfer.merge_state.__doc__
    readme = ROOT / "python" / "README.md"
    if readme.is_file():
        text = " ".join(readme.read_text().split())
        assert "FlashInfer (`mla_gen.flashinfer`) on f16/bf16," in text, text

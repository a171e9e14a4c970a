"""GPU tests of the drop-in against a float64 torch reference. Skipped without a GPU."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU: the drop-in needs one (run scripts/gpu-check.sh on a GPU machine)",
                allow_module_level=True)

import mla_gen  # noqa: E402

TOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
EPS = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def reference(prefix, plse, suffix, slse, n=None, has_context=None):
    """docs/SEMANTICS.md in float64: returns (out, lse, magnitude, copy_mask). Rows t < n (or
    where has_context[t]) have context."""
    p = plse.double().t()  # [T, H]
    s = slse.double().t()
    T = p.shape[0]
    if has_context is None:
        has_context = torch.arange(T, device=p.device) < n
    ctx = has_context[:, None].expand_as(p)
    inf = math.inf
    p2 = torch.where(p == inf, -inf, p)
    s2 = torch.where(s == inf, -inf, s)
    m = torch.where((p2 > s2) | p2.isnan(), p2, s2)  # a NaN on either side makes m NaN
    empty = m == -inf
    m_safe = torch.where(empty, torch.zeros_like(m), m)
    a = torch.exp(p2 - m_safe)
    b = torch.exp(s2 - m_safe)
    pw, sw = a / (a + b), b / (a + b)
    P, S = prefix.double(), suffix.double()
    blend = P * pw[..., None] + S * sw[..., None]
    mag = (P * pw[..., None]).abs() + (S * sw[..., None]).abs()
    out = torch.where(empty[..., None], P, blend)
    out = torch.where(ctx[..., None], out, S)
    lse = torch.where(empty, torch.full_like(m, -inf), torch.log(a + b) + m_safe)
    lse = torch.where(ctx, lse, slse.double().t())
    copy = (~ctx) | empty
    mag = torch.where(copy[..., None], out.abs(), mag)
    return out, lse.t(), mag, copy


def check(out, ref, mag, copy, dtype):
    got = out.double()
    want = ref.to(dtype).double()
    both_nan = got.isnan() & want.isnan()
    assert not (got.isnan() ^ want.isnan()).any(), "NaN mismatch"
    ulp = (want.abs() * EPS[dtype]).clamp_min(torch.finfo(dtype).tiny)
    err = (got - want).abs()
    slack = TOL[dtype] * mag + ulp
    blend_ok = (err <= slack) | both_nan | (got == want)
    copy_ok = (got == want) | both_nan
    ok = torch.where(copy[..., None].expand_as(got), copy_ok, blend_ok)
    assert ok.all(), f"{(~ok).sum().item()} elements off; worst err {err[~ok].max().item()}"


def lse_check(got, want):
    g, w = got.double(), want
    assert not (g.isnan() ^ w.isnan()).any()
    inf_ok = (g.isinf() == w.isinf()) & ((g == w) | ~w.isinf())
    assert inf_ok.all(), "infinite lse mismatch"
    fin = w.isfinite()
    assert ((g[fin] - w[fin]).abs() <= 1e-5).all()


def make(T, H, D, dtype, pad=0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    def tensor(extra):
        base = torch.empty(T, H, D + extra, device="cuda", dtype=dtype)
        base.uniform_(-4, 4, generator=g)
        return base[..., :D]
    prefix, suffix = tensor(pad), tensor(0)
    plse = torch.empty(H, T, device="cuda").uniform_(-15, 15, generator=g)
    slse = torch.empty(H, T, device="cuda").uniform_(-15, 15, generator=g)
    for lse in (plse, slse):
        u = torch.rand(H, T, device="cuda", generator=g)
        lse[u < 0.1] = math.inf
        lse[(u >= 0.1) & (u < 0.2)] = -math.inf
    both = torch.rand(H, T, device="cuda", generator=g) < 0.03
    plse[both] = -math.inf
    slse[both] = -math.inf
    return prefix, plse, suffix, slse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 80, 128, 576])
@pytest.mark.parametrize("T,H", [(1, 1), (7, 4), (613, 16), (256, 128)])
@pytest.mark.parametrize("mode", ["none", "zero", "half", "all"])
@pytest.mark.parametrize("with_lse", [True, False])
def test_matches_float64_reference(dtype, D, T, H, mode, with_lse):
    n = {"none": None, "zero": 0, "half": T // 2, "all": T}[mode]
    prefix, plse, suffix, slse = make(T, H, D, dtype, pad=D // 2, seed=T * 131 + H + D)
    # Output in a padded buffer too: a V of D inside D + 8.
    out = torch.full((T, H, D + 8), float("nan"), device="cuda", dtype=dtype)[..., :D]
    out_lse = torch.full((H, T), float("nan"), device="cuda") if with_lse else None
    mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, out_lse, n)
    torch.cuda.synchronize()
    ref, ref_lse, mag, copy = reference(prefix, plse, suffix, slse, T if n is None else n)
    check(out, ref, mag, copy, dtype)
    if with_lse:
        lse_check(out_lse, ref_lse)


def test_cuda_graph_capture_and_replay_with_changed_threshold():
    T, H, D, dtype = 512, 16, 128, torch.bfloat16
    prefix, plse, suffix, slse = make(T, H, D, dtype, seed=7)
    outs = {n: torch.empty(T, H, D, device="cuda", dtype=dtype) for n in (100, 400)}
    lses = {n: torch.empty(H, T, device="cuda") for n in (100, 400)}
    mla_gen.merge_attn_states(outs[100], prefix, plse, suffix, slse, lses[100], 100)  # warm: load
    loads = mla_gen.stats()["module_loads"]
    graphs = {}
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for n in (100, 400):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                mla_gen.merge_attn_states(outs[n], prefix, plse, suffix, slse, lses[n], n)
            graphs[n] = g
    torch.cuda.synchronize()
    for round_ in range(3):
        # New data in the same buffers each round; replay both thresholds.
        p2, pl2, s2, sl2 = make(T, H, D, dtype, seed=100 + round_)
        prefix.copy_(p2); plse.copy_(pl2); suffix.copy_(s2); slse.copy_(sl2)
        for n in (400, 100):
            outs[n].fill_(float("nan"))
            graphs[n].replay()
        torch.cuda.synchronize()
        for n in (100, 400):
            ref, ref_lse, mag, copy = reference(prefix, plse, suffix, slse, n)
            check(outs[n], ref, mag, copy, dtype)
            lse_check(lses[n], ref_lse)
    assert mla_gen.stats()["module_loads"] == loads


def test_a_thousand_thresholds_compile_and_load_nothing():
    T, H, D, dtype = 1000, 4, 128, torch.float16
    prefix, plse, suffix, slse = make(T, H, D, dtype, seed=3)
    out = torch.empty(T, H, D, device="cuda", dtype=dtype)
    # The first calls load what the loop runs: the kernel, and at n = T its all-context twin.
    for n in (0, T):
        mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, None, n)
    loads = mla_gen.stats()["module_loads"]
    launches = mla_gen.stats()["launches"]
    for n in range(1, 1001):
        mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, None, n)
    torch.cuda.synchronize()
    assert mla_gen.stats()["module_loads"] == loads
    assert mla_gen.stats()["launches"] == launches + 1000
    ref, _, mag, copy = reference(prefix, plse, suffix, slse, 1000)
    check(out, ref, mag, copy, dtype)


def test_offsets_past_2_to_the_32_elements():
    T, H, D, dtype = 1 << 20, 16, 256, torch.bfloat16  # 2^32 elements per tensor
    if torch.cuda.get_device_properties(0).total_memory < 40 << 30:
        pytest.skip("needs 40 GiB of GPU memory (its tensors take ~30 GiB)")
    g = torch.Generator(device="cuda").manual_seed(11)
    prefix = torch.empty(T, H, D, device="cuda", dtype=dtype).uniform_(-4, 4, generator=g)
    suffix = torch.empty(T, H, D, device="cuda", dtype=dtype).uniform_(-4, 4, generator=g)
    plse = torch.empty(H, T, device="cuda").uniform_(-5, 5, generator=g)
    slse = torch.empty(H, T, device="cuda").uniform_(-5, 5, generator=g)
    out = torch.full((T, H, D), float("nan"), device="cuda", dtype=dtype)
    out_lse = torch.full((H, T), float("nan"), device="cuda")
    n = T - 1000
    mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, out_lse, n)
    torch.cuda.synchronize()
    rows = torch.cat([torch.arange(0, 64), torch.randint(0, T, (2000,), generator=torch.Generator().manual_seed(1)),
                      torch.arange(T - 1100, T)]).cuda()
    ref, ref_lse, mag, copy = reference(prefix[rows], plse[:, rows], suffix[rows], slse[:, rows],
                                        has_context=rows < n)
    check(out[rows], ref, mag, copy, dtype)
    lse_check(out_lse[:, rows], ref_lse)
    assert not out.isnan().any(), "an element was never written"


def test_bad_calls_raise_clear_errors():
    T, H, D = 8, 2, 128
    prefix, plse, suffix, slse = make(T, H, D, torch.bfloat16)
    out = torch.empty(T, H, D, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="must be a Python int"):
        mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, None, torch.tensor(3))
    with pytest.raises(mla_gen.ArgumentError, match="prefill_tokens_with_context = 9 exceeds its maximum num_tokens = 8"):
        mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, None, 9)
    # Mixed input dtypes: the kernel is chosen by one input's dtype and the other is refused.
    with pytest.raises(mla_gen.ArgumentError, match="_output is (f16|bf16), the kernel takes (bf16|f16)"):
        mla_gen.merge_attn_states(out.half(), prefix.half(), plse, suffix, slse)
    with pytest.raises(ValueError, match=r"\[H=2, T=8\]"):
        mla_gen.merge_attn_states(out, prefix, plse.t().contiguous(), suffix, slse)
    with pytest.raises(ValueError, match="no generated merge_attn_states kernel"):
        o = torch.empty(T, H, 100, device="cuda", dtype=torch.bfloat16)
        mla_gen.merge_attn_states(o, o.clone(), plse, o.clone(), slse)
    with pytest.raises(mla_gen.ArgumentError, match="output overlaps prefix_output"):
        mla_gen.merge_attn_states(prefix, prefix, plse, suffix, slse)
    with pytest.raises(ValueError, match="has shape"):  # the head dim must be contiguous
        strided = torch.empty(T, H, D, 2, device="cuda", dtype=torch.bfloat16)[..., 0]
        mla_gen.merge_attn_states(out, strided, plse, suffix, slse)
    with pytest.raises(ValueError, match="on cpu"):
        mla_gen.merge_attn_states(out, prefix.cpu(), plse, suffix, slse)

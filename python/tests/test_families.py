"""K-way merge (merge_states) and in-place merge (merge_state_in_place) through the drop-in,
against a float64 torch reference. Runs on the kernel folder's kernels of those families (the
default's, or $MLA_GEN_KERNELS's: scripts/gpu-check.sh points it at tests/gpu-extra.toml's);
skipped where the folder has none, and without a GPU."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import mla_gen  # noqa: E402

# Head sizes per family in the folder: the default has 128 but not the extra folder's 3.
HEADS: dict = {}
for _k in mla_gen.manifest.load()["kernels"]:
    HEADS.setdefault(mla_gen.manifest.family_of(_k)[0], set()).add(_k["variant"].get("head_size"))
FAMILIES = set(HEADS)
if not {"merge_states", "merge_state_in_place"} <= FAMILIES:
    pytest.skip("no merge_states / merge_state_in_place kernels in this kernel folder (set MLA_GEN_KERNELS)",
                allow_module_level=True)



def need(family, D):
    if D not in HEADS.get(family, ()):
        pytest.skip(f"no {family} kernel of head size {D} in this kernel folder (tests/gpu-extra.toml has "
                    "it: set MLA_GEN_KERNELS)")


TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
INF = math.inf


def specials(lse, g):
    """~10% +inf, ~10% -inf in place."""
    u = torch.rand(lse.shape, generator=g, device=lse.device)
    lse[u < 0.1] = INF
    lse[(u >= 0.1) & (u < 0.2)] = -INF
    return lse


def reference_states(v, s):
    """float64 K-way merge over dim 1: +inf read as -inf; no keys -> state 0, lse -inf."""
    s = torch.where(s == INF, -INF, s).double()
    m = s.max(dim=1).values  # [T, H]
    empty = m == -INF
    m0 = torch.where(empty, torch.zeros_like(m), m)
    w = torch.exp(s - m0[:, None, :])  # [T, K, H]
    total = w.sum(dim=1)
    out = (v.double() * (w / total[:, None, :])[..., None]).sum(dim=1)
    out = torch.where(empty[..., None], v[:, 0].double(), out)
    lse = torch.where(empty, torch.full_like(m, -INF), torch.log(total) + m0)
    return out, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("K", [2, 4, 8, 16, 1, 3, 5])  # 1, 3, 5: the runtime-K kernel
@pytest.mark.parametrize("T,H,D", [(1, 1, 128), (613, 4, 128), (7, 3, 3)])
def test_merge_states_matches_the_reference(dtype, K, T, H, D):
    need("merge_states", D)
    g = torch.Generator(device="cuda").manual_seed(K * 1000 + T + H)
    # A padded layout: each state row inside a wider buffer.
    base = torch.empty(T, K, H, D + 8 * (D % 8 == 0), device="cuda", dtype=dtype).uniform_(-4, 4, generator=g)
    v = base[..., :D]
    s = specials(torch.empty(T, K, H, device="cuda").uniform_(-15, 15, generator=g), g)
    s[::5, :, 0] = -INF  # rows with no keys anywhere
    out, lse = mla_gen.merge_states(v, s)
    torch.cuda.synchronize()
    want, want_lse = reference_states(v, s)
    assert torch.allclose(out.double(), want, rtol=TOL[dtype], atol=TOL[dtype] * 4), \
        (out.double() - want).abs().max()
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    finite = torch.isfinite(want_lse)
    assert torch.allclose(lse.double()[finite], want_lse[finite], atol=1e-5)


def test_merge_states_propagates_nan_and_writes_given_outputs():
    T, K, H, D = 4, 3, 2, 128
    v = torch.randn(T, K, H, D, device="cuda")
    s = torch.zeros(T, K, H, device="cuda")
    s[0, 2, 1] = math.nan
    s[1, :, :] = -INF
    s[1, 1, 0] = math.nan  # NaN after -inf states: still NaN
    out = torch.full((T, H, D), 7.0, device="cuda")
    out_lse = torch.full((T, H), 7.0, device="cuda")
    got, got_lse = mla_gen.merge_states(v, s, out, out_lse)
    torch.cuda.synchronize()
    assert got is out and got_lse is out_lse
    assert out[0, 1].isnan().all() and out_lse[0, 1].isnan()
    assert out[1, 0].isnan().all() and out_lse[1, 0].isnan()
    assert torch.equal(out[1, 1], v[1, 0, 1]) and out_lse[1, 1] == -INF
    assert not out[2:].isnan().any()


def reference_pair(a, sa, b, sb):
    p = torch.where(sa == INF, -INF, sa).double()
    q = torch.where(sb == INF, -INF, sb).double()
    m = torch.maximum(p, q)
    empty = m == -INF
    m0 = torch.where(empty, torch.zeros_like(m), m)
    x, y = torch.exp(p - m0), torch.exp(q - m0)
    out = a.double() * (x / (x + y))[..., None] + b.double() * (y / (x + y))[..., None]
    out = torch.where(empty[..., None], a.double(), out)
    return out, torch.where(empty, torch.full_like(m, -INF), torch.log(x + y) + m0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["token_major", "head_major"])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("T,H,D", [(1, 1, 128), (613, 16, 128), (9, 5, 3)])
def test_merge_state_in_place_matches_the_reference(dtype, layout, masked, T, H, D):
    need("merge_state_in_place", D)
    g = torch.Generator(device="cuda").manual_seed(T * 31 + H + masked)
    v = torch.empty(T, H, D, device="cuda", dtype=dtype).uniform_(-4, 4, generator=g)
    w = torch.empty(T, H, D, device="cuda", dtype=dtype).uniform_(-4, 4, generator=g)
    s = specials(torch.empty(T, H, device="cuda").uniform_(-15, 15, generator=g), g)
    t = specials(torch.empty(T, H, device="cuda").uniform_(-15, 15, generator=g), g)
    mask = (torch.rand(T, generator=g, device="cuda") > 0.3) if masked else None
    v0, s0 = v.clone(), s.clone()
    want, want_lse = reference_pair(v0, s0, w, t)
    if masked:
        want = torch.where(mask[:, None, None], want, v0.double())
        want_lse = torch.where(mask[:, None], want_lse, s0.double())
    s_arg, t_arg = (s, t) if layout == "token_major" else (s.t().contiguous(), t.t().contiguous())
    mla_gen.merge_state_in_place(v, s_arg, w, t_arg, mask, lse_layout=layout)
    torch.cuda.synchronize()
    got_lse = s_arg if layout == "token_major" else s_arg.t()
    assert torch.allclose(v.double(), want, rtol=TOL[dtype], atol=TOL[dtype] * 4), (v.double() - want).abs().max()
    if masked:  # untouched tokens keep their exact bits
        assert torch.equal(v[~mask], v0[~mask]) and torch.equal(got_lse[~mask], s0[~mask])
    assert torch.equal(torch.isinf(got_lse), torch.isinf(want_lse))
    finite = torch.isfinite(want_lse)
    assert torch.allclose(got_lse.double()[finite], want_lse[finite], atol=1e-5)


def test_bad_calls_raise_clear_errors():
    v = torch.zeros(4, 3, 2, 128, device="cuda")
    s = torch.zeros(4, 3, 2, device="cuda")
    with pytest.raises(ValueError, match="has shape"):  # the lse of 2 states inside a 3-state buffer
        mla_gen.merge_states(v, s[:, :2])
    with pytest.raises(mla_gen.ArgumentError, match="states_lse is f16, the kernel takes f32"):
        mla_gen.merge_states(v, s.half())
    with pytest.raises(ValueError, match="overlaps"):
        mla_gen.merge_states(v, s, output=v[:, 0])
    with pytest.raises(ValueError, match="no generated merge_states kernel"):
        mla_gen.merge_states(torch.zeros(4, 3, 2, 100, device="cuda"), s)  # no folder has D = 100
    a = torch.zeros(4, 2, 128, device="cuda")
    la = torch.zeros(4, 2, device="cuda")
    with pytest.raises(ValueError, match="overlaps"):
        mla_gen.merge_state_in_place(a, la, a, la)
    with pytest.raises(mla_gen.ArgumentError, match="mask is f32, the kernel takes u8"):
        mla_gen.merge_state_in_place(a, la, a.clone(), la.clone(), torch.zeros(4, device="cuda"))
    with pytest.raises(ValueError, match="lse_layout"):
        mla_gen.merge_state_in_place(a, la, a.clone(), la.clone(), lse_layout="rows")


@pytest.mark.parametrize("layout", ["head_major", "token_major"])
@pytest.mark.parametrize("T,H,B", [(1, 1, 1), (613, 16, 7), (4096, 8, 300)])
def test_mask_empty_context_lse(layout, T, H, B):
    g = torch.Generator(device="cpu").manual_seed(T + B)
    covered = T - T // 10
    cuts = torch.sort(torch.randint(0, covered + 1, (B - 1,), generator=g)).values
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), cuts, torch.tensor([covered])]).int()
    ctx = torch.where(torch.rand(B, generator=g) < 0.4, 0, torch.randint(1, 50, (B,), generator=g))
    csl = torch.cat([torch.zeros(1, dtype=torch.int64), ctx.cumsum(0)]).int()
    lse = torch.randn(H, T) if layout == "head_major" else torch.randn(T, H)
    want = lse.clone()
    for b in range(B):
        if csl[b + 1] == csl[b]:
            tokens = slice(int(qsl[b]), int(qsl[b + 1]))
            if layout == "head_major":
                want[:, tokens] = -INF
            else:
                want[tokens] = -INF
    got = lse.cuda()
    mla_gen.mask_empty_context_lse(got, qsl.cuda(), csl.cuda(), lse_layout=layout)
    assert torch.equal(got.cpu(), want)

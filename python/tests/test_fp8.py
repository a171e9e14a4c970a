"""FP8 e4m3 output with a per-tensor scale, against a float64 reference. Runs on the kernel
folder's FP8 kernels (the default's, or $MLA_GEN_KERNELS's: scripts/gpu-check.sh points it at the
extra kernels of tests/gpu-extra.toml); skipped where the folder has none, and without a GPU."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import mla_gen  # noqa: E402

FP8 = torch.float8_e4m3fn
HEAD = 128
if not any(k["variant"]["output"] == "fp8_e4m3" and k["variant"]["head_size"] == HEAD
           and k["variant"]["lse_layout"] == "head_major" for k in mla_gen.manifest.load()["kernels"]):
    pytest.skip("no FP8 kernels at head size 128 in this kernel folder (set MLA_GEN_KERNELS)",
                allow_module_level=True)


def e4m3(x):
    """float32 -> e4m3 codes as the kernels write them: saturate to +-448, nearest even, NaN 0x7f."""
    codes = x.clamp(-448.0, 448.0).to(FP8).view(torch.uint8)
    return torch.where(x.isnan(), torch.full_like(codes, 0x7F), codes)


def ordered(codes):
    """e4m3 codes on a line where neighbouring values are neighbouring integers (-0 == +0)."""
    c = codes.to(torch.int32)
    return torch.where(c >= 128, -(c - 128), c)


def inputs(T, H, dtype, seed):
    """Rows in [-40, 40) (past +-448 after a small scale) and lse with +inf and -inf columns."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    prefix = torch.empty(T, H, HEAD, device="cuda", dtype=dtype).uniform_(-40, 40, generator=g)
    suffix = torch.empty(T, H, HEAD, device="cuda", dtype=dtype).uniform_(-40, 40, generator=g)
    plse = torch.empty(H, T, device="cuda").uniform_(-10, 10, generator=g)
    slse = torch.empty(H, T, device="cuda").uniform_(-10, 10, generator=g)
    plse[:, ::5] = math.inf
    slse[:, ::7] = -math.inf
    return prefix, suffix, plse, slse


def reciprocal(scale):
    """1 / scale rounded to float32, as the kernels take it once per tensor or group: a division
    of float32 tensors on the CPU (IEEE), not torch.reciprocal on the GPU."""
    s = scale.detach().float().cpu()
    return (torch.ones_like(s) / s).to(scale.device)


def reference(prefix, suffix, plse, slse, n):
    """float64: each element's value and whether it is a copy (past the threshold, or no keys
    on either side), by docs/SEMANTICS.md."""
    T = prefix.shape[0]
    p = torch.where(plse == math.inf, -math.inf, plse).double().t()
    q = torch.where(slse == math.inf, -math.inf, slse).double().t()
    m = torch.maximum(p, q)
    empty = m == -math.inf
    m0 = torch.where(empty, torch.zeros_like(m), m)
    a, b = torch.exp(p - m0), torch.exp(q - m0)
    blend = prefix.double() * (a / (a + b))[..., None] + suffix.double() * (b / (a + b))[..., None]
    ctx = (torch.arange(T, device="cuda") < n)[:, None, None]
    is_copy = (~ctx) | empty[..., None]
    copy_src = torch.where(ctx & empty[..., None], prefix.float(), suffix.float())
    return torch.where(is_copy, copy_src.double(), blend), copy_src, is_copy


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,H", [(1, 1), (7, 4), (613, 16)])
@pytest.mark.parametrize("scale", [0.05, 1.0, 3.7])
def test_fp8_output_matches_the_reference(dtype, T, H, scale):
    prefix, suffix, plse, slse = inputs(T, H, dtype, T * 7 + H)
    n = T // 2
    out = torch.empty(T, H, HEAD, device="cuda", dtype=FP8)
    out.view(torch.uint8).fill_(0xFF)  # poison: the kernel never writes 0xff
    s = torch.tensor([scale], device="cuda")
    mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, None, n, output_scale=s)
    torch.cuda.synchronize()
    got = out.view(torch.uint8)
    assert not (got == 0xFF).any(), "an element was never written"

    value, copy_src, is_copy = reference(prefix, suffix, plse, slse, n)
    # Copies: the exact conversion of input * RN(1 / scale) in float32 (docs/SEMANTICS.md). Merges:
    # within one e4m3 step of the float64 value / scale.
    copy_codes = e4m3(copy_src * reciprocal(s))
    merged_codes = e4m3((value / scale).float())  # used where value is the blend
    exact = torch.where(is_copy, copy_codes, merged_codes)
    dist = (ordered(got) - ordered(exact)).abs()
    assert (dist[is_copy.expand_as(dist)] == 0).all(), "a copied row is not the exact conversion"
    assert (dist <= 1).all(), f"max distance {dist.max().item()} e4m3 steps"


def test_fp8_needs_an_fp8_output_and_a_float32_scale():
    x = torch.zeros(4, 2, HEAD, device="cuda", dtype=torch.bfloat16).uniform_()
    lse = torch.zeros(2, 4, device="cuda")
    out = torch.empty(4, 2, HEAD, device="cuda", dtype=FP8)
    with pytest.raises(mla_gen.ArgumentError, match="output is bf16, the kernel takes fp8_e4m3"):
        mla_gen.merge_attn_states(x.clone(), x, lse, x.clone(), lse, output_scale=torch.ones(1, device="cuda"))
    with pytest.raises(mla_gen.ArgumentError, match="output_scale is f16, the kernel takes f32"):
        mla_gen.merge_attn_states(out, x, lse, x.clone(), lse, output_scale=torch.ones(1, device="cuda").half())
    with pytest.raises(mla_gen.ArgumentError, match="output is fp8_e4m3, the kernel takes bf16"):
        mla_gen.merge_attn_states(out, x, lse, x.clone(), lse)


# ---- per-token-group FP8 (output = "fp8_e4m3_group") ----


def group_scale(absmax, ue8m0):
    """The reference scale in float32: max(absmax, 1e-10) x RN(1/448) (vLLM's rule,
    docs/SEMANTICS.md), UE8M0 rounding by its bits."""
    s = torch.clamp(absmax.float(), min=1e-10) * torch.tensor(1.0, dtype=torch.float32).div(448.0)
    if ue8m0:  # 2^ceil(log2f(s)): a scale whose log2 rounds to an integer k keeps 2^k, as vLLM's
        bits = s.view(torch.int32)
        log2 = torch.log2(s.double()).float()
        up = torch.where((bits & 0x7FFFFF) != 0, (bits & ~0x7FFFFF) + 0x800000, bits)
        up = torch.where(log2 == log2.trunc(), bits & ~0x7FFFFF, up)
        s = up.view(torch.float32)
    return s


GROUPS = {k["variant"]["fp8_group"]["group_size"] for k in mla_gen.manifest.load()["kernels"]
          if k["variant"].get("fp8_group")}
HAS_GROUP = bool(GROUPS)


@pytest.mark.skipif(not HAS_GROUP, reason="no per-token-group FP8 kernels in this kernel folder")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("G", [16, 128])
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("layout", ["row", "padded", "column"])
@pytest.mark.parametrize("n_frac", [0.0, 0.5])
def test_group_fp8_scales_and_codes(dtype, G, ue8m0, layout, n_frac):
    if G not in GROUPS:
        pytest.skip(f"no group-FP8 kernels in groups of {G} in this kernel folder (it has {sorted(GROUPS)})")
    T, H = 613, 4
    prefix, suffix, plse, slse = inputs(T, H, dtype, G + T)
    n = int(T * n_frac)
    groups = H * HEAD // G
    if layout == "row":
        scales = torch.full((T, groups), math.nan, device="cuda")
    elif layout == "padded":
        scales = torch.full((T, groups + 3), math.nan, device="cuda")[:, :groups]
    else:
        scales = torch.full((groups, T), math.nan, device="cuda").t()
    out = torch.empty(T, H, HEAD, device="cuda", dtype=FP8)
    out.view(torch.uint8).fill_(0xFF)
    mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, None, n, output_group_scales=scales, ue8m0=ue8m0)
    torch.cuda.synchronize()
    got = out.view(torch.uint8)
    assert not (got == 0xFF).any(), "an element was never written"
    assert not scales.isnan().any(), "a group scale was never written"

    value, _, is_copy = reference(prefix, suffix, plse, slse, n)
    absmax = value.abs().reshape(T, groups, G).amax(dim=2)
    want = group_scale(absmax, ue8m0)
    copy_group = is_copy.expand(T, H, HEAD).reshape(T, groups, G).all(dim=2)
    # Copied rows: float32 values known exactly, so the scale is bit-exact. Blends: a few ulps.
    assert torch.equal(scales[copy_group], want[copy_group]), "a copied group's scale differs"
    lo, hi = group_scale(absmax * (1 - 1e-5), ue8m0), group_scale(absmax * (1 + 1e-5), ue8m0)
    assert ((scales >= lo) & (scales <= hi)).all(), "a merged group's scale is off"
    per_elem = scales.repeat_interleave(G, dim=1).reshape(T, H, HEAD)
    # Copies: input * RN(1 / scale) in float32, exactly; merges: within one step of value / scale.
    copied = e4m3(value.float() * reciprocal(per_elem))
    exact = torch.where(is_copy, copied, e4m3((value / per_elem.double()).float()))
    dist = (ordered(got) - ordered(exact)).abs()
    assert (dist[is_copy.expand_as(dist)] == 0).all(), "a copied element is not the exact conversion"
    assert (dist <= 1).all(), f"max distance {dist.max().item()} e4m3 steps"


@pytest.mark.skipif(not HAS_GROUP, reason="no per-token-group FP8 kernels in this kernel folder")
def test_group_fp8_bad_calls():
    x = torch.zeros(4, 2, HEAD, device="cuda", dtype=torch.bfloat16).uniform_()
    lse = torch.zeros(2, 4, device="cuda")
    out = torch.empty(4, 2, HEAD, device="cuda", dtype=FP8)
    sc = torch.empty(4, 2 * HEAD // 16, device="cuda")
    with pytest.raises(ValueError, match="not both"):
        mla_gen.merge_attn_states(out, x, lse, x.clone(), lse, output_scale=torch.ones(1, device="cuda"),
                                  output_group_scales=sc)
    with pytest.raises(ValueError, match=r"\[T, H \* D / G\]"):
        mla_gen.merge_attn_states(out, x, lse, x.clone(), lse, output_group_scales=torch.empty(4, 7, device="cuda"))
    # One group per token: G = D * H = 256 where no kernel has it, or (the G = D kernel's group
    # count num_heads * 1 read as num_heads, which the scales then dispute: selection leaves it to
    # that kernel's check, docs/MANIFEST.md "Selection") its check naming output_scales.
    with pytest.raises(ValueError, match="no generated merge_attn_states kernel|output_scales: "):
        mla_gen.merge_attn_states(out, x, lse, x.clone(), lse, output_group_scales=torch.empty(4, 1, device="cuda"))
    # Scales that alias (every token's row at one address), in a group size a kernel has: one it
    # lacks is refused before its check could run (the wheel's default has G = 128, not 16).
    w = 2 * HEAD // (128 if 128 in GROUPS else min(GROUPS))
    with pytest.raises(mla_gen.ArgumentError, match="maps two elements to one address"):
        mla_gen.merge_attn_states(out, x, lse, x.clone(), lse,
                                  output_group_scales=torch.empty(1, w, device="cuda").expand(4, w))

"""mla_gen.flashinfer.merge_states on a GPU against FlashInfer's rule in float64 (lse in base 2;
a row with no keys in any state: zeros, lse -inf; one state: that state as it is). K = 1 needs no
kernel and runs with any kernel folder; K > 1 runs where the folder has base-2 merge_states
kernels (lse_base = "2", e.g. $MLA_GEN_KERNELS from tests/gpu-extra.toml), skipped otherwise.
FlashInfer's own kernels are compared in bench/flashinfer_check.py."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import mla_gen  # noqa: E402
from mla_gen import flashinfer  # noqa: E402

INF = math.inf
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def states(T, K, H, D, dtype, seed):
    """v [T, K, H, D] in a padded buffer, s [T, K, H] base-2 lse with every fifth token empty in
    every state and ~10% of the other lse -inf."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    v = torch.empty(T, K, H, D + 8, device="cuda", dtype=dtype).uniform_(-4, 4, generator=g)[..., :D]
    s = torch.empty(T, K, H, device="cuda").uniform_(-20, 20, generator=g)
    s[torch.rand(s.shape, generator=g, device="cuda") < 0.1] = -INF
    s[::5] = -INF
    return v, s


def reference(v, s):
    """FlashInfer's merge in float64: weights 2^(s - max), no keys anywhere -> zeros, lse -inf."""
    s = s.double()
    m = s.max(dim=1).values
    empty = m == -INF
    m0 = torch.where(empty, torch.zeros_like(m), m)
    w = torch.exp2(s - m0[:, None, :])
    total = w.sum(dim=1)
    out = (v.double() * (w / torch.where(empty, 1.0, total)[:, None, :])[:, :, :, None]).sum(dim=1)
    out = torch.where(empty[..., None], torch.zeros_like(out), out)
    lse = torch.where(empty, torch.full_like(m, -INF), torch.log2(total) + m0)
    return out, lse


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,H,D", [(1, 1, 64), (613, 16, 128), (2048, 8, 256)])
def test_one_state_is_returned_as_it_is(dtype, T, H, D):
    v, s = states(T, 1, H, D, dtype, T + D)
    s[1::7, 0, 0] = INF  # given back as given, like NaN: nothing is merged
    s[2::7, 0, 0] = math.nan
    out, lse = flashinfer.merge_states(v, s)
    torch.cuda.synchronize()
    empty = s[:, 0] == -INF  # the rows states() left without keys, less those set to +inf or NaN above
    want = v[:, 0].contiguous()
    if T == 1:  # states >= tokens: FlashInfer's other kernel, which merges (no keys: zeros)
        want = want.masked_fill(empty[..., None], 0)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16)), "rows bit for bit"
    assert torch.equal(lse.view(torch.int32), s[:, 0].contiguous().view(torch.int32)), "lse bit for bit"
    assert empty.any() and (T == 1 or out[empty].abs().sum() > 0), "empty rows keep their row, not zeros"


HAS_BASE2_STATES = any(mla_gen.manifest.family_of(k)[0] == "merge_states" and k["variant"].get("lse_base") == "2"
                       for k in mla_gen.manifest.load()["kernels"])


def served(dtype, D, K) -> bool:
    """A base-2 merge_states kernel with an output lse for K states: compile-time K or runtime."""
    kf = mla_gen.manifest.folder()
    for k in (K, None):
        args, _ = mla_gen.manifest.call("merge_states", dtype, D, num_states=k, output_lse=True)
        hit = mla_gen.manifest.select(kf, "merge_states", args, {"lse_base": "2"})
        if hit is not None and hit[1]:
            return True
    return False


@pytest.mark.skipif(not HAS_BASE2_STATES, reason="no base-2 merge_states kernels in this kernel folder "
                                                 "(set MLA_GEN_KERNELS)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("K", [2, 3, 5, 9, 16])
@pytest.mark.parametrize("T,H,D", [(1, 1, 128), (613, 16, 128), (256, 8, 64)])
def test_many_states_match_the_float64_rule(dtype, K, T, H, D):
    if not served(dtype, D, K):
        pytest.skip(f"no base-2 merge_states kernel for {dtype} d{D} with {K} states in this kernel folder")
    v, s = states(T, K, H, D, dtype, K * 100 + T)
    out, lse = flashinfer.merge_states(v, s)
    torch.cuda.synchronize()
    want, want_lse = reference(v, s)
    assert torch.allclose(out.double(), want, rtol=TOL[dtype], atol=TOL[dtype] * 4), (out.double() - want).abs().max()
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse)) and (out[::5] == 0).all()
    finite = torch.isfinite(want_lse)
    assert torch.allclose(lse.double()[finite], want_lse[finite], atol=1e-5)

"""The call table of test_coverage_cpu.py launched on a GPU: every row through its public API
against a float64 torch reference (docs/SEMANTICS.md), on the shipped kernel folder (the
installed package's kernels, else a checkout's generated/ with its images built; or
$MLA_GEN_KERNELS where it holds the same kernels, e.g. generated for one arch). Small shapes (8
tokens, 4 heads; token 0 without keys on either side; three requests for the fused mask), ~3,300
launches.

Run on the GPU machine: ``python -m pytest -q -rs python/tests/test_coverage_gpu.py`` (pass: 10
passed, one per API, none skipped). Without a CUDA GPU the module is skipped with its reason."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU: the coverage table's launches need one (test_coverage_cpu.py checks the selection)",
                allow_module_level=True)

from mla_gen import manifest  # noqa: E402
from test_coverage_cpu import APIS, CONTEXT_START, N, QUERY_START, ROWS, T, make_call  # noqa: E402

INF = math.inf
# Blends, relative to the magnitudes (docs/SEMANTICS.md: a few float32 ulps in the weights, then
# the output type's rounding).
TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}


@pytest.fixture(autouse=True)
def shipped(monkeypatch):
    """The shipped folder; or $MLA_GEN_KERNELS where it holds exactly the shipped kernels (a
    generation of the default spec for fewer archs, `mla-gen generate --arch sm_90 --out DIR`,
    is a folder small enough to carry to a GPU machine)."""
    given = manifest.env_value()
    monkeypatch.delenv(manifest.ENV, raising=False)
    if given is not None:
        default = [k["name"] for k in manifest.load()["kernels"]]
        monkeypatch.setenv(manifest.ENV, given.decode() if isinstance(given, bytes) else given)
        assert [k["name"] for k in manifest.load()["kernels"]] == default, \
            f"{manifest.folder().label} holds other kernels than the default spec's: unset MLA_GEN_KERNELS"


def _token_major(lse, layout):
    return lse.t() if layout == "head_major" else lse


def _empty_context_tokens(device):
    """Tokens of the requests without context (QUERY_START, CONTEXT_START)."""
    empty = torch.zeros(T, dtype=torch.bool, device=device)
    for b in range(len(QUERY_START) - 1):
        if CONTEXT_START[b + 1] == CONTEXT_START[b]:
            empty[QUERY_START[b]:QUERY_START[b + 1]] = True
    return empty


def merge(a, la, b, lb, base_two=False):
    """float64 pairwise merge of [T, H, D] rows with token-major lse: +inf reads as -inf; a row
    without keys on either side is `a` (base e) or zeros (base 2, FlashInfer's), lse -inf."""
    la = torch.where(la == INF, -INF, la.double())
    lb = torch.where(lb == INF, -INF, lb.double())
    m = torch.maximum(la, lb)
    empty = m == -INF
    m0 = torch.where(empty, torch.zeros_like(m), m)
    exp, log = (torch.exp2, torch.log2) if base_two else (torch.exp, torch.log)
    wa, wb = exp(la - m0), exp(lb - m0)
    total = wa + wb
    out = (a.double() * (wa / total)[..., None] + b.double() * (wb / total)[..., None])
    out = torch.where(empty[..., None], torch.zeros_like(out) if base_two else a.double(), out)
    return out, torch.where(empty, torch.full_like(m, -INF), log(total) + m0)


def merge_k(v, s, base_two=False):
    """float64 K-way merge over dim 1 of [T, K, H, D] with lse [T, K, H]."""
    s = torch.where(s == INF, -INF, s.double())
    m = s.max(dim=1).values
    empty = m == -INF
    m0 = torch.where(empty, torch.zeros_like(m), m)
    exp, log = (torch.exp2, torch.log2) if base_two else (torch.exp, torch.log)
    w = exp(s - m0[:, None, :])
    total = w.sum(dim=1)
    out = (v.double() * (w / total[:, None, :])[..., None]).sum(dim=1)
    out = torch.where(empty[..., None], torch.zeros_like(out) if base_two else v[:, 0].double(), out)
    return out, torch.where(empty, torch.full_like(m, -INF), log(total) + m0)


def close(got, want, tol):
    got = got.double()
    if not torch.equal(torch.isinf(got), torch.isinf(want)) or not torch.equal(torch.isnan(got), torch.isnan(want)):
        return "infinities or NaN differ"
    fin = torch.isfinite(want)
    err = (got[fin] - want[fin]).abs()
    bound = tol * 4 + tol * want[fin].abs()
    return None if bool((err <= bound).all()) else f"max error {err.max().item():.3g}"


def e4m3_step(q):
    """One e4m3 step at magnitude |q| (normals from 2^-6: 3 mantissa bits; subnormals 2^-9)."""
    normal = torch.exp2(torch.floor(torch.log2(q.abs().clamp(min=2.0 ** -6))) - 3)
    return torch.where(q.abs() >= 2.0 ** -6, normal, torch.full_like(q, 2.0 ** -9))


def fp8_close(codes, want_values, scale):
    """Codes within one e4m3 step of the reference value / scale, saturated at 448."""
    q = (want_values / scale).clamp(-448, 448)
    err = (codes.double() - q).abs()
    return None if bool((err <= e4m3_step(q) * 1.0001).all()) else f"FP8 max error {err.max().item():.3g} codes"


def check_vllm(row, x):
    """The merge_attn_states reference, threshold, fused mask and FP8 outputs included."""
    layout = row.lse_layout
    pl, sl = _token_major(x["prefix_lse"], layout), _token_major(x["suffix_lse"], layout)
    if row.ctxmask:
        pl = pl.masked_fill(_empty_context_tokens(pl.device)[:, None], -INF)
    want, want_lse = merge(x["prefix"], pl, x["suffix"], sl)
    n = N if row.threshold else T
    want[n:], want_lse[n:] = x["suffix"][n:].double(), sl[n:].double()
    problems = []
    if row.output == "same":
        problems.append(close(x["output"], want, TOL[row.dtype]))
    elif row.output == "fp8":
        problems.append(fp8_close(x["output"].double(), want, x["output_scale"].double()))
    else:
        g = row.group_size
        groups = want.reshape(T, -1, g)  # [T, H * D / G, G]
        scale = groups.abs().amax(-1).clamp(min=1e-10) / 448
        if row.ue8m0:
            scale = torch.exp2(torch.ceil(torch.log2(scale)))
        got_scale = x["output_scales"].double()
        ratio = got_scale / scale
        if row.ue8m0:
            ok = ((ratio == 1) | (ratio == 2) | (ratio == 0.5)).all()
        else:
            ok = ((ratio - 1).abs() <= 1e-4).all()
        problems.append(None if bool(ok) else "group scales differ")
        problems.append(fp8_close(x["output"].double().reshape(T, -1, g), groups, got_scale[..., None]))
    if row.output_lse:
        problems.append(close(_token_major(x["output_lse"], layout), want_lse, 1e-5))
    return [p for p in problems if p]


def check(row, x):
    """What is wrong with the row's results against float64 (an empty list: nothing)."""
    base_two = row.api.startswith("flashinfer")
    tol = TOL[row.dtype]
    if row.api == "mla_gen.mask_empty_context_lse":
        lse = _token_major(x["lse_before"], row.lse_layout)
        want = lse.masked_fill(_empty_context_tokens(lse.device)[:, None], -INF)
        got = _token_major(x["lse"], row.lse_layout)
        return [] if torch.equal(got, want) else ["lse differs"]
    if row.num_states:
        out, lse = x["result"]
        if base_two and row.num_states == 1:  # FlashInfer's: the state as it is
            want, want_lse = x["v"][:, 0].double(), x["s"][:, 0].double()
        else:
            want, want_lse = merge_k(x["v"], x["s"], base_two)
        return [p for p in (close(out, want, tol), close(lse, want_lse, 1e-5)) if p]
    if row.api.endswith("merge_state_in_place"):
        layout = row.lse_layout
        want, want_lse = merge(x["v_before"], _token_major(x["s_before"], layout), x["v_other"],
                               _token_major(x["s_other"], layout), base_two)
        if row.mask:
            keep = ~x["mask"]
            want[keep] = x["v_before"][keep].double()
            want_lse[keep] = _token_major(x["s_before"], layout)[keep].double()
        return [p for p in (close(x["v"], want, tol), close(_token_major(x["s"], layout), want_lse, 1e-5)) if p]
    if row.api in ("sglang.merge_state_v2", "flashinfer.merge_state"):
        out, lse = x["result"]
        want, want_lse = merge(x["prefix"], x["prefix_lse"], x["suffix"], x["suffix_lse"], base_two)
        return [p for p in (close(out, want, tol), close(lse, want_lse, 1e-5)) if p]
    return check_vllm(row, x)


@pytest.mark.parametrize("api", APIS)
def test_every_row_matches_the_float64_reference(api):
    failures = []
    rows = [r for r in ROWS if r.api == api]
    for seed, row in enumerate(rows):
        try:
            x = make_call(row, torch.device("cuda"), seed)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - every row's failure is reported, not just the first
            failures.append(f"{row}: {type(e).__name__}: {e}")
            continue
        problems = check(row, x)
        if problems:
            failures.append(f"{row}: {'; '.join(problems)}")
    assert not failures, f"{len(failures)} of {len(rows)} rows:\n" + "\n".join(failures[:40])

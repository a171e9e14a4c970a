"""The empty-context mask fused into the merge (``query_start_loc``/``context_start_loc``), on the
GPU: every `_ctxmask` kernel of the kernel folder against the two launches it replaces,
``mask_empty_context_lse`` on a copy of prefix_lse then the plain merge of the same dtype, head
size and options, bit for bit (docs/SEMANTICS.md, "The empty-context mask fused into the merge"),
and a few cases against the float64 reference.

Runs on the kernel folder's `_ctxmask` kernels (the default's, or $MLA_GEN_KERNELS's:
python/gpu_checks.sh points it at .device/ctxmask, generated from tests/gpu-ctxmask.toml);
skipped where the folder has none, and without a GPU.
The last test prints ``ctxmask: N cases passed, M failed``."""

import math
import random

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import mla_gen  # noqa: E402
from mla_gen import manifest  # noqa: E402

KERNELS = [k for k in manifest.load()["kernels"] if manifest.family_of(k)[0] == "merge_attn_states"]
# The kernels a call selects; a specialization (the _dense twin) runs through its kernel, on the
# dense layouts of run_case (two cases in three).
FUSED = [k for k in KERNELS if k["variant"].get("mask_empty_context") and k["name"] not in manifest.load()["_reached"]]
if not FUSED:
    pytest.skip("no _ctxmask kernels in this kernel folder (set MLA_GEN_KERNELS to the output of "
                "`mla-gen generate tests/gpu-ctxmask.toml --out DIR`)", allow_module_level=True)

from test_merge import check, lse_check, reference  # noqa: E402  the float64 reference of test_merge.py

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
FP8 = torch.float8_e4m3fn
INF = math.inf
# Raw-bit views, and a NaN with a payload to fill outputs with before each run: one for the
# fused call, another for the pair, so that an element either leaves unwritten shows as a
# mismatch (e4m3 has one NaN per sign: 0x7f and 0xff).
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
POISON = {(1, 0): 0x7F, (1, 1): 0xFF, (2, 0): 0x7FA5, (2, 1): 0x7FB3, (4, 0): 0x7FC0A5A5, (4, 1): 0x7FC05A5A}

results = {"passed": 0, "failed": 0, "failures": []}


def bits(t):
    return t.view(BITS[t.element_size()])


def poison(t, which):
    if t is not None:
        bits(t).fill_(POISON[(t.element_size(), which)])
    return t


def plain_of(fused):
    """The kernel without the mask that the fused one must equal: the same variant otherwise (the
    schedule aside: the fused kernels default to smaller blocks, which change no result; and
    `flat_twins`, which says only that the plain kernel has `_flat` specializations)."""
    def rule(variant):
        return {k: v for k, v in variant.items()
                if k not in ("mask_empty_context", "schedule", "explicit_schedule", "size_rule", "flat_twins")}
    for k in KERNELS:  # (a size rule's kernels are reached through their kernel: rows_below differs)
        if not k["variant"].get("mask_empty_context") and rule(k["variant"]) == rule(fused["variant"]):
            return k
    return None


def requests(rng, T):
    """Ragged requests over T tokens: (query_start_loc, context_start_loc) as int32 lists, B + 1
    entries each. B = 1..20 in half the cases, else 33..3000 (the fused kernels search 32
    requests per round and walk 32 per step, so many requests, most of them empty when T is small,
    exercise both); token counts random (zeros included); some requests with an empty context
    (equal neighbouring context_start_loc), some not; sometimes tokens outside every request
    (before query_start_loc[0] or from query_start_loc[B] < T)."""
    pick = rng.random()
    B = rng.randint(1, 20) if pick < 0.5 else rng.randint(33, 300) if pick < 0.8 else rng.randint(300, 3000)
    shape = rng.random()
    lo = rng.randint(1, max(1, T // 5)) if shape < 0.15 and T > 1 else 0
    hi = T - rng.randint(1, max(1, T // 4)) if 0.15 <= shape < 0.4 and T > 1 else T
    hi = max(hi, lo)
    cuts = sorted(rng.randint(lo, hi) for _ in range(B - 1))
    qsl = [lo] + cuts + [hi]
    empty = [rng.random() < 0.4 for _ in range(B)]
    if B > 1 and len(set(empty)) == 1:
        empty[rng.randrange(B)] = not empty[0]
    csl = [rng.randint(0, 50)]
    for e in empty:
        csl.append(csl[-1] + (0 if e else rng.randint(1, 200)))
    return qsl, csl


def sprinkle(lse, g):
    """~8% +inf, ~8% -inf, ~4% NaN (quiet NaNs with payloads, both signs), in place."""
    u = torch.rand(lse.shape, generator=g, device=lse.device)
    lse[u < 0.08] = INF
    lse[(u >= 0.08) & (u < 0.16)] = -INF
    b = bits(lse)
    b[(u >= 0.16) & (u < 0.18)] = 0x7FC00123
    b[(u >= 0.18) & (u < 0.20)] = 0xFFC04567 - (1 << 32)
    return lse


def inputs(kern, T, H, seed, specials=True, pad=0):
    v = kern["variant"]
    dtype, D = DTYPES[v["dtype"]], v["head_size"]
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rows(extra):
        base = torch.empty(T, H, D + extra, device="cuda", dtype=dtype).uniform_(-4, 4, generator=g)
        return base[..., :D]

    prefix, suffix = rows(pad), rows(0)
    if specials:  # a few NaN elements in the rows: a copied row keeps them, a blended one propagates them
        for r in (prefix, suffix):
            r.view(-1, D)[torch.rand(T * H, generator=g, device="cuda") < 0.01, 3] = math.nan
    shape = (H, T) if v["lse_layout"] == "head_major" else (T, H)
    plse = torch.empty(shape, device="cuda").uniform_(-15, 15, generator=g)
    slse = torch.empty(shape, device="cuda").uniform_(-15, 15, generator=g)
    if specials:
        sprinkle(plse, g)
        sprinkle(slse, g)
        both = torch.rand(shape, generator=g, device="cuda") < 0.03
        plse[both] = -INF
        slse[both] = -INF
    return prefix, plse, suffix, slse


def outputs(kern, T, H, with_lse, which, scale):
    """Fresh outputs for one run, filled with that run's NaN payload: (output, output_lse, the
    call's other keyword arguments, {name: tensor} of what the kernel writes)."""
    v = kern["variant"]
    D = v["head_size"]
    shape = (H, T) if v["lse_layout"] == "head_major" else (T, H)
    out_lse = poison(torch.empty(shape, device="cuda"), which) if with_lse else None
    kw = {"lse_layout": v["lse_layout"]}
    out = poison(torch.empty(T, H, D, device="cuda", dtype=DTYPES[v["dtype"]] if v["output"] == "same" else FP8),
                 which)
    written = {"output": out}
    if with_lse:
        written["output_lse"] = out_lse
    if v["output"] == "fp8_e4m3":
        kw["output_scale"] = scale
    elif v["output"] == "fp8_e4m3_group":
        G = v["fp8_group"]["group_size"]
        written["output_group_scales"] = kw["output_group_scales"] = \
            poison(torch.empty(T, H * D // G, device="cuda"), which)
        kw["ue8m0"] = v["fp8_group"]["ue8m0"]
    return out, out_lse, kw, written


def same_bits(name, a, b):
    if not torch.equal(bits(a), bits(b)):
        diff = (bits(a) != bits(b)).nonzero()
        first = tuple(diff[0].tolist())
        mask = (1 << 8 * a.element_size()) - 1
        raise AssertionError(f"{name}: {diff.shape[0]} of {a.numel()} elements differ in their bits, first at "
                             f"{first}: fused {a[first].float().item()!r} ({bits(a)[first].item() & mask:#x}), "
                             f"pair {b[first].float().item()!r} ({bits(b)[first].item() & mask:#x})")


def run_case(kern, T, H, n, with_lse, seed, pad=0):
    """One case: the fused call against mask_empty_context_lse (or, in a folder without it, the same
    rule in torch ops) + the plain merge, bit for bit."""
    rng = random.Random(seed)
    qsl_l, csl_l = requests(rng, T)
    qsl = torch.tensor(qsl_l, dtype=torch.int32, device="cuda")
    csl = torch.tensor(csl_l, dtype=torch.int32, device="cuda")
    prefix, plse, suffix, slse = inputs(kern, T, H, seed, pad=pad)
    layout = kern["variant"]["lse_layout"]
    scale = torch.tensor([rng.choice((0.0625, 1.0, 3.7))], device="cuda")
    # (a) fused
    out_a, lse_a, kw_a, written_a = outputs(kern, T, H, with_lse, 0, scale)
    plse_bits = bits(plse).clone()
    mla_gen.merge_attn_states(out_a, prefix, plse, suffix, slse, lse_a, n, query_start_loc=qsl,
                              context_start_loc=csl, **kw_a)
    # (b) the pair: the mask on a copy of prefix_lse, then the plain merge
    out_b, lse_b, kw_b, written_b = outputs(kern, T, H, with_lse, 1, scale)
    masked = plse.clone()
    if mla_gen.supports(None, 0, family="mask_empty_context_lse", lse_layout=layout):
        mla_gen.mask_empty_context_lse(masked, qsl, csl, lse_layout=layout)
    else:  # a folder without the lse mask (the default has it): the same rule in torch ops, [H, T]
        from mla_gen.vllm import mask_empty_context
        head_major = layout == "head_major"
        masked = mask_empty_context(masked if head_major else masked.t(), qsl, csl)
        masked = masked if head_major else masked.t().contiguous()
    mla_gen.merge_attn_states(out_b, prefix, masked, suffix, slse, lse_b, n, **kw_b)
    torch.cuda.synchronize()
    label = f"{kern['name']} T={T} H={H} n={n} output_lse={with_lse} B={len(qsl_l) - 1} seed={seed}"
    try:
        for what, a in written_a.items():
            same_bits(f"{label}: {what}", a, written_b[what])
        if not torch.equal(bits(plse), plse_bits):
            raise AssertionError(f"{label}: the fused call wrote prefix_lse")
        assert qsl.tolist() == qsl_l and csl.tolist() == csl_l, f"{label}: the start locations changed"
    except AssertionError as e:
        results["failed"] += 1
        results["failures"].append(str(e))
        raise
    results["passed"] += 1


def selected(kern, mask, with_lse, n):
    """The kernel the package picks for a call of this kernel's kind."""
    v = kern["variant"]
    want = {"output": v["output"], "output_lse": with_lse, "threshold": n is not None, "lse_layout": v["lse_layout"],
            "mask_empty_context": mask}
    if v["output"] == "fp8_e4m3_group":
        want.update(group_size=v["fp8_group"]["group_size"], ue8m0=v["fp8_group"]["ue8m0"])
    hit = manifest.select(manifest.folder(), "merge_attn_states",
                          *manifest.call("merge_attn_states", v["dtype"], v["head_size"], **want))
    return hit and hit[1] and hit[0]["name"]


@pytest.mark.parametrize("kern", FUSED, ids=[k["name"] for k in FUSED])
def test_fused_equals_mask_then_merge(kern):
    plain = plain_of(kern)
    assert plain is not None, f"{kern['name']}: the folder has no plain kernel of its variant to compare with"
    assert mla_gen.supports(kern["variant"]["dtype"], kern["variant"]["head_size"], output_lse=True, threshold=True,
                            lse_layout=kern["variant"]["lse_layout"], mask_empty_context=True,
                            output=kern["variant"]["output"],
                            group_size=(kern["variant"].get("fp8_group") or {}).get("group_size"),
                            ue8m0=(kern["variant"].get("fp8_group") or {}).get("ue8m0", False))
    seed0 = sum(map(ord, kern["name"])) * 1000
    cases = 0
    for i, T in enumerate((1, 2, 37, 256, 613, 1029)):
        for H in (1, 5, 16) if T <= 613 else (3,):
            for n in (0, T // 3, T, None):
                for with_lse in (True, False):
                    seed = seed0 + cases
                    # The call's selection: the fused kernel with the start locations, its plain twin without.
                    assert selected(kern, True, with_lse, n) == kern["name"]
                    assert selected(kern, False, with_lse, n) == plain["name"]
                    run_case(kern, T, H, n, with_lse, seed, pad=8 * (seed % 3 == 0))
                    cases += 1
    assert cases > 0


@pytest.mark.parametrize("kern", [k for k in FUSED if k["variant"]["output"] == "same"], ids=lambda k: k["name"])
def test_fused_against_the_float64_reference(kern):
    """The fused result against docs/SEMANTICS.md in float64, prefix_lse masked in the reference."""
    v = kern["variant"]
    dtype = DTYPES[v["dtype"]]
    for T, H, n, seed in ((613, 16, 400, 1), (100, 3, None, 2), (1, 1, 1, 3)):
        rng = random.Random(seed)
        qsl, csl = requests(rng, T)
        prefix, plse, suffix, slse = inputs(kern, T, H, seed, specials=(seed != 2))
        head_major = v["lse_layout"] == "head_major"
        out = poison(torch.empty(T, H, v["head_size"], device="cuda", dtype=dtype), 0)
        out_lse = poison(torch.empty(plse.shape, device="cuda"), 0)
        mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, out_lse, n, lse_layout=v["lse_layout"],
                                  query_start_loc=torch.tensor(qsl, dtype=torch.int32, device="cuda"),
                                  context_start_loc=torch.tensor(csl, dtype=torch.int32, device="cuda"))
        torch.cuda.synchronize()
        pl, sl, ol = (x if head_major else x.t() for x in (plse, slse, out_lse))  # [H, T]
        masked = pl.clone()
        for b in range(len(qsl) - 1):
            if csl[b + 1] == csl[b]:
                masked[:, qsl[b]:qsl[b + 1]] = -INF
        try:
            ref, ref_lse, mag, copy = reference(prefix, masked, suffix, sl, T if n is None else n)
            check(out, ref, mag, copy, dtype)
            lse_check(ol, ref_lse)
        except AssertionError as e:
            results["failed"] += 1
            results["failures"].append(f"{kern['name']} T={T} H={H} n={n} (float64 reference): {e}")
            raise
        results["passed"] += 1


def test_zz_summary(capsys):
    """Prints the line the GPU run reports (after the tests above, in file order)."""
    total = results["passed"] + results["failed"]
    with capsys.disabled():
        print(f"\nctxmask: {results['passed']} cases passed, {results['failed']} failed "
              f"({len(FUSED)} fused kernels in {mla_gen.kernels_dir()})")
        for f in results["failures"][:10]:
            print("  " + f)
    if total == 0:
        pytest.skip("no case ran (run the whole file)")
    assert results["failed"] == 0

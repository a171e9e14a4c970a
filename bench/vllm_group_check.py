"""GPU check: vLLM's per-token-group FP8 merge routed to mla-gen by ``mla_gen.vllm.patch()``
against vLLM's own Triton kernel (``merge_attn_states_group_fp8_kernel``), issue #34.

vLLM's newest ``merge_attn_states`` (output_block_scale, quant_group_size, quant_scale_ue8m0) is
in no vLLM release on PyPI yet, so its Triton file comes from a vLLM checkout (--vllm; see
bench/gpu/vllm_group.sh) and its two vLLM imports are stubbed: ``current_platform.fp8_dtype()``
is torch.float8_e4m3fn and ``vllm.triton_utils`` is Triton. A stand-in dispatcher module holding
vLLM's ``merge_attn_states`` is patched with ``mla_gen.vllm.patch(strict=True)``; each case calls
it as vLLM's callers do and must be routed to mla-gen (a fallback would compare vLLM with
itself: a failure). The same inputs then go through vLLM's function itself.

Cases: f16/bf16 x D {128, 576} x group size {32, 64, 128} where it divides D x UE8M0 off/on x
scale layouts (row-major [T, H*D/G]; column-major, the transpose's storage; column-major with
the token dimension padded to the next multiple of 16 past T, bf16 only) x T tokens, 16 heads, threshold n =
T - 129; the inputs' heads padded by 16 elements outside row-major; the output lse given except
with the padded layout. Rows: magnitudes over 10^-3..10^2; ~4% without keys on either side (half
with a zero prefix row: the 1e-10 floor), ~4% +inf lse (FlashAttention-2's empty), ~6% one side
-inf, zero suffix rows and groups whose absmax is 448 * 2^k past the threshold.

Compared, per case:
  outputs   e4m3 codes within 1 step (codes' ordinal distance) where both scales are equal;
            where they differ, the finer side's value (code x scale) in the coarser side's units
            within one e4m3 step of the coarser side's code.
            Counted: elements 1 step apart, elements past the rule (failures).
  scales    bit for bit. Every mismatch is counted and classed. Exact rows (the merged row is
            one input exactly: copies past the threshold, rows without keys, one side empty):
            "reciprocal" when vLLM's scale is absmax * RN(1/448) and mla-gen's absmax / 448 (the
            IEEE quotient kernels before 2026-12-04 wrote; today both take vLLM's rule,
            docs/SEMANTICS.md); "other" otherwise, and a failure where mla-gen is off the rule.
            Blended rows: the float32 merges round differently, so the absmax may differ by
            ulps: counted with the largest distance (ulps, or x2 steps with UE8M0). Also counted
            over all exact groups: how often the two rules alone give different scales.
  lse       finite values within 1e-5 (absolute) + 1e-6 (relative); infinities equal.
  writes    no NaN code or scale left (outputs and scales start as NaN), the padded layout's
            padding untouched.

Exit status 1 on any failure: a fallback, an element past 1 step, a scale mismatch of any class
(unless --allow-scale-diffs says which classes only to report), an lse difference, a missing or
stray write, or a case not run within --cap seconds. The summary prints the verdict under each
--allow-scale-diffs choice, so one run answers all three. Table to stdout; with --out (or
$OUT), vllm_group.json with every case's counts and up to 8 mismatches each.

    PYTHONPATH=python python3 bench/vllm_group_check.py --vllm .device/vllm/triton_merge_attn_states.py \\
        [--kernels DIR] [--tokens T] [--layouts row,col,col-padded] [--cap S] [--out DIR]

--kernels: a folder built from bench/vllm-group.toml (default: $MLA_GEN_KERNELS, else the
installed package's kernels). About a minute on an H200, most of it Triton compiling.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEVICE = "cuda"  # a CPU dry run of the comparison sets "cpu"
CASE_FIELDS = ("dtype", "D", "G", "ue8m0", "layout")
ALLOW = {"none": set(), "blended": {"blended"}, "reciprocal+blended": {"blended", "reciprocal"}}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", required=True, help="vLLM's triton_merge_attn_states.py (with the group kernel)")
    ap.add_argument("--kernels", help="mla-gen kernel folder (sets MLA_GEN_KERNELS)")
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--layouts", default="row,col,col-padded")
    ap.add_argument("--cap", type=float, default=100.0, help="seconds after which no new case starts")
    ap.add_argument("--allow-scale-diffs", choices=list(ALLOW), default="none",
                    help="scale mismatch classes reported without failing (default: none, bit for bit)")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    return ap.parse_args()


def load_vllm(path):
    """vLLM's Triton module with its two vLLM imports stubbed."""
    import torch
    import triton
    import triton.language as tl

    if "def merge_attn_states_group_fp8_kernel" not in Path(path).read_text():
        sys.exit(f"{path} has no merge_attn_states_group_fp8_kernel: it is not vLLM's newest Triton file "
                 "(bench/gpu/vllm_group.sh says where to get it)")
    vllm = types.ModuleType("vllm")
    vllm.__path__ = []
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(fp8_dtype=lambda: torch.float8_e4m3fn)
    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.tl, triton_utils.triton = tl, triton
    sys.modules.update({"vllm": vllm, "vllm.platforms": platforms, "vllm.triton_utils": triton_utils})
    spec = importlib.util.spec_from_file_location("vllm_triton_merge_attn_states", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def cases(layouts):
    import torch

    for dtype in (torch.float16, torch.bfloat16):
        for D in (128, 576):
            for G in (32, 64, 128):
                if D % G:
                    continue
                for ue8m0 in (False, True):
                    for layout in layouts:
                        if layout != "col-padded" or dtype == torch.bfloat16:
                            yield dtype, D, G, ue8m0, layout


def make_inputs(dtype, D, G, layout, T, H, n, seed):
    """Inputs as vLLM's kernel addresses them (the suffix at the prefix's strides, token stride
    H * head stride) and, per row, whether the merged row is one input exactly and which."""
    import torch

    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    pad = 0 if layout == "row" else 16

    def rand(*shape):
        return torch.rand(*shape, generator=gen, device=DEVICE)

    def state():
        mag = torch.pow(10.0, rand(T, H, 1) * 5 - 3)
        return torch.randn(T, H, D + pad, generator=gen, device=DEVICE) * mag

    p, s = state(), state()
    pl, sl = rand(H, T) * 8 - 4, rand(H, T) * 8 - 4
    u = rand(H, T)
    empty = u < 0.04
    pl[empty] = sl[empty] = float("-inf")
    pl[(u >= 0.04) & (u < 0.06)] = float("inf")
    sl[(u >= 0.06) & (u < 0.08)] = float("inf")
    pl[(u >= 0.08) & (u < 0.11)] = float("-inf")
    sl[(u >= 0.11) & (u < 0.14)] = float("-inf")
    zero_prefix = (empty & (rand(H, T) < 0.5)).t()
    p[zero_prefix] = 0
    tail = torch.arange(T, device=DEVICE)[:, None] >= n
    v = rand(T, H)
    s[tail & (v < 0.05)] = 0
    # Rows whose every group's absmax is 448 * 2^k (its first element; the others below 0.9 of
    # it): the scale is 2^k exactly under both rules, UE8M0 or not.
    boundary = tail & (v >= 0.05) & (v < 0.10)
    top = 448 * torch.exp2(torch.randint(-10, 5, (T, H, 1), generator=gen, device=DEVICE).float())
    s = torch.where(boundary[..., None], (rand(T, H, D + pad) * 1.8 - 0.9) * top, s)
    s[..., :D:G] = torch.where(boundary[..., None], top, s[..., :D:G])
    p, s = p.to(dtype)[..., :D], s.to(dtype)[..., :D]
    # The merged row where it is one input exactly (after +inf -> -inf): else NaN.
    pe, se = pl.clone(), sl.clone()
    pe[pe == float("inf")] = float("-inf")
    se[se == float("inf")] = float("-inf")
    head = ~tail.t()  # [H, T]: rows with context
    take_p = head & (se == float("-inf"))  # rows without keys copy the prefix too
    take_s = ~head | ((pe == float("-inf")) & (se > float("-inf")))
    exact = torch.full((T, H, D), float("nan"), device=DEVICE)
    exact[take_p.t()] = p.float()[take_p.t()]
    exact[take_s.t()] = s.float()[take_s.t()]
    return p, pl.contiguous(), s, sl.contiguous(), exact


def scale_tensor(layout, T, groups):
    """The scale tensor [T, groups] at the layout's strides, and its storage (all NaN)."""
    import torch

    rows = {"row": T, "col": groups, "col-padded": groups}[layout]
    cols = {"row": groups, "col": T, "col-padded": -(-(T + 1) // 16) * 16}[layout]  # >= 1 column of padding
    storage = torch.full((rows, cols), float("nan"), device=DEVICE)
    return (storage if layout == "row" else storage[:, :T].t()), storage


def ue8m0_round(x):
    """2^ceil(log2(x)) for positive float32 x, exactly."""
    import torch

    m, e = torch.frexp(x)
    return torch.where(m == 0.5, x, torch.ldexp(torch.ones_like(x), e))


def ordinal(codes):
    """e4m3 codes as signed positions on the number line (adjacent codes differ by 1)."""
    import torch

    c = codes.view(torch.uint8).int()
    return torch.where(c >= 128, -(c - 128), c)


def step_of(x):
    """One e4m3 step at |x| (x in the code's own units): 2^(e-3) from 2^-6 up, 2^-9 below."""
    import torch

    e = torch.floor(torch.log2(x.abs().clamp_min(2.0 ** -6)))
    return torch.exp2(e - 3)


def compare(dtype, D, G, ue8m0, layout, T, H, n, vllm, patched, seed):
    import torch
    import mla_gen.vllm as mv

    p, pl, s, sl, exact = make_inputs(dtype, D, G, layout, T, H, n, seed)
    groups = H * D // G
    with_lse = layout != "col-padded"
    runs = {}
    for name in ("vllm", "mla"):
        out = torch.full((T, H, D), float("nan"), device=DEVICE).to(torch.float8_e4m3fn)
        lse = torch.full((H, T), float("nan"), device=DEVICE) if with_lse else None
        scales, storage = scale_tensor(layout, T, groups)
        fn = vllm.merge_attn_states if name == "vllm" else patched
        routed = mv.stats["routed"]
        try:
            fn(out, p, pl, s, sl, lse, prefill_tokens_with_context=n, output_block_scale=scales,
               quant_group_size=G, quant_scale_ue8m0=ue8m0)
        except Exception as e:  # strict=True: mla-gen's refusal raises instead of falling back
            return {"failures": [f"{name} raised {type(e).__name__}: {e}"]}
        if name == "mla" and mv.stats["routed"] != routed + 1:
            return {"failures": ["not routed to mla-gen (vLLM's kernel ran): no kernel for it in the folder?"]}
        runs[name] = (out, lse, scales, storage)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    (ov, lv, sv, _), (om, lm, sm, _) = runs["vllm"], runs["mla"]
    r = {"groups": T * groups, "elements": T * H * D, "failures": [], "examples": []}
    fails = r["failures"]

    # Writes: nothing left NaN, the padding of the padded layout untouched.
    for name, (out, _, scales, storage) in runs.items():
        if torch.isnan(out.float()).any() or torch.isnan(scales).any():
            fails.append(f"{name}: NaN codes or scales left (unwritten)")
        if layout == "col-padded" and not torch.isnan(storage[:, T:]).all():
            fails.append(f"{name}: wrote into the scale tensor's padding")

    # Scales.
    sv_, sm_ = sv.float().reshape(T, H, D // G), sm.float().reshape(T, H, D // G)
    amax = exact.view(T, H, D // G, G).abs().amax(-1).clamp_min(1e-10).cpu()  # NaN where blended
    is_exact = ~torch.isnan(amax)
    recip = torch.tensor(1 / 448, dtype=torch.float32)
    want_v, want_m = amax * recip, amax / 448
    if ue8m0:
        want_v, want_m = ue8m0_round(want_v), ue8m0_round(want_m)
    sv_c, sm_c = sv_.cpu(), sm_.cpu()
    differ = sv_c.view(torch.int32) != sm_c.view(torch.int32)
    recip_rule = is_exact & (sv_c == want_v) & (sm_c == want_m)
    r["scale_mismatch"] = int(differ.sum())
    r["scale_reciprocal"] = int((differ & recip_rule).sum())
    r["scale_other"] = int((differ & is_exact & ~recip_rule).sum())
    blended = differ & ~is_exact
    r["scale_blended"] = int(blended.sum())
    r["exact_groups"] = int(is_exact.sum())
    r["rules_differ"] = int((is_exact & (want_v != want_m)).sum())
    r["mla_off_contract"] = int((is_exact & (sm_c != want_v)).sum())
    r["vllm_off_its_rule"] = int((is_exact & (sv_c != want_v)).sum())
    dist = (sv_c.view(torch.int32).long() - sm_c.view(torch.int32).long()).abs()
    r["blended_max_ulps"] = int(dist[blended].max()) if blended.any() else 0
    for cls, mask in (("reciprocal", differ & recip_rule), ("other", differ & is_exact & ~recip_rule),
                      ("blended", blended)):
        for idx in mask.nonzero()[:8].tolist():
            t, h, g = idx
            r["examples"].append({"class": cls, "t": t, "h": h, "g": g, "vllm": sv_c[t, h, g].item(),
                                  "mla": sm_c[t, h, g].item(),
                                  "absmax": None if not is_exact[t, h, g] else amax[t, h, g].item()})
    if r["mla_off_contract"]:
        fails.append(f"mla-gen scale != absmax * RN(1/448) on {r['mla_off_contract']} exact groups")

    # Outputs: codes within 1 step where the scales agree; dequantized within 1 coarse step elsewhere.
    same = ~differ.to(sv.device).repeat_interleave(G, dim=-1)
    dv, dm = ordinal(ov), ordinal(om)
    steps = (dv - dm).abs()
    r["one_step"] = int((same & (steps == 1)).sum())
    bad = same & (steps > 1)
    xv, xm = ov.float(), om.float()
    sv_e = sv_.repeat_interleave(G, dim=-1)
    sm_e = sm_.repeat_interleave(G, dim=-1)
    # Unequal scales: the finer side's value in the coarser side's units, within one step there.
    v_coarse = sv_e >= sm_e
    x_coarse, s_coarse = torch.where(v_coarse, xv, xm), torch.where(v_coarse, sv_e, sm_e)
    x_fine = torch.where(v_coarse, xm * sm_e, xv * sv_e) / s_coarse
    gap = (x_fine - x_coarse).abs()
    loose = ~same & (gap > step_of(torch.maximum(x_fine.abs(), x_coarse.abs())) * (1 + 1e-5))
    r["compared_dequantized"] = int((~same).sum())
    r["past_one_step"] = int(bad.sum() + loose.sum())
    if r["past_one_step"]:
        t, h, d = (bad | loose).nonzero()[0].tolist()
        fails.append(f"{r['past_one_step']} elements past 1 FP8 step, first (t={t}, h={h}, d={d}): "
                     f"vLLM {xv[t, h, d].item()} x {sv_e[t, h, d].item()!r}, mla-gen {xm[t, h, d].item()} "
                     f"x {sm_e[t, h, d].item()!r}")

    # lse.
    if with_lse:
        fin = torch.isfinite(lv) & torch.isfinite(lm)
        r["lse_max_diff"] = float((lv - lm)[fin].abs().max()) if fin.any() else 0.0
        off = fin & ((lv - lm).abs() > 1e-5 + 1e-6 * lv.abs())
        inf_diff = ~fin & ~((lv == lm) | (torch.isnan(lv) & torch.isnan(lm)))
        if off.any() or inf_diff.any():
            fails.append(f"lse: {int(off.sum())} finite values past 1e-5, {int(inf_diff.sum())} non-finite differ")
    return r


def case_ok(r, allowed):
    """No failure, and no scale mismatch of a class not in `allowed`."""
    classes = {"reciprocal": r.get("scale_reciprocal", 0), "other": r.get("scale_other", 0),
               "blended": r.get("scale_blended", 0)}
    return not r["failures"] and not any(v for c, v in classes.items() if c not in allowed)


def verdict(results, allowed, capped):
    return not capped and all(case_ok(r, allowed) for r in results)


def main():
    args = parse_args()
    if args.kernels:
        os.environ["MLA_GEN_KERNELS"] = str(Path(args.kernels).resolve())
    if not any(Path(p, "mla_gen").is_dir() for p in sys.path if p):
        sys.path.insert(0, str(HERE.parent / "python"))
    import torch

    vllm = load_vllm(args.vllm)
    import mla_gen
    import mla_gen.vllm as mv

    # vLLM's dispatcher module, where patch() looks first, holding vLLM's function.
    original = vllm.merge_attn_states
    name = mv.MODULES[0]
    parts = name.split(".")
    for i in range(2, len(parts)):
        package = types.ModuleType(".".join(parts[:i]))
        package.__path__ = []
        sys.modules.setdefault(package.__name__, package)
    dispatcher = types.ModuleType(name)
    dispatcher.merge_attn_states = original
    sys.modules[name] = dispatcher
    handle = mv.patch(strict=True)
    vllm.merge_attn_states = original  # patch() rebinds every holder: vLLM's module keeps its own
    patched = dispatcher.merge_attn_states
    if patched is original:
        sys.exit(f"mla_gen.vllm.patch() did not patch {name}")
    T, H = args.tokens, 16
    n = T - 129
    print(f"# vLLM group FP8 vs mla_gen.vllm.patch(): T={T}, H={H}, n={n}; kernels "
          f"{os.environ.get('MLA_GEN_KERNELS') or mla_gen.kernels_dir()}; torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")
    start, results, capped = time.time(), [], False
    for seed, (dtype, D, G, ue8m0, layout) in enumerate(cases(args.layouts.split(","))):
        if time.time() - start > args.cap:
            capped = True
            break
        r = compare(dtype, D, G, ue8m0, layout, T, H, n, vllm, patched, seed)
        r.update(dtype=str(dtype).removeprefix("torch."), D=D, G=G, ue8m0=ue8m0, layout=layout)
        results.append(r)
        for f in r["failures"]:
            print(f"FAIL {r['dtype']} D={D} G={G} ue8m0={ue8m0} {layout}: {f}")
    handle.undo()
    elapsed = time.time() - start

    hdr = (f"{'dtype':8} {'D':>4} {'G':>4} {'ue8m0':5} {'layout':10} {'groups':>7} {'scale!=':>7} "
           f"{'recip':>6} {'other':>5} {'blend':>6} {'maxulp':>6} {'rules!=':>7} {'1step':>7} {'>1step':>6} "
           f"{'lse diff':>9}")
    print(hdr)
    for r in results:
        if "groups" not in r:
            continue
        lse = f"{r['lse_max_diff']:.2e}" if "lse_max_diff" in r else "-"
        print(f"{r['dtype']:8} {r['D']:>4} {r['G']:>4} {str(r['ue8m0']):5} {r['layout']:10} {r['groups']:>7} "
              f"{r['scale_mismatch']:>7} {r['scale_reciprocal']:>6} {r['scale_other']:>5} {r['scale_blended']:>6} "
              f"{r['blended_max_ulps']:>6} {r['rules_differ']:>7} {r['one_step']:>7} {r['past_one_step']:>6} "
              f"{lse:>9}")
    tot = {k: sum(r.get(k, 0) for r in results) for k in
           ("groups", "exact_groups", "scale_mismatch", "scale_reciprocal", "scale_other", "scale_blended",
            "rules_differ", "vllm_off_its_rule", "one_step", "past_one_step", "elements")}
    print(f"# scale mismatches: {tot['scale_mismatch']} of {tot['groups']} groups "
          f"({100 * tot['scale_mismatch'] / max(tot['groups'], 1):.2f}%): reciprocal rule {tot['scale_reciprocal']}, "
          f"other {tot['scale_other']} (exact rows), blended rows {tot['scale_blended']}")
    print(f"# scale mismatches: on the {tot['exact_groups']} exact groups, absmax * RN(1/448) != absmax / 448 "
          f"(after UE8M0 where on) for {tot['rules_differ']} "
          f"({100 * tot['rules_differ'] / max(tot['exact_groups'], 1):.2f}%); vLLM off its own rule "
          f"{tot['vllm_off_its_rule']}")
    print(f"# outputs: {tot['one_step']} of {tot['elements']} elements 1 step apart, {tot['past_one_step']} past 1 step")
    for name, allowed in ALLOW.items():
        print(f"# verdict with --allow-scale-diffs {name}: {'PASS' if verdict(results, allowed, capped) else 'FAIL'}")
    if capped:
        print(f"# cap: {args.cap} s reached after {len(results)} cases; rerun with fewer --layouts or a higher --cap")
    ok = verdict(results, ALLOW[args.allow_scale_diffs], capped)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "vllm_group.json").write_text(json.dumps(
            {"tokens": T, "heads": H, "threshold": n, "seconds": elapsed, "capped": capped,
             "allow_scale_diffs": args.allow_scale_diffs, "totals": tot, "cases": results}, indent=1))
    passed = sum(case_ok(r, ALLOW[args.allow_scale_diffs]) for r in results)
    print(f"{passed} passed, {len(results) - passed + capped} failed: vLLM group FP8 ({len(results)} cases in "
          f"{elapsed:.0f} s{', capped' if capped else ''}; scale mismatches allowed: {args.allow_scale_diffs})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

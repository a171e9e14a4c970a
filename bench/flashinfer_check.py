"""GPU check: mla_gen.flashinfer (kernels built with lse_base = "2") against FlashInfer's own
MergeState, MergeStateInPlace and MergeStates (its headers from the flashinfer-python wheel,
compiled by bench/gpu/peers.sh run into libpeers_fi.so), and both against a float64 reference
with FlashInfer's rules (docs/SEMANTICS.md, "lse in base 2"); mla_gen.sglang.merge_state_v2
against the float64 reference in base e. Over head sizes 64-512, f16 and bf16 (f32 against the
reference only: FlashInfer's entry points here are 16-bit), ragged token and head counts, and lse
patterns with empty sides (-inf on one side, on both, in every state), large gaps and masks. A
dtype the folder has no base-2 kernel of (f32 in the default's generated/) is left out of the
base-2 checks, with one line that says so; its sglang check still runs.

    MLA_GEN_KERNELS=<folder of tests/gpu-flashinfer.toml> python3 bench/flashinfer_check.py \\
        --peers <dir with libpeers_fi.so> [--out DIR]

Exit status 1 when any comparison fails; the summary (each case's worst differences) goes to
stdout and DIR/flashinfer_check.json.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import pathlib
import sys

import torch

import mla_gen
import mla_gen.flashinfer as mfi
import mla_gen.manifest as mmanifest
import mla_gen.sglang as msg

TOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6}
SHAPES = [(1, 1), (7, 3), (64, 16), (300, 32), (1024, 8)]
HEADS = [64, 128, 256, 512]
NAMES = {torch.float16: "f16", torch.bfloat16: "bf16"}
failures: list = []
results: list = []


def ulp(x: torch.Tensor, dtype) -> torch.Tensor:
    """One unit in the last place of `dtype` at |x| (float64)."""
    bits = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}[dtype]
    tiny = torch.finfo(dtype).tiny
    e = torch.floor(torch.log2(x.abs().clamp_min(tiny)))
    return torch.exp2(e - bits)


def lse_pattern(T, H, g, device, kinds):
    """float32 lse [T, H] in base 2 whose rows cycle through `kinds` ('x' normal, 'e' empty,
    'g' a large value, 40 above the normal ones)."""
    s = torch.randn(T, H, generator=g, device="cpu", dtype=torch.float64) * 4
    idx = torch.arange(T * H).reshape(T, H) % len(kinds)
    for i, k in enumerate(kinds):
        if k == "e":
            s[idx == i] = -float("inf")
        elif k == "g":
            s[idx == i] += 40
    return s.to(torch.float32).to(device)


def ref_pair(va, sa, vb, sb, base):
    """Float64 merge of two states by the rules of `base` ("2": FlashInfer's zeros for empty rows;
    "e": the prefix row)."""
    va, vb, sa, sb = va.double(), vb.double(), sa.double(), sb.double()
    m = torch.maximum(sa, sb)
    empty = m == -float("inf")
    mm = torch.where(empty, torch.zeros_like(m), m)
    pw = torch.exp2 if base == "2" else torch.exp
    wa, wb = pw(sa - mm), pw(sb - mm)
    tot = torch.where(empty, torch.ones_like(m), wa + wb)
    out = (va * (wa / tot)[..., None] + vb * (wb / tot)[..., None])
    mag = (va * (wa / tot)[..., None]).abs() + (vb * (wb / tot)[..., None]).abs()
    lg = torch.log2 if base == "2" else torch.log
    lse = torch.where(empty, torch.full_like(m, -float("inf")), lg(tot) + mm)
    if base == "e":
        out = torch.where(empty[..., None], va, out)
    return out, lse, mag, empty


def close(got, ref, mag, dtype, empty):
    """got within the suite's tolerance of ref (tol x magnitude + 1 ulp); empty rows exactly 0
    (base 2) or as the reference gives them."""
    got64 = got.double()
    err = (got64 - ref).abs()
    bound = TOL[dtype] * mag + ulp(ref, dtype)
    ok = bool((err <= bound).all()) and bool(torch.equal(got64[empty], ref[empty]))
    return ok, float(err.max()) if err.numel() else 0.0


def lse_close(got, ref):
    finite = torch.isfinite(ref)
    same_inf = torch.equal(torch.isfinite(got), finite) and torch.equal(got[~finite].double(), ref[~finite])
    err = (got.double() - ref).abs()[finite]
    ok = same_inf and bool((err <= 2e-5 + 1e-6 * ref.abs()[finite]).all())
    return ok, float(err.max()) if err.numel() else 0.0


def compared(who, v, s, ref, ref_lse, mag, dtype, empty):
    """`who`'s v and lse against the float64 reference: ok_<who>_v, <who>_err_v, ok_<who>_s,
    <who>_err_s."""
    ok_v, err_v = close(v, ref, mag, dtype, empty)
    ok_s, err_s = lse_close(s, ref_lse)
    return {f"ok_{who}_v": ok_v, f"{who}_err_v": err_v, f"ok_{who}_s": ok_s, f"{who}_err_s": err_s}


def flashinfer_side(rc, fv, fs, ours, ref, ref_lse, mag, dtype, empty):
    """FlashInfer's result (its entry point returned `rc`) against the same reference and
    bounds, and the share of its elements bit-equal to mla-gen's."""
    torch.cuda.synchronize()
    return {"ok_fi_rc": rc == 0, **compared("fi", fv, fs, ref, ref_lse, mag, dtype, empty),
            "bit_equal": float((ours == fv).double().mean())}


def record(case, **vals):
    ok = all(v for k, v in vals.items() if k.startswith("ok"))
    results.append({"case": case, **vals})
    if not ok:
        failures.append(case)
        print("FAIL", case, vals, flush=True)


def base2_dtypes() -> set:
    """The dtypes (manifest names: "f16", ...) the kernel folder has a base-2 kernel of."""
    return {k["variant"]["dtype"] for k in mmanifest.load()["kernels"] if k["variant"].get("lse_base") == "2"}


def stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def ptr(t):
    return ctypes.c_void_p(t.data_ptr())


def check_merge_state(fi, dtype, T, H, D, g, kinds_a, kinds_b):
    dev = "cuda"
    va = torch.randn(T, H, D, generator=g).to(dtype).to(dev)
    vb = torch.randn(T, H, D, generator=g).to(dtype).to(dev)
    sa, sb = lse_pattern(T, H, g, dev, kinds_a), lse_pattern(T, H, g, dev, kinds_b)
    v, s = mfi.merge_state(va, sa, vb, sb)
    ref, ref_lse, mag, empty = ref_pair(va, sa, vb, sb, "2")
    vals = compared("ref", v, s, ref, ref_lse, mag, dtype, empty)
    if fi is not None and dtype in NAMES:
        fv, fs = torch.empty_like(va), torch.empty(T, H, device=dev)
        rc = getattr(fi, f"fi_merge_state_{NAMES[dtype]}")(ptr(va), ptr(sa), ptr(vb), ptr(sb), ptr(fv), ptr(fs),
                                                         T, H, D, stream())
        vals |= flashinfer_side(rc, fv, fs, v, ref, ref_lse, mag, dtype, empty)
        vals["ok_empty_alike"] = bool(torch.equal(v[empty], fv[empty])) and bool(torch.equal(s[empty], fs[empty]))
    record(f"merge_state {dtype} T={T} H={H} D={D} a={kinds_a} b={kinds_b}", **vals)


def check_in_place(fi, dtype, T, H, D, g, masked):
    dev = "cuda"
    v0 = torch.randn(T, H, D, generator=g).to(dtype).to(dev)
    vo = torch.randn(T, H, D, generator=g).to(dtype).to(dev)
    s0, so = lse_pattern(T, H, g, dev, "xexe"), lse_pattern(T, H, g, dev, "xxee")
    mask = (torch.arange(T, device=dev) % 3 != 1) if masked else None
    v, s = v0.clone(), s0.clone()
    mfi.merge_state_in_place(v, s, vo, so, mask)
    ref, ref_lse, mag, empty = ref_pair(v0, s0, vo, so, "2")
    if mask is not None:
        keep = ~mask
        ref[keep], ref_lse[keep] = v0[keep].double(), s0[keep].double()
        mag[keep] = 0
    vals = compared("ref", v, s, ref, ref_lse, mag, dtype, empty)
    if fi is not None and dtype in NAMES:
        fv, fs = v0.clone(), s0.clone()
        m8 = mask.to(torch.uint8) if mask is not None else None
        rc = getattr(fi, f"fi_merge_state_in_place_{NAMES[dtype]}")(
            ptr(fv), ptr(fs), ptr(vo), ptr(so), T, H, D, ptr(m8) if m8 is not None else None, stream())
        vals |= flashinfer_side(rc, fv, fs, v, ref, ref_lse, mag, dtype, empty)
    record(f"merge_state_in_place {dtype} T={T} H={H} D={D} mask={masked}", **vals)


def check_merge_states(fi, dtype, T, K, H, D, g, all_empty_every):
    dev = "cuda"
    v = torch.randn(T, K, H, D, generator=g).to(dtype).to(dev)
    s = (torch.randn(T, K, H, generator=g) * 4).to(dev)
    s[:, 1::2, :] = -float("inf")  # every other state empty
    s[::all_empty_every] = -float("inf")  # whole tokens without keys
    out, lse = mfi.merge_states(v, s)
    x = s.double()
    m = x.max(dim=1).values
    empty = m == -float("inf")
    mm = torch.where(empty, torch.zeros_like(m), m)
    w = torch.exp2(x - mm[:, None, :])
    tot = torch.where(empty, torch.ones_like(m), w.sum(1))
    terms = v.double() * (w / tot[:, None, :])[..., None]
    ref, mag = terms.sum(1), terms.abs().sum(1)
    ref_lse = torch.where(empty, torch.full_like(m, -float("inf")), torch.log2(tot) + mm)
    if K == 1 and T > K:  # FlashInfer's MergeStates: the state's row and lse as given, empty rows too
        # (with states >= tokens its other kernel merges: the rule above, zeros where no keys)
        ref, ref_lse, mag = v[:, 0].double(), x[:, 0], torch.zeros_like(ref)
        empty = torch.ones_like(empty)
    vals = compared("ref", out, lse, ref, ref_lse, mag, dtype, empty)
    if fi is not None and dtype in NAMES:
        fv, fs = torch.empty(T, H, D, dtype=dtype, device=dev), torch.empty(T, H, device=dev)
        rc = getattr(fi, f"fi_merge_states_{NAMES[dtype]}")(ptr(v), ptr(s), ptr(fv), ptr(fs), K, T, H, D, stream())
        vals |= flashinfer_side(rc, fv, fs, out, ref, ref_lse, mag, dtype, empty)
    record(f"merge_states {dtype} T={T} K={K} H={H} D={D}", **vals)


def check_sglang(dtype, T, H, D, g):
    dev = "cuda"
    va = torch.randn(T, H, D, generator=g).to(dtype).to(dev)
    vb = torch.randn(T, H, D, generator=g).to(dtype).to(dev)
    sa, sb = lse_pattern(T, H, g, dev, "xexe"), lse_pattern(T, H, g, dev, "xxeg")
    v, s = msg.merge_state_v2(va, sa, vb, sb)
    ref, ref_lse, mag, empty = ref_pair(va, sa, vb, sb, "e")
    vals = compared("ref", v, s, ref, ref_lse, mag, dtype, empty)
    # Given outputs are written in place.
    v2, s2 = torch.empty_like(v), torch.empty_like(s)
    r = msg.merge_state_v2(va, sa, vb, sb, v2, s2)
    vals["ok_given"] = r[0] is v2 and r[1] is s2 and torch.equal(v2, v) and torch.equal(s2, s)
    record(f"sglang.merge_state_v2 {dtype} T={T} H={H} D={D}", **vals)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", help="folder with libpeers_fi.so (FlashInfer's entry points)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    fi = None
    if a.peers:
        fi = ctypes.CDLL(str(pathlib.Path(a.peers) / "libpeers_fi.so"))
        for f in ("merge_state", "merge_state_in_place", "merge_states"):
            for n in NAMES.values():
                getattr(fi, f"fi_{f}_{n}").restype = ctypes.c_int
    g = torch.Generator().manual_seed(2026)
    with_base2 = base2_dtypes()
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        base2 = mmanifest.dtype_name(dtype) in with_base2
        if not base2:
            print(f"skipped {mmanifest.dtype_name(dtype)} in the base-2 checks (merge_state, merge_state_in_place, "
                  f"merge_states): {mla_gen.kernels_dir()} has no base-2 kernel of that dtype", flush=True)
        for D in HEADS:
            for T, H in SHAPES:
                if base2:
                    for ka, kb in (("x", "x"), ("xexe", "xxee"), ("xg", "gx"), ("e", "e")):
                        check_merge_state(fi, dtype, T, H, D, g, ka, kb)
                check_sglang(dtype, T, H, D, g)
                if base2 and dtype != torch.float32:
                    for masked in (False, True):
                        check_in_place(fi, dtype, T, H, D, g, masked)
                    for K in (1, 2, 3, 4, 7):
                        check_merge_states(fi, dtype, T, K, H, D, g, 5)
    n = len(results)
    print(f"{n - len(failures)}/{n} cases pass (mla_gen {mla_gen.__version__}, "
          f"FlashInfer {'compared' if fi is not None else 'not given'})")
    worst = {}
    for r in results:
        fam = r["case"].split()[0]
        for k, v in r.items():
            if isinstance(v, float) and k != "bit_equal":
                worst[(fam, k)] = max(worst.get((fam, k), 0.0), v)
            if k == "bit_equal":
                worst[(fam, "bit_equal_min")] = min(worst.get((fam, "bit_equal_min"), 1.0), v)
    for (fam, k), v in sorted(worst.items()):
        print(f"  {fam:24s} {k:14s} {v:.3g}")
    if a.out:
        out = pathlib.Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "flashinfer_check.json").write_text(json.dumps({"results": results, "failures": failures}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

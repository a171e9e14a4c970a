"""The K-way merge's rules (docs/SEMANTICS.md, "merge_states" and "lse in base 2") checked on the GPU
against a float64 reference, for every merge_states kernel of a folder: +inf read as "no keys", a
NaN lse giving a NaN row and lse (also beside empty states), rows with no keys (state 0's row in
base e, zeros in base 2, lse -inf), large lse gaps, K = 1 (base 2: FlashInfer's copy of the state
and its lse), runtime K across the unrolled and chunked bodies, padded strides with the padding
left unwritten, every element written, and a null output lse. Used by kway_peers.py --check
(bench/gpu/kway.sh run); standalone:

    python3 bench/kway_check.py DIR [DIR ...]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mla_gen  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
MANTISSA = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
TOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
RUNTIME_KS = (1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17)
POISON = 7777.0
T, H, PAD = 37, 5, 16  # odd counts: partial head blocks; padded head and token strides


def lse_cases(K, g):
    """[T, K, H] float32 lse, rows (t, h) cycling through: normal; state 0 empty (-inf); all -inf;
    all +inf; one NaN; one NaN and the rest empty; a +40 gap; +inf beside finite states."""
    s = torch.randn(T, K, H, generator=g, dtype=torch.float64) * 4
    kind = (torch.arange(T)[:, None] * H + torch.arange(H)[None, :]) % 8
    inf = float("inf")
    for t in range(T):
        for h in range(H):
            c = int(kind[t, h])
            k1 = (t + h) % K
            if c == 1:
                s[t, 0, h] = -inf
            elif c == 2:
                s[t, :, h] = -inf
            elif c == 3:
                s[t, :, h] = inf
            elif c == 4:
                s[t, k1, h] = float("nan")
            elif c == 5:
                s[t, :, h] = -inf
                s[t, k1, h] = float("nan")
            elif c == 6:
                s[t, k1, h] += 40
            elif c == 7:
                s[t, k1, h] = inf
    return s.float()


def reference(v, s, base):
    """float64 merge by mla-gen's rules in `base` ("e" or "2"): (out [T, H, D], lse [T, H], kind
    [T, H]: 0 blend, 1 no keys, 2 NaN), the magnitude sum |w_k v_k| for the tolerance."""
    x = s.double()
    x = torch.where(x == float("inf"), torch.full_like(x, -float("inf")), x)
    nan = x.isnan().any(1)
    m = torch.where(nan, torch.zeros_like(x[:, 0]), torch.where(x.isnan(), -float("inf"), x).max(1).values)
    empty = (m == -float("inf")) & ~nan
    mm = torch.where(empty, torch.zeros_like(m), m)
    exp = torch.exp2 if base == "2" else torch.exp
    w = exp(torch.where(x.isnan(), 0.0, x) - mm[:, None])
    tot = torch.where(empty, torch.ones_like(m), w.sum(1))
    terms = v.double() * (w / tot[:, None])[..., None]
    out, mag = terms.sum(1), terms.abs().sum(1)
    if base == "e":  # no keys: state 0's row (base 2: the blend with weights 0, zeros)
        out = torch.where(empty[..., None], v[:, 0].double(), out)
    log = torch.log2 if base == "2" else torch.log
    lse = torch.where(empty, torch.full_like(m, -float("inf")), log(tot) + mm)
    lse = torch.where(nan, torch.full_like(m, float("nan")), lse)
    kind = torch.where(nan, 2, torch.where(empty, 1, 0))
    return out, lse, kind, mag


def check_case(meta, K, dtype, D, base, with_lse, g):
    """None, or what is wrong with this kernel's result for one K."""
    dev = "cuda"
    v_full = torch.randn(T, K, H, D + PAD, generator=g).to(dtype)
    v = v_full.to(dev)[..., :D]
    s = lse_cases(K, g)
    o_full = torch.full((T, H, D + PAD), POISON, dtype=dtype, device=dev)
    out = o_full[..., :D]
    out_lse = torch.full((T, H), POISON, device=dev) if with_lse else None
    names = {p["name"] for p in meta["params"]}
    values = {"output": out, "output_lse": out_lse, "states": v, "states_lse": s.to(dev), "num_tokens": T,
              "num_heads": H, "output_token_stride": out.stride(0), "output_head_stride": out.stride(1),
              "states_token_stride": v.stride(0), "states_state_stride": v.stride(1),
              "states_head_stride": v.stride(2), "num_states": K}
    mla_gen.launch_kernel(meta["name"], {k: x for k, x in values.items() if k in names})
    torch.cuda.synchronize()
    got, o_full = out.double().cpu(), o_full.cpu()
    if (o_full[..., D:] != POISON).any():
        return "wrote the padding"
    v64 = v_full[..., :D]
    if base == "2" and K == 1:  # FlashInfer's MergeStates: the state's row and lse as given
        want, want_lse, kind = v64[:, 0].double(), s[:, 0].double(), torch.full((T, H), 3)
        mag = want.abs()
    else:
        want, want_lse, kind, mag = reference(v64, s, base)
    eps = 2.0 ** -MANTISSA[dtype]
    tol = max(TOL[dtype], (K + 2) * 2.0 ** -24) if dtype == torch.float32 else TOL[dtype]
    ulp = torch.exp2(torch.floor(torch.log2(want.abs().clamp_min(torch.finfo(dtype).tiny)))) * eps  # subnormals too
    blend = kind == 0
    copied = (kind == 1) | (kind == 3)
    if ((got - want).abs() > tol * mag + ulp)[blend].any():
        bad = ((got - want).abs() - tol * mag - ulp).masked_fill(~blend[..., None], -1).argmax()
        return f"blend off the reference at flat index {int(bad)}"
    if base == "e" or K == 1:
        # State 0's row (base e), or the state (base 2, K = 1), bit for bit; NaN rows stay NaN.
        same = (got == want) | (got.isnan() & want.isnan())
        if not same[copied].all():
            return "a row with no keys is not state 0's row"
    elif not (got[kind == 1] == 0).all():
        return "a row with no keys is not zeros (base 2)"
    if not got[kind == 2].isnan().all():
        return "a NaN lse did not give a NaN row"
    if (got == POISON).any():
        return "an element was never written"
    if out_lse is not None:
        gl = out_lse.double().cpu()
        if (gl == POISON).any():
            return "an output lse was never written"
        both_nan = gl.isnan() & want_lse.isnan()
        exact = (gl == want_lse) | both_nan
        if not exact[kind != 0].all():
            return "lse of a row with no keys or a NaN is not -inf / NaN / the state's"
        if not ((gl - want_lse).abs() <= 1e-5)[kind == 0].all():
            return f"lse off by {float((gl - want_lse).abs()[kind == 0].max()):.3g}"
    return None


def check_folder(folder, only_bf16_base2=False):
    """Every merge_states kernel of `folder` over its K values; the failures, printed and returned."""
    folder = str(Path(folder).resolve())
    os.environ["MLA_GEN_KERNELS"] = folder
    manifest = json.loads(Path(folder, "manifest.json").read_text())
    g = torch.Generator().manual_seed(34)
    failures, cases = [], 0
    for meta in manifest["kernels"]:
        var = meta["variant"]
        fam = var["family"]
        if not (isinstance(fam, dict) and "merge_states" in fam):
            continue
        base = var.get("lse_base", "e")
        if only_bf16_base2 and (var["dtype"] != "bf16" or base != "2"):
            continue
        fixed = fam["merge_states"]["num_states"]
        # Candidate folders (only_bf16_base2): each body once (unrolled, chunked, a partial chunk).
        ks = RUNTIME_KS[::2] if only_bf16_base2 else RUNTIME_KS
        for i, K in enumerate([fixed] if fixed else ks):
            cases += 1
            try:
                problem = check_case(meta, K, DTYPES[var["dtype"]], var["head_size"], base,
                                     var["output_lse"] and i % 3 != 2, g)
            except (ValueError, LookupError, RuntimeError) as e:
                problem = f"not run: {str(e).splitlines()[0][:160]}"
            if problem:
                failures.append(f"{Path(folder).name}/{meta['name']} K={K}: {problem}")
                print("#  FAIL", failures[-1], flush=True)
    print(f"# {folder}: {cases - len(failures)}/{cases} K-way cases pass", flush=True)
    return failures


if __name__ == "__main__":
    bad = [f for d in sys.argv[1:] for f in check_folder(d)]
    sys.exit(1 if bad else 0)

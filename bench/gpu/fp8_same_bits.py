"""The group FP8 kernels of two kernel folders (bench/gpu/fp8.sh: bench-base, the base templates,
and bench-new) give the same bits: codes, group scales and lse, on inputs with every row kind (blend,
copied suffix past the threshold, copied prefix with no keys, NaN lse) and special elements (+-inf,
NaN, -0, subnormal, huge, tiny, all-zero and all-NaN groups).

Usage: python3 bench/gpu/fp8_same_bits.py BASE_DIR NEW_DIR   (bf16, D = 128 kernels; prints
PASS/FAIL per case, exits 1 on a difference)
"""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import mla_gen  # noqa: E402

HEAD = 128


def inputs(T, H, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    prefix = torch.empty(T, H, HEAD, device="cuda").uniform_(-40, 40, generator=g)
    suffix = torch.empty(T, H, HEAD, device="cuda").uniform_(-40, 40, generator=g)
    for x in (prefix, suffix):
        scale = torch.empty(T, H, 1, device="cuda").uniform_(-60, 60, generator=g).exp2()
        x *= scale  # magnitudes from 2^-60 to 2^60 (bf16 keeps float32's exponent range)
        pick = torch.randint(0, 64, x.shape, device="cuda", generator=g)
        x[pick == 0] = math.inf
        x[pick == 1] = -math.inf
        x[pick == 2] = math.nan
        x[pick == 3] = -0.0
        x[pick == 4] = 1e-40  # subnormal in float32 and bf16
        x[pick == 5] = 3e38
    prefix[1::11] = 0.0          # whole rows of zeros
    suffix[2::13] = math.nan     # whole rows of NaN
    plse = torch.empty(H, T, device="cuda").uniform_(-10, 10, generator=g)
    slse = torch.empty(H, T, device="cuda").uniform_(-10, 10, generator=g)
    plse[:, ::5] = math.inf
    slse[:, ::7] = -math.inf
    plse[:, ::9] = -math.inf
    slse[:, ::3] = math.inf      # with ::5 / ::9 above: no keys on either side
    plse[:, 4::17] = math.nan
    return prefix.bfloat16(), suffix.bfloat16(), plse, slse


def run(folder, case):
    os.environ["MLA_GEN_KERNELS"] = folder
    T, H, G, ue8m0, n = case
    prefix, suffix, plse, slse = inputs(T, H, T + G)
    out = torch.full((T, H, HEAD), 0.0, device="cuda").to(torch.float8_e4m3fn)
    scales = torch.full((T, H * HEAD // G), math.nan, device="cuda")
    lse = torch.full((H, T), 1.0, device="cuda")
    mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, lse, n, output_group_scales=scales, ue8m0=ue8m0)
    torch.cuda.synchronize()
    return out.view(torch.uint8).cpu(), scales.view(torch.int32).cpu(), lse.view(torch.int32).cpu()


def main():
    base, new = sys.argv[1], sys.argv[2]
    ok = True
    for T, H in ((613, 4), (4096, 32)):
        for G in (16, 128):
            for ue8m0 in (False, True):
                for n in (T, T // 2, 0):
                    case = (T, H, G, ue8m0, n)
                    a, b = run(base, case), run(new, case)
                    diff = [int((x != y).sum()) for x, y in zip(a, b)]
                    same = diff == [0, 0, 0]
                    ok &= same
                    print(f"T={T} H={H} G={G} ue8m0={ue8m0} threshold={n}: differing codes/scales/lse "
                          f"{diff[0]}/{diff[1]}/{diff[2]} {'PASS' if same else 'FAIL'}")
    print(f"fp8_same_bits: {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

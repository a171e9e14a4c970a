"""Launch a few merge_attn_states shapes once each, for Nsight Compute to profile (ncu filters
and replays them; this script only launches). Two sets:

  outlier  bf16 D = 512, H = 128, threshold T/2 at T = 4096, 8192, 32768 (kernels of generated/):
           run 9 and run 17 measured T = 8192 at 86-87% of copy, the others at 93-97.5%
  threshold  bf16 H = 128, D = 96 at T = 8192 and D = 128 at T = 32768, each with no threshold
           and with T/2 (kernels of generated/): T/2 shapes stay 2-5 points below their twins
  fp8      bf16 D = 128 at T = 32768, H = 128, no threshold, writing bf16, per-tensor FP8 and
           per-token-group FP8 (G = 128, UE8M0 and plain): the FP8 outputs move fewer bytes
           than bf16 yet take longer (kernels of tests/gpu-extra.toml: set MLA_GEN_KERNELS)

Usage (GPU machine): ncu --clock-control none --metrics ... python3 bench/profile_cases.py outlier|threshold|fp8
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mla_gen  # noqa: E402


def inputs(T, H, D, dtype=torch.bfloat16):
    prefix = torch.empty(T, H, D, device="cuda", dtype=dtype).uniform_(-4, 4)
    suffix = torch.empty(T, H, D, device="cuda", dtype=dtype).uniform_(-4, 4)
    plse = torch.empty(H, T, device="cuda").uniform_(-10, 10)
    slse = torch.empty(H, T, device="cuda").uniform_(-10, 10)
    return prefix, suffix, plse, slse, torch.empty(H, T, device="cuda")


def main(which):
    if which == "outlier":
        for T in (4096, 8192, 32768):
            prefix, suffix, plse, slse, out_lse = inputs(T, 128, 512)
            out = torch.empty_like(prefix)
            mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, out_lse, T // 2)
            print(f"launched bf16 D=512 T={T} H=128 threshold T/2", flush=True)
    elif which == "threshold":
        for T, D in ((8192, 96), (32768, 128)):
            prefix, suffix, plse, slse, out_lse = inputs(T, 128, D)
            out = torch.empty_like(prefix)
            for n in (T, T // 2):
                mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, out_lse, n)
                print(f"launched bf16 D={D} T={T} H=128 threshold {'none' if n == T else 'T/2'}", flush=True)
    elif which == "fp8":
        T, H, D = 32768, 128, 128
        prefix, suffix, plse, slse, out_lse = inputs(T, H, D)
        out16 = torch.empty_like(prefix)
        out8 = torch.empty(T, H, D, device="cuda", dtype=torch.float8_e4m3fn)
        scales = torch.empty(T, H * D // 128, device="cuda")
        mla_gen.merge_attn_states(out16, prefix, plse, suffix, slse, out_lse, T)
        mla_gen.merge_attn_states(out8, prefix, plse, suffix, slse, out_lse, T,
                                  output_scale=torch.tensor([0.05], device="cuda"))
        for ue8m0 in (True, False):
            mla_gen.merge_attn_states(out8, prefix, plse, suffix, slse, out_lse, T,
                                      output_group_scales=scales, ue8m0=ue8m0)
        print("launched bf16 D=128 T=32768 H=128: bf16 out, fp8 per-tensor, fp8 group UE8M0, fp8 group", flush=True)
    else:
        raise SystemExit("usage: profile_cases.py outlier|threshold|fp8")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")

"""Where the T/2 shapes lose: the same tensors merged at thresholds n = 0 (every row a copy row),
T/4, T/2, 3T/4 and T (every row a merge row), each as a percent of a device-to-device copy of
the same bytes, timed as in bench.py (median of --reps launches, L2 flushed before each).

Run 20 found the percent rising steadily with n (bf16 D = 128: 90.2% at n = 0, 96.4% at n = T):
the rows past the threshold, one row read and one written, ran at 90% of a copy of the same bytes.
That led to the block order (docs/PERFORMANCE.md, "Block order"); `--label` names a kernel set so
two sets can be compared in one call.

Usage (GPU machine): python3 bench/threshold_sweep.py [--out DIR] [--label NAME]
(the kernels are those of $MLA_GEN_KERNELS or generated/, as for the drop-in)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mla_gen  # noqa: E402
from bench import make, merge_bytes, time_ms  # noqa: E402

# (T, H, D): the two threshold shapes of profile_cases.py, a long-row one, a short-row one, the
# D = 512 outlier of the benchmark (a 128 KiB token stride), a few-heads one
SHAPES = ((32768, 128, 128), (8192, 128, 96), (32768, 64, 512), (32768, 128, 64), (8192, 128, 512),
          (32768, 16, 128))
FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--label", default="generated")
    ap.add_argument("--reps", type=int, default=100)
    args = ap.parse_args()
    rows = []
    for T, H, D in SHAPES:
        prefix, plse, suffix, slse = make(T, H, D, torch.bfloat16, seed=T + H + D)
        out = torch.empty_like(prefix)
        out_lse = torch.empty(H, T, device="cuda")
        line = []
        for frac in FRACTIONS:
            n = int(T * frac)
            nbytes = merge_bytes(T, H, D, 2, n)
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            merge_ms = time_ms(lambda: mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, out_lse, n),
                               args.reps)
            copy_ms = time_ms(lambda: dst.copy_(src), args.reps)
            del src, dst
            pct = copy_ms / merge_ms * 100
            rows.append({"kernels": args.label, "T": T, "H": H, "D": D, "n": n, "bytes": nbytes,
                         "us": merge_ms * 1e3, "copy_us": copy_ms * 1e3, "pct_copy": pct})
            line.append(f"n={frac:g}T {pct:5.1f}%")
        print(f"[{args.label}] bf16 T={T} H={H} D={D}: " + "  ".join(line), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, f"threshold-sweep-{args.label}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

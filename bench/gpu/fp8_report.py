"""Summarise bench/gpu/fp8.sh's timings: per shape and output kind, % of a same-size copy for the
base templates and the new ones (the better of the two alternating rounds of each) and the speedup
new over base (base time / new time, each the lower of its two rounds).

Usage: python3 bench/gpu/fp8_report.py OUT/fp8   (reads base-1, new-1, base-2, new-2)
"""

import json
import sys
from pathlib import Path

KINDS = ("fp8_tensor", "fp8_group_ue8m0", "fp8_group", "bf16")


def load(path):
    rows = json.loads(Path(path, "bench-families.json").read_text())["fp8"]
    return {(r["T"], r["H"], r["G"]): r for r in rows}


def main():
    root = Path(sys.argv[1])
    runs = {name: [load(root / f"{name}-{i}") for i in (1, 2)] for name in ("base", "new")}
    print("% of copy: the kind's bytes (inputs, lse, codes, group scales) / its time, over the copy")
    print("bandwidth measured in the same call; the better of two rounds. speedup = base us / new us.")
    head = f"{'T':>6} {'H':>4} {'G':>4} {'MB':>6} |"
    for k in KINDS:
        head += f" {k + ' base%':>22} {'new%':>6} {'new us':>8} {'x':>5} |"
    print(head)
    worst = {k: 1e9 for k in KINDS}
    for key in sorted(runs["new"][0]):
        T, H, G = key
        mb = runs["new"][0][key]["fp8_tensor"]["bytes"] / 1e6
        line = f"{T:>6} {H:>4} {G:>4} {mb:>6.0f} |"
        for k in KINDS:
            base = [r[key][k] for r in runs["base"]]
            new = [r[key][k] for r in runs["new"]]
            b_us, n_us = min(x["us"] for x in base), min(x["us"] for x in new)
            b_pct, n_pct = max(x["pct_copy"] for x in base), max(x["pct_copy"] for x in new)
            line += f" {b_pct:>21.1f}% {n_pct:>5.1f}% {n_us:>8.1f} {b_us / n_us:>5.2f} |"
            if mb >= 256:
                worst[k] = min(worst[k], n_pct)
        print(line)
    print("lowest % of copy at >= 256 MB (new templates): " +
          ", ".join(f"{k} {v:.1f}%" for k, v in worst.items() if v < 1e9) + "  (target: >= 90% for FP8)")


if __name__ == "__main__":
    main()

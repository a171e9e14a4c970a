"""Same-run comparison of two kernel folders timed by `mla-gen bench` in alternation
(base, new, base, new): is any shape slower than the base beyond noise?

Noise is read from the run itself: the two base rounds of a shape differ by `spread` (relative);
a shape counts as slower only when new's median of its rounds exceeds base's median by more than
max(2 %, 2 x spread) AND both new rounds are slower than both base rounds. Prints a summary and
the worst shapes; with --json writes every row.

Usage: python3 bench/compare_runs.py BASE1.json NEW1.json BASE2.json NEW2.json [--json OUT]
       [--field us|hot_us]  (cold L2, the default, or hot L2 graph-replayed time)
"""

from __future__ import annotations

import argparse
import json
import statistics


def rows(path, field="us"):
    data = json.load(open(path))
    return {(r["kernel"], r["T"], r["H"], r["threshold"]): r[field] for r in data["rows"] if r.get(field)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs=4, help="base1 new1 base2 new2 (mla-gen bench --json files)")
    ap.add_argument("--json")
    ap.add_argument("--field", default="us", help="the time compared: us (cold L2, default) or hot_us (hot L2, graph)")
    args = ap.parse_args()
    b1, n1, b2, n2 = (rows(p, args.field) for p in args.runs)
    out, slower, faster = [], [], []
    for key in sorted(set(b1) & set(n1) & set(b2) & set(n2)):
        base, new = (b1[key], b2[key]), (n1[key], n2[key])
        b, n = statistics.median(base), statistics.median(new)
        spread = abs(base[0] - base[1]) / b
        ratio = n / b
        limit = max(0.02, 2 * spread)
        verdict = "same"
        if ratio - 1 > limit and min(new) > max(base):
            verdict = "slower"
            slower.append(key)
        elif 1 - ratio > limit and max(new) < min(base):
            verdict = "faster"
            faster.append(key)
        out.append({"kernel": key[0], "T": key[1], "H": key[2], "threshold": key[3], "base_us": base,
                    "new_us": new, "ratio": ratio, "base_spread": spread, "verdict": verdict})
    ratios = [r["ratio"] for r in out]
    spreads = [r["base_spread"] for r in out]
    print(f"{len(out)} shapes; new/base time: median {statistics.median(ratios):.4f}, "
          f"min {min(ratios):.4f}, max {max(ratios):.4f}; base run-to-run spread: median "
          f"{statistics.median(spreads):.4f}, max {max(spreads):.4f}")
    print(f"slower beyond noise: {len(slower)}; faster beyond noise: {len(faster)}")
    for r in sorted(out, key=lambda r: -r["ratio"])[:8]:
        print(f"  {r['kernel']:<40} T={r['T']:<6} H={r['H']:<4} thr={r['threshold']:<5} "
              f"base {r['base_us'][0]:8.2f} {r['base_us'][1]:8.2f} us  new {r['new_us'][0]:8.2f} "
              f"{r['new_us'][1]:8.2f} us  x{r['ratio']:.3f} {r['verdict']}")
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()

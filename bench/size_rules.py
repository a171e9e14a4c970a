"""Size rules from `mla-gen tune --l2 both --json` runs (docs/HISTORY.md, session 7).

    python3 bench/size_rules.py choose RUN.json [RUN.json ...]
        Per (dtype, head size): the current schedule, the two best single schedules and the three
        best two-range rules (schedule A below R rows = T x H, B from R on), each scored in every
        run (w = worst time / best candidate, g = geometric mean, over the shapes and both L2
        modes), ranked by the worst run's geomean. specs/tuned.toml's [[size_rule]] entries were
        chosen from this output (runs 47 and 52).
    python3 bench/size_rules.py judge RUN.json
        specs/tuned.toml's rules, and the schedules before them, on a run they were not chosen
        from: per mode the worst ratio, the geomean and the shapes within 2% of the best.
"""

import itertools
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ratios(group, pick):
    """time of the schedule `pick(rows)` / best candidate, per mode, per shape."""
    idx = {c["schedule"]: i for i, c in enumerate(group["candidates"])}
    out = {}
    for mode, t in group["times_us"].items():
        out[mode] = [t[idx[pick(s["T"] * s["H"])]][i] / min(t[c][i] for c in range(len(t)))
                     for i, s in enumerate(group["shapes"])]
    return out


def score(group, pick):
    rs = [x for v in ratios(group, pick).values() for x in v]
    return max(rs), math.exp(sum(map(math.log, rs)) / len(rs))


def choose(paths):
    runs = [{(g["dtype"], g["head_size"]): g for g in json.load(open(p))["groups"]} for p in paths]
    for key, first in runs[0].items():
        gs = [r[key] for r in runs if key in r]
        names = [c["schedule"] for c in first["candidates"]]
        cuts = sorted({s["T"] * s["H"] for s in first["shapes"]})[1:]
        cands = [(f"single {n}", lambda r, n=n: n) for n in names]
        cands += [(f"{a} <{R} {b}", lambda r, a=a, b=b, R=R: a if r < R else b)
                  for a, b in itertools.permutations(names, 2) for R in cuts]
        scored = sorted((max(g for _, g in e), max(w for w, _ in e), label, e)
                        for label, pick in cands for e in [[score(g, pick) for g in gs]])
        show = lambda e: " ".join(f"w{w:.3f}/g{g:.4f}" for w, g in e)  # noqa: E731
        cur = first["analysis"]["current"]
        print(f"== {key} current {cur}: {show([score(g, lambda r: cur) for g in gs])}")
        for s in [s for s in scored if s[2].startswith("single")][:2] + \
                 [s for s in scored if not s[2].startswith("single")][:3]:
            print("   ", s[2], show(s[3]))


def tuned_rules():
    text = (ROOT / "specs/tuned.toml").read_text()
    rules = {}
    for m in re.finditer(r'\[\[size_rule\]\]\ndtype = "(\w+)"\nhead_size = (\d+)\nranges = \[\n(.*?)\]\n', text, re.S):
        ranges = []
        for line in m.group(3).strip().splitlines():
            below = re.search(r"below_rows = (\d+)", line)
            bt = re.search(r"block_threads = (\d+)", line).group(1)
            hpb = re.search(r"heads_per_block = (\d+)", line).group(1)
            ranges.append((int(below.group(1)) if below else None, f"bt{bt}/hpb{hpb}"))
        rules[(m.group(1), int(m.group(2)))] = ranges
    return rules


def judge(path):
    rules, every = tuned_rules(), []
    for g in json.load(open(path))["groups"]:
        rule = rules[(g["dtype"], g["head_size"])]
        cur = g["analysis"]["current"]
        parts = []
        for label, pick in (("before", lambda r: cur),
                            ("rule", lambda r: next(s for b, s in rule if b is None or r < b))):
            per = ratios(g, pick)
            if label == "rule":
                every += [x for v in per.values() for x in v]
            parts.append(f"{label}: " + ", ".join(
                f"{m} worst {max(v):.3f} gm {math.exp(sum(map(math.log, v)) / len(v)):.4f} "
                f"{sum(x <= 1.02 for x in v)}/{len(v)} within 2%" for m, v in per.items()))
        print(f"{g['dtype']} d{g['head_size']:<4}", " | ".join(parts))
    every.sort()
    print(f"all rule ratios: {len(every)}, within 2%: {sum(x <= 1.02 for x in every)}, "
          f"median {every[len(every) // 2]:.4f}, max {every[-1]:.3f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["choose"] and len(sys.argv) > 2:
        choose(sys.argv[2:])
    elif sys.argv[1:2] == ["judge"] and len(sys.argv) == 3:
        judge(sys.argv[2])
    else:
        sys.exit(__doc__)

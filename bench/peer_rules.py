"""Size rules from peer-benchmark runs (bench/peers.py, with schedule candidates given as
`--kernels b<threads>h<heads>v<vecs>=DIR`, e.g. bench/gpu/peers.sh build with PEERS_CANDIDATES):

    python3 bench/peer_rules.py RUN.json [RUN.json ...]

Per (dtype, head size): every single schedule and every two-range rule (schedule A below R rows =
T x H, B from R on, R between two measured shapes), scored over the shapes and both L2 modes of
every run by time / the best candidate's time at that shape: w = the worst, g = the geometric
mean. Prints the best rule by g (a second range only where it gains over 0.5% and keeps two
measured sizes on each side) with its score and the best single schedule's,
and the [[size_rule]] entry for specs/tuned.toml. Candidates a run did not time at a shape count
as missing there: a rule using them is not scored.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import defaultdict

LABEL = re.compile(r"^b(\d+)h(\d+)v(\d+)$")


def groups(paths):
    """(dtype, D) -> [(rows, mode, {candidate: us})] over every run and shape."""
    out = defaultdict(list)
    for path in paths:
        run = json.load(open(path))
        cands = [label for label, _ in run["kernels"] if LABEL.match(label)]
        for r in run["rows"]:
            for mode in ("cold", "hot"):
                times = {c: r[f"{mode}_{c}_us"] for c in cands if f"{mode}_{c}_us" in r}
                if times:
                    out[(r["dtype"], r["D"])].append((r["T"] * r["H"], mode, times))
    return out


def score(points, pick):
    """(worst, geomean) of time(pick(rows)) / best, or None where a pick was not timed."""
    logs, worst = [], 0.0
    for rows, _, times in points:
        c = pick(rows)
        if c not in times:
            return None
        x = times[c] / min(times.values())
        logs.append(math.log(x))
        worst = max(worst, x)
    return worst, math.exp(sum(logs) / len(logs))


def toml_range(label, below=None):
    b, h, v = LABEL.match(label).groups()
    bound = f"below_rows = {below}, " if below is not None else ""
    return f"    {{ {bound}block_threads = {b}, heads_per_block = {h}, vecs_per_thread = {v} }},"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for (dtype, d), points in sorted(groups(sys.argv[1:]).items()):
        cands = sorted({c for _, _, t in points for c in t})
        singles = [(score(points, lambda _r, c=c: c), c) for c in cands]
        singles = sorted((s, c) for s, c in singles if s)
        best_single = singles[0]
        bounds = sorted({rows for rows, _, _ in points})
        rules = []
        # A split leaves two measured sizes on each side at least: one shape's noise does not
        # make a range.
        for lo, hi in list(zip(bounds, bounds[1:]))[1:-1]:
            # rows < cut: A; a round bound between the two sizes (a multiple of 1024 where one fits)
            cut = max(lo + 1, min(hi, round((lo + hi) / 2 / 1024) * 1024))
            for a in cands:
                for b in cands:
                    if a == b:
                        continue
                    s = score(points, lambda r, a=a, b=b, cut=cut: a if r < cut else b)
                    if s:
                        rules.append((s, a, b, cut))
        rules.sort(key=lambda x: x[0][1])
        print(f"== {dtype} d{d}: {len(points)} shape-modes, {len(cands)} candidates")
        (w, g), c = best_single
        print(f"  one schedule: {c}  w {w:.3f} g {g:.4f}")
        entry = [toml_range(c)]
        if rules and rules[0][0][1] < g - 0.005:
            (rw, rg), a, b, cut = rules[0]
            print(f"  two ranges:   {a} below {cut} rows, then {b}  w {rw:.3f} g {rg:.4f}")
            entry = [toml_range(a, cut), toml_range(b)]
        print(f'[[size_rule]]\ndtype = "{dtype}"\nhead_size = {d}\nranges = [\n' + "\n".join(entry) + "\n]\n")


if __name__ == "__main__":
    main()

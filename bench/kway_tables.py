"""The K-way tables of bench/kway_peers.py without torch: the shapes each table runs and the
summary lines of its rows (a row: {"table", "K", "T", "H", "D", "x_fi": {label: {mode: ratio}},
"x_loop": {mode: ratio}, "kernel"?}); python/tests/test_bench_table.py reads them on a CPU.

  python3 bench/kway_tables.py --repeated A/kway.json B/kway.json [--label shipped]
      the grid's losses (x fi < 0.98) that both runs show, per mode: the ones that count
      (issue #34: a loss counts when a second run repeats it)
"""

from __future__ import annotations

import argparse
import json
import statistics

GRID_K = (2, 3, 4, 5, 8, 9, 16)
GRID_T = (256, 2048, 8192, 32768)
# (H, D) pairs in the order the grid runs them: the first three cover every H and every D, so
# that a run stopped by --cap still has each; then the rest of the 3 x 3.
GRID_HD = ((16, 128), (8, 64), (32, 256), (16, 64), (32, 128), (8, 256), (16, 256), (8, 128), (32, 64))
CANDIDATE_SHAPES = ([(K, T, 16, 128) for T in (2048, 32768) for K in (2, 3, 5, 9, 16)]
                    + [(K, T, H, D) for H, D in ((8, 64), (32, 256)) for T in (2048, 32768) for K in (2, 5, 16)])
# The grid's small merges (states of at most 20 MiB, the kernel's last-first bound): where the
# session-25 hot losses were, 2-5 us merges whose prologue and first wave decide their time.
SMALL_SHAPES = [(K, T, H, D) for H, D in GRID_HD for K in GRID_K for T in GRID_T if K * T * H * (2 * D + 4) <= 20 << 20]
STATES_SHAPES = [(K, T, 16, 128) for T in (2048, 32768) for K in range(1, 17)]
INPLACE_SHAPES = [(T, H, D) for D in (64, 128, 256) for H in (8, 32) for T in (256, 2048, 8192, 32768)]
# The family peer table (issue #34 item 5, bench/gpu/families.sh): MergeStates at 1-16 states beside
# the chunk loop, and MergeStateInPlace with and without a mask, at decode and prefill shapes.
FAMILY_STATES = (1, 2, 3, 4, 8, 16)
FAMILY_THD = ((256, 16, 128), (2048, 16, 128), (8192, 32, 128), (32768, 8, 128), (2048, 32, 256), (8192, 8, 64))
FAMILY_SHAPES = [(K, T, H, D) for T, H, D in FAMILY_THD for K in FAMILY_STATES]
FAMILY_INPLACE = [(T, H, D, mask) for T, H, D in FAMILY_THD for mask in (False, True)]


def k_tag(kernel):
    """merge_states_bf16_d128_k4_lse_base2 -> k4 (kvar: the runtime-K kernel)."""
    return kernel.split("_")[4]


def summary(rows, default):
    """The lines a run ends with: per table, mode and label the median, least and count below 0.98
    of x fi (FlashInfer's time / the label's); the grid per K for `default`; the family and
    in-place tables; x loop (the chunk loop's time / the default's) from 4 states."""
    lines = []
    for table in ("candidates", "states", "family", "grid"):
        kway = [r for r in rows if r["table"] == table and "x_fi" in r]
        labels = list(dict.fromkeys(n for r in kway for n in r["x_fi"]))
        for mode in ("cold", "hot"):
            for label in labels:
                xs = [(r["x_fi"][label][mode], r) for r in kway if label in r["x_fi"]]
                worst = min(xs, key=lambda p: p[0])
                slower = sum(x < 0.98 for x, _ in xs)
                lines.append(f"{table} {mode} {label}: x fi median {statistics.median(x for x, _ in xs):.3f}, min "
                             f"{worst[0]:.3f} (K={worst[1]['K']} T={worst[1]['T']} H={worst[1]['H']} "
                             f"D={worst[1]['D']}), {slower} of {len(xs)} below 0.98")
    grid = [r for r in rows if r["table"] == "grid" and default in r.get("x_fi", {})]
    for K in sorted({r["K"] for r in grid}):  # the target grid per number of states, the default
        rs = [r for r in grid if r["K"] == K]
        kernels = ",".join(sorted({k_tag(r["kernel"]) for r in rs if "kernel" in r}))
        per_mode = "; ".join(
            f"{m} median {statistics.median(r['x_fi'][default][m] for r in rs):.3f} min "
            f"{min(r['x_fi'][default][m] for r in rs):.3f}, {sum(r['x_fi'][default][m] < 0.98 for r in rs)} below 0.98"
            for m in ("cold", "hot"))
        lines.append(f"grid K={K} {default}{f' [{kernels}]' if kernels else ''} ({len(rs)} shapes): x fi {per_mode}")
    family = [r for r in rows if r["table"] == "family" and default in r.get("x_fi", {})]
    for K in sorted({r["K"] for r in family}):  # the family table per number of states
        rs = [r for r in family if r["K"] == K]
        fi = " ".join(f"{m} median {statistics.median(r['x_fi'][default][m] for r in rs):.3f} min "
                      f"{min(r['x_fi'][default][m] for r in rs):.3f}" for m in ("cold", "hot"))
        loop = " ".join(f"{m} min {min(r['x_loop'][m] for r in rs):.2f}" for m in ("cold", "hot")
                        if all(m in r["x_loop"] for r in rs))
        lines.append(f"family K={K} ({len(rs)} shapes): x fi {fi}" + (f"; x loop {loop}" if loop else ""))
    for table, mask in (("inplace", False), ("family-inplace", False), ("family-inplace", True)):
        inplace = [r for r in rows if r["table"] == table and r.get("mask", False) == mask and "x_fi" in r]
        labels = list(dict.fromkeys(n for r in inplace for n in r["x_fi"]))
        for mode, label in ((m, n) for m in ("cold", "hot") for n in labels):
            xs = [(r["x_fi"][label][mode], r) for r in inplace if label in r["x_fi"]]
            worst = min(xs, key=lambda p: p[0])
            lines.append(f"{table}{' mask' if mask else ''} {mode} {label}: x fi median "
                         f"{statistics.median(x for x, _ in xs):.3f}, min {worst[0]:.3f} (T={worst[1]['T']} "
                         f"H={worst[1]['H']} D={worst[1]['D']}), {sum(x < 0.98 for x, _ in xs)} of {len(xs)} below 0.98")
    for table in ("family", "grid"):
        kway = [r for r in rows if r["table"] == table and "x_loop" in r]
        for mode in ("cold", "hot"):
            loops = [(r["x_loop"][mode], r) for r in kway if mode in r["x_loop"] and r["K"] >= 4]
            if loops:
                worst = min(loops, key=lambda p: p[0])
                lines.append(f"{table} {mode} {default} x loop (K >= 4): min {worst[0]:.2f} (K={worst[1]['K']} "
                             f"T={worst[1]['T']} H={worst[1]['H']} D={worst[1]['D']}), "
                             f"{sum(x < 2 for x, _ in loops)} of {len(loops)} below 2")
    return lines


def parse_shapes(text: str):
    """"K:TxHxD,..." -> [(K, T, H, D), ...]."""
    shapes = []
    for item in text.split(","):
        K, dims = item.split(":")
        shapes.append((int(K), *(int(x) for x in dims.split("x"))))
    return shapes


def repeated_losses(first, second, label, mode, below=0.98):
    """[((K, T, H, D), x in the first run, x in the second)]: the grid shapes where `label`'s x fi
    is below `below` in both runs' rows, in the first run's order."""
    def xs(rows):
        return {(r["K"], r["T"], r["H"], r["D"]): r["x_fi"][label][mode] for r in rows
                if r["table"] == "grid" and label in r.get("x_fi", {})}
    a, b = xs(first), xs(second)
    return [(shape, a[shape], b[shape]) for shape in a if shape in b and a[shape] < below and b[shape] < below]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeated", nargs=2, required=True, metavar="KWAY_JSON", help="two runs' kway.json")
    ap.add_argument("--label", help="the implementation (default: the first run's default)")
    args = ap.parse_args()
    first, second = (json.loads(open(path).read()) for path in args.repeated)
    label = args.label or first["default"]
    shapes = sum(1 for r in first["rows"] if r["table"] == "grid" and label in r.get("x_fi", {}))
    for mode in ("cold", "hot"):
        losses = repeated_losses(first["rows"], second["rows"], label, mode)
        listed = ", ".join(f"{K}:{T}x{H}x{D} {x1:.3f}/{x2:.3f}" for (K, T, H, D), x1, x2 in losses)
        print(f"# grid {mode} {label}: {len(losses)} of {shapes} shapes below 0.98 in both runs"
              + (f": {listed}" if listed else ""))


if __name__ == "__main__":
    main()

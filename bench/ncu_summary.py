"""The lines of an Nsight Compute CSV (`ncu --csv --page details`) that say where a memory-bound
kernel's time goes, one block per profiled launch: duration, instructions, registers, launch
shape, occupancy, issue and stall figures, memory throughput and L2 hits. Used by
bench/gpu/peers.sh and bench/gpu/kway.sh (their NCU steps).

Usage: python3 bench/ncu_summary.py NCU.csv
"""

from __future__ import annotations

import collections
import csv
import sys

WANT = ["Duration", "Executed Instructions", "Registers Per Thread", "Grid Size", "Block Size",
        "Achieved Occupancy", "Issue Slots Busy", "No Eligible", "Memory Throughput", "L2 Hit Rate",
        "Warp Cycles Per Issued Instruction", "Waves Per SM", "DRAM Throughput", "Mem Busy", "Max Bandwidth",
        "L1/TEX Hit Rate"]


def main(path: str) -> None:
    with open(path) as f:
        rows = list(csv.DictReader(line for line in f if line.startswith('"')))
    by = collections.defaultdict(dict)
    for r in rows:
        if r["Metric Name"] in WANT:
            by[(r["ID"], r["Kernel Name"][:60])][r["Metric Name"]] = f'{r["Metric Value"]} {r["Metric Unit"]}'.strip()
    if not by:
        sys.exit(f"{path}: no profiled launch (ncu's errors are in the .err file beside it)")
    for (i, k), m in by.items():
        print(i, k)
        print("   " + "; ".join(f"{n}: {m[n]}" for n in WANT if n in m))


if __name__ == "__main__":
    main(sys.argv[1])

"""Session 28-29's question: at merges of 1-5 GB the shipped call path (mla_gen.flashinfer.merge_states)
timed cold 7% slower than the kernel it selects launched by name into the same buffers, but only in
buffer placements 1 and 2 (kway_peers.py --placements 3 --by-name). This script repeats those
steps for a few shapes and placements and shows what the two CUDA graphs hold: each graph's DOT
dump (torch's debug mode) with addresses masked, diffed, and each graph's cold time, plus the call
path captured again after the plan cache is emptied (`shipped-fresh`).

Run 170 (HISTORY.md, session 29): the graphs are the same; the first series timed ran slow
whichever graph it was (kway_peers.py now throws one series away first).

  python3 bench/kway_graphs.py --peers LIB --shipped DIR [--shapes 8:32768x32x256,...] --out DIR
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kway_peers import (PLACEMENT_PAD_BYTES, FlashInfer, KwayShape, Shipped, cold_us,  # noqa: E402
                        implementations)
from kway_tables import parse_shapes  # noqa: E402
from mla_gen import _torch  # noqa: E402


def dumped(call, path):
    """`call` captured in a graph with torch's debug mode, the graph and its DOT text with
    addresses and graph ids masked."""
    call()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph(keep_graph=True)  # keep the cudaGraph_t for the DOT dump
    g.enable_debug_mode()
    with torch.cuda.graph(g):
        call()
    g.instantiate()
    g.debug_dump(str(path))
    text = re.sub(r"0x[0-9a-fA-F]+", "0x?", path.read_text())
    return g, re.sub(r"graph_\d+|\b\d{6,}\b", "N", text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", required=True)
    ap.add_argument("--shipped", required=True)
    ap.add_argument("--shapes", default="8:32768x32x256,16:32768x32x128")
    ap.add_argument("--placements", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fi = FlashInfer(args.peers)
    shipped = Shipped(args.shipped, also_by_name=True)
    for K, T, H, D in parse_shapes(args.shapes):
        for p in range(args.placements):
            torch.cuda.empty_cache()
            pad = torch.empty(p * PLACEMENT_PAD_BYTES, dtype=torch.uint8, device="cuda")
            sh = KwayShape(T, K, H, D, seed=T * 7 + K * 5 + H * 3 + D, loop=False)
            impls = implementations(sh, [shipped], fi, fixed_too=False, loop=False)
            # the steps kway_peers.py takes before timing
            problems = []
            for name, (call, _, lse2) in impls.items():
                problems.append(sh.check(name, call, lse2))
                if name == "shipped":  # its output is still in sh.out
                    problems.append(shipped.differs_from_the_function(sh))
            kernel = shipped.kernel(sh)
            tag = f"{K}:{T}x{H}x{D} p{p}"
            print(f"# {tag}: kernel {kernel}, states at {sh.v.data_ptr():#x}, out at {sh.out.data_ptr():#x}, "
                  f"pad {pad.numel()} B; problems {[x for x in problems if x]}", flush=True)
            graphs, texts = {}, {}
            for name in ("shipped", "shipped-name", "flashinfer"):
                graphs[name], texts[name] = dumped(impls[name][0], out / f"{K}-{T}-{H}-{D}-p{p}-{name}.dot")
            _torch._forget_plans_after_fork()  # every plan and slot emptied, as in a forked child
            graphs["shipped-fresh"], texts["shipped-fresh"] = dumped(
                impls["shipped"][0], out / f"{K}-{T}-{H}-{D}-p{p}-shipped-fresh.dot")
            for name in ("shipped", "shipped-fresh"):
                diff = list(difflib.unified_diff(texts["shipped-name"].splitlines(), texts[name].splitlines(),
                                                 "shipped-name", name, n=0, lineterm=""))
                print(f"#   graph {name} vs shipped-name: {'same (addresses masked)' if not diff else 'DIFFERS'}")
                for line in diff[:30]:
                    print("#     " + line[:200])
            names = list(graphs)
            times = {n: [] for n in names}
            for r in range(2):  # two rounds, rotating order
                for n in names[r:] + names[:r]:
                    times[n].append(cold_us(graphs[n], args.reps))
            print("#   cold us: " + ", ".join(f"{n} {' / '.join(f'{t:.1f}' for t in ts)}" for n, ts in times.items()),
                  flush=True)
            del graphs, sh, pad, impls


if __name__ == "__main__":
    main()

"""The empty-context mask fused into the merge against the two launches it replaces:

  fused   merge_attn_states with query_start_loc/context_start_loc (a `_ctxmask` kernel)
  pair    mask_empty_context_lse on prefix_lse (in place), then the plain merge
  copy    a device copy moving the fused merge's bytes (read + written): the limit
  vllm    with --peers DIR (libpeers_vllm.so, bench/gpu/peers.sh run builds it): vLLM's
          pipeline as it runs it, written here and labelled vLLM-style: a Triton kernel writing
          -inf into prefix_lse for the requests without context (one program per request and
          head), then the vLLM-style CUDA merge of the peer benchmark (bench/peers/peers.cu)

bf16, D = 128 at T in {256, 1K, 2K, 4K, 8K, 32K} x H in {16, 32}, and D = 512 at H = 16 for a
few T; ragged requests (B = clamp(T / 128, 4, 256), random token counts covering all T tokens),
25% of them with an empty context; n = T. Two timing modes:

  cold    eager launches, the L2 flushed (a 512 MB zero_) before each, median of >= 100 timed
          with CUDA events (bench.py's time_ms). The flush gives the host a head start, so the
          pair's two launches reach the GPU back to back: GPU time, not host time.
  hot     in a CUDA graph, no flush: each iteration is [producer, fused] or [producer, mask,
          merge], where the producer is one elementwise kernel (an int32 add of 0 over one
          buffer holding prefix, suffix and both lse) that writes every input just before, as an
          attention kernel would. A graph holds R iterations (R = 20, 5 for the largest shapes)
          so that one replay keeps the GPU busy far longer than the host takes to issue it;
          each replay is timed with CUDA events, median of 30. The producer-only graph (R
          producers) is timed the same way and subtracted: fused us = (t[producer+fused] -
          t[producer]) / R, the same for the pair.

Prints a table (T, H, D, fused us, pair us, speedup = pair / fused, per mode, and the copy time
of the same bytes in both modes; with --peers, vLLM's pipeline and x vllm = vllm / fused) and the
targets: speedup >= 1.25 at 1K-8K tokens x 16 heads (D = 128) and never below 1.0; x vllm >= 1.25
at <= 4K tokens x 16 heads, D = 128 and 512 (issue #21). JSON to $OUT/bench_ctxmask.json when OUT is set (or --out).
Kernels: $MLA_GEN_KERNELS must hold the `_ctxmask` kernels (python/gpu_checks.sh points it at
.device/ctxmask, from tests/gpu-ctxmask.toml). About 30 s on an H200.

Usage: MLA_GEN_KERNELS=DIR python3 bench/bench_ctxmask.py [--reps N] [--quick] [--peers DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

HERE = Path(__file__).resolve().parent
if not any(Path(p, "mla_gen").is_dir() for p in sys.path if p):
    sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
import mla_gen  # noqa: E402
from bench import time_ms  # noqa: E402  cold L2: flush before each launch, CUDA events, median
from hot_l2 import Arena, graph_us  # noqa: E402  hot L2: producer + X in a CUDA graph

SHAPES = [(T, H, 128) for T in (256, 1024, 2048, 4096, 8192, 32768) for H in (16, 32)] + \
         [(T, 16, 512) for T in (1024, 4096, 32768)]
QUICK = [(1024, 16, 128), (8192, 16, 128), (32768, 32, 128), (4096, 16, 512)]


def requests(T, seed):
    """query_start_loc, context_start_loc (int32 lists): B ragged requests covering the T tokens,
    a quarter of them (rounded, at least one) with an empty context."""
    rng = random.Random(seed)
    B = max(4, min(256, T // 128))
    cuts = sorted(rng.randint(0, T) for _ in range(B - 1))
    qsl = [0] + cuts + [T]
    empty = set(rng.sample(range(B), max(1, B // 4)))
    csl = [0]
    for b in range(B):
        csl.append(csl[-1] + (0 if b in empty else rng.randint(1, 4096)))
    return qsl, csl, B


@triton.jit
def _vllm_style_mask(lse, query_start_loc, context_start_loc, num_tokens, BLOCK: tl.constexpr):
    """prefix_lse [H, T] = -inf over the tokens of request b, for head h, where b has no context."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    if tl.load(context_start_loc + b + 1) == tl.load(context_start_loc + b):
        start = tl.load(query_start_loc + b)
        end = tl.load(query_start_loc + b + 1)
        for t0 in range(start, end, BLOCK):
            t = t0 + tl.arange(0, BLOCK)
            tl.store(lse + h * num_tokens + t, float("-inf"), mask=t < end)


class Case:
    """One shape's buffers: the inputs inside one arena (so that one kernel can produce them all),
    its source, the outputs, the start locations."""

    def __init__(self, T, H, D, seed):
        self.T, self.H, self.D = T, H, D
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.inputs = Arena([((T, H, D), torch.bfloat16), ((T, H, D), torch.bfloat16),
                             ((H, T), torch.float32), ((H, T), torch.float32)])
        self.prefix, self.suffix, self.plse, self.slse = self.inputs.views
        self.prefix.uniform_(-4, 4, generator=g)
        self.suffix.uniform_(-4, 4, generator=g)
        self.plse.uniform_(-10, 10, generator=g)
        self.slse.uniform_(-10, 10, generator=g)
        self.inputs.seal()  # the producer rewrites these values, bit for bit
        self.out = torch.empty(T, H, D, dtype=torch.bfloat16, device="cuda")
        self.out_lse = torch.empty(H, T, device="cuda")
        qsl, csl, self.B = requests(T, seed)
        self.qsl = torch.tensor(qsl, dtype=torch.int32, device="cuda")
        self.csl = torch.tensor(csl, dtype=torch.int32, device="cuda")
        self.masked_tokens = sum(qsl[b + 1] - qsl[b] for b in range(self.B) if csl[b + 1] == csl[b])
        # The fused merge's bytes: three rows and three lse per (t, h), plus the start locations.
        self.bytes = T * H * (3 * D * 2 + 12) + 8 * (self.B + 1)
        self.copy_src = torch.empty(self.bytes // 2, dtype=torch.uint8, device="cuda")
        self.copy_dst = torch.empty_like(self.copy_src)

    def producer(self):
        self.inputs.producer()

    def fused(self):
        mla_gen.merge_attn_states(self.out, self.prefix, self.plse, self.suffix, self.slse, self.out_lse, self.T,
                                  query_start_loc=self.qsl, context_start_loc=self.csl)

    def pair(self):
        mla_gen.mask_empty_context_lse(self.plse, self.qsl, self.csl)
        mla_gen.merge_attn_states(self.out, self.prefix, self.plse, self.suffix, self.slse, self.out_lse, self.T)

    def copy(self):
        self.copy_dst.copy_(self.copy_src)

    def vllm(self):
        _vllm_style_mask[(self.B, self.H)](self.plse, self.qsl, self.csl, self.T, BLOCK=256)
        PEERS.vllm_style(self.out, self.out_lse, self.prefix, self.plse, self.suffix, self.slse, self.T)


PEERS = None  # bench/peers.py's Peers, with --peers


def bench_shape(T, H, D, reps, graph_reps):
    c = Case(T, H, D, seed=T * 7 + H * 3 + D)
    # Warm: load the kernels, build the plans (nothing of that may happen during a capture).
    c.fused()
    c.pair()
    if PEERS is not None:
        # vLLM's pipeline must compute what the fused merge does (its expf/logf round otherwise).
        c.producer()
        c.fused()
        fused = c.out.float().clone()
        c.producer()
        c.vllm()
        worst = (c.out.float() - fused).abs().max().item()
        if not worst <= 0.05:
            sys.exit(f"bench_ctxmask: vLLM's pipeline differs from the fused merge by {worst} at {T}x{H}x{D}")
    c.producer()
    torch.cuda.synchronize()
    row = {"T": T, "H": H, "D": D, "B": c.B, "masked_tokens": c.masked_tokens, "bytes": c.bytes}
    # cold L2, eager
    row["cold_fused_us"] = time_ms(c.fused, reps) * 1e3
    row["cold_pair_us"] = time_ms(c.pair, reps) * 1e3
    row["cold_copy_us"] = time_ms(c.copy, reps) * 1e3
    # hot L2, CUDA graph: [producer, X] x R minus [producer] x R
    R = 20 if c.bytes < (256 << 20) else 5

    def with_producer(fn):
        def body():
            c.producer()
            fn()
        return body

    prod = graph_us(c.producer, R, graph_reps)
    row["hot_producer_us"] = prod
    row["hot_fused_us"] = graph_us(with_producer(c.fused), R, graph_reps) - prod
    row["hot_pair_us"] = graph_us(with_producer(c.pair), R, graph_reps) - prod
    row["hot_copy_us"] = graph_us(c.copy, R, graph_reps)
    if PEERS is not None:
        row["cold_vllm_us"] = time_ms(c.vllm, reps) * 1e3
        row["hot_vllm_us"] = graph_us(with_producer(c.vllm), R, graph_reps) - prod
    row["graph_iterations"] = R
    for mode in ("cold", "hot"):
        row[f"{mode}_speedup"] = row[f"{mode}_pair_us"] / row[f"{mode}_fused_us"]
        row[f"{mode}_fused_pct_copy"] = 100 * row[f"{mode}_copy_us"] / row[f"{mode}_fused_us"]
        if PEERS is not None:
            row[f"{mode}_x_vllm"] = row[f"{mode}_vllm_us"] / row[f"{mode}_fused_us"]
    del c
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=100, help="cold-mode launches per timing (>= 100)")
    ap.add_argument("--graph-reps", type=int, default=30, help="graph replays per hot-mode timing")
    ap.add_argument("--quick", action="store_true", help="four shapes")
    ap.add_argument("--peers", help="folder holding libpeers_vllm.so: time vLLM's pipeline too")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    global PEERS
    if args.peers:
        from peers import Peers
        PEERS = Peers(args.peers)
    if not torch.cuda.is_available():
        sys.exit("bench_ctxmask: no CUDA GPU")
    if not mla_gen.supports("bf16", 128, output_lse=True, threshold=True, mask_empty_context=True):
        sys.exit(f"bench_ctxmask: no bf16 d128 _ctxmask kernel in {mla_gen.kernels_dir()} (set MLA_GEN_KERNELS to "
                 "the output of `mla-gen generate tests/gpu-ctxmask.toml`)")
    t0 = time.time()
    prop = torch.cuda.get_device_properties(0)
    print(f"# {prop.name}, {prop.multi_processor_count} SMs, torch {torch.__version__}, "
          f"kernels {mla_gen.kernels_dir()}")
    print("# fused: merge_attn_states with the start locations; pair: mask_empty_context_lse then the plain merge;")
    print("# cold: eager, L2 flushed before each, median of CUDA-event times; hot: CUDA graph, inputs written by a")
    print("# producer kernel just before, producer-only graph subtracted; speedup = pair / fused; n = T, bf16, 25% of")
    print("# requests without context")
    print(f"{'T':>6} {'H':>3} {'D':>4} {'B':>4} {'MB':>7} | {'cold fused':>10} {'pair':>7} {'speedup':>7} "
          f"{'copy':>7} | {'hot fused':>9} {'pair':>7} {'speedup':>7} {'copy':>7}   (us)")
    rows = []
    for T, H, D in (QUICK if args.quick else SHAPES):
        r = bench_shape(T, H, D, max(args.reps, 100), args.graph_reps)
        rows.append(r)
        print(f"{T:>6} {H:>3} {D:>4} {r['B']:>4} {r['bytes'] / 1e6:>7.1f} | {r['cold_fused_us']:>10.1f} "
              f"{r['cold_pair_us']:>7.1f} {r['cold_speedup']:>6.2f}x {r['cold_copy_us']:>7.1f} | "
              f"{r['hot_fused_us']:>9.1f} {r['hot_pair_us']:>7.1f} {r['hot_speedup']:>6.2f}x {r['hot_copy_us']:>7.1f}"
              + (f" | vllm cold {r['cold_vllm_us']:.1f} x{r['cold_x_vllm']:.2f}, hot {r['hot_vllm_us']:.1f} "
                 f"x{r['hot_x_vllm']:.2f}" if PEERS is not None else ""),
              flush=True)
    target_rows = [r for r in rows if 1024 <= r["T"] <= 8192 and r["H"] == 16 and r["D"] == 128]
    verdict = {}
    for mode in ("cold", "hot"):
        at_target = min((r[f"{mode}_speedup"] for r in target_rows), default=None)
        lowest = min(r[f"{mode}_speedup"] for r in rows)
        verdict[mode] = {"min_speedup_1k_8k_h16": at_target, "min_speedup": lowest,
                         "met": (at_target is None or at_target >= 1.25) and lowest >= 1.0}
        shown = "n/a" if at_target is None else f"{at_target:.2f}x"
        print(f"target ({mode}): speedup >= 1.25 at 1K-8K tokens x 16 heads: min {shown}; never < 1.0: min "
              f"{lowest:.2f}x -> {'met' if verdict[mode]['met'] else 'MISSED'}")
    if PEERS is not None:
        small = [r for r in rows if r["T"] <= 4096 and r["H"] == 16 and r["D"] in (128, 512)]
        for mode in ("cold", "hot"):
            least = min((r[f"{mode}_x_vllm"] for r in small), default=None)
            verdict[mode]["min_x_vllm_le_4k_h16"] = least
            shown = "n/a" if least is None else f"{least:.2f}x"
            print(f"target ({mode}): x vLLM's pipeline >= 1.25 at <= 4K tokens x 16 heads, D = 128 and 512: min "
                  f"{shown} -> {'met' if least is not None and least >= 1.25 else 'MISSED'}")
    elapsed = time.time() - t0
    print(f"# {len(rows)} shapes in {elapsed:.0f} s")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "bench_ctxmask.json").write_text(json.dumps(
            {"device": prop.name, "torch": torch.__version__, "kernels": str(mla_gen.kernels_dir()),
             "method": {"cold": "eager, L2 flushed before each launch, median of >= 100 CUDA-event times",
                        "hot": "CUDA graph of R x [producer, X] minus R x [producer], per iteration, median of "
                               "graph replays; producer = one int32 add-0 kernel writing all inputs"},
             "rows": rows, "target": verdict, "seconds": elapsed}, indent=1))


if __name__ == "__main__":
    main()

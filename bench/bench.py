"""Side-by-side benchmark of merge_attn_states on one GPU, in one process:

  mla-gen   the generated kernel, through the Python drop-in
  copy      a device-to-device copy moving the same bytes (read + written): the limit
  torch     a PyTorch eager composite of the same semantics
  triton    a Triton kernel of the same semantics, with prefill_tokens_with_context as
            tl.constexpr, as engines ship it today (the baseline mla-gen replaces)

Two L2 conditions (--l2, default both):

  cold  each time is the median of >= 100 launches timed with CUDA events, with the L2 flushed
        before each launch (the columns and JSON keys this script always had);
  hot   in a CUDA graph, right after a producer kernel rewrote every input (hot_l2.py: R x
        [producer, X] minus R x [producer], median of graph replays), as an engine's graph runs
        the merge; the copy's source is rewritten by its own producer the same way. JSON keys
        hot_<impl>_us, hot_pct_copy (hot copy time / hot mla-gen time), hot_x_triton.

Inputs are fresh random data for every shape. Bytes moved per call:
rows with context x (3*D*size + 12) + rows without x (2*D*size + 8).

Usage: python3 bench/bench.py [--quick] [--out DIR] [--l2 cold|hot|both]
           [--shapes bf16:613x16x128,bf16:4096x16x96/2,...] [--impls mla-gen,copy,triton]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import mla_gen  # noqa: E402
from bench_table import header, line, parse_shapes, ratios, summary  # noqa: E402
from hot_l2 import Arena, hot_us, iterations  # noqa: E402


# ---- the Triton baseline (written here; semantics of docs/SEMANTICS.md) ----

@triton.jit
def _triton_merge(out, out_lse, prefix, prefix_lse, suffix, suffix_lse, num_tokens,
                  o_ts, o_hs, p_ts, p_hs, s_ts, s_hs,
                  N_CTX: tl.constexpr, HEAD: tl.constexpr, BLOCK: tl.constexpr,
                  WRITE_LSE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < HEAD
    li = h * num_tokens + t
    s_lse = tl.load(suffix_lse + li)
    s_row = tl.load(suffix + t * s_ts + h * s_hs + offs, mask=mask)
    if t >= N_CTX:
        tl.store(out + t * o_ts + h * o_hs + offs, s_row, mask=mask)
        if WRITE_LSE:
            tl.store(out_lse + li, s_lse)
    else:
        p_lse = tl.load(prefix_lse + li)
        p_row = tl.load(prefix + t * p_ts + h * p_hs + offs, mask=mask).to(tl.float32)
        p_lse = tl.where(p_lse == float("inf"), float("-inf"), p_lse)
        s_lse = tl.where(s_lse == float("inf"), float("-inf"), s_lse)
        m = tl.where(p_lse > s_lse, p_lse, s_lse)
        empty = m == float("-inf")
        m_safe = tl.where(empty, 0.0, m)
        a = tl.exp(p_lse - m_safe)
        b = tl.exp(s_lse - m_safe)
        pw = a / (a + b)
        sw = b / (a + b)
        merged = p_row * pw + s_row.to(tl.float32) * sw
        merged = tl.where(empty, p_row, merged)
        tl.store(out + t * o_ts + h * o_hs + offs, merged.to(out.dtype.element_ty), mask=mask)
        if WRITE_LSE:
            tl.store(out_lse + li, tl.where(empty, float("-inf"), tl.log(a + b) + m_safe))


def triton_merge(out, prefix, plse, suffix, slse, out_lse, n):
    T, H, D = out.shape
    _triton_merge[(T, H)](out, out_lse if out_lse is not None else plse, prefix, plse, suffix, slse, T,
                          out.stride(0), out.stride(1), prefix.stride(0), prefix.stride(1),
                          suffix.stride(0), suffix.stride(1),
                          N_CTX=n, HEAD=D, BLOCK=triton.next_power_of_2(D), WRITE_LSE=out_lse is not None)


def torch_merge(out, prefix, plse, suffix, slse, out_lse, n):
    p = plse.t()
    s = slse.t()
    inf = math.inf
    p = torch.where(p == inf, -inf, p)
    s = torch.where(s == inf, -inf, s)
    m = torch.maximum(p, s)
    empty = m == -inf
    m = torch.where(empty, 0.0, m)
    a = torch.exp(p - m)
    b = torch.exp(s - m)
    pw = (a / (a + b))[..., None]
    sw = (b / (a + b))[..., None]
    merged = prefix[:n].float() * pw[:n] + suffix[:n].float() * sw[:n]
    merged = torch.where(empty[:n, :, None], prefix[:n].float(), merged)
    out[:n] = merged.to(out.dtype)
    out[n:] = suffix[n:]
    if out_lse is not None:
        lse = torch.where(empty, -inf, torch.log(a + b) + m)
        out_lse[:, :n] = lse[:n].t()
        out_lse[:, n:] = slse[:, n:]


# ---- timing ----

_flush = None


def flush_l2():
    global _flush
    if _flush is None:
        _flush = torch.empty(512 << 20, dtype=torch.int8, device="cuda")  # 512 MB >> 60 MB L2
    _flush.zero_()


def time_ms(fn, reps):
    for _ in range(3):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush_l2()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def merge_bytes(T, H, D, size, n, with_lse=True):
    ctx_rows = n * H
    plain_rows = (T - n) * H
    lse = 12 if with_lse else 8
    return ctx_rows * (3 * D * size + lse) + plain_rows * (2 * D * size + (8 if with_lse else 4))


def make(T, H, D, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    prefix = torch.empty(T, H, D, device="cuda", dtype=dtype).uniform_(-4, 4, generator=g)
    suffix = torch.empty(T, H, D, device="cuda", dtype=dtype).uniform_(-4, 4, generator=g)
    plse = torch.empty(H, T, device="cuda").uniform_(-10, 10, generator=g)
    slse = torch.empty(H, T, device="cuda").uniform_(-10, 10, generator=g)
    return prefix, plse, suffix, slse


def bench_shape(T, H, D, dtype, threshold_half, reps, impls, l2="cold", graph_reps=30):
    n = T // 2 if threshold_half else T
    prefix, plse, suffix, slse = make(T, H, D, dtype, seed=T * 7 + H * 3 + D)
    out = torch.empty_like(prefix)
    out_lse = torch.empty(H, T, device="cuda")
    size = prefix.element_size()
    nbytes = merge_bytes(T, H, D, size, n)
    row = {"T": T, "H": H, "D": D, "dtype": str(dtype).replace("torch.", ""),
           "threshold": "T/2" if threshold_half else "none", "bytes": nbytes}
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)

    def merges(p, pl, s_, sl):
        return {
            "mla-gen": lambda: mla_gen.merge_attn_states(out, p, pl, s_, sl, out_lse,
                                                         n if threshold_half else None),
            "torch": lambda: torch_merge(out, p, pl, s_, sl, out_lse, n),
            "triton": lambda: triton_merge(out, p, pl, s_, sl, out_lse, n),
        }

    if l2 in ("cold", "both"):
        fns = dict(merges(prefix, plse, suffix, slse), copy=lambda: dst.copy_(src))
        for name in impls:
            ms = time_ms(fns[name], reps)
            row[name + "_us"] = ms * 1e3
            row[name + "_gbs"] = nbytes / (ms * 1e-3) / 1e9
    if l2 in ("hot", "both"):
        # The same values in an arena one producer launch rewrites; the copy's source likewise.
        inputs = Arena([((T, H, D), dtype), ((T, H, D), dtype), ((H, T), torch.float32), ((H, T), torch.float32)])
        for v, x in zip(inputs.views, (prefix, suffix, plse, slse)):
            v.copy_(x)
        inputs.seal()
        hp, hs, hpl, hsl = inputs.views
        copy_in = Arena([((nbytes // 2,), torch.uint8)])
        copy_in.views[0].copy_(torch.randint(0, 256, (nbytes // 2,), dtype=torch.uint8, device="cuda"))
        copy_in.seal()
        fns = dict(merges(hp, hpl, hs, hsl), copy=lambda: dst.copy_(copy_in.views[0]))
        R = iterations(nbytes)
        row["graph_iterations"] = R
        producer_us = {}
        for name in impls:
            producer = copy_in.producer if name == "copy" else inputs.producer
            fns[name]()  # load / compile outside the capture
            producer()
            torch.cuda.synchronize()
            us, p = hot_us(producer, fns[name], R, graph_reps, producer_us.get(producer))
            producer_us[producer] = p
            row["hot_" + name + "_us"] = us
            row["hot_" + name + "_gbs"] = nbytes / (us * 1e-6) / 1e9
        row["hot_producer_us"] = producer_us.get(inputs.producer)
        del inputs, copy_in, hp, hs, hpl, hsl
    del prefix, suffix, out, src, dst
    return row


def host_cost(calls=1000, rounds=7):
    """Per-call host time of back-to-back launches on a tiny shape (1 token, 1 head), both
    implementations interleaved round by round; the minimum over rounds is the least disturbed
    (the median is reported too)."""
    T, H, D, dtype = 1, 1, 128, torch.bfloat16
    prefix, plse, suffix, slse = make(T, H, D, dtype, 1)
    out = torch.empty_like(prefix)
    impls = (("mla-gen (Python drop-in)", lambda: mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, None, 1)),
             ("triton baseline", lambda: triton_merge(out, prefix, plse, suffix, slse, None, 1)))
    samples = {name: [] for name, _ in impls}
    for name, fn in impls:
        for _ in range(100):
            fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in impls:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return {name: {"min": min(v), "median": statistics.median(v)} for name, v in samples.items()}


def new_threshold_cost(values=20):
    """Wall time of a call with a threshold value never seen before."""
    T, H, D, dtype = 4096, 16, 128, torch.bfloat16
    prefix, plse, suffix, slse = make(T, H, D, dtype, 2)
    out = torch.empty_like(prefix)
    res = {}
    for name, fn in (("mla-gen", lambda n: mla_gen.merge_attn_states(out, prefix, plse, suffix, slse, None, n)),
                     ("triton baseline", lambda n: triton_merge(out, prefix, plse, suffix, slse, None, n))):
        fn(1)
        torch.cuda.synchronize()
        times = []
        for n in range(1000, 1000 + values):
            t0 = time.perf_counter()
            fn(n)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        res[name] = statistics.median(times) * 1e3
    return res


DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a few shapes, for calibration")
    ap.add_argument("--out", default=".")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--host-only", action="store_true", help="only the host-cost measurements")
    ap.add_argument("--l2", choices=("cold", "hot", "both"), default="both",
                    help="cold: L2 flushed, eager (the original columns); hot: CUDA graph right after a "
                         "producer rewrote the inputs; both (default)")
    ap.add_argument("--graph-reps", type=int, default=30, help="hot: timed replays per graph (median)")
    ap.add_argument("--shapes", help="comma-separated dtype:TxHxD or dtype:TxHxD/2 (threshold T/2), "
                                     "e.g. bf16:613x16x128,float16:4096x16x128/2 (default: the full table)")
    ap.add_argument("--impls", default="mla-gen,copy,torch,triton",
                    help="comma-separated subset of mla-gen,copy,torch,triton")
    ap.add_argument("--no-host", action="store_true", help="skip the host-cost measurements at the end")
    args = ap.parse_args()
    if args.host_only:
        print("# host cost per call (us):", json.dumps(host_cost()))
        print("# new threshold value, wall ms per call incl. sync:", json.dumps(new_threshold_cost()))
        return
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    bf16 = torch.bfloat16
    if args.shapes:
        try:
            shapes = [(T, H, D, DTYPES[dt], half) for T, H, D, dt, half in parse_shapes(args.shapes)]
        except ValueError as e:
            sys.exit(f"bench.py: {e}")
    elif args.quick:
        shapes = [(T, H, D, bf16, th) for T in (1024, 8192, 32768) for H in (16, 128) for D in (128, 576)
                  for th in (False, True)]
    else:
        shapes = [(T, H, D, bf16, th) for T in (256, 613, 1024, 4096, 8192, 32768) for H in (16, 64, 128)
                  for D in (64, 80, 96, 128, 192, 256, 512) for th in (False, True)]
        shapes += [(T, H, 128, dt, th) for dt in (torch.float16, torch.float32)
                   for T in (256, 613, 1024, 4096, 8192, 32768) for H in (16, 64, 128) for th in (False, True)]
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    unknown = set(impls) - {"mla-gen", "copy", "torch", "triton"}
    if unknown or "mla-gen" not in impls:
        sys.exit(f"bench.py: --impls takes mla-gen (required), copy, torch, triton; not {sorted(unknown)}")
    rows = []
    prop = torch.cuda.get_device_properties(0)
    print(f"# {prop.name}, {prop.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}")
    print(header(args.l2))
    for (T, H, D, dt, th) in shapes:
        r = bench_shape(T, H, D, dt, th, args.reps, impls, args.l2, args.graph_reps)
        ratios(r)
        rows.append(r)
        (out_dir / "bench.json").write_text(json.dumps({"device": prop.name, "torch": torch.__version__,
                                                        "triton": triton.__version__, "l2": args.l2,
                                                        "rows": rows}, indent=1))
        print(line(r, args.l2), flush=True)
    for s in summary(rows):
        print("#", s)
    if args.no_host:
        return
    host = host_cost()
    thr = new_threshold_cost()
    print("# host cost per call (us):", json.dumps(host))
    print("# new threshold value, wall ms per call incl. sync:", json.dumps(thr))
    (out_dir / "bench.json").write_text(json.dumps({"device": prop.name, "torch": torch.__version__,
                                                    "triton": triton.__version__, "l2": args.l2, "rows": rows,
                                                    "host_cost_us": host, "new_threshold_ms": thr}, indent=1))


if __name__ == "__main__":
    main()

"""Benchmark of the K-way merge (merge_states) against the copy limit and against K-1 chained
in-place pairwise merges (what an engine without a K-way kernel runs), in one process.

Kernels come from $MLA_GEN_KERNELS (scripts/gpu-check.sh bench points it at the kernels of
tests/gpu-extra.toml). Method as in bench.py: median of >= 100 launches, CUDA events, L2 flushed
before each launch, fresh random data per shape.

Bytes moved: K-way = T*H*(K*(D*size + 4) + D*size + 4); the chain = (K-1) * T*H*(3*D*size + 12).
The target: the K-way merge is faster than the chain by at least the ratio of those bytes.

Usage: MLA_GEN_KERNELS=DIR python3 bench/bench_families.py [--out DIR] [--reps N] [--only kway|mask|fp8]
       [--fp8-shapes TxH ...] [--fp8-groups G ...] [--l2 cold|hot]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import mla_gen  # noqa: E402
from bench import time_ms  # noqa: E402
from peers import access_floor  # noqa: E402
from hot_l2 import Arena, hot_us, iterations  # noqa: E402

SHAPES = [(8192, 32, 128), (32768, 32, 128), (16384, 128, 128)]


def kernel_k(K):
    """The compile-time-K kernel's name for bf16 d128, or None (then the runtime-K one runs)."""
    for k in mla_gen.manifest.load()["kernels"]:
        fam, fields = mla_gen.manifest.family_of(k)
        v = k["variant"]
        if fam == "merge_states" and v["dtype"] == "bf16" and v["head_size"] == 128 and fields["num_states"] == K:
            return k["name"]
    return None


def bench(T, H, D, K, reps, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(T + H + K)
    v = torch.empty(T, K, H, D, device="cuda", dtype=dtype).uniform_(-4, 4, generator=g)
    s = torch.empty(T, K, H, device="cuda").uniform_(-10, 10, generator=g)
    out = torch.empty(T, H, D, device="cuda", dtype=dtype)
    out_lse = torch.empty(T, H, device="cuda")
    size = v.element_size()
    kway_bytes = T * H * (K * (D * size + 4) + D * size + 4)
    chain_bytes = (K - 1) * T * H * (3 * D * size + 12)
    # The chain's inputs as an engine holds them: K separate [T, H, D] states and [T, H] lse.
    states = [v[:, k].contiguous() for k in range(K)]
    lses = [s[:, k].contiguous() for k in range(K)]

    def chain():
        for k in range(1, K):
            mla_gen.merge_state_in_place(states[0], lses[0], states[k], lses[k])

    src = torch.empty(kway_bytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    row = {"T": T, "H": H, "D": D, "K": K, "dtype": "bf16", "kway_bytes": kway_bytes,
           "chain_bytes": chain_bytes, "kernel": kernel_k(K) or "runtime K"}
    for name, fn in (("merge_states", lambda: mla_gen.merge_states(v, s, out, out_lse)),
                     ("copy", lambda: dst.copy_(src)),
                     ("chain", chain)):
        row[name + "_us"] = time_ms(fn, reps) * 1e3
    row["merge_states_gbs"] = kway_bytes / row["merge_states_us"] / 1e3
    row["copy_gbs"] = kway_bytes / row["copy_us"] / 1e3
    row["pct_copy"] = 100 * row["merge_states_gbs"] / row["copy_gbs"]
    row["chain_gbs"] = chain_bytes / row["chain_us"] / 1e3
    row["speedup_vs_chain"] = row["chain_us"] / row["merge_states_us"]
    row["bytes_ratio"] = chain_bytes / kway_bytes
    del v, s, out, states, lses, src, dst
    return row


def bench_mask_lse(T, H, B, reps):
    """mask_empty_context_lse against a PyTorch composite (searchsorted + masked_fill, no sync)."""
    g = torch.Generator(device="cpu").manual_seed(T + B)
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64),
                     torch.sort(torch.randint(0, T + 1, (B - 1,), generator=g)).values,
                     torch.tensor([T])]).int().cuda()
    ctx = torch.where(torch.rand(B, generator=g) < 0.4, 0, torch.randint(1, 50, (B,), generator=g))
    csl = torch.cat([torch.zeros(1, dtype=torch.int64), ctx.cumsum(0)]).int().cuda()
    lse = torch.randn(H, T, device="cuda")
    tokens = torch.arange(T, device="cuda", dtype=torch.int32)

    def composite():
        req = torch.searchsorted(qsl, tokens, right=True) - 1
        empty = (csl[1:] == csl[:-1])[req.clamp(0, B - 1)] & (req >= 0) & (req < B)
        lse.masked_fill_(empty[None, :], float("-inf"))

    row = {"T": T, "H": H, "B": B,
           "mla-gen_us": time_ms(lambda: mla_gen.mask_empty_context_lse(lse, qsl, csl), reps) * 1e3,
           "torch_us": time_ms(composite, reps) * 1e3}
    return row


def bench_fp8(T, H, G, reps, D=128, floor=None, hot=False):
    """FP8 outputs from bf16 inputs: per-tensor scale, per-token-group scales (UE8M0 and plain
    float32), and the same merge writing bf16; each as a percent of the copy bandwidth measured
    in the same call (bytes read + written, its own byte count). With `floor` (libpeers_vllm.so,
    ctypes), also the access floors of both outputs' traffic: no merge, the same bytes moved.
    `hot`: each time (the copy's too) right after a kernel rewrote its inputs, in a CUDA graph
    (hot_l2.hot_us), as after attention; else cold L2 (bench.time_ms flushes it)."""
    g = torch.Generator(device="cuda").manual_seed(T + G)
    inputs = Arena([((T, H, D), torch.bfloat16), ((T, H, D), torch.bfloat16), ((H, T), torch.float32),
                    ((H, T), torch.float32)])
    prefix, suffix, plse, slse = inputs.views
    prefix.uniform_(-4, 4, generator=g)
    suffix.uniform_(-4, 4, generator=g)
    plse.uniform_(-10, 10, generator=g)
    slse.uniform_(-10, 10, generator=g)
    inputs.seal()
    out8 = torch.empty(T, H, D, device="cuda", dtype=torch.float8_e4m3fn)
    out16 = torch.empty_like(prefix)
    out_lse = torch.empty(H, T, device="cuda")
    scale = torch.tensor([0.05], device="cuda")
    scales = torch.empty(T, H * D // G, device="cuda")
    rows_bytes = T * H * (2 * D * 2 + 12)  # both inputs and three lse values per row
    kinds = {
        "fp8_tensor": (rows_bytes + T * H * D,
                       lambda: mla_gen.merge_attn_states(out8, prefix, plse, suffix, slse, out_lse, T,
                                                         output_scale=scale)),
        "fp8_group_ue8m0": (rows_bytes + T * H * (D + 4 * D // G),
                            lambda: mla_gen.merge_attn_states(out8, prefix, plse, suffix, slse, out_lse, T,
                                                              output_group_scales=scales, ue8m0=True)),
        "fp8_group": (rows_bytes + T * H * (D + 4 * D // G),
                      lambda: mla_gen.merge_attn_states(out8, prefix, plse, suffix, slse, out_lse, T,
                                                        output_group_scales=scales, ue8m0=False)),
        "bf16": (rows_bytes + T * H * D * 2,
                 lambda: mla_gen.merge_attn_states(out16, prefix, plse, suffix, slse, out_lse, T)),
    }
    if floor is not None:
        def fastest_floor(fn, out):
            # The fastest of peers.cu's three schedules, the scales' bytes left out.
            return lambda: min(time_ms(lambda: access_floor(fn, out, out_lse, prefix, plse, suffix, slse, s), reps)
                               for s in range(3))
        kinds["floor_fp8"] = (rows_bytes + T * H * D, fastest_floor(floor.access_floor_fp8, out8))
        kinds["floor_bf16"] = (rows_bytes + T * H * D * 2, fastest_floor(floor.access_floor, out16))
    copy_src = Arena([((rows_bytes // 2,), torch.uint8)])
    src = copy_src.views[0]
    dst = torch.empty_like(src)

    def us_of(fn, producer=inputs.producer):
        if not hot:
            return time_ms(fn, reps) * 1e3
        fn()  # loaded before the graph is captured
        return hot_us(producer, fn, iterations(rows_bytes), reps)[0]
    copy_us = us_of(lambda: dst.copy_(src), copy_src.producer)
    copy_gbs = 2 * src.numel() / copy_us / 1e3
    row = {"T": T, "H": H, "D": D, "G": G, "l2": "hot" if hot else "cold", "copy_us": copy_us,
           "copy_gbs": copy_gbs}
    for name, (nbytes, fn) in kinds.items():
        if hot and name.startswith("floor"):
            continue  # the floors time themselves, cold
        try:
            us = fn() * 1e3 if name.startswith("floor") else us_of(fn)
        except ValueError as e:  # the folder has no kernel for it (e.g. no group variant at this D)
            if not str(e).startswith("no generated"):
                raise
            continue
        row[name] = {"bytes": nbytes, "us": us, "pct_copy": 100 * nbytes / us / 1e3 / copy_gbs}
    return row


def candidates(reps, out):
    """Time every merge_states kernel of the folder (schedule candidates from
    specs/kway-candidates.toml) at SHAPES; K = its own, or 3 and 8 for runtime-K kernels."""
    rows = []
    dev = torch.cuda.current_device()
    for meta in mla_gen.manifest.load()["kernels"]:
        fam, fields = mla_gen.manifest.family_of(meta)
        if fam != "merge_states":
            continue
        for K in ([fields["num_states"]] if fields["num_states"] else [3, 8]):
            for T, H, D in SHAPES:
                v = torch.empty(T, K, H, D, device="cuda", dtype=torch.bfloat16).uniform_(-4, 4)
                s = torch.empty(T, K, H, device="cuda").uniform_(-10, 10)
                o = torch.empty(T, H, D, device="cuda", dtype=torch.bfloat16)
                ol = torch.empty(T, H, device="cuda")
                vts, vks, vhs, _ = v.stride()
                values = {"output": o, "output_lse": ol, "states": v, "states_lse": s, "num_tokens": T,
                          "num_heads": H, "output_token_stride": H * D, "output_head_stride": D,
                          "states_token_stride": vts, "states_state_stride": vks, "states_head_stride": vhs}
                if fields["num_states"] is None:
                    values["num_states"] = K
                us = time_ms(lambda: mla_gen.launch_kernel(meta["name"], values, device=dev), reps) * 1e3
                nbytes = T * H * (K * (D * 2 + 4) + D * 2 + 4)
                rows.append({"kernel": meta["name"], "K": K, "T": T, "H": H, "us": us, "gbs": nbytes / us / 1e3,
                             "regs": [a.get("resources", {}).get("registers") for a in meta["archs"]]})
                print(f"{meta['name']:>46} K={K:>2} T={T:>5} H={H:>3} {us:>8.1f} us {rows[-1]['gbs']:>6.0f} GB/s",
                      flush=True)
                del v, s, o, ol
    Path(out, "kway-candidates.json").write_text(json.dumps(rows, indent=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--candidates", action="store_true", help="time every merge_states schedule in the folder")
    ap.add_argument("--only", choices=("kway", "mask", "fp8"), action="append",
                    help="run only these tables (repeatable; default: all three)")
    ap.add_argument("--fp8-shapes", nargs="+", metavar="TxH[xD]", default=["8192x32", "32768x128"],
                    help="the FP8 table's shapes, D = 128 unless given (default: 8192x32 32768x128)")
    ap.add_argument("--fp8-groups", nargs="+", type=int, default=[16, 128], metavar="G",
                    help="the FP8 table's group sizes (default: 16 128)")
    ap.add_argument("--floor-lib", metavar="SO",
                    help="libpeers_vllm.so (bench/gpu/peers.sh run builds it): the FP8 table adds the "
                         "access floors of the FP8 and bf16 outputs' traffic (no merge, the same bytes)")
    ap.add_argument("--l2", choices=("cold", "hot"), default="cold",
                    help="the FP8 table: cold L2 (flushed before each launch), or hot (inputs just "
                         "rewritten by a kernel, launches replayed in a CUDA graph; no floors)")
    args = ap.parse_args()
    only = set(args.only or ("kway", "mask", "fp8"))
    if args.candidates:
        candidates(args.reps, args.out)
        return
    print(f"# {torch.cuda.get_device_name()}, kernels from {mla_gen.kernels_dir()}")
    print(f"{'K':>3} {'T':>6} {'H':>4} {'D':>4} {'MB':>7} | {'merge_states us':>15} {'GB/s':>6} {'%copy':>6} | "
          f"{'chain us':>9} {'x chain':>8} {'bytes ratio':>11} | kernel")
    rows = []
    for K in (4, 8, 16, 3) if "kway" in only else ():
        for T, H, D in SHAPES:
            r = bench(T, H, D, K, args.reps)
            rows.append(r)
            print(f"{K:>3} {T:>6} {H:>4} {D:>4} {r['kway_bytes'] / 1e6:>7.0f} | {r['merge_states_us']:>15.1f} "
                  f"{r['merge_states_gbs']:>6.0f} {r['pct_copy']:>5.1f}% | {r['chain_us']:>9.1f} "
                  f"{r['speedup_vs_chain']:>7.2f}x {r['bytes_ratio']:>11.2f} | {r['kernel']}", flush=True)
    print("\nmask_empty_context_lse (lse [H, T] float32, ~40% of requests without context)")
    print(f"{'T':>6} {'H':>4} {'B':>5} | {'mla-gen us':>10} | {'torch us':>9}")
    mask_rows = []
    for T, H, B in ((4096, 32, 16), (32768, 128, 256)) if "mask" in only else ():
        r = bench_mask_lse(T, H, B, args.reps)
        mask_rows.append(r)
        print(f"{T:>6} {H:>4} {B:>5} | {r['mla-gen_us']:>10.1f} | {r['torch_us']:>9.1f}", flush=True)
    print(f"\nFP8 outputs (bf16 in, per-tensor scale / per-token-group scales) vs the same merge writing bf16, "
          f"{args.l2} L2")
    floor = ctypes.CDLL(args.floor_lib) if args.floor_lib else None
    names = ("fp8_tensor", "fp8_group_ue8m0", "fp8_group", "bf16") + (("floor_fp8", "floor_bf16") if floor else ())
    print(f"{'T':>6} {'H':>4} {'D':>4} {'G':>4} | " + " | ".join(f"{n + ' us':>20} {'%copy':>6}" for n in names))
    group_rows = []
    fp8_shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.fp8_shapes]
    for T, H, *D in fp8_shapes if "fp8" in only else ():
        for G in args.fp8_groups:
            r = bench_fp8(T, H, G, args.reps, D=D[0] if D else 128, floor=floor, hot=args.l2 == "hot")
            group_rows.append(r)
            print(f"{T:>6} {H:>4} {r['D']:>4} {G:>4} | " + " | ".join(
                f"{r[n]['us']:>20.1f} {r[n]['pct_copy']:>5.1f}%" if n in r else f"{'-':>20} {'-':>6}"
                for n in names), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "bench-families.json").write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                                                 "rows": rows, "mask_lse": mask_rows,
                                                                 "fp8": group_rows}, indent=1))


if __name__ == "__main__":
    main()

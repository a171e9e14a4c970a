"""mla-gen beside the kernels engines run today, in one process, hot and cold (issue #21):

  mla-gen      the default kernels (head-major lse [H, T], vLLM's layout) through the Python package;
               --kernels LABEL=DIR adds kernel folders (other templates) under their label, the
               first one given is "the default" every ratio is taken against
  mla-gen-tm   token-major lse kernels (--tm-kernels LABEL=DIR), FlashInfer's layout
  flashinfer   FlashInfer's MergeState (headers of the flashinfer-python wheel, bench/peers/
               peers.cu): lse base 2, token-major; head sizes 64, 128, 256, 512 with H * D / vec <=
               1024 threads, f16 and bf16
  vllm-style   a baseline built the way vLLM's CUDA op works (peers.cu)
  copy         a device-to-device copy of the same byte count: the limit
  floor        no merge: the merge's bytes read and written with no arithmetic (peers.cu's
               access_floor, the fastest of its three schedules): what moving those bytes costs,
               so `faster peer / floor` estimates the most `x peer` a merge kernel could reach
               (to within a few percent: another schedule can move them faster)

Cold: L2 flushed (512 MB memset) before each launch, median of --reps launches timed with CUDA
events. Hot: hot_l2.hot_us, a CUDA graph of R x [producer, merge] minus R x [producer], where the
producer rewrites every input just before (attention having just written them).

Every implementation's output is checked once per shape against a float64 reference before it is
timed (a peer wired wrongly shows as `check failed`, not as a fast time).

Per shape and mode: each time (us), `x peer` = the faster peer's time / the default's time (> 1:
mla-gen faster), and a verdict: faster (>= 1.02), par (within 2%), SLOWER (< 0.98). The summary
adds, per mode and size class, the median of `x peer` that a merge running at the floor would
reach: where that estimate is under a target, a kernel body would have to beat the floor to
meet it.

Usage (on the GPU machine; bench/gpu/peers.sh builds and runs it):
  python3 bench/peers.py --peers DIR --kernels new=generated [--kernels base=DIR ...]
      [--tm-kernels new-tm=DIR] [--l2 cold|hot|both] [--shapes bf16:1024x16x128,...] [--out DIR]
  python3 bench/peers.py --profile --peers DIR --kernels ... --shapes ...   (one launch of
      each, after its producer, for Nsight Compute; no timing)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import mla_gen  # noqa: E402
from bench_table import iterations, parse_shapes  # noqa: E402
from hot_l2 import Arena, hot_us  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
FLOOR_SCHEDULES = ("floor-256x1", "floor-128x2", "floor-512x1")  # peers.cu's access_floor 0, 1, 2
LOG2E = 1.4426950408889634
HEADS = (64, 128, 192, 256, 512, 576)
TOKENS_HEADS = ((64, 16), (256, 8), (512, 32), (1024, 16), (2048, 64), (4096, 16), (8192, 32),
                (16384, 16), (32768, 128), (131072, 16))


def issue_shapes():
    """The table of issue #21: every D x (T, H) in bf16, then f16 and f32 at D = 128."""
    shapes = [(T, H, D, "bf16", False) for D in HEADS for T, H in TOKENS_HEADS]
    shapes += [(T, H, 128, dt, False) for dt in ("f16", "f32") for T, H in TOKENS_HEADS]
    return shapes


def access_floor(fn, out, out_lse, a, a_lse, b, b_lse, schedule):
    """One launch of peers.cu's access_floor or access_floor_fp8 (`fn`, from libpeers_vllm.so) on
    torch's current stream: contiguous [T, H, D] inputs a and b, T * H lse values each, `out` and
    `out_lse` written; `schedule` 0, 1 or 2. RuntimeError with the cudaError where it fails."""
    p = ctypes.c_void_p
    rc = fn(p(out.data_ptr()), p(out_lse.data_ptr()), p(a.data_ptr()), p(a_lse.data_ptr()), p(b.data_ptr()),
            p(b_lse.data_ptr()), ctypes.c_uint(a.shape[0] * a.shape[1]), ctypes.c_uint(a.shape[2] * a.element_size()),
            ctypes.c_uint(schedule), p(torch.cuda.current_stream().cuda_stream))
    if rc != 0:
        raise RuntimeError(f"{fn.__name__}: cudaError {rc}")


class Peers:
    """The two peer libraries, called through ctypes on torch's current stream."""

    def __init__(self, folder):
        folder = Path(folder)
        self.vllm = ctypes.CDLL(str(folder / "libpeers_vllm.so"))
        fi = folder / "libpeers_fi.so"
        self.fi = ctypes.CDLL(str(fi)) if fi.exists() else None

    @staticmethod
    def _call(fn, *args):
        rc = fn(*args)
        if rc != 0:
            raise RuntimeError(f"{fn.__name__}: cudaError {rc}")

    def flashinfer_fits(self, H, D, dtype):
        if self.fi is None or dtype == torch.float32 or D not in (64, 128, 256, 512):
            return False
        vec = max(16 // torch.empty((), dtype=dtype).element_size(), D // 32)
        return (D // vec) * H <= 1024

    def flashinfer(self, v_a, s_a, v_b, s_b, v_out, s_out):
        T, H, D = v_a.shape
        fn = getattr(self.fi, "fi_merge_state_" + ("bf16" if v_a.dtype == torch.bfloat16 else "f16"))
        p = ctypes.c_void_p
        self._call(fn, p(v_a.data_ptr()), p(s_a.data_ptr()), p(v_b.data_ptr()), p(s_b.data_ptr()),
                   p(v_out.data_ptr()), p(s_out.data_ptr()), ctypes.c_uint(T), ctypes.c_uint(H),
                   ctypes.c_uint(D), p(torch.cuda.current_stream().cuda_stream))

    @staticmethod
    def floor_fits(sh):
        row_bytes = sh.D * sh.prefix.element_size()
        return row_bytes % 32 == 0 and sh.T * sh.H * row_bytes // 16 < 2**32

    def access_floor(self, sh, schedule):
        access_floor(self.vllm.access_floor, sh.out, sh.out_lse_tm, sh.prefix, sh.plse_tm, sh.suffix, sh.slse_tm,
                     schedule)

    def vllm_style(self, out, out_lse, prefix, plse, suffix, slse, n):
        T, H, D = out.shape
        name = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}[out.dtype]
        p = ctypes.c_void_p
        self._call(getattr(self.vllm, "vllm_merge_" + name), p(out.data_ptr()), p(out_lse.data_ptr()),
                   p(prefix.data_ptr()), p(plse.data_ptr()), p(suffix.data_ptr()), p(slse.data_ptr()),
                   ctypes.c_uint(T), ctypes.c_uint(H), ctypes.c_uint(D), ctypes.c_uint(n),
                   p(torch.cuda.current_stream().cuda_stream))


def with_kernels(folder, fn):
    """fn run with $MLA_GEN_KERNELS = folder (the package reads it at every lookup)."""
    def call():
        os.environ["MLA_GEN_KERNELS"] = folder
        fn()
    return call


_flush = None


def cold_us(fn, reps):
    global _flush
    if _flush is None:
        _flush = torch.empty(512 << 20, dtype=torch.int8, device="cuda")
    for _ in range(3):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        _flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3


def reference(prefix, plse, suffix, slse):
    """float64 merge (no threshold) on [T, H] lse in base e: (out, lse)."""
    p, s = plse.double(), slse.double()
    m = torch.maximum(p, s)
    a, b = torch.exp(p - m), torch.exp(s - m)
    out = (prefix.double() * (a / (a + b))[..., None] + suffix.double() * (b / (a + b))[..., None])
    return out, torch.log(a + b) + m


class Shape:
    """One shape's buffers: the inputs in one arena (one producer launch rewrites them all), in every
    layout an implementation reads; the outputs each layout writes."""

    def __init__(self, T, H, D, dtype, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        prefix = torch.empty(T, H, D, device="cuda", dtype=dtype).uniform_(-4, 4, generator=g)
        suffix = torch.empty(T, H, D, device="cuda", dtype=dtype).uniform_(-4, 4, generator=g)
        plse = torch.empty(T, H, device="cuda").uniform_(-10, 10, generator=g)  # token-major, base e
        slse = torch.empty(T, H, device="cuda").uniform_(-10, 10, generator=g)
        f32 = torch.float32
        self.inputs = Arena([((T, H, D), dtype), ((T, H, D), dtype), ((H, T), f32), ((H, T), f32),
                             ((T, H), f32), ((T, H), f32), ((T, H), f32), ((T, H), f32)])
        (self.prefix, self.suffix, self.plse_hm, self.slse_hm, self.plse_tm, self.slse_tm,
         self.plse_b2, self.slse_b2) = self.inputs.views
        for v, x in zip(self.inputs.views, (prefix, suffix, plse.t(), slse.t(), plse, slse,
                                            plse * LOG2E, slse * LOG2E)):
            v.copy_(x)
        self.inputs.seal()
        # The reference on the first and last rows only (float64 of the largest shapes would not fit).
        self.rows = torch.cat([torch.arange(min(T, 2048)), torch.arange(max(T - 64, 0), T)]).unique().cuda()
        self.want, self.want_lse = reference(prefix[self.rows], plse[self.rows], suffix[self.rows], slse[self.rows])
        self.out = torch.empty_like(prefix)
        self.out_lse_hm = torch.empty(H, T, device="cuda")
        self.out_lse_tm = torch.empty(T, H, device="cuda")
        self.T, self.H, self.D, self.dtype = T, H, D, dtype
        self.nbytes = T * H * (3 * D * prefix.element_size() + 12)


def implementations(sh, args, peers):
    """name -> (call, how its output lse reads as [T, H] base e); only those that run this shape."""
    impls = {}
    T, H, D = sh.T, sh.H, sh.D
    for label, folder in args.kernels:
        impls[label] = (with_kernels(folder, lambda: mla_gen.merge_attn_states(
            sh.out, sh.prefix, sh.plse_hm, sh.suffix, sh.slse_hm, sh.out_lse_hm)), lambda: sh.out_lse_hm.t())
    for label, folder in args.tm_kernels:
        impls[label] = (with_kernels(folder, lambda: mla_gen.merge_attn_states(
            sh.out, sh.prefix, sh.plse_tm, sh.suffix, sh.slse_tm, sh.out_lse_tm, lse_layout="token_major")),
            lambda: sh.out_lse_tm)
    if peers.flashinfer_fits(H, D, sh.dtype):
        impls["flashinfer"] = (lambda: peers.flashinfer(sh.prefix, sh.plse_b2, sh.suffix, sh.slse_b2, sh.out,
                                                        sh.out_lse_tm), lambda: sh.out_lse_tm / LOG2E)
    if T * H * (D // (16 // sh.prefix.element_size())) < 2**32:
        impls["vllm-style"] = (lambda: peers.vllm_style(sh.out, sh.out_lse_hm, sh.prefix, sh.plse_hm, sh.suffix,
                                                        sh.slse_hm, T), lambda: sh.out_lse_hm.t())
    return impls


def check(sh, name, call, lse_of):
    """Run once on poisoned outputs; the error against the float64 reference, or why it failed."""
    sh.out.fill_(float("nan"))
    sh.out_lse_hm.fill_(float("nan"))
    sh.out_lse_tm.fill_(float("nan"))
    try:
        call()
        torch.cuda.synchronize()
    except (ValueError, LookupError, RuntimeError) as e:  # e.g. no such kernel in the folder (ArgumentError is one)
        return f"not run: {name}: {str(e).splitlines()[0][:120]}"
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[sh.dtype]
    err = ((sh.out[sh.rows].double() - sh.want).abs() / (sh.want.abs() + 1)).max().item()
    lse_err = (lse_of()[sh.rows].double() - sh.want_lse).abs().max().item()
    if not (err <= tol and lse_err <= 1e-4):
        return f"check failed: {name} max error {err:.3g} (tol {tol}), lse {lse_err:.3g}"
    return None


def bench_shape(T, H, D, dt, args, peers):
    dtype = DTYPES[dt]
    sh = Shape(T, H, D, dtype, seed=T * 7 + H * 3 + D)
    row = {"dtype": dt, "T": T, "H": H, "D": D, "bytes": sh.nbytes, "errors": []}
    impls = implementations(sh, args, peers)
    for name, (call, lse_of) in list(impls.items()):
        problem = check(sh, name, call, lse_of)
        if problem:
            row["errors"].append(problem)
            del impls[name]
    if args.profile:
        for name, (call, _) in impls.items():
            sh.inputs.producer()
            call()
        torch.cuda.synchronize()
        return row
    copy_src = Arena([((sh.nbytes // 2,), torch.uint8)])
    copy_src.views[0].copy_(torch.randint(0, 256, (sh.nbytes // 2,), dtype=torch.uint8, device="cuda"))
    copy_src.seal()
    copy_dst = torch.empty(sh.nbytes // 2, dtype=torch.uint8, device="cuda")
    impls["copy"] = (lambda: copy_dst.copy_(copy_src.views[0]), None)
    if peers.floor_fits(sh):
        for schedule, label in enumerate(FLOOR_SCHEDULES):
            impls[label] = (lambda schedule=schedule: peers.access_floor(sh, schedule), None)
    R = iterations(sh.nbytes)
    # Interleaved rounds, each in another order, and the median of each implementation's rounds:
    # one pass in a fixed order put the first implementation 5% behind the same kernels measured
    # later in the shape, cold, and 25% ahead, hot, at the run's first shape (runs 86-87).
    times = {}
    names = list(impls)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            call = impls[name][0]
            if args.l2 in ("cold", "both"):
                times.setdefault(f"cold_{name}_us", []).append(cold_us(call, args.reps))
            if args.l2 in ("hot", "both"):
                producer = copy_src.producer if name == "copy" else sh.inputs.producer
                call()
                producer()
                torch.cuda.synchronize()
                # The producer alone timed beside each implementation, not once per shape.
                times.setdefault(f"hot_{name}_us", []).append(hot_us(producer, call, R, args.graph_reps)[0])
    row.update({key: statistics.median(ts) for key, ts in times.items()})
    for mode in ("cold", "hot"):
        floors = [row[f"{mode}_{label}_us"] for label in FLOOR_SCHEDULES if f"{mode}_{label}_us" in row]
        if floors:
            row[f"{mode}_floor_us"] = min(floors)
        default = row.get(f"{mode}_{args.kernels[0][0]}_us")
        peer_times = [row[k] for k in (f"{mode}_flashinfer_us", f"{mode}_vllm-style_us") if k in row]
        if default and peer_times:
            row[f"{mode}_x_peer"] = min(peer_times) / default
        if default and f"{mode}_copy_us" in row:
            row[f"{mode}_pct_copy"] = 100 * row[f"{mode}_copy_us"] / default
        if peer_times and f"{mode}_floor_us" in row:
            # The x peer of a merge that took no longer than the floor (an estimate of the most any
            # kernel reaches: a schedule outside the floor's three can be faster).
            row[f"{mode}_x_peer_bound"] = min(peer_times) / row[f"{mode}_floor_us"]
            if f"{mode}_copy_us" in row:
                row[f"{mode}_floor_pct_copy"] = 100 * row[f"{mode}_copy_us"] / row[f"{mode}_floor_us"]
    del sh, copy_src, copy_dst
    torch.cuda.empty_cache()
    return row


def verdict(x):
    return "-" if x is None else ("faster" if x >= 1.02 else "par" if x >= 0.98 else "SLOWER")


def print_row(row, names, l2):
    head = f"{row['dtype']:>5} {row['T']:>6} {row['H']:>4} {row['D']:>4} {row['bytes'] / 1e6:>8.1f}"
    parts = [head]
    for mode in ("cold", "hot"):
        if l2 not in (mode, "both"):
            continue
        times = " ".join(f"{row[f'{mode}_{n}_us']:>8.2f}" if f"{mode}_{n}_us" in row else f"{'-':>8}" for n in names)
        x = row.get(f"{mode}_x_peer")
        parts.append(f"| {times} | {x if x is None else round(x, 3)!s:>6} {verdict(x):>6}")
    print(" ".join(parts) + ("  " + "; ".join(row["errors"]) if row["errors"] else ""), flush=True)


def summary(rows, l2):
    lines = []
    for mode in ("cold", "hot"):
        if l2 not in (mode, "both"):
            continue
        for label, keep in (("<= 64 MB", lambda r: r["bytes"] <= 64e6), ("> 64 MB", lambda r: r["bytes"] > 64e6)):
            xs = [r[f"{mode}_x_peer"] for r in rows if f"{mode}_x_peer" in r and keep(r)]
            if xs:
                slower = sum(x < 0.98 for x in xs)
                lines.append(f"{mode}, {label}: x peer median {statistics.median(xs):.3f}, min {min(xs):.3f}, "
                             f"{slower} of {len(xs)} shapes SLOWER than a peer")
            bound = [r[f"{mode}_x_peer_bound"] for r in rows if f"{mode}_x_peer_bound" in r and keep(r)]
            if bound:
                lines.append(f"{mode}, {label}: a merge at the floor would be x peer median "
                             f"{statistics.median(bound):.3f}, min {min(bound):.3f}")
        big = [r[f"{mode}_pct_copy"] for r in rows if f"{mode}_pct_copy" in r and r["bytes"] > 64e6]
        if big:
            lines.append(f"{mode}, > 64 MB: % of copy min {min(big):.1f}, median {statistics.median(big):.1f}")
        floor = [r[f"{mode}_floor_pct_copy"] for r in rows if f"{mode}_floor_pct_copy" in r and r["bytes"] > 64e6]
        if floor:
            lines.append(f"{mode}, > 64 MB: the floor at % of copy min {min(floor):.1f}, median "
                         f"{statistics.median(floor):.1f}")
    return lines


def labelled(items, what):
    out = []
    for item in items:
        if "=" not in item:
            sys.exit(f"peers.py: {what} takes LABEL=DIR, not `{item}`")
        label, folder = item.split("=", 1)
        if not (Path(folder) / "manifest.json").is_file():
            sys.exit(f"peers.py: {what} {label}: {folder} holds no manifest.json")
        out.append((label, str(Path(folder).resolve())))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", required=True, help="folder holding libpeers_vllm.so (and libpeers_fi.so)")
    ap.add_argument("--kernels", action="append", default=[], metavar="LABEL=DIR",
                    help="head-major kernel folder; the first is the default the ratios use")
    ap.add_argument("--tm-kernels", action="append", default=[], metavar="LABEL=DIR",
                    help="token-major kernel folder")
    ap.add_argument("--shapes", help="dtype:TxHxD,... (default: the issue's table)")
    ap.add_argument("--l2", choices=("cold", "hot", "both"), default="both")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--graph-reps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per shape (median)")
    ap.add_argument("--profile", action="store_true", help="launch each once per shape (for ncu), no timing")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    if not args.kernels:
        sys.exit("peers.py: give at least one --kernels LABEL=DIR (the default kernels)")
    args.kernels = labelled(args.kernels, "--kernels")
    args.tm_kernels = labelled(args.tm_kernels, "--tm-kernels")
    try:
        shapes = parse_shapes(args.shapes) if args.shapes else issue_shapes()
    except ValueError as e:
        sys.exit(f"peers.py: {e}")
    peers = Peers(args.peers)
    names = [k for k, _ in args.kernels] + [k for k, _ in args.tm_kernels] + ["flashinfer", "vllm-style", "copy", "floor"]
    prop = torch.cuda.get_device_properties(0)
    print(f"# {prop.name}, {prop.multi_processor_count} SMs, torch {torch.__version__}; default = "
          f"{args.kernels[0][0]}; FlashInfer {'built' if peers.fi else 'MISSING'}")
    print(f"# dtype      T    H    D       MB | {' '.join(f'{n[:8]:>8}' for n in names)} | x peer verdict"
          + ("  (cold, then hot)" if args.l2 == "both" else f"  ({args.l2})"))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    if not args.profile:
        # Warm-up, discarded: the first shape measured once before the table, so that no row is
        # timed while clocks and caches settle.
        bench_shape(*shapes[0][:4], args, peers)
    for T, H, D, dt, _ in shapes:
        try:
            row = bench_shape(T, H, D, dt, args, peers)
        except torch.cuda.OutOfMemoryError:
            row = {"dtype": dt, "T": T, "H": H, "D": D, "bytes": 0, "errors": ["out of memory"]}
            torch.cuda.empty_cache()
        rows.append(row)
        if not args.profile:
            print_row(row, names, args.l2)
            (out_dir / "peers.json").write_text(json.dumps(
                {"device": prop.name, "torch": torch.__version__, "default": args.kernels[0][0],
                 "kernels": args.kernels, "tm_kernels": args.tm_kernels, "l2": args.l2, "rows": rows}, indent=1))
        elif row["errors"]:
            print(row["errors"])
    if not args.profile:
        for line in summary(rows, args.l2):
            print("#", line)
    failed = [e for r in rows for e in r["errors"] if not e.startswith("not run")]
    if failed:
        print(f"# {len(failed)} checks failed", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

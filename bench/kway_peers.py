"""The K-way merge beside FlashInfer's MergeStates and a vLLM-style chunk loop, in one process,
hot and cold L2 (issue #34, items 4 and 5), and the in-place merge beside FlashInfer's
MergeStateInPlace:

  shipped      what mla_gen.flashinfer.merge_states runs from the kernel folder given with --shipped
               (bench/gpu/kway.sh: the default spec's kernels): the package's own selection and
               launch path (the kernel fixed at the call's K where the folder has one, else the
               runtime-K kernel; the row names it), checked bit for bit against the function's
               result; with --shipped it is the default the ratios and the summary use
  shipped-name with --by-name: the kernel `shipped` selects, launched by name into the same
               buffers (the kernel's time apart from the call path's)
  <label>      mla-gen's runtime-K kernel (`num_states = "runtime"`) of each kernel folder given
               with --kernels LABEL=DIR (candidates: other templates or schedules; without
               --shipped the first is the default), FlashInfer's lse (base 2,
               token-major), launched by name (mla_gen.launch_kernel); <label>-k: the folder's
               kernel for this K fixed at compile time, where it has one
  flashinfer   FlashInfer's MergeStates (and MergeStateInPlace), from the flashinfer-python
               wheel's headers (bench/peers/peers.cu, libpeers_fi.so)
  loop         what an engine without a K-way merge runs (vLLM's chunked prefill): K - 1 launches
               of a pairwise merge over K separate [T, H, D] states with [H, T] lse, the running
               result ping-ponging between two buffers. The pairwise merge is peers.cu's
               "vLLM-style" kernel (written here the way vLLM's CUDA op works), not vLLM's own
  copy         a device-to-device copy of the K-way merge's bytes (read + written): the limit

Cold: every implementation captured in a CUDA graph (the loop's K - 1 launches in one), L2
flushed (512 MB memset; --flush read: read instead) before each replay, median of --reps replays
timed with CUDA events, after one series of the copy's thrown away (the first series timed ran
slow: session 29).
Hot: hot_l2.hot_us, graphs of R x [producer, X] minus R x [producer], the producer rewriting every
input just before X. Rounds interleaved in rotating order, median per implementation.

Each implementation's output is checked in every placement against a float64 reference on the
first tokens before it is timed (a wrongly wired peer shows as `check failed`, not as a time; the loop's
bound allows its K - 1 roundings to bf16, as a timing baseline). The
`check` table first runs the semantic cases of kway_check.py (docs/SEMANTICS.md: +inf, NaN, empty
rows, K = 1, padded strides, every element written, no output lse) on every kernel of the
--check-kernels folder, every one of the --shipped folder and the bf16 base-2 kernels of each
--kernels folder but --unchecked ones.

The `family` table (bench/gpu/families.sh) is the peer table of the other families: states 1, 2,
3, 4, 8 and 16 (the default, FlashInfer, the loop) and the in-place merge with
and without a [T] mask, at six decode and prefill shapes.

Per shape: times (us) and the ratios `x fi` = FlashInfer's time / the kernel's (>= 1: mla-gen
at least as fast) and `x loop` = the loop's time / the default's. JSON in --out/kway.json.

With ``--profile K:TxHxD,...`` nothing is timed: each shape's default and FlashInfer run twice,
each right after its producer (as hot), for Nsight Compute (bench/gpu/kway.sh, KWAY_NCU=1).

  python3 bench/kway_peers.py --peers DIR [--shipped DIR] [--kernels new=DIR ...] [--no-loop]
      [--inplace [LABEL=]DIR ...] [--check-kernels DIR] [--unchecked LABEL]
      [--tables check,candidates,states,inplace,family,family-inplace,grid] [--candidate-shapes K:TxHxD,...]
      [--cap SECONDS] [--placements N] [--out DIR]   (bench/gpu/kway.sh run: the lead's one command)
  python3 bench/kway_peers.py --peers DIR --shipped DIR --profile 5:256x16x128,2:2048x16x128
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import mla_gen  # noqa: E402
import mla_gen.flashinfer as mfi  # noqa: E402
from mla_gen import _torch  # noqa: E402
from bench_table import iterations  # noqa: E402
from hot_l2 import Arena, hot_us  # noqa: E402
from kway_check import check_folder  # noqa: E402
from kway_tables import (CANDIDATE_SHAPES, FAMILY_INPLACE, FAMILY_SHAPES, GRID_HD, GRID_K, GRID_T,  # noqa: E402
                         INPLACE_SHAPES, SMALL_SHAPES, STATES_SHAPES, k_tag, parse_shapes, summary)

LOG2E = 1.4426950408889634
BF16 = torch.bfloat16


def by_name(path, name, out, out_lse, v, s, runtime_k):
    """A call that launches kernel `name` of folder `path` by name (mla_gen.launch_kernel)."""
    values = {"output": out, "output_lse": out_lse, "states": v, "states_lse": s, "num_tokens": v.shape[0],
              "num_heads": v.shape[2], "output_token_stride": out.stride(0), "output_head_stride": out.stride(1),
              "states_token_stride": v.stride(0), "states_state_stride": v.stride(1),
              "states_head_stride": v.stride(2)}
    if runtime_k:
        values["num_states"] = v.shape[1]

    def call():
        os.environ["MLA_GEN_KERNELS"] = path
        mla_gen.launch_kernel(name, values)
    return call


class Folder:
    """A kernel folder: its bf16, base-2 merge_states kernels by (head size, K; None = runtime)."""

    def __init__(self, label, path):
        self.label, self.path = label, str(Path(path).resolve())
        manifest = json.loads(Path(path, "manifest.json").read_text())
        self.kway = {}
        for k in manifest["kernels"]:
            v = k["variant"]
            fam = v["family"]
            if not (isinstance(fam, dict) and "merge_states" in fam):
                continue
            if v["dtype"] == "bf16" and v.get("lse_base") == "2" and v["output_lse"]:
                self.kway.setdefault((v["head_size"], fam["merge_states"]["num_states"]), k["name"])

    def launcher(self, D, K, out, out_lse, v, s, fixed):
        name = self.kway.get((D, K if fixed else None))
        return None if name is None else by_name(self.path, name, out, out_lse, v, s, runtime_k=not fixed)

    def impls(self, sh, fixed_too):
        """label -> call: the runtime-K kernel, and with `fixed_too` the kernel fixed at K."""
        calls = {self.label: self.launcher(sh.D, sh.K, sh.out, sh.out_lse, sh.v, sh.s2, fixed=False)}
        if fixed_too:
            calls[self.label + "-k"] = self.launcher(sh.D, sh.K, sh.out, sh.out_lse, sh.v, sh.s2, fixed=True)
        return {label: call for label, call in calls.items() if call}


class Shipped:
    """mla_gen.flashinfer.merge_states's launch into the shape's buffers: its kind, options and
    call path (_torch._call: selection, checks, plan), the kernels of `path`."""

    label = "shipped"

    def __init__(self, path, also_by_name=False):
        self.path = str(Path(path).resolve())
        self.also_by_name = also_by_name
        manifest = json.loads(Path(path, "manifest.json").read_text())
        self.runtime_k = {k["name"]: any(p["name"] == "num_states" for p in k["params"]) for k in manifest["kernels"]}

    def _args(self, sh):
        os.environ["MLA_GEN_KERNELS"] = self.path
        return mfi._STATES, mfi._OPTIONS[1:], (sh.out, sh.out_lse, sh.v, sh.s2), ()

    def kernel(self, sh):
        """The kernel the call launches (selection, then size rule and specializations)."""
        return _torch._prepare(*self._args(sh))[0].name

    def impls(self, sh, fixed_too):
        """The call path; with by_name also the kernel it selects launched by name (shipped-name:
        the kernel's own time, apart from the path's)."""
        calls = {self.label: lambda: _torch._call(*self._args(sh))}
        if self.also_by_name:
            try:
                name = self.kernel(sh)
            except (LookupError, ValueError):  # no kernel serves the call: its check says so
                return calls
            calls[self.label + "-name"] = by_name(self.path, name, sh.out, sh.out_lse, sh.v, sh.s2,
                                                  runtime_k=self.runtime_k[name])
        return calls

    def differs_from_the_function(self, sh):
        """None, or how mla_gen.flashinfer.merge_states's own result differs from the one the
        last call left in the shape's outputs (bit for bit: the same kernel on the same inputs)."""
        out, lse = mfi.merge_states(sh.v, sh.s2)
        if torch.equal(out, sh.out) and torch.equal(lse, sh.out_lse):
            return None
        return "check failed: shipped: mla_gen.flashinfer.merge_states's result differs from the timed call's"


class FlashInfer:
    """libpeers_fi.so's MergeStates / MergeStateInPlace and libpeers_vllm.so's pairwise merge."""

    def __init__(self, folder):
        self.fi = ctypes.CDLL(str(Path(folder, "libpeers_fi.so")))
        self.vllm = ctypes.CDLL(str(Path(folder, "libpeers_vllm.so")))

    @staticmethod
    def _ok(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: cudaError {rc}")

    def merge_states(self, v, s, out, out_lse):
        T, K, H, D = v.shape
        p = ctypes.c_void_p
        self._ok(self.fi.fi_merge_states_bf16(
            p(v.data_ptr()), p(s.data_ptr()), p(out.data_ptr()), p(out_lse.data_ptr()), ctypes.c_uint(K),
            ctypes.c_uint(T), ctypes.c_uint(H), ctypes.c_uint(D), p(torch.cuda.current_stream().cuda_stream)),
            "MergeStates")

    def merge_state_in_place(self, v, s, v_other, s_other, mask=None):
        T, H, D = v.shape
        p = ctypes.c_void_p
        self._ok(self.fi.fi_merge_state_in_place_bf16(
            p(v.data_ptr()), p(s.data_ptr()), p(v_other.data_ptr()), p(s_other.data_ptr()), ctypes.c_uint(T),
            ctypes.c_uint(H), ctypes.c_uint(D), p(None if mask is None else mask.data_ptr()),
            p(torch.cuda.current_stream().cuda_stream)),
            "MergeStateInPlace")

    def pair(self, out, out_lse, prefix, plse, suffix, slse):
        T, H, D = out.shape
        p = ctypes.c_void_p
        self._ok(self.vllm.vllm_merge_bf16(p(out.data_ptr()), p(out_lse.data_ptr()), p(prefix.data_ptr()),
                                           p(plse.data_ptr()), p(suffix.data_ptr()), p(slse.data_ptr()),
                                           ctypes.c_uint(T), ctypes.c_uint(H), ctypes.c_uint(D), ctypes.c_uint(T),
                                           p(torch.cuda.current_stream().cuda_stream)), "vllm-style merge")


_flush = None
# --flush: how cold_us empties L2 before each replay. "memset" (the default, as every table of this
# repo) writes the 512 MB buffer, so L2 is left full of dirty lines the kernel's misses must write
# back; "read" reads it instead (every earlier dirty line written back during the flush), so the
# kernel meets a clean L2, as Nsight Compute's --cache-control all leaves it (session 31: the
# one repeated cold K-way loss, 3:256x32x256, is equal under ncu).
FLUSH_MODE = "memset"


def graph_of(fn):
    """fn captured in a CUDA graph (run once first: kernels loaded before the capture)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def cold_us(graph, reps):
    global _flush
    if _flush is None:
        _flush = torch.empty(512 << 20, dtype=torch.int8, device="cuda")
    for _ in range(2):
        graph.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if FLUSH_MODE == "read":
            _flush.view(torch.int32).max()
        else:
            _flush.zero_()
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3


class KwayShape:
    """Inputs of one shape: [T, K, H, D] states and [T, K, H] base-2 lse in one arena (FlashInfer
    and mla-gen read the same buffers), the loop's K states [T, H, D] and base-e lse [H, T] in
    another, a copy source of the K-way merge's bytes in a third; outputs; the reference."""

    def __init__(self, T, K, H, D, seed, loop=True):
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.T, self.K, self.H, self.D = T, K, H, D
        f32 = torch.float32
        self.inputs = Arena([((T, K, H, D), BF16), ((T, K, H), f32)])
        self.v, self.s2 = self.inputs.views
        self.v.uniform_(-4, 4, generator=g)
        self.s2.uniform_(-10, 10, generator=g).mul_(LOG2E)
        self.inputs.seal()
        self.loop_inputs = None
        if loop and K >= 2:
            self.loop_inputs = Arena([((T, H, D), BF16)] * K + [((H, T), f32)] * K)
            views = self.loop_inputs.views
            self.states, self.lses = views[:K], views[K:]
            for k in range(K):
                self.states[k].copy_(self.v[:, k])
                self.lses[k].copy_(self.s2[:, k].t() / LOG2E)
            self.loop_inputs.seal()
            self.loop_tmp = (torch.empty(T, H, D, dtype=BF16, device="cuda"), torch.empty(H, T, device="cuda"))
            self.loop_lse = torch.empty(H, T, device="cuda")
        self.nbytes = T * H * (K * (2 * D + 4) + 2 * D + 4)
        self.copy_src = Arena([((self.nbytes // 2,), torch.uint8)])
        self.copy_src.seal()
        self.copy_dst = torch.empty(self.nbytes // 2, dtype=torch.uint8, device="cuda")
        self.out = torch.empty(T, H, D, dtype=BF16, device="cuda")
        self.out_lse = torch.empty(T, H, device="cuda")
        n = min(T, 48)
        x = self.s2[:n].double()
        m = x.max(dim=1).values
        w = torch.exp2(x - m[:, None])
        self.want = (self.v[:n].double() * w[..., None]).sum(1) / w.sum(1)[..., None]
        self.want_lse = torch.log2(w.sum(1)) + m

    def loop(self, fi):
        """K - 1 pairwise merges; the last writes self.out and self.loop_lse (base e, [H, T])."""
        bufs = ((self.out, self.loop_lse), self.loop_tmp)
        prev = (self.states[0], self.lses[0])
        for i in range(1, self.K):
            dst = bufs[(self.K - 1 - i) % 2]
            fi.pair(dst[0], dst[1], prev[0], prev[1], self.states[i], self.lses[i])
            prev = dst

    def check(self, name, call, lse2, roundings=1):
        """None, or why `call`'s output differs from the reference (outputs poisoned first). A result
        rounded to bf16 `roundings` times (the loop: K - 1, its running result stored between
        launches) may differ by one more rounding each: 2^-7 of a value below 4 (|want| + 1 >= 1)."""
        self.out.fill_(float("nan"))
        self.out_lse.fill_(float("nan"))
        if self.loop_inputs is not None:
            self.loop_lse.fill_(float("nan"))
        try:
            call()
            torch.cuda.synchronize()
        except (ValueError, LookupError, RuntimeError) as e:
            return f"not run: {name}: {str(e).splitlines()[0][:120]}"
        n = self.want.shape[0]
        err = ((self.out[:n].double() - self.want).abs() / (self.want.abs() + 1)).max().item()
        lse_err = (lse2()[:n].double() - self.want_lse).abs().max().item()
        if not (err <= 1.6e-2 + (roundings - 1) * 2.0 ** -7 and lse_err <= 1e-3):
            return f"check failed: {name}: max error {err:.3g}, lse {lse_err:.3g}"
        return None


def implementations(sh, folders, fi, fixed_too, loop=True):
    """name -> (call, producer, base-2 [T, H] lse of its result)."""
    impls = {}
    for f in folders:
        for label, call in f.impls(sh, fixed_too).items():
            impls[label] = (call, sh.inputs.producer, lambda: sh.out_lse)
    impls["flashinfer"] = (lambda: fi.merge_states(sh.v, sh.s2, sh.out, sh.out_lse), sh.inputs.producer,
                           lambda: sh.out_lse)
    if loop and sh.loop_inputs is not None:
        impls["loop"] = (lambda: sh.loop(fi), sh.loop_inputs.producer, lambda: sh.loop_lse.t() * LOG2E)
    return impls


def time_all(impls, copy, nbytes, args):
    """{name: {"cold": us, "hot": us}}: interleaved rounds, median each."""
    graphs = {name: graph_of(call) for name, (call, _, _) in impls.items()}
    graphs["copy"] = graph_of(copy[0])
    producers = {name: p for name, (_, p, _) in impls.items()} | {"copy": copy[1]}
    calls = {name: c for name, (c, _, _) in impls.items()} | {"copy": copy[0]}
    R = iterations(nbytes)
    names = list(graphs)
    # A series thrown away first: the first cold series after the checks and captures ran 13% slow
    # at merges of 1-5 GB whichever graph it timed, the same graph's next series not (session 29,
    # bench/kway_graphs.py); with two rounds that series was half of the first graph's median.
    cold_us(graphs["copy"], args.reps)
    times = {}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times.setdefault((name, "cold"), []).append(cold_us(graphs[name], args.reps))
            producers[name]()
            calls[name]()
            torch.cuda.synchronize()
            times.setdefault((name, "hot"), []).append(hot_us(producers[name], calls[name], R, args.graph_reps)[0])
    del graphs
    out = {}
    for (name, mode), ts in times.items():
        out.setdefault(name, {})[mode] = statistics.median(ts)
    return out


def time_beside_copy(impls, nbytes, args):
    """time_all with a device copy of `nbytes` (half read, half written) as its `copy` row."""
    src = Arena([((nbytes // 2,), torch.uint8)])
    src.seal()
    dst = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    return time_all(impls, (lambda: dst.copy_(src.views[0]), src.producer), nbytes, args)


# --placements: placement p (p >= 1) allocates this many bytes x p before the shape's buffers,
# from an emptied cache, so that they lie on other pages (session 27: at 256 x 32 x 256 the same
# kernel took 8.45 us in one table and 10.7 us in another, FlashInfer 9.44 us in both).
PLACEMENT_PAD_BYTES = 6 << 20


def bench_kway(tag, K, T, H, D, folders, fi, args, fixed_too=True, loop=True):
    """One shape's row: checks, then times (us) per implementation and mode, the median over
    --placements placements of the buffers (each placement's own in row["placements"])."""
    row = {"table": tag, "K": K, "T": T, "H": H, "D": D, "errors": []}
    per_placement, failed = [], set()
    for p in range(args.placements):
        if args.placements > 1:
            torch.cuda.empty_cache()
        pad = torch.empty(p * PLACEMENT_PAD_BYTES, dtype=torch.uint8, device="cuda")
        sh = KwayShape(T, K, H, D, seed=T * 7 + K * 5 + H * 3 + D, loop=loop)
        row["bytes"] = sh.nbytes
        impls = implementations(sh, folders, fi, fixed_too, loop)
        # Every placement runs the same steps before its timing (session 28: with the checks in
        # placement 0 only, the call path alone was 5% slower cold in the others); a failure is
        # recorded once and that implementation left out of every placement.
        for name, (call, _, lse2) in list(impls.items()):
            problem = sh.check(name, call, lse2, roundings=K - 1 if name == "loop" else 1)
            if name == Shipped.label and not problem:
                kernel = folders[0].kernel(sh)
                if row.setdefault("kernel", kernel) != kernel:  # selection does not look at addresses
                    problem = f"check failed: shipped: placement {p} selects {kernel}, not {row['kernel']}"
                problem = problem or folders[0].differs_from_the_function(sh)
            if problem and name not in failed:
                row["errors"].append(problem)
                failed.add(name)
            if name in failed:
                del impls[name]
        copy = (lambda: sh.copy_dst.copy_(sh.copy_src.views[0]), sh.copy_src.producer)
        per_placement.append(time_all(impls, copy, sh.nbytes, args))
        del sh, pad
    row["us"] = {name: {mode: statistics.median(us[name][mode] for us in per_placement if name in us)
                        for mode in ("cold", "hot")} for name in per_placement[0]}
    if args.placements > 1:
        row["placements"] = per_placement
    ratios(row, folders[0].label)
    return row


def ratios(row, default):
    us = row["us"]
    row["x_fi"], row["x_loop"] = {}, {}
    for mode in ("cold", "hot"):
        fi_us = us.get("flashinfer", {}).get(mode)
        for name, t in us.items():
            if name not in ("flashinfer", "loop", "copy") and fi_us:
                row["x_fi"].setdefault(name, {})[mode] = fi_us / t[mode]
        if "loop" in us and default in us:
            row["x_loop"][mode] = us["loop"][mode] / us[default][mode]
        if "copy" in us and default in us:
            row.setdefault("pct_copy", {})[mode] = 100 * us["copy"][mode] / us[default][mode]


def print_kway(row, default):
    head = f"K={row['K']:>2} T={row['T']:>5} H={row['H']:>2} D={row['D']:>3} {row['bytes'] / 1e6:>8.1f}MB"
    if "kernel" in row:
        head += f" [{k_tag(row['kernel'])}]"
    parts = [head]
    for mode in ("cold", "hot"):
        us = {n: t[mode] for n, t in row["us"].items()}
        nan = float("nan")
        xs = " ".join(f"{n}:{x[mode]:.3f}" for n, x in row["x_fi"].items())
        loop = row["x_loop"].get(mode)
        parts.append(f"| {mode} {default} {us.get(default, nan):7.2f}us fi {us.get('flashinfer', nan):7.2f}us "
                     f"copy {us.get('copy', nan):7.2f}us x fi {xs}" + (f" x loop {loop:.2f}" if loop else ""))
    print(" ".join(parts) + ("  " + "; ".join(row["errors"]) if row["errors"] else ""), flush=True)


def inplace_inputs(T, H, D):
    """The in-place merge's inputs in one arena: state [T, H, D] and its lse, other and its lse,
    a [T] uint8 mask with a quarter of the tokens 0; seeded by the shape."""
    g = torch.Generator(device="cuda").manual_seed(T + H + D)
    inputs = Arena([((T, H, D), BF16), ((T, H), torch.float32), ((T, H, D), BF16), ((T, H), torch.float32),
                    ((T,), torch.uint8)])
    v, s, vo, so, keep = inputs.views
    for x in (v, vo):
        x.uniform_(-4, 4, generator=g)
    for x in (s, so):
        x.uniform_(-10, 10, generator=g)
    keep.copy_(torch.rand(T, generator=g, device="cuda") >= 0.25)
    inputs.seal()
    return inputs


def inplace_calls(folders, fi, v, s, vo, so, mask):
    """label -> call: each (label, folder)'s merge through mla_gen.flashinfer's call path, then
    MergeStateInPlace (`flashinfer`)."""
    def ours(folder):
        def call():
            os.environ["MLA_GEN_KERNELS"] = folder
            mfi.merge_state_in_place(v, s, vo, so, mask=mask)
        return call
    calls = {label: ours(folder) for label, folder in folders}
    calls["flashinfer"] = lambda: fi.merge_state_in_place(v, s, vo, so, mask)
    return calls


def bench_inplace(T, H, D, folders, fi, args, table="inplace", mask=False):
    """The in-place merge of each (label, folder) of `folders` beside MergeStateInPlace; with
    `mask`, the inputs' [T] mask (a quarter of the tokens 0: left as they are) given to all."""
    inputs = inplace_inputs(T, H, D)
    v, s, vo, so, keep = inputs.views
    nbytes = T * H * (3 * 2 * D + 12) + (T if mask else 0)
    row = {"table": table, "T": T, "H": H, "D": D, "mask": mask, "bytes": nbytes, "errors": []}
    impls = {label: (call, inputs.producer, None)
             for label, call in inplace_calls(folders, fi, v, s, vo, so, keep if mask else None).items()}
    n = min(T, 48)
    x = torch.stack([s[:n], so[:n]], 1).double()
    m = x.max(1).values
    w = torch.exp2(x - m[:, None])
    want = (torch.stack([v[:n], vo[:n]], 1).double() * w[..., None]).sum(1) / w.sum(1)[..., None]
    if mask:
        want = torch.where(keep[:n, None, None].bool(), want, v[:n].double())
    for name, (call, _, _) in list(impls.items()):
        inputs.producer()
        try:
            call()
            torch.cuda.synchronize()
            err = ((v[:n].double() - want).abs() / (want.abs() + 1)).max().item()
            if err > 1.6e-2:
                row["errors"].append(f"check failed: {name}: max error {err:.3g}")
                del impls[name]
        except (ValueError, LookupError, RuntimeError) as e:
            row["errors"].append(f"not run: {name}: {str(e).splitlines()[0][:120]}")
            del impls[name]
    row["us"] = time_beside_copy(impls, nbytes, args)
    us = row["us"]
    row["x_fi"] = {label: {mode: us["flashinfer"][mode] / us[label][mode] for mode in ("cold", "hot")}
                   for label, _ in folders if label in us and "flashinfer" in us}
    nan = float("nan")
    print(f"in-place{' mask' if mask else ''} T={T:>5} H={H:>2} D={D:>3} {nbytes / 1e6:>7.1f}MB | " + " | ".join(
        f"{mode} {folders[0][0]} {us.get(folders[0][0], {}).get(mode, nan):7.2f}us fi "
        f"{us.get('flashinfer', {}).get(mode, nan):7.2f}us copy {us['copy'][mode]:7.2f}us x fi "
        + " ".join(f"{label}:{x[mode]:.3f}" for label, x in row["x_fi"].items()) for mode in ("cold", "hot"))
        + ("  " + "; ".join(row["errors"]) if row["errors"] else ""), flush=True)
    return row


def profile(shapes: str, default, fi):
    """--profile: each shape's default and FlashInfer, twice, each right after its producer."""
    for K, T, H, D in parse_shapes(shapes):
        sh = KwayShape(T, K, H, D, seed=T * 7 + K * 5 + H * 3 + D, loop=False)
        impls = implementations(sh, [default], fi, fixed_too=False, loop=False)
        for name, (call, producer, _) in impls.items():
            for _ in range(2):
                producer()
                call()
            torch.cuda.synchronize()
            print(f"# profiled {name} at K={K} T={T} H={H} D={D}", file=sys.stderr, flush=True)
        del sh


def profile_inplace(shapes: str, inplace, fi):
    """--profile-inplace: each T x H x D's in-place merges (every --inplace folder, then
    MergeStateInPlace), twice, each right after its producer (as hot), for ncu."""
    for T, H, D in (tuple(int(x) for x in item.split("x")) for item in shapes.split(",")):
        inputs = inplace_inputs(T, H, D)
        for label, call in inplace_calls(inplace, fi, *inputs.views[:4], None).items():
            for _ in range(2):
                inputs.producer()
                call()
            torch.cuda.synchronize()
            print(f"# profiled in-place {label} at T={T} H={H} D={D}", file=sys.stderr, flush=True)
        del inputs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", required=True, help="folder with libpeers_fi.so and libpeers_vllm.so")
    ap.add_argument("--shipped", metavar="DIR", help="kernel folder whose kernels mla_gen.flashinfer.merge_states "
                    "runs, through its own call path (the default spec's): then the default")
    ap.add_argument("--kernels", action="append", default=[], metavar="LABEL=DIR",
                    help="kernel folder launched by name (specs/kway-candidates-3.toml); the first is the "
                    "default without --shipped")
    ap.add_argument("--inplace", action="append", default=[], metavar="[LABEL=]DIR",
                    help="folder with base-2 token-major merge_state_in_place kernels (the inplace table, "
                    "the family table with and without the mask), run through mla_gen.flashinfer's call; "
                    "repeat for candidates (the first is the default; label mla-gen when none is given)")
    ap.add_argument("--check-kernels", metavar="DIR", help="folder of bench/kway-check.toml for --tables check")
    ap.add_argument("--unchecked", action="append", default=[], metavar="LABEL",
                    help="a --kernels folder the semantic checks skip (the base templates' rules differ)")
    ap.add_argument("--tables", default="check,candidates,states,inplace,grid",
                    help="any of check,candidates,states,inplace,family,family-inplace,grid (family-inplace: "
                    "the family table's in-place rows alone)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--graph-reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--placements", type=int, default=1, help="time each K-way shape with its buffers in this "
                    "many places (PLACEMENT_PAD_BYTES apart), the median of them (default 1)")
    ap.add_argument("--by-name", action="store_true", help="time the kernel --shipped's call selects launched "
                    "by name too (shipped-name): the kernel apart from the call path")
    ap.add_argument("--flush", choices=("memset", "read"), default="memset", help="how cold L2 is made before "
                    "each replay: memset the 512 MB buffer (dirty lines left in L2; default) or read it (clean)")
    ap.add_argument("--cap", type=float, default=1e9, help="seconds: stop starting shapes after this")
    ap.add_argument("--no-loop", dest="loop", action="store_false", help="no chunk loop in the grid")
    ap.add_argument("--out", default=".")
    ap.add_argument("--candidate-shapes", metavar="K:TxHxD,...", help="the candidates table at these shapes "
                    "instead of its own; `small`: the grid's merges of at most 20 MiB of states")
    ap.add_argument("--profile", metavar="K:TxHxD,...", help="no timing: launch the default and FlashInfer at "
                    "these shapes, for ncu")
    ap.add_argument("--profile-inplace", metavar="TxHxD,...", help="no timing: launch each --inplace folder's "
                    "merge and MergeStateInPlace at these shapes, for ncu")
    args = ap.parse_args()
    global FLUSH_MODE
    FLUSH_MODE = args.flush
    inplace = [(item.split("=", 1) if "=" in item else ("mla-gen", item)) for item in args.inplace]
    inplace = [(label, str(Path(path).resolve())) for label, path in inplace]
    if args.profile_inplace:
        return profile_inplace(args.profile_inplace, inplace, FlashInfer(args.peers))
    folders = ([Shipped(args.shipped, args.by_name)] if args.shipped else []) + [
        Folder(*item.split("=", 1)) for item in args.kernels]
    tables = args.tables.split(",")
    if not folders and not (inplace and set(tables) <= {"inplace", "family-inplace"}):
        sys.exit("kway_peers.py: give --shipped DIR or at least one --kernels LABEL=DIR (without them, only "
                 "--tables inplace,family-inplace with --inplace)")
    fi = FlashInfer(args.peers)
    if args.profile:
        if not folders:
            sys.exit("kway_peers.py: --profile needs --shipped DIR or --kernels LABEL=DIR")
        return profile(args.profile, folders[0], fi)
    default = folders[0].label if folders else inplace[0][0]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prop = torch.cuda.get_device_properties(0)
    print(f"# {prop.name}, torch {torch.__version__}; default {default}; "
          f"folders {[f.label for f in folders]}; cold flush: {FLUSH_MODE}", flush=True)
    start = time.monotonic()
    rows, failures = [], []

    def save():
        (out / "kway.json").write_text(json.dumps({"device": prop.name, "default": default,
                                                   "folders": [(f.label, f.path) for f in folders],
                                                   "failures": failures, "rows": rows}, indent=1))

    def run(label, shapes, fn):
        print(f"\n## {label}", flush=True)
        for shape in shapes:
            if time.monotonic() - start > args.cap:
                print(f"# --cap {args.cap:.0f} s reached: {label} stopped before {shape}", flush=True)
                return
            try:
                row = fn(*shape)
            except torch.cuda.OutOfMemoryError:
                row = {"table": label, "shape": list(shape), "errors": ["out of memory"]}
                print(row, flush=True)
            failures.extend(e for e in row["errors"] if not e.startswith("not run"))
            rows.append(row)
            torch.cuda.empty_cache()
            save()

    if "check" in tables and args.check_kernels:
        print("## semantic checks (bench/kway_check.py)", flush=True)
        bad = check_folder(args.check_kernels)
        for f in folders:
            if f.label not in args.unchecked:
                bad += check_folder(f.path, only_bf16_base2=not isinstance(f, Shipped))
        failures.extend(bad)
        print(f"# semantic checks: {len(bad)} failures", flush=True)
        save()
    if "candidates" in tables:
        shapes = {None: CANDIDATE_SHAPES, "small": SMALL_SHAPES}.get(args.candidate_shapes) or parse_shapes(
            args.candidate_shapes)
        run("candidates (every folder, x fi per label)", shapes,
            lambda K, T, H, D: print_kway(r := bench_kway("candidates", K, T, H, D, folders, fi, args),
                                          folders[0].label) or r)
    first = folders[:1]
    if "states" in tables:
        run("states 1-16 (the default: --shipped's kernels, else the first folder's runtime K)", STATES_SHAPES,
            lambda K, T, H, D: print_kway(r := bench_kway("states", K, T, H, D, first, fi, args, fixed_too=False),
                                          folders[0].label) or r)
    if "inplace" in tables and inplace:
        run("in-place beside MergeStateInPlace", INPLACE_SHAPES,
            lambda T, H, D: bench_inplace(T, H, D, inplace, fi, args))
    if "family" in tables:
        run("family: MergeStates at 1-16 states beside the chunk loop (the default)",
            FAMILY_SHAPES, lambda K, T, H, D: print_kway(
                r := bench_kway("family", K, T, H, D, first, fi, args, fixed_too=False), folders[0].label) or r)
    if ("family" in tables or "family-inplace" in tables) and inplace:
        run("family: MergeStateInPlace, without and with a mask", FAMILY_INPLACE,
            lambda T, H, D, mask: bench_inplace(T, H, D, inplace, fi, args, table="family-inplace", mask=mask))
    if "grid" in tables:
        shapes = [(K, T, H, D) for H, D in GRID_HD for K in GRID_K for T in GRID_T]

        def grid_row(K, T, H, D):
            r = bench_kway("grid", K, T, H, D, folders[:2], fi, args, fixed_too=not args.shipped, loop=args.loop)
            print_kway(r, folders[0].label)
            return r
        run("target grid (the default and the second folder; fixed-K kernels by name without --shipped)",
            shapes, grid_row)
    print()
    for line in summary(rows, default):
        print("#", line)
    save()
    if failures:
        print(f"# {len(failures)} checks failed:", *failures[:20], sep="\n# ", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

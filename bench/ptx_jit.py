"""CUBIN against PTX for a handful of default kernels on this GPU (issue #34 item 2: which archs
get CUBINs, which PTX). Run with CUDA_CACHE_DISABLE=1 (bench/gpu/families.sh does): every PTX
load is then a first load, JIT'd by the driver, none served from the JIT cache.

For each call of CALLS (through the package, as twins.py's PairCall), the kernel it runs in
--kernels (the default spec generated for sm_90 with PTX: `mla-gen generate --arch sm_90`), then:

  load ms     cuLibraryLoadData + cuLibraryGetKernel + cuKernelGetFunction of that kernel's image
              (what mla_gen/_cuda.py does on a first launch), from the sm_90 CUBIN, the sm_90 PTX
              and, with --ptx80, the sm_80 PTX (what a GPU with no CUBIN of its major JITs: the
              newest PTX at or below it); first load and median of --loads
  first call  ms of the package's first call in a folder (plan + load + launch, synchronized)
  us          the kernel's time, cold and hot (kway_peers.time_all), run from each image: the
              folders are --kernels' manifest with the CUBIN entries taken out (sm_90 PTX) and
              --ptx80's the same way, so the package picks the PTX (manifest.pick_image)
  x           time from the PTX image / time from the CUBIN (> 1: the CUBIN is faster)

  CUDA_CACHE_DISABLE=1 python3 bench/ptx_jit.py --kernels DIR [--ptx80 DIR] --out OUTDIR
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from twins import PairCall, agree, derived_folder, in_folder, launched_names  # noqa: E402
from mla_gen import _cuda, manifest as mm  # noqa: E402

# (dtype, T, H, D, output, threshold): decode and prefill, the head sizes engines run most, an FP8
# output, a flat twin, a size rule's range, f16 and f32.
CALLS = [(torch.bfloat16, 64, 32, 128, "same", "all"), (torch.bfloat16, 8192, 32, 128, "same", "all"),
         (torch.bfloat16, 8192, 16, 576, "same", "all"), (torch.bfloat16, 8192, 32, 128, "fp8", "all"),
         (torch.bfloat16, 2048, 2, 128, "fp8", "all"), (torch.float16, 16384, 8, 64, "same", "part"),
         (torch.float32, 4096, 32, 128, "same", "all")]
# The image each folder's label must load (the folders: main's).
IMAGE = {"cubin": ".sm_90.cubin", "ptx90": ".sm_90.ptx", "ptx80": ".sm_80.ptx"}


def ptx_only(src, dst):
    """A folder of src's kernels with only their PTX entries (the package then JITs the PTX)."""
    m = json.loads(Path(src, "manifest.json").read_text())
    for k in m["kernels"]:
        for a in k["archs"]:
            a.pop("cubin", None)
    return derived_folder(src, dst, m)


def load_ms(data: bytes, name: str):
    """ms to load an image and get the kernel's function in device 0's primary context, as the
    package does (then unloaded)."""
    cuda = _cuda.lib()
    library, kern, fn = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    buf = ctypes.create_string_buffer(data)  # NUL-terminated: PTX is text
    with _cuda._Current(_cuda.primary_context(0)):
        t0 = time.perf_counter()
        rc = cuda.cuLibraryLoadData(ctypes.byref(library), buf, None, None, 0, None, None, 0)
        if rc == 0:
            rc = cuda.cuLibraryGetKernel(ctypes.byref(kern), library, name.encode())
        if rc == 0:
            rc = cuda.cuKernelGetFunction(ctypes.byref(fn), kern)
        t1 = time.perf_counter()
    if library.value:
        cuda.cuLibraryUnload(library)
    if rc != 0:
        raise RuntimeError(f"loading {name}: CUresult {rc}")
    return (t1 - t0) * 1e3


def image(folder, kernel, arch, kind):
    for k in json.loads(Path(folder, "manifest.json").read_text())["kernels"]:
        if k["name"] == kernel:
            for a in k["archs"]:
                if a["arch"] == arch and a.get(kind):
                    return Path(folder, a[kind]["file"]).read_bytes()
    return None


def picked(folder, kernel, cc):
    """The image file the package loads for `kernel` from `folder` on a GPU of this cc."""
    for k in json.loads(Path(folder, "manifest.json").read_text())["kernels"]:
        if k["name"] == kernel:
            entry = mm.pick_image(k, cc)
            return entry and entry["file"]
    return None


def bench_call(spec, folders, sources, cc, args):
    """One call run from each folder's image: its first call, the load times, the kernel times. A
    folder whose image fails (a driver that cannot JIT this PTX) is left out of the timing and
    named in the row's errors."""
    from kway_peers import time_beside_copy
    dtype, T, H, D, out, thr = spec
    call = PairCall(T, H, D, out, thr, seed=T + H + D, dtype=dtype)
    row = {"call": f"{str(dtype).removeprefix('torch.')}{'>fp8' if out != 'same' else ''} T={T} H={H} D={D} "
                   f"thr={thr}", "bytes": call.nbytes, "errors": [], "load_ms": {}, "first_call_ms": {}}
    impls, results = {}, {}
    for label, folder in folders.items():
        fn = in_folder(folder, call)
        call.inputs.producer()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            with launched_names() as names:
                results[label] = call.result(fn)  # result() synchronizes
        except (ValueError, LookupError, RuntimeError) as e:
            row["errors"].append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        row["first_call_ms"][label] = (time.perf_counter() - t0) * 1e3
        row.setdefault("kernel", names[0])
        row.setdefault("image", {})[label] = picked(folder, names[0], cc)
        if names != [row["kernel"]] or not str(row["image"][label]).endswith(IMAGE[label]):
            row["errors"].append(f"{label} launched {names} from {row['image'][label]}, not {row['kernel']} from "
                                 f"its {IMAGE[label]}")
            continue
        problem = agree(results[label], results["cubin"], out != "same") if "cubin" in results else None
        if problem:
            row["errors"].append(f"{label} against the CUBIN: {problem}")
            continue
        impls[label] = (fn, call.inputs.producer, None)
    for label, (folder, arch, kind) in sources.items():
        data = image(folder, row.get("kernel"), arch, kind)
        try:
            ms = [load_ms(data, row["kernel"]) for _ in range(args.loads)] if data else []
        except RuntimeError as e:
            row["errors"].append(str(e))
            continue
        if ms:
            row["load_ms"][label] = {"first": ms[0], "median": statistics.median(ms), "bytes": len(data)}
    if "cubin" not in impls:
        return row
    row["us"] = time_beside_copy(impls, call.nbytes, args)
    row["x"] = {label: {m: row["us"][label][m] / row["us"]["cubin"][m] for m in ("cold", "hot")}
                for label in impls if label != "cubin"}
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", required=True, help="the default spec generated for sm_90 (CUBIN and PTX)")
    ap.add_argument("--ptx80", help="a folder with sm_80 PTX of the same kernels (optional)")
    ap.add_argument("--loads", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--graph-reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    if os.environ.get("CUDA_CACHE_DISABLE") != "1":
        print("# CUDA_CACHE_DISABLE is not 1: PTX loads after the first may come from the JIT cache", flush=True)
    prop = torch.cuda.get_device_properties(0)
    cc = prop.major * 10 + prop.minor
    print(f"# {prop.name} (sm_{cc}), torch {torch.__version__}, CUDA_CACHE_DISABLE="
          f"{os.environ.get('CUDA_CACHE_DISABLE')}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []

    def save():  # after every call: a run cut short by its timeout keeps what it measured
        failures = [f"{r['call']}: {e}" for r in rows for e in r["errors"]]
        (out / "ptx_jit.json").write_text(json.dumps({"device": prop.name, "cc": cc, "cache_disabled":
                                                      os.environ.get("CUDA_CACHE_DISABLE") == "1",
                                                      "failures": failures, "rows": rows}, indent=1))
        return failures
    _cuda.primary_context(0)  # the driver opened before the first call is timed
    with tempfile.TemporaryDirectory() as tmp:
        folders = {"cubin": Path(args.kernels).resolve(), "ptx90": ptx_only(args.kernels, Path(tmp, "ptx90"))}
        sources = {"cubin": (args.kernels, "sm_90", "cubin"), "ptx90": (args.kernels, "sm_90", "ptx")}
        if args.ptx80:
            folders["ptx80"] = ptx_only(args.ptx80, Path(tmp, "ptx80"))
            sources["ptx80"] = (args.ptx80, "sm_80", "ptx")
        for spec in CALLS:
            try:
                row = bench_call(spec, folders, sources, cc, args)
            except (ValueError, LookupError, RuntimeError) as e:
                row = {"call": str(spec), "errors": [f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"]}
            rows.append(row)
            save()
            torch.cuda.empty_cache()
            if row["errors"]:
                print(f"{row['call']}: " + "; ".join(row["errors"]), flush=True)
            if "us" not in row:
                continue
            loads = " ".join(f"{k} {v['first']:.2f}/{v['median']:.2f}ms" for k, v in row["load_ms"].items())
            xs = " ".join(f"{k} {v['cold']:.3f}/{v['hot']:.3f}" for k, v in row["x"].items())
            print(f"{row['call']:<34} {row['kernel']}\n    load (first/median) {loads} | first call "
                  + " ".join(f"{k} {v:.1f}ms" for k, v in row["first_call_ms"].items())
                  + f" | cubin {row['us']['cubin']['cold']:.2f}/{row['us']['cubin']['hot']:.2f}us (cold/hot)"
                  f" | x (PTX time / CUBIN time, cold/hot) {xs}", flush=True)
    for label in ("ptx90", "ptx80"):
        ok = [r for r in rows if label in r.get("x", {}) and label in r["load_ms"] and "cubin" in r["load_ms"]]
        if not ok:
            continue
        jit = [r["load_ms"][label]["first"] for r in ok]
        xs = [r["x"][label][m] for r in ok for m in ("cold", "hot")]
        cubin = statistics.median(r["load_ms"]["cubin"]["first"] for r in ok)
        print(f"# {label} ({len(ok)} kernels): JIT {min(jit):.1f}-{max(jit):.1f} ms a kernel (median "
              f"{statistics.median(jit):.1f}; CUBIN load median {cubin:.2f} ms); "
              f"kernel time x CUBIN {min(xs):.3f}-{max(xs):.3f}, median {statistics.median(xs):.3f}")
    failures = save()
    if failures:
        print(f"# {len(failures)} failed:", *failures, sep="\n# ", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

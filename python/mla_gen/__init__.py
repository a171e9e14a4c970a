"""vLLM-compatible ``merge_attn_states`` on kernels generated ahead of time by mla-gen.

No compiler runs here: kernels are loaded once per (device, kernel) from the generated CUBIN/PTX
through the CUDA driver (cuda-python), and ``prefill_tokens_with_context`` is a plain kernel
argument, so a new value never compiles or loads anything. Launches go on torch's current stream
with no device-to-host synchronization, so they can be captured in CUDA graphs.

The kernel folder is ``$MLA_GEN_KERNELS`` or the repository's ``generated/``.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from pathlib import Path

import torch
from cuda.bindings import driver as _cu

__all__ = ["merge_attn_states", "merge_states", "merge_state_in_place", "mask_empty_context_lse", "stats",
           "kernel_for", "available_kernels"]

_DTYPE_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_SIZES = {"f32": 4, "f16": 2, "bf16": 2}

_lock = threading.Lock()
_manifest: dict | None = None
_loaded: dict[tuple[int, str], "_Kernel"] = {}
_stats = {"module_loads": 0, "launches": 0}


def stats() -> dict:
    """Counters: ``module_loads`` (cuModuleLoadData calls: one per kernel and device, ever) and
    ``launches``. Nothing here compiles; a new threshold value is a new argument, so it shows as a
    launch and never as a module load."""
    return dict(_stats)


def kernels_dir() -> Path:
    env = os.environ.get("MLA_GEN_KERNELS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "generated"


def _manifest_data() -> dict:
    global _manifest
    if _manifest is None:
        path = kernels_dir() / "manifest.json"
        try:
            _manifest = json.loads(path.read_text())
        except OSError as e:
            raise RuntimeError(f"cannot read {path}: {e}; run `mla-gen generate` or set MLA_GEN_KERNELS") from e
    return _manifest


def available_kernels() -> list[str]:
    return [k["name"] for k in _manifest_data()["kernels"]]


def _check(result, what: str):
    err = result[0] if isinstance(result, tuple) else result
    if err != _cu.CUresult.CUDA_SUCCESS:
        _, name = _cu.cuGetErrorName(err)
        detail = name.decode() if isinstance(name, bytes) else str(err)
        if err == _cu.CUresult.CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
            nv = _manifest_data()["nvrtc"]
            detail += (f": PTX ISA {nv['ptx_isa']} from NVRTC {nv['release']} needs a CUDA "
                       f"{nv['oldest_driver_cuda']} driver; use CUBIN or the pinned NVRTC 13.0.88")
        raise RuntimeError(f"{what} failed: {detail}")
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result


class _Kernel:
    __slots__ = ("meta", "module", "function", "param_names", "loaded_from")

    def __init__(self, meta: dict, device: int):
        major = torch.cuda.get_device_capability(device)
        cc = major[0] * 10 + major[1]
        self.meta = meta
        self.param_names = [p["name"] for p in meta["params"]]
        choice = _pick_artifact(meta, cc)
        if choice is None:
            raise RuntimeError(f"{meta['name']}: no CUBIN or PTX in the manifest runs on sm_{cc}")
        data = (kernels_dir() / choice).read_bytes()
        if choice.endswith(".ptx"):
            data += b"\0"
        _ensure_context(device)
        self.module = _check(_cu.cuModuleLoadData(data), f"cuModuleLoadData({choice})")
        self.function = _check(_cu.cuModuleGetFunction(self.module, meta["name"].encode()),
                               f"cuModuleGetFunction({meta['name']})")
        self.loaded_from = choice
        _stats["module_loads"] += 1


def _pick_artifact(meta: dict, cc: int) -> str | None:
    best_cubin, best_ptx = None, None
    for a in meta["archs"]:
        arch = a["arch"]
        real = arch.startswith("sm_")
        digits = arch.split("_", 1)[1]
        specific = digits.endswith("a")
        n = int(digits.rstrip("a"))
        if real and a.get("cubin"):
            ok = n == cc if specific else (n // 10 == cc // 10 and n <= cc)
            if ok and (best_cubin is None or n > best_cubin[0]):
                best_cubin = (n, a["cubin"]["file"])
        if not specific and n <= cc and (best_ptx is None or n > best_ptx[0]):
            best_ptx = (n, a["ptx"]["file"])
    pick = best_cubin or best_ptx
    return pick[1] if pick else None


def _ensure_context(device: int):
    # torch runs on the device's primary context; make it current for the driver API.
    torch.cuda.init()
    _, ctx = _cu.cuCtxGetCurrent()
    if ctx is None or int(ctx) == 0:
        dev = _check(_cu.cuDeviceGet(device), "cuDeviceGet")
        pctx = _check(_cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _check(_cu.cuCtxSetCurrent(pctx), "cuCtxSetCurrent")


def kernel_for(dtype: torch.dtype, head_size: int, device: int, *, threshold: bool = True,
               output_lse: bool = True, head_major: bool = True, fp8: bool = False) -> _Kernel:
    """The loaded kernel for a variant; loads it on first use (the only time anything is loaded)."""
    name = _DTYPE_NAMES.get(dtype)
    key_meta = None
    for k in _manifest_data()["kernels"]:
        v = k["variant"]
        if (_family(k)[0] == "merge_attn_states" and v["dtype"] == name and v["head_size"] == head_size
                and v["output"] == ("fp8_e4m3" if fp8 else "same")
                and (v["lse_layout"] == "head_major") == head_major
                and (not threshold or v["prefix_threshold"]) and (not output_lse or v["output_lse"])):
            # Prefer the exact option set; a kernel with more options also serves.
            if key_meta is None or (v["prefix_threshold"] == threshold and v["output_lse"] == output_lse):
                key_meta = k
    if key_meta is None:
        sizes = sorted({k["variant"]["head_size"] for k in _manifest_data()["kernels"]
                        if k["variant"]["dtype"] == name})
        what = "FP8 e4m3 output" if fp8 else "output of the same dtype"
        raise ValueError(f"no generated kernel for dtype={dtype}, head_size={head_size} with {what} "
                         f"(this manifest has head sizes {sizes} for {dtype}); add it to the spec"
                         + (' with output = "fp8_e4m3"' if fp8 else ""))
    return _load(key_meta, device)


_F32 = torch.float32
_libcuda = None


def _launcher():
    """cuLaunchKernel through ctypes: the per-call cost of cuda-python's wrapper is several
    microseconds, which the host-cost budget does not have. No argtypes: the grid and block
    numbers are Python ints below 2^31, which ctypes passes as C ints without a conversion
    object, and the pointers are passed as ready-made c_void_p instances."""
    global _libcuda
    if _libcuda is None:
        fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
        fn.restype = ctypes.c_int
        _libcuda = fn
    return _libcuda


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(device: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(device)
    return torch.cuda.current_stream(device).cuda_stream


def _fail(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, n,
          output_scale=None):
    """Slow path: find what is wrong and raise the error that says so."""
    tensors = {"output": output, "prefix_output": prefix_output, "suffix_output": suffix_output,
               "prefix_lse": prefix_lse, "suffix_lse": suffix_lse}
    if output_lse is not None:
        tensors["output_lse"] = output_lse
    if output_scale is not None:
        tensors["output_scale"] = output_scale
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_cuda:
            raise ValueError(f"{name} is on {t.device}; all tensors must be on the same CUDA device")
        if t.device != output.device:
            raise ValueError(f"{name} is on {t.device}, output on {output.device}")
    if output.dim() != 3:
        raise ValueError(f"output must be [num_tokens, num_heads, head_size], got shape {tuple(output.shape)}")
    T, H, D = output.shape
    for name in ("prefix_output", "suffix_output"):
        t = tensors[name]
        if tuple(t.shape) != (T, H, D):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, output {tuple(output.shape)}")
    if prefix_output.dtype not in _DTYPE_NAMES:
        raise TypeError(f"input dtype {prefix_output.dtype} is not supported (float32, float16, bfloat16)")
    if suffix_output.dtype != prefix_output.dtype:
        raise TypeError(f"suffix_output is {suffix_output.dtype}, prefix_output is {prefix_output.dtype}; "
                        "they must match")
    if output_scale is None and output.dtype != prefix_output.dtype:
        raise TypeError(f"prefix_output is {prefix_output.dtype}, output is {output.dtype}; they must match "
                        "(an FP8 output needs output_scale)")
    if output_scale is not None:
        if output.dtype != _FP8:
            raise TypeError(f"with output_scale the output must be torch.float8_e4m3fn, got {output.dtype}")
        if output_scale.dtype != torch.float32 or output_scale.numel() < 1:
            raise ValueError("output_scale must be a float32 tensor holding the scale (one element)")
    for name in ("prefix_lse", "suffix_lse", "output_lse"):
        t = tensors.get(name)
        if t is None:
            continue
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
        if tuple(t.shape) != (H, T):
            raise ValueError(f"{name} must be [num_heads, num_tokens] = {(H, T)}, got {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError("prefill_tokens_with_context must be a Python int (a tensor would need a "
                            f"device-to-host sync), got {type(n).__name__}")
        if not 0 <= n <= T:
            raise ValueError(f"prefill_tokens_with_context = {n} is outside 0..={T}")
    if H > 65535 * 8:
        raise ValueError(f"num_heads = {H} is over the grid's limit")
    kern = kernel_for(prefix_output.dtype, D, output.get_device(), output_lse=output_lse is not None,
                      fp8=output_scale is not None)
    launch = kern.meta["launch"]
    vec, vec_bytes = launch["vec_elems"], launch["vec_bytes"]
    for name in ("output", "prefix_output", "suffix_output"):
        t = tensors[name]
        ts, hs, es = t.stride()
        if es != 1:
            raise ValueError(f"{name}: the head_size dimension must be contiguous (stride 1), got strides {t.stride()}")
        if H > 1 and hs < D:
            raise ValueError(f"{name}: head stride {hs} < head size {D}")
        if ts % vec or hs % vec:
            raise ValueError(f"{name}: strides {t.stride()} must be multiples of {vec} elements")
        align = (launch.get("out_vec_bytes") or vec_bytes) if name == "output" else vec_bytes
        if t.data_ptr() % align:
            raise ValueError(f"{name}: data pointer is not {align}-byte aligned")
    ots, ohs, _ = output.stride()
    if T > 1 and ots < H * max(ohs, D):
        raise ValueError(f"output: token stride {ots} < num_heads * head stride: rows would overlap")
    for iname in ("prefix_output", "suffix_output", "prefix_lse", "suffix_lse"):
        for oname in ("output", "output_lse"):
            if oname in tensors and _span_overlap(tensors[oname], tensors[iname]):
                raise ValueError(f"{oname} overlaps {iname}; this merge is not in-place")
    raise AssertionError("mla_gen: arguments rejected by the fast path but not by the checks; please report")


def _span_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    def span(t):
        if t.numel() == 0:
            return (0, 0)
        last = sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
        return (t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size())
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def _lse_overlaps(a0, a1, *ranges):
    return any(a0 < ranges[i + 1] and ranges[i] < a1 for i in range(0, len(ranges), 2))


_FP8 = getattr(torch, "float8_e4m3fn", None)

# Parameter orders of our argument tuple: without and with the FP8 scale.
_ORDER_SAME = ("output", "output_lse", "prefix_output", "prefix_lse", "suffix_output", "suffix_lse",
               "num_tokens", "num_heads", "output_token_stride", "output_head_stride",
               "prefix_token_stride", "prefix_head_stride", "suffix_token_stride", "suffix_head_stride",
               "prefill_tokens_with_context")
_ORDER_FP8 = _ORDER_SAME[:6] + ("output_scale",) + _ORDER_SAME[6:]

# (input dtype, head_size, device, with output_lse, fp8) -> everything a launch needs
_fast: dict = {}


def _fast_entry(dtype, D, device, with_lse, fp8):
    key = (dtype, D, device, with_lse, fp8)
    entry = _fast.get(key)
    if entry is None:
        kern = kernel_for(dtype, D, device, output_lse=with_lse, fp8=fp8)
        count = len(kern.param_names)
        values = (ctypes.c_uint64 * count)()
        base = ctypes.addressof(values)
        pointers = (ctypes.c_void_p * count)(*[base + 8 * i for i in range(count)])
        # Map our fixed argument order onto the manifest's parameter order.
        order = _ORDER_FP8 if fp8 else _ORDER_SAME
        index = [order.index(p) for p in kern.param_names]
        identity = index == list(range(len(order)))
        launch = kern.meta["launch"]
        in_size = _SIZES[_DTYPE_NAMES[dtype]]
        # ctypes instances pass through ctypes calls without conversion.
        entry = (ctypes.c_void_p(int(kern.function)), values, ctypes.c_void_p(ctypes.addressof(pointers)),
                 (pointers, _launcher()), index, identity, in_size, 1 if fp8 else in_size,
                 launch["vec_elems"], launch["vec_bytes"], launch.get("out_vec_bytes") or launch["vec_bytes"],
                 launch["tokens_per_block"] * launch["rows_per_thread"], launch["heads_per_block"],
                 launch["block_threads"], launch["shared_mem_bytes"], threading.Lock())
        _fast[key] = entry
    return entry


def merge_attn_states(
    output: torch.Tensor,
    prefix_output: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix_output: torch.Tensor,
    suffix_lse: torch.Tensor,
    output_lse: torch.Tensor | None = None,
    prefill_tokens_with_context: int | None = None,
    output_scale: torch.Tensor | None = None,
    *,
    output_group_scales: torch.Tensor | None = None,
    ue8m0: bool = False,
) -> None:
    """vLLM's ``merge_attn_states``: output [T, H, D] (written), prefix/suffix outputs [T, H, D],
    lse [H, T] float32; tokens ``t >= prefill_tokens_with_context`` copy the suffix. With
    ``output_scale`` (a float32 tensor holding one scale) the output is ``torch.float8_e4m3fn``:
    saturate(value / scale), rounded to nearest even. With ``output_group_scales`` (float32
    [T, H * D / G], any strides: row-major, column-major, padded) the output is e4m3 with one
    scale per group of G elements, computed by the kernel (max(absmax, 1e-10) / 448, rounded up
    to a power of two with ``ue8m0=True``) and written there; G = H * D / its second dimension.
    Raises TypeError/ValueError for arguments the kernel cannot take safely."""
    if output_group_scales is not None:
        return _merge_group(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
                            prefill_tokens_with_context, output_group_scales, ue8m0, output_scale)
    n = prefill_tokens_with_context
    fp8 = output_scale is not None
    args = (output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, n, output_scale)
    # Fast path: every check in one pass of cheap accessors; anything off goes to _fail, which
    # finds the problem and raises the error that names it.
    try:
        shape = output.shape
        T, H, D = shape
        dtype = prefix_output.dtype
        device = output.get_device()
        ok = (device >= 0 and prefix_output.shape == shape and suffix_output.shape == shape
              and suffix_output.dtype is dtype
              and output.dtype is (_FP8 if fp8 else dtype)
              and prefix_output.get_device() == device and suffix_output.get_device() == device
              and prefix_lse.dtype is _F32 and suffix_lse.dtype is _F32
              and prefix_lse.get_device() == device and suffix_lse.get_device() == device
              and prefix_lse.shape == (H, T) and suffix_lse.shape == (H, T)
              and prefix_lse.is_contiguous() and suffix_lse.is_contiguous()
              and dtype in _DTYPE_NAMES and H <= 65535 * 8)
        if output_lse is not None:
            ok = ok and (output_lse.dtype is _F32 and output_lse.get_device() == device
                         and output_lse.shape == (H, T) and output_lse.is_contiguous())
        if fp8:
            ok = ok and (output_scale.dtype is _F32 and output_scale.get_device() == device
                         and output_scale.numel() >= 1)
        if n is None:
            n = T
        elif type(n) is not int or not 0 <= n <= T:
            ok = False
    except (AttributeError, TypeError, ValueError):
        ok = False
    if not ok:
        _fail(*args)
    if T == 0 or H == 0:
        return
    (function, values, pointers_addr, (_keep, launch_kernel), index, identity, size, out_size, vec,
     vec_bytes, out_vec_bytes, tokens_per_block, heads_per_block, block, shmem,
     lock) = _fast_entry(dtype, D, device, output_lse is not None, fp8)
    ots, ohs, oes = output.stride()
    pts, phs, pes = prefix_output.stride()
    sts, shs, ses = suffix_output.stride()
    o_ptr, p_ptr, s_ptr = output.data_ptr(), prefix_output.data_ptr(), suffix_output.data_ptr()
    pl_ptr, sl_ptr = prefix_lse.data_ptr(), suffix_lse.data_ptr()
    ol_ptr = 0 if output_lse is None else output_lse.data_ptr()
    last = (T - 1, H - 1)
    o_end = o_ptr + (last[0] * ots + last[1] * ohs + D) * out_size
    p_end = p_ptr + (last[0] * pts + last[1] * phs + D) * size
    s_end = s_ptr + (last[0] * sts + last[1] * shs + D) * size
    lse_bytes = 4 * T * H
    pl_end, sl_end = pl_ptr + lse_bytes, sl_ptr + lse_bytes
    if (oes != 1 or pes != 1 or ses != 1
            or (H > 1 and (ohs < D or phs < D or shs < D))
            or (ots | ohs | pts | phs | sts | shs) % vec
            or (p_ptr | s_ptr) % vec_bytes or o_ptr % out_vec_bytes
            or (T > 1 and ots < H * (ohs if ohs > D else D))
            # no output may overlap an input (byte ranges)
            or (o_ptr < p_end and p_ptr < o_end) or (o_ptr < s_end and s_ptr < o_end)
            or (o_ptr < pl_end and pl_ptr < o_end) or (o_ptr < sl_end and sl_ptr < o_end)
            or (ol_ptr and _lse_overlaps(ol_ptr, ol_ptr + lse_bytes, p_ptr, p_end, s_ptr, s_end,
                                         pl_ptr, pl_end, sl_ptr, sl_end))):
        _fail(*args)
    grid_y = (H + heads_per_block - 1) // heads_per_block
    if grid_y > 65535:
        raise ValueError(f"num_heads = {H} needs {grid_y} block rows, over the grid's y limit 65535")
    if fp8:
        by_order = (o_ptr, ol_ptr, p_ptr, pl_ptr, s_ptr, sl_ptr, output_scale.data_ptr(),
                    T, H, ots, ohs, pts, phs, sts, shs, n)
    else:
        by_order = (o_ptr, ol_ptr, p_ptr, pl_ptr, s_ptr, sl_ptr, T, H, ots, ohs, pts, phs, sts, shs, n)
    stream = _current_stream(device)
    with lock:
        if identity:
            values[:] = by_order
        else:
            values[:] = [by_order[i] for i in index]
        err = launch_kernel(function, (T + tokens_per_block - 1) // tokens_per_block, grid_y, 1, block, 1, 1,
                            shmem, ctypes.c_void_p(stream), pointers_addr, None)
    if err:
        _check((_cu.CUresult(err), None), "cuLaunchKernel")
    _stats["launches"] += 1


# ---- the other families: K-way merge and in-place merge ----

def _family(meta: dict) -> tuple[str, dict]:
    """A manifest kernel's family name and its fields ({"num_states": K or None} / {"mask": b})."""
    f = meta["variant"].get("family", "merge_attn_states")
    if isinstance(f, dict):
        (name, fields), = f.items()
        return name, fields
    return f, {}


def _load(meta: dict, device: int) -> _Kernel:
    """The loaded kernel of manifest entry `meta` on `device`: loaded on first use, the only time
    anything is loaded."""
    key = (device, meta["name"])
    kern = _loaded.get(key)
    if kern is None:
        with _lock:
            kern = _loaded.get(key)
            if kern is None:
                kern = _Kernel(meta, device)
                _loaded[key] = kern
    return kern


def _find(family: str, dtype: torch.dtype, head_size: int, accept, what: str) -> dict:
    """The manifest kernel of `family` for (dtype, head size) whose fields `accept` ranks best
    (lower is better; None = unusable). `what` describes the conditions `accept` checks: it ends
    the error message and keys the cache, so it must name every one of them."""
    key = (family, dtype, head_size, what)  # `what` spells out the selection
    hit = _found.get(key)
    if hit is not None:
        return hit
    name = _DTYPE_NAMES.get(dtype)
    best = None
    for k in _manifest_data()["kernels"]:
        fam, fields = _family(k)
        v = k["variant"]
        if fam != family or v["dtype"] != name or v["head_size"] != head_size:
            continue
        rank = accept(fields, v)
        if rank is not None and (best is None or rank < best[0]):
            best = (rank, k)
    if best is None:
        raise ValueError(f"no generated {family} kernel for dtype={dtype}, head_size={head_size}{what}; "
                         f"add a [[{family}]] table to the spec")
    _found[key] = best[1]
    return best[1]


_found: dict = {}


def _check_rows(name: str, t: torch.Tensor, device, dtype, D: int, launch: dict):
    """A [.., H, D] tensor of rows: on the device, of the dtype, rows contiguous, strides and
    pointer fit the kernel's vector access."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if t.dtype != dtype:
        raise TypeError(f"{name} is {t.dtype}, expected {dtype}")
    vec, vec_bytes = launch["vec_elems"], launch["vec_bytes"]
    if t.stride()[-1] != 1:
        raise ValueError(f"{name}: the head_size dimension must be contiguous (stride 1), got strides {t.stride()}")
    if t.shape[-2] > 1 and t.stride()[-2] < D:
        raise ValueError(f"{name}: head stride {t.stride()[-2]} < head size {D}")
    if any(st % vec for st in t.stride()[:-1]):
        raise ValueError(f"{name}: strides {t.stride()} must be multiples of {vec} elements")
    if t.data_ptr() % vec_bytes:
        raise ValueError(f"{name}: data pointer is not {vec_bytes}-byte aligned")


def _check_lse(name: str, t: torch.Tensor, device, shape: tuple):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _launch(kern: _Kernel, values: dict, grid: tuple, device: int):
    """cuLaunchKernel with the kernel's parameters, in the manifest's order, from `values`."""
    launch = kern.meta["launch"]
    ordered = [values[n] for n in kern.param_names]
    storage = (ctypes.c_uint64 * len(ordered))(*ordered)
    base = ctypes.addressof(storage)
    pointers = (ctypes.c_void_p * len(ordered))(*[base + 8 * i for i in range(len(ordered))])
    err = _launcher()(ctypes.c_void_p(int(kern.function)), grid[0], grid[1], 1, launch["block_threads"], 1, 1,
                      launch["shared_mem_bytes"], ctypes.c_void_p(_current_stream(device)), pointers, None)
    if err:
        _check((_cu.CUresult(err), None), "cuLaunchKernel")
    _stats["launches"] += 1


def _grid(launch: dict, T: int, H: int) -> tuple:
    tokens = launch["tokens_per_block"] * launch["rows_per_thread"]
    gy = (H + launch["heads_per_block"] - 1) // launch["heads_per_block"]
    if gy > 65535:
        raise ValueError(f"num_heads = {H} needs {gy} block rows, over the grid's y limit 65535")
    return ((T + tokens - 1) // tokens, gy)


def merge_states(v: torch.Tensor, s: torch.Tensor, output: torch.Tensor | None = None,
                 output_lse: torch.Tensor | None = None):
    """Merge K attention states per token in one pass (FlashInfer's ``merge_states``).

    v: [T, K, H, D] partial outputs (f32/f16/bf16; the D dimension contiguous, other strides free),
    s: [T, K, H] float32 lse, contiguous. Returns ``(output [T, H, D], output_lse [T, H])``,
    allocated when not given. +inf lse means "no keys" like -inf; a row with no keys in any
    state gets state 0's row and lse -inf. Uses the compile-time-K kernel for this K when the
    spec has one, else the runtime-K kernel."""
    if not isinstance(v, torch.Tensor) or v.dim() != 4:
        raise ValueError("v must be a [num_tokens, num_states, num_heads, head_size] tensor")
    T, K, H, D = v.shape
    if K < 1:
        raise ValueError("num_states must be at least 1")
    if v.dtype not in _DTYPE_NAMES:
        raise TypeError(f"v's dtype {v.dtype} is not supported (float32, float16, bfloat16)")
    if not v.is_cuda:
        raise ValueError(f"v is on {v.device}; the merge runs on a CUDA device")
    meta = _find("merge_states", v.dtype, D,
                 # This K compiled in beats runtime K; a kernel with output lse (null = skip) beats one without.
                 lambda f, var: None if f.get("num_states") not in (K, None)
                 else 2 * (f.get("num_states") is None) + (not var["output_lse"]),
                 f" merging {K} states (no kernel with num_states = {K} or \"runtime\")")
    launch = meta["launch"]
    _check_rows("v", v, v.device, v.dtype, D, launch)
    _check_lse("s", s, v.device, (T, K, H))
    if output is None:
        output = torch.empty((T, H, D), dtype=v.dtype, device=v.device)
    if output_lse is None and meta["variant"]["output_lse"]:
        output_lse = torch.empty((T, H), dtype=torch.float32, device=v.device)
    if tuple(output.shape) != (T, H, D):
        raise ValueError(f"output must be [T, H, D] = {(T, H, D)}, got {tuple(output.shape)}")
    _check_rows("output", output, v.device, v.dtype, D, launch)
    ots, ohs, _ = output.stride()
    if T > 1 and ots < H * max(ohs, D):
        raise ValueError(f"output: token stride {ots} < num_heads * head stride: rows would overlap")
    if output_lse is not None:
        if not meta["variant"]["output_lse"]:
            raise ValueError(f"{meta['name']} has no output_lse (spec: output_lse = true)")
        _check_lse("output_lse", output_lse, v.device, (T, H))
    for oname, o in (("output", output), ("output_lse", output_lse)):
        for iname, i in (("v", v), ("s", s)):
            if o is not None and _span_overlap(o, i):
                raise ValueError(f"{oname} overlaps {iname}; this merge is not in-place")
    if T == 0 or H == 0:
        return output, output_lse
    kern = _load(meta, output.get_device())
    vts, vks, vhs, _ = v.stride()
    values = {"output": output.data_ptr(), "output_lse": 0 if output_lse is None else output_lse.data_ptr(),
              "states": v.data_ptr(), "states_lse": s.data_ptr(), "num_states": K,
              "num_tokens": T, "num_heads": H, "output_token_stride": ots, "output_head_stride": ohs,
              "states_token_stride": vts, "states_state_stride": vks, "states_head_stride": vhs}
    _launch(kern, values, _grid(launch, T, H), output.get_device())
    return output, output_lse


def merge_state_in_place(v: torch.Tensor, s: torch.Tensor, v_other: torch.Tensor, s_other: torch.Tensor,
                         mask: torch.Tensor | None = None, *, lse_layout: str = "token_major") -> None:
    """``v, s := merge((v, s), (v_other, s_other))`` in place (FlashInfer's
    ``merge_state_in_place``). v, v_other: [T, H, D]; s, s_other: float32 lse, [T, H] with
    ``lse_layout="token_major"`` (FlashInfer's layout, the default) or [H, T] with
    ``"head_major"`` (vLLM's). ``mask``: [T] bool or uint8; tokens where it is 0/False are left
    untouched (needs a kernel generated with ``mask = true``)."""
    if lse_layout not in ("token_major", "head_major"):
        raise ValueError('lse_layout must be "token_major" or "head_major"')
    if not isinstance(v, torch.Tensor) or v.dim() != 3:
        raise ValueError("v must be a [num_tokens, num_heads, head_size] tensor")
    T, H, D = v.shape
    if v.dtype not in _DTYPE_NAMES:
        raise TypeError(f"v's dtype {v.dtype} is not supported (float32, float16, bfloat16)")
    if not v.is_cuda:
        raise ValueError(f"v is on {v.device}; the merge runs on a CUDA device")
    want_mask = mask is not None
    meta = _find("merge_state_in_place", v.dtype, D,
                 lambda f, var: None if var["lse_layout"] != lse_layout or (want_mask and not f.get("mask"))
                 else int(f.get("mask", False) != want_mask),
                 f" with lse_layout={lse_layout}" + (" and a mask" if want_mask else ""))
    launch = meta["launch"]
    _check_rows("v", v, v.device, v.dtype, D, launch)
    if not isinstance(v_other, torch.Tensor) or tuple(v_other.shape) != (T, H, D):
        raise ValueError(f"v_other must be [T, H, D] = {(T, H, D)}")
    _check_rows("v_other", v_other, v.device, v.dtype, D, launch)
    lse_shape = (T, H) if lse_layout == "token_major" else (H, T)
    _check_lse("s", s, v.device, lse_shape)
    _check_lse("s_other", s_other, v.device, lse_shape)
    vts, vhs, _ = v.stride()
    if T > 1 and vts < H * max(vhs, D):
        raise ValueError(f"v: token stride {vts} < num_heads * head stride: rows would overlap")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype not in (torch.bool, torch.uint8):
            raise TypeError("mask must be a bool or uint8 tensor")
        if tuple(mask.shape) != (T,) or not mask.is_contiguous() or mask.device != v.device:
            raise ValueError(f"mask must be a contiguous [num_tokens] = ({T},) tensor on {v.device}")
    for oname, o in (("v", v), ("s", s)):
        for iname, i in (("v_other", v_other), ("s_other", s_other), ("mask", mask)):
            if i is not None and _span_overlap(o, i):
                raise ValueError(f"{oname} overlaps {iname}; only v and s are updated in place")
    if _span_overlap(v, s):
        raise ValueError("v overlaps s; both are written")
    if T == 0 or H == 0:
        return
    kern = _load(meta, v.get_device())
    ots, ohs, _ = v_other.stride()
    values = {"state": v.data_ptr(), "state_lse": s.data_ptr(), "other": v_other.data_ptr(),
              "other_lse": s_other.data_ptr(), "mask": 0 if mask is None else mask.data_ptr(),
              "num_tokens": T, "num_heads": H, "state_token_stride": vts, "state_head_stride": vhs,
              "other_token_stride": ots, "other_head_stride": ohs}
    _launch(kern, values, _grid(launch, T, H), v.get_device())


def mask_empty_context_lse(lse: torch.Tensor, query_start_loc: torch.Tensor, context_start_loc: torch.Tensor,
                           *, lse_layout: str = "head_major") -> None:
    """Set ``lse`` to -inf, in place, for every head of the tokens of requests whose context is
    empty, before a merge (so those tokens take the suffix alone). ``lse``: float32 [H, T]
    (``lse_layout="head_major"``, vLLM's) or [T, H] (``"token_major"``). ``query_start_loc`` and
    ``context_start_loc``: int32 [B + 1] on the device; request b holds tokens
    ``query_start_loc[b]:query_start_loc[b+1]`` and has an empty context when
    ``context_start_loc[b+1] == context_start_loc[b]``. Their contents are not read on the host (no
    sync): whatever they hold, only lse is written, and only inside its bounds."""
    if lse_layout not in ("token_major", "head_major"):
        raise ValueError('lse_layout must be "token_major" or "head_major"')
    if not isinstance(lse, torch.Tensor) or lse.dim() != 2:
        raise ValueError("lse must be a 2-D float32 tensor ([H, T] or [T, H])")
    if not lse.is_cuda:
        raise ValueError(f"lse is on {lse.device}; the mask runs on a CUDA device")
    H, T = lse.shape if lse_layout == "head_major" else lse.shape[::-1]
    _check_lse("lse", lse, lse.device, tuple(lse.shape))
    for name, t in (("query_start_loc", query_start_loc), ("context_start_loc", context_start_loc)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
            raise TypeError(f"{name} must be an int32 tensor")
        if t.dim() != 1 or t.numel() < 1 or not t.is_contiguous() or t.device != lse.device:
            raise ValueError(f"{name} must be a contiguous 1-D [num_requests + 1] tensor on {lse.device}")
        if _span_overlap(lse, t):
            raise ValueError(f"lse overlaps {name}")
    B = query_start_loc.numel() - 1
    if context_start_loc.numel() != B + 1:
        raise ValueError(f"context_start_loc has {context_start_loc.numel()} elements, query_start_loc {B + 1}")
    if T == 0 or H == 0 or B == 0:
        return
    meta = _find("mask_empty_context_lse", torch.float32, 1,
                 lambda f, var: 0 if var["lse_layout"] == lse_layout else None,
                 f" with lse_layout={lse_layout}")
    kern = _load(meta, lse.get_device())
    values = {"lse": lse.data_ptr(), "query_start_loc": query_start_loc.data_ptr(),
              "context_start_loc": context_start_loc.data_ptr(), "num_requests": B,
              "num_tokens": T, "num_heads": H}
    _launch(kern, values, _grid(meta["launch"], T, H), lse.get_device())


def _merge_group(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, n, scales, ue8m0,
                 output_scale):
    """merge_attn_states with per-token-group FP8 output (a checked, unhurried path)."""
    if output_scale is not None:
        raise ValueError("give output_scale (one per-tensor scale) or output_group_scales, not both")
    if not isinstance(scales, torch.Tensor) or scales.dim() != 2 or scales.dtype != torch.float32:
        raise TypeError("output_group_scales must be a 2-D float32 tensor [num_tokens, num_heads * head_size / G]")
    if not isinstance(output, torch.Tensor) or output.dim() != 3:
        raise ValueError("output must be [num_tokens, num_heads, head_size]")
    T, H, D = output.shape
    if output.dtype != _FP8:
        raise TypeError(f"with output_group_scales the output must be torch.float8_e4m3fn, got {output.dtype}")
    if scales.shape[0] != T or scales.shape[1] < 1 or (H * D) % scales.shape[1]:
        raise ValueError(f"output_group_scales must be [T, H * D / G] for a group size G, got {tuple(scales.shape)}")
    G = H * D // scales.shape[1]
    dtype = prefix_output.dtype if isinstance(prefix_output, torch.Tensor) else None
    if dtype not in _DTYPE_NAMES:
        raise TypeError(f"input dtype {dtype} is not supported (float32, float16, bfloat16)")
    if n is None:
        n = T
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError("prefill_tokens_with_context must be a Python int")
    if not 0 <= n <= T:
        raise ValueError(f"prefill_tokens_with_context = {n} is outside 0..={T}")
    meta = _find("merge_attn_states", dtype, D,
                 lambda f, var: 0 if (var.get("fp8_group") == {"group_size": G, "ue8m0": bool(ue8m0)}
                                      and var["lse_layout"] == "head_major"
                                      and (var["prefix_threshold"] or n == T)
                                      and (output_lse is None or var["output_lse"])) else None,
                 # `what` is also the cache key: it names every condition of the choice.
                 f" with output = fp8_e4m3_group, group_size = {G}, ue8m0 = {bool(ue8m0)}"
                 + (", output_lse" if output_lse is not None else "") + ("" if n == T else ", a threshold"))
    launch = meta["launch"]
    for name, t, want in (("prefix_output", prefix_output, dtype), ("suffix_output", suffix_output, dtype)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (T, H, D):
            raise ValueError(f"{name} must be [T, H, D] = {(T, H, D)}")
        _check_rows(name, t, output.device, want, D, launch)
    if output.stride()[-1] != 1 or any(st % launch["vec_elems"] for st in output.stride()[:-1]):
        raise ValueError(f"output: rows must be contiguous with strides in multiples of {launch['vec_elems']}")
    if output.data_ptr() % launch["out_vec_bytes"]:
        raise ValueError(f"output: data pointer is not {launch['out_vec_bytes']}-byte aligned")
    ots, ohs, _ = output.stride()
    if H > 1 and ohs < D or T > 1 and ots < H * max(ohs, D):
        raise ValueError("output: rows would overlap")
    _check_lse("prefix_lse", prefix_lse, output.device, (H, T))
    _check_lse("suffix_lse", suffix_lse, output.device, (H, T))
    if output_lse is not None:
        _check_lse("output_lse", output_lse, output.device, (H, T))
    if scales.device != output.device:
        raise ValueError(f"output_group_scales is on {scales.device}, output on {output.device}")
    sts, sgs = scales.stride()
    groups = scales.shape[1]
    if T > 1 and groups > 1 and not (sts >= groups * sgs or sgs >= T * sts) or min(sts, sgs) < 1:
        raise ValueError(f"output_group_scales: strides {scales.stride()} map two groups to one element")
    written = [("output", output), ("output_lse", output_lse), ("output_group_scales", scales)]
    read = [("prefix_output", prefix_output), ("suffix_output", suffix_output), ("prefix_lse", prefix_lse),
            ("suffix_lse", suffix_lse)]
    for i, (oname, o) in enumerate(written):
        for iname, x in read + written[i + 1:]:
            if o is not None and x is not None and _span_overlap(o, x):
                raise ValueError(f"{oname} overlaps {iname}")
    if T == 0 or H == 0:
        return
    kern = _load(meta, output.get_device())
    pts, phs, _ = prefix_output.stride()
    xts, xhs, _ = suffix_output.stride()
    values = {"output": output.data_ptr(), "output_lse": 0 if output_lse is None else output_lse.data_ptr(),
              "prefix_output": prefix_output.data_ptr(), "prefix_lse": prefix_lse.data_ptr(),
              "suffix_output": suffix_output.data_ptr(), "suffix_lse": suffix_lse.data_ptr(),
              "output_scales": scales.data_ptr(), "num_tokens": T, "num_heads": H,
              "output_token_stride": ots, "output_head_stride": ohs, "prefix_token_stride": pts,
              "prefix_head_stride": phs, "suffix_token_stride": xts, "suffix_head_stride": xhs,
              "scale_token_stride": sts, "scale_group_stride": sgs, "prefill_tokens_with_context": n}
    _launch(kern, values, _grid(launch, T, H), output.get_device())

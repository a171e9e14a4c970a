"""The torch functions: tensors become the contract's arguments, the one checker judges them,
and the kernel is launched on torch's current stream (no device-to-host sync, so CUDA graphs can
capture it).

A call's tensors are mapped to the kernel's parameters by name; the integer parameters (sizes
and strides) are read from the tensors through the contract's dims (a dim of size ``num_tokens``
gives ``num_tokens``, a stride ``output_token_stride`` gives that stride); a buffer's length is
the elements from its pointer to the end of its storage. The contract then decides everything it
can (docs/MANIFEST.md, "The check"). This module adds only what the contract cannot say: a
torch.Tensor on a CUDA device, all on one device, of the rank the kernel addresses, and laid out
as the kernel addresses it (the shape and strides its dims give, e.g. a contiguous head dim).

Fast path: the first call with given layouts (shapes, strides, dtypes, device) builds a plan with
the full check; later calls with the same layouts check only what depends on the pointers and
on the free integers (alignment, overlap, the threshold's range). Anything off there reruns the
full check, which raises the exact error. The storage-length rule needs no per-call work: torch
keeps every tensor inside its storage, and the plan checked these layouts.
"""

from __future__ import annotations

import torch

from . import _cuda
from . import manifest as _m
from .contract import ArgumentError, Buffer, plan_for

_FP8 = getattr(torch, "float8_e4m3fn", None)
_ELEM = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.int32: "i32",
         torch.uint8: "u8", torch.bool: "u8", torch.float64: "f64", torch.int64: "i64", torch.int8: "i8",
         torch.int16: "i16"}
if _FP8 is not None:
    _ELEM[_FP8] = "fp8_e4m3"

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_env = _m.env_value
# $MLA_GEN_KERNELS as stored, for the fast paths' `how` (only compared with itself): one C call
if _m._env_data is not None:
    _env_get, _ENV_KEY = _m._env_data.get, _m._env_key
else:  # pragma: no cover - an os.environ without _data
    _env_get, _ENV_KEY = (lambda key: _m.env_value()), None

# Where an empty tensor has no storage (data_ptr 0) it stands at this address: nothing is read
# or written through it (its extent is 0, or the check refuses it as too short).
_EMPTY_ADDRESS = 1 << 12

_MAX_PLANS = 4096
# Tests without a GPU run the whole path on CPU tensors with the launch replaced (tests/conftest).
_DEVICE_TYPE = "cuda"
_plans: dict = {}
stats = {"plans": 0}


def _elem(dtype) -> str:
    return _ELEM.get(dtype) or str(dtype).removeprefix("torch.")


def _stream(device: int) -> int:
    """torch's current stream on `device` (its CUstream as an int)."""
    return torch.cuda.current_stream(device).cuda_stream


if _raw_stream is not None:
    _stream = _raw_stream  # noqa: F811 - the same answer, one C call (the generated paths call _stream)


def _buffer(t: torch.Tensor) -> Buffer:
    """The contract's view of a tensor: its address, the elements from there to the end of its
    storage, its element type."""
    size = t.element_size()
    ptr = t.data_ptr()
    length = (t.untyped_storage().nbytes() - t.storage_offset() * size) // size
    if ptr == 0 and t.numel() == 0:
        ptr, length = _EMPTY_ADDRESS, 0
    return Buffer(ptr, length, _elem(t.dtype))


class _Kind:
    """One way of calling: the family, the kernel parameters its tensors bind (in call order),
    its free integers, and how it picks the kernel."""

    def __init__(self, family, names, free, select):
        self.family, self.names, self.free, self.select = family, names, free, select


class _Prepared:
    __slots__ = ("launcher", "run", "go", "set_guard", "guard", "grid", "device", "meta", "name", "gx", "gy")


def _layout_error(name, t, sizes, strides, labels):
    want = ", ".join(f"{lab}={s}" for lab, s in zip(labels, sizes))
    return ValueError(f"{name} has shape {tuple(t.shape)} and strides {tuple(t.stride())}; the kernel addresses it "
                      f"as [{want}] with strides {tuple(strides)} (strides of size-1 dims do not matter)")


def _prepare(kind: _Kind, options: tuple, tensors: tuple, free: tuple):
    """Check a call in full; returns (plan for this layout, the parameter values of this call).
    Raises TypeError/ValueError for what the contract cannot express, ArgumentError (a
    ValueError) for what it refuses."""
    device = None
    first = None
    for name, t in zip(kind.names, tensors):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != _DEVICE_TYPE:
            raise ValueError(f"{name} is on {t.device}; the kernels run on a CUDA device")
        if device is None:
            device, first = t.device, name
        elif t.device != device:
            raise ValueError(f"{name} is on {t.device}, {first} on {device}; all tensors must be on one device")
    given_free = {}
    for name, v in zip(kind.free, free):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be a Python int (a tensor would need a device-to-host sync), "
                            f"got {type(v).__name__}")
        given_free[name] = int(v)
    tmap = dict(zip(kind.names, tensors))
    kf = _m.folder()
    meta = kind.select(kf, tmap, options, given_free)
    plan = plan_for(meta["name"], meta)
    # The integers, from the tensors' shapes and strides through the contract's dims.
    ints = {}
    for p in plan.params:
        t = tmap.get(p.name) if p.pointer else None
        if t is None or not p.dims:
            continue
        if t.dim() != len(p.dims):
            raise ValueError(f"{p.name} must have {len(p.dims)} dimensions [{', '.join(d[0] for d in p.dims)}], "
                             f"got shape {tuple(t.shape)}")
        for k, (_, size, _) in enumerate(p.dims):
            if size.mul == 1 and len(size.factors) == 1:
                j = size.factors[0]
                if j not in ints and plan.names[j] not in given_free:
                    ints[j] = t.shape[k] - size.add
        for k, (_, _, stride) in enumerate(p.dims):
            j = stride.param()
            if j is not None and j not in ints and plan.names[j] not in given_free:
                ints[j] = t.stride(k) if t.shape[k] > 1 else 0
    args = {name: (None if t is None else _buffer(t)) for name, t in tmap.items()}
    for j, v in ints.items():
        args[plan.names[j]] = v
    args.update(given_free)
    checked = plan.check(args)
    values = checked.values
    # What the contract cannot say: the tensor is laid out as the kernel addresses it.
    for p in plan.params:
        t = tmap.get(p.name) if p.pointer else None
        if t is None or not p.dims:
            continue
        sizes, strides = plan.dims_of(p.name, values)
        if tuple(t.shape) != sizes or (0 not in sizes and any(
                sz > 1 and st != ts for sz, st, ts in zip(sizes, strides, t.stride()))):
            raise _layout_error(p.name, t, sizes, strides, [d[0] for d in p.dims])
    run_meta, run = _sized(kf, meta, plan, checked, args)
    prep = _Prepared()
    prep.meta = meta
    prep.name = meta["name"]
    prep.grid = run.grid
    prep.gx, prep.gy = run.grid[:2] if run.grid else (0, 0)
    prep.device = (device.index or 0) if device is not None else 0  # CPU tensors (tests): 0
    prep.launcher = None
    if run.grid is not None:
        prep.launcher = _launcher(kf, run_meta, run, prep.device)
    # Parameter values per call: pool = tensors' pointers + free integers + this plan's values.
    pos = {name: k for k, name in enumerate(kind.names)}
    nt, nf = len(kind.names), len(kind.free)
    order = []
    for i, p in enumerate(plan.params):
        if p.pointer and p.name in pos and tmap[p.name] is not None:
            order.append(pos[p.name])
        elif not p.pointer and p.name in given_free:
            order.append(nt + kind.free.index(p.name))
        else:
            order.append(nt + nf + i)
    # What a call with the same layouts still checks: alignment, overlap, the free integers.
    ext = [0] * nt
    for i, p in enumerate(plan.params):
        if p.pointer and p.name in pos and tmap[p.name] is not None:
            ext[pos[p.name]] = checked.extents[i] * p.elem_bytes
    bounds = []
    for name in given_free:
        k = kind.free.index(name)
        if name in plan.names:
            p = plan.params[plan.names.index(name)]
            deps = set((p.min.factors if p.min else ()) + (p.max.factors if p.max else ()))
            if any(plan.names[d] in given_free for d in deps):
                bounds = None  # a bound over another free integer: every call gets the full check
                break
            lo = p.min.eval(values) if p.min else -(1 << 63)
            hi = p.max.eval(values) if p.max else (1 << 63) - 1
        else:  # a constant of the kernel: that value only
            c = plan.constants[name]
            if any(plan.names[d] in given_free for d in c.factors):
                bounds = None
                break
            lo = hi = c.eval(values)
        bounds.append((k, lo, hi))
    prep.run, prep.go, prep.set_guard = _fast_path(kind, plan, pos, order, tuple(values), tuple(ext), bounds,
                                                   prep.launcher, prep.gx, prep.gy, prep.device,
                                                   tuple(t is not None for t in tensors))
    prep.guard = None
    stats["plans"] += 1
    pool = tuple(_ptr(t) for t in tensors) + tuple(free) + tuple(values)
    return prep, tuple(pool[k] for k in order)


def _sized(kf, meta, plan, checked, args):
    """The kernel a launch with these checked values runs, and its check (same values; its own
    grid and block): the size rule's kernel for the rows where it has one and its grid fits."""
    if checked.grid is None:
        return meta, checked
    values = checked.values
    run_meta = _m.by_size_rule(kf, meta, lambda name: values[plan.names.index(name)])
    if run_meta is meta:
        return meta, checked
    try:
        return run_meta, plan_for(run_meta["name"], run_meta).check(args)
    except ArgumentError:  # past a grid limit of that kernel: this one serves
        return meta, checked


def _launcher(kf, meta, checked, device):
    return _cuda.Launcher(_cuda.kernel(kf, meta).function(device), _cuda.primary_context(device), len(meta["params"]),
                          checked.block_threads, checked.shared_mem_bytes, kf.manifest.get("nvrtc"), meta["name"],
                          _cuda.param_kinds(meta["params"]), _cuda.uses_pdl(meta, device))


def _ptr(t):
    return 0 if t is None else (t.data_ptr() or (_EMPTY_ADDRESS if t.numel() == 0 else 0))


def _key(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.get_device())


_fast_sources: dict = {}


def _fast_path(kind: _Kind, plan, pos: dict, order: list, consts: tuple, ext: tuple, bounds, launcher, gx: int,
               gy: int, device: int, present: tuple):
    """``(run, go, set_guard)`` for a plan: straight-line code generated once per kernel, call kind
    and set of given tensors (the plan's numbers are bound in a closure).
    ``run(t0, .., f0, ..)`` (the call's tensors, None where absent, and free integers) does what a
    call with a planned layout still checks: the pointers are aligned and no written buffer
    overlaps another (docs/MANIFEST.md steps 7 and 8, pointer parts), each given free integer is
    an int inside its bounds; then it launches (_cuda.launch's body, inlined) and returns True.
    False: something is off, nothing was launched, the full check decides (and names it).
    ``go`` is ``run`` behind the plan's layout guard (set_guard(check) sets it): False also where
    the guard says no. A plan without a launch (nothing to do): True at once."""
    nt, nf = len(kind.names), len(kind.free)
    targs = [f"t{k}" for k in range(nt)]
    args = ", ".join(targs + [f"f{k}" for k in range(nf)])
    given = ", ".join(f"t{k}" for k in range(nt) if present[k])
    conds = []
    head = ""
    launch = "        return True\n"
    bind = ""
    L = ()
    if launcher is not None and bounds is None:
        conds = ["True"]  # a bound over another free integer: every call gets the full check
    elif launcher is not None:
        aligns: dict = {}
        ptrs = []
        for p in plan.params:
            if p.pointer and p.dims is not None and p.name in pos and present[pos[p.name]]:
                ptrs.append(p)
                if p.align > 1:
                    aligns.setdefault(p.align, []).append(pos[p.name])
        used = sorted({pos[p.name] for p in ptrs} | {j for j in order if j < nt})
        head = "".join(f"        p{k} = t{k}.data_ptr()\n" for k in used)
        for a, ks in sorted(aligns.items()):
            joined = " | ".join(f"p{k}" for k in ks)
            conds.append(f"({joined}) & {a - 1}" if a & (a - 1) == 0 else f"({joined}) % {a}")
        for x in range(len(ptrs)):
            for y in range(x + 1, len(ptrs)):
                p, q = ptrs[x], ptrs[y]
                a, b = pos[p.name], pos[q.name]
                if (p.writes or q.writes) and ext[a] and ext[b]:
                    # [pa, pa + ea) and [pb, pb + eb) overlap: -ea < pa - pb < eb
                    conds.append(f"n{a} < p{a} - p{b} < e{b}")
        for k, _, _ in bounds:
            conds.append(f"type(f{k}) is not int or f{k} < lo{k} or hi{k} < f{k}")
        vals = ", ".join(f"p{j}" if j < nt else f"f{j - nt}" if j < nt + nf else f"c{j - nt - nf}" for j in order)
        text, L = _cuda.launch_source(launcher, gx, gy)
        launch = "".join(f"        {line}\n" for line in text.format(stream="_stream(D)", values=vals).splitlines())
        launch += "        return True\n"
        bind = f"    {''.join(f'c{i}, ' for i in range(len(consts)))}= C\n"
        bind += f"    {''.join(f'e{k}, ' for k in range(nt))}= E\n    {''.join(f'n{k}, ' for k in range(nt))}= [-e for e in E]\n"
        if bounds:
            bind += f"    {''.join(f'lo{k}, hi{k}, ' for k, _, _ in bounds)}= [x for _, lo, hi in B for x in (lo, hi)]\n"
        bind += f"    {''.join(f'{name}, ' for name in _cuda._INLINE_NAMES)}= L\n"
    body = head + "".join(f"        if {c}:\n            return False\n" for c in conds) + launch
    src = (f"def make(C, E, B, L, D):\n{bind}    G = None\n\n"
           f"    def run({args}):\n{body}\n"
           f"    def go({args}):\n        if not G({given}):\n            return False\n{body}\n"
           f"    def set_guard(check):\n        nonlocal G\n        G = check\n\n"
           f"    return run, go, set_guard\n")
    make = _fast_sources.get(src)
    if make is None:
        scope: dict = {}
        # The module's globals: the generated code calls _stream as this module has it now.
        exec(compile(src, f"<mla_gen fast path: {plan.kernel}>", "exec"), globals(), scope)  # noqa: S102
        make = _fast_sources[src] = scope["make"]
    return make(consts, ext, bounds if bounds else (), L, device)


try:  # a C++ check of dtype, device, shape, strides (and dispatch keys, requires_grad) of many tensors
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # pragma: no cover - torch without it: _LayoutKey, the same check in Python
    _TensorGuards = None
class _LayoutKey:
    """The guard where torch has no TensorGuards: the tensors' (shape, strides, dtype, device)."""

    __slots__ = ("key",)

    def __init__(self, tensors):
        self.key = tuple([_key(t) for t in tensors])

    def check(self, *tensors):
        return tuple([_key(t) for t in tensors]) == self.key


def _layout_guard(tensors: tuple):
    """A check that later tensors have the layouts (dtype, device, shape, strides) these have,
    for the given (not None) ones, in order (which are None is part of the plan and of the call's
    `how`): torch's TensorGuards (one C++ call, ~0.1 us a tensor; stricter: also the dispatch keys
    and requires_grad, so it may say no where the plan would serve, and the call then looks the
    plan up by its key; it refuses one tensor object in two slots, and then _LayoutKey serves),
    else _LayoutKey."""
    ts = tuple([t for t in tensors if t is not None])
    if _TensorGuards is not None:
        try:
            g = _TensorGuards(*ts, dynamic_dims_sizes=None, dynamic_dims_strides=None)
            if g.check(*ts):
                return g
        except (TypeError, RuntimeError):
            pass
    return _LayoutKey(ts)


def _guard(prep, tensors: tuple):
    prep.guard = _layout_guard(tensors)
    prep.set_guard(prep.guard.check)


_NO_PLAN = (None, None, None)  # (how, go, plan) of a call kind's previous call


def _planned(kind: _Kind, how: tuple, options: tuple, tensors: tuple, free: tuple):
    """The plan for a call whose guard said no: looked up by the layouts' key (its guard
    renewed: the previous one may have been made under other dispatch keys); None where there was
    none, after the full check, the plan and the launch (_first)."""
    try:
        key = (kind, how, tuple([_key(t) for t in tensors]))
        prep = _plans.get(key)
    except (AttributeError, TypeError):
        key = prep = None
    if prep is None:
        _first(kind, options, tensors, free, key)
        return None
    _guard(prep, tensors)
    return prep


def _go(prep, tensors: tuple, free: tuple, kind, options):
    """A planned call: the per-call checks and the launch (prep.run), the full check where they
    fail (it raises the error that names the problem, or launches)."""
    if prep.launcher is None:
        return
    if not prep.run(*tensors, *free):
        prep, values = _prepare(kind, options, tensors, free)
        if prep.launcher is not None:
            _cuda.launch(prep.launcher, values, prep.gx, prep.gy, _stream(prep.device))


def _first(kind, options, tensors, free, key):
    """A call whose layouts have no plan yet: the full check, the plan, the launch."""
    prep, values = _prepare(kind, options, tensors, free)
    if key is not None:
        _guard(prep, tensors)
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = prep
    if prep.launcher is not None:
        _cuda.launch(prep.launcher, values, prep.gx, prep.gy, _stream(prep.device))


def _call(kind: _Kind, options: tuple, tensors: tuple, free: tuple):
    """One call of any kind: the plan for these layouts, the per-call checks, the launch."""
    try:
        key = (kind, options, _m.env_value(), tuple([_key(t) for t in tensors]), tuple([v is None for v in free]))
        prep = _plans.get(key)
    except (AttributeError, TypeError):
        key = prep = None
    if prep is None:
        return _first(kind, options, tensors, free, key)
    _go(prep, tensors, free, kind, options)


def _no_kernel(kf, family, what):
    return ValueError(f"no generated {family} kernel for {what} in {kf.label}; add it to the spec "
                      f"([[{family}]]) and regenerate, or set MLA_GEN_KERNELS")


def _dims(t, name, rank):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions, got shape {tuple(t.shape)}")
    return t.shape


# ---- merge_attn_states (vLLM's), per-tensor FP8 included ----

# The previous plain call's (how, go, plan): one slot for the function, one for the operator
# (torch.ops.mla_gen.merge_attn_states), so that code calling both with different layouts does
# not make each call look its plan up again.
_last_pair = _NO_PLAN
_last_pair_op = _NO_PLAN


def _pair_planned(how, tensors, n, lse_layout, op):
    """The plain call whose `go` said no: the plan (or the first call's full check), the slot,
    the per-call checks and the launch."""
    global _last_pair, _last_pair_op
    prep = _planned(_PAIR, how, (lse_layout,), tensors, (n,))
    if prep is None:
        return
    if op:
        _last_pair_op = (how, prep.go, prep)
    else:
        _last_pair = (how, prep.go, prep)
    _go(prep, tensors, (n,), _PAIR, (lse_layout,))


_CTX_MASK = " with the empty-context mask (mask_empty_context = true)"


def _select_pair(kf, tmap, options, free):
    (lse_layout,) = options
    prefix = tmap["prefix_output"]
    D = _dims(prefix, "prefix_output", 3)[2]
    fp8 = tmap["output_scale"] is not None
    ctx = tmap.get("query_start_loc") is not None
    want = dict(output="fp8_e4m3" if fp8 else "same", output_lse=tmap["output_lse"] is not None,
                threshold="prefill_tokens_with_context" in free, lse_layout=lse_layout, mask_empty_context=ctx)
    hit = _m.select(kf, "merge_attn_states", prefix.dtype, D, **want)
    if hit is None:
        raise _no_kernel(kf, "merge_attn_states", f"dtype={prefix.dtype}, head_size={D}, "
                         f"output={want['output']}, lse_layout={lse_layout}" + (_CTX_MASK if ctx else ""))
    return hit[0]


_PAIR = _Kind("merge_attn_states", ("output", "output_lse", "prefix_output", "prefix_lse", "suffix_output",
                                    "suffix_lse", "output_scale"), ("prefill_tokens_with_context",), _select_pair)
def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None,
                      prefill_tokens_with_context=None, output_scale=None, *, output_group_scales=None,
                      ue8m0: bool = False, lse_layout: str = "head_major", query_start_loc=None,
                      context_start_loc=None) -> None:
    """vLLM's ``merge_attn_states``: output [T, H, D] (written), prefix/suffix outputs [T, H, D]
    (each with its own token and head strides, the head dim contiguous), lse float32 [H, T]
    (``lse_layout="token_major"``: [T, H], where the kernel folder has such kernels); tokens
    ``t >= prefill_tokens_with_context`` copy the suffix (None: every token has context).
    ``output_lse``: the merged lse, same layout, or None.

    With ``output_scale`` (a float32 tensor holding one scale) the output is
    ``torch.float8_e4m3fn``: saturate(value * (1 / scale)), the reciprocal rounded to float32
    once (docs/SEMANTICS.md), nearest even. With ``output_group_scales`` (float32
    [T, H * D / G], any strides) the output is e4m3 with one scale per group of G elements,
    computed by the kernel and written there (see merge_attn_states_fp8_group).

    With ``query_start_loc`` and ``context_start_loc`` (int32 [B + 1] each, on the device; both
    or neither) the empty-context mask is fused into the merge (a kernel generated with
    ``mask_empty_context = true``): the tokens t < n of a request b (tokens
    ``query_start_loc[b]:query_start_loc[b+1]``) whose context is empty
    (``context_start_loc[b+1] == context_start_loc[b]``) read ``prefix_lse`` as -inf, bit for bit
    what ``mask_empty_context_lse`` on a copy of prefix_lse followed by the plain merge gives;
    ``prefix_lse`` itself is not written, and the start locations are not read on the host.
    B = ``query_start_loc.numel() - 1``.

    Raises TypeError/ValueError for what the kernel cannot take; ArgumentError (a ValueError)
    carries the argument check's text ``"<kernel>: <problem>"``."""
    if output_group_scales is not None or query_start_loc is not None or context_start_loc is not None:
        return _merge_attn_states_other(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
                                        prefill_tokens_with_context, output_scale, output_group_scales, ue8m0,
                                        lse_layout, query_start_loc, context_start_loc)
    # The fast path: the previous call's plan, where the call has the same options and its `go`
    # (the plan's guard, the per-call checks, the launch) takes these tensors.
    how = (lse_layout, _env_get(_ENV_KEY), output_lse is None, output_scale is None, prefill_tokens_with_context is None)
    last_how, go, _ = _last_pair
    if how != last_how or not go(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, output_scale,
                                 prefill_tokens_with_context):
        _pair_planned(how, (output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, output_scale),
                      prefill_tokens_with_context, lse_layout, False)


def merge_attn_states_op(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse,
                         prefill_tokens_with_context=None, output_scale=None, query_start_loc=None,
                         context_start_loc=None) -> None:
    """The implementation of ``torch.ops.mla_gen.merge_attn_states`` (the op's argument order):
    merge_attn_states's fast path written out again, with its own slot, so that the dispatcher
    calls one Python function. Everything else goes through merge_attn_states."""
    if query_start_loc is not None or context_start_loc is not None:
        return merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
                                 prefill_tokens_with_context, output_scale, query_start_loc=query_start_loc,
                                 context_start_loc=context_start_loc)
    how = ("head_major", _env_get(_ENV_KEY), output_lse is None, output_scale is None,
           prefill_tokens_with_context is None)
    last_how, go, _ = _last_pair_op
    if how != last_how or not go(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, output_scale,
                                 prefill_tokens_with_context):
        _pair_planned(how, (output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, output_scale),
                      prefill_tokens_with_context, "head_major", True)


def launch_kernel(kernel: str, args: dict, *, device: int | None = None) -> None:
    """Launch one kernel of the current folder by name (the scripts' way to time a given
    schedule): `args` by parameter name as ``check_args`` takes them, torch tensors standing for
    their buffers. Always the full check; on torch's current stream of `device` (default: the
    first tensor's device, else the current device). A kernel with a size rule launches the
    rule's kernel for the call's rows, as every call does."""
    kf = _m.folder()
    meta = kf.kernel(kernel)
    plan = plan_for(kernel, meta)
    conv = {}
    for name, a in args.items():
        if isinstance(a, torch.Tensor):
            if device is None:
                device = a.get_device()
            a = _buffer(a)
        conv[name] = a
    checked = plan.check(conv)
    meta, checked = _sized(kf, meta, plan, checked, conv)
    if checked.grid is None:
        return
    device = torch.cuda.current_device() if device is None or device < 0 else device
    _cuda.launch(_launcher(kf, meta, checked, device), checked.values, checked.grid[0], checked.grid[1],
                 _stream(device))


# The other calls (per-token-group FP8, the fused empty-context mask, the K-way and in-place
# merges, the lse mask) live in _torch_families; imported last, as they build on this module.
from ._torch_families import (_PAIR_CTX, _both_or_neither, _merge_attn_states_other,  # noqa: E402,F401
                              mask_empty_context_lse, merge_attn_states_fp8_group, merge_state_in_place,
                              merge_states)

__all__ = ["merge_attn_states", "merge_attn_states_fp8_group", "merge_states", "merge_state_in_place",
           "mask_empty_context_lse", "ArgumentError"]

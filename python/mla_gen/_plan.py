"""Planning: which kernel serves a call, and the plan that checks and launches calls of its layouts.

A call's tensors are mapped to the kernel's parameters by name; the integer parameters (sizes
and strides) are read from the tensors through the contract's dims (a dim of size ``num_tokens``
gives ``num_tokens``, a stride ``output_token_stride`` gives that stride); a buffer's length is
the elements from its pointer to the end of its storage. The contract then decides everything it
can (docs/MANIFEST.md, "The check"). This module adds only what the contract cannot say: a
torch.Tensor on the kernels' device type, all on one device, of the rank the kernel addresses,
and laid out as the kernel addresses it (the shape and strides its dims give, e.g. a contiguous
head dim).

``prepare`` runs that full check once per layout (shapes, strides, dtypes, device) and returns a
plan, whose generated fast path (_fastpath) checks later calls with the same layouts only for what
depends on the pointers and on the free integers. The storage-length rule needs no per-call work:
torch keeps every tensor inside its storage, and the plan checked these layouts. The kinds (which
tensors bind which parameters, how an error names a call: binding.json) and the refusals' texts are _binding's,
the table the compiled op reads too.

Nothing here reads a global setting of the calls: the device type and the stream function come
in as arguments (_torch holds them, tests and the benches replace them there).
"""

from __future__ import annotations

import torch

from . import _cuda, _fastpath
from . import manifest as _m
from ._binding import ELEMS, LSE_LAYOUTS, TEXTS, Kind, shape_text
from ._select import bound_param
from .contract import ArgumentError, Buffer, plan_for

_ELEM = {getattr(torch, name): elem for name, elem in ELEMS.items() if hasattr(torch, name)}

# Where an empty tensor has no storage (data_ptr 0) it stands at this address: nothing is read
# or written through it (its extent is 0, or the check refuses it as too short).
EMPTY_ADDRESS = 1 << 12

stats = {"plans": 0}  # full checks that built a plan (mla_gen.stats())


def _elem(dtype) -> str:
    return _ELEM.get(dtype) or str(dtype).removeprefix("torch.")


def buffer(t: torch.Tensor) -> Buffer:
    """The contract's view of a tensor: its address, the elements from there to the end of its
    storage, its element type."""
    size = t.element_size()
    ptr = t.data_ptr()
    length = (t.untyped_storage().nbytes() - t.storage_offset() * size) // size
    if ptr == 0 and t.numel() == 0:
        ptr, length = EMPTY_ADDRESS, 0
    return Buffer(ptr, length, _elem(t.dtype))


def pointer(t):
    return 0 if t is None else (t.data_ptr() or (EMPTY_ADDRESS if t.numel() == 0 else 0))


def layout_key(t):
    """What a plan depends on of a tensor: shape, strides, dtype, device (None: not given)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.get_device())


class Prepared:
    """A plan: the kernel, its launcher (None: nothing to launch), grid and device, and the fast
    path (run, go, set_guard: _fastpath.build) with its layout guard."""

    __slots__ = ("launcher", "run", "go", "set_guard", "guard", "grid", "device", "meta", "name", "gx", "gy")


def _layout_error(name, t, sizes, strides, labels, layout=None):
    """The error for a tensor not laid out as the kernel addresses it. `layout`: the call's
    lse_layout where its kind has one: an lse (a 2-D tensor whose name ends in ``lse``) given as
    the addressed one transposed gets the other layout as ``lse_hint`` (text ``lse_layout_hint``),
    which the entry points whose caller chooses the layout append (mla_gen.functions)."""
    want = ", ".join(f"{lab}={s}" for lab, s in zip(labels, sizes))
    if tuple(t.shape) != tuple(sizes):  # the wanted strides would be read from this tensor's own
        e = ValueError(TEXTS["shape"].format(name=name, shape=shape_text(t.shape), want=want))
        if layout is not None and name.endswith("lse") and len(sizes) == 2 and tuple(t.shape) == tuple(sizes)[::-1]:
            e.lse_hint = TEXTS["lse_layout_hint"].format(labels=", ".join(labels[::-1]),
                                                         layout=LSE_LAYOUTS[1 - LSE_LAYOUTS.index(layout)])
        return e
    return ValueError(TEXTS["layout"].format(name=name, shape=shape_text(t.shape), strides=shape_text(t.stride()),
                                             want=want, want_strides=shape_text(strides)))


def _shaped(plan, tmap, first=()):
    """(parameter, tensor) for each given tensor the contract addresses through dims: those named
    in `first` (the tensors that describe the call), then the rest, each in signature order."""
    given = [(p, tmap[p.name]) for p in plan.params if p.pointer and p.dims and tmap.get(p.name) is not None]
    return [g for g in given if g[0].name in first] + [g for g in given if g[0].name not in first]


def _not_as_addressed(p, t, sizes, strides, gave, layout=None):
    """The error for tensor `t` (parameter `p`) not laid out as the kernel addresses it: where its
    sizes are not those sizes reordered (an lse [H, T] given for [T, H]) and one contradicts the
    tensor that gave that integer (`gave`: parameter index -> (param, dim, tensor)), both tensors
    named; else the layout the kernel addresses (`layout`: _layout_error's)."""
    if sorted(t.shape) != sorted(sizes):
        for k, (label, size, _) in enumerate(p.dims):
            first = gave.get(bound_param(size))
            if t.shape[k] != sizes[k] and first is not None and first[0] is not p:
                fp, fk, ft = first
                return ValueError(TEXTS["disagree"].format(
                    name=p.name, label=label, size=t.shape[k], shape=shape_text(t.shape),
                    labels=", ".join(d[0] for d in p.dims), first=fp.name, first_label=fp.dims[fk][0],
                    first_size=ft.shape[fk], first_shape=shape_text(ft.shape),
                    first_labels=", ".join(d[0] for d in fp.dims)))
    return _layout_error(p.name, t, sizes, strides, [d[0] for d in p.dims], layout)


def _check_laid_out(plan, p, t, values, gave, layout=None):
    """Tensor `t` (parameter `p`) has the shape and strides the kernel addresses it by at these
    integer `values` (strides of size-1 dims, and of empty tensors, aside); else the error."""
    sizes, strides = plan.dims_of(p.name, values)
    if tuple(t.shape) != sizes or (0 not in sizes and any(
            sz > 1 and st != ts for sz, st, ts in zip(sizes, strides, t.stride()))):
        raise _not_as_addressed(p, t, sizes, strides, gave, layout)


def one_device(named, device_type: str):
    """The device of the tensors in `named` ((name, tensor) pairs, None skipped) and the name of
    the first, after the checks: each on a device of `device_type`, all on one device. (None,
    None) where none is given."""
    device = first = None
    for name, t in named:
        if t is None:
            continue
        if t.device.type != device_type:
            raise ValueError(TEXTS["not_on_device"].format(name=name, device=t.device))
        if device is None:
            device, first = t.device, name
        elif t.device != device:
            raise ValueError(TEXTS["two_devices"].format(name=name, device=t.device, first=first, first_device=device))
    return device, first


def _arguments(kind: Kind, tensors: tuple, free: tuple, device_type: str):
    """The call's device and free integers given by name, after what the contract cannot say of
    them: a tensor for each of the kind's tensors (None only where it is optional), on one device
    of `device_type`; free integers as Python ints."""
    for name, t in zip(kind.names, tensors):
        if not isinstance(t, torch.Tensor) and (t is not None or name not in kind.optional):
            raise TypeError(TEXTS["not_tensor"].format(name=name, type=type(t).__name__))
    device, _ = one_device(zip(kind.names, tensors), device_type)
    given_free = {}
    for name, v in zip(kind.free, free):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be a Python int (a tensor would need a device-to-host sync), "
                            f"got {type(v).__name__}")
        given_free[name] = int(v)
    return device, given_free


def _stride(t, k: int) -> int:
    """Dim k's stride as the kernel gets it. A dim of size 1 is addressed at index 0 only, so any
    stride serves and torch's may be anything: pass the one a packed dim would have (the next
    dim's stride, as passed, times its size; 1 for the last), which a dense specialization
    accepts."""
    if t.shape[k] > 1:
        return t.stride(k)
    return _stride(t, k + 1) * t.shape[k + 1] if k + 1 < t.dim() else 1


def prepare(kind: Kind, options: tuple, tensors: tuple, free: tuple, device_type: str, stream):
    """Check a call in full; returns (plan for this layout, the parameter values of this call).
    Raises TypeError/ValueError for what the contract cannot express, ArgumentError (a
    ValueError) for what it refuses. `stream(device)`: the launch's stream, called per launch."""
    device, given_free = _arguments(kind, tensors, free, device_type)
    tmap = dict(zip(kind.names, tensors))
    kf = _m.folder()
    meta = select(kind, kf, tmap, options, given_free)
    layout = dict(zip(kind.options, options)).get("lse_layout")  # for the hint of an lse given transposed
    plan = plan_for(meta["name"], meta)
    # The integers, from the tensors' shapes and strides through the contract's dims, the tensors
    # that describe the call first (a tensor that contradicts them is the one named).
    shaped = _shaped(plan, tmap, kind.described())
    ints, gave = {}, {}
    for p, t in shaped:
        if t.dim() != len(p.dims):
            raise ValueError(TEXTS["param_rank"].format(name=p.name, rank=len(p.dims), shape=shape_text(t.shape),
                                                        labels=", ".join(d[0] for d in p.dims)))
        for k, (label, size, _) in enumerate(p.dims):
            j = bound_param(size)
            if j is not None and j not in ints and plan.names[j] not in given_free:
                if t.shape[k] < size.add:  # the integer would be negative: the dim holds too few
                    raise ValueError(TEXTS["too_short"].format(name=p.name, least=size.add, label=label,
                                                               param=plan.names[j], shape=shape_text(t.shape)))
                ints[j], gave[j] = t.shape[k] - size.add, (p, k, t)
        for k, (_, _, stride) in enumerate(p.dims):
            j = stride.param()
            if j is not None and j not in ints and plan.names[j] not in given_free:
                ints[j] = _stride(t, k)
    # What the contract cannot say, before it (as the compiled op): each tensor is laid out as the
    # kernel addresses it by those integers. A dim over an integer no tensor gives (none in the
    # default kernels: test_torch_cpu.py) waits for the contract's values.
    known = [ints.get(j, given_free.get(name)) for j, name in enumerate(plan.names)]
    later = []
    for p, t in shaped:
        if any(known[f] is None for _, size, stride in p.dims for f in size.factors + stride.factors):
            later.append((p, t))
        else:
            _check_laid_out(plan, p, t, known, gave, layout)
    args = {name: (None if t is None else buffer(t)) for name, t in tmap.items()}
    for j, v in ints.items():
        args[plan.names[j]] = v
    args.update(given_free)
    checked = plan.check(args)
    values = checked.values
    for p, t in later:
        _check_laid_out(plan, p, t, values, gave, layout)
    varying = {plan.names.index(name) for name in given_free if name in plan.names}
    run_meta, run, per_call = sized(kf, meta, plan, checked, args, varying)
    per_call |= any(not varying.isdisjoint(e.factors) for e, _, _ in plan.limits)  # the fast path checks no limit
    prep = Prepared()
    prep.meta = meta
    prep.name = meta["name"]
    prep.grid = run.grid
    prep.gx, prep.gy = run.grid[:2] if run.grid else (0, 0)
    prep.device = (device.index or 0) if device is not None else 0  # CPU tensors (tests): 0
    prep.launcher = None
    if run.grid is not None:
        prep.launcher = make_launcher(kf, run_meta, run, prep.device)
    sources = _launch_values(kind, plan, tensors, given_free, values)
    # The free integers' bounds are the launched kernel's: a call outside a specialization's
    # (a threshold below T for `_dense_nothr`) takes the full check, which chooses again.
    run_plan = plan if run_meta is meta else plan_for(run_meta["name"], run_meta)
    preferred = _preferred_ranges(kf, meta, plan, run_meta, values, given_free, kind)
    prep.run, prep.go, prep.set_guard = _fast_path(kind, plan, run_plan, checked, tensors, free, given_free, sources,
                                                   prep, stream, per_call, preferred)
    prep.guard = None
    stats["plans"] += 1
    pointers = [pointer(t) for t in tensors]
    return prep, tuple(pointers[s[1]] if s[0] == "tensor" else free[s[1]] if s[0] == "free" else s[2]
                       for s in sources)


def _launch_values(kind: Kind, plan, tensors: tuple, given_free: dict, values) -> list:
    """Where each kernel parameter's value comes from in a call of this plan: ("tensor", k) the
    k-th tensor's pointer, ("free", k) the k-th free integer, ("plan", name, value)."""
    pos = {name: k for k, name in enumerate(kind.names)}
    out = []
    for i, p in enumerate(plan.params):
        if p.pointer and p.name in pos and tensors[pos[p.name]] is not None:
            out.append(("tensor", pos[p.name]))
        elif not p.pointer and p.name in given_free:
            out.append(("free", kind.free.index(p.name)))
        else:
            out.append(("plan", p.name, values[i]))
    return out


def _preferred_ranges(kf, meta, plan, run_meta, values, given_free, kind) -> list:
    """The free integers' ranges where a specialization tried before the launched kernel would
    serve this layout instead: ``[[(free index, lo, hi), ...], ...]``, one list per such kernel
    (the call is in it when every free integer is in its range). A plan of `_dense` refuses a
    threshold equal to T, which `_dense_nothr` takes (the full check then plans the twin), instead
    of launching the slower kernel for it. Only ranges its bounds state over the plan's fixed
    values, and where the kernel accepts both ends: otherwise no range (the plan keeps such calls,
    correct as before)."""
    if run_meta is meta or not given_free:
        return []
    chosen = _m.by_size_rule(kf, meta, lambda name: values[plan.names.index(name)])
    out = []
    for name in chosen["launch"].get("specializations", ()):
        if name == run_meta["name"]:
            break
        kplan = plan_for(name, kf.kernel(name))
        ranges, ends = [], [list(values), list(values)]
        for free_name in given_free:
            if free_name not in plan.names:
                ranges = None
                break
            i = plan.names.index(free_name)
            lo, hi = _free_bounds(kplan.params[i], values, plan, given_free) or (None, None)
            if lo is None or hi is None:  # unstated, over another free integer or overflowing: no range
                ranges = None
                break
            ranges.append((kind.free.index(free_name), lo, hi))
            ends[0][i], ends[1][i] = lo, hi
        if ranges and all(kplan.accepts(v) for v in ends):
            out.append(ranges)
    return out


def _free_bounds(p, values, plan, given_free):
    """A free integer's (min, max) in parameter `p`'s bounds over the plan's values, each None
    where unstated or overflowing 64 bits; None where a bound reads another free integer (it
    changes from call to call)."""
    deps = (p.min.factors if p.min else ()) + (p.max.factors if p.max else ())
    if any(plan.names[d] in given_free for d in deps):
        return None
    return (p.min.eval(values) if p.min else None, p.max.eval(values) if p.max else None)


def _fast_path(kind, plan, run_plan, checked, tensors, free, given_free, sources, prep, stream, per_call,
               preferred=()):
    """The plan's per-call checks (what a call with the same layouts still checks: alignment,
    overlap, the free integers' bounds in `run_plan`, the contract of the kernel it launches) and
    launch, generated by _fastpath. `per_call`: the kernel chosen depends on a free integer in a
    way those bounds do not hold, so every call gets the full check (which chooses). `preferred`:
    the free integers' ranges a kernel tried before this one serves (_preferred_ranges), refused."""
    pos = {name: k for k, name in enumerate(kind.names)}
    given = [p for p in plan.params if p.pointer and p.dims is not None and p.name in pos
             and tensors[pos[p.name]] is not None]
    aligned: dict = {}
    for p in given:
        if p.align > 1:
            aligned.setdefault(p.align, []).append(pos[p.name])
    extents = [0] * len(kind.names)
    for i, p in enumerate(plan.params):
        if p.pointer and p.name in pos and tensors[pos[p.name]] is not None:
            extents[pos[p.name]] = checked.extents[i] * p.elem_bytes
    overlaps = [(pos[p.name], pos[q.name]) for x, p in enumerate(given) for q in given[x + 1:]
                if (p.writes or q.writes) and extents[pos[p.name]] and extents[pos[q.name]]]
    values = checked.values
    bounds = []
    for name in given_free:
        if name in plan.names:
            found = _free_bounds(run_plan.params[plan.names.index(name)], values, plan, given_free)
            if found is None:
                bounds = None  # a bound over another free integer: every call gets the full check
                break
            # An unstated bound, or one that overflows 64 bits, binds nothing (as in the check).
            lo = -(1 << 63) if found[0] is None else found[0]
            hi = (1 << 63) - 1 if found[1] is None else found[1]
        else:  # a constant of the kernel: that value only
            c = plan.constants[name]
            if any(plan.names[d] in given_free for d in c.factors):
                bounds = None
                break
            lo = hi = c.eval(values)
        bounds.append((kind.free.index(name), lo, hi))
    if per_call:
        bounds = None
    present = tuple(t is not None for t in tensors) + tuple(v is not None for v in free)
    launch = None if prep.launcher is None else (prep.launcher, prep.gx, prep.gy)
    return _fastpath.build(plan.kernel, kind.names, kind.free, present, sorted(aligned.items()), overlaps,
                           tuple(extents), bounds, sources, launch, prep.device, stream, preferred)


def sized(kf, meta, plan, checked, args, varying=frozenset()):
    """The kernel a launch with these checked values runs, its check (same values; its own grid
    and block), and whether that choice read a parameter in `varying` (indexes of the integers a
    plan's later calls may change, so each of them must choose again): the size rule's kernel
    for the rows where it has one (docs/MANIFEST.md, "Size rules"), then the first of that
    kernel's specializations whose integer bounds and limits the values meet
    ("Specializations"); a kernel whose grid would pass a limit is passed over."""
    if checked.grid is None:
        return meta, checked, False
    values = checked.values
    chosen = _m.by_size_rule(kf, meta, lambda name: values[plan.names.index(name)])
    rule = meta["launch"].get("size_rule")
    per_call = bool(rule) and any(plan.names.index(name) in varying for name in rule["rows"])
    base = plan_for(chosen["name"], chosen)
    for k in [kf.kernel(name) for name in chosen["launch"].get("specializations", ())] + [chosen]:
        if k is meta:
            break
        kplan = plan_for(k["name"], k)
        if k is not chosen:
            # A free integer this choice reads: the fast path checks it against the launched
            # kernel's bounds (_fast_path), so only what those do not hold makes the choice per call.
            per_call |= not varying.isdisjoint(kplan.reads_beyond(base) - kplan.rebound(base).keys())
            if not kplan.accepts(values):
                continue
        try:
            return k, kplan.check(args), per_call
        except ArgumentError:  # past a grid limit of that kernel: the next one serves
            pass
    return meta, checked, per_call


def make_launcher(kf, meta, checked, device):
    return _cuda.Launcher(_cuda.kernel(kf, meta).function(device), _cuda.primary_context(device), len(meta["params"]),
                          checked.block_threads, checked.shared_mem_bytes, kf.manifest.get("nvrtc"), meta["name"],
                          _cuda.param_kinds(meta["params"]), _cuda.uses_pdl(meta, device))


# ---- the layout guard ----

try:  # a C++ check of dtype, device, shape, strides (and dispatch keys, requires_grad) of many tensors
    from torch._C._dynamo.guards import TensorGuards
except ImportError:  # pragma: no cover - torch without it: LayoutKey, the same check in Python
    TensorGuards = None


class LayoutKey:
    """The guard where torch has no TensorGuards: the tensors' (shape, strides, dtype, device)."""

    __slots__ = ("key",)

    def __init__(self, tensors):
        self.key = tuple([layout_key(t) for t in tensors])

    def check(self, *tensors):
        try:
            return tuple([layout_key(t) for t in tensors]) == self.key
        except (AttributeError, TypeError):  # not a tensor: no plan's layout; the full check names it
            return False


def layout_guard(tensors: tuple):
    """A check that later tensors have the layouts (dtype, device, shape, strides) these have,
    for the given (not None) ones, in order (which are None is part of the plan, checked by its
    `go`): torch's TensorGuards (one C++ call, ~0.1 us a tensor; stricter: also the dispatch keys
    and requires_grad, so it may say no where the plan would serve, and the call then looks the
    plan up by its key; it refuses one tensor object in two slots, and then LayoutKey serves),
    else LayoutKey."""
    ts = tuple([t for t in tensors if t is not None])
    if TensorGuards is not None:
        try:
            g = TensorGuards(*ts, dynamic_dims_sizes=None, dynamic_dims_strides=None)
            if g.check(*ts):
                return g
        except (TypeError, RuntimeError):
            pass
    return LayoutKey(ts)


def set_guard(prep: Prepared, tensors: tuple):
    prep.guard = layout_guard(tensors)
    prep.set_guard(prep.guard.check)


# ---- which kernel serves a call: the kinds and their selection ----

def select(kind: Kind, kf, tmap: dict, options: tuple, free: dict) -> dict:
    """The manifest entry that serves a call of `kind` (manifest.select over the call's tensors:
    element types and sizes; its free integers, given, their values left to each call; its
    options by name), else the error that names the call."""
    what = kind.describe(tmap, options)  # first: it also refuses what no kernel could mean
    args = {name: (_elem(t.dtype) if name in kind.typed else None, tuple(t.shape))
            for name, t in tmap.items() if t is not None}
    args.update(dict.fromkeys(free))
    named = {k: (("true" if v else "false") if isinstance(v, bool) else v) for k, v in zip(kind.options, options)}
    hit = _m.select(kf, kind.family, args, named)
    if hit is None:
        # Where the tensors that describe the call select a kernel, another tensor disagrees with
        # them (a head size, a dtype): that kernel's check names which, instead of "no kernel".
        described = kind.described()
        probe = {name: (None, None) if isinstance(a, tuple) and name not in described else a
                 for name, a in args.items()}
        hit = _m.select(kf, kind.family, probe, named) if probe != args else None
    if hit is not None and not hit[1] and kind.group_size(tmap) not in (None, _fp8_group(hit[0])):
        # The nearest kernel groups otherwise (its scales' width binds the head count, so it
        # only disagrees on a size): none serves this group size, and the error says which.
        hit = None
    if hit is None:
        raise ValueError(TEXTS["no_kernel"].format(family=kind.family, what=what, label=kf.label))
    return hit[0]


def _fp8_group(kernel: dict):
    """The group size a per-token-group FP8 kernel was built for, else None."""
    return (kernel.get("variant", {}).get("fp8_group") or {}).get("group_size")


def lse_f32(s, name):
    """An engine API's lse as float32 (FlashInfer and sgl-kernel read it so whatever it is given),
    or the error that names the argument where it is not a tensor."""
    if not isinstance(s, torch.Tensor):
        raise TypeError(TEXTS["not_tensor"].format(name=name, type=type(s).__name__))
    return s.to(torch.float32)


def dims(t, name, rank):
    if not isinstance(t, torch.Tensor):
        raise TypeError(TEXTS["not_tensor"].format(name=name, type=type(t).__name__))
    if t.dim() != rank:
        raise ValueError(TEXTS["rank"].format(name=name, rank=rank, shape=shape_text(t.shape)))
    return t.shape

"""The torch functions: each turns its arguments into a call of a kind (_plan: which tensors bind
which kernel parameters, the free integers, which kernel serves), finds the plan of the call's
layouts and launches on torch's current stream (no device-to-host sync, so CUDA graphs can
capture it).

Where a call finds its plan, fastest first:

- its entry point's slot ``[options, go, plan, folder]``: the previous call's plan, where the
  call has the same options and kernel folder and the plan's generated ``go`` takes it (the same
  arguments given, the layout guard, the per-call checks; then it launches);
- the plan cache, by the call's kind, options, folder and layouts (``_lookup``): a few plans per
  layout, one per kernel the free integers' values launch (a threshold below T, equal to T);
- the full check (_plan.prepare), which makes the plan, or raises the error that names the problem.

Anything off on the way down reruns the full check, so every error is the full check's. The
plain merge_attn_states and its operator share one fast path (``_merge``), each with its own slot,
so that code calling both with different layouts does not make each call look its plan up again.

Which calls come here (mla_gen/ops.py says the routes in one place): every plain function and
the FlashInfer, SGLang and vLLM APIs; the torch ops only where the compiled op (mla_gen._ext) is
absent. The plain merge_attn_states comes here even where the compiled op serves the op: on the
H200 its fast path cost less per call than the compiled op of session 9 (GPU runs 74-75: 7.41 against 7.61 us, 10.70 against 12.11 us;
docs/PERFORMANCE.md), which checked the whole contract on every call. The compiled op now keeps a
plan per layout too (session 10: on the CPU machine, sending the function's calls to it costs
about what this path costs; not yet measured on the GPU).
"""

from __future__ import annotations

import os

import torch

from . import _cuda, _plan
from . import manifest as _m
from ._binding import GROUP, GROUP_CTX, IN_PLACE, LSE_LAYOUTS, MASK, PAIR, PAIR_CTX, STATES, TEXTS
from .contract import ArgumentError, plan_for

# $MLA_GEN_KERNELS as stored, for the slots' folder (only compared with itself): one C call
if _m._env_data is not None:
    _env_get, _ENV_KEY = _m._env_data.get, _m._env_key
else:  # pragma: no cover - an os.environ without _data
    _env_get, _ENV_KEY = (lambda key: _m.env_value()), None

_MAX_PLANS = 4096
# Tests without a GPU run the whole path on CPU tensors with the launch replaced (tests/conftest,
# bench/host_cost_stub.py): they set these two here.
_DEVICE_TYPE = "cuda"
_plans: dict = {}


def _stream(device: int) -> int:
    """torch's current stream on `device` (its CUstream as an int)."""
    return torch.cuda.current_stream(device).cuda_stream


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
if _raw_stream is not None:
    _stream = _raw_stream  # noqa: F811 - the same answer, one C call (each plan's fast path calls it)


# ---- finding a call's plan ----

def _prepare(kind, options, tensors, free):
    return _plan.prepare(kind, options, tensors, free, _DEVICE_TYPE, _stream)


def _launch(prep, values):
    if prep.launcher is not None:
        _cuda.launch(prep.launcher, values, prep.gx, prep.gy, _stream(prep.device))


# Plans one layout keeps for different values of its free integers: a threshold below T plans the
# `_dense` kernel, one equal to T its `_dense_nothr` twin, and each plan's fast path takes only
# the values of its kernel (without a second plan, every call of the other kind took the full
# check: a new plan per call after a first call with n = T).
_MAX_PLANS_PER_LAYOUT = 4


def _go(preps, kind, options, tensors, free):
    """A planned call: the first of its layout's plans whose per-call checks take it launches
    (prep.run); where none does, the full check (it raises the error that names the problem, or
    makes the plan of these values, kept beside the others, and launches). Returns the plan that
    served."""
    for prep in preps:
        if prep.launcher is None or prep.run(*tensors, *free):
            return prep
    prep, values = _prepare(kind, options, tensors, free)
    _plan.set_guard(prep, tensors)
    if len(preps) < _MAX_PLANS_PER_LAYOUT:
        preps.append(prep)
    _launch(prep, values)
    return prep


def _lookup(kind, options, tensors, free):
    """The plans of the call's layouts from the cache (a list, one per kernel its free integers'
    values launch); None after a call that had none (the full check, the plan kept, the launch)."""
    try:
        key = (kind, options, _m.env_value(), tuple([_plan.layout_key(t) for t in tensors]),
               tuple([v is None for v in free]))
        preps = _plans.get(key)
    except (AttributeError, TypeError):
        key = preps = None
    if preps is not None:
        return preps
    prep, values = _prepare(kind, options, tensors, free)
    if key is not None:
        _plan.set_guard(prep, tensors)
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = [prep]
    _launch(prep, values)
    return None


def _call(kind, options, tensors, free):
    """A call of an entry point without a slot: its plans by key, the per-call checks, the launch."""
    preps = _lookup(kind, options, tensors, free)
    if preps is not None:
        _go(preps, kind, options, tensors, free)


def _miss(slot, slot_options, kind, options, tensors, free):
    """A call its slot's plan did not take: its layout's plans by key, with their guards renewed
    (the previous ones may have been made under other dispatch keys), the per-call checks and the
    launch; the plan that served goes into the slot."""
    preps = _lookup(kind, options, tensors, free)
    if preps is not None:
        for prep in preps:
            _plan.set_guard(prep, tensors)
        prep = _go(preps, kind, options, tensors, free)
        slot[:] = (slot_options, prep.go, prep, _env_get(_ENV_KEY))


def _slotted(slot, kind, options, tensors, free):
    """A call through an entry point's slot (the generic form of _merge)."""
    last_options, go, _, last_folder = slot
    if options != last_options or _env_get(_ENV_KEY) != last_folder or not go(*tensors, *free):
        _miss(slot, options, kind, options, tensors, free)


# ---- merge_attn_states (vLLM's), FP8 outputs and the fused empty-context mask included ----

# The slots [options, go, plan, folder]: the function's, the operator's
# (torch.ops.mla_gen.merge_attn_states), the function's with the start locations (a plan per
# (T, B), reused while they stay). The plan stays at [2]: bench/host_cost.py reads it.
_last_pair = [None, None, None, None]
_last_pair_op = [None, None, None, None]
_last_ctx = [None, None, None, None]


def _merge(slot, lse_layout, output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, output_scale,
           prefill_tokens_with_context):
    """The plain merge's fast path, the function's and the operator's: the slot's plan where the
    call has the same lse layout and folder and its `go` takes the call; else _miss. Spelled out
    (no tuples, no *args: about 0.1 us) because this is the path host_cost measures."""
    last_layout, go, _, last_folder = slot
    if (lse_layout != last_layout or _env_get(_ENV_KEY) != last_folder
            or not go(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, output_scale,
                      prefill_tokens_with_context)):
        _miss(slot, lse_layout, PAIR, (lse_layout,), (output, output_lse, prefix_output, prefix_lse, suffix_output,
                                                      suffix_lse, output_scale), (prefill_tokens_with_context,))


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
        return _merge_other(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
                            prefill_tokens_with_context, output_scale, output_group_scales, ue8m0, lse_layout,
                            query_start_loc, context_start_loc)
    # _merge's body with the function's slot, inlined: one Python call less on the path engines
    # call (0.1-0.2 us of the function's ~3 on the CPU machine, bench/host_cost_stub.py).
    last_layout, go, _, last_folder = _last_pair
    if (lse_layout != last_layout or _env_get(_ENV_KEY) != last_folder
            or not go(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, output_scale,
                      prefill_tokens_with_context)):
        _miss(_last_pair, lse_layout, PAIR, (lse_layout,), (output, output_lse, prefix_output, prefix_lse,
                                                            suffix_output, suffix_lse, output_scale),
              (prefill_tokens_with_context,))


def merge_attn_states_op(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse,
                         prefill_tokens_with_context=None, output_scale=None, query_start_loc=None,
                         context_start_loc=None) -> None:
    """The implementation of ``torch.ops.mla_gen.merge_attn_states`` (the op's argument order):
    the function's fast path with the operator's slot, so that the dispatcher calls one Python
    function and one shared fast path. The start locations go through merge_attn_states."""
    if query_start_loc is not None or context_start_loc is not None:
        return merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
                                 prefill_tokens_with_context, output_scale, query_start_loc=query_start_loc,
                                 context_start_loc=context_start_loc)
    _merge(_last_pair_op, "head_major", output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse,
           output_scale, prefill_tokens_with_context)


def both_or_neither(query_start_loc, context_start_loc):
    """The start locations come together (the fused mask needs both)."""
    if query_start_loc is None or context_start_loc is None:
        given, missing = (("query_start_loc", "context_start_loc") if context_start_loc is None
                          else ("context_start_loc", "query_start_loc"))
        raise ValueError(TEXTS["both_or_neither"].format(given=given, missing=missing))


def _merge_other(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, prefill_tokens_with_context,
                 output_scale, output_group_scales, ue8m0, lse_layout, query_start_loc, context_start_loc):
    """merge_attn_states with per-token-group FP8 scales or the empty-context mask (off the plain
    call's path)."""
    if query_start_loc is not None or context_start_loc is not None:
        both_or_neither(query_start_loc, context_start_loc)
    if output_group_scales is not None:
        if output_scale is not None:
            raise ValueError("give output_scale (one per-tensor scale) or output_group_scales, not both")
        return merge_attn_states_fp8_group(output, output_group_scales, prefix_output, prefix_lse, suffix_output,
                                           suffix_lse, output_lse, prefill_tokens_with_context, ue8m0=ue8m0,
                                           lse_layout=lse_layout, query_start_loc=query_start_loc,
                                           context_start_loc=context_start_loc)
    _slotted(_last_ctx, PAIR_CTX, (lse_layout,), (output, output_lse, prefix_output, prefix_lse, suffix_output,
                                                  suffix_lse, output_scale, query_start_loc, context_start_loc),
             (prefill_tokens_with_context,))


def merge_attn_states_fp8_group(output, output_group_scales, prefix_output, prefix_lse, suffix_output, suffix_lse,
                                output_lse=None, prefill_tokens_with_context=None, *, ue8m0: bool = False,
                                lse_layout: str = "head_major", query_start_loc=None,
                                context_start_loc=None) -> None:
    """merge_attn_states with an e4m3 output quantized per token-group: output
    ``torch.float8_e4m3fn`` [T, H, D]; ``output_group_scales`` float32 [T, H * D / G] (any
    strides: row-major, column-major, padded) receives each group's scale, max(absmax, 1e-10) x
    float32(1/448), as vLLM writes it (rounded up to a power of two with ``ue8m0``); G = H * D / its second dimension.
    ``query_start_loc``, ``context_start_loc``: the fused empty-context mask, as in
    merge_attn_states."""
    tensors = (output, output_group_scales, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse)
    if query_start_loc is None and context_start_loc is None:
        _call(GROUP, (bool(ue8m0), lse_layout), tensors, (prefill_tokens_with_context,))
    else:
        both_or_neither(query_start_loc, context_start_loc)
        _call(GROUP_CTX, (bool(ue8m0), lse_layout), tensors + (query_start_loc, context_start_loc),
              (prefill_tokens_with_context,))


# ---- merge_states (K-way), merge_state_in_place, mask_empty_context_lse ----

def merge_states(v, s, output=None, output_lse=None):
    """Merge K attention states per token in one pass (FlashInfer's ``merge_states``).

    v: [T, K, H, D] partial outputs (f32/f16/bf16; the D dimension contiguous, other strides
    free), s: [T, K, H] float32 lse, contiguous. Returns ``(output [T, H, D], output_lse [T, H])``,
    allocated when not given (``output_lse`` is None when the kernel has none). +inf lse means
    "no keys" like -inf; a row with no keys in any state gets state 0's row and lse -inf. Uses
    the compile-time-K kernel for this K when the folder has one, else the runtime-K kernel."""
    T, K, H, D = _plan.dims(v, "v", 4)
    if v.device.type != _DEVICE_TYPE:
        raise ValueError(TEXTS["not_on_device"].format(name="v", device=v.device))
    if output is None:
        output = torch.empty((T, H, D), dtype=v.dtype, device=v.device)
    if output_lse is None and isinstance(s, torch.Tensor):
        # Allocated where the kernel a call with one selects takes one.
        wanted = torch.empty((T, H), dtype=torch.float32, device="meta")
        tmap = {"output": output, "output_lse": wanted, "states": v, "states_lse": s}
        if any(p["name"] == "output_lse" for p in _plan.select(STATES, _m.folder(), tmap, (), {})["params"]):
            output_lse = torch.empty((T, H), dtype=torch.float32, device=v.device)
    _call(STATES, (), (output, output_lse, v, s), ())
    return output, output_lse


def _lse_layout(lse_layout):
    if lse_layout not in LSE_LAYOUTS:
        raise ValueError(TEXTS["lse_layout"])


def merge_state_in_place(v, s, v_other, s_other, mask=None, *, lse_layout: str = "token_major") -> None:
    """``v, s := merge((v, s), (v_other, s_other))`` in place (FlashInfer's
    ``merge_state_in_place``). v, v_other: [T, H, D]; s, s_other: float32 lse, [T, H] with
    ``lse_layout="token_major"`` (FlashInfer's, the default) or [H, T] with ``"head_major"``
    (vLLM's). ``mask``: [T] bool or uint8; tokens where it is 0 are left untouched (needs a
    kernel generated with ``mask = true``)."""
    _lse_layout(lse_layout)
    _call(IN_PLACE, (lse_layout,), (v, s, v_other, s_other, mask), ())


def mask_empty_context_lse(lse, query_start_loc, context_start_loc, *, lse_layout: str = "head_major") -> None:
    """Set ``lse`` to -inf, in place, for every head of the tokens of requests whose context is
    empty, before a merge. ``lse``: float32 [H, T] (``lse_layout="head_major"``, vLLM's) or
    [T, H] (``"token_major"``). ``query_start_loc``, ``context_start_loc``: int32 [B + 1] on
    the device; request b holds tokens ``query_start_loc[b]:query_start_loc[b+1]`` and has an
    empty context when ``context_start_loc[b+1] == context_start_loc[b]``. Their contents are
    not read on the host (no sync): whatever they hold, only lse is written, inside its bounds."""
    _lse_layout(lse_layout)
    _call(MASK, (lse_layout,), (lse, query_start_loc, context_start_loc), ())


def launch_kernel(kernel: str, args: dict, *, device: int | None = None) -> None:
    """Launch one kernel of the current folder by name (the scripts' way to time a given
    schedule): `args` by parameter name as ``check_args`` takes them, torch tensors standing for
    their buffers. Always the full check; on torch's current stream of `device` (default: the
    first tensor's device, else the current device). A kernel with a size rule or
    specializations launches the one they choose for the call's values, as every call does."""
    kf = _m.folder()
    meta = kf.kernel(kernel)
    plan = plan_for(kernel, meta)
    conv = {}
    for name, a in args.items():
        if isinstance(a, torch.Tensor):
            if device is None:
                device = a.get_device()
            a = _plan.buffer(a)
        conv[name] = a
    checked = plan.check(conv)
    meta, checked, _ = _plan.sized(kf, meta, plan, checked, conv)
    if checked.grid is None:
        return
    device = torch.cuda.current_device() if device is None or device < 0 else device
    _cuda.launch(_plan.make_launcher(kf, meta, checked, device), checked.values, checked.grid[0], checked.grid[1],
                 _stream(device))


def _forget_plans_after_fork():
    """In a forked child the parent's plans would launch the parent's functions: the child's
    first call plans again (and _cuda raises where the parent had used the driver)."""
    _plans.clear()
    for slot in (_last_pair, _last_pair_op, _last_ctx):
        slot[:] = (None, None, None, None)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_plans_after_fork)


__all__ = ["merge_attn_states", "merge_attn_states_fp8_group", "merge_states", "merge_state_in_place",
           "mask_empty_context_lse", "launch_kernel", "ArgumentError"]

"""mla-gen's own functions, in vLLM's base and layout: each states its arguments, says which kind
of call they make (mla_gen/binding.json: which tensors bind which kernel parameters) and hands
them to the torch layer (mla_gen._torch), which finds the call's plan and launches on torch's
current stream (no device-to-host sync, so CUDA graphs can capture it). The FlashInfer and SGLang
conventions are mla_gen.flashinfer and mla_gen.sglang, written the same way.

An option that adds a tensor argument adds its keyword here and its row to binding.json; the
torch layer below takes any kind's tensors as given (docs/ADDING-AN-OPTION.md).
"""

from __future__ import annotations

import torch

from . import _plan, _torch
from . import manifest as _m
from ._binding import CALLER_NAMES, KINDS, LSE_LAYOUTS, TEXTS
from ._torch import _ENV_KEY, _env_get, _miss
from .contract import ArgumentError

_PAIR, _PAIR_CTX, _GROUP, _GROUP_CTX = KINDS["pair"], KINDS["pair_ctx"], KINDS["group"], KINDS["group_ctx"]
_STATES, _IN_PLACE, _MASK = KINDS["states"], KINDS["in_place"], KINDS["mask"]
# The kinds' tensors these functions (and the ops of their names) call otherwise: a refusal names
# the caller's argument (merge_states's ``s``, not the kernel's ``states_lse``).
_GROUP_NAMES, _STATES_NAMES, _IN_PLACE_NAMES = CALLER_NAMES["group"], CALLER_NAMES["states"], CALLER_NAMES["in_place"]


def _hinted(fn, *args):
    """``fn(*args)`` for a function whose caller chose ``lse_layout``: a refusal of an lse given as
    the addressed one transposed (_plan._layout_error's ``lse_hint``) names the layout to pass.
    Only the functions that take ``lse_layout`` (and the ops that do) say so: an entry point with
    a fixed layout (the merge_attn_states op, FlashInfer's, SGLang's) has nothing to pass."""
    try:
        return fn(*args)
    except ValueError as e:
        hint = getattr(e, "lse_hint", None)
        if hint and not e.args[0].endswith(hint):
            e.args = (e.args[0] + hint,)
        raise


# ---- merge_attn_states (vLLM's), FP8 outputs and the fused empty-context mask included ----

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

    Raises TypeError/ValueError for what the kernel cannot take (a tensor argument that is not a
    tensor: TypeError; ``ue8m0`` without ``output_group_scales``: ValueError); ArgumentError (a
    ValueError) carries the argument check's text ``"<kernel>: <problem>"``."""
    if output_group_scales is None and query_start_loc is None and context_start_loc is None and not ue8m0:
        # The call engines make: _merge's body with the function's slot, inlined (through the
        # generic _torch._slotted, tuples and *args cost 0.3 us of the function's ~4 on the CPU
        # machine, bench/host_cost_stub.py).
        last_layout, go, _, last_folder = _torch._last_pair
        if (lse_layout != last_layout or _env_get(_ENV_KEY) != last_folder
                or not go(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, output_scale,
                          prefill_tokens_with_context)):
            _lse_layout(lse_layout)  # off the slot's path: a layout it took is a valid one
            _hinted(_miss, _torch._last_pair, lse_layout, _PAIR, (lse_layout,),
                    (output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, output_scale),
                    (prefill_tokens_with_context,))
        return
    _lse_layout(lse_layout)
    if output_group_scales is None and ue8m0:
        raise ValueError("ue8m0=True rounds the per-group scales of an e4m3 output, but no output_group_scales is "
                         "given: pass output_group_scales (float32 [T, H * D / G]) with it, or leave ue8m0 out")
    if query_start_loc is not None or context_start_loc is not None:
        both_or_neither(query_start_loc, context_start_loc)
    if output_group_scales is not None:
        if output_scale is not None:
            raise ValueError("give output_scale (one per-tensor scale) or output_group_scales, not both")
        return merge_attn_states_fp8_group(output, output_group_scales, prefix_output, prefix_lse, suffix_output,
                                           suffix_lse, output_lse, prefill_tokens_with_context, ue8m0=ue8m0,
                                           lse_layout=lse_layout, query_start_loc=query_start_loc,
                                           context_start_loc=context_start_loc)
    _hinted(_fused, lse_layout, output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse,
            output_scale, query_start_loc, context_start_loc, prefill_tokens_with_context)


def _fused(lse_layout, output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, output_scale,
           query_start_loc, context_start_loc, prefill_tokens_with_context):
    """The call with the start locations (both given), through the function's slot for them."""
    _torch._slotted(_torch._last_ctx, _PAIR_CTX, (lse_layout,), (output, output_lse, prefix_output, prefix_lse,
                                                                  suffix_output, suffix_lse, output_scale,
                                                                  query_start_loc, context_start_loc),
                    (prefill_tokens_with_context,))


def merge_attn_states_op(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse,
                         prefill_tokens_with_context=None, output_scale=None, query_start_loc=None,
                         context_start_loc=None) -> None:
    """The Python implementation of ``torch.ops.mla_gen.merge_attn_states`` (the op's argument
    order): the function's path with the operator's own slot, so that code calling both with
    different layouts does not make each call look its plan up again. The op's lse is head-major,
    with no lse_layout to pass: its refusals name none."""
    if query_start_loc is not None or context_start_loc is not None:
        both_or_neither(query_start_loc, context_start_loc)
        return _fused("head_major", output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse,
                      output_scale, query_start_loc, context_start_loc, prefill_tokens_with_context)
    _merge(_torch._last_pair_op, "head_major", output, output_lse, prefix_output, prefix_lse, suffix_output,
           suffix_lse, output_scale, prefill_tokens_with_context)


def _merge(slot, lse_layout, output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, output_scale,
           prefill_tokens_with_context):
    """The plain call's path through `slot`: merge_attn_states's body (which has it inlined, one
    frame less) for the operator and bench/host_cost.py's own slot."""
    last_layout, go, _, last_folder = slot
    if (lse_layout != last_layout or _env_get(_ENV_KEY) != last_folder
            or not go(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, output_scale,
                      prefill_tokens_with_context)):
        _miss(slot, lse_layout, _PAIR, (lse_layout,),
              (output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, output_scale),
              (prefill_tokens_with_context,))


def both_or_neither(query_start_loc, context_start_loc):
    """The start locations come together (the fused mask needs both)."""
    if query_start_loc is None or context_start_loc is None:
        given, missing = (("query_start_loc", "context_start_loc") if context_start_loc is None
                          else ("context_start_loc", "query_start_loc"))
        raise ValueError(TEXTS["both_or_neither"].format(given=given, missing=missing))


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
    _lse_layout(lse_layout)
    _hinted(_fp8_group, output, output_group_scales, prefix_output, prefix_lse, suffix_output, suffix_lse,
            output_lse, prefill_tokens_with_context, ue8m0, lse_layout, query_start_loc, context_start_loc)


def merge_attn_states_fp8_group_op(output, output_group_scales, prefix_output, prefix_lse, suffix_output, suffix_lse,
                                   output_lse=None, prefill_tokens_with_context=None, ue8m0=False,
                                   query_start_loc=None, context_start_loc=None) -> None:
    """The Python implementation of ``torch.ops.mla_gen.merge_attn_states_fp8_group`` (the op's
    arguments): head-major lse, with no lse_layout to pass (its refusals name none)."""
    _fp8_group(output, output_group_scales, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
               prefill_tokens_with_context, ue8m0, "head_major", query_start_loc, context_start_loc)


def _fp8_group(output, output_group_scales, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
               prefill_tokens_with_context, ue8m0, lse_layout, query_start_loc, context_start_loc):
    tensors = (output, output_group_scales, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse)
    if query_start_loc is None and context_start_loc is None:
        _torch._call_as(_GROUP_NAMES, _GROUP, (bool(ue8m0), lse_layout), tensors, (prefill_tokens_with_context,))
    else:
        both_or_neither(query_start_loc, context_start_loc)
        _torch._call_as(_GROUP_NAMES, _GROUP_CTX, (bool(ue8m0), lse_layout),
                        tensors + (query_start_loc, context_start_loc), (prefill_tokens_with_context,))


# ---- merge_states (K-way), merge_state_in_place, mask_empty_context_lse ----

def merge_states(v, s, output=None, output_lse=None):
    """Merge K attention states per token in one pass (FlashInfer's ``merge_states``).

    v: [T, K, H, D] partial outputs (f32/f16/bf16; the D dimension contiguous, other strides
    free), s: [T, K, H] float32 lse, contiguous. Returns ``(output [T, H, D], output_lse [T, H])``,
    allocated when not given (``output_lse`` is None when the kernel has none). +inf lse means
    "no keys" like -inf; a row with no keys in any state gets state 0's row and lse -inf. Uses
    the compile-time-K kernel for this K when the folder has one, else the runtime-K kernel."""
    return _merge_states(v, s, output, output_lse, False)


def merge_states_op(v, s):
    """The Python implementation of ``torch.ops.mla_gen.merge_states``, which returns the merged
    lse: a folder whose kernel for the call writes none is refused before anything launches (text
    ``no_states_lse``), as the compiled op does."""
    return _merge_states(v, s, None, None, True)


def _merge_states(v, s, output, output_lse, lse_returned):
    T, K, H, D = _plan.dims(v, "v", 4)
    if v.device.type != _torch._DEVICE_TYPE:
        raise ValueError(TEXTS["not_on_device"].format(name="v", device=v.device))
    if output is None:
        output = torch.empty((T, H, D), dtype=v.dtype, device=v.device)
    if output_lse is None:
        # Allocated where a kernel serves the call with one (after the checks that come before
        # selection: every tensor a tensor, on one device); else the call goes without, which
        # the op, returning the lse, refuses before anything launches (text no_states_lse).
        tmap = {"output": output, "output_lse": None, "states": v, "states_lse": s}
        kf = _m.folder()
        try:
            _plan._arguments(_STATES, tuple(tmap.values()), (), _torch._DEVICE_TYPE)
            wanted = torch.empty((T, H), dtype=torch.float32, device="meta")
            try:
                _plan.select(_STATES, kf, dict(tmap, output_lse=wanted), (), {})
                output_lse = torch.empty((T, H), dtype=torch.float32, device=v.device)
            except ValueError:  # no kernel with one (or a refusal the call without one repeats)
                if lse_returned:
                    _plan.select(_STATES, kf, tmap, (), {})  # no kernel at all: that error
                    raise ValueError(TEXTS["no_states_lse"]) from None
        except (TypeError, ValueError) as e:
            raise _torch.renamed(e, _STATES_NAMES)
    _torch._call_as(_STATES_NAMES, _STATES, (), (output, output_lse, v, s), ())
    return output, output_lse


def _lse_layout(lse_layout):
    if lse_layout not in LSE_LAYOUTS:
        raise ValueError(TEXTS["lse_layout"].format(value=lse_layout))


def merge_state_in_place(v, s, v_other, s_other, mask=None, *, lse_layout: str = "token_major") -> None:
    """``v, s := merge((v, s), (v_other, s_other))`` in place (FlashInfer's
    ``merge_state_in_place``). v, v_other: [T, H, D]; s, s_other: float32 lse, [T, H] with
    ``lse_layout="token_major"`` (FlashInfer's, the default) or [H, T] with ``"head_major"``
    (vLLM's). ``mask``: [T] bool or uint8; tokens where it is 0 are left untouched (needs a
    kernel generated with ``mask = true``)."""
    _lse_layout(lse_layout)
    _hinted(_torch._call_as, _IN_PLACE_NAMES, _IN_PLACE, (lse_layout,), (v, s, v_other, s_other, mask), ())


def mask_empty_context_lse(lse, query_start_loc, context_start_loc, *, lse_layout: str = "head_major") -> None:
    """Set ``lse`` to -inf, in place, for every head of the tokens of requests whose context is
    empty, before a merge. ``lse``: float32 [H, T] (``lse_layout="head_major"``, vLLM's) or
    [T, H] (``"token_major"``). ``query_start_loc``, ``context_start_loc``: int32 [B + 1] on
    the device; request b holds tokens ``query_start_loc[b]:query_start_loc[b+1]`` and has an
    empty context when ``context_start_loc[b+1] == context_start_loc[b]``. Their contents are
    not read on the host (no sync): whatever they hold, only lse is written, inside its bounds.
    ``lse`` of another dtype than float32 is refused (``lse is f16, the kernel takes f32``)."""
    _lse_layout(lse_layout)
    _hinted(_torch._call, _MASK, (lse_layout,), (lse, query_start_loc, context_start_loc), ())


launch_kernel = _torch.launch_kernel

__all__ = ["merge_attn_states", "merge_attn_states_fp8_group", "merge_states", "merge_state_in_place",
           "mask_empty_context_lse", "launch_kernel", "ArgumentError"]

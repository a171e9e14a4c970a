"""The torch functions beyond the plain merge: merge_attn_states with per-token-group FP8 scales
or the fused empty-context mask, merge_attn_states_fp8_group, merge_states (K-way),
merge_state_in_place and mask_empty_context_lse. Each maps its tensors to the contract's
arguments through _torch's plans (_torch's docstring says how); this module holds only their
kinds (parameter names, free integers), their kernel selection and their argument rules."""

from __future__ import annotations

import torch

from . import _torch as _t
from . import manifest as _m
from ._torch import _CTX_MASK, _PAIR, _Kind, _call, _dims, _go, _no_kernel, _select_pair

_env = _m.env_value

# The same call with the empty-context mask fused (a `_ctxmask` kernel): two more tensors, whose
# [B + 1] dims give num_requests through the contract like every other size.
_PAIR_CTX = _Kind("merge_attn_states", _PAIR.names + ("query_start_loc", "context_start_loc"), _PAIR.free,
                  _select_pair)
_last_ctx = _t._NO_PLAN  # (how, go, plan) of the previous call with the start locations


def _both_or_neither(query_start_loc, context_start_loc):
    if query_start_loc is None or context_start_loc is None:
        given, missing = (("query_start_loc", "context_start_loc") if context_start_loc is None
                          else ("context_start_loc", "query_start_loc"))
        raise ValueError(f"{given} given without {missing}: the empty-context mask needs both start locations "
                         "(int32 [B + 1] each), or neither")



def _merge_attn_states_other(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
                             prefill_tokens_with_context, output_scale, output_group_scales, ue8m0, lse_layout,
                             query_start_loc, context_start_loc):
    """merge_attn_states with per-token-group FP8 scales or the empty-context mask (off the plain
    call's path)."""
    if query_start_loc is not None or context_start_loc is not None:
        _both_or_neither(query_start_loc, context_start_loc)
    if output_group_scales is not None:
        if output_scale is not None:
            raise ValueError("give output_scale (one per-tensor scale) or output_group_scales, not both")
        return merge_attn_states_fp8_group(output, output_group_scales, prefix_output, prefix_lse, suffix_output,
                                           suffix_lse, output_lse, prefill_tokens_with_context, ue8m0=ue8m0,
                                           lse_layout=lse_layout, query_start_loc=query_start_loc,
                                           context_start_loc=context_start_loc)
    # The fused mask's own fast path: the plain one's, with the start locations in the key (their
    # [B + 1] shape gives num_requests: a plan per (T, B), reused while they stay).
    o, ol, p, pl, s, sl, sc = output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, output_scale
    q, c = query_start_loc, context_start_loc
    n = prefill_tokens_with_context
    tensors = (o, ol, p, pl, s, sl, sc, q, c)
    how = (lse_layout, _env(), ol is None, sc is None, n is None)
    last_how, go, _ = _last_ctx
    if how != last_how or not go(o, ol, p, pl, s, sl, sc, q, c, n):
        _ctx_planned(how, tensors, n, lse_layout)


def _ctx_planned(how, tensors, n, lse_layout):
    global _last_ctx
    prep = _t._planned(_PAIR_CTX, how, (lse_layout,), tensors, (n,))
    if prep is None:
        return
    _last_ctx = (how, prep.go, prep)
    _go(prep, tensors, (n,), _PAIR_CTX, (lse_layout,))


def _select_group(kf, tmap, options, free):
    ue8m0, lse_layout = options
    prefix = tmap["prefix_output"]
    T, H, D = _dims(prefix, "prefix_output", 3)
    scales = tmap["output_scales"]
    _dims(scales, "output_group_scales", 2)
    groups = scales.shape[1]
    if groups < 1 or (H * D) % groups:
        raise ValueError(f"output_group_scales must be [T, H * D / G] for a group size G, got {tuple(scales.shape)} "
                         f"for H * D = {H * D}")
    G = H * D // groups
    ctx = tmap.get("query_start_loc") is not None
    want = dict(output="fp8_e4m3_group", group_size=G, ue8m0=bool(ue8m0), output_lse=tmap["output_lse"] is not None,
                threshold="prefill_tokens_with_context" in free, lse_layout=lse_layout, mask_empty_context=ctx)
    hit = _m.select(kf, "merge_attn_states", prefix.dtype, D, **want)
    if hit is None:
        raise _no_kernel(kf, "merge_attn_states", f"dtype={prefix.dtype}, head_size={D}, output = fp8_e4m3_group, "
                         f"group_size = {G}, ue8m0 = {bool(ue8m0)}, lse_layout={lse_layout}"
                         + (_CTX_MASK if ctx else ""))
    return hit[0]


_GROUP = _Kind("merge_attn_states", ("output", "output_scales", "output_lse", "prefix_output", "prefix_lse",
                                     "suffix_output", "suffix_lse"), ("prefill_tokens_with_context",), _select_group)
_GROUP_CTX = _Kind("merge_attn_states", _GROUP.names + ("query_start_loc", "context_start_loc"), _GROUP.free,
                   _select_group)


def merge_attn_states_fp8_group(output, output_group_scales, prefix_output, prefix_lse, suffix_output, suffix_lse,
                                output_lse=None, prefill_tokens_with_context=None, *, ue8m0: bool = False,
                                lse_layout: str = "head_major", query_start_loc=None,
                                context_start_loc=None) -> None:
    """merge_attn_states with an e4m3 output quantized per token-group: output
    ``torch.float8_e4m3fn`` [T, H, D]; ``output_group_scales`` float32 [T, H * D / G] (any
    strides: row-major, column-major, padded) receives each group's scale, max(absmax, 1e-10) /
    448 (rounded up to a power of two with ``ue8m0``); G = H * D / its second dimension.
    ``query_start_loc``, ``context_start_loc``: the fused empty-context mask, as in
    merge_attn_states."""
    tensors = (output, output_group_scales, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse)
    if query_start_loc is None and context_start_loc is None:
        _call(_GROUP, (bool(ue8m0), lse_layout), tensors, (prefill_tokens_with_context,))
    else:
        _both_or_neither(query_start_loc, context_start_loc)
        _call(_GROUP_CTX, (bool(ue8m0), lse_layout), tensors + (query_start_loc, context_start_loc),
              (prefill_tokens_with_context,))


# ---- merge_states (K-way), merge_state_in_place, mask_empty_context_lse ----

def _select_states(kf, tmap, options, free):
    v = tmap["states"]
    T, K, H, D = _dims(v, "v", 4)
    hit = _m.select(kf, "merge_states", v.dtype, D, num_states=K, output_lse=tmap["output_lse"] is not None)
    if hit is None:
        raise _no_kernel(kf, "merge_states", f"dtype={v.dtype}, head_size={D} merging {K} states "
                         f"(no kernel with num_states = {K} or \"runtime\")")
    return hit[0]


_STATES = _Kind("merge_states", ("output", "output_lse", "states", "states_lse"), (), _select_states)


def merge_states(v, s, output=None, output_lse=None):
    """Merge K attention states per token in one pass (FlashInfer's ``merge_states``).

    v: [T, K, H, D] partial outputs (f32/f16/bf16; the D dimension contiguous, other strides
    free), s: [T, K, H] float32 lse, contiguous. Returns ``(output [T, H, D], output_lse [T, H])``,
    allocated when not given (``output_lse`` is None when the kernel has none). +inf lse means
    "no keys" like -inf; a row with no keys in any state gets state 0's row and lse -inf. Uses
    the compile-time-K kernel for this K when the folder has one, else the runtime-K kernel."""
    T, K, H, D = _dims(v, "v", 4)
    if v.device.type != _t._DEVICE_TYPE:
        raise ValueError(f"v is on {v.device}; the kernels run on a CUDA device")
    if output is None or output_lse is None:
        kf = _m.folder()
        hit = _m.select(kf, "merge_states", v.dtype, D, num_states=K, output_lse=True)
        if hit is None:
            raise _no_kernel(kf, "merge_states", f"dtype={v.dtype}, head_size={D} merging {K} states "
                             f"(no kernel with num_states = {K} or \"runtime\")")
        if output is None:
            output = torch.empty((T, H, D), dtype=v.dtype, device=v.device)
        if output_lse is None and hit[0]["variant"]["output_lse"]:
            output_lse = torch.empty((T, H), dtype=torch.float32, device=v.device)
    _call(_STATES, (), (output, output_lse, v, s), ())
    return output, output_lse


def _select_in_place(kf, tmap, options, free):
    (lse_layout,) = options
    v = tmap["state"]
    D = _dims(v, "v", 3)[2]
    hit = _m.select(kf, "merge_state_in_place", v.dtype, D, mask=tmap["mask"] is not None, lse_layout=lse_layout)
    if hit is None:
        raise _no_kernel(kf, "merge_state_in_place", f"dtype={v.dtype}, head_size={D}, lse_layout={lse_layout}"
                         + (" and a mask" if tmap["mask"] is not None else ""))
    return hit[0]


_IN_PLACE = _Kind("merge_state_in_place", ("state", "state_lse", "other", "other_lse", "mask"), (), _select_in_place)


def merge_state_in_place(v, s, v_other, s_other, mask=None, *, lse_layout: str = "token_major") -> None:
    """``v, s := merge((v, s), (v_other, s_other))`` in place (FlashInfer's
    ``merge_state_in_place``). v, v_other: [T, H, D]; s, s_other: float32 lse, [T, H] with
    ``lse_layout="token_major"`` (FlashInfer's, the default) or [H, T] with ``"head_major"``
    (vLLM's). ``mask``: [T] bool or uint8; tokens where it is 0 are left untouched (needs a
    kernel generated with ``mask = true``)."""
    if lse_layout not in ("token_major", "head_major"):
        raise ValueError('lse_layout must be "token_major" or "head_major"')
    _call(_IN_PLACE, (lse_layout,), (v, s, v_other, s_other, mask), ())


def _select_mask(kf, tmap, options, free):
    (lse_layout,) = options
    hit = _m.select(kf, "mask_empty_context_lse", None, None, lse_layout=lse_layout)
    if hit is None:
        raise _no_kernel(kf, "mask_empty_context_lse", f"lse_layout={lse_layout}")
    return hit[0]


_MASK = _Kind("mask_empty_context_lse", ("lse", "query_start_loc", "context_start_loc"), (), _select_mask)


def mask_empty_context_lse(lse, query_start_loc, context_start_loc, *, lse_layout: str = "head_major") -> None:
    """Set ``lse`` to -inf, in place, for every head of the tokens of requests whose context is
    empty, before a merge. ``lse``: float32 [H, T] (``lse_layout="head_major"``, vLLM's) or
    [T, H] (``"token_major"``). ``query_start_loc``, ``context_start_loc``: int32 [B + 1] on
    the device; request b holds tokens ``query_start_loc[b]:query_start_loc[b+1]`` and has an
    empty context when ``context_start_loc[b+1] == context_start_loc[b]``. Their contents are
    not read on the host (no sync): whatever they hold, only lse is written, inside its bounds."""
    if lse_layout not in ("token_major", "head_major"):
        raise ValueError('lse_layout must be "token_major" or "head_major"')
    _call(_MASK, (lse_layout,), (lse, query_start_loc, context_start_loc), ())

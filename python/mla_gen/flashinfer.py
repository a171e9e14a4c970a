"""FlashInfer's merge functions in FlashInfer's signatures and conventions: ``merge_state``,
``merge_state_in_place`` and ``merge_states`` (``flashinfer.cascade``), lse in base 2 and
token-major ([T, H]; [T, K, H] for K states), so an engine built on FlashInfer's attention passes
its lse as is, with no conversion kernel.

They run kernels generated with ``lse_base = "2"`` (docs/SEMANTICS.md, "lse in base 2"), FlashInfer's
rules included: a row with no keys on either side is zeros with lse -inf. Where mla-gen's rules
are stricter they stay (a NaN lse gives a NaN row, +inf reads as "no keys"), except for
``merge_states`` of one state, which returns that state's rows and lse as they are, as FlashInfer
does (the runtime-K kernel's copy, any lse comes back as given). The default kernels include
them (f16/bf16, head sizes 64-576; specs/default.toml); a folder of your own needs such kernels,
e.g.::

    [[merge_attn_states]]        # merge_state
    dtype = ["f16", "bf16"]
    head_size = [64, 128, 256]
    prefix_threshold = false
    lse_layout = "token_major"
    lse_base = "2"

    [[merge_state_in_place]]     # merge_state_in_place
    dtype = ["f16", "bf16"]
    head_size = [64, 128, 256]
    lse_layout = "token_major"
    lse_base = "2"
    mask = [true, false]

    [[merge_states]]             # merge_states
    dtype = ["f16", "bf16"]
    head_size = [64, 128, 256]
    num_states = "runtime"
    lse_base = "2"

A call no kernel serves raises the error that names what is missing.
"""

from __future__ import annotations

import math

import torch

from . import _plan, _torch
from ._binding import ENGINE_NAMES, KINDS, TEXTS

__all__ = ["merge_state", "merge_state_in_place", "merge_states"]

_OPTIONS = ("token_major", "2")  # (lse_layout, lse_base)


# mla-gen's kinds with the select blocks' lse_base: the same parameters, the base-2 kernels.
# (Each passes its tensors in the order named here: a tensor an option adds to a kind moves none.)
_PAIR = KINDS["pair"].with_options(("lse_layout", "lse_base"), ", lse_base = 2").taking(
    ("output", "output_lse", "prefix_output", "prefix_lse", "suffix_output", "suffix_lse"))
_IN_PLACE = KINDS["in_place"].with_options(("lse_layout", "lse_base"), ", lse_base = 2").taking(
    ("state", "state_lse", "other", "other_lse", "mask"))
_STATES = KINDS["states"].with_options(("lse_base",), ", lse_base = 2").taking(
    ("output", "output_lse", "states", "states_lse"))


def merge_state(v_a, s_a, v_b, s_b):
    """Merge two attention states: v_a, v_b [T, H, D] (f16/bf16: the default kernels'; f32 where
    the kernel folder has base-2 f32 kernels), s_a, s_b [T, H] lse in base 2. Returns
    ``(v_merged [T, H, D] of v_a's dtype, s_merged [T, H] float32)``."""
    T, H, D = _plan.dims(v_a, "v_a", 3)
    v_merged = torch.empty_like(v_a, memory_format=torch.contiguous_format)
    s_merged = torch.empty((T, H), dtype=torch.float32, device=v_a.device)
    s_a, s_b = _plan.lse_f32(s_a, "s_a"), _plan.lse_f32(s_b, "s_b")
    _torch._call_as(ENGINE_NAMES["pair"], _PAIR, _OPTIONS, (v_merged, s_merged, v_a, s_a, v_b, s_b), (None,))
    return v_merged, s_merged


def merge_state_in_place(v, s, v_other, s_other, mask=None) -> None:
    """``v, s := merge((v, s), (v_other, s_other))`` in place: v, v_other [T, H, D]; s float32
    [T, H] (updated), s_other [T, H]; lse in base 2. ``mask`` [T] bool or uint8: tokens where it
    is 0 are left untouched (needs a kernel generated with ``mask = true``)."""
    s_other = _plan.lse_f32(s_other, "s_other")
    _torch._call_as(ENGINE_NAMES["in_place"], _IN_PLACE, _OPTIONS, (v, s, v_other, s_other, mask), ())


def merge_states(v, s):
    """Merge K states per token: v [T, K, H, D], s [T, K, H] lse in base 2. Returns
    ``(v_merged [T, H, D], s_merged [T, H] float32)``. With one state (K = 1), FlashInfer's
    result: the state's rows and lse as they are, empty rows (-inf) included (the runtime-K kernel's
    copy, or torch's where the folder has none);
    but with one token too, FlashInfer's kernel for states >= tokens merges, and a row without
    keys becomes zeros (lse -inf), as in every merge of its."""
    T, K, H, D = _plan.dims(v, "v", 4)
    v_merged = torch.empty((T, H, D), dtype=v.dtype, device=v.device)
    s_merged = torch.empty((T, H), dtype=torch.float32, device=v.device)
    if K != 1 or T > 1:
        # At K = 1 the base-2 runtime-K kernel copies rows and lse in one launch (two torch copies
        # cost 1.1-1.2x FlashInfer's one kernel: GPU run 128); a folder without it copies below.
        try:
            _torch._call_as(ENGINE_NAMES["states"], _STATES, _OPTIONS[1:],
                            (v_merged, s_merged, v, _plan.lse_f32(s, "s")), ())
            return v_merged, s_merged
        except ValueError:  # at K = 1: no such kernel (or a call it refuses: the copy checks it)
            if K != 1:
                raise
    if v.device.type != _torch._DEVICE_TYPE:
        raise ValueError(TEXTS["not_on_device"].format(name="v", device=v.device))
    if not isinstance(s, torch.Tensor) or tuple(s.shape) != (T, 1, H) or s.device != v.device:
        raise ValueError(f"s must be [T, K, H] = {(T, 1, H)} on {v.device} for v of shape {tuple(v.shape)}, got "
                         f"{tuple(s.shape) if isinstance(s, torch.Tensor) else type(s).__name__}")
    if T <= K:  # FlashInfer stages states >= tokens through shared memory and merges them
        v_merged.copy_(v[:, 0].masked_fill((s[:, 0] == -math.inf)[..., None], 0))
    else:
        v_merged.copy_(v[:, 0])
    s_merged.copy_(s[:, 0])
    return v_merged, s_merged

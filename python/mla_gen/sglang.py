"""SGLang's merge in sgl-kernel's signature: ``merge_state_v2(v_a, s_a, v_b, s_b, v_merged=None,
s_merged=None) -> (v_merged, s_merged)``, lse in base e and token-major ([T, H]), as sgl-kernel's
``merge_state_v2`` takes them (vLLM's merge rule on FlashInfer's layout).

It runs the pairwise kernels generated with ``lse_layout = "token_major"`` (the default lse base,
"e"); the default kernels include them (f16/bf16/f32, head sizes 64-576); a folder of your own
needs e.g.::

    [[merge_attn_states]]
    dtype = ["f16", "bf16", "f32"]
    head_size = [64, 128, 256, 512]
    prefix_threshold = false
    lse_layout = "token_major"

A call no kernel serves raises the error that names what is missing.
"""

from __future__ import annotations

import torch

from . import _plan, _torch
from ._binding import ENGINE_NAMES, KINDS

__all__ = ["merge_state_v2"]

# mla-gen's pairwise kind with the tensors this API passes, in its order (a tensor an option adds
# to the kind moves nothing here)
_PAIR = KINDS["pair"].taking(("output", "output_lse", "prefix_output", "prefix_lse", "suffix_output", "suffix_lse"))


def merge_state_v2(v_a, s_a, v_b, s_b, v_merged=None, s_merged=None):
    """Merge two attention states: v_a, v_b [T, H, D] (f16/bf16/f32), s_a, s_b [T, H] lse in base
    e (read as float32). ``v_merged`` [T, H, D] of v_a's dtype and ``s_merged`` float32 [T, H]
    are written where given, else allocated; returns ``(v_merged, s_merged)``."""
    T, H, D = _plan.dims(v_a, "v_a", 3)
    if v_merged is None:
        v_merged = torch.empty((T, H, D), dtype=v_a.dtype, device=v_a.device)
    if s_merged is None:
        s_merged = torch.empty((T, H), dtype=torch.float32, device=v_a.device)
    s_a, s_b = _plan.lse_f32(s_a, "s_a"), _plan.lse_f32(s_b, "s_b")
    _torch._call_as(ENGINE_NAMES["pair"], _PAIR, ("token_major",), (v_merged, s_merged, v_a, s_a, v_b, s_b), (None,))
    return v_merged, s_merged

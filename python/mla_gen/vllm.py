"""Route vLLM's ``merge_attn_states`` dispatcher to mla-gen, falling back to vLLM's own path.

On CUDA, vLLM's dispatcher (``vllm.v1.attention.ops.merge_attn_states.merge_attn_states``;
``vllm.attention.ops.merge_attn_states`` in older releases) calls its compiled CUDA op
``torch.ops._C.merge_attn_states`` where that supports the call, and its Triton kernel
otherwise. ``patch()`` replaces the dispatcher with one that sends a call to
``mla_gen.merge_attn_states`` when ``supports()`` says the kernel folder has a kernel for it and
every tensor is on a CUDA device, and to the original dispatcher otherwise (including, unless
``strict=True``, when the argument check refuses the call, e.g. strides the kernel's vector
access cannot take)::

    import mla_gen.vllm
    mla_gen.vllm.patch()          # before the model runs; returns a handle with .undo()

The patched dispatcher takes vLLM's arguments, its newest signature's included:
``output_scale`` (FP8 e4m3 output with a per-tensor scale) and ``output_block_scale``,
``quant_group_size``, ``quant_scale_ue8m0`` (e4m3 output with one float32 scale per group of
``quant_group_size`` elements, UE8M0-rounded when set, written at ``t * stride(0) + group *
stride(1)`` of the scale tensor: [T, H*D/G] row- or column-major, its strides passed as given, to
a kernel generated with ``output = "fp8_e4m3_group"`` of that group size and ue8m0; vLLM's own
kernel where the folder has none), and two more keywords, ``query_start_loc`` and
``context_start_loc``: the empty-context mask fused into the merge, in place of masking
``prefix_lse`` before the call
(docs/PYTHON.md). A fused call handed back to vLLM runs that mask first, on a copy of
``prefix_lse``, with torch ops. The default kernels serve every f32/f16/bf16 call of the default
head sizes, with the inputs' dtype or FP8 output, fused or not, and group FP8 in groups of 128
and 64 (UE8M0 or not) on the head sizes the group divides (not f32 at 576 in groups of 64); a
call of another group size goes to vLLM's kernel.

The patch also rebinds modules that imported the dispatcher by name (``from ... import
merge_attn_states``). Counters: ``mla_gen.stats()["fallbacks"]``.
"""

from __future__ import annotations

import importlib
import sys

from .manifest import env_value, supports

__all__ = ["patch", "route", "group_scales", "mask_empty_context", "MODULES", "TRAILING", "stats"]

MODULES = ("vllm.v1.attention.ops.merge_attn_states", "vllm.attention.ops.merge_attn_states")
stats = {"fallbacks": 0, "routed": 0}
# vLLM's arguments after output_lse, in its newest signature's order
TRAILING = ("prefill_tokens_with_context", "output_scale", "output_block_scale", "quant_group_size",
            "quant_scale_ue8m0")
_TRAILING = frozenset(TRAILING)

_SAME = {"torch.float32", "torch.float16", "torch.bfloat16"}
# What mla-gen's checks raise before any launch (an ArgumentError is a ValueError; so is a lse
# layout the plan cannot address; a threshold of another type is a TypeError): a patch that is not
# strict hands such a call back to vLLM, which judges it by its own rules.
REFUSED = (ValueError, TypeError)
_routes: dict = {}  # (dtype, head size, options, $MLA_GEN_KERNELS) -> supports()


def _on_cuda(t) -> bool:
    return getattr(t, "is_cuda", False)


def _merge(*args, **kwargs):
    from . import functions  # torch only once vLLM calls
    return functions.merge_attn_states(*args, **kwargs)


def route(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None,
          prefill_tokens_with_context=None, output_scale=None, query_start_loc=None,
          context_start_loc=None, *, output_block_scale=None, quant_group_size=None,
          quant_scale_ue8m0=None) -> bool:
    """Whether mla-gen takes this call: tensors on a CUDA device, f32/f16/bf16 inputs, an
    output of the inputs' dtype (or e4m3 with output_scale, or e4m3 with output_block_scale: a
    float32 [T, H*D/G] scale tensor, quant_group_size G dividing the head size, no
    output_scale), and a kernel in the folder (with the start locations: a ``_ctxmask``
    kernel)."""
    try:
        fused = query_start_loc is not None
        if not (_on_cuda(output) and _on_cuda(prefix_output) and _on_cuda(suffix_output)):
            return False
        if fused and not (_on_cuda(query_start_loc) and _on_cuda(context_start_loc)):
            return False
        dtype = str(prefix_output.dtype)
        if dtype not in _SAME or str(suffix_output.dtype) != dtype:
            return False
        group = None
        if output_block_scale is not None:
            group = _group(output, output_block_scale, output_scale, quant_group_size)
            if group is None:
                return False
            kind = "fp8_e4m3_group"
        elif output_scale is None:
            if str(output.dtype) != dtype:
                return False
            kind = "same"
        else:
            if str(output.dtype) != "torch.float8_e4m3fn":
                return False
            kind = "fp8_e4m3"
        n = prefill_tokens_with_context
        ue8m0 = bool(quant_scale_ue8m0) and group is not None
        key = (dtype, prefix_output.shape[-1], output_lse is not None, n is not None and n != output.shape[0], kind,
               fused, group, ue8m0, env_value())
        hit = _routes.get(key)
        if hit is None:
            hit = _routes[key] = supports(dtype, key[1], output_lse=key[2], threshold=key[3], output=kind,
                                          group_size=group, ue8m0=ue8m0, mask_empty_context=fused)
        return hit
    except (AttributeError, IndexError, TypeError, ValueError):
        return False


def _group(output, block_scale, output_scale, group_size):
    """The group size of a per-token-group FP8 call mla-gen can take (vLLM's rules: a group size,
    no per-tensor scale, e4m3 output; a float32 2-D scale tensor on the device), else None."""
    if output_scale is not None or group_size is None or isinstance(group_size, bool):
        return None
    g = int(group_size)
    if g < 1 or output.shape[-1] % g or str(output.dtype) != "torch.float8_e4m3fn":
        return None
    if not _on_cuda(block_scale) or str(block_scale.dtype) != "torch.float32" or block_scale.dim() != 2:
        return None
    return g


def group_scales(output, block_scale, group_size: int):
    """The scale tensor as the group kernels take it, [T, H*D/G], at the strides vLLM's kernel
    addresses it by (its own two strides, whatever its shape): the tensor itself where its shape
    is that already (row-major, column-major, padded alike)."""
    T, H, D = output.shape
    shape = (T, H * D // group_size)
    if tuple(block_scale.shape) == shape:
        return block_scale
    return block_scale.as_strided(shape, block_scale.stride(), block_scale.storage_offset())


class Patch:
    """What ``patch()`` changed; ``undo()`` puts the originals back."""

    def __init__(self, original, wrapper, places):
        self.original, self.wrapper, self.places = original, wrapper, places

    def undo(self):
        """Put vLLM's own ``merge_attn_states`` back where ``patch()`` installed the wrapper (where
        the wrapper is still there: a later patch by someone else is left alone). Calling it again
        does nothing."""
        for module in self.places:
            if getattr(module, "merge_attn_states", None) is self.wrapper:
                module.merge_attn_states = self.original
        self.places = []


def mask_empty_context(lse, query_start_loc, context_start_loc):
    """A copy of head-major ``lse`` ([H, T]) with -inf for every token of a request whose context
    is empty, what ``mask_empty_context_lse`` computes (docs/SEMANTICS.md) for nondecreasing
    ``query_start_loc``, in torch ops on the tensors' device (no host sync): the fallback of a
    fused call vLLM's dispatcher cannot take."""
    import torch

    q, c = query_start_loc.long(), context_start_loc.long()
    requests = q.numel() - 1
    if requests < 1:
        return lse
    t = torch.arange(lse.shape[-1], device=lse.device)
    b = torch.searchsorted(q, t, right=True) - 1  # q[b] <= t < q[b + 1] for a token of request b
    inside = (b >= 0) & (b < requests)
    empty = (c[1:] == c[:-1])[b.clamp(0, requests - 1)] & inside
    return lse.masked_fill(empty, float("-inf"))


def _make_wrapper(original, strict: bool):
    from .functions import both_or_neither

    def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None,
                          *args, query_start_loc=None, context_start_loc=None, **kwargs):
        # vLLM's trailing arguments (TRAILING), by position or name; anything else is vLLM's to judge.
        nargs = len(args)
        n = args[0] if nargs > 0 else kwargs.get("prefill_tokens_with_context")
        scale = args[1] if nargs > 1 else kwargs.get("output_scale")
        block = args[2] if nargs > 2 else kwargs.get("output_block_scale")
        fused = query_start_loc is not None or context_start_loc is not None
        if fused:
            both_or_neither(query_start_loc, context_start_loc)
        known = nargs <= len(TRAILING) and (not kwargs or _TRAILING.issuperset(kwargs))
        if block is not None and known:
            group = args[3] if nargs > 3 else kwargs.get("quant_group_size")
            ue8m0 = args[4] if nargs > 4 else kwargs.get("quant_scale_ue8m0")
            scales = None
            if route(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, n, scale,
                     query_start_loc, context_start_loc, output_block_scale=block, quant_group_size=group,
                     quant_scale_ue8m0=ue8m0):
                try:
                    scales = group_scales(output, block, int(group))
                except RuntimeError:  # strides reaching past the tensor's storage: vLLM's to judge
                    if strict:
                        raise
            if scales is not None:
                try:
                    locations = ({"query_start_loc": query_start_loc, "context_start_loc": context_start_loc}
                                 if fused else {})
                    _merge(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, n, None,
                           output_group_scales=scales, ue8m0=bool(ue8m0), **locations)
                    stats["routed"] += 1
                    return None
                except REFUSED:
                    if strict:
                        raise
        elif known and route(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, n, scale,
                             query_start_loc, context_start_loc):
            try:
                if fused:
                    _merge(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, n, scale,
                           query_start_loc=query_start_loc, context_start_loc=context_start_loc)
                else:
                    _merge(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, n, scale)
                stats["routed"] += 1
                return None
            except REFUSED:
                if strict:
                    raise
        stats["fallbacks"] += 1
        if fused:  # vLLM's dispatcher has no start locations: the mask first, as vLLM runs it
            prefix_lse = mask_empty_context(prefix_lse, query_start_loc, context_start_loc)
        return original(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, *args, **kwargs)

    merge_attn_states.__wrapped__ = original
    merge_attn_states.__doc__ = f"mla-gen's merge_attn_states where supported, else {original.__module__}'s."
    merge_attn_states._mla_gen_original = original
    merge_attn_states._mla_gen_strict = strict
    return merge_attn_states


def patch(module=None, *, strict: bool = False) -> Patch:
    """Replace vLLM's ``merge_attn_states`` dispatcher (in `module`, a module or its name; by
    default the first of MODULES that imports) with one routing to mla-gen, and rebind every
    loaded module that holds the original under that name. Idempotent: a second call with the same
    ``strict`` keeps the installed wrapper; with the other, it installs one of that ``strict``
    wherever the first was. ``strict``: an argument check refusal raises instead of falling back."""
    if module is None:
        errors = []
        for name in MODULES:
            try:
                module = importlib.import_module(name)
                break
            except ImportError as e:
                errors.append(f"{name}: {e}")
        else:
            raise ImportError("vLLM's merge_attn_states dispatcher is not importable: " + "; ".join(errors)
                              + "; install vLLM, or name its module: patch(module=...)")
    elif isinstance(module, str):
        module = importlib.import_module(module)
    current = module.merge_attn_states
    original = getattr(current, "_mla_gen_original", current)
    strict = bool(strict)
    if current is not original and getattr(current, "_mla_gen_strict", None) == strict:
        wrapper = current
    else:
        wrapper = _make_wrapper(original, strict)
    places = []
    for m in list(sys.modules.values()):
        try:
            held = getattr(m, "merge_attn_states", None)
            if held is original or held is current or m is module:
                m.merge_attn_states = wrapper
                places.append(m)
        except Exception:  # modules with unusual attribute access
            continue
    return Patch(original, wrapper, places)

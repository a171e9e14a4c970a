"""The kernels as torch operators, ``torch.ops.mla_gen.*``, for torch.compile and code that
dispatches through torch.ops. Registered once, at import, with
``torch.library.Library("mla_gen", "DEF")`` define/impl (not the @custom_op decorator, which
costs 12-19 us a call); each op has a fake (meta) implementation, so torch.compile traces it
and meta tensors run it.

The routes, in one place: where the package has its compiled op (mla_gen._ext: C++ on the
LibTorch stable ABI, or its native build for the running torch release, a platform wheel), it
implements every op here for CUDA, from the table the Python path reads too (mla_gen/binding.json);
the plain functions (mla_gen.merge_attn_states ...) and the FlashInfer, SGLang and vLLM APIs keep
the Python path (functions -> _torch -> _plan), whose per-layout fast path costs less per call
than a dispatch. Without the compiled op (a pure-Python wheel, ``$MLA_GEN_PURE_PYTHON``,
``$MLA_GEN_KERNELS`` set at import, torch < 2.10) the ops are these Python functions over the
same path. ``compiled`` says which serves.

- ``merge_attn_states``: vLLM's schema, ``torch.ops._C.merge_attn_states``'s arguments, then
  ``query_start_loc``, ``context_start_loc`` (both or neither: the fused empty-context mask).
- ``merge_attn_states_fp8_group``: per-token-group FP8 output, its scales written.
- ``merge_states``: K-way merge, returns ``(output, output_lse)``.
- ``merge_state_in_place``: mutates ``v`` and ``s``.
- ``mask_empty_context_lse``: mutates ``lse``.
"""

from __future__ import annotations

import torch

from . import _plan
from . import functions as _f
from ._binding import OPS, SCHEMAS, schema_args

NAMESPACE = "mla_gen"

# The op's own entry (the op's argument order): the dispatcher calls it directly, no wrapper frame
# here; it runs the function's fast path with the operator's last-plan slot.
_merge_attn_states = _f.merge_attn_states_op
# Returns the merged lse: a folder whose kernel for the call writes none is refused before the
# launch (text no_states_lse), as the compiled op refuses it.
_merge_states = _f.merge_states_op


def _schema_names(name: str) -> tuple:
    """Op `name`'s argument names, in schema order."""
    return tuple(arg for _, arg in schema_args(name))


def _by_name(name):
    """Op `name`'s Python implementation: its schema's arguments, by name, to the function of the
    same name (each argument of an op is the function's parameter of that name; arguments the
    dispatcher passes by keyword, or leaves out because they hold their defaults, follow); its
    ``_op`` variant where it has one (an op without the function's lse_layout)."""
    fn, names = getattr(_f, f"{name}_op", None) or getattr(_f, name), _schema_names(name)

    def impl(*args, **kwargs):
        return fn(**dict(zip(names, args)), **kwargs)

    impl.__name__ = f"_{name}"
    return impl


IMPLS = {name: _by_name(name) for name in SCHEMAS}
IMPLS["merge_attn_states"] = _merge_attn_states
IMPLS["merge_states"] = _merge_states


# Fakes: the mutating ops return nothing; merge_states allocates on the input's device. Sizes are
# the kernel's check, at the call (a fake that compared symbolic sizes would specialize them). The
# fakes of ops with the fused mask's kind (_binding.OPS: a second kind, the start locations
# given) refuse one start location without the other, as the call would before any kernel.
def _fake_none(*args, **kwargs):
    return None


def _fake_checked(name):
    names = _schema_names(name)

    def fake(*args, **kwargs):
        given = {**dict(zip(names, args)), **kwargs}
        q, c = given.get("query_start_loc"), given.get("context_start_loc")
        if (q is None) != (c is None):
            _f.both_or_neither(q, c)
        return None

    return fake


def _fake_merge_states(v, s):
    # The rank, as the call refuses it; no size is compared here: under torch.compile's dynamic
    # shapes each comparison of a symbolic size would guard on it (a recompile per size).
    T, _, H, D = _plan.dims(v, "v", 4)
    return v.new_empty((T, H, D)), v.new_empty((T, H), dtype=torch.float32)


FAKES = {name: _fake_checked(name) if len(OPS[name].kinds) > 1 else _fake_none for name in SCHEMAS}
FAKES["merge_states"] = _fake_merge_states

_lib = None
# Whether the compiled op (mla_gen._ext) implements the ops for CUDA in this process.
compiled = False


def _register():
    global _lib, compiled
    if _lib is not None:
        return
    try:
        lib = torch.library.Library(NAMESPACE, "DEF")
    except RuntimeError:
        if hasattr(torch.ops, NAMESPACE) and hasattr(getattr(torch.ops, NAMESPACE), "merge_attn_states"):
            return  # registered by another copy of this package in the process: keep that one
        raise
    register_fake = getattr(torch.library, "register_fake", None)
    for name, schema in SCHEMAS.items():
        lib.define(schema)
    # The schemas first: the compiled op registers its implementation as it loads.
    from . import _ext
    compiled = _ext.load()
    for name in SCHEMAS:
        if not compiled:  # the compiled op implements every op of SCHEMAS (python/csrc, from _binding.OPS)
            lib.impl(name, IMPLS[name], "CUDA")
        if register_fake is not None:
            register_fake(f"{NAMESPACE}::{name}", FAKES[name], lib=lib)
        else:  # torch < 2.4
            torch.library.impl_abstract(f"{NAMESPACE}::{name}", FAKES[name], lib=lib)
    _lib = lib  # the ops live as long as this object


_register()

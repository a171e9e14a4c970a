"""Attention-state merges (vLLM's ``merge_attn_states`` and relatives) on CUDA kernels generated
ahead of time by mla-gen.

No compiler runs here: each kernel's CUBIN/PTX is loaded once through the CUDA driver (ctypes
libcuda, opened at the first launch, never at import), and ``prefill_tokens_with_context`` is a
plain kernel argument, so a new value never compiles anything (where a kernel has an
all-context twin, ``_nothr``, the first value equal to the token count loads that twin's image
once). Launches go on torch's current stream with no device-to-host sync, so CUDA graphs can
capture them.

- Functions (the fast path): ``merge_attn_states``, ``merge_attn_states_fp8_group``,
  ``merge_states``, ``merge_state_in_place``, ``mask_empty_context_lse``.
- Operators: ``torch.ops.mla_gen.*`` (``mla_gen.ops``), with fake implementations.
- For dispatchers: ``supports(dtype, head_size, ...)`` from the manifest alone;
  ``mla_gen.vllm.patch()`` routes vLLM's dispatcher here.
- Other engines' conventions: ``mla_gen.flashinfer`` (``merge_state``, ``merge_state_in_place``,
  ``merge_states``: lse in base 2, token-major) and ``mla_gen.sglang`` (``merge_state_v2``).
- Checking without a GPU: ``check_args(kernel, args)`` -> ``(values, grid)`` or ``ArgumentError``.
- Faults: a kernel folder that cannot serve raises ``KernelFolderError`` (``ManifestError``;
  ``ImageError``, ``MissingImageError``: every image is checked against the manifest's size and
  sha256 before the driver sees it), a driver call ``CudaError``; each names the fix.

Kernels: ``$MLA_GEN_KERNELS`` (read at every lookup), else those shipped in the package, else a
source checkout's ``generated/``. The checker and ``supports`` import without torch.
"""

from __future__ import annotations

from ._version import __version__
from ._cuda import CudaError
from .contract import ArgumentError, Buffer
from .errors import ImageError, KernelFolderError, ManifestError, MissingImageError
from .manifest import check_args, supports

try:
    import torch as _torch_module  # noqa: F401
except ImportError:  # the checker, supports() and the manifest work without torch
    _torch_module = None

if _torch_module is not None:
    from .functions import (launch_kernel, mask_empty_context_lse, merge_attn_states, merge_attn_states_fp8_group,
                            merge_state_in_place, merge_states)
    from . import ops  # noqa: F401  registers torch.ops.mla_gen.*


def kernels_dir():
    """The kernel folder a call would use now (a Path, or an importlib.resources Traversable)."""
    from . import manifest
    return manifest.folder().root


def available_kernels() -> list:
    """The kernel names of the current folder's manifest: every kernel, those a call reaches only
    through another (a size rule's ranges, specializations such as ``_dense``) included."""
    from . import manifest
    return [k["name"] for k in manifest.load()["kernels"]]


def stats() -> dict:
    """Counters: ``module_loads`` (images loaded through the driver: one per kernel and image,
    ever), ``launches``, ``plans`` (full checks that built a per-layout plan, the compiled op's
    too), ``fallbacks`` (calls mla_gen.vllm handed back to vLLM). A new threshold value is an
    argument: it shows as a launch, never as a plan; where the kernel has an all-context twin
    (``_nothr``), the first threshold equal to the token count loads that twin's image once."""
    from . import _cuda
    out = dict(_cuda.stats)
    out["plans"] = 0
    if _torch_module is not None:  # the torch layers and the compiled op; without torch none ran
        from . import _ext, _plan
        out["launches"] += _ext.launches()  # the compiled op's
        out["plans"] = _plan.stats["plans"] + _ext.plans()
    from . import vllm as _vllm
    out["fallbacks"] = _vllm.stats["fallbacks"]
    return out


__all__ = ["__version__", "ArgumentError", "Buffer", "check_args", "supports", "kernels_dir", "available_kernels",
           "stats", "CudaError", "KernelFolderError", "ManifestError", "ImageError", "MissingImageError"]
if _torch_module is not None:
    __all__ += ["merge_attn_states", "merge_attn_states_fp8_group", "merge_states", "merge_state_in_place",
                "mask_empty_context_lse", "launch_kernel", "ops"]

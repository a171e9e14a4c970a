"""The compiled op, chosen at import: ``mla_gen/_C.abi3.so`` (python/csrc, built by setup.py
against the LibTorch stable ABI) implements every ``torch.ops.mla_gen`` op for CUDA in C++,
from the table the Python path reads too (mla_gen._binding), through the generated C launcher of
the package's kernels. It embeds no image: it reads
each from the package's ``kernels/`` folder beside it (the images the wheel ships once), checked
against the manifest's size and sha256 before the driver sees it.

Where the package also has a native build for the running torch's release
(``_C_torch<major>_<minor>.abi3.so``: the same op as a TORCH_LIBRARY kernel, built against that
release's headers and libraries), that one is loaded instead: the dispatcher hands it its stack
as it is, where the stable ABI boxes every argument on the heap. Only under a final release
(``2.11.0``, ``2.11.1+cu130``): a pre-release or a vendor's build (``2.11.0a0+git...``) may lay
out what the native build reads inline otherwise. ``$MLA_GEN_NATIVE_OP=0`` keeps the stable one
(``build`` says which loaded: "native" or "stable"; ``native_reason`` why not the native one).

It is used where it loads; otherwise the Python implementation of today serves the op. Why not
(``reason``): no such file (a pure-Python wheel: another platform, or built without torch >=
2.10's headers), no ``kernels/manifest.json`` beside it, torch older than 2.10 (before the
stable ABI) without a native build for it, torch without CUDA (no libtorch_cuda),
``$MLA_GEN_PURE_PYTHON`` set, or ``$MLA_GEN_KERNELS`` set at import (the compiled op's launcher
is generated from the package's manifest, so it serves only the package's folder; the Python path
serves any folder).
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

import torch

MIN_TORCH = (2, 10)

loaded: Path | None = None  # the library, once loaded
build: str | None = None  # "native" or "stable", once loaded
native_reason: str | None = None  # why the native build is not the one loaded
reason = "not tried"  # why the Python implementation serves the op
_counter = None
_plans = None


def _torch_version() -> tuple:
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def candidate():
    """The compiled op's stable-ABI file in the package, or None."""
    files = sorted(Path(__file__).parent.glob("_C.*so"))
    return files[0] if files else None


def _final_release() -> bool:
    return re.fullmatch(r"\d+\.\d+\.\d+(\+[\w.]+)?", torch.__version__) is not None


def native_candidate():
    """The package's native build for the running torch's release (a final release), or None."""
    if not _final_release():
        return None
    major, minor = _torch_version()
    files = sorted(Path(__file__).parent.glob(f"_C_torch{major}_{minor}.*so"))
    return files[0] if files else None


def _load(path: Path) -> str | None:
    """Load one build of the op; None, or why it did not load."""
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as e:
        return f"the compiled op did not load: {e}"
    return None


def load() -> bool:
    """Load the compiled op (once): its CUDA implementations of the ops register as the library
    loads. Call after the schemas are defined. False with ``reason`` set where the
    Python implementation is to serve."""
    global loaded, build, reason, native_reason, _counter, _plans
    if loaded is not None:
        return True
    if os.environ.get("MLA_GEN_PURE_PYTHON", "") not in ("", "0"):
        reason = "MLA_GEN_PURE_PYTHON is set"
        return False
    if os.environ.get("MLA_GEN_KERNELS"):
        reason = "MLA_GEN_KERNELS is set: the compiled op serves only the package's kernels"
        return False
    path, native = candidate(), None
    if os.environ.get("MLA_GEN_NATIVE_OP", "") == "0":
        native_reason = "MLA_GEN_NATIVE_OP=0"
    elif not _final_release():
        native_reason = (f"torch {torch.__version__} is not a final release (the native builds serve only the "
                         "releases they were built for)")
    else:
        native = native_candidate()
        native_reason = None if native else f"the package has no native build for torch {torch.__version__}"
    if path is None and native is None:
        reason = ("the package has no compiled op (a pure-Python wheel)" if not any(Path(__file__).parent.glob("_C*.so"))
                  else f"the package has no stable-ABI op and {native_reason}")
        return False
    folder = (path or native).parent
    if not (folder / "kernels" / "manifest.json").is_file():
        reason = f"the compiled op's images are missing: no {folder / 'kernels' / 'manifest.json'}"
        return False
    # A native build that does not load (a torch of that release built otherwise) leaves nothing
    # registered (the loader refuses it before its registrations run): the stable one serves.
    why = _load(native) if native is not None else native_reason
    if why is None:
        path, kind = native, "native"
    elif path is None:
        reason = why
        return False
    elif _torch_version() < MIN_TORCH:
        reason = f"torch {torch.__version__} predates the stable ABI the compiled op needs (2.10)"
        return False
    else:
        kind, native_reason = "stable", why
        why = _load(path)
        if why is not None:
            reason = why
            return False
    try:
        lib = ctypes.CDLL(str(path))
        _counter = ctypes.c_uint64.in_dll(lib, "mla_gen_ext_launches")
        _plans = ctypes.c_uint64.in_dll(lib, "mla_gen_ext_plans")
    except (OSError, ValueError):
        _counter = _plans = None
    loaded, build, reason = path, kind, None
    return True


def launches() -> int:
    """Calls of the compiled op that launched (or had nothing to launch)."""
    return 0 if _counter is None else int(_counter.value)


def plans() -> int:
    """Calls of the compiled op that prepared a plan (a layout not among its thread's last few)."""
    return 0 if _plans is None else int(_plans.value)

"""Where the kernels are and which one a call needs, from manifest.json alone: no torch, no
driver, nothing loaded.

The kernel folder is, at every lookup: ``$MLA_GEN_KERNELS`` when set (read live: a later change
takes effect at the next call), else the kernels shipped in the package (``mla_gen/kernels``,
found through importlib.resources), else a source checkout's ``generated/``. Manifests and
kernel choices are cached per resolved folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from importlib import resources
from pathlib import Path

from . import _binding, _select
from . import contract as _contract
from ._version import __version__
from .errors import ImageError, ManifestError, MissingImageError

__all__ = ["KernelFolder", "folder", "load", "supports", "select", "call", "family_of", "launch_pdl", "SCHEMA_VERSION"]

SCHEMA_VERSION = 2
ENV = "MLA_GEN_KERNELS"
_MAX_SELECTED = 4096  # selections kept per kernel folder

# The live environment, read without os.environ.get's per-call encoding and KeyError (about 1 us
# where the variable is unset): os.environ keeps its contents in `_data`, keyed by the encoded
# name, and updates it on every assignment, so this sees what os.environ sees.
_env_data = getattr(os.environ, "_data", None)
try:
    _env_key = os.environ.encodekey(ENV)  # type: ignore[attr-defined]
except AttributeError:
    _env_data = None
    _env_key = ENV

# torch dtypes, numpy-style names and manifest names -> manifest names
_DTYPE_NAMES = {"float32": "f32", "float": "f32", "f32": "f32", "float16": "f16", "half": "f16", "f16": "f16",
                "bfloat16": "bf16", "bf16": "bf16"}


def env_value():
    """``$MLA_GEN_KERNELS`` as stored (bytes on POSIX), or None; cheap enough for every call."""
    if _env_data is not None:
        return _env_data.get(_env_key) or None
    return os.environ.get(ENV) or None


def _parts(rel) -> list:
    """A manifest path's parts, refusing any that leaves the folder: absolute, ``..``, ``.``,
    empty parts, a backslash or a drive (ValueError)."""
    if not isinstance(rel, str) or not rel:
        raise ValueError(f"{rel!r} is not a relative path")
    parts = rel.split("/")
    if "" in parts or "." in parts or ".." in parts or "\\" in rel or "\0" in rel or ":" in parts[0]:
        raise ValueError(f"{rel!r} is not a plain relative path inside the folder")
    return parts


_SHA256 = re.compile("[0-9a-f]{64}")


def _is_sha256(text) -> bool:
    return isinstance(text, str) and _SHA256.fullmatch(text) is not None


class KernelFolder:
    """A folder of generated kernels: its manifest, read once, and its files. `origin` says where
    it came from ("package", "env": $MLA_GEN_KERNELS, "source": a checkout's generated/), for the
    fix an error names."""

    def __init__(self, root, label: str, origin: str = "env"):
        self.root = root  # a Path or an importlib.resources Traversable
        self.label = label
        self.origin = origin
        self._manifest = None
        self._lock = threading.Lock()
        self.selected: dict = {}  # selection key -> kernel entry (or None)

    def __repr__(self):
        return f"KernelFolder({self.label})"

    def read_bytes(self, rel: str) -> bytes:
        """The bytes of the folder's file ``rel`` (a manifest path, ``/``-separated), unchecked:
        :meth:`image` checks an image against the manifest. OSError where it cannot be read."""
        node = self.root
        for part in _parts(rel):
            node = node.joinpath(part)
        return node.read_bytes()

    def fix(self) -> str:
        """The command that makes this folder whole again."""
        if self.origin == "package":
            return ("reinstall the package from what it was installed from (pip install "
                    "--force-reinstall --no-deps ./python, or the mla_gen wheel's path), or set "
                    f"${ENV} to a complete kernel folder")
        if self.origin == "source":
            return "regenerate the checkout's images with scripts/generate.sh"
        spec = "the spec that made it"
        m = self._manifest
        if m is not None and isinstance(m.get("spec"), dict) and m["spec"].get("source"):
            spec += f", {m['spec']['source']}"
        return (f"regenerate it with `mla-gen generate SPEC --out {self.root}` ({spec}), or set ${ENV} to a "
                "complete kernel folder")

    def image(self, entry: dict, kernel: str) -> bytes:
        """The bytes of an image (a manifest artifact entry: ``file``, ``bytes``, ``sha256``) after
        checking them against the entry: ImageError (MissingImageError) names the file, what was
        expected and found, and the fix. Nothing unchecked reaches the driver."""
        rel = entry["file"]
        want = (entry.get("bytes"), entry.get("sha256"))
        where = f"{self.label}/{rel}"
        try:
            data = self.read_bytes(rel)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise MissingImageError(
                f"{kernel} needs {where}, which is missing: the kernel folder is incomplete (a partial copy or "
                f"an interrupted install); {self.fix()}", file=where, kernel=kernel, expected=want,
                found=None) from e
        except OSError as e:
            raise ImageError(f"cannot read {where} (for {kernel}): {e}; {self.fix()}", file=where, kernel=kernel,
                             expected=want, found=None) from e
        found = (len(data), hashlib.sha256(data).hexdigest())
        if found != want:
            what = (f"{found[0]} bytes where the manifest says {want[0]} (truncated or padded)" if found[0] != want[0]
                    else "the right size but other contents (corrupted)")
            raise ImageError(
                f"{where} (for {kernel}) does not match manifest.json: {what}; expected {want[0]} bytes, sha256 "
                f"{want[1]}; found {found[0]} bytes, sha256 {found[1]}. Refused before the driver saw it; "
                f"{self.fix()}", file=where, kernel=kernel, expected=want, found=found)
        cubin = self.is_cubin(entry, kernel)
        if cubin is not None and (len(data) < 64 or data[:4] != b"\x7fELF" if cubin else not data or 0 in data):
            kind = "an ELF CUBIN" if cubin else "PTX text"
            raise ImageError(f"{where} (for {kernel}) is not {kind}, which manifest.json says it is: the manifest "
                             f"itself is wrong (its size and sha256 match). Refused before the driver saw it; "
                             f"{self.fix()}", file=where, kernel=kernel, expected=want, found=found)
        return data

    def is_cubin(self, entry: dict, kernel: str) -> bool | None:
        """Whether the manifest lists `entry` as kernel `kernel`'s CUBIN (True) or PTX (False);
        None where it lists it as neither."""
        for a in self.kernel(kernel)["archs"]:
            if a.get("cubin") == entry or a.get("ptx") == entry:
                return a.get("cubin") == entry
        return None

    @property
    def manifest(self) -> dict:
        """The folder's manifest.json as a dict, read and checked once (on first use, thread-safe):
        ManifestError names what is wrong with it and the fix."""
        m = self._manifest
        if m is None:
            with self._lock:
                if self._manifest is None:
                    self._manifest = self._read_manifest()
                m = self._manifest
        return m

    def _read_manifest(self) -> dict:
        where = f"{self.label}/manifest.json"
        try:
            raw = self.read_bytes("manifest.json")
        except OSError as e:
            raise ManifestError(f"cannot read {where}: {e}; {self.fix()}") from e
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise ManifestError(f"{where} is not valid JSON ({e}; the file has {len(raw)} bytes): truncated or "
                                f"corrupt; {self.fix()}") from e
        if not isinstance(data, dict):
            raise ManifestError(f"{where} holds a {type(data).__name__}, not an mla-gen manifest; {self.fix()}")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
                hint = (f"written by a newer mla-gen than this package ({__version__}); upgrade the mla_gen "
                        f"package, or regenerate the folder with mla-gen {__version__}")
            else:
                hint = f"made by another mla-gen; {self.fix()}"
            raise ManifestError(f"{where} has schema_version {version}; this package reads {SCHEMA_VERSION} ({hint})")
        try:
            _check_images(data, where, self.fix)
            data["_by_name"] = {k["name"]: k for k in data["kernels"]}
            reached = _select.reached(data["kernels"])
        except (KeyError, TypeError, AttributeError) as e:
            raise ManifestError(f"{where} is malformed ({type(e).__name__}: {e}); {self.fix()}") from e
        data["_reached"] = reached
        return data

    def kernel(self, name: str) -> dict:
        """The manifest's entry of the kernel called ``name``; KeyError where the folder has none."""
        try:
            return self.manifest["_by_name"][name]
        except KeyError:
            raise KeyError(f"no kernel {name!r} in {self.label}/manifest.json") from None


def _check_images(data: dict, where: str, fix) -> None:
    """Every image entry names a file inside the folder, with its size and sha256 (ManifestError)."""
    for k in data["kernels"]:
        for a in k["archs"]:
            for kind in ("cubin", "ptx"):
                art = a.get(kind)
                if art is None:
                    continue
                what = f"{where}: {k['name']}'s {a.get('arch')} {kind}"
                try:
                    _parts(art.get("file"))
                except ValueError as e:
                    raise ManifestError(f"{what}: {e}, refused (an image must lie inside its kernel folder); "
                                        f"{fix()}") from None
                size = art.get("bytes")
                if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not _is_sha256(art.get("sha256")):
                    raise ManifestError(f"{what} ({art.get('file')}) lacks a valid size and sha256 (`bytes`, "
                                        f"`sha256`): an image is checked against them before it loads; {fix()}")


_folders: dict = {}
_PACKAGED = object()


def _packaged_root():
    try:
        root = resources.files("mla_gen").joinpath("kernels")
        if root.joinpath("manifest.json").is_file():
            return root
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        pass
    return None


def folder() -> KernelFolder:
    """The kernel folder for this call (see the module's doc)."""
    raw = env_value()
    f = _folders.get(raw if raw is not None else _PACKAGED)
    if f is not None:
        return f
    if raw is not None:
        text = raw.decode(errors="surrogateescape") if isinstance(raw, bytes) else raw
        path = Path(text).expanduser().resolve()
        f = _by_path(str(path), lambda: KernelFolder(path, f"{path} (${ENV})", "env"))
        _folders[raw] = f
        return f
    root = _packaged_root()
    if root is not None:
        f = _by_path(str(root), lambda: KernelFolder(root, f"{root} (installed package)", "package"))
    else:
        repo = Path(__file__).resolve().parents[2] / "generated"
        f = _by_path(str(repo), lambda: KernelFolder(repo, str(repo), "source"))
    _folders[_PACKAGED] = f
    return f


_by_path_cache: dict = {}


def _by_path(key, make):
    f = _by_path_cache.get(key)
    if f is None:
        f = _by_path_cache[key] = make()
    return f


def _new_locks_after_fork():
    # A folder's lock held by another thread at a fork would never be released in the child.
    for f in _by_path_cache.values():
        f._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_after_fork)


def load() -> dict:
    """The current folder's manifest."""
    return folder().manifest


def check_args(kernel: str, args: dict, manifest=None) -> tuple:
    """Check `args` (by name) against `kernel`'s contract; ``(values, grid)`` or
    :class:`~mla_gen.contract.ArgumentError`. No GPU, no driver, no launch. `manifest`: a
    manifest dict, a dict of contracts keyed by kernel name, or None for the current kernel
    folder's manifest."""
    return _contract.check_args(kernel, args, load() if manifest is None else manifest)


def family_of(kernel: dict) -> tuple:
    """A kernel's family and its fields: ("merge_states", {"num_states": 4 or None}), ..."""
    f = kernel["variant"].get("family", kernel.get("family", "merge_attn_states"))
    if isinstance(f, dict):
        ((name, fields),) = f.items()
        return name, dict(fields or {})
    return f, {}


def dtype_name(dtype) -> str:
    """A manifest dtype name from a torch dtype, its name, or a manifest name."""
    text = str(dtype).removeprefix("torch.")
    return _DTYPE_NAMES.get(text, text)


def select(kf: KernelFolder, family: str, args: dict, options: dict):
    """The kernel of `family` that serves a call, from the manifest's contracts and ``select``
    blocks (docs/MANIFEST.md, "Selection"; the rule is _select.select). `args`: by name, a buffer
    as ``(elem, shape)`` (either None where unknown), an integer as its value or None (given,
    its value left to each launch); null buffers left out. `options`: the ``select`` blocks'
    keys (``lse_layout``, ``ue8m0`` as "true"/"false"). Returns ``(kernel, serves)`` (serves
    False: none serves, and this one's check names what it does not take) or None; cached."""
    key = (family, tuple(sorted(args.items())), tuple(sorted(options.items())))
    hit = kf.selected.get(key)
    if hit is not None or key in kf.selected:
        return hit
    result = _select.select(kf.manifest, family, args, options)
    if len(kf.selected) >= _MAX_SELECTED:  # calls state their sizes: bounded, as the plans are
        kf.selected.clear()
    kf.selected[key] = result
    return result


def by_size_rule(kf: KernelFolder, kernel: dict, value) -> dict:
    """The kernel a launch of `kernel` runs (docs/MANIFEST.md, "Size rules"): where its size
    rule has a range whose bound exceeds the launch's rows (the product of two integer
    parameters, ``value(name)``), that range's kernel, with the same arguments; else itself."""
    rule = kernel["launch"].get("size_rule")
    if not rule:
        return kernel
    rows = value(rule["rows"][0]) * value(rule["rows"][1])
    for r in rule["ranges"]:
        if rows < r["below_rows"]:
            return kf.kernel(r["kernel"])
    return kernel


OUTPUTS = ("same", "fp8_e4m3", "fp8_e4m3_group")  # supports()'s output kinds
# supports()'s keywords with their defaults, and those each family's calls have: a keyword another
# family's calls have must hold its default (a ValueError names it, where False would read as "no
# kernel" and True as a kernel that takes it).
DEFAULTS = {"output_lse": False, "threshold": False, "output": "same", "group_size": None, "ue8m0": False,
            "lse_layout": None, "num_states": None, "mask": False, "mask_empty_context": False}
FAMILY_KEYWORDS = {
    "merge_attn_states": ("output_lse", "threshold", "output", "group_size", "ue8m0", "lse_layout",
                          "mask_empty_context"),
    "merge_states": ("output_lse", "num_states"),
    "merge_state_in_place": ("lse_layout", "mask"),
    "mask_empty_context_lse": ("lse_layout",),
}


def supports(dtype, head_size: int, *, family: str = "merge_attn_states", output_lse: bool = False,
             threshold: bool = False, output: str = "same", group_size: int | None = None, ue8m0: bool = False,
             lse_layout: str | None = None, num_states: int | None = None, mask: bool = False,
             mask_empty_context: bool = False, **select_options: str) -> bool:
    """Whether the current kernel folder has a kernel for this call, from the manifest alone (no
    driver, no GPU, nothing loaded). ``dtype``: the inputs' dtype (torch dtype or name);
    ``output_lse``: an output lse will be given; ``threshold``: prefill_tokens_with_context
    below num_tokens will be given; ``output``: "same", "fp8_e4m3" (per-tensor scale) or
    "fp8_e4m3_group" (with group_size, ue8m0); ``mask_empty_context``: query_start_loc and
    context_start_loc will be given (the empty-context mask fused into the merge). Layout defaults: head-major lse for
    merge_attn_states and mask_empty_context_lse, token-major for merge_state_in_place.
    ``select_options``: any other key of the kernels' ``select`` blocks, its value as the manifest
    writes it, e.g. ``lse_base="2"`` (FlashInfer's and SGLang's base), or the name of any tensor
    of the family's calls (mla_gen/binding.json) with True, e.g. ``query_start_loc=True``: a new
    spec option that selects or adds a tensor is asked for here with no change to this function.
    A True answer means a kernel exists; the argument check still judges strides, alignment and
    overlap at the call. An unknown ``output`` or ``family`` raises ValueError, and so does a
    keyword the family's calls do not have (FAMILY_KEYWORDS: ``output`` of merge_states,
    ``output_lse`` of merge_state_in_place ...) set to other than its default, or ``group_size``
    or ``ue8m0`` without ``output="fp8_e4m3_group"``; a group size that does not divide the head
    size, or fewer than one state, is a call no kernel serves (False)."""
    if output not in OUTPUTS:
        raise ValueError(f"unknown output {output!r} ({', '.join(map(repr, OUTPUTS))})")
    # call() refuses the keywords the family does not take, before any answer.
    args, options = call(family, dtype, head_size, output_lse=output_lse, threshold=threshold, output=output,
                         group_size=group_size, ue8m0=ue8m0, lse_layout=lse_layout, num_states=num_states, mask=mask,
                         mask_empty_context=mask_empty_context, **select_options)
    if (output == "fp8_e4m3_group" and (not group_size or head_size % group_size)) or \
            (num_states is not None and num_states < 1):
        return False
    hit = select(folder(), family, args, options)
    return hit is not None and hit[1]


def _check_keywords(family, **keywords):
    """ValueError where `family` is unknown, or a keyword its calls do not have is set (to other
    than its default in DEFAULTS), or the group keywords come without the group output."""
    if family not in FAMILY_KEYWORDS:
        raise ValueError(f"unknown family {family!r} ({', '.join(FAMILY_KEYWORDS)})")
    for key, value in keywords.items():
        if value != DEFAULTS[key] and key not in FAMILY_KEYWORDS[family]:
            having = " or ".join(repr(f) for f, keys in FAMILY_KEYWORDS.items() if key in keys)
            raise ValueError(f"{key}={value!r} given for family={family!r}, whose calls have no {key} (its keywords: "
                             f"{', '.join(FAMILY_KEYWORDS[family])}): leave {key} out, or ask for family={having}")
    if keywords.get("output") != "fp8_e4m3_group":
        for key in ("group_size", "ue8m0"):
            if keywords.get(key, DEFAULTS[key]) != DEFAULTS[key]:
                raise ValueError(f"{key}={keywords[key]!r} describes the per-token-group FP8 output: pass "
                                 f"output=\"fp8_e4m3_group\" with it, or leave {key} out")


def call(family, dtype, head_size, *, output_lse=False, threshold=False, output="same", group_size=None, ue8m0=False,
         lse_layout=None, num_states=None, mask=False, mask_empty_context=False, **select_options) -> tuple:
    """The call ``supports()``'s keywords describe, as :func:`select` takes it: ``(args,
    options)``, one token of one head (so either lse layout fits the sizes; the option decides).
    Refuses the keywords supports() refuses (ValueError)."""
    _check_keywords(family, output_lse=output_lse, threshold=threshold, output=output, group_size=group_size,
                    ue8m0=ue8m0, lse_layout=lse_layout, num_states=num_states, mask=mask,
                    mask_empty_context=mask_empty_context)
    dt = None if dtype is None else dtype_name(dtype)
    row = (dt, (1, 1, head_size))
    lse = ("f32", (1, 1))
    locations = {"query_start_loc": ("i32", None), "context_start_loc": ("i32", None)}
    options = {"lse_layout": lse_layout or ("token_major" if family == "merge_state_in_place" else "head_major")}
    if family == "merge_attn_states":
        fp8 = output in ("fp8_e4m3", "fp8_e4m3_group")
        args = {"output": ("fp8_e4m3" if fp8 else dt, (1, 1, head_size)), "prefix_output": row, "prefix_lse": lse,
                "suffix_output": row, "suffix_lse": lse}
        if output == "fp8_e4m3":
            args["output_scale"] = ("f32", ())
        elif output == "fp8_e4m3_group":
            args["output_scales"] = ("f32", (1, head_size // group_size if group_size else 0))
            options["ue8m0"] = "true" if ue8m0 else "false"
        if threshold:
            args["prefill_tokens_with_context"] = None
        if mask_empty_context:
            args.update(locations)
    elif family == "merge_states":
        k = num_states
        args = {"output": row, "states": (dt, None if k is None else (1, k, 1, head_size)),
                "states_lse": ("f32", None if k is None else (1, k, 1))}
        if k is None:
            args["num_states"] = None
        options = {}
    elif family == "merge_state_in_place":
        args = {"state": row, "state_lse": lse, "other": row, "other_lse": lse}
        if mask:
            args["mask"] = ("u8", (1,))
    else:  # mask_empty_context_lse: _check_keywords refused any other family
        args = {"lse": lse, **locations}
    if output_lse and family in ("merge_attn_states", "merge_states"):
        args["output_lse"] = ("f32", (1, 1))
    # Any other tensor of the family's calls (mla_gen/binding.json), asked for by its name (e.g.
    # query_start_loc=True): the kernel must take it; its size and element type are the check's.
    tensors = {n for k in _binding.KINDS.values() if k.family == family for n in k.names}
    for name in [k for k in select_options if k in tensors and isinstance(select_options[k], bool)]:
        if select_options.pop(name):
            args.setdefault(name, (None, None))
    return args, {**options, **{k: str(v) for k, v in select_options.items()}}


def launch_pdl(kernel: dict) -> bool:
    """The kernel's ``launch.pdl``: built with ``pdl = true`` (it executes griddepcontrol.wait
    before touching its inputs), so a host may launch it with programmatic stream serialization
    on sm_90 and newer. Absent (manifests before the field): False."""
    return bool(kernel.get("launch", {}).get("pdl", False))


def pick_artifact(kernel: dict, cc: int) -> str | None:
    """The file to load on a device of compute capability `cc` (see pick_image), or None."""
    entry = pick_image(kernel, cc)
    return entry["file"] if entry else None


def pick_image(kernel: dict, cc: int) -> dict | None:
    """The image entry (``file``, ``bytes``, ``sha256``) to load on a device of compute
    capability `cc` (major*10 + minor): the CUBIN of the same major with the largest arch <= cc
    (an `sm_XYa` only when XY == cc), else the PTX of the largest non-arch-specific arch <= cc,
    else None (docs/MANIFEST.md, artifact rule)."""
    best_cubin = best_ptx = None
    for a in kernel["archs"]:
        arch = a["arch"]
        digits = arch.split("_", 1)[1]
        specific = digits.endswith("a")
        n = int(digits.rstrip("a"))
        if arch.startswith("sm_") and a.get("cubin"):
            ok = n == cc if specific else (n // 10 == cc // 10 and n <= cc)
            if ok and (best_cubin is None or n > best_cubin[0]):
                best_cubin = (n, a["cubin"])
        if not specific and n <= cc and a.get("ptx") and (best_ptx is None or n > best_ptx[0]):
            best_ptx = (n, a["ptx"])
    pick = best_cubin or best_ptx
    return pick[1] if pick else None

"""Build of the mla_gen wheel (setuptools; the project's metadata is in pyproject.toml).

The wheel holds the ``mla_gen`` package, its kernels as package data (``mla_gen/kernels/``:
``manifest.json`` and every PTX and CUBIN it names, sha256-checked here) and, where it can be
built, the compiled op ``mla_gen/_C.abi3.so``: host code only (C++ against the LibTorch stable
ABI, torch >= 2.10, and the generated C launcher), no CUDA toolkit, so one binary serves every
torch from 2.10 and every Python from 3.9. It embeds no image: it reads them from
``mla_gen/kernels/`` (the C launcher's file mode), so the wheel holds each image once. Without it
the wheel is pure Python and the package registers its ops in Python, as before.

Kernels: ``$MLA_GEN_WHEEL_KERNELS``, else ``mla_gen/kernels/`` in the source tree (an sdist),
else ``../generated/`` (the repository's default-spec kernels). Git holds only that folder's
manifest: its images are build outputs, and where they are absent or differ from the manifest
they are generated here with the mla-gen binary (below; it needs NVRTC) and packaged only if the
manifest generated is byte for byte the repository's. ``$MLA_GEN_WHEEL_LOCAL`` adds a local
version label (``0.1.0+LABEL``).

The compiled op (``$MLA_GEN_EXTENSION``: ``auto``, the default, builds it where everything below
is found and says why not otherwise; ``1`` requires it; ``0`` never builds it) needs:

- torch's headers, 2.10 or newer: ``$MLA_GEN_TORCH_INCLUDE`` (a ``torch/include``), else the
  torch installed in the environment being built for (found on disk, not imported, so pip's
  build isolation does not hide it). Built with ``TORCH_TARGET_VERSION`` = 2.10, so the binary
  calls nothing a later torch added; it registers with the headers' ABI version, though, so it
  serves that torch and later ones: scripts/build-wheel.sh builds against 2.10's for a wheel that
  serves every torch >= 2.10, a plain ``pip install`` against the environment's own torch;
- torch's libraries to link (only their names are recorded): ``$MLA_GEN_TORCH_LIB``, else that
  torch's ``lib/``;
- the C launcher of the same kernels (``mla_kernels.{h,c}``): ``$MLA_GEN_C_LAUNCHER``, else
  ``mla_gen_c/`` in the source tree (an sdist), else generated with the mla-gen binary
  (``$MLA_GEN_BIN``, the newer of ``../target/{release,debug}/mla-gen``, or ``mla-gen`` on
  PATH; it needs NVRTC) and used only if the kernels it was generated with are byte for byte the
  packaged ones (it checks each image it reads against the sizes and hashes it was generated
  with);
- a C and C++ compiler, on Linux.

Native builds beside it (``$MLA_GEN_TORCH_NATIVE``: torch folders separated by ``:``, each with
``include/`` and ``lib/``, e.g. ``scripts/torch-headers.sh 2.11.0 --libs``'s or an installed
torch's; ``auto``, the default, is the environment's own torch where it has both; ``0`` none):
``mla_gen/_C_torch<M>_<m>.abi3.so`` per folder, the same op (python/csrc/op_core.h) as a
TORCH_LIBRARY kernel of that torch release, which mla_gen._ext loads instead of the stable one
under a final release of that major.minor only: the dispatcher then hands it its stack without
the stable ABI's per-argument boxing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent  # python/
PACKAGE = "mla_gen"
TORCH_TARGET = (2, 10)  # the oldest torch with the stable ABI this extension uses


def version() -> str:
    text = (ROOT / PACKAGE / "_version.py").read_text()
    v = re.search(r'__version__\s*=\s*"([^"]+)"', text).group(1)
    local = os.environ.get("MLA_GEN_WHEEL_LOCAL", "").strip()
    if local:
        if not re.fullmatch(r"[A-Za-z0-9]+(\.[A-Za-z0-9]+)*", local):
            raise ValueError(f"MLA_GEN_WHEEL_LOCAL={local!r} is not a local version label")
        v += "+" + local
    return v


# ---- the kernels, as package data ----

def kernels_folder() -> Path:
    env = os.environ.get("MLA_GEN_WHEEL_KERNELS")
    candidates = [Path(env)] if env else [ROOT / PACKAGE / "kernels", ROOT.parent / "generated"]
    for c in candidates:
        if (c / "manifest.json").is_file():
            if c == ROOT.parent / "generated" and not env and image_problems(c):
                return _generated_default()  # the repository's images are not built (or stale)
            return c
    raise FileNotFoundError("no kernels to package: none of " + ", ".join(str(c) for c in candidates)
                            + " has a manifest.json (run `mla-gen generate`, or set MLA_GEN_WHEEL_KERNELS)")


def _images(manifest: dict):
    for k in manifest["kernels"]:
        for a in k["archs"]:
            for kind in ("ptx", "cubin"):
                if a.get(kind):
                    yield a[kind]


def image_problems(folder: Path) -> list:
    """The images of folder/manifest.json that are missing or differ from its sha256."""
    bad = []
    for entry in _images(json.loads((folder / "manifest.json").read_text())):
        path = folder / entry["file"]
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
            bad.append(entry["file"])
    return bad


def kernel_files(folder: Path) -> list:
    """manifest.json and every PTX/CUBIN it names, each checked against its sha256."""
    manifest = json.loads((folder / "manifest.json").read_text())
    if manifest.get("schema_version") != 2:
        raise ValueError(f"{folder}/manifest.json has schema_version {manifest.get('schema_version')}, "
                         "this package reads 2")
    bad = image_problems(folder)
    if bad:
        raise ValueError(f"{folder}: {len(bad)} images missing or differing from manifest.json's sha256 "
                         f"(first: {bad[0]}); the images are build outputs: build them with `mla-gen generate "
                         f"--out {folder}` (in the mla-gen repository: scripts/generate.sh)")
    return ["manifest.json"] + [e["file"] for e in _images(manifest)]


_GENERATED = []  # the default spec generated by this build, once


def _generated_default() -> Path:
    """The default spec's kernels and C launcher generated here, refused unless the manifest is
    ../generated/manifest.json byte for byte (then every image is the one it hashes)."""
    if _GENERATED:
        return _GENERATED[0]
    binary = _mla_gen_binary()
    repo = ROOT.parent / "generated"
    if binary is None:
        raise FileNotFoundError(f"{repo} has no images (build outputs) and there is no mla-gen binary to build them: "
                                "run scripts/generate.sh in the repository first, or set MLA_GEN_BIN")
    out = Path(tempfile.mkdtemp(prefix="mla_gen_kernels_")) / "gen"
    _say(f"{repo}'s images are absent or stale: generating the default spec with {binary} (minutes)")
    r = subprocess.run([binary, "generate", "--out", str(out), "--emit", "c", "--quiet"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"`{binary} generate --emit c` failed: {r.stderr.strip()[-2000:]}")
    if (out / "manifest.json").read_bytes() != (repo / "manifest.json").read_bytes():
        raise RuntimeError(f"the default spec generated here differs from {repo}/manifest.json, so its images are not "
                           "the ones the manifest hashes: another NVRTC than the pinned one (scripts/install-nvrtc.sh), "
                           f"a stale mla-gen binary ({binary}: run `cargo build --release`, or set MLA_GEN_BIN), "
                           "or a stale manifest (run scripts/generate.sh and commit it)")
    _GENERATED.append(out)
    return out


def copy_kernels(dest: Path):
    folder = kernels_folder()
    if folder.resolve() == dest.resolve():
        return
    shutil.rmtree(dest, ignore_errors=True)
    for rel in kernel_files(folder):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / rel, dest / rel)


class BuildPy(build_py):
    def run(self):
        super().run()
        copy_kernels(Path(self.build_lib) / PACKAGE / "kernels")


# ---- the compiled op ----

def _say(msg: str):
    print(f"mla_gen build: {msg}", file=sys.stderr, flush=True)


def _torch_root():
    """A torch installed in the environment being built for (its folder), found without importing."""
    seen = []
    for key in ("purelib", "platlib"):
        seen.append(Path(sysconfig.get_paths()[key]))
    seen += [Path(p) for p in sys.path if p]
    for base in seen:
        if (base / "torch" / "include" / "torch" / "csrc" / "stable" / "library.h").is_file():
            return base / "torch"
    return None


def _torch_version(include: Path):
    for text in (include / "torch" / "headeronly" / "version.h", include / "torch" / "csrc" / "api" / "include" / "torch"
                 / "version.h"):
        if text.is_file():
            break
    else:
        return None
    t = text.read_text()
    major = re.search(r"#define TORCH_VERSION_MAJOR (\d+)", t)
    minor = re.search(r"#define TORCH_VERSION_MINOR (\d+)", t)
    return (int(major.group(1)), int(minor.group(1))) if major and minor else None


def _mla_gen_binary():
    """$MLA_GEN_BIN, else the newer of the repository's target/{release,debug}/mla-gen, else
    mla-gen on PATH. A stale binary is caught where it matters: its manifest differs from the
    committed one (_generated_default names the binary among the causes)."""
    env = os.environ.get("MLA_GEN_BIN")
    if env:
        return env
    built = [c for c in (ROOT.parent / "target" / "release" / "mla-gen", ROOT.parent / "target" / "debug" / "mla-gen")
             if c.is_file()]
    return str(max(built, key=lambda c: c.stat().st_mtime)) if built else shutil.which("mla-gen")


def _c_launcher():
    """A folder with mla_kernels.{h,c} for the packaged kernels, or (None, why not)."""
    env = os.environ.get("MLA_GEN_C_LAUNCHER")
    if env:
        return (Path(env), None) if (Path(env) / "mla_kernels.c").is_file() else (None, f"{env} has no mla_kernels.c")
    shipped = ROOT / "mla_gen_c"
    if (shipped / "mla_kernels.c").is_file():
        return shipped, None
    binary = _mla_gen_binary()
    if binary is None:
        return None, "no C launcher: no mla-gen binary (cargo build --release), and MLA_GEN_C_LAUNCHER unset"
    folder = kernels_folder()
    manifest = json.loads((folder / "manifest.json").read_text())
    if manifest["spec"]["source"] != "<embedded default spec>":
        return None, (f"no C launcher: {folder} was generated from {manifest['spec']['source']}; generate it with "
                      "`mla-gen generate SPEC --out DIR --emit c` and set MLA_GEN_C_LAUNCHER=DIR/c")
    try:
        out = _generated_default()
    except (OSError, RuntimeError) as e:
        return None, f"no C launcher: {e}"
    # The launcher holds the sizes and hashes of the images it was generated with and reads the
    # packaged ones: they must be the same (else every load is refused).
    for rel in kernel_files(folder):
        if (out / rel).read_bytes() != (folder / rel).read_bytes():
            return None, (f"the C launcher generated here differs from {folder} ({rel}): another NVRTC than the "
                          "one that generated the kernels (scripts/install-nvrtc.sh installs the pinned one)")
    return out / "c", None


def _binding_modules():
    """mla_gen._binding (the torch layer's table, from binding.json), mla_gen.contract and
    mla_gen._select, read from this source tree as a package of their own (importing mla_gen would
    import torch where it is installed)."""
    import importlib.util
    import types
    pkg = types.ModuleType("mla_gen_build")
    pkg.__path__ = [str(ROOT / PACKAGE)]
    sys.modules["mla_gen_build"] = pkg
    mods = []
    for name in ("_binding", "contract", "_select"):  # in import order: each imports the ones before
        spec = importlib.util.spec_from_file_location(f"mla_gen_build.{name}", ROOT / PACKAGE / f"{name}.py")
        mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mods.append(mod)
    return mods


def _c(text) -> str:
    return json.dumps(str(text))  # a C string literal: the texts are ASCII


def _ops_header(launcher_dir: Path, dest: Path):
    """mla_gen_ops.h: the torch layer's table (mla_gen/binding.json, read by mla_gen/_binding.py:
    the ops, their kinds; the refusals' texts) and,
    per kernel a call can name, how its parameters read the call's tensors (the contract's dims,
    resolved by mla_gen/contract.py), in the C launcher's argument structs (every field 8 bytes:
    a field is its index). python/csrc/mla_gen_ops.cpp declares the types."""
    binding, contract, select = _binding_modules()
    manifest = json.loads((kernels_folder() / "manifest.json").read_text())
    header = (launcher_dir / "mla_kernels.h").read_text()
    families = []  # family names with an argument struct, in the header's order
    fields = {}
    for fam, body in re.findall(r"typedef struct mla_(\w+)_args \{(.*?)\} mla_\1_args;", header, re.S):
        families.append(fam)
        fields[fam] = re.findall(r"(\w+);", re.sub(r"/\*.*?\*/", "", body, flags=re.S))
    out = ["/* Written by python/setup.py from mla_gen/binding.json, mla_gen/_binding.py and the packaged manifest.json. */"]
    out += [f"static const char* const kText_{k} = {_c(v)};" for k, v in binding.TEXTS.items()]
    out.append(f"static const char kKernelsLabel[] = {_c(PACKAGE + chr(39) + 's compiled kernels (' + manifest['spec']['source'] + ')')};")
    out.append("static const char* const kLseLayouts[] = {" + ", ".join(_c(x) for x in binding.LSE_LAYOUTS) + "};")
    out.append("static const NamePair kElems[] = {" + ", ".join(f"{{{_c(k)}, {_c(v)}}}" for k, v in binding.ELEMS.items())
               + "};")

    def slot(fam, name):
        return fields[fam].index(name) if fam in fields and name in fields[fam] else -1

    def strings(values):
        return "{" + ", ".join(_c(v) for v in values) + "}" if values else "{nullptr}"

    for fam in families:  # every field 8 bytes, counted above: the limits below hold them
        out.append(f"static_assert(sizeof(mla_{fam}_args) <= kMaxSlots * 8, \"mla_{fam}_args outgrows kMaxSlots\");")
    out.append("static const Family kFamilies[] = {")
    for fam in families:
        out.append(f"    {{{_c(fam)}, []() {{ static const mla_{fam}_args a = MLA_{fam.upper()}_ARGS_INIT; return (const void*)&a; }}(), "
                   f"sizeof(mla_{fam}_args)}},")
    out.append("};")
    # The kinds: names and free integers as struct fields; the describe rules.
    kinds = []
    for op in binding.OPS.values():
        for k in op.kinds:
            if k not in kinds:
                kinds.append(k)
    plans = {}  # family -> the plans of the kernels selection considers
    reached = select.reached(manifest["kernels"])
    for kk in manifest["kernels"]:
        if kk["name"] not in reached:
            plans.setdefault(kk["family"], []).append(contract.plan_for(kk["name"], kk))

    def free_dims(fam, name):
        """Per dim of tensor `name` (8): the integer it gives in every kernel of the family (its
        field, and the size's addend), where no other size reads that integer: selection then
        reads only that the tensors agree on it (mla_gen/_select.py's fits), so a selection made
        for one value serves every other. -1: the size itself decides."""
        fam_plans = plans.get(fam, [])
        read = set()  # integers a size that is no bare integer reads
        for plan in fam_plans:
            for q in plan.params:
                for _, size, _ in q.dims or ():
                    if not (size.mul == 1 and len(size.factors) == 1):
                        read.update(plan.names[f] for f in size.factors)
        out = []
        for d in range(8):
            seen = set()
            for plan in fam_plans:
                for q in plan.params:
                    if q.name == name and q.dims and len(q.dims) > d:
                        size = q.dims[d][1]
                        bare = size.mul == 1 and len(size.factors) == 1
                        seen.add((plan.names[size.factors[0]], size.add) if bare else None)
            one = next(iter(seen)) if len(seen) == 1 else None
            out.append((slot(fam, one[0]), one[1]) if one and one[0] not in read and slot(fam, one[0]) >= 0
                       else (-1, 0))
        return out

    for i, k in enumerate(kinds):
        fam = k.family
        dims = [free_dims(fam, n) for n in k.names]
        out.append(f"static const FreeDim kFreeDims{i}[][8] = {{"
                   + ", ".join("{" + ", ".join(f"{{{a}, {b}}}" for a, b in row) + "}" for row in dims) + "};")
        rules = []
        for name, r in k.fields:
            kind = ("dtype", "size", "given", "option", "group_size").index(r[0])
            a = (list(r[1:]) + [0, 0, 0])[:3]
            tensor = k.names.index(a[0]) if r[0] != "option" else k.options.index(a[0])
            second = k.names.index(a[1]) if r[0] == "group_size" else (a[1] if r[0] == "size" else 0)
            texts = (a[1], a[2]) if r[0] == "given" else ("", "")
            rules.append(f"{{{_c(name)}, {kind}, {tensor}, {second}, {_c(texts[0])}, {_c(texts[1])}}}")
        checks = []
        for c in k.checks:
            if c[0] == "rank":
                checks.append(f"{{0, {k.names.index(c[1])}, 0, {_c(c[2])}, {c[3]}}}")
            else:
                checks.append(f"{{1, {k.names.index(c[1])}, {k.names.index(c[2])}, {_c(c[3])}, 0}}")
        out.append(f"static const Rule kRules{i}[] = {{{', '.join(rules) or '{}'}}};")
        out.append(f"static const Check kChecks{i}[] = {{{', '.join(checks) or '{}'}}};")
        out.append(f"static const char* const kNames{i}[] = {strings(k.names)};")
        out.append(f"static const int kSlots{i}[] = {{{', '.join(str(slot(fam, n)) for n in k.names)}}};")
        out.append(f"static const char* const kFree{i}[] = {strings(k.free)};")
        out.append(f"static const int kFreeSlots{i}[] = {{{', '.join(str(slot(fam, n)) for n in k.free) or '-1'}}};")
        out.append(f"static const char* const kOptions{i}[] = {strings(k.options)};")
    out.append("static const KindRow kKinds[] = {")
    for i, k in enumerate(kinds):
        typed = [k.names.index(t) for t in k.typed] or [-1]  # none: selection reads no element type
        out.append(f"    {{{_c(k.family)}, {families.index(k.family) if k.family in families else -1}, kNames{i}, kSlots{i}, "
                   f"{len(k.names)}, kFree{i}, kFreeSlots{i}, {len(k.free)}, kOptions{i}, {len(k.options)}, "
                   f"{typed[0]}, {_c(k.what)}, kRules{i}, {len(k.fields)}, kChecks{i}, {len(k.checks)}, kFreeDims{i}}},")
    out.append("};")
    # The ops: each schema argument's role (0 tensor, 1 free integer, 2 option) and index in its kind.
    out.append("static const OpRow kOps[] = {")
    for name, op in binding.OPS.items():
        base = op.kinds[-1]  # the kind with every tensor (the start locations too)
        first = op.kinds[0]
        assert base.names[:len(first.names)] == first.names and base.free == first.free, name
        # each schema argument's type: optional ("?"), a string
        types = [t for t, _ in binding.schema_args(name)]
        assert len(types) == len(op.args), name
        args = []
        for (role, what), t in zip(op.args, types):
            index = (base.names if role == "tensor" else base.free if role == "free" else base.options).index(what)
            args.append(f"{{{('tensor', 'free', 'option').index(role)}, {index}, {int(t.endswith('?'))}, "
                        f"{int(t == 'str')}}}")
        fixed = [(base.options.index(k), v) for k, v in op.options.items()]
        alloc = [base.names.index(n) for n in op.allocated]
        out.append(f"    {{{_c(name)}, {len(op.args)}, {{{', '.join(args)}}}, {{{kinds.index(op.kinds[0])}, "
                   f"{kinds.index(op.kinds[-1])}}}, {{{', '.join(f'{{{i}, {_c(v)}}}' for i, v in fixed) or '{-1, nullptr}'}}}, "
                   f"{len(fixed)}, {{{', '.join(map(str, alloc)) or '-1'}}}, {len(alloc)}}},")
    out.append("};")
    # Per op, its tensors it names otherwise than the kernels' parameters (_binding.CALLER_NAMES,
    # from the op's argument names): a refusal names the op's arguments (op_core.h, as_called).
    renames = [binding.op_renames(name) for name in binding.OPS]
    for i, pairs in enumerate(renames):
        items = ", ".join(f"{{{_c(a)}, {_c(b)}}}" for a, b in pairs.items())
        out.append(f"static const NamePair kRenames{i}[] = {{{items or '{}'}}};")
    out.append("static const Renames kOpRenames[] = {" + ", ".join(f"{{kRenames{i}, {len(p)}}}" for i, p in enumerate(renames))
               + "};")
    # The kernels a call can name (not a size rule's range or a specialization: the launcher
    # reaches those itself), each parameter as the contract reads it.
    rows = []
    arrays = {}  # an array's rows -> its name: kernels of one family mostly read their tensors alike

    def array(kind, rows_text):
        name = arrays.get((kind, rows_text))
        if name is None:
            name = arrays[(kind, rows_text)] = f"k{kind}{len(arrays)}"
            out.append(f"static const {kind} {name}[] = {{{rows_text}}};")
        return name

    for k in manifest["kernels"]:
        fam = k["family"]
        if k["name"] in reached or fam not in families:
            continue
        plan = contract.plan_for(k["name"], k)

        def expr(e):
            f = [slot(fam, plan.names[j]) for j in e.factors]
            return f"{{{e.mul}, {len(f)}, {{{', '.join(map(str, (f + [0, 0, 0, 0])[:4]))}}}, {e.add}}}"

        params = []
        for q in plan.params:
            dims = q.dims or ()
            drows = []
            for label, size, stride in dims:
                bind = size.factors[0] if size.mul == 1 and len(size.factors) == 1 else None
                sp = stride.param()
                drows.append(f"{{{_c(label)}, {expr(size)}, {expr(stride)}, "
                             f"{-1 if bind is None else slot(fam, plan.names[bind])}, "
                             f"{-1 if sp is None else slot(fam, plan.names[sp])}}}")
            params.append(f"{{{_c(q.name)}, {slot(fam, q.name)}, {int(q.pointer)}, {_c(q.elem or '')}, "
                          f"{len(dims)}, {array('Dim', ', '.join(drows)) if dims else 'nullptr'}}}")
        group = (k.get("variant", {}).get("fp8_group") or {}).get("group_size") or 0
        rows.append(f"    {{{_c(k['name'])}, {families.index(fam)}, {array('Param', ', '.join(params))}, "
                    f"{len(params)}, {group}}},")
    out.append("static const KernelRow kKernels[] = {")
    out += rows or ['    {"", -1, nullptr, 0, 0},']  # no kernel: every call is refused
    out.append("};")
    (dest / "mla_gen_ops.h").write_text("\n".join(out) + "\n")
    # The arrays' sizes, from the table: a kind with one more tensor, or an op with one more
    # argument, needs no edit of python/csrc.
    limits = {"kMaxTensors": [len(k.names) for k in kinds], "kMaxFree": [len(k.free) for k in kinds],
              "kMaxOptions": [len(k.options) for k in kinds], "kMaxOpArgs": [len(o.args) for o in binding.OPS.values()],
              "kMaxSlots": [len(f) for f in fields.values()]}
    (dest / "mla_gen_ops_limits.h").write_text(
        "/* Written by python/setup.py from mla_gen/binding.json and the C launcher's argument structs. */\n"
        + "".join(f"constexpr int {name} = {max(sizes, default=1) or 1};\n" for name, sizes in limits.items()))


def extension_plan():
    """([Extension, ...], None) where the compiled op can be built (the stable one, then the
    native ones), else (None, why not)."""
    if not sys.platform.startswith("linux"):
        return None, f"the compiled op is built on Linux only (this is {sys.platform})"
    root = _torch_root()
    include = Path(os.environ["MLA_GEN_TORCH_INCLUDE"]) if os.environ.get("MLA_GEN_TORCH_INCLUDE") else (
        root / "include" if root else None)
    if include is None or not (include / "torch" / "csrc" / "stable" / "library.h").is_file():
        return None, "no torch headers with the stable ABI (torch >= 2.10 installed, or MLA_GEN_TORCH_INCLUDE)"
    tv = _torch_version(include)
    if tv is None or tv < TORCH_TARGET:
        return None, f"torch headers in {include} are {tv}, the stable ABI needs >= 2.10"
    lib = Path(os.environ["MLA_GEN_TORCH_LIB"]) if os.environ.get("MLA_GEN_TORCH_LIB") else (root / "lib" if root else None)
    if lib is None or not (lib / "libtorch_cpu.so").is_file() or not (lib / "libtorch_cuda.so").is_file():
        return None, f"no libtorch_cpu.so and libtorch_cuda.so in {lib} (a CUDA build of torch, or MLA_GEN_TORCH_LIB)"
    work = Path(tempfile.mkdtemp(prefix="mla_gen_build_"))
    launcher, why = _c_launcher()
    if launcher is None:
        return None, why
    _ops_header(launcher, work)
    ext = _op_extension("_C", "mla_gen_ops.cpp", launcher, work, include, lib,
                        # TORCH_TARGET_VERSION: the binary calls nothing a torch after 2.10 added
                        [("TORCH_TARGET_VERSION", "0x020a000000000000")], ["torch_cpu", "torch_cuda"])
    _say(f"building the compiled op against torch {tv[0]}.{tv[1]} headers ({include}), targeting 2.10; "
         f"C launcher from {launcher}")
    return [ext] + _native_extensions(root, launcher, work), None


def _op_extension(name, source, launcher, work, include, lib, macros, libraries, extra_includes=()):
    csrc = ROOT / "csrc"
    sources = [csrc / source, csrc / "driver" / "driver.c", launcher / "mla_kernels.c"]
    return Extension(
        f"{PACKAGE}.{name}",
        sources=[os.path.relpath(s, ROOT) if str(s).startswith(str(ROOT)) else str(s) for s in sources],
        # driver/ first: its cuda.h stands in for the toolkit's
        include_dirs=[str(csrc / "driver"), str(launcher), str(work), str(include)] + [str(i) for i in extra_includes],
        library_dirs=[str(lib)],
        libraries=libraries + ["dl"],  # libdl: where glibc < 2.34 has dlopen
        # MLA_IMAGES_FROM_FILES: the launcher embeds no image; it reads the package's kernels/ (each
        # image once in the wheel), checking each file's size and sha256 before the driver sees it.
        define_macros=macros + [("Py_LIMITED_API", "0x03090000"), ("MLA_IMAGES_FROM_FILES", "1")],
        # -g0: no debug info (a native build's is 1.3 MB of the wheel, packed)
        extra_compile_args=["-O2", "-g0", "-fvisibility=hidden", "-fno-strict-aliasing"],
        extra_link_args=["-Wl,--no-as-needed", "-Wl,-z,defs", "-Wl,--allow-shlib-undefined"],
        py_limited_api=True,  # no Python in it: the abi3 name keeps one wheel for every Python
    )


NATIVE_LIBS = ("libc10.so", "libtorch_cpu.so", "libtorch.so", "libtorch_cuda.so")  # what a native build links


def _native_extensions(root, launcher, work) -> list:
    """The native builds ($MLA_GEN_TORCH_NATIVE, see the module's doc): one TORCH_LIBRARY op per
    torch folder, named by its release."""
    value = os.environ.get("MLA_GEN_TORCH_NATIVE", "auto").strip() or "0"
    if value == "0":
        return []
    folders = ([root] if root else []) if value == "auto" else [Path(f) for f in value.split(":") if f]
    exts, seen = [], set()
    for folder in folders:
        include, lib = folder / "include", folder / "lib"
        tv = _torch_version(include)
        missing = [f for f in NATIVE_LIBS if not (lib / f).is_file()]
        problem = (f"{include} has no torch/library.h" if not (include / "torch" / "library.h").is_file()
                   else f"{lib} lacks {', '.join(missing)} (a CUDA build of torch's libraries)" if missing
                   else f"{include}: no torch version" if tv is None else None)
        if problem:
            if value == "auto":
                _say(f"no native op for the environment's torch: {problem}")
                continue
            raise SystemExit(f"mla_gen build: MLA_GEN_TORCH_NATIVE: {problem}")
        if tv in seen:
            continue
        seen.add(tv)
        # the std::string ABI the libraries were built with (PyPI's: the C++11 one since torch 2.7)
        abi = "1" if b"__cxx11" in (lib / "libc10.so").read_bytes() else "0"
        exts.append(_op_extension(f"_C_torch{tv[0]}_{tv[1]}", "mla_gen_ops_native.cpp", launcher, work, include, lib,
                                  [("_GLIBCXX_USE_CXX11_ABI", abi)], [n[3:-3] for n in NATIVE_LIBS],
                                  [include / "torch" / "csrc" / "api" / "include"]))
        _say(f"building the native op for torch {tv[0]}.{tv[1]} ({folder})")
    return exts


class BuildExt(build_ext):
    def build_extension(self, ext):
        # C++17 for the .cpp only (gcc refuses -std=c++17 for C files); C++20 for the native
        # builds (torch 2.15's own headers need it; 2.10's and 2.11's compile under it too)
        original = self.compiler._compile

        def compile_one(obj, src, ext_, cc_args, extra_postargs, pp_opts):
            std = "-std=c++20" if src.endswith("_native.cpp") else "-std=c++17" if src.endswith(".cpp") else "-std=gnu11"
            extra = list(extra_postargs) + [std]
            return original(obj, src, ext_, cc_args, extra, pp_opts)

        self.compiler._compile = compile_one
        # each extension its own objects: the native builds compile the same sources, each against
        # its torch (one object path would let one link another's)
        temp = self.build_temp
        self.build_temp = os.path.join(temp, ext.name.split(".")[-1])
        try:
            super().build_extension(ext)
        finally:
            self.compiler._compile = original
            self.build_temp = temp

    def get_export_symbols(self, ext):
        if ext.name.split(".")[-1].startswith("_C"):
            return []  # a torch library, not a Python module: no PyInit_ to export
        return super().get_export_symbols(ext)


class Sdist(sdist):
    """The source archive carries the kernels (mla_gen/kernels/) and, where it could be made, the
    C launcher (mla_gen_c/), so that it builds the same wheel without the repository."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        copy_kernels(Path(base_dir) / PACKAGE / "kernels")
        launcher, why = _c_launcher() if MODE != "0" else (None, "MLA_GEN_EXTENSION=0")
        if launcher is not None:
            dest = Path(base_dir) / "mla_gen_c"
            dest.mkdir(exist_ok=True)
            for f in ("mla_kernels.h", "mla_kernels.c"):
                shutil.copyfile(launcher / f, dest / f)
        else:
            _say(f"the sdist has no C launcher: {why}")


MODE = os.environ.get("MLA_GEN_EXTENSION", "auto").strip().lower() or "auto"
if MODE not in ("auto", "0", "1"):
    raise SystemExit(f"MLA_GEN_EXTENSION={MODE!r}: use auto, 1 or 0")

ext_modules = []
options = {}
# Only when building: metadata queries (egg_info, dist_info, sdist) need no compiler or torch.
if MODE != "0" and any(c in sys.argv for c in ("bdist_wheel", "build", "build_ext", "install", "editable_wheel")):
    exts, why = extension_plan()
    if exts is not None:
        # Beside the op, the launch of the plain function's planned calls in one C call (Python's
        # limited API only: no torch, no driver library; mla_gen._cuda.use_c_launch).
        launch = Extension(f"{PACKAGE}._launch", sources=[os.path.relpath(ROOT / "csrc" / "launch.c", ROOT)],
                           extra_compile_args=["-O2", "-Wall"], py_limited_api=True)
        ext_modules = exts + [launch]
        options["bdist_wheel"] = {"py_limited_api": "cp39"}
    elif MODE == "1":
        raise SystemExit(f"mla_gen build: MLA_GEN_EXTENSION=1 but the compiled op cannot be built: {why}")
    else:
        _say(f"pure-Python wheel (the ops registered in Python): {why}")

setup(
    version=version(),
    ext_modules=ext_modules,
    cmdclass={"build_py": BuildPy, "build_ext": BuildExt, "sdist": Sdist},
    options=options,
)

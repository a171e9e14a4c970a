"""PEP 517 build backend of the mla-gen Python package: pure Python, standard library only, so
installing needs no compiler, no CUDA toolkit, no Rust and no network (``requires = []``).

The wheel holds the ``mla_gen`` package and, as package data under ``mla_gen/kernels/``, a kernel
folder: ``manifest.json`` and every PTX and CUBIN it lists (sha256-checked here). The folder is

1. ``$MLA_GEN_WHEEL_KERNELS`` (scripts/build-wheel.sh SPEC sets it to a fresh generation), else
2. ``mla_gen/kernels/`` in the source tree (an sdist carries its kernels there), else
3. ``../generated/`` (the repository's default-spec kernels; nothing is copied into the tree).

``$MLA_GEN_WHEEL_LOCAL`` adds a local version label (``0.1.0+LABEL``).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import stat
import tarfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # python/
PACKAGE = "mla_gen"
DIST = "mla_gen"  # normalized distribution name (project name "mla-gen")
_EPOCH = (1980, 1, 1, 0, 0, 0)


def _version() -> str:
    text = (ROOT / PACKAGE / "_version.py").read_text()
    version = re.search(r'__version__\s*=\s*"([^"]+)"', text).group(1)
    local = os.environ.get("MLA_GEN_WHEEL_LOCAL", "").strip()
    if local:
        if not re.fullmatch(r"[A-Za-z0-9]+(\.[A-Za-z0-9]+)*", local):
            raise ValueError(f"MLA_GEN_WHEEL_LOCAL={local!r} is not a local version label")
        version += "+" + local
    return version


def _project() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11: the few keys this file uses
        tomllib = None
    text = (ROOT / "pyproject.toml").read_text()
    if tomllib is not None:
        return tomllib.loads(text)["project"]
    project = {}
    for key in ("name", "description", "requires-python", "readme"):
        m = re.search(rf'^{key}\s*=\s*"([^"]*)"', text, re.M)
        if m:
            project[key] = m.group(1)
    deps = re.search(r"^dependencies\s*=\s*\[([^\]]*)\]", text, re.M)
    project["dependencies"] = re.findall(r'"([^"]+)"', deps.group(1)) if deps else []
    return project


def kernels_folder() -> Path:
    env = os.environ.get("MLA_GEN_WHEEL_KERNELS")
    candidates = [Path(env)] if env else [ROOT / PACKAGE / "kernels", ROOT.parent / "generated"]
    for c in candidates:
        if (c / "manifest.json").is_file():
            return c
    raise FileNotFoundError("no kernels to package: none of " + ", ".join(str(c) for c in candidates)
                            + " has a manifest.json (run `mla-gen generate`, or set MLA_GEN_WHEEL_KERNELS)")


def kernel_files(folder: Path) -> list:
    """manifest.json and every PTX/CUBIN it names, each checked against its sha256."""
    manifest = json.loads((folder / "manifest.json").read_text())
    if manifest.get("schema_version") != 2:
        raise ValueError(f"{folder}/manifest.json has schema_version {manifest.get('schema_version')}, "
                         "this package reads 2")
    files = ["manifest.json"]
    for k in manifest["kernels"]:
        for a in k["archs"]:
            for kind in ("ptx", "cubin"):
                entry = a.get(kind)
                if not entry:
                    continue
                data = (folder / entry["file"]).read_bytes()
                if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                    raise ValueError(f"{folder / entry['file']}: sha256 differs from manifest.json (regenerate)")
                files.append(entry["file"])
    return files


def _package_files() -> list:
    """(archive name, bytes) of the package's Python files and its kernels."""
    out = []
    for path in sorted((ROOT / PACKAGE).rglob("*")):
        rel = path.relative_to(ROOT).as_posix()
        if path.is_file() and "__pycache__" not in rel and not rel.startswith(f"{PACKAGE}/kernels/") \
                and path.suffix in (".py", ".typed"):
            out.append((rel, path.read_bytes()))
    folder = kernels_folder()
    for rel in kernel_files(folder):
        out.append((f"{PACKAGE}/kernels/{rel}", (folder / rel).read_bytes()))
    return out


def _metadata(version: str) -> str:
    p = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {p.get('name', 'mla-gen')}", f"Version: {version}"]
    if p.get("description"):
        lines.append(f"Summary: {p['description']}")
    if p.get("requires-python"):
        lines.append(f"Requires-Python: {p['requires-python']}")
    lic = p.get("license")
    if isinstance(lic, dict) and lic.get("text"):
        lines.append(f"License: {lic['text']}")
    elif isinstance(lic, str):
        lines.append(f"License: {lic}")
    for dep in p.get("dependencies", []):
        lines.append(f"Requires-Dist: {dep}")
    body = ""
    readme = ROOT / "README.md"
    if readme.is_file():
        lines.append("Description-Content-Type: text/markdown")
        body = "\n" + readme.read_text()
    return "\n".join(lines) + "\n" + body


def _dist_info(version: str) -> list:
    di = f"{DIST}-{version}.dist-info"
    wheel = "Wheel-Version: 1.0\nGenerator: mla_gen_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    return [(f"{di}/METADATA", _metadata(version).encode()), (f"{di}/WHEEL", wheel.encode()),
            (f"{di}/top_level.txt", f"{PACKAGE}\n".encode())]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(directory: str, files: list, version: str) -> str:
    name = f"{DIST}-{version}-py3-none-any.whl"
    di = f"{DIST}-{version}.dist-info"
    files = files + _dist_info(version)
    record = "\n".join([_record_line(n, d) for n, d in files] + [f"{di}/RECORD,,"]) + "\n"
    files.append((f"{di}/RECORD", record.encode()))
    path = Path(directory) / name
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in files:  # fixed timestamps and modes: the same inputs give the same wheel
            info = zipfile.ZipInfo(n, _EPOCH)
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, d)
    return name


# ---- PEP 517 / 660 hooks ----

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    version = _version()
    di = Path(metadata_directory) / f"{DIST}-{version}.dist-info"
    di.mkdir(parents=True, exist_ok=True)
    for name, data in _dist_info(version):
        (Path(metadata_directory) / name).write_bytes(data)
    return di.name


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _package_files(), _version())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """An editable install: a .pth naming python/, so the package runs from the tree; its kernels
    are then the tree's (``mla_gen/kernels`` if present, else the repository's generated/)."""
    pth = (str(ROOT) + "\n").encode()
    return _write_wheel(wheel_directory, [(f"__editable__.{DIST}.pth", pth)], _version())


def build_sdist(sdist_directory, config_settings=None):
    """A source archive that builds the same wheel anywhere: the kernels go in as
    mla_gen/kernels/, where build_wheel finds them."""
    version = _version()
    base = f"{DIST}-{version}"
    name = f"{base}.tar.gz"
    entries = [("pyproject.toml", (ROOT / "pyproject.toml").read_bytes()),
               ("_build/mla_gen_build.py", Path(__file__).read_bytes()),
               ("PKG-INFO", _metadata(version).encode())]
    if (ROOT / "README.md").is_file():
        entries.append(("README.md", (ROOT / "README.md").read_bytes()))
    entries += _package_files()
    with tarfile.open(Path(sdist_directory) / name, "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for n, d in entries:
            info = tarfile.TarInfo(f"{base}/{n}")
            info.size = len(d)
            info.mtime = int(time.mktime((1980, 1, 1, 0, 0, 0, 0, 0, -1)))
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(d))
    return name

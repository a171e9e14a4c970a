"""Helpers of the fault suites (test_faults_cpu.py, test_faults_gpu.py): kernel folders made from a
manifest's entries, with synthetic or real images, and the stand-in driver (ext/stub_driver.c)."""

from __future__ import annotations

import copy
import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
KERNEL = "merge_attn_states_bf16_d128_thr_lse"


def reached(manifest: dict, names) -> list:
    """`names` and every kernel a launch of them may run (specializations, size-rule ranges)."""
    by_name = {k["name"]: k for k in manifest["kernels"]}
    out, todo = [], list(names)
    while todo:
        name = todo.pop(0)
        if name in out:
            continue
        out.append(name)
        launch = by_name[name]["launch"]
        todo += list(launch.get("specializations", ()))
        todo += [r["kernel"] for r in (launch.get("size_rule") or {}).get("ranges", ())]
    return out


def make_folder(path: Path, names=(KERNEL,), source: Path | None = None, kind: str = "cubin") -> dict:
    """A kernel folder at `path` holding `names` (and what they reach) of `source`'s manifest
    (default: the repository's generated/manifest.json). Without `source`: one synthetic sm_90
    image per kernel (`kind` "cubin" or "ptx"; the stand-in driver reads none of it), its size
    and sha256 in the manifest. With `source` (a folder with images): its images, copied. Returns
    {kernel name: its synthetic image} (empty with `source`: manifest.pick_image says which loads)."""
    src = json.loads(((source or ROOT / "generated") / "manifest.json").read_text())
    kernels = [copy.deepcopy(k) for k in src["kernels"] if k["name"] in reached(src, names)]
    images = {}
    (path / "kernels").mkdir(parents=True, exist_ok=True)
    for k in kernels:
        if source is None:
            rel = f"kernels/{k['name']}.sm_90.{kind}"
            # An ELF header, or text without a NUL: the kind the manifest says (KernelFolder.image).
            data = (b"\x7fELF" + bytes(range(256)) if kind == "cubin" else b"//\n.version 9.0\n" + bytes(range(1, 256)))
            data += k["name"].encode()
            (path / rel).write_bytes(data)
            k["archs"] = [{"arch": "sm_90", kind: {"file": rel, "bytes": len(data),
                                                   "sha256": hashlib.sha256(data).hexdigest()}}]
            images[k["name"]] = path / rel
        else:
            for a in k["archs"]:
                for which in ("cubin", "ptx"):
                    if a.get(which):
                        shutil.copyfile(source / a[which]["file"], path / a[which]["file"])
    manifest = dict(src, kernels=kernels)
    (path / "manifest.json").write_text(json.dumps(manifest))
    return images


def edit_manifest(folder: Path, edit) -> bytes:
    """Rewrite folder/manifest.json through `edit(dict)`; returns the previous bytes."""
    before = (folder / "manifest.json").read_bytes()
    m = json.loads(before)
    edit(m)
    (folder / "manifest.json").write_text(json.dumps(m))
    return before


def build_stub(out_dir: Path) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler for the stand-in driver (ext/stub_driver.c)")
    out = out_dir / "libcuda_stub.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", str(HERE / "ext" / "stub_driver.c"), "-o", str(out)], check=True)
    return out


class Stub:
    """The stand-in driver's counters and fault switches (its exported globals)."""

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        for name in ("stub_loads", "stub_launches", "stub_load_error", "stub_launch_error"):
            ctypes.c_int.in_dll(self.lib, name).value = 0

    def __getattr__(self, name):
        return ctypes.c_int.in_dll(self.__dict__["lib"], f"stub_{name}").value

    def set(self, name, value):
        ctypes.c_int.in_dll(self.lib, f"stub_{name}").value = value

    def kernel(self) -> str:
        return ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(self.lib, "stub_kernel"))).decode()


def run_child(code: str, env_extra: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    """`code` in a fresh Python that imports the mla_gen these tests import."""
    import mla_gen
    env = dict(os.environ)
    env.pop("MLA_GEN_KERNELS", None)
    env.update(env_extra)
    pkg_parent = str(Path(mla_gen.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent, str(HERE), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=pkg_parent,
                          timeout=timeout)

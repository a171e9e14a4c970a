"""A kernel folder's dense specializations alone, as a folder of their own: SRC's manifest with
only each kernel's first dense specialization (the first its `specializations` names:
`_dense_nothr_flat`, `_dense_nothr`, `_dense_flat` or `_dense`; their files copied), so that a host picking kernels by their options
launches them directly. For timing schedule candidates before a host selects specializations
itself; the kernels and their contracts are unchanged.

Usage: python3 bench/gpu/dense_only.py SRC DST
"""

import json
import shutil
import sys
from pathlib import Path


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    manifest = json.loads((src / "manifest.json").read_text())
    # A kernel's first specialization only: two
    # specializations of the same options would leave a host two kernels to choose from.
    first = {k["launch"]["specializations"][0] for k in manifest["kernels"] if k["launch"].get("specializations")}
    manifest["kernels"] = [k for k in manifest["kernels"] if k["variant"].get("dense") and k["name"] in first]
    if not manifest["kernels"]:
        sys.exit(f"{src}: no dense specializations")
    (dst / "kernels").mkdir(parents=True, exist_ok=True)
    for k in manifest["kernels"]:
        for a in k["archs"]:
            for f in ("ptx", "cubin"):
                if a.get(f):
                    shutil.copy2(src / a[f]["file"], dst / a[f]["file"])
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{dst}: {len(manifest['kernels'])} dense kernels")


if __name__ == "__main__":
    main()

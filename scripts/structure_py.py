#!/usr/bin/env python3
"""The module structure of the Python package (python/mla_gen), as scripts/structure.py checks
src/: which module imports which (every import, also one inside a function: it is a dependency
all the same), circles, and arrows running back up the layers below. Importing the package root
(`import mla_gen`, `from mla_gen import x`, `from . import x` where x is no module) from inside the
package is a climb too: the root imports every module.

Exits 1 if there is any circle, upward arrow or module in no layer. Standard library only:
python3 scripts/structure_py.py [--graph]
"""

import ast
import sys
from pathlib import Path

from structure import circles, one_loop

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "mla_gen"

# Bottom first; a module may import modules of its own layer or of lower ones. `_launch` is the
# optional compiled C module (no .py).
LAYERS = [
    ("ground", ["_version", "errors", "_ext", "_launch"]),
    ("contract", ["contract", "_binding"]),
    ("select", ["_select"]),
    ("manifest", ["manifest"]),
    ("driver", ["_cuda"]),
    ("fast path", ["_fastpath"]),
    ("plan", ["_plan"]),
    ("torch layer", ["_torch"]),
    ("APIs", ["ops", "flashinfer", "sglang", "vllm"]),
    ("root", ["__init__"]),
]


def layer_of(module):
    return next((i for i, (_, names) in enumerate(LAYERS) if module in names), None)


def imports(path, modules):
    """The package modules `path` imports, and whether it imports the package root."""
    found, root = set(), False
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "mla_gen":
                    if len(parts) > 1 and parts[1] in modules:
                        found.add(parts[1])
                    else:
                        root = True
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1 or (node.level == 0 and (node.module or "").split(".")[0] == "mla_gen"):
                sub = (node.module or "").split(".")
                sub = sub[1:] if node.level == 0 else sub
                if sub and sub[0]:
                    found.add(sub[0]) if sub[0] in modules else None
                else:  # from . import x (a module, or a name of the root)
                    for a in node.names:
                        if a.name in modules:
                            found.add(a.name)
                        else:
                            root = True
    return found, root


def main():
    modules = {p.stem for p in PACKAGE.glob("*.py")} | {"_launch"}
    edges, climbs = {}, []
    for p in sorted(PACKAGE.glob("*.py")):
        found, root = imports(p, modules)
        edges[p.stem] = found - {p.stem}
        if root and p.stem != "__init__":
            climbs.append(f"  {p.stem} imports the package root")
    arrows = sum(len(v) for v in edges.values())
    print(f"structure of python/mla_gen: {len(edges)} modules, {arrows} arrows")
    if "--graph" in sys.argv:
        for a in sorted(edges):
            print(f"  {a} -> {', '.join(sorted(edges[a]))}")
    found = circles(set(edges), edges)
    print(f"circles: {len(found)}")
    for comp in found:
        print(f"  {' -> '.join(one_loop(comp, edges))}   ({len(comp)} modules)")
    unplaced = sorted(m for m in modules if layer_of(m) is None)
    for a, bs in sorted(edges.items()):
        for b in sorted(bs):
            la, lb = layer_of(a), layer_of(b)
            if la is not None and lb is not None and lb > la:
                climbs.append(f"  {a} ({LAYERS[la][0]}) -> {b} ({LAYERS[lb][0]})")
    print(f"arrows running back up: {len(climbs)}")
    print("\n".join(climbs)) if climbs else None
    if unplaced:
        print(f"modules in no layer of LAYERS (add them): {', '.join(unplaced)}")
    print("layers, bottom first: " + " < ".join(n for n, _ in LAYERS))
    return 1 if found or climbs or unplaced else 0


if __name__ == "__main__":
    sys.exit(main())

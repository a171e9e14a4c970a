#!/usr/bin/env python3
"""The module structure of the whole house: which module imports which, circles, and arrows
running back up a list of layers, for each place code lives. Exits 1 on any finding below.

src/ (Rust): every file of the library (src/lib.rs) and of the binary (src/cli/main.rs), read
through their `mod` declarations; each path starting with `crate::`, `super::`, `self::`, a child
module's name or (in the binary) `mla_gen::` is resolved to the module (file) it names. Test
modules (`mod tests`) are left out: they are not part of the structure. A private child module
(`mod x;`, not `pub`) of a module other than a crate root counts as part of its parent: nothing
outside the parent can reach it, so arrows between the two are the parent's business. Findings:
circles of the file graph and of the folder graph (a folder: everything under one top-level name
of src/, e.g. gen/ or variant.rs with variant/), arrows to a higher layer of RUST_LAYERS, files in
no layer.

python/mla_gen (the package): every import, also one inside a function (a dependency all the
same). Findings: circles, arrows to a higher layer of PY_LAYERS, modules in no layer, and a module
importing the package root (`import mla_gen`, `from mla_gen import x`, `from . import x` where x
is no module): the root imports every module, so that is a climb too.

bench/ (the lab's Python: bench/*.py and bench/gpu/*.py, scripts that import each other by file
name through sys.path): findings are circles, and any arrow from the product to the lab (a package
module importing a lab module, or src/ including a file under bench/): the library and the wheels
carry none of it. Which private modules of the package the lab imports is printed, not refused
(a harness may time an inner layer on purpose).

Standard library only: python3 scripts/structure.py [--graph]  (--graph also prints every arrow).
"""

import ast
import re
import sys
from pathlib import Path

# Bottom first. A module may import modules of its own layer or of lower ones; the entries are
# module paths (`a::b` covers `a::b::c` too; the longest entry that matches a module wins; ""
# is the crate root, lib.rs). Generation's data flows spec -> variants -> abi -> render ->
# compile -> emit; the imports run the other way round for the types: spec builds variants and
# checks their launch geometry, so variant and launch sit under spec.
RUST_LAYERS = [
    ("ground", ["dtype", "constants", "error", "contract", "variant", "reference"]),
    ("gen:base", ["gen"]),  # gen/mod.rs: sha256_hex
    ("gen:variant", ["gen::variant"]),
    ("gen:launch", ["gen::launch"]),
    ("gen:spec", ["gen::spec"]),
    ("gen:abi", ["gen::abi"]),
    ("gen:render", ["gen::render"]),
    ("gen:nvrtc", ["gen::nvrtc"]),
    ("gen:compile", ["gen::compile"]),
    ("gen:emit", ["gen::emit"]),
    ("host:base", ["host"]),  # host/mod.rs: declarations
    ("host:driver", ["host::driver"]),
    ("host:check", ["host::check"]),
    ("host:manifest", ["host::manifest"]),
    ("host:select", ["host::select"]),
    ("host:args", ["host::args"]),
    ("host:kernel", ["host::kernel"]),
    ("host:load", ["host::load"]),
    ("host:typed", ["host::typed"]),
    ("host:runtime", ["host::runtime"]),
    ("writers", ["writers"]),
    ("builder", ["generate", "builder"]),
    ("bench", ["host::bench"]),  # the CLI's GPU timing (feature cli)
    ("lib", [""]),  # lib.rs: declarations and re-exports only
    ("cli", ["cli"]),
]

# The package, bottom first; a module may import modules of its own layer or of lower ones.
# `_launch` is the optional compiled C module (no .py).
PY_LAYERS = [
    ("ground", ["_version", "errors", "_ext", "_launch"]),
    ("contract", ["contract", "_binding"]),
    ("select", ["_select"]),
    ("manifest", ["manifest"]),
    ("driver", ["_cuda"]),
    ("fast path", ["_fastpath"]),
    ("plan", ["_plan"]),
    ("torch layer", ["_torch"]),
    ("APIs", ["functions", "flashinfer", "sglang", "vllm"]),
    ("ops", ["ops"]),
    ("root", ["__init__"]),
]

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PACKAGE = ROOT / "python" / "mla_gen"
LAB = ROOT / "bench"
CRATES = {"lib": "lib.rs", "cli": "cli/main.rs"}  # the binary's modules are cli::...

TOKENS = re.compile(
    r'r(#*)".*?"\1|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\\n])\'|//[^\n]*|/\*.*?\*/',
    re.S,
)


def strip(text):
    """Comments, strings and char literals blanked (newlines kept)."""
    return TOKENS.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def matching_brace(text, i):
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text)


def split_top(s):
    parts, depth, cur = [], 0, ""
    for c in s:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def use_paths(tree, prefix=()):
    """`a::{b, c::{d as e}}` -> [(path segments, bound name)]."""
    tree = tree.strip()
    m = re.match(r"^((?:\w+\s*::\s*)*)\{(.*)\}$", tree, re.S)
    if m:
        head = tuple(s.strip() for s in m.group(1).split("::") if s.strip())
        out = []
        for part in split_top(m.group(2)):
            out += use_paths(part, prefix + head)
        return out
    rename = None
    if " as " in tree:
        tree, rename = (s.strip() for s in tree.rsplit(" as ", 1))
    segs = prefix + tuple(s.strip() for s in tree.split("::") if s.strip())
    if segs and segs[-1] == "self":
        segs = segs[:-1]
    if not segs or segs[-1] == "*":
        return [(segs[:-1], None)] if segs else []
    return [(segs, rename or segs[-1])]


class File:
    def __init__(self, crate, module, path):
        self.crate, self.module, self.path = crate, module, path
        self.rel = path.relative_to(SRC).as_posix()
        self.text = strip(path.read_text())
        # Inline modules: (start, end, name), for `super` inside them and to skip tests.
        self.inline = []
        for m in re.finditer(r"\bmod\s+(\w+)\s*\{", self.text):
            self.inline.append((m.start(), matching_brace(self.text, m.end() - 1), m.group(1)))
        self.children, self.private = set(), set()
        for m in re.finditer(r"(\bpub(?:\([^)]*\))?\s+)?\bmod\s+(\w+)\s*;", self.text):
            if m.group(2) != "tests":
                self.children.add(m.group(2))
                if not m.group(1):
                    self.private.add(m.group(2))
        self.owner = self  # the file whose node this one is part of

    def scope(self, pos):
        """The module (segments) at `pos`, or None inside a test module."""
        names = [n for (s, e, n) in self.inline if s < pos < e]
        if "tests" in names:
            return None
        return self.module + tuple(names)


def child_file(f, name):
    base = f.path.parent if f.path.name in ("lib.rs", "main.rs", "mod.rs") else f.path.with_suffix("")
    for p in (base / f"{name}.rs", base / name / "mod.rs"):
        if p.exists():
            return p
    return None


def load():
    files, modules = [], {}
    for crate, root in CRATES.items():
        stack = [File(crate, (), SRC / root)]
        while stack:
            f = stack.pop()
            files.append(f)
            modules[(crate, f.module)] = f
            for name in sorted(f.children):
                p = child_file(f, name)
                if p is not None:
                    child = File(crate, f.module + (name,), p)
                    inner = name in f.private and f.module != ()  # crate roots are façades
                    child.owner = f.owner if inner else child
                    stack.append(child)
    return files, modules


def resolve(crate, scope, segs, modules, aliases, children):
    """The module a path names: its longest prefix that is a module (through re-exports)."""
    first = segs[0]
    if first == "crate":
        cur, rest = (), segs[1:]
    elif first == "mla_gen" and crate == "cli":
        crate, cur, rest = "lib", (), segs[1:]
    elif first in ("self", "super"):
        cur, rest = scope, segs
        while rest and rest[0] in ("self", "super"):
            cur = cur[:-1] if rest[0] == "super" else cur
            rest = rest[1:]
    elif first in children:
        cur, rest = scope, segs
    else:
        return None  # another crate
    for s in rest:
        if (crate, cur + (s,)) in modules:
            cur = cur + (s,)
        elif (crate, cur, s) in aliases:
            crate, cur = aliases[(crate, cur, s)]
        else:
            break
    return (crate, cur)


def scan(files, modules):
    aliases = {}
    uses = []  # (file, scope, segs, is_pub, bound)
    refs = []  # (file, scope, segs)
    for f in files:
        for m in re.finditer(r"(\bpub(?:\([^)]*\))?\s+)?\buse\s+([^;]+);", f.text):
            scope = f.scope(m.start())
            if scope is None:
                continue
            for segs, bound in use_paths(m.group(2)):
                if segs:
                    uses.append((f, scope, segs, bool(m.group(1)), bound))
        for m in re.finditer(r"\b(?:crate|super|self|mla_gen|\w+)(?:\s*::\s*\w+)+", f.text):
            scope = f.scope(m.start())
            if scope is None:
                continue
            before = f.text[max(0, m.start() - 2) : m.start()]
            if before.endswith("::"):
                continue  # the middle of a longer path
            refs.append((f, scope, tuple(s.strip() for s in m.group(0).split("::"))))
    # Re-exports of whole modules (`pub use gen::{spec, abi}`) name modules too: resolve until
    # nothing changes (a re-export may go through another).
    for _ in range(4):
        for f, scope, segs, is_pub, bound in uses:
            if not bound:
                continue
            kids = children_of(f, scope)
            t = resolve(f.crate, scope, segs, modules, aliases, kids)
            if t and t in modules and full_match(f.crate, scope, segs, t, modules, aliases, kids):
                aliases[(f.crate, scope, bound)] = t
    edges = {}
    for f, scope, segs in [(f, s, p) for f, s, p, _, _ in uses] + refs:
        kids = children_of(f, scope)
        t = resolve(f.crate, scope, segs, modules, aliases, kids)
        if t is None or t not in modules:
            continue
        g = modules[t]
        if g.owner is not f.owner and g.module[-1:] != ("tests",):
            edges.setdefault(f.owner.rel, set()).add(g.owner.rel)
    return edges


def children_of(f, scope):
    if scope == f.module:
        return f.children | {n for (_, _, n) in f.inline}
    return set()


def full_match(crate, scope, segs, target, modules, aliases, kids):
    """Does the whole path name the module (not an item inside it)?"""
    if len(segs) == 1:
        return segs[0] in kids
    return resolve(crate, scope, segs[:-1], modules, aliases, kids) != target


def rust_layer_of(module, crate):
    name = "cli" if crate == "cli" else "::".join(module)
    best = None
    for i, (_, prefixes) in enumerate(RUST_LAYERS):
        for p in prefixes:
            hit = name == p or (p == "" and not name) or (p and name.startswith(p + "::"))
            if hit and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return None if best is None else best[0]


def circles(nodes, edges):
    """Strongly connected components of more than one node (Tarjan), each as a list."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def one_loop(comp, edges):
    """A shortest loop through the component's first node, for printing."""
    start, members = comp[0], set(comp)
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges.get(v, ())):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w in members and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def folder(rel):
    first = rel.split("/")[0]
    return first[:-3] if first.endswith(".rs") else first


def check_rust(graph):
    """src/: the number of findings (each printed)."""
    files, modules = load()
    edges = scan(files, modules)
    by_rel = {f.rel: f for f in files if f.owner is f}
    arrows = sum(len(v) for v in edges.values())
    print(f"structure of src/: {len(files)} files ({len(by_rel)} once private children join their parent), {arrows} arrows")
    if graph:
        for a in sorted(edges):
            print(f"  {a} -> {', '.join(sorted(edges[a]))}")
    bad = 0

    found = circles(by_rel, edges)
    print(f"circles between files: {len(found)}")
    for comp in found:
        print(f"  {' -> '.join(one_loop(comp, edges))}   ({len(comp)} files)")
    bad += len(found)

    # Inside each folder alone (a circle there may hide in a larger one above).
    inner = []
    for name in sorted({folder(r) for r in by_rel}):
        own = {r for r in by_rel if folder(r) == name}
        sub = {a: {b for b in bs if b in own} for a, bs in edges.items() if a in own}
        for comp in circles(own, sub):
            if comp not in found:
                inner.append(f"  {' -> '.join(one_loop(comp, sub))}   ({len(comp)} files, {name}/ alone)")
    print(f"circles inside one folder, not listed above: {len(inner)}")
    print("\n".join(inner)) if inner else None
    bad += len(inner)

    fedges = {}
    for a, bs in edges.items():
        for b in bs:
            if folder(a) != folder(b):
                fedges.setdefault(folder(a), set()).add(folder(b))
    ffound = circles({folder(r) for r in by_rel}, fedges)
    print(f"circles between folders: {len(ffound)}")
    for comp in ffound:
        print(f"  {' -> '.join(one_loop(comp, fedges))}")
    bad += len(ffound)

    up, unplaced = [], []
    for f in by_rel.values():
        if rust_layer_of(f.module, f.crate) is None:
            unplaced.append(f.rel)
    for a, bs in sorted(edges.items()):
        fa = by_rel[a]
        la = rust_layer_of(fa.module, fa.crate)
        for b in sorted(bs):
            fb = by_rel[b]
            lb = rust_layer_of(fb.module, fb.crate)
            if la is not None and lb is not None and lb > la:
                up.append(f"  {a} ({RUST_LAYERS[la][0]}) -> {b} ({RUST_LAYERS[lb][0]})")
    print(f"arrows running back up: {len(up)}")
    print("\n".join(up)) if up else None
    bad += len(up)
    if unplaced:
        print(f"files in no layer of RUST_LAYERS (add them): {', '.join(unplaced)}")
        bad += len(unplaced)
    print("layers, bottom first: " + " < ".join(n for n, _ in RUST_LAYERS))
    return bad


def py_layer_of(module):
    return next((i for i, (_, names) in enumerate(PY_LAYERS) if module in names), None)


def package_imports(path, modules):
    """The package modules `path` (a package module) imports, and whether it imports the root."""
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


def top_level_imports(path):
    """(module, names) of each absolute import in `path`: `import a.b` -> ("a.b", []),
    `from a import x, y` -> ("a", ["x", "y"])."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, [a.name for a in node.names]))
    return out


def lab_modules():
    """bench/'s Python files by name as the lab imports them ("peers", "gpu/fp8_report")."""
    return {p.relative_to(LAB).with_suffix("").as_posix(): p for p in sorted(LAB.rglob("*.py"))}


def lab_target(name, importer, lab):
    """The lab module `import name` in `importer` reaches: the importer's own folder first (a
    script's folder is on sys.path), then bench/ (which the harnesses put there)."""
    top = name.split(".")[0]
    here = importer.rsplit("/", 1)[0] + "/" if "/" in importer else ""
    return next((m for m in (here + top, top) if m in lab), None)


def module_circles(place, edges, graph):
    """Prints the size of a module graph (every arrow with --graph) and its circles; returns them."""
    arrows = sum(len(v) for v in edges.values())
    print(f"structure of {place}: {len(edges)} modules, {arrows} arrows")
    if graph:
        for a in sorted(edges):
            print(f"  {a} -> {', '.join(sorted(edges[a]))}")
    found = circles(set(edges), edges)
    print(f"circles: {len(found)}")
    for comp in found:
        print(f"  {' -> '.join(one_loop(comp, edges))}   ({len(comp)} modules)")
    return found


def check_package(graph, lab):
    """python/mla_gen: the number of findings (each printed)."""
    modules = {p.stem for p in PACKAGE.glob("*.py")} | {"_launch"}
    edges, climbs, into_lab = {}, [], []
    for p in sorted(PACKAGE.glob("*.py")):
        found, root = package_imports(p, modules)
        edges[p.stem] = found - {p.stem}
        if root and p.stem != "__init__":
            climbs.append(f"  {p.stem} imports the package root")
        for name, _ in top_level_imports(p):
            target = lab_target(name, "", lab)
            if target and name.split(".")[0] not in modules:
                into_lab.append(f"  mla_gen/{p.name} imports bench/{target}.py")
    found = module_circles("python/mla_gen", edges, graph)
    unplaced = sorted(m for m in modules if py_layer_of(m) is None)
    for a, bs in sorted(edges.items()):
        for b in sorted(bs):
            la, lb = py_layer_of(a), py_layer_of(b)
            if la is not None and lb is not None and lb > la:
                climbs.append(f"  {a} ({PY_LAYERS[la][0]}) -> {b} ({PY_LAYERS[lb][0]})")
    print(f"arrows running back up: {len(climbs)}")
    print("\n".join(climbs)) if climbs else None
    print(f"imports of the lab (bench/): {len(into_lab)}")
    print("\n".join(into_lab)) if into_lab else None
    if unplaced:
        print(f"modules in no layer of PY_LAYERS (add them): {', '.join(unplaced)}")
    print("layers, bottom first: " + " < ".join(n for n, _ in PY_LAYERS))
    return len(found) + len(climbs) + len(into_lab) + len(unplaced)


def check_lab(graph, lab):
    """bench/: the number of findings (each printed); the package's private modules it uses."""
    edges, private = {}, {}
    package = {p.stem for p in PACKAGE.glob("*.py")}
    for name, path in lab.items():
        edges[name] = set()
        for module, names in top_level_imports(path):
            parts = module.split(".")
            if parts[0] == "mla_gen":
                inner = parts[1:2] or [n for n in names if n in package]
                private.setdefault(name, set()).update(m for m in inner if m.startswith("_"))
            else:
                target = lab_target(module, name, lab)
                if target and target != name:
                    edges[name].add(target)
    # src/ including a lab file (include_str!/include_bytes! resolve against the including file).
    included = []
    for rs in sorted(SRC.rglob("*.rs")):
        for m in re.finditer(r'include_(?:str|bytes)!\(\s*"([^"]+)"', rs.read_text()):
            target = (rs.parent / m.group(1)).resolve()
            if target.is_relative_to(LAB.resolve()):
                included.append(f"  {rs.relative_to(ROOT)} includes {target.relative_to(ROOT)}")
    found = module_circles("bench/ (Python)", edges, graph)
    print(f"src/ files including a file of bench/: {len(included)}")
    print("\n".join(included)) if included else None
    reach = sorted((a, sorted(ms)) for a, ms in private.items() if ms)
    print(f"lab modules importing private modules of mla_gen (allowed, listed): {len(reach)}")
    for a, ms in reach:
        print(f"  {a} -> {', '.join(ms)}")
    return len(found) + len(included)


def main():
    graph = "--graph" in sys.argv
    lab = lab_modules()
    found = {
        "src/": check_rust(graph),
        "python/mla_gen": check_package(graph, lab),
        "bench/": check_lab(graph, lab),
    }
    summary = ", ".join(f"{place} {n}" for place, n in found.items())
    total = sum(found.values())
    print(f"{'1 passed, 0 failed' if total == 0 else '0 passed, 1 failed'}: module structure ({total} findings: {summary})")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The module structure of src/: which file imports which, circles, and arrows running back up.

Reads every file of the library (src/lib.rs) and of the binary (src/cli/main.rs) through their
`mod` declarations, takes each path starting with `crate::`, `super::`, `self::`, a child
module's name or (in the binary) `mla_gen::`, and resolves it to the module (file) it names.
Test modules (`mod tests`) are left out: they are not part of the structure. A private child
module (`mod x;`, not `pub`) of a module other than a crate root counts as part of its parent:
nothing outside the parent can reach it, so arrows between the two are the parent's business.

Prints the circles of the file graph and of the folder graph (a folder: everything under one
top-level name of src/, e.g. gen/ or variant.rs with variant/), and every arrow from a module to one
of a higher layer in LAYERS below. Exits 1 if there is any circle or upward arrow.

Standard library only: python3 scripts/structure.py [--graph]  (--graph also prints every arrow).
"""

import re
import sys
from pathlib import Path

# Bottom first. A module may import modules of its own layer or of lower ones; the entries are
# module paths (`a::b` covers `a::b::c` too; the longest entry that matches a module wins; ""
# is the crate root, lib.rs). Generation's data flows spec -> variants -> abi -> render ->
# compile -> emit; the imports run the other way round for the types: spec builds variants and
# checks their launch geometry, so variant and launch sit under spec.
LAYERS = [
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

SRC = Path(__file__).resolve().parent.parent / "src"
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


def layer_of(module, crate):
    name = "cli" if crate == "cli" else "::".join(module)
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
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


def main():
    files, modules = load()
    edges = scan(files, modules)
    by_rel = {f.rel: f for f in files if f.owner is f}
    arrows = sum(len(v) for v in edges.values())
    print(f"structure of src/: {len(files)} files ({len(by_rel)} once private children join their parent), {arrows} arrows")
    if "--graph" in sys.argv:
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
        if layer_of(f.module, f.crate) is None:
            unplaced.append(f.rel)
    for a, bs in sorted(edges.items()):
        fa = by_rel[a]
        la = layer_of(fa.module, fa.crate)
        for b in sorted(bs):
            fb = by_rel[b]
            lb = layer_of(fb.module, fb.crate)
            if la is not None and lb is not None and lb > la:
                up.append(f"  {a} ({LAYERS[la][0]}) -> {b} ({LAYERS[lb][0]})")
    print(f"arrows running back up: {len(up)}")
    print("\n".join(up)) if up else None
    bad += len(up)
    if unplaced:
        print(f"files in no layer of LAYERS (add them): {', '.join(unplaced)}")
        bad += len(unplaced)
    print("layers, bottom first: " + " < ".join(n for n, _ in LAYERS))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

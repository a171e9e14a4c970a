"""Which kernel of a manifest serves a call, from the manifest alone (docs/MANIFEST.md,
"Selection"): the Rust host's src/host/select.rs and the C launcher's ``mla_select`` apply the
same rule, and tests/contract/select.json holds the choices all three must make. No torch.

A call is its family, its arguments by name and its options. An argument is a buffer
``(elem, shape)`` (element type name and sizes, outermost first; either None where unknown), an
``int`` (an integer whose value the call fixes) or None (an integer given, its value left to
each launch). A null buffer is not an argument.
"""

from __future__ import annotations

from .contract import _elem_matches, plan_for

NO, NEAR, YES = 0, 1, 2


def reached(kernels) -> dict:
    """The kernels a launch reaches only through another: a size rule's ranges and the
    specializations (docs/MANIFEST.md); selection never returns them. A dict (keys in manifest
    order), not a set: the manifest it is stored in stays JSON."""
    out: dict = {}
    for k in kernels:
        rule = k["launch"].get("size_rule") or {}
        out.update(dict.fromkeys(r["kernel"] for r in rule.get("ranges", ())))
        out.update(dict.fromkeys(k["launch"].get("specializations", ())))
    return out


def bound_param(e):
    """The parameter a size is, up to an added constant (``num_tokens``, ``num_requests+1``)."""
    return e.factors[0] if e.mul == 1 and len(e.factors) == 1 else None


def _eval_bound(e, binds):
    v = e.mul
    for f in e.factors:
        if binds.get(f) is None:
            return None
        v *= binds[f]
    return v + e.add


def fits(plan, args: dict) -> tuple:
    """(NO | NEAR | YES, unused optional parameters): whether the contract takes the call. A
    buffer it does not take rules it out (memory the call expects it to read or write); NEAR
    where only the check can tell (an integer it does not take, a constant whose value the call
    leaves open, two tensors that disagree on a size)."""
    index = {n: i for i, n in enumerate(plan.names)}
    near = False
    binds = {}
    given = set()
    for name, arg in args.items():
        i = index.get(name)
        if i is None:
            if isinstance(arg, tuple):
                return NO, 0
            near |= name not in plan.constants or arg is None
            continue
        p = plan.params[i]
        given.add(i)
        if p.pointer != isinstance(arg, tuple):
            return NO, 0
        if p.pointer:
            if arg[0] is not None and p.elem is not None and not _elem_matches(arg[0], p.elem):
                return NO, 0
        elif arg is not None:
            binds[i] = arg
    if any(p.pointer and not p.nullable and i not in given for i, p in enumerate(plan.params)):
        return NO, 0
    # Sizes: a dim that is one parameter binds it; every other dim (a constant such as the head
    # size, a product such as the group count) must equal the call's size.
    shaped = []
    for name, arg in args.items():
        i = index.get(name)
        if i is not None and isinstance(arg, tuple) and arg[1] is not None:
            dims = plan.params[i].dims
            if dims is not None and len(dims) == len(arg[1]):  # another rank: the check names it
                shaped.extend(zip((d[1] for d in dims), arg[1]))
    # Two tensors that disagree on a size: the check names which, and the size binds nothing (so
    # the verdict does not depend on the arguments' order).
    disputed = set()
    for size, n in shaped:
        j = bound_param(size)
        if j is not None and binds.setdefault(j, n - size.add) != n - size.add:
            disputed.add(j)
    for j in disputed:
        del binds[j]
    near |= bool(disputed)
    for size, n in shaped:
        if bound_param(size) is None:
            v = _eval_bound(size, binds)
            if v is not None and v != n:
                return NO, 0
    for name, arg in args.items():
        c = plan.constants.get(name) if name not in index else None
        if c is not None and isinstance(arg, int):
            v = _eval_bound(c, binds)
            if v is not None and v != arg:
                return NO, 0
    unused = sum(1 for i, p in enumerate(plan.params)
                 if i not in given and (p.nullable or (not p.pointer and p.default is not None)))
    return (NEAR if near else YES), unused


def select(manifest: dict, family: str, args: dict, options: dict):
    """The kernel that serves the call: among the kernels of `family` that no other kernel names
    (a size rule's, a specialization), those whose ``select`` block `options` state alike (no more,
    no fewer) and
    whose contract takes the call; the fewest unused optional parameters, then the fewest
    integer parameters (a size fixed at compile time beats one passed at run time), then
    ``pdl``, then manifest order. Where none takes it but one would be judged by its check, the
    best such one (an integer it does not take, a constant the call leaves open, two tensors that
    disagree on a size). Returns ``(kernel entry, serves)`` or None."""
    family_kernels = [k for k in manifest["kernels"]
                      if k.get("family") == family and k["name"] not in manifest["_reached"]]
    best = None
    for k in family_kernels:
        plan = plan_for(k["name"], k)
        named = k.get("select") or {}
        # alike both ways: an option the call states that the kernel does not name rules it out
        if len(named) != len(options) or any(options.get(key) != value for key, value in named.items()):
            continue
        verdict, unused = fits(plan, args)
        if verdict == NO:
            continue
        rank = (verdict == NEAR, unused, sum(1 for p in plan.params if not p.pointer),
                not k["launch"].get("pdl", False))
        if best is None or rank < best[0]:
            best = (rank, k)
    return None if best is None else (best[1], not best[0][0])

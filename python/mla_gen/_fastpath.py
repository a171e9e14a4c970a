"""A plan's fast path: Python source generated per shape of plan, compiled once, bound to each
plan's numbers.

A call whose layouts have a plan still checks what depends on its pointers and free integers
(docs/MANIFEST.md steps 7 and 8, pointer parts): each pointer aligned, no written buffer
overlapping another, each free integer an int inside its bounds; then it launches (_cuda.launch's
body, inlined). Straight-line code with the plan's numbers bound in a closure is about 1 us a call
cheaper than a loop over the plan's parameters (docs/PYTHON.md, "Host cost"). The text names
everything after the call's arguments and the kernel's parameters (``output_ptr``,
``plan_num_tokens``, ``prefill_tokens_with_context_max``) and holds no number of the plan but the
pointers' alignments (the kernel's, from its dtypes), so plans of one shape and alignment share
one compiled text.

``MLA_GEN_SHOW_FASTPATH=1``: each text is printed to stderr when it is first compiled.
"""

from __future__ import annotations

import keyword
import os
import sys

from . import _cuda

# The one layout of every generated text. {fits}: which arguments the plan's call gave and the
# layout guard; {body}: the per-call checks and the launch; {bind}: the plan's numbers.
SOURCE = """\
def make(constants, extents, bounds, launch_bindings, device, stream):
{bind}\
    guard = None

    def run({params}):
{body}
    def go({params}):
{fits}\
{body}
    def set_guard(check):
        nonlocal guard
        guard = check

    return run, go, set_guard
"""

_BODY_INDENT = " " * 8
_compiled: dict = {}  # text -> its make()


def _ident(name: str) -> str:
    """A kernel parameter's name as a Python identifier (the contract's names are C identifiers;
    a Python keyword gets a trailing underscore)."""
    if not name.isidentifier():
        raise ValueError(f"parameter name {name!r} is not an identifier")
    return name + "_" if keyword.iskeyword(name) else name


def _unpack(names, source: str) -> str:
    if not names:
        return ""
    return f"    {', '.join(names)}{',' if len(names) == 1 else ''} = {source}\n"


def build(kernel: str, tensors: tuple, free: tuple, present: tuple, aligned: list, overlaps: list,
          extents: tuple, bounds, values: list, launch, device: int, stream, preferred=()):
    """``(run, go, set_guard)`` of one plan.

    tensors, free: the names of the call's tensors and free integers, in call order (the
      generated functions take them so: ``run(*tensors, *free)``).
    present: for each tensor, then each free integer, whether the plan's call gave it.
    aligned: ``[(alignment in bytes, [tensor index, ...])]``; overlaps: ``[(a, b)]``, tensor
      indices whose byte ranges must not meet; extents: bytes each tensor spans from its pointer.
    bounds: ``[(free index, lo, hi)]``; None: a bound depends on another free integer, so every
      call gets the full check (run says False).
    values: per kernel parameter, what the launch passes: ``("tensor", k)`` (its pointer),
      ``("free", k)``, or ``("plan", name, value)`` (this plan's value).
    launch: ``(launcher, gx, gy)``, or None: the plan launches nothing (run says True where the
      per-call checks pass: a refusal does not depend on which plans earlier calls made).
    preferred: ``[[(free index, lo, hi), ...], ...]``: where every free integer of one list is in
      its range, another kernel serves the call better (run says False: the full check plans it).

    ``run`` does the per-call checks and the launch and returns True; False where anything is off
    (nothing launched: the full check then names the problem). ``go`` is ``run`` where the call
    fits the plan: the same arguments given, the layout guard (set by ``set_guard``) passes."""
    targs = [_ident(n) for n in tensors]
    fargs = [_ident(n) for n in free]
    ptr = [f"{n}_ptr" for n in targs]
    nt = len(targs)
    body, constants, extent_names, extent_values, bound_names, bound_values, launch_names = [], [], [], [], [], [], ()
    launch_values = ()
    checked_free = False
    if bounds is None:
        body.append("return False  # a bound over another free integer: every call gets the full check")
    else:
        checked_free = True
        used = sorted({k for _, ks in aligned for k in ks} | {k for pair in overlaps for k in pair}
                      | ({v[1] for v in values if v[0] == "tensor"} if launch is not None else set()))
        body += [f"{ptr[k]} = {targs[k]}.data_ptr()" for k in used]
        checks = []
        for align, ks in sorted(aligned):
            joined = " | ".join(ptr[k] for k in ks)
            joined = f"({joined})" if len(ks) > 1 else joined
            checks.append(f"{joined} & {align - 1}" if align & (align - 1) == 0 else f"{joined} % {align}")
        for a, b in overlaps:
            # [pa, pa + ea) and [pb, pb + eb) meet: -ea < pa - pb < eb
            for k, name in ((a, f"neg_{targs[a]}_bytes"), (b, f"{targs[b]}_bytes")):
                if name not in extent_names:
                    extent_names.append(name)
                    extent_values.append(-extents[k] if name.startswith("neg_") else extents[k])
            checks.append(f"neg_{targs[a]}_bytes < {ptr[a]} - {ptr[b]} < {targs[b]}_bytes")
        for k, lo, hi in bounds:
            f = fargs[k]
            bound_names += [f"{f}_min", f"{f}_max"]
            bound_values += [lo, hi]
            checks.append(f"type({f}) is not int or {f} < {f}_min or {f}_max < {f}")
        for j, ranges in enumerate(preferred):
            inside = []
            for k, lo, hi in ranges:
                f = fargs[k]
                bound_names += [f"{f}_preferred{j}_min", f"{f}_preferred{j}_max"]
                bound_values += [lo, hi]
                inside.append(f"{f}_preferred{j}_min <= {f} <= {f}_preferred{j}_max")
            checks.append(" and ".join(inside))
        for c in checks:
            body += [f"if {c}:", "    return False"]
        if launch is None:
            body.append("return True  # nothing to launch")
        else:
            exprs = []
            for v in values:
                if v[0] == "tensor":
                    exprs.append(ptr[v[1]])
                elif v[0] == "free":
                    exprs.append(fargs[v[1]])
                else:
                    constants.append((f"plan_{_ident(v[1])}", v[2]))
                    exprs.append(constants[-1][0])
            text, launch_names, launch_values = _cuda.launch_source(*launch, "stream(device)", ", ".join(exprs))
            body += text.splitlines()
            body.append("return True")
    # Whether the call fits the plan: what the plan's call left out is left out again, what it
    # gave is given (the body's bound check refuses a free integer's None), the guard passes.
    fits = [f"{n} is not None" for n, given in zip(targs + fargs, present) if not given]
    fits += [f"{n} is None" for n, given in zip(fargs, present[nt:]) if given and not checked_free]
    fits = [f"if {' or '.join(fits)}:", "    return False"] if fits else []
    fits += [f"if not guard({', '.join(n for n, given in zip(targs, present) if given)}):", "    return False"]
    bind = (_unpack([n for n, _ in constants], "constants") + _unpack(extent_names, "extents")
            + _unpack(bound_names, "bounds") + _unpack(launch_names, "launch_bindings"))
    names = targs + fargs + ptr + [n for n, _ in constants] + extent_names + bound_names + list(launch_names)
    assert len(set(names)) == len(names), f"{kernel}: generated names collide: {names}"
    src = SOURCE.format(bind=bind, params=", ".join(targs + fargs),
                        body="".join(f"{_BODY_INDENT}{line}\n" for line in body),
                        fits="".join(f"{_BODY_INDENT}{line}\n" for line in fits))
    make = _compiled.get(src)
    if make is None:
        if os.environ.get("MLA_GEN_SHOW_FASTPATH", "") not in ("", "0"):
            print(f"# mla_gen fast path (first compiled for {kernel})\n{src}", file=sys.stderr, flush=True)
        scope: dict = {}
        exec(compile(src, f"<mla_gen fast path: {kernel}>", "exec"), {}, scope)  # noqa: S102
        make = _compiled[src] = scope["make"]
    return make(tuple(v for _, v in constants), tuple(extent_values), tuple(bound_values), launch_values, device,
                stream)

"""The one argument check, driven by a kernel's contract in manifest.json.

docs/MANIFEST.md, "The check", steps 1-8, with the same messages as the Rust host
(src/host/check.rs) and the C launcher. Needs no GPU, no driver and no torch: a :class:`Plan` is
built once per kernel (names resolved to indexes), then :meth:`Plan.check` takes the arguments by
name and returns the parameter values in signature order and the grid, or raises
:class:`ArgumentError` with the text ``"<kernel>: <problem>"``.

An argument is a :class:`Buffer` (address, length in elements, element type or None), an ``int``,
or ``None`` (no buffer). ``check_args`` also takes a buffer as a dict ``{ptr, len, elem}``.
"""

from __future__ import annotations

from typing import NamedTuple

from ._binding import TEXTS

__all__ = ["ArgumentError", "Buffer", "Checked", "Plan", "check_args", "plan_for"]

_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_U64_MAX = (1 << 64) - 1
MAX_PARAMS = 32


class ArgumentError(ValueError):
    """An argument the kernel cannot take: ``"<kernel>: <problem>"``."""

    def __init__(self, kernel: str, problem: str):
        super().__init__(f"{kernel}: {problem}")
        self.kernel = kernel
        self.problem = problem


class Buffer(NamedTuple):
    """A device buffer: address, length in elements from that address, element type
    (``bf16``, ``f32``, ``u8`` ...) or None where the host does not know it."""
    ptr: int
    len: int
    elem: str | None = None


class Checked(NamedTuple):
    """A passing check: parameter values in signature order (pointers as addresses, null as 0),
    the grid (None: nothing to launch), the block size and the dynamic shared memory."""
    values: tuple
    grid: tuple | None
    block_threads: int
    shared_mem_bytes: int
    extents: tuple  # per parameter: elements covered (0 for integers, null and empty buffers)


def _i64(v):
    """v if it fits a signed 64-bit integer, else None (an overflow)."""
    return v if _I64_MIN <= v <= _I64_MAX else None


def parse_expr(text: str):
    """``factor ('*' factor)* ('+' integer)?`` -> (mul, [names], add)."""
    bad = f"`{text}` is not a size expression (factor*factor...+integer)"
    product, plus, add_text = text.partition("+")
    add = 0
    if plus:
        try:
            add = int(add_text.strip())
        except ValueError:
            raise ValueError(bad) from None
    mul, names = 1, []
    for f in product.split("*"):
        f = f.strip()
        if not f:
            raise ValueError(bad)
        if f.lstrip("-").isdigit():
            mul *= int(f)
        elif all(c.isascii() and (c.isalnum() or c == "_") for c in f):
            names.append(f)
        else:
            raise ValueError(bad)
    return mul, names, add


class _Expr:
    """An expression with names resolved: ``mul * product(ints[factors]) + add``."""
    __slots__ = ("text", "mul", "factors", "add")

    def __init__(self, text, mul, factors, add):
        self.text, self.mul, self.factors, self.add = text, mul, tuple(factors), add

    def eval(self, ints):
        v = self.mul
        for f in self.factors:
            v = _i64(v * ints[f])
            if v is None:
                return None
        return _i64(v + self.add)

    def show(self, ints):
        """``num_tokens = 512``, or ``0`` for a plain number."""
        v = self.eval(ints)
        if v is None:
            return self.text
        return str(v) if not self.factors else f"{self.text} = {v}"

    def param(self):
        """The single parameter this expression is (a stride the caller gives), if any."""
        return self.factors[0] if self.mul == 1 and self.add == 0 and len(self.factors) == 1 else None

    def value(self, ints):
        """For messages: the value, or the text where it overflows."""
        v = self.eval(ints)
        return self.text if v is None else str(v)


class _Param:
    __slots__ = ("name", "pointer", "writes", "elem", "elem_bytes", "nullable", "dims", "align",
                 "stride_multiple", "distinct", "min", "max", "default")


class Plan:
    """A kernel's contract with every name resolved, ready to check launches."""

    def __init__(self, kernel: str, contract: dict):
        params = contract["params"]
        if len(params) > MAX_PARAMS:
            raise ValueError(f"{kernel}: {len(params)} parameters, at most {MAX_PARAMS} are supported")
        self.kernel = kernel
        self.names = tuple(p["name"] for p in params)
        index = {n: i for i, n in enumerate(self.names)}
        consts = contract.get("constants", {})

        def resolve(text):
            try:
                mul, names, add = parse_expr(text)
            except ValueError as e:
                raise ValueError(f"{kernel}: {e}") from None
            factors = []
            for f in names:
                if f in index:
                    factors.append(index[f])
                    continue
                if f not in consts:
                    raise ValueError(f"{kernel}: `{text}` names `{f}`, which is neither a parameter nor a constant")
                cm, cnames, cadd = parse_expr(consts[f])
                if cadd != 0:
                    raise ValueError(f"{kernel}: constant `{f}` = `{consts[f]}` cannot be a factor")
                mul *= cm
                for g in cnames:
                    if g not in index:
                        raise ValueError(f"{kernel}: constant `{f}` names `{g}`, which is not a parameter")
                    factors.append(index[g])
            return _Expr(text, mul, factors, add)

        self.params = []
        for p in params:
            q = _Param()
            q.name = p["name"]
            q.pointer = p["kind"] == "pointer"
            q.writes = p["role"] in ("write", "read_write")
            q.elem = p.get("elem")
            q.elem_bytes = max(p.get("elem_bytes", 0), 1)
            q.nullable = bool(p.get("nullable", False))
            t = p.get("tensor")
            if t is not None:
                if len(t["dims"]) > 8:
                    raise ValueError(f"{kernel}: {q.name} has more than 8 dimensions")
                q.dims = tuple((d["label"], resolve(d["size"]), resolve(d["stride"])) for d in t["dims"])
                q.align = max(t.get("align_bytes", 1), 1)
                q.stride_multiple = max(t.get("stride_multiple", 1), 1)
                q.distinct = bool(t.get("distinct", False))
            else:
                q.dims = None
            b = p.get("bounds") or {}
            q.min = resolve(b["min"]) if "min" in b else None
            q.max = resolve(b["max"]) if b.get("max") is not None else None
            q.default = resolve(b["default"]) if b.get("default") is not None else None
            self.params.append(q)
        self.constants = {name: resolve(text) for name, text in sorted(consts.items())}
        self.limits = tuple((resolve(lim["expr"]), min(lim["max"], _I64_MAX), lim["why"])
                            for lim in contract.get("limits") or ())
        launch = contract["launch"]
        self.axes = []
        for axis, key in (("x", "grid_x"), ("y", "grid_y")):
            a = launch[key]
            if a["dim"] not in index:
                raise ValueError(f"{kernel}: the grid counts `{a['dim']}`, which is not a parameter")
            self.axes.append((index[a["dim"]], max(a["per_block"], 1), a["limit"], axis))
        self.block_threads = launch["block_threads"]
        self.shared_mem_bytes = launch["shared_mem_bytes"]

    def _refuse(self, problem):
        return ArgumentError(self.kernel, problem)

    def check(self, args: dict) -> Checked:
        """Check one launch's arguments, given by name (docs/MANIFEST.md, "The check", 1-8).
        Values: a :class:`Buffer` (or a ``{ptr, len, elem}`` dict), an ``int``, or ``None``."""
        n = len(self.params)
        given = [_UNSET] * n
        index = {name: i for i, name in enumerate(self.names)}
        # 1. Bind each argument to a parameter or a constant.
        for name, arg in _items(args):
            arg = _arg(arg)
            i = index.get(name)
            if i is not None:
                if given[i] is not _UNSET:
                    raise self._refuse(f"{name} is given twice")
                given[i] = arg
            elif arg is None:
                pass
            elif name in self.constants:
                if not _is_int(arg):
                    raise self._refuse(f"{name} must be an integer")
            else:
                raise self._refuse(f"{name} given, but this kernel takes no {name}")
        # 2. Every parameter present, of the right kind and element type.
        ints = [0] * n
        ptrs = [0] * n
        lens = [0] * n
        defaulted = []
        for i, p in enumerate(self.params):
            a = given[i]
            if p.pointer:
                if a is _UNSET or a is None:
                    if p.nullable:
                        continue
                    raise self._refuse(f"{p.name} is required" if a is _UNSET else f"{p.name} is a null pointer")
                if _is_int(a):
                    raise self._refuse(f"{p.name} must be a buffer")
                if a.ptr == 0:
                    if p.nullable:
                        continue
                    raise self._refuse(f"{p.name} is a null pointer")
                if a.elem is not None and p.elem is not None and not _elem_matches(a.elem, p.elem):
                    raise self._refuse(TEXTS["elem"].format(name=p.name, got=a.elem, want=p.elem))
                ptrs[i], lens[i] = a.ptr, a.len
            else:
                if a is _UNSET:
                    if p.default is None:
                        raise self._refuse(f"{p.name} is required")
                    defaulted.append(i)
                elif _is_int(a):
                    ints[i] = a
                else:
                    raise self._refuse(f"{p.name} must be an integer")
        # 3. Defaults, from the values given.
        for i in defaulted:
            d = self.params[i].default.eval(ints)
            if d is None:
                raise self._refuse(f"{self.params[i].name}: its default overflows")
            ints[i] = d
        # 4. Ranges of the integers, then the kernel's limits.
        problem = self._integers_problem(ints, False)
        if problem is not None:
            raise self._refuse(problem)
        # 5. Constants passed must match the kernel's.
        for name, arg in _items(args):
            c = self.constants.get(name)
            arg = _arg(arg)
            if c is not None and _is_int(arg) and c.eval(ints) != arg:
                raise self._refuse(f"{name} = {arg}, but this kernel is built for {name} = {c.show(ints)}")
        # 6. The grid, from the launch rule.
        grid = [1, 1, 1]
        empty = False
        for k, (dim, per_block, limit, axis) in enumerate(self.axes):
            count = ints[dim] % (1 << 64)  # as u64; >= 0 after step 4 anyway
            blocks = -(-count // per_block)
            if blocks > limit:
                raise self._refuse(f"{self.params[dim].name} = {count} needs {blocks} blocks in grid {axis}, "
                                   f"over CUDA's limit {limit}")
            empty |= blocks == 0
            grid[k] = blocks
        values = tuple(ptrs[i] if p.pointer else ints[i] for i, p in enumerate(self.params))
        extents = [0] * n
        if empty:
            return Checked(values, None, self.block_threads, self.shared_mem_bytes, tuple(extents))
        # 7. Each tensor: alignment, strides, extent, distinct elements.
        for i, p in enumerate(self.params):
            if p.dims is None or ptrs[i] == 0:
                continue
            extents[i] = self._check_tensor(p, ptrs[i], lens[i], ints)
        # 8. A buffer the kernel writes shares memory with no other argument.
        hulls = [(ptrs[i], min(ptrs[i] + extents[i] * p.elem_bytes, _U64_MAX)) for i, p in enumerate(self.params)]
        for i in range(n):
            a = self.params[i]
            a0, a1 = hulls[i]
            if a0 >= a1:
                continue
            for j in range(i + 1, n):
                b = self.params[j]
                if not (a.writes or b.writes):
                    continue
                b0, b1 = hulls[j]
                if b0 < b1 and a0 < b1 and b0 < a1:
                    writer = a.name if a.writes else b.name
                    raise self._refuse(f"{a.name} overlaps {b.name}: the kernel writes {writer}, "
                                       "which may share memory with no other argument")
        return Checked(values, tuple(grid), self.block_threads, self.shared_mem_bytes, tuple(extents))

    def _integers_problem(self, ints, strict):
        """Step 4: the first integer bound or limit `ints` break, as the refusal says it, or None.
        A bound that overflows binds nothing in the check; `strict`: it is broken (a
        specialization is taken only where its bounds surely hold). A limit that overflows is
        exceeded either way."""
        for i, p in enumerate(self.params):
            v = ints[i]
            if p.min is not None:
                m = p.min.eval(ints)
                if (m is None and strict) or (m is not None and v < m):
                    return f"{p.name} = {v} is below its minimum {p.min.show(ints)}"
            if p.max is not None:
                m = p.max.eval(ints)
                if (m is None and strict) or (m is not None and v > m):
                    return f"{p.name} = {v} exceeds its maximum {p.max.show(ints)}"
        for expr, most, why in self.limits:
            v = expr.eval(ints)
            if v is None or v > most:
                return f"{expr.show(ints)} exceeds {most}: {why}"
        return None

    def accepts(self, values) -> bool:
        """Whether parameter values another kernel of the same parameters checked (signature
        order, as :class:`Checked` has them) meet this kernel's integer bounds and limits: all a
        specialization adds to its kernel's contract (docs/MANIFEST.md, "Specializations")."""
        ints = [0 if p.pointer else v for p, v in zip(self.params, values)]
        return len(ints) == len(self.params) and self._integers_problem(ints, True) is None

    def rebound(self, general: Plan) -> dict:
        """The parameters whose bounds differ from their bounds in `general` (the kernel this one
        specializes), by index, each with those bounds of its own."""
        out = {}
        for i, (p, g) in enumerate(zip(self.params, general.params)):
            new = [mine for mine, theirs in ((p.min, g.min), (p.max, g.max))
                   if mine is not None and (theirs is None or mine.text != theirs.text)]
            if new:
                out[i] = new
        return out

    def reads_beyond(self, general: Plan) -> set:
        """The parameter indexes whose values decide :meth:`accepts` beyond what `general` (the
        kernel this one specializes) already bounds alike: each bound that differs from its
        bound there (the parameter and what the bound names), each limit it does not have."""
        out = set()
        for i, bounds in self.rebound(general).items():
            out.add(i)
            for b in bounds:
                out.update(b.factors)
        theirs = {(e.text, most) for e, most, _ in general.limits}
        for expr, most, _ in self.limits:
            if (expr.text, most) not in theirs:
                out.update(expr.factors)
        return out

    def _check_tensor(self, p, ptr, length, ints):
        """Step 7 for one tensor; its extent in elements."""
        if ptr % p.align:
            raise self._refuse(f"{p.name}: pointer {ptr:#x} is not aligned to {p.align} bytes")
        if p.stride_multiple > 1:
            for _, _, stride in p.dims:
                s = stride.param()
                if s is not None and ints[s] % p.stride_multiple:
                    raise self._refuse(f"{p.name}: {self.names[s]} = {ints[s]} is not a multiple of "
                                       f"{p.stride_multiple} elements (the kernel's {p.align}-byte access)")
        dims = []
        for _, size, stride in p.dims:
            sz, st = size.eval(ints), stride.eval(ints)
            if sz is None or st is None:
                raise self._refuse(f"{p.name}: {self.shape(p, ints)} overflows 64 bits")
            dims.append((sz, st))
        if any(sz == 0 for sz, _ in dims):
            return 0
        extent = 1
        for sz, st in dims:
            step = _i64((sz - 1) * st)
            extent = None if step is None or extent is None else _i64(step + extent)
            if extent is None:
                raise self._refuse(f"{p.name}: {self.shape(p, ints)} overflows 64 bits")
        if (extent if extent >= 0 else extent + (1 << 64)) > length:  # as u64
            raise self._refuse(f"{p.name}: {self.shape(p, ints)} needs {extent} elements, it has {length}")
        if p.distinct:
            # Innermost (smallest stride) first: each dimension must step past everything the
            # dimensions inside it cover.
            span = 1
            for st, sz in sorted(((st, sz) for sz, st in dims if sz > 1), key=lambda x: x[0]):
                if st < span:
                    raise self._refuse(f"{p.name}: {self.shape(p, ints)} maps two elements to one address")
                span += (sz - 1) * st
        return extent

    def shape(self, p, ints):
        """``[T=4, H=2, D=128] with strides (256, 128, 1)`` for messages."""
        dims = ", ".join(f"{label}={size.value(ints)}" for label, size, _ in p.dims)
        strides = ", ".join(stride.value(ints) for _, _, stride in p.dims)
        return f"[{dims}] with strides ({strides})"

    def dims_of(self, name: str, values) -> tuple | None:
        """(sizes, strides) of pointer parameter `name` for the integer `values` (in signature
        order), or None for a parameter without a tensor."""
        p = self.params[self.names.index(name)]
        if p.dims is None:
            return None
        ints = list(values)
        return (tuple(s.eval(ints) for _, s, _ in p.dims), tuple(t.eval(ints) for _, _, t in p.dims))


class _Unset:
    __slots__ = ()


_UNSET = _Unset()


def _is_int(a):
    return type(a) is int


def _items(args):
    return args.items() if isinstance(args, dict) else args


def _arg(a):
    if a is None or type(a) is int or isinstance(a, Buffer):
        return a
    if isinstance(a, dict):
        return Buffer(int(a["ptr"]), int(a["len"]), a.get("elem"))
    if isinstance(a, bool):
        raise TypeError(f"not an argument: {a!r} (a bool; an int, a Buffer, a {{ptr, len, elem}} dict or None)")
    if isinstance(a, int):
        return int(a)
    raise TypeError(f"not an argument: {a!r} (a Buffer, a {{ptr, len, elem}} dict, an int or None)")


def _elem_matches(got: str, want: str) -> bool:
    """FP8 codes may come as plain bytes."""
    return got == want or (want == "fp8_e4m3" and got == "u8")


_plans: dict = {}


def plan_for(kernel: str, contract: dict) -> Plan:
    """The plan of `kernel`, built at first use for this contract (cached by identity)."""
    key = (kernel, id(contract))
    hit = _plans.get(key)
    if hit is None or hit[0] is not contract:
        hit = (contract, Plan(kernel, contract))
        _plans[key] = hit
    return hit[1]


def check_args(kernel: str, args: dict, manifest) -> tuple:
    """Check `args` (by name) against `kernel`'s contract; ``(values, grid)`` or
    :class:`ArgumentError`. No GPU, no driver, no launch.

    `manifest`: a manifest dict (``{"kernels": [...]}``) or a dict of contracts keyed by kernel
    name (tests/contract/contracts.json); ``mla_gen.check_args`` defaults it to the current
    kernel folder's (this module reads no folder: the manifest module, above it, does)."""
    contract = _contract_of(kernel, manifest)
    checked = plan_for(kernel, contract).check(args)
    return checked.values, checked.grid


def _contract_of(kernel, manifest):
    if "kernels" in manifest and isinstance(manifest["kernels"], list):
        for k in manifest["kernels"]:
            if k["name"] == kernel:
                return k
        raise KeyError(f"no kernel {kernel!r} in this manifest")
    if kernel not in manifest:
        raise KeyError(f"no kernel {kernel!r} among these contracts")
    return manifest[kernel]

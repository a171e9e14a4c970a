"""The torch layer's table, shared by the Python path (_plan, _torch, ops) and the compiled op
(python/csrc: setup.py writes it into the header it compiles, mla_gen_ops.h): which argument of
each torch op binds which kernel parameter, what a call that no kernel serves is called in its
error, and the texts of the refusals the torch layer adds to the contract's. Torch-free, so that
the wheel build reads it without torch.

The kinds and ops are data, binding.json beside this file (its "about" says each field): an
option that adds a tensor argument adds it there, not here.

- ``TEXTS``: each refusal as a ``str.format`` template over named fields; rendered the same by
  both (shapes and strides as Python tuples, devices as torch prints them, dtypes ``torch.x``).
- ``KINDS`` (``Kind``): one way of calling a family: the kernel parameters its tensors bind (in
  call order), its free integers, its options (the manifest's ``select`` keys), the tensors whose
  element type selects the kernel, and ``what`` (with ``fields`` and ``checks``): how an error
  names a call.
- ``SCHEMAS`` and ``OPS``: the torch ops, and per op which of its arguments is which tensor,
  free integer or option of which kind.
"""

from __future__ import annotations

import json
from pathlib import Path

TEXTS = {
    "not_tensor": "{name} must be a torch.Tensor, got {type}",
    "not_on_device": "{name} is on {device}; the kernels run on a CUDA device",
    "two_devices": "{name} is on {device}, {first} on {first_device}; all tensors must be on one device",
    "rank": "{name} must have {rank} dimensions, got shape {shape}",
    "param_rank": "{name} must have {rank} dimensions [{labels}], got shape {shape}",
    "disagree": ("{name} has {label}={size} where {first} has {first_label}={first_size} (the tensors of one call "
                 "must agree on every size): {name} has shape {shape} for [{labels}], {first} {first_shape} for "
                 "[{first_labels}]"),
    # shape: sizes other than the kernel's (no strides: those it wants are partly the tensor's own);
    # layout: the kernel's sizes, laid out otherwise
    "shape": "{name} has shape {shape}; the kernel addresses it as [{want}]",
    "layout": ("{name} has shape {shape} and strides {strides}; the kernel addresses it as [{want}] with strides "
               "{want_strides} (strides of size-1 dims do not matter)"),
    # after "shape", where an entry point takes lse_layout and the lse is the addressed one transposed
    "lse_layout_hint": " (for an lse laid out [{labels}], pass lse_layout=\"{layout}\")",
    # a dim whose size is an integer plus a constant (num_requests+1) with fewer entries than that
    "too_short": ("{name} must hold at least {least} along {label} = {param} + {least} ({param} >= 0), got shape "
                  "{shape}"),
    "no_kernel": ("no generated {family} kernel for {what} in {label}; add it to a spec as a [[{family}]] table, "
                  "with `include_default = true` to keep every default kernel (docs/SPEC.md), generate it "
                  "(`mla-gen generate SPEC --out DIR`) and set MLA_GEN_KERNELS=DIR"),
    "groups": "{name} must be [T, H * D / G] for a group size G, got {shape} for H * D = {hd}",
    "both_or_neither": ("{given} given without {missing}: the empty-context mask needs both start locations "
                        "(int32 [B + 1] each), or neither"),
    # the contract's step 2 (mla_gen/contract.py), which the C launcher cannot check: it has no element types
    "elem": "{name} is {got}, the kernel takes {want}",
    "lse_layout": "lse_layout must be \"token_major\" or \"head_major\", got \"{value}\"",
    "no_states_lse": ("torch.ops.mla_gen.merge_states returns the merged lse: the kernel folder's merge_states "
                      "kernel for this call has no output lse (spec: output_lse = true); call "
                      "mla_gen.merge_states instead"),
}

LSE_LAYOUTS = ("token_major", "head_major")

# The kinds' tensors by the names FlashInfer's functions and sgl-kernel's merge_state_v2 give them
# (v_a, s_a, ...), so that their refusals name the caller's arguments (_torch._call_as). The
# package's own functions and ops: CALLER_NAMES, below.
ENGINE_NAMES = {
    "pair": {"output": "v_merged", "output_lse": "s_merged", "prefix_output": "v_a", "prefix_lse": "s_a",
             "suffix_output": "v_b", "suffix_lse": "s_b"},
    "in_place": {"state": "v", "state_lse": "s", "other": "v_other", "other_lse": "s_other"},
    "states": {"output": "v_merged", "output_lse": "s_merged", "states": "v", "states_lse": "s"},
}

# torch dtypes (by name) -> the manifest's element names
ELEMS = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "int32": "i32", "uint8": "u8", "bool": "u8",
         "float64": "f64", "int64": "i64", "int8": "i8", "int16": "i16", "float8_e4m3fn": "fp8_e4m3"}


def shape_text(sizes) -> str:
    """A shape or strides as Python prints a tuple of ints."""
    return repr(tuple(int(s) for s in sizes))


class Kind:
    """One way of calling a family (see the module's doc).

    ``what``: a template over ``fields``, each ``name: rule`` with rule ``("dtype", tensor)``
    (``torch.bfloat16``), ``("size", tensor, dim)``, ``("given", tensor, yes, no)``,
    ``("option", key)`` (an option's value as Python prints it) or ``("group_size", rows, scales)``
    (``H * D`` of rows over the second size of scales). ``checks``, before the fields are read:
    ``("rank", tensor, name, rank)`` (text ``rank``) and ``("groups", rows, scales, name)`` (text
    ``groups``: scales' second size divides ``H * D``). ``optional``: the tensors a call may
    leave out (None); every other one is required, and a call that passes no tensor there is
    refused (text ``not_tensor``) before any kernel is selected."""

    def __init__(self, family, names, free, options, typed, what, fields=(), checks=(), optional=()):
        self.family, self.names, self.free, self.options = family, tuple(names), tuple(free), tuple(options)
        self.typed, self.what, self.fields, self.checks = tuple(typed), what, tuple(fields), tuple(checks)
        self.optional = frozenset(optional)

    def with_options(self, options, what_suffix):
        """The same tensors under more select keys (e.g. FlashInfer's ``lse_base``)."""
        return Kind(self.family, self.names, self.free, options, self.typed, self.what + what_suffix, self.fields,
                    self.checks, self.optional)

    def described(self) -> set:
        """The tensors the checks and the error's fields read (a "given" one may be absent): those
        that say which kernel the call means."""
        read = set(self.typed)
        for check in self.checks:
            read.update(check[1:2] if check[0] == "rank" else check[1:3])
        for _, rule in self.fields:
            read.update(rule[1:2] if rule[0] in ("dtype", "size") else rule[1:3] if rule[0] == "group_size" else ())
        return read

    def taking(self, names):
        """The same call with only the tensors `names`, in that order: an engine API that passes
        a fixed few is not moved by a tensor an option adds to the kind."""
        read = self.described()
        missing, unknown = read - set(names), set(names) - set(self.names)
        if missing or unknown:
            raise ValueError(f"{names} for a {self.family} kind of {self.names}: needs {sorted(missing)}"
                             + (f", has no {sorted(unknown)}" if unknown else ""))
        return Kind(self.family, names, self.free, self.options, self.typed, self.what, self.fields, self.checks,
                    self.optional & set(names))

    def describe(self, tmap: dict, options: tuple) -> str:
        """The call as its error names it; raises TypeError/ValueError for what no kernel could
        mean (the checks)."""
        for check in self.checks:
            t = tmap[check[1]]
            if check[0] == "rank":
                _, _, name, rank = check
                if not hasattr(t, "dim"):
                    raise TypeError(TEXTS["not_tensor"].format(name=name, type=type(t).__name__))
                if t.dim() != rank:
                    raise ValueError(TEXTS["rank"].format(name=name, rank=rank, shape=shape_text(t.shape)))
            else:
                _, rows, scales, name = check
                s = tmap[scales]
                hd = tmap[rows].shape[1] * tmap[rows].shape[2]
                if s.shape[1] < 1 or hd % s.shape[1]:
                    raise ValueError(TEXTS["groups"].format(name=name, shape=shape_text(s.shape), hd=hd))
        named = dict(zip(self.options, options))
        values = {}
        for name, rule in self.fields:
            if rule[0] == "dtype":
                values[name] = str(tmap[rule[1]].dtype)
            elif rule[0] == "size":
                values[name] = tmap[rule[1]].shape[rule[2]]
            elif rule[0] == "given":
                values[name] = rule[2] if tmap.get(rule[1]) is not None else rule[3]
            elif rule[0] == "option":
                values[name] = named[rule[1]]
            else:  # group_size
                values[name] = _group_size(rule, tmap)
        return self.what.format(**values)

    def group_size(self, tmap: dict):
        """The call's group size where the kind has one (its ``group_size`` field), else None."""
        rules = [rule for _, rule in self.fields if rule[0] == "group_size"]
        return _group_size(rules[0], tmap) if rules else None


def _group_size(rule, tmap: dict) -> int:
    """``H * D`` of the rule's rows over the second size of its scales (the checks ensure it divides)."""
    r, s = tmap[rule[1]], tmap[rule[2]]
    return r.shape[1] * r.shape[2] // s.shape[1]


def _load() -> dict:
    with open(Path(__file__).with_name("binding.json"), encoding="utf-8") as f:
        return json.load(f)


def _tuples(rows):
    return tuple(tuple(r) for r in rows)


def _kinds(data: dict) -> dict:
    """binding.json's kinds as Kind objects; a kind with ``base`` extends its base's tensors and
    ``what``."""
    kinds = {}
    for name, k in data.items():
        if "base" in k:
            b = kinds[k["base"]]
            kinds[name] = Kind(b.family, b.names + tuple(k["tensors"]), b.free, b.options, b.typed, b.what + k["what"],
                               b.fields, b.checks, b.optional | set(k.get("optional", ())))
        else:
            kinds[name] = Kind(k["family"], k["tensors"], k["free"], k["options"], k["typed"], k["what"],
                               tuple((f[0], tuple(f[1:])) for f in k["fields"]), _tuples(k["checks"]),
                               k.get("optional", ()))
    return kinds


_DATA = _load()
KINDS = _kinds(_DATA["kinds"])

# The torch ops (torch.ops.mla_gen.*): mla_gen.ops defines them with these schemas.
SCHEMAS = {name: f"{name}({', '.join(a[0] for a in op['args'])}) -> {op['returns']}"
           for name, op in _DATA["ops"].items()}


def schema_args(name: str) -> tuple:
    """Op `name`'s schema arguments in order, as (type, name): ``Tensor! a`` gives ("Tensor!", "a"),
    ``SymInt? b=None`` ("SymInt?", "b"). The compiled op's table (setup.py) reads the types,
    mla_gen.ops the names."""
    return tuple(tuple(a[0].split("=")[0].split()) for a in _DATA["ops"][name]["args"])


class Op:
    """A torch op's binding: ``args``, per schema argument in order, ``("tensor", kind name)``,
    ``("free", name)`` or ``("option", key)``; ``options``, the select keys the op fixes
    (``{key: value}``); ``kinds``: the kind without and with the start locations (the second
    where either is given: both or neither, text ``both_or_neither``); ``allocated``: the kind's
    tensors the op allocates and returns (merge_states: output like the states' rows, the lse
    float32 [T, H] where the kernel has one, else text ``no_states_lse``)."""

    def __init__(self, args, kinds, options=(), allocated=()):
        self.args, self.kinds, self.options, self.allocated = tuple(args), tuple(kinds), dict(options), tuple(allocated)


OPS = {name: Op((tuple(a[1].split()) for a in op["args"]), (KINDS[k] for k in op["kinds"]), op.get("options", ()),
              op.get("allocated", ())) for name, op in _DATA["ops"].items()}


def op_renames(name: str) -> dict:
    """Op `name`'s tensors that its arguments name otherwise than the kernels' parameters:
    ``{kernel parameter: argument}``, e.g. merge_states's ``states`` is ``v``. The compiled op's
    table has them too (python/setup.py): its refusals name the op's arguments alike."""
    return {what: arg for (_, arg), a in zip(schema_args(name), _DATA["ops"][name]["args"])
            for role, what in [a[1].split()] if role == "tensor" and what != arg}


def _caller_names() -> dict:
    """Per kind (by name), its tensors that the op of that kind (and the function of the op's name,
    whose parameters are the op's arguments) calls otherwise (op_renames). _torch._call_as renames
    them in a refusal."""
    out: dict = {}
    for name, op in _DATA["ops"].items():
        for kind in op["kinds"]:
            out.setdefault(kind, {}).update(op_renames(name))
    return out


# The tensors each kind's functions and ops name otherwise than the kernel's parameters (the kinds
# without any: an empty dict).
CALLER_NAMES = _caller_names()

"""The one table of the torch layer, shared by the Python path (_plan, _torch, ops) and the
compiled op (python/csrc: setup.py writes this table into the header it compiles, mla_gen_ops.h):
which argument of each torch op binds which kernel parameter, what a call that no kernel serves
is called in its error, and the texts of the refusals the torch layer adds to the contract's.
Torch-free, so that the wheel build reads it without torch.

- ``TEXTS``: each refusal as a ``str.format`` template over named fields; rendered the same by
  both (shapes and strides as Python tuples, devices as torch prints them, dtypes ``torch.x``).
- ``Kind``: one way of calling a family: the kernel parameters its tensors bind (in call order),
  its free integers, its options (the manifest's ``select`` keys), the tensors whose element type
  selects the kernel, and ``what`` (with ``fields`` and ``checks``): how an error names a call.
- ``SCHEMAS`` and ``OPS``: the torch ops, and per op which of its arguments is which tensor,
  free integer or option of which kind.
"""

from __future__ import annotations

TEXTS = {
    "not_on_device": "{name} is on {device}; the kernels run on a CUDA device",
    "two_devices": "{name} is on {device}, {first} on {first_device}; all tensors must be on one device",
    "rank": "{name} must have {rank} dimensions, got shape {shape}",
    "param_rank": "{name} must have {rank} dimensions [{labels}], got shape {shape}",
    "layout": ("{name} has shape {shape} and strides {strides}; the kernel addresses it as [{want}] with strides "
               "{want_strides} (strides of size-1 dims do not matter)"),
    "no_kernel": ("no generated {family} kernel for {what} in {label}; add it to the spec ([[{family}]]) and "
                  "regenerate, or set MLA_GEN_KERNELS"),
    "groups": "{name} must be [T, H * D / G] for a group size G, got {shape} for H * D = {hd}",
    "both_or_neither": ("{given} given without {missing}: the empty-context mask needs both start locations "
                        "(int32 [B + 1] each), or neither"),
    # the contract's step 2 (mla_gen/contract.py), which the C launcher cannot check: it has no element types
    "elem": "{name} is {got}, the kernel takes {want}",
    "lse_layout": "lse_layout must be \"token_major\" or \"head_major\"",
    "no_states_lse": ("torch.ops.mla_gen.merge_states returns the merged lse: the kernel folder's merge_states "
                      "kernel for this call has no output lse (spec: output_lse = true); call "
                      "mla_gen.merge_states instead"),
}

LSE_LAYOUTS = ("token_major", "head_major")

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
    ``groups``: scales' second size divides ``H * D``)."""

    def __init__(self, family, names, free, options, typed, what, fields=(), checks=()):
        self.family, self.names, self.free, self.options = family, tuple(names), tuple(free), tuple(options)
        self.typed, self.what, self.fields, self.checks = tuple(typed), what, tuple(fields), tuple(checks)

    def with_options(self, options, what_suffix):
        """The same tensors under more select keys (e.g. FlashInfer's ``lse_base``)."""
        return Kind(self.family, self.names, self.free, options, self.typed, self.what + what_suffix, self.fields,
                    self.checks)

    def describe(self, tmap: dict, options: tuple) -> str:
        """The call as its error names it; raises TypeError/ValueError for what no kernel could
        mean (the checks)."""
        for check in self.checks:
            t = tmap[check[1]]
            if check[0] == "rank":
                _, _, name, rank = check
                if not hasattr(t, "dim"):
                    raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
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
                r, s = tmap[rule[1]], tmap[rule[2]]
                values[name] = r.shape[1] * r.shape[2] // s.shape[1]
        return self.what.format(**values)


_FREE = ("prefill_tokens_with_context",)
_START_LOCATIONS = ("query_start_loc", "context_start_loc")  # the fused mask's: [B + 1] gives num_requests
_LSE = ("lse_layout",)
_CTX_MASK = " with the empty-context mask (mask_empty_context = true)"

_PAIR_NAMES = ("output", "output_lse", "prefix_output", "prefix_lse", "suffix_output", "suffix_lse", "output_scale")
_PAIR_WHAT = "dtype={dtype}, head_size={head_size}, output={output}, lse_layout={lse_layout}"
_PAIR_FIELDS = (("dtype", ("dtype", "prefix_output")), ("head_size", ("size", "prefix_output", 2)),
                ("output", ("given", "output_scale", "fp8_e4m3", "same")), ("lse_layout", ("option", "lse_layout")))
_PAIR_CHECKS = (("rank", "prefix_output", "prefix_output", 3),)
# merge_attn_states, per-tensor FP8 included (options: (lse_layout,)), with the fused mask
PAIR = Kind("merge_attn_states", _PAIR_NAMES, _FREE, _LSE, ("prefix_output",), _PAIR_WHAT, _PAIR_FIELDS, _PAIR_CHECKS)
PAIR_CTX = Kind("merge_attn_states", _PAIR_NAMES + _START_LOCATIONS, _FREE, _LSE, ("prefix_output",),
                _PAIR_WHAT + _CTX_MASK, _PAIR_FIELDS, _PAIR_CHECKS)

_GROUP_NAMES = ("output", "output_scales", "output_lse", "prefix_output", "prefix_lse", "suffix_output", "suffix_lse")
_GROUP_WHAT = ("dtype={dtype}, head_size={head_size}, output = fp8_e4m3_group, group_size = {group_size}, "
               "ue8m0 = {ue8m0}, lse_layout={lse_layout}")
_GROUP_FIELDS = (("dtype", ("dtype", "prefix_output")), ("head_size", ("size", "prefix_output", 2)),
                 ("group_size", ("group_size", "prefix_output", "output_scales")), ("ue8m0", ("option", "ue8m0")),
                 ("lse_layout", ("option", "lse_layout")))
_GROUP_CHECKS = (("rank", "prefix_output", "prefix_output", 3), ("rank", "output_scales", "output_group_scales", 2),
                 ("groups", "prefix_output", "output_scales", "output_group_scales"))
# per-token-group FP8 (options: (ue8m0, lse_layout)), with the fused mask
GROUP = Kind("merge_attn_states", _GROUP_NAMES, _FREE, ("ue8m0",) + _LSE, ("prefix_output",), _GROUP_WHAT,
             _GROUP_FIELDS, _GROUP_CHECKS)
GROUP_CTX = Kind("merge_attn_states", _GROUP_NAMES + _START_LOCATIONS, _FREE, ("ue8m0",) + _LSE, ("prefix_output",),
                 _GROUP_WHAT + _CTX_MASK, _GROUP_FIELDS, _GROUP_CHECKS)

STATES = Kind("merge_states", ("output", "output_lse", "states", "states_lse"), (), (), ("states",),
              "dtype={dtype}, head_size={head_size} merging {num_states} states (no kernel with num_states = "
              "{num_states} or \"runtime\")",
              (("dtype", ("dtype", "states")), ("head_size", ("size", "states", 3)),
               ("num_states", ("size", "states", 1))), (("rank", "states", "v", 4),))
IN_PLACE = Kind("merge_state_in_place", ("state", "state_lse", "other", "other_lse", "mask"), (), _LSE, ("state",),
                "dtype={dtype}, head_size={head_size}, lse_layout={lse_layout}{mask}",
                (("dtype", ("dtype", "state")), ("head_size", ("size", "state", 2)),
                 ("lse_layout", ("option", "lse_layout")), ("mask", ("given", "mask", " and a mask", ""))),
                (("rank", "state", "v", 3),))
MASK = Kind("mask_empty_context_lse", ("lse",) + _START_LOCATIONS, (), _LSE, ("lse",), "lse_layout={lse_layout}",
            (("lse_layout", ("option", "lse_layout")),))

# The torch ops (torch.ops.mla_gen.*): mla_gen.ops defines them with these schemas.
SCHEMAS = {
    "merge_attn_states": (
        "merge_attn_states(Tensor! output, Tensor!? output_lse, Tensor prefix_output, Tensor prefix_lse, "
        "Tensor suffix_output, Tensor suffix_lse, SymInt? prefill_tokens_with_context=None, "
        "Tensor? output_scale=None, Tensor? query_start_loc=None, Tensor? context_start_loc=None) -> ()"),
    "merge_attn_states_fp8_group": (
        "merge_attn_states_fp8_group(Tensor! output, Tensor! output_group_scales, Tensor!? output_lse, "
        "Tensor prefix_output, Tensor prefix_lse, Tensor suffix_output, Tensor suffix_lse, "
        "SymInt? prefill_tokens_with_context=None, bool ue8m0=False, Tensor? query_start_loc=None, "
        "Tensor? context_start_loc=None) -> ()"),
    "merge_states": "merge_states(Tensor v, Tensor s) -> (Tensor, Tensor)",
    "merge_state_in_place": (
        "merge_state_in_place(Tensor(a!) v, Tensor(b!) s, Tensor v_other, Tensor s_other, Tensor? mask=None, "
        "str lse_layout=\"token_major\") -> ()"),
    "mask_empty_context_lse": (
        "mask_empty_context_lse(Tensor(a!) lse, Tensor query_start_loc, Tensor context_start_loc, "
        "str lse_layout=\"head_major\") -> ()"),
}


def schema_args(name: str) -> tuple:
    """Op `name`'s schema arguments in order, as (type, name): ``f(Tensor! a, SymInt? b=None) -> ()``
    gives (("Tensor!", "a"), ("SymInt?", "b")). The compiled op's table (setup.py) reads the
    types, mla_gen.ops the names."""
    schema = SCHEMAS[name]
    inside = schema[schema.index("(") + 1:schema.index(") ->")]
    return tuple(tuple(arg.split("=")[0].split()) for arg in inside.split(","))


class Op:
    """A torch op's binding: ``args``, per schema argument in order, ``("tensor", kind name)``,
    ``("free", name)`` or ``("option", key)``; ``options``, the select keys the op fixes
    (``{key: value}``); ``kinds``: the kind without and with the start locations (the second
    where either is given: both or neither, text ``both_or_neither``); ``allocated``: the kind's
    tensors the op allocates and returns (merge_states: output like the states' rows, the lse
    float32 [T, H] where the kernel has one, else text ``no_states_lse``)."""

    def __init__(self, args, kinds, options=(), allocated=()):
        self.args, self.kinds, self.options, self.allocated = tuple(args), tuple(kinds), dict(options), tuple(allocated)


def _tensors(*names):
    return tuple(("tensor", n) for n in names)


_THR = (("free", "prefill_tokens_with_context"),)
OPS = {
    "merge_attn_states": Op(_tensors("output", "output_lse", "prefix_output", "prefix_lse", "suffix_output",
                                     "suffix_lse") + _THR + _tensors("output_scale", "query_start_loc",
                                                                     "context_start_loc"),
                            (PAIR, PAIR_CTX), {"lse_layout": "head_major"}),
    "merge_attn_states_fp8_group": Op(_tensors("output", "output_scales", "output_lse", "prefix_output", "prefix_lse",
                                               "suffix_output", "suffix_lse") + _THR + (("option", "ue8m0"),)
                                      + _tensors("query_start_loc", "context_start_loc"),
                                      (GROUP, GROUP_CTX), {"lse_layout": "head_major"}),
    "merge_states": Op(_tensors("states", "states_lse"), (STATES,), allocated=("output", "output_lse")),
    "merge_state_in_place": Op(_tensors("state", "state_lse", "other", "other_lse", "mask") + (("option", "lse_layout"),),
                               (IN_PLACE,)),
    "mask_empty_context_lse": Op(_tensors("lse", "query_start_loc", "context_start_loc") + (("option", "lse_layout"),),
                                 (MASK,)),
}

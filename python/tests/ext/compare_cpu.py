"""Run by test_extension_cpu.py in a child process, with MLA_GEN_EXT_CPU=1 and MLA_GEN_LIBCUDA
naming a build of stub_driver.c: the compiled op (CPU tensors, the stand-in driver recording
each launch) and the Python path (CPU tensors, launches recorded as conftest's cpu_launch does)
take the same calls; each must launch the same kernel with the same grid and parameters, or
refuse with the same text. Then the compiled op's plans (one per layout, kept per thread): calls
after a call of the same layout (other pointers, another threshold, a misaligned or overlapping
buffer) and after one of another layout still agree, and a layout seen again makes no new plan.
Exits non-zero naming every difference."""

from __future__ import annotations

import ctypes
import os
import re
import sys

import torch

import mla_gen
from mla_gen import _cuda, _ext, _torch, ops

assert ops.compiled, f"the compiled op did not load: {_ext.reason}"
stub = ctypes.CDLL(os.environ["MLA_GEN_LIBCUDA"])


def compiled_call(args, op="merge_attn_states"):
    before = ctypes.c_int.in_dll(stub, "stub_launches").value
    try:
        getattr(torch.ops.mla_gen, op)(*args)
    except RuntimeError as e:
        return ("error", str(e).splitlines()[0])
    if ctypes.c_int.in_dll(stub, "stub_launches").value == before:
        return ("nothing",)
    kernel = ctypes.create_string_buffer(256)
    ctypes.memmove(kernel, ctypes.addressof(ctypes.c_char.in_dll(stub, "stub_kernel")), 255)
    grid = (ctypes.c_int * 2).in_dll(stub, "stub_grid")
    n = ctypes.c_int.in_dll(stub, "stub_nparams").value
    params = (ctypes.c_longlong * 32).in_dll(stub, "stub_params")
    return ("launch", kernel.value.decode(), (grid[0], grid[1]), [params[i] & (2**64 - 1) for i in range(n)])


class _FakeKernel:
    def function(self, device):
        return 0xF00


python_launches = []


def _record(launcher, values, gx, gy, stream):
    python_launches.append((launcher.name, (gx, gy), [int(v) & (2**64 - 1) for v in values]))


_torch._DEVICE_TYPE = "cpu"
_cuda.kernel = lambda folder, meta: _FakeKernel()
_cuda.primary_context = lambda device: 0xC0
_torch._stream = lambda device: 0
_cuda.launch = _record


def python_call(args, full=False, op="merge_attn_states"):
    """The Python path's launch; `full`: through its full check (no plan kept), which launches
    by the rule itself: the Python plans may launch a kernel the rule ranks below (_dense for a
    threshold of T after a plan made with a smaller one, where the rule picks _dense_nothr)."""
    if full:
        _torch._plans.clear()
        _torch._last_pair_op[:] = [None, None, None, None]
    before = len(python_launches)
    try:
        ops.IMPLS[op](*args)
    except (ValueError, TypeError) as e:
        return ("error", str(e).splitlines()[0])
    if len(python_launches) == before:
        return ("nothing",)
    name, grid, values = python_launches[-1]
    return ("launch", name, grid, values)


def case(T, H, D, dtype, *, lse=True, n=None, pad_head=0, pad_token=0, lse_tm=False, out=None, transform=None):
    g = torch.Generator().manual_seed(T * 131 + H * 7 + D)
    hs = D + pad_head
    ts = H * hs + pad_token

    def rows():
        buf = torch.randn(T * ts + 1, generator=g).to(dtype)
        return buf.as_strided((T, H, D), (ts, hs, 1))

    prefix, suffix = rows(), rows()
    output = rows() if out is None else out(T, H, D)
    plse = torch.randn(H, T, generator=g)
    slse = torch.randn(H, T, generator=g)
    if lse_tm:
        plse = torch.randn(T, H, generator=g)
    olse = torch.empty(H, T) if lse else None
    args = [output, olse, prefix, plse, suffix, slse, n, None, None, None]
    if transform:
        args = transform(args)
    return args


cases = {
    "dense bf16 d128": case(8, 4, 128, torch.bfloat16),
    "dense f16 d64, threshold 3": case(8, 4, 64, torch.float16, n=3),
    "f32 d576, no output lse": case(5, 3, 576, torch.float32, lse=False),
    "padded heads (v 128 in 192)": case(6, 2, 128, torch.bfloat16, pad_head=64),
    "padded tokens": case(6, 2, 96, torch.float16, pad_token=8),
    "one token one head": case(1, 1, 128, torch.bfloat16),
    "no tokens": case(0, 4, 128, torch.bfloat16),
    "large size-rule range": case(4096, 8, 64, torch.bfloat16),
    "small size-rule range": case(64, 4, 64, torch.bfloat16),
    "threshold above T": case(8, 4, 128, torch.bfloat16, n=9),
    "negative threshold": case(8, 4, 128, torch.bfloat16, n=-1),
    "no kernel for d100": case(4, 2, 100, torch.bfloat16),
    "suffix of another dtype": case(4, 2, 128, torch.bfloat16,
                                    transform=lambda a: a[:4] + [a[4].to(torch.float16)] + a[5:]),
    "output overlaps prefix": case(4, 2, 128, torch.bfloat16, transform=lambda a: [a[2]] + a[1:]),
    "lse token-major": case(8, 4, 128, torch.bfloat16, lse_tm=True),
    "output_scale without an fp8 kernel": case(4, 2, 128, torch.bfloat16,
                                               transform=lambda a: a[:7] + [torch.ones(1)] + a[8:]),
    "one start location": case(4, 2, 128, torch.bfloat16,
                               transform=lambda a: a[:8] + [torch.tensor([0, 4], dtype=torch.int32), None]),
    "start locations without a _ctxmask kernel": case(
        4, 2, 128, torch.bfloat16, transform=lambda a: a[:8] + [torch.tensor([0, 4], dtype=torch.int32)] * 2),
    "f16 lse": case(4, 2, 128, torch.bfloat16, transform=lambda a: a[:3] + [a[3].half()] + a[4:]),
    "output of two dims": case(4, 2, 128, torch.bfloat16, out=lambda T, H, D: torch.empty(T, H * D, dtype=torch.bfloat16)),
    "output of more tokens": case(4, 2, 128, torch.bfloat16,
                                  out=lambda T, H, D: torch.empty(T + 2, H, D, dtype=torch.bfloat16)),
    "output of another head size than prefix_output": case(
        4, 2, 128, torch.bfloat16, out=lambda T, H, D: torch.empty(T, H, 64, dtype=torch.bfloat16)),
    "misaligned output": case(4, 2, 128, torch.bfloat16,
                              out=lambda T, H, D: torch.empty(T * H * D + 1, dtype=torch.bfloat16)[1:].view(T, H, D)),
}

NO_KERNEL = re.compile(r"(no generated \w+ kernel for .*) in .*; add it to a spec")
failures = []


def compare(name, args, full=False, op="merge_attn_states"):
    c, p = compiled_call(args, op), python_call(args, full, op)
    if op == "merge_states":  # its outputs are allocated by each: their addresses differ
        c, p = (x[:3] + (x[3][2:],) if x[0] == "launch" else x for x in (c, p))
    if c[0] == "error" and p[0] == "error":
        # The same text, but where no kernel serves: each names its own folder.
        nc, np_ = NO_KERNEL.match(c[1]), NO_KERNEL.match(p[1])
        if c[1] != p[1] and not (nc and np_ and nc.group(1) == np_.group(1)):
            failures.append(f"{name}: compiled says {c[1]!r}, Python {p[1]!r}")
    elif c != p:
        failures.append(f"{name}: compiled {c}, Python {p}")
    print(f"{name}: {c[0]} {c[1] if len(c) > 1 else ''}")
    return c


for name, args in cases.items():
    compare(name, args)
    compare(f"{name}, again", args)  # its layout's plan, where the first call made one


def same_layout(args, **changes):
    """The call with some arguments replaced (by position name), its layout otherwise the same."""
    names = ["output", "output_lse", "prefix_output", "prefix_lse", "suffix_output", "suffix_lse",
             "prefill_tokens_with_context", "output_scale", "query_start_loc", "context_start_loc"]
    out = list(args)
    for k, v in changes.items():
        out[names.index(k)] = v
    return out


def shifted(t, elements):
    """A tensor of t's sizes and strides `elements` further into a buffer of its own."""
    buf = torch.zeros(t.numel() + 64, dtype=t.dtype)
    return buf.as_strided(t.shape, t.stride(), elements)


base = case(8, 4, 128, torch.bfloat16, n=3)
plans = _ext.plans()
sequence = {
    "plan: the prepared call": base,
    "plan: other buffers": same_layout(base, output=shifted(base[0], 8), prefix_lse=shifted(base[3], 1)),
    "plan: threshold T (the _nothr twin)": same_layout(base, prefill_tokens_with_context=8),
    "plan: threshold 0": same_layout(base, prefill_tokens_with_context=0),
    "plan: threshold above T": same_layout(base, prefill_tokens_with_context=9),
    "plan: negative threshold": same_layout(base, prefill_tokens_with_context=-1),
    "plan: misaligned output": same_layout(base, output=shifted(base[0], 1)),
    "plan: output is the prefix": same_layout(base, output=base[2]),
    "plan: output_lse is prefix_lse": same_layout(base, output_lse=base[3]),
    "plan: the prepared call again": base,
}
for name, args in sequence.items():
    compare(name, args, full=True)
if _ext.plans() != plans + 1:
    failures.append(f"calls of one layout made {_ext.plans() - plans} plans, not 1")
# Other layouts in between, then each again: the thread keeps its last few.
padded = case(8, 4, 128, torch.bfloat16, n=3, pad_token=8)  # layouts no call above had
others = {
    "layouts: threshold left out": same_layout(padded, prefill_tokens_with_context=None),
    "layouts: no output_lse": same_layout(padded, output_lse=None),
    "layouts: f16": case(8, 4, 128, torch.float16, n=3),
}
plans = _ext.plans()
planned = 0  # the layouts a kernel of the folder serves (f16's may have none)
for round_ in range(2):
    for name, args in others.items():
        planned += round_ == 0 and compare(f"{name} ({round_})", args)[0] != "error"
    compare(f"plan: the prepared call ({round_})", base)
if _ext.plans() != plans + planned:
    failures.append(f"four layouts called twice made {_ext.plans() - plans} plans, not {planned}")
# A bad call of a layout never planned makes none; the next good one does.
bad = case(6, 2, 128, torch.bfloat16, n=7)
plans = _ext.plans()
compare("new layout: refused", bad)
compare("new layout: refused again", bad)
compare("new layout: its good call", same_layout(bad, prefill_tokens_with_context=6))
if _ext.plans() != plans + 1:
    failures.append(f"a refused layout, then a good call, made {_ext.plans() - plans} plans, not 1")

# Every other op, from the same table: each launches what its Python implementation launches
# or both refuse with the same text (where the folder lacks the family: no kernel, each naming the
# call alike).
bf, i32 = torch.bfloat16, torch.int32
T, H, D = 8, 4, 128
g = torch.Generator().manual_seed(7)


def rnd(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


def locs(*v, dtype=i32):
    return torch.tensor(v, dtype=dtype)


def group(out=None, scales=None, ue8m0=False, qsl=None, csl=None):
    o = torch.empty(T, H, D, dtype=torch.float8_e4m3fn) if out is None else out
    sc = torch.empty(T, H * D // 64) if scales is None else scales
    return [o, sc, rnd(H, T), rnd(T, H, D, dtype=bf), rnd(H, T), rnd(T, H, D, dtype=bf), rnd(H, T), 5, ue8m0, qsl, csl]


def in_place(layout="head_major", mask=True, v=None, lse_t=False):
    lse = (lambda: rnd(T, H)) if lse_t else (lambda: rnd(H, T))
    m = torch.ones(T, dtype=torch.uint8) if mask else None
    return [rnd(T, H, D, dtype=bf) if v is None else v, lse(), rnd(T, H, D, dtype=bf), lse(), m, layout]


other_ops = {
    "merge_states": {
        "four states": [rnd(T, 4, H, D, dtype=bf), rnd(T, 4, H)],
        "three states (runtime K)": [rnd(T, 3, H, D, dtype=bf), rnd(T, 3, H)],
        "f16 states": [rnd(T, 4, H, D, dtype=torch.float16), rnd(T, 4, H)],
        "v of three dims": [rnd(T, H, D, dtype=bf), rnd(T, 4, H)],
        "f16 lse": [rnd(T, 4, H, D, dtype=bf), rnd(T, 4, H, dtype=torch.float16)],
        "lse transposed": [rnd(T, 4, H, D, dtype=bf), rnd(H, 4, T).permute(2, 1, 0)],
        "lse of more tokens": [rnd(T, 4, H, D, dtype=bf), rnd(T + 1, 4, H)],
    },
    "merge_state_in_place": {
        "head-major with a mask": in_place(),
        "head-major, no mask": in_place(mask=False),
        "token-major": in_place("token_major", lse_t=True),
        "another lse_layout": in_place("tokens"),
        "v of two dims": in_place(v=rnd(T, H * D, dtype=bf)),
        "lse [H, T] for token-major": in_place("token_major"),
        "mask of int32": in_place()[:4] + [torch.ones(T, dtype=i32), "head_major"],
        "other of more tokens": in_place()[:2] + [rnd(T + 1, H, D, dtype=bf), rnd(H, T + 1)] + in_place()[4:],
        # the op's argument names in the refusal (v, s, v_other), the overlap text's "other" kept
        "f16 s": (lambda a: a[:1] + [a[1].half()] + a[2:])(in_place()),
        "v is v_other": (lambda a: a[:2] + [a[0]] + a[3:])(in_place()),
    },
    "mask_empty_context_lse": {
        "head-major": [rnd(H, T), locs(0, 3, 8), locs(0, 0, 5), "head_major"],
        "token-major": [rnd(T, H), locs(0, 3, 8), locs(0, 0, 5), "token_major"],
        "int64 start locations": [rnd(H, T), locs(0, 3, 8), locs(0, 0, 5, dtype=torch.int64), "head_major"],
        "start locations of two dims": [rnd(H, T), locs(0, 3, 8).view(1, 3), locs(0, 0, 5), "head_major"],
        "f16 lse": [rnd(H, T, dtype=torch.float16), locs(0, 3, 8), locs(0, 0, 5), "head_major"],
        "start locations with no entry": [rnd(H, T), locs(), locs(), "head_major"],
    },
    "merge_attn_states_fp8_group": {
        "groups of 64": group(),
        "ue8m0": group(ue8m0=True),
        "scales of 7 groups": group(scales=torch.empty(T, 7)),
        "groups of 32 (no kernel has them)": group(scales=torch.empty(T, H * D // 32)),
        "scales column-major": group(scales=torch.empty(H * D // 64, T).t()),
        "with the start locations": group(qsl=locs(0, 3, 8), csl=locs(0, 0, 5)),
        "one start location": group(csl=locs(0, 0, 5)),
        "bf16 output": group(out=rnd(T, H, D, dtype=bf)),
        "f16 scales": group(scales=torch.empty(T, H * D // 64).half()),
        "prefix_lse [T, H]": (lambda a: a[:4] + [rnd(T, H)] + a[5:])(group()),
    },
    "merge_attn_states": {
        "the fused mask": case(T, H, D, bf, n=5, transform=lambda a: a[:8] + [locs(0, 3, 8), locs(0, 0, 5)]),
        "start locations of other lengths": case(
            T, H, D, bf, n=5, transform=lambda a: a[:8] + [locs(0, 3, 8), locs(0, 0, 5, 6)]),
        "f32 start locations": case(
            T, H, D, bf, n=5, transform=lambda a: a[:8] + [locs(0, 3, 8), locs(0, 0, 5, dtype=torch.float32)]),
        "start locations with no entry": case(T, H, D, bf, n=5, transform=lambda a: a[:8] + [locs(), locs()]),
        "lse [T, H] with the start locations": case(
            T, H, D, bf, n=5, lse_tm=True, transform=lambda a: a[:8] + [locs(0, 3, 8), locs(0, 0, 5)]),
    },
}
n_other = 0
for op, op_cases in other_ops.items():
    for name, args in op_cases.items():
        compare(f"{op}: {name}", args, op=op)
        compare(f"{op}: {name}, again", args, op=op)
        n_other += 2

if failures:
    sys.exit("\n".join(failures))
print(f"{2 * len(cases) + len(sequence) + 2 * (len(others) + 1) + 3 + n_other} cases agree "
      f"({_ext.build} build: {_ext.loaded.name})")

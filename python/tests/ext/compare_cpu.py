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
import sys

import torch

import mla_gen
from mla_gen import _cuda, _ext, _torch, ops

assert ops.compiled, f"the compiled op did not load: {_ext.reason}"
stub = ctypes.CDLL(os.environ["MLA_GEN_LIBCUDA"])


def compiled_call(args):
    before = ctypes.c_int.in_dll(stub, "stub_launches").value
    try:
        torch.ops.mla_gen.merge_attn_states(*args)
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


def python_call(args, full=False):
    """The Python path's launch; `full`: through its full check (no plan kept), which launches
    by the rule itself: the Python plans may launch a kernel the rule ranks below (_dense for a
    threshold of T after a plan made with a smaller one, where the rule picks _dense_nothr)."""
    if full:
        _torch._plans.clear()
        _torch._last_pair_op[:] = [None, None, None, None]
    before = len(python_launches)
    try:
        _torch.merge_attn_states_op(*args)
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
    "misaligned output": case(4, 2, 128, torch.bfloat16,
                              out=lambda T, H, D: torch.empty(T * H * D + 1, dtype=torch.bfloat16)[1:].view(T, H, D)),
}

NO_KERNEL = "no generated merge_attn_states kernel for "
failures = []


def compare(name, args, full=False):
    c, p = compiled_call(args), python_call(args, full)
    if c[0] == "error" and p[0] == "error":
        # The same text, but where no kernel serves: each names its own folder.
        if c[1] != p[1] and not (c[1].startswith(NO_KERNEL) and p[1].startswith(NO_KERNEL)):
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
others = {
    "layouts: threshold left out": same_layout(base, prefill_tokens_with_context=None),
    "layouts: no output_lse": same_layout(base, output_lse=None),
    "layouts: f16": case(8, 4, 128, torch.float16, n=3),
}
plans = _ext.plans()
for round_ in range(2):
    for name, args in others.items():
        compare(f"{name} ({round_})", args)
    compare(f"plan: the prepared call ({round_})", base)
if _ext.plans() != plans + len(others):
    failures.append(f"four layouts called twice made {_ext.plans() - plans} plans, not {len(others)}")
# A bad call of a layout never planned makes none; the next good one does.
bad = case(6, 2, 128, torch.bfloat16, n=7)
plans = _ext.plans()
compare("new layout: refused", bad)
compare("new layout: refused again", bad)
compare("new layout: its good call", same_layout(bad, prefill_tokens_with_context=6))
if _ext.plans() != plans + 1:
    failures.append(f"a refused layout, then a good call, made {_ext.plans() - plans} plans, not 1")

if failures:
    sys.exit("\n".join(failures))
print(f"{2 * len(cases) + len(sequence) + 2 * (len(others) + 1) + 3} cases agree")

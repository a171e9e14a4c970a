"""The torch layer: a call of a kind (mla_gen/binding.json: which tensors bind which kernel
parameters; the free integers; the options) finds the plan of its layouts (_plan: which kernel
serves, the check) and launches on torch's current stream (no device-to-host sync, so CUDA
graphs can capture it). Generic over the kinds: the public functions (functions.py, flashinfer.py,
sglang.py) say which kind a call is and pass its tensors in the kind's order.

Where a call finds its plan, fastest first:

- its entry point's slot ``[options, go, plan, folder]`` (``_slotted``): the previous call's
  plan, where the call has the same options and kernel folder and the plan's generated ``go``
  takes it (the same arguments given, the layout guard, the per-call checks; then it launches);
- the plan cache, by the call's kind, options, folder and layouts (``_lookup``): a few plans per
  layout, one per kernel the free integers' values launch (a threshold below T, equal to T);
- the full check (_plan.prepare), which makes the plan, or raises the error that names the problem.

Anything off on the way down reruns the full check, so every error is the full check's. The
plain merge_attn_states and its operator's Python implementation each have a slot, so that code
calling both with different layouts does not make each call look its plan up again.

Which calls come here (mla_gen/ops.py says the routes in one place): every plain function and
the FlashInfer, SGLang and vLLM APIs; the torch ops only where the compiled op (mla_gen._ext) is
absent. The plain merge_attn_states comes here even where the compiled op serves the op: on the
H200 its slot cost less per call than a compiled op with vLLM's launcher (run 137, 0.85x;
docs/PYTHON.md).
"""

from __future__ import annotations

import os
import re

import torch

from . import _cuda, _plan
from . import manifest as _m
from .contract import ArgumentError, plan_for

# $MLA_GEN_KERNELS as stored, for the slots' folder (only compared with itself): one C call
if _m._env_data is not None:
    _env_get, _ENV_KEY = _m._env_data.get, _m._env_key
else:  # pragma: no cover - an os.environ without _data
    _env_get, _ENV_KEY = (lambda key: _m.env_value()), None

_MAX_PLANS = 4096
# Tests without a GPU run the whole path on CPU tensors with the launch replaced (tests/conftest,
# bench/host_cost_stub.py): they set these two here.
_DEVICE_TYPE = "cuda"
_plans: dict = {}


def _stream(device: int) -> int:
    """torch's current stream on `device` (its CUstream as an int)."""
    return torch.cuda.current_stream(device).cuda_stream


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
if _raw_stream is not None:
    _stream = _raw_stream  # noqa: F811 - the same answer, one C call (each plan's fast path calls it)


# ---- finding a call's plan ----

def _prepare(kind, options, tensors, free):
    return _plan.prepare(kind, options, tensors, free, _DEVICE_TYPE, _stream)


def _launch(prep, values):
    if prep.launcher is not None:
        _cuda.launch(prep.launcher, values, prep.gx, prep.gy, _stream(prep.device))


# Plans one layout keeps for different values of its free integers: a threshold below T plans the
# `_dense` kernel, one equal to T its `_dense_nothr` twin, and each plan's fast path takes only
# the values of its kernel (without a second plan, every call of the other kind took the full
# check: a new plan per call after a first call with n = T).
_MAX_PLANS_PER_LAYOUT = 4


def _go(preps, kind, options, tensors, free):
    """A planned call: the first of its layout's plans whose per-call checks take it launches
    (prep.run); where none does, the full check (it raises the error that names the problem, or
    makes the plan of these values, kept beside the others, and launches). Returns the plan that
    served."""
    for prep in preps:
        if prep.run(*tensors, *free):  # a plan with nothing to launch still checks the free integers
            return prep
    prep, values = _prepare(kind, options, tensors, free)
    _plan.set_guard(prep, tensors)
    if len(preps) < _MAX_PLANS_PER_LAYOUT:
        preps.append(prep)
    _launch(prep, values)
    return prep


def _lookup(kind, options, tensors, free):
    """The plans of the call's layouts from the cache (a list, one per kernel its free integers'
    values launch); None after a call that had none (the full check, the plan kept, the launch)."""
    try:
        key = (kind, options, _m.env_value(), tuple([_plan.layout_key(t) for t in tensors]),
               tuple([v is None for v in free]))
        preps = _plans.get(key)
    except (AttributeError, TypeError):
        key = preps = None
    if preps is not None:
        return preps
    prep, values = _prepare(kind, options, tensors, free)
    if key is not None:
        _plan.set_guard(prep, tensors)
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = [prep]
    _launch(prep, values)
    return None


def _call(kind, options, tensors, free):
    """A call of an entry point without a slot: its plans by key, the per-call checks, the launch."""
    preps = _lookup(kind, options, tensors, free)
    if preps is not None:
        _go(preps, kind, options, tensors, free)


def renamed(error, api_names: dict):
    """`error` (a TypeError or ValueError of the torch layer) naming each kind's tensor in
    ``api_names`` (kind's name -> the caller's) by the caller's name: its text, and an
    ArgumentError's ``problem`` with it. The "no generated kernel" error names the spec's keys and
    stays. The compiled op renames its refusals alike (python/csrc/op_core.h, as_called)."""
    text = str(error)
    if not api_names or text.startswith("no generated"):
        return error
    # A name is a whole word, not after a dot (torch.ops.mla_gen.x), and not the English word of the
    # overlap text's "with no other argument".
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, api_names)) + r")(?!\w)(?! argument\b)")

    def swap(t):
        return pattern.sub(lambda m: api_names[m.group(1)], t)

    if isinstance(error, ArgumentError):
        problem = swap(error.problem)
        if problem != error.problem:
            error.problem = problem
            error.args = (f"{error.kernel}: {problem}",)
    else:
        new = swap(text)
        if new != text:
            error.args = (new,)
    return error


def _call_as(api_names: dict, kind, options, tensors, free):
    """_call for an entry point whose arguments have other names than the kind's tensors
    (FlashInfer's ``v_a``, ``s_a`` ...; merge_states's ``v``, ``s``; ``api_names``: kind's name ->
    the caller's): a refusal names the caller's arguments (``renamed``)."""
    try:
        _call(kind, options, tensors, free)
    except (TypeError, ValueError) as e:
        raise renamed(e, api_names)


def _miss(slot, slot_options, kind, options, tensors, free):
    """A call its slot's plan did not take: its layout's plans by key, with their guards renewed
    (the previous ones may have been made under other dispatch keys), the per-call checks and the
    launch; the plan that served goes into the slot."""
    preps = _lookup(kind, options, tensors, free)
    if preps is not None:
        for prep in preps:
            _plan.set_guard(prep, tensors)
        prep = _go(preps, kind, options, tensors, free)
        slot[:] = (slot_options, prep.go, prep, _env_get(_ENV_KEY))


def _slotted(slot, kind, options, tensors, free):
    """A call through an entry point's slot: the slot's plan where the call has the same options
    and kernel folder and the plan's `go` takes it (the same arguments given, the layout guard,
    the per-call checks; then it launches); else _miss."""
    last_options, go, _, last_folder = slot
    if options != last_options or _env_get(_ENV_KEY) != last_folder or not go(*tensors, *free):
        _miss(slot, options, kind, options, tensors, free)


# ---- the entry points' slots ----

# [options, go, plan, folder]: the plain merge_attn_states's, the operator's
# (torch.ops.mla_gen.merge_attn_states's Python implementation), the function's with the start
# locations (a plan per (T, B), reused while they stay). The plan stays at [2]: bench/host_cost.py
# reads it.
_last_pair = [None, None, None, None]
_last_pair_op = [None, None, None, None]
_last_ctx = [None, None, None, None]


def launch_kernel(kernel: str, args: dict, *, device: int | None = None) -> None:
    """Launch one kernel of the current folder by name (the scripts' way to time a given
    schedule): `args` by parameter name as ``check_args`` takes them, torch tensors standing for
    their buffers. Always the full check; on torch's current stream of `device` (default: the
    first tensor's device, else the current device). The tensors must be on one CUDA device, and
    `device`, where given, must be theirs. A kernel with a size rule or
    specializations launches the one they choose for the call's values, as every call does."""
    kf = _m.folder()
    meta = kf.kernel(kernel)
    plan = plan_for(kernel, meta)
    conv = {}
    named = []
    for name, a in args.items():
        if isinstance(a, torch.Tensor):
            named.append((name, a))
            a = _plan.buffer(a)
        conv[name] = a
    found, first = _plan.one_device(named, _DEVICE_TYPE)
    if found is not None:
        index = found.index or 0  # CPU tensors (tests): 0, as a plan's device
        if device is not None and device != index:
            raise ValueError(f"launch_kernel(device={device}): {first} is on {found}, as every tensor of the call; "
                             f"pass device={index}, or leave device out")
        device = index
    checked = plan.check(conv)
    meta, checked, _ = _plan.sized(kf, meta, plan, checked, conv)
    if checked.grid is None:
        return
    device = torch.cuda.current_device() if device is None or device < 0 else device
    _cuda.launch(_plan.make_launcher(kf, meta, checked, device), checked.values, checked.grid[0], checked.grid[1],
                 _stream(device))


def _forget_plans_after_fork():
    """In a forked child the parent's plans would launch the parent's functions: the child's
    first call plans again (and _cuda raises where the parent had used the driver)."""
    _plans.clear()
    for slot in (_last_pair, _last_pair_op, _last_ctx):
        slot[:] = (None, None, None, None)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_plans_after_fork)



"""Faults of the Python path on a real GPU and driver (test_faults_cpu.py has the rest, on the
stand-in driver): a truncated CUBIN (the case that segfaulted on 2026-12-04), an exhausted GPU at
a first call's load, a sticky context error (an illegal address) left by an earlier kernel, and
os.fork() after the first call. Each ends in a clear error or a correct result, never a crash or a
hang, and the process (or, after a sticky error, the test) goes on. Images come from the current
kernel folder (the installed package's, generated/, or $MLA_GEN_KERNELS)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU: the GPU fault suite (truncated CUBIN on a real driver, exhausted GPU, sticky "
                "context error, fork) did not run", allow_module_level=True)

import mla_gen  # noqa: E402
from mla_gen import _cuda, manifest  # noqa: E402

from conftest import launched  # noqa: E402
from faults import KERNEL, make_folder, run_child  # noqa: E402
from test_ops import close, inputs, reference  # noqa: E402

T, H, D, N = 64, 4, 128, 40


def _copy(tmp_path, monkeypatch, names=(KERNEL,)):
    """A fresh copy of the current folder's `names` (a new folder: its first call loads), as
    $MLA_GEN_KERNELS; returns the image the device loads for KERNEL's launched kernel."""
    source = Path(str(mla_gen.kernels_dir()))
    make_folder(tmp_path, names, source=source)
    monkeypatch.setenv("MLA_GEN_KERNELS", str(tmp_path))
    kf = manifest.folder()
    entry = manifest.pick_image(kf.kernel(launched(KERNEL, T, H, threshold=N)), _cuda.compute_capability(0))
    return tmp_path / entry["file"]


def _merge_and_check():
    p, pl, s, sl = inputs(T, H, D)
    out, out_lse = torch.empty_like(p), torch.empty_like(pl)
    mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, N)
    torch.cuda.synchronize()
    want, want_lse = reference(p, pl, s, sl, N)
    close(out, want, out_lse, want_lse)


def test_a_truncated_cubin_is_an_error_not_a_crash(tmp_path, monkeypatch):
    image = _copy(tmp_path, monkeypatch)
    good = image.read_bytes()
    image.write_bytes(good[: len(good) // 2])
    with pytest.raises(mla_gen.ImageError, match="truncated or padded"):
        _merge_and_check()
    image.write_bytes(good)
    _merge_and_check()


def test_an_exhausted_gpu_fails_the_first_load_cleanly_and_the_next_call_is_correct(tmp_path, monkeypatch):
    _copy(tmp_path, monkeypatch)
    p, pl, s, sl = inputs(T, H, D)
    out, out_lse = torch.empty_like(p), torch.empty_like(pl)
    hog, size = [], 1 << 30
    while size >= 1 << 16:
        try:
            hog.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError:
            size //= 2
    try:
        mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, N)
        torch.cuda.synchronize()
        outcome = "loaded and launched with the GPU full"
    except mla_gen.CudaError as e:  # out of memory, as the driver names it (the CPU suite checks the hint)
        outcome = f"refused: {e}"
    finally:
        del hog
        torch.cuda.empty_cache()
    print("exhausted GPU, first call:", outcome)
    if outcome.startswith("loaded"):
        want, want_lse = reference(p, pl, s, sl, N)
        close(out, want, out_lse, want_lse)
    _merge_and_check()


_STICKY = """
import torch, mla_gen
from mla_gen import _binding, _cuda, _plan, _torch, manifest
from test_ops import inputs
T, H, D = 64, 4, 128
p, pl, s, sl = inputs(T, H, D)
out = torch.empty_like(p)
p16, pl16, s16, sl16 = (t.half() if t.dtype == torch.bfloat16 else t.clone() for t in (p, pl, s, sl))
out16 = torch.empty_like(p16)
torch.cuda.synchronize()
# The bf16 kernel launched with its output at an unmapped address: an illegal address, sticky.
prep, values = _plan.prepare(_binding.KINDS["pair"], ("head_major",), (out, None, p, pl, s, sl, None), (None,), "cuda",
                             _torch._stream)
params = [q["name"] for q in manifest.folder().kernel(prep.name)["params"]]
values = list(values)
values[params.index("output")] = 1 << 47
_cuda.launch(prep.launcher, values, prep.gx, prep.gy, _torch._stream(0))
try:
    torch.cuda.synchronize()
    print("FAULT none")
except RuntimeError as e:
    print("FAULT", str(e).splitlines()[0])
for what, call in [("first call", lambda: mla_gen.merge_attn_states(out16, p16, pl16, s16, sl16)),
                   ("loaded kernel", lambda: mla_gen.merge_attn_states(out, p, pl, s, sl))]:
    try:
        call()
        print("RESULT", what, "no error")
    except mla_gen.CudaError as e:
        print("RESULT", what, "CudaError", e.code, "hint" if "left unusable by an earlier fault" in str(e) else "", e)
"""


def test_a_sticky_context_error_is_reported_by_the_next_calls_without_a_hang():
    r = run_child(_STICKY, {}, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAULT none" not in r.stdout, "the faulting launch did not fault: " + r.stdout
    results = [line for line in r.stdout.splitlines() if line.startswith("RESULT")]
    assert len(results) == 2, r.stdout + r.stderr
    for line in results:
        assert "CudaError" in line and " hint " in line, r.stdout


_FORK = """
import os, torch, mla_gen
from test_ops import close, inputs, reference
T, H, D, N = 64, 4, 128, 40
p, pl, s, sl = inputs(T, H, D)
out, out_lse = torch.empty_like(p), torch.empty_like(pl)
def call_and_check():
    mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, N)
    torch.cuda.synchronize()
    want, want_lse = reference(p, pl, s, sl, N)
    close(out, want, out_lse, want_lse)
call_and_check()
pid = os.fork()
if pid == 0:
    try:
        mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, N)
        code = 3
    except mla_gen.CudaError as e:
        code = 0 if "forked from one that had already used CUDA" in str(e) else 4
        print("child:", e, flush=True)
    except RuntimeError as e:  # torch's own refusal of CUDA in a forked child is as clear
        code = 0 if "fork" in str(e) else 5
        print("child (torch):", e, flush=True)
    os._exit(code)
_, status = os.waitpid(pid, 0)
call_and_check()
print("child exit", os.waitstatus_to_exitcode(status), "parent correct")
"""


def test_fork_after_the_first_call_gives_the_child_a_clear_error_and_the_parent_goes_on():
    r = run_child(_FORK, {}, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "child exit 0 parent correct" in r.stdout, r.stdout + r.stderr

"""The Python examples' kernel selections, replayed without a GPU against the package's kernels.

Each example runs as written, with three things swapped for the CPU: tensors asked for on
"cuda" are made on the CPU (a torch function mode), the flash attention of chunked_prefill.py is
computed in plain torch, and launches are recorded instead of run (the `cpu_launch` fixture:
every check and plan is real). A call that no kernel of the folder serves raises here as it
would on the GPU, so CI fails when an example's call finds nothing. Results are not compared:
nothing ran; the GPU smoke run (scripts/gpu-smoke.sh) runs the examples for real."""

import importlib.util
import runpy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.overrides import TorchFunctionMode  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class CudaOnCpu(TorchFunctionMode):
    """Factory calls that name a CUDA device make their tensor on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def cpu_flash(q, k, v, causal):
    """What chunked_prefill.flash returns ([L, H, D] output, [H, L] natural-log lse), on the CPU."""
    scores = torch.einsum("lhd,shd->hls", q.float(), k.float()) / q.shape[-1] ** 0.5
    if causal:
        keep = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).tril(k.shape[0] - q.shape[0])
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = scores.logsumexp(-1)
    out = torch.einsum("hls,shd->lhd", (scores - lse[..., None]).exp(), v.float())
    return out.to(q.dtype), lse


def test_snippet_selects_its_kernel(cpu_launch):
    with CudaOnCpu():
        runpy.run_path(str(EXAMPLES / "snippet.py"))
    kernels = {name for name, _, _ in cpu_launch.launches}
    assert len(cpu_launch.launches) == 4, cpu_launch.launches
    assert all(k.startswith("merge_attn_states_bf16_d128_thr_lse") for k in kernels), kernels


def test_chunked_prefill_selects_a_kernel_for_each_form(cpu_launch, monkeypatch):
    spec = importlib.util.spec_from_file_location("chunked_prefill", EXAMPLES / "chunked_prefill.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # defines the example; main() runs only as a script
    monkeypatch.setattr(example, "flash", cpu_flash)
    real_generator = torch.Generator
    monkeypatch.setattr(torch, "Generator", lambda device=None: real_generator())
    with CudaOnCpu():
        reqs = example.make()
        for form in (example.by_mask, example.by_threshold):
            before = len(cpu_launch.launches)
            out, ref, how = form(reqs)
            assert out.shape == ref.shape, form.__name__
            chosen = [name for name, _, _ in cpu_launch.launches[before:]]
            assert chosen and chosen[-1].startswith("merge_attn_states_bf16_d128"), (form.__name__, chosen)
            # The default serves the mask fused into the merge: by_mask takes it, by_threshold not.
            fused = form is example.by_mask
            assert ("_ctxmask" in chosen[-1]) == fused, (form.__name__, how, chosen)
            assert (how == "the fused mask") == fused, (form.__name__, how)

"""python/examples/chunked_prefill.py on the GPU: context attention and new-token causal attention
from torch's SDPA (flash), merged by mla-gen, equal to full causal attention within rounding; the
requests without context handled by the start locations and, in a second form, by the threshold.
python/gpu_checks.sh runs it with the default kernels (the threshold form; the start-location form
needs a `_ctxmask` or `mask_empty_context_lse` kernel) and with .device/ctxmask (both forms)."""

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU: the example runs SDPA's flash backend and the kernels", allow_module_level=True)

import mla_gen  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "chunked_prefill.py"


def test_chunked_prefill_merged_equals_full_attention():
    spec = importlib.util.spec_from_file_location("chunked_prefill", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    worst = example.main()  # asserts each form within rounding of full attention
    assert "by_threshold" in worst
    bf16 = torch.bfloat16
    if mla_gen.supports(bf16, 128, mask_empty_context=True):
        assert "by_mask" in worst, "the folder has the fused mask: the start-location form must run"

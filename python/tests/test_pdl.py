"""Programmatic dependent launch on a GPU (sm_90+): a kernel whose manifest says ``launch.pdl``
is launched right behind a producer that lets dependents start at once, sleeps, and only then
writes the merge's inputs; the merge must wait for it (griddepcontrol.wait) and read the data,
not the NaN that was there before.

Needs, from the environment (nothing is generated here):
- MLA_GEN_PDL_PRODUCER: PTX of ``pdl_late_writer(unsigned* dst, const unsigned* src, long long
  n_words, long long delay_ns)`` (tests/pdl/producer.cu, e.g. .device/pdl/producer.sm_90.ptx);
- MLA_GEN_PDL_KERNELS: a kernel folder generated with ``pdl = true``.
"""

import hashlib
import math
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)
PRODUCER, KERNELS = os.environ.get("MLA_GEN_PDL_PRODUCER"), os.environ.get("MLA_GEN_PDL_KERNELS")
if not PRODUCER or not KERNELS:
    pytest.skip("MLA_GEN_PDL_PRODUCER (the late writer's PTX) and MLA_GEN_PDL_KERNELS (a folder generated with "
                "pdl = true) are not both set", allow_module_level=True)
if torch.cuda.get_device_capability(0) < (9, 0):
    pytest.skip("programmatic dependent launch needs sm_90 or newer", allow_module_level=True)

import mla_gen  # noqa: E402
from mla_gen import _cuda, _torch, manifest  # noqa: E402

from test_ops import close, reference  # noqa: E402

BF16 = torch.bfloat16


def _producer(device: int):
    """The late writer, loaded as _cuda loads a kernel: from a one-file folder, its image checked
    against the size and sha256 given here."""
    path = Path(PRODUCER)
    data = path.read_bytes()
    folder = manifest.KernelFolder(path.parent, str(path.parent))
    folder._manifest = {}
    image = {"file": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    meta = {"name": "pdl_late_writer", "archs": [{"arch": "compute_90", "ptx": image}]}
    function = _cuda.Kernel(folder, meta).function(device)
    return _cuda.Launcher(function, _cuda.primary_context(device), 4, 256, 0, None, "pdl_late_writer", "QQqq")


def _views(buf, T, H, D):
    """prefix, suffix [T, H, D] bf16 and their lse [H, T] f32, packed in one uint8 buffer."""
    nb, nl = T * H * D * 2, H * T * 4
    p = buf[:nb].view(BF16).view(T, H, D)
    s = buf[nb:2 * nb].view(BF16).view(T, H, D)
    pl = buf[2 * nb:2 * nb + nl].view(torch.float32).view(H, T)
    sl = buf[2 * nb + nl:2 * nb + 2 * nl].view(torch.float32).view(H, T)
    return p, pl, s, sl


@pytest.mark.parametrize("delay_ns", [100_000, 0])
def test_pdl_merge_waits_for_the_late_writer(monkeypatch, delay_ns):
    monkeypatch.setenv("MLA_GEN_KERNELS", str(Path(KERNELS).resolve()))
    kern = manifest.select(manifest.folder(), "merge_attn_states",
                           *manifest.call("merge_attn_states", "bf16", 128, output_lse=True, threshold=True))
    assert kern is not None and manifest.launch_pdl(kern[0]), f"{KERNELS} has no pdl bf16 d128 merge with lse"
    T, H, D, n = 1024, 16, 128, 700
    size = 2 * T * H * D * 2 + 2 * H * T * 4
    g = torch.Generator(device="cuda").manual_seed(11)
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    for t in _views(src, T, H, D):
        t.uniform_(-4, 4, generator=g)
    inputs = torch.full((size,), 0xFF, dtype=torch.uint8, device="cuda")  # NaN in bf16 and f32 until written
    out = torch.full((T, H, D), math.nan, dtype=BF16, device="cuda")
    out_lse = torch.full((H, T), math.nan, device="cuda")
    p, pl, s, sl = _views(inputs, T, H, D)
    producer = _producer(0)
    stream = torch.cuda.current_stream().cuda_stream
    words = size // 4
    torch.cuda.synchronize()
    for _ in range(2):  # the first call plans; the second is the planned path
        inputs.fill_(0xFF)
        out.fill_(math.nan)
        _cuda.launch(producer, (inputs.data_ptr(), src.data_ptr(), words, delay_ns), -(-words // 256), 1, stream)
        mla_gen.merge_attn_states(out, p, pl, s, sl, out_lse, n)
        torch.cuda.synchronize()
        planned = [prep for preps in _torch._plans.values() for prep in preps
                   if prep.launcher is not None and prep.name == kern[0]["name"]]
        assert planned and all(prep.launcher.pdl for prep in planned), \
            "the merge went through cuLaunchKernelEx with programmatic stream serialization"
        assert torch.equal(inputs, src), "the producer wrote the inputs"
        assert not out.isnan().any() and not out_lse.isnan().any(), "the merge read the inputs before the producer"
        want, want_lse = reference(*_views(src, T, H, D), n)
        close(out, want, out_lse, want_lse)

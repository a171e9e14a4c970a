"""bench/flashinfer_check.py's choice of cases without a GPU: on the default's kernels (no f32
base-2 kernel) it leaves f32 out of the base-2 checks with one line, and still runs f32's sglang
check. The checks themselves are replaced by recorders."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import flashinfer_check  # noqa: E402


def test_the_defaults_f32_skips_the_base_2_checks_and_says_so(monkeypatch, capsys):
    monkeypatch.setenv("MLA_GEN_KERNELS", str(ROOT / "generated"))
    assert flashinfer_check.base2_dtypes() == {"f16", "bf16"}
    calls = []
    for name in ("check_merge_state", "check_in_place", "check_merge_states", "check_sglang"):
        monkeypatch.setattr(flashinfer_check, name, lambda *a, _n=name: calls.append((_n, a)))
    monkeypatch.setattr(sys, "argv", ["flashinfer_check.py"])
    monkeypatch.setattr(flashinfer_check, "results", [])
    monkeypatch.setattr(flashinfer_check, "failures", [])
    assert flashinfer_check.main() == 0

    def dtypes(check):
        # check_sglang takes the dtype first; the others take FlashInfer's library first.
        at = 0 if check == "check_sglang" else 1
        return {a[at] for n, a in calls if n == check}

    assert dtypes("check_merge_state") == {torch.float16, torch.bfloat16}
    assert dtypes("check_in_place") == dtypes("check_merge_states") == {torch.float16, torch.bfloat16}
    assert dtypes("check_sglang") == {torch.float16, torch.bfloat16, torch.float32}
    skipped = [line for line in capsys.readouterr().out.splitlines() if line.startswith("skipped")]
    assert len(skipped) == 1 and skipped[0].startswith("skipped f32 in the base-2 checks"), skipped

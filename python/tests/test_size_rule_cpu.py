"""Size rules in the Python package (docs/MANIFEST.md, "Size rules"), without a GPU: a kernel
whose manifest entry has ``launch.size_rule`` launches the range's kernel for calls with fewer
rows (tokens x heads), with that kernel's grid and the same parameter values; selection never
returns a range's kernel by itself. The folder is the contract table's kernels with a rule made
up here (conftest.rule_folder: bound 100 rows), so the test does not depend on specs/tuned.toml."""

import json

import pytest

torch = pytest.importorskip("torch")

import mla_gen  # noqa: E402
from mla_gen import _torch, manifest  # noqa: E402

from conftest import ALT, MAIN, rule_folder  # noqa: E402

H, D = 4, 128


@pytest.fixture
def rule_kernels(tmp_path, monkeypatch):
    return rule_folder(tmp_path, monkeypatch, twins=False)


def call(t, h=H):
    g = torch.Generator().manual_seed(t)
    p, s = torch.randn(t, h, D, generator=g).bfloat16(), torch.randn(t, h, D, generator=g).bfloat16()
    mla_gen.merge_attn_states(torch.empty(t, h, D, dtype=torch.bfloat16), p, torch.randn(h, t), s,
                              torch.randn(h, t), torch.empty(h, t), t // 2)


@pytest.mark.parametrize("t, kernel, grid", [
    (1, ALT, (1, 1)),            # 4 rows
    (24, ALT, (2, 1)),           # 96 rows: below the bound
    (25, MAIN, (25, 4)),         # 100 rows: the bound itself is the kernel's own
    (40, MAIN, (40, 4)),
])
def test_fewer_rows_launch_the_ranges_kernel(cpu_launch, rule_kernels, t, kernel, grid):
    call(t)
    name, values, got = cpu_launch.last()
    assert (name, got) == (kernel, grid)
    assert (values["num_tokens"], values["num_heads"], values["prefill_tokens_with_context"]) == (t, H, t // 2)


def test_planned_calls_keep_their_kernel_across_sizes(cpu_launch, rule_kernels):
    for t in (24, 40, 24, 40, 24):  # plans per layout: each size keeps its own kernel
        call(t)
    assert [n for n, _, _ in cpu_launch.launches] == [ALT, MAIN, ALT, MAIN, ALT]


def test_selection_never_returns_a_ranges_kernel(rule_kernels):
    hit = manifest.select(manifest.folder(), "merge_attn_states",
                          *manifest.call("merge_attn_states", torch.bfloat16, D, output_lse=True, threshold=True))
    assert hit[0]["name"] == MAIN
    assert mla_gen.supports(torch.bfloat16, D, output_lse=True)


def test_launch_kernel_by_name_applies_the_rule(cpu_launch, rule_kernels):
    t = 8
    args = {"output": torch.empty(t, H, D, dtype=torch.bfloat16), "output_lse": None,
            "prefix_output": torch.zeros(t, H, D, dtype=torch.bfloat16), "prefix_lse": torch.zeros(H, t),
            "suffix_output": torch.zeros(t, H, D, dtype=torch.bfloat16), "suffix_lse": torch.zeros(H, t),
            "num_tokens": t, "num_heads": H, "output_token_stride": H * D, "output_head_stride": D,
            "prefix_token_stride": H * D, "prefix_head_stride": D, "suffix_token_stride": H * D,
            "suffix_head_stride": D}
    _torch.launch_kernel(MAIN, args, device=0)
    assert cpu_launch.last()[0] == ALT
    _torch.launch_kernel(ALT, args, device=0)  # a range's kernel launches as itself
    assert cpu_launch.last()[0] == ALT


def test_a_ranges_kernel_past_its_grid_limit_leaves_the_call_to_the_kernel(cpu_launch, rule_kernels):
    m = json.loads((rule_kernels / "manifest.json").read_text())
    m["kernels"][0]["launch"]["grid_y"]["limit"] = 0  # the range's kernel can take no heads
    (rule_kernels / "manifest.json").write_text(json.dumps(m))
    call(2)
    assert cpu_launch.last()[0] == MAIN

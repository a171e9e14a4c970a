"""Specializations in the Python package (docs/MANIFEST.md, "Specializations"), without a GPU:
after the size rule chose a kernel, a call runs the first of its specializations whose integer
bounds and limits the call's values meet (the dense twin: dense strides, T x H below 2^31), with
that kernel's grid and the same values; else the kernel itself. Selection never returns a
specialization by itself. The folder is conftest.rule_folder's with the twins."""

import json

import pytest

torch = pytest.importorskip("torch")

import mla_gen  # noqa: E402
from mla_gen import ArgumentError, Buffer, _torch, manifest  # noqa: E402

from conftest import ALT, MAIN, rule_folder  # noqa: E402

H, D = 4, 128
BF16 = torch.bfloat16


@pytest.fixture
def twins(tmp_path, monkeypatch):
    return rule_folder(tmp_path, monkeypatch, twins=True)


def grid_of(kernel, t):
    launch = manifest.folder().kernel(kernel)["launch"]
    return -(-t // launch["grid_x"]["per_block"]), -(-H // launch["grid_y"]["per_block"])


def tensors(t, pad=0):
    """out, prefix, prefix lse, suffix, suffix lse, out lse; `pad` elements after each head of
    the prefix (its strides then are not the dense ones)."""
    prefix = torch.zeros(t, H, D + pad, dtype=BF16)[..., :D]
    return (torch.empty(t, H, D, dtype=BF16), prefix, torch.zeros(H, t), torch.zeros(t, H, D, dtype=BF16),
            torch.zeros(H, t), torch.empty(H, t))


def call(t, pad=0, n=None):
    out, p, pl, s, sl, ol = tensors(t, pad)
    mla_gen.merge_attn_states(out, p, pl, s, sl, ol, t // 2 if n is None else n)


@pytest.mark.parametrize("t, pad, kernel", [
    (40, 0, MAIN + "_dense"),   # 160 rows, dense: MAIN's twin
    (40, 8, MAIN),              # a padded prefix: MAIN
    (24, 0, ALT + "_dense"),    # 96 rows: the range's kernel, and then its own twin
    (24, 8, ALT),
    (1, 0, ALT + "_dense"),     # one token: its token stride passed as a packed one (any serves)
    (1, 8, ALT),
])
def test_dense_calls_run_the_twin_of_the_kernel_the_rule_chose(cpu_launch, twins, t, pad, kernel):
    call(t, pad)
    name, values, grid = cpu_launch.last()
    assert (name, grid) == (kernel, grid_of(kernel, t))
    assert (values["num_tokens"], values["num_heads"], values["prefill_tokens_with_context"]) == (t, H, t // 2)
    assert values["prefix_head_stride"] == D + pad


def test_planned_calls_keep_their_kernel_across_layouts(cpu_launch, twins):
    plans = mla_gen.stats()["plans"]
    for t, pad in ((40, 0), (40, 8), (40, 0), (24, 0), (40, 8)):
        call(t, pad)
    assert [n for n, _, _ in cpu_launch.launches] == [MAIN + "_dense", MAIN, MAIN + "_dense", ALT + "_dense", MAIN]
    assert mla_gen.stats()["plans"] == plans + 3, "one plan per layout, the kernel decided there"


def big_args(t, token_stride=H * D):
    """Buffers of t tokens with these strides: addresses and lengths only, nothing allocated."""
    args = {"num_tokens": t, "num_heads": H, "prefill_tokens_with_context": 0}
    for k, name in enumerate(("output", "prefix", "suffix")):
        args["output" if name == "output" else f"{name}_output"] = Buffer((k + 1) << 48, t * token_stride, "bf16")
        args[f"{name}_token_stride"], args[f"{name}_head_stride"] = token_stride, D
    for k, name in enumerate(("prefix_lse", "suffix_lse")):
        args[name] = Buffer((k + 5) << 48, H * t, "f32")
    return args


@pytest.mark.parametrize("t, kernel", [
    ((1 << 29) - 1, MAIN + "_dense"),  # T x H = 2^31 - 4
    (1 << 29, MAIN),                   # T x H = 2^31: past the twin's limit
])
def test_rows_past_32_bits_run_the_general_kernel(cpu_launch, twins, t, kernel):
    _torch.launch_kernel(MAIN, big_args(t), device=0)
    name, values, grid = cpu_launch.last()
    assert (name, grid) == (kernel, grid_of(kernel, t))
    assert values["num_tokens"] == t


def test_a_direct_launch_of_a_twin_gets_its_own_check(cpu_launch, twins):
    with pytest.raises(ArgumentError, match=r"num_tokens\*num_heads = 2147483648 exceeds 2147483647"):
        _torch.launch_kernel(MAIN + "_dense", big_args(1 << 29), device=0)
    with pytest.raises(ArgumentError, match=r"output_token_stride = 520 exceeds its maximum num_heads\*128 = 512"):
        _torch.launch_kernel(MAIN + "_dense", big_args(8, token_stride=520), device=0)
    assert not cpu_launch.launches


def test_selection_never_returns_a_specialization(twins):
    hit = manifest.select(manifest.folder(), "merge_attn_states",
                          *manifest.call("merge_attn_states", BF16, D, output_lse=True, threshold=True))
    assert hit == (manifest.folder().kernel(MAIN), True)
    assert mla_gen.supports(BF16, D, output_lse=True, threshold=True)
    assert set(mla_gen.available_kernels()) == {MAIN, ALT, MAIN + "_dense", ALT + "_dense"}


def test_a_limit_over_a_free_integer_is_decided_per_call(cpu_launch, twins):
    """A made-up twin whose limit reads prefill_tokens_with_context: one layout's plan, and each
    call chooses with its own value."""
    m = json.loads((twins / "manifest.json").read_text())
    dense = next(k for k in m["kernels"] if k["name"] == MAIN + "_dense")
    dense["limits"].append({"expr": "prefill_tokens_with_context", "max": 10, "why": "made up"})
    (twins / "manifest.json").write_text(json.dumps(m))
    for n in (5, 20, 10, 11, 0):
        call(40, n=n)
    assert [(k, v["prefill_tokens_with_context"]) for k, v, _ in cpu_launch.launches] == [
        (MAIN + "_dense", 5), (MAIN, 20), (MAIN + "_dense", 10), (MAIN, 11), (MAIN + "_dense", 0)]


def test_a_twin_bounded_from_below_in_tokens_is_decided_per_call(cpu_launch, twins):
    """A twin whose num_tokens bound has a minimum, as the `_flat` twins of outputs in the inputs'
    dtype have (128 blocks' rows): each call's token count chooses."""
    m = json.loads((twins / "manifest.json").read_text())
    dense = next(k for k in m["kernels"] if k["name"] == MAIN + "_dense")
    next(p for p in dense["params"] if p["name"] == "num_tokens")["bounds"]["min"] = "45"
    (twins / "manifest.json").write_text(json.dumps(m))
    for t in (50, 40, 45, 44, 60, 40, 50):  # 160-240 rows: MAIN's range of the size rule
        call(t)
    assert [(k, v["num_tokens"]) for k, v, _ in cpu_launch.launches] == [
        (MAIN + "_dense", 50), (MAIN, 40), (MAIN + "_dense", 45), (MAIN, 44), (MAIN + "_dense", 60),
        (MAIN, 40), (MAIN + "_dense", 50)]

"""The default kernels serve every engine call (issue #34): the call table as data, one row per
API call shape, each row made as a call of the package's public API against the shipped kernel
folder (the installed package's kernels/manifest.json, else a checkout's generated/manifest.json;
$MLA_GEN_KERNELS is ignored here). On the CPU the call runs the package's own selection, checks
and plan with the launch recorded (conftest's `cpu_launch`), so a row no kernel serves raises the
"no generated ... kernel" error a GPU call would, and a row served by another kernel than the
table names fails. test_coverage_gpu.py runs the same rows on a GPU against float64.

The table (specs/default.toml says which block serves which rows): vLLM's merge_attn_states
through mla_gen.vllm.patch(), mla_gen.merge_attn_states and its torch op (f16/bf16/f32, head
sizes 64-576 with 80 and 112, threshold given or not, output lse or not, the inputs' dtype /
per-tensor FP8 / per-token-group FP8 in groups of 128 and 64 with UE8M0 on and off, the fused
empty-context mask on and off); SGLang's merge_state_v2; FlashInfer's merge_state,
merge_state_in_place (mask or not) and merge_states (1-16 states); mla_gen.merge_states (1-16
states) and merge_state_in_place (both lse layouts, mask or not); mask_empty_context_lse."""

from typing import NamedTuple

import pytest

torch = pytest.importorskip("torch")

import mla_gen  # noqa: E402
import mla_gen.vllm as mv  # noqa: E402
from mla_gen import flashinfer, manifest, ops, sglang  # noqa: E402

DTYPES = ("f16", "bf16", "f32")
HALF = ("f16", "bf16")  # FlashInfer's merge functions take these
HEADS = (64, 96, 128, 192, 256, 512, 576)
VLLM_HEADS = (64, 80, 96, 112, 128, 192, 256, 512, 576)  # 80 and 112: vLLM's merge_attn_states only
GROUPS = (128, 64)  # vLLM's quant_group_size: 128 block FP8 (DeepSeek-V3, Qwen3 FP8), 64
STATES = tuple(range(1, 17))
FIXED_STATES = (1, 2, 3, 4, 5, 8)  # K-way kernels with K fixed at compile time (block 9)
VLLM_ENTRIES = ("vllm.patch", "mla_gen.merge_attn_states", "torch.ops.mla_gen.merge_attn_states")
TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
# Sizes of every call: T tokens (n of them with context where a threshold is given), H heads,
# three requests for the fused mask, the first and last without context.
T, H, N = 8, 4, 5
QUERY_START, CONTEXT_START = [0, 3, 5, 8], [0, 0, 4, 4]


class Row(NamedTuple):
    """One call shape: the entry point, the inputs' dtype and head size, and its options."""

    api: str
    dtype: str
    head_size: int
    output: str = "same"  # merge_attn_states: "same", "fp8" (output_scale), "fp8_group" (output_block_scale)
    group_size: int = 0
    ue8m0: bool = False
    ctxmask: bool = False  # the start locations given: the empty-context mask fused in
    threshold: bool = False  # prefill_tokens_with_context = N given
    output_lse: bool = True
    lse_layout: str = "head_major"
    mask: bool = False  # merge_state_in_place's token mask given
    num_states: int = 0


def group_fits(dtype, head_size, group):
    """Where the spec can build a group FP8 kernel: the group divides the row and its lanes sit
    in one warp (not f32 d576 in groups of 64: GAPS)."""
    return head_size % group == 0 and (dtype, head_size, group) != ("f32", 576, 64)


def vllm_rows():
    for api in VLLM_ENTRIES:
        for dt in DTYPES:
            for d in VLLM_HEADS:
                outputs = [("same", 0), ("fp8", 0)] + [("fp8_group", g) for g in GROUPS if group_fits(dt, d, g)]
                for output, g in outputs:
                    for ue8m0 in ((False, True) if g else (False,)):
                        for ctxmask in (False, True):
                            for threshold in (False, True):
                                for lse in (False, True):
                                    yield Row(api, dt, d, output, g, ue8m0, ctxmask, threshold, lse)


def other_rows():
    for dt in DTYPES:
        for d in HEADS:
            yield Row("sglang.merge_state_v2", dt, d, lse_layout="token_major")
            for k in STATES:
                yield Row("mla_gen.merge_states", dt, d, lse_layout="token_major", num_states=k)
            for layout in ("head_major", "token_major"):
                for mask in (False, True):
                    yield Row("mla_gen.merge_state_in_place", dt, d, lse_layout=layout, mask=mask)
    for dt in HALF:
        for d in HEADS:
            yield Row("flashinfer.merge_state", dt, d, lse_layout="token_major")
            for mask in (False, True):
                yield Row("flashinfer.merge_state_in_place", dt, d, lse_layout="token_major", mask=mask)
            for k in STATES:
                yield Row("flashinfer.merge_states", dt, d, lse_layout="token_major", num_states=k)
    for layout in ("head_major", "token_major"):
        yield Row("mla_gen.mask_empty_context_lse", "f32", 1, lse_layout=layout)


ROWS = list(vllm_rows()) + list(other_rows())
# Calls engines make that the default kernels do not serve, and why (the test checks they still
# do not: a kernel added for one moves it into ROWS).
GAPS = [(Row(api, "f32", 576, "fp8_group", 64, ue8m0, ctxmask, True), "a group of 64 f32 lanes does not sit in "
         "one warp of a d576 row (the spec refuses it); groups of 16 and 32 would")
        for api in VLLM_ENTRIES for ue8m0 in (False, True) for ctxmask in (False, True)]


def expected_kernel(row):
    """The kernel the table says serves the row (the one callers name, before size rules and
    specializations); every row launches one (merge_states of one state too: a kernel that
    copies, K = 1 fixed for f16/bf16, runtime K for f32)."""
    dt, d = row.dtype, row.head_size
    tm = "_tm" if row.lse_layout == "token_major" else ""
    if row.api in VLLM_ENTRIES:
        out = {"same": "", "fp8": "_fp8", "fp8_group": f"_fp8g{row.group_size}"}[row.output]
        return (f"merge_attn_states_{dt}_d{d}_thr_lse" + ("_ctxmask" if row.ctxmask else "") + out
                + ("_ue8m0" if row.ue8m0 else ""))
    if row.api == "sglang.merge_state_v2":
        return f"merge_attn_states_{dt}_d{d}_lse_tm"
    if row.api == "flashinfer.merge_state":
        return f"merge_attn_states_{dt}_d{d}_lse_tm_base2"
    if row.api in ("mla_gen.merge_states", "flashinfer.merge_states"):
        # K fixed at compile time where block 9 has it (f16/bf16), else the runtime-K kernel;
        # FlashInfer's K = 1 too: the runtime-K kernel's copy, one launch (T > 1)
        k = f"k{row.num_states}" if row.num_states in FIXED_STATES and row.dtype in HALF else "kvar"
        return f"merge_states_{dt}_d{d}_{k}_lse" + ("_base2" if row.api.startswith("flashinfer") else "")
    if row.api == "mla_gen.merge_state_in_place":
        return f"merge_state_in_place_{dt}_d{d}" + ("_mask" if row.mask else "") + tm
    if row.api == "flashinfer.merge_state_in_place":
        return f"merge_state_in_place_{dt}_d{d}" + ("_mask" if row.mask else "") + "_tm_base2"
    if row.api == "mla_gen.mask_empty_context_lse":
        return "mask_empty_context_lse" + tm
    raise ValueError(row.api)


class HandedBack(Exception):
    """mla_gen.vllm's patched dispatcher gave the call to vLLM's own (no kernel, or refused)."""


def _not_vllms(*args, **kwargs):
    raise HandedBack("mla_gen.vllm handed the call back to vLLM's dispatcher")


def _op(name, device):
    """torch.ops.mla_gen.<name>: through the dispatcher on a GPU (the compiled op where the
    package has it), its Python implementation on the CPU (the op is registered for CUDA)."""
    return getattr(torch.ops.mla_gen, name) if device.type == "cuda" else ops.IMPLS[name]


def _lse(layout, device, g, tokens=T):
    shape = (tokens, H) if layout == "token_major" else (H, tokens)
    lse = torch.randn(shape, generator=g, device=device) * 4
    (lse[0] if layout == "token_major" else lse[:, 0]).fill_(-float("inf"))  # token 0 without keys
    return lse


def make_call(row, device, seed=0):
    """Make `row`'s call on `device`; returns its tensors by name (inputs and outputs; "result" for
    what the API returned)."""
    g = torch.Generator(device=device).manual_seed(seed)
    dt, d = TORCH_DTYPES[row.dtype], row.head_size
    x = {}

    def rows(*shape):
        return torch.randn(shape, generator=g, device=device).to(dt)

    if row.api == "mla_gen.mask_empty_context_lse":
        x.update(lse=_lse(row.lse_layout, device, g), query_start_loc=_ints(QUERY_START, device),
                 context_start_loc=_ints(CONTEXT_START, device))
        x["lse_before"] = x["lse"].clone()
        mla_gen.mask_empty_context_lse(x["lse"], x["query_start_loc"], x["context_start_loc"],
                                       lse_layout=row.lse_layout)
        return x
    if row.num_states:
        k = row.num_states
        x.update(v=rows(T, k, H, d), s=torch.randn(T, k, H, generator=g, device=device) * 4)
        x["s"][0, :, 0] = -float("inf")  # a row without keys in any state
        fn = mla_gen.merge_states if row.api == "mla_gen.merge_states" else flashinfer.merge_states
        x["result"] = fn(x["v"], x["s"])
        return x
    if row.api.endswith("merge_state_in_place"):
        x.update(v=rows(T, H, d), s=_lse(row.lse_layout, device, g), v_other=rows(T, H, d),
                 s_other=_lse(row.lse_layout, device, g))
        x["mask"] = torch.arange(T, device=device) % 3 != 1 if row.mask else None
        x["v_before"], x["s_before"] = x["v"].clone(), x["s"].clone()
        if row.api.startswith("flashinfer"):
            flashinfer.merge_state_in_place(x["v"], x["s"], x["v_other"], x["s_other"], x["mask"])
        else:
            mla_gen.merge_state_in_place(x["v"], x["s"], x["v_other"], x["s_other"], x["mask"],
                                         lse_layout=row.lse_layout)
        return x
    x.update(prefix=rows(T, H, d), prefix_lse=_lse(row.lse_layout, device, g), suffix=rows(T, H, d),
             suffix_lse=_lse(row.lse_layout, device, g))
    if row.api in ("sglang.merge_state_v2", "flashinfer.merge_state"):
        fn = sglang.merge_state_v2 if row.api.startswith("sglang") else flashinfer.merge_state
        x["result"] = fn(x["prefix"], x["prefix_lse"], x["suffix"], x["suffix_lse"])
        return x
    _vllm_call(row, device, g, x)
    return x


def _ints(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


def _vllm_call(row, device, g, x):
    """vLLM's merge_attn_states through `row.api`, in vLLM's arguments (and mla-gen's for the
    fused mask)."""
    fp8 = row.output != "same"
    x["output"] = torch.empty(T, H, row.head_size, device=device,
                              dtype=torch.float8_e4m3fn if fp8 else TORCH_DTYPES[row.dtype])
    x["output_lse"] = torch.empty_like(x["prefix_lse"]) if row.output_lse else None
    n = N if row.threshold else None
    scale = torch.rand((1,), generator=g, device=device) + 0.01 if row.output == "fp8" else None
    scales = (torch.empty(T, H * row.head_size // row.group_size, device=device)
              if row.output == "fp8_group" else None)
    x.update(n=n, output_scale=scale, output_scales=scales)
    locations = {}
    if row.ctxmask:
        locations = {"query_start_loc": _ints(QUERY_START, device), "context_start_loc": _ints(CONTEXT_START, device)}
        x.update(locations)
    ins = (x["prefix"], x["prefix_lse"], x["suffix"], x["suffix_lse"])
    out, out_lse = x["output"], x["output_lse"]
    if row.api == "vllm.patch":
        dispatch = mv._make_wrapper(_not_vllms, strict=True)
        if scales is not None:
            dispatch(out, *ins, out_lse, n, None, scales, row.group_size, row.ue8m0, **locations)
        else:
            dispatch(out, *ins, out_lse, n, scale, **locations)
    elif row.api == "mla_gen.merge_attn_states":
        group = {"output_group_scales": scales, "ue8m0": row.ue8m0} if scales is not None else {}
        mla_gen.merge_attn_states(out, *ins, out_lse, n, scale, **group, **locations)
    elif scales is not None:
        _op("merge_attn_states_fp8_group", device)(out, scales, out_lse, *ins, n, row.ue8m0,
                                                    locations.get("query_start_loc"),
                                                    locations.get("context_start_loc"))
    else:
        _op("merge_attn_states", device)(out, out_lse, *ins, n, scale, locations.get("query_start_loc"),
                                         locations.get("context_start_loc"))


# ---- the CPU test: every row selects the kernel the table names, in the shipped folder ----


@pytest.fixture
def shipped(monkeypatch, cpu_launch):
    """The shipped kernel folder (package or checkout), launches recorded, CPU tensors routed by
    mla_gen.vllm as if on the GPU."""
    monkeypatch.delenv(manifest.ENV, raising=False)
    monkeypatch.setattr(mv, "_on_cuda", lambda t: t.device.type == "cpu")
    monkeypatch.setattr(mv, "_routes", {})
    kf = manifest.folder()
    assert kf.origin in ("package", "source"), kf.label
    return cpu_launch


APIS = sorted({r.api for r in ROWS})


@pytest.mark.parametrize("api", APIS)
def test_every_row_is_served_by_the_kernel_the_table_names(shipped, api):
    from conftest import launched

    failures = []
    rows = [r for r in ROWS if r.api == api]
    for row in rows:
        before = len(shipped.launches)
        want = expected_kernel(row)
        try:
            make_call(row, torch.device("cpu"))
        except (ValueError, TypeError, HandedBack) as e:
            failures.append(f"{row}: {type(e).__name__}: {e}")
            continue
        got = [name for name, _, _ in shipped.launches[before:]]
        n = N if row.threshold else None
        expect = launched(want, T, H, threshold=n) if want.startswith("merge_attn_states") else want
        if got != [expect]:
            failures.append(f"{row}: expected {expect} (named {want}), launched {got}")
    assert not failures, f"{len(failures)} of {len(rows)} rows:\n" + "\n".join(failures[:40])


def test_the_table_covers_what_issue_34_lists():
    """The table's extent, so that a row lost from a generator above shows here."""
    vllm = [r for r in ROWS if r.api == "vllm.patch"]
    assert {r.head_size for r in vllm} == set(VLLM_HEADS)
    assert {(r.output, r.group_size, r.ue8m0) for r in vllm} == {
        ("same", 0, False), ("fp8", 0, False), ("fp8_group", 128, False), ("fp8_group", 128, True),
        ("fp8_group", 64, False), ("fp8_group", 64, True)}
    assert {(r.ctxmask, r.threshold, r.output_lse) for r in vllm} == {
        (a, b, c) for a in (False, True) for b in (False, True) for c in (False, True)}
    for api in ("mla_gen.merge_states", "flashinfer.merge_states"):
        assert {r.num_states for r in ROWS if r.api == api} == set(STATES)
    assert {r.head_size for r in ROWS if r.api == "flashinfer.merge_state"} == set(HEADS)
    assert {(r.lse_layout, r.mask) for r in ROWS if r.api == "mla_gen.merge_state_in_place"} == {
        (a, b) for a in ("head_major", "token_major") for b in (False, True)}
    # per vLLM entry: 27 (dtype, head size) x 2 outputs + 26 (dtype, head size, group) x 2 ue8m0, x 8
    assert len(ROWS) == 3 * (27 * 2 * 8 + 26 * 2 * 8) + 3 * 7 * (1 + 16 + 4) + 2 * 7 * (1 + 2 + 16) + 2


def test_the_known_gaps_are_still_gaps(shipped):
    for row, why in GAPS:
        assert not mla_gen.supports(row.dtype, row.head_size, output="fp8_e4m3_group", group_size=row.group_size,
                                    ue8m0=row.ue8m0, threshold=True, mask_empty_context=row.ctxmask), (row, why)
        with pytest.raises((ValueError, HandedBack), match="no generated merge_attn_states kernel|handed the call"):
            make_call(row, torch.device("cpu"))


def test_supports_says_no_to_what_no_kernel_serves(shipped):
    """A dispatcher asks supports() first: a group size that does not divide the head (its one-head
    probe would land on a wider group's kernel), no states, or an output kind it does not know is
    never a yes."""
    bf16 = torch.bfloat16
    assert mla_gen.supports(bf16, 128, output="fp8_e4m3_group", group_size=128)
    assert mla_gen.supports(bf16, 128, output="fp8_e4m3_group", group_size=64)
    for g in (96, 100, 0, None):
        assert not mla_gen.supports(bf16, 128, output="fp8_e4m3_group", group_size=g), g
    assert mla_gen.supports(bf16, 128, family="merge_states", num_states=1)
    assert not mla_gen.supports(bf16, 128, family="merge_states", num_states=0)
    for kind in ("fp8_e5m2", "fp9"):
        with pytest.raises(ValueError, match=f"unknown output '{kind}'"):
            mla_gen.supports(bf16, 128, output=kind)

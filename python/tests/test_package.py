"""The package without a GPU: version, kernel folder and supports() from the manifest alone
(nothing loaded), op registration, schemas, and the fake implementations on meta tensors."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mla_gen
from mla_gen import manifest

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_cargos():
    cargo = ROOT / "Cargo.toml"
    if not cargo.is_file():
        pytest.skip("not in a checkout")
    want = re.search(r'^version = "([^"]+)"', cargo.read_text(), re.M).group(1)
    assert mla_gen.__version__ == want


def test_installed_package_is_what_runs():
    if not os.environ.get("MLA_GEN_EXPECT_INSTALLED"):
        pytest.skip("set by .ci/python.sh")
    assert "site-packages" in mla_gen.__file__
    assert "installed package" in manifest.folder().label


def test_supports_answers_from_the_manifest_without_the_driver(monkeypatch):
    import torch
    from mla_gen import _cuda

    def no_driver(*args, **kwargs):
        raise AssertionError("supports() reached the driver")

    # Every way into libcuda fails the test: supports() must answer from the manifest alone.
    for name in ("lib", "kernel", "primary_context", "launch"):
        monkeypatch.setattr(_cuda, name, no_driver)
    assert mla_gen.supports(torch.bfloat16, 128, output_lse=True, threshold=True)
    assert mla_gen.supports("f16", 576)
    assert not mla_gen.supports(torch.bfloat16, 100)
    assert mla_gen.supports(torch.bfloat16, 128, output="fp8_e4m3")
    assert mla_gen.supports(torch.bfloat16, 128, output="fp8_e4m3_group", group_size=128)
    assert not mla_gen.supports(torch.bfloat16, 128, output="fp8_e4m3_group", group_size=32)
    assert mla_gen.supports(torch.bfloat16, 128, family="merge_states", num_states=4, output_lse=True)
    assert not mla_gen.supports(torch.bfloat16, 100, family="merge_states", num_states=4)
    # Any select option by its manifest name: the base-2 kernels (FlashInfer's API is f16/bf16).
    assert mla_gen.supports(torch.bfloat16, 128, family="merge_states", lse_base="2")
    assert not mla_gen.supports(torch.float32, 128, family="merge_states", lse_base="2")
    assert mla_gen.supports(torch.float32, 128, family="merge_states")
    assert mla_gen.supports(torch.float16, 576, lse_layout="token_major", lse_base="2", output_lse=True)
    assert not mla_gen.supports(torch.float16, 576, lse_layout="token_major", lse_base="3")
    # (Whether libcuda is open here depends on the tests before this one; a fresh process checks
    # that supports() opens nothing: test_import_opens_no_driver.)


@pytest.mark.parametrize("family, keyword", [
    ("merge_states", {"output": "fp8_e4m3"}),
    ("merge_states", {"threshold": True}),
    ("merge_states", {"lse_layout": "token_major"}),
    ("merge_states", {"mask": True}),
    ("merge_state_in_place", {"output_lse": True}),
    ("merge_state_in_place", {"num_states": 4}),
    ("merge_state_in_place", {"mask_empty_context": True}),
    ("mask_empty_context_lse", {"output_lse": True}),
    ("mask_empty_context_lse", {"mask": True}),
    ("merge_attn_states", {"num_states": 4}),
    ("merge_attn_states", {"mask": True}),
])
def test_supports_refuses_a_keyword_the_family_does_not_take(family, keyword):
    # A keyword the family's calls have no such thing for was ignored: True for a kernel that does
    # not take it. It names the keyword and the family; the same keyword at its default passes.
    (key, value), = keyword.items()
    with pytest.raises(ValueError, match=f"^{key}={re.escape(repr(value))} given for family={family!r}, whose calls "
                                         f"have no {key} "):
        mla_gen.supports("bf16", 128, family=family, **keyword)
    with pytest.raises(ValueError, match=f"given for family={family!r}"):
        manifest.call(family, "bf16", 128, **keyword)
    assert mla_gen.supports("bf16", 128, family=family, **{key: manifest.DEFAULTS[key]}) == \
        mla_gen.supports("bf16", 128, family=family)


def test_supports_refuses_group_keywords_without_the_group_output():
    for keyword in ({"group_size": 64}, {"ue8m0": True}):
        with pytest.raises(ValueError, match='describes the per-token-group FP8 output: pass output="fp8_e4m3_group"'):
            mla_gen.supports("bf16", 128, output="fp8_e4m3", **keyword)
    with pytest.raises(ValueError, match="unknown family 'merge'"):
        mla_gen.supports("bf16", 128, family="merge")
    assert mla_gen.supports("bf16", 128, output="fp8_e4m3_group", group_size=64, ue8m0=True)


def _in_a_fresh_process(code):
    """Run `code` in a new interpreter importing this mla_gen; its failure fails the test."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(mla_gen.__file__).parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_import_opens_no_driver():
    # mla_gen itself opens no driver at import or in supports(): its own handle stays None. (The
    # process may still map libcuda: on a GPU machine importing torch, which mla_gen does to
    # register its ops, maps it - seen on the H200 - so the maps are checked in the next test,
    # where torch cannot be imported.)
    code = ("import mla_gen\n"
            "import torch\n"
            "assert mla_gen.supports(torch.float16, 128)\n"
            "assert mla_gen._cuda._lib is None, 'mla_gen opened libcuda before any launch'\n")
    _in_a_fresh_process(code)


def test_the_torch_free_names_work_without_torch():
    # What __all__ offers without torch answers in a process where torch cannot be imported.
    code = ("import sys\n"
            "sys.modules['torch'] = None  # import torch raises ImportError\n"
            "import mla_gen\n"
            "assert 'merge_attn_states' not in mla_gen.__all__\n"
            "s = mla_gen.stats()\n"
            "assert s == {'module_loads': 0, 'launches': 0, 'plans': 0, 'fallbacks': 0}, s\n"
            "assert mla_gen.available_kernels() and mla_gen.kernels_dir()\n"
            "assert mla_gen.supports('bfloat16', 128)\n"
            "import os\n"
            "maps = open('/proc/self/maps').read() if os.path.exists('/proc/self/maps') else ''\n"
            "assert 'libcuda.so' not in maps, 'libcuda mapped by import or supports()'\n")
    _in_a_fresh_process(code)


def test_mla_gen_kernels_is_read_at_every_lookup(tmp_path, monkeypatch):
    m = {k: v for k, v in manifest.load().items() if not k.startswith("_")}
    m["kernels"] = [k for k in m["kernels"] if k["variant"]["head_size"] == 64]
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    assert mla_gen.supports("bf16", 128)
    monkeypatch.setenv("MLA_GEN_KERNELS", str(tmp_path))
    assert not mla_gen.supports("bf16", 128) and mla_gen.supports("bf16", 64)
    assert Path(mla_gen.kernels_dir()) == tmp_path.resolve()
    monkeypatch.delenv("MLA_GEN_KERNELS")
    assert mla_gen.supports("bf16", 128)


def test_another_schema_version_is_refused(tmp_path, monkeypatch):
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 1, "kernels": []}))
    monkeypatch.setenv("MLA_GEN_KERNELS", str(tmp_path))
    with pytest.raises(RuntimeError, match="schema_version 1; this package reads 2"):
        mla_gen.supports("bf16", 128)


def test_check_args_on_the_current_manifest():
    name = "merge_attn_states_bf16_d128_thr_lse"
    args = {"output": {"ptr": 1 << 20, "len": 512, "elem": "bf16"}, "prefix_output": mla_gen.Buffer(2 << 20, 512),
            "prefix_lse": mla_gen.Buffer(3 << 20, 4), "suffix_output": mla_gen.Buffer(4 << 20, 512),
            "suffix_lse": mla_gen.Buffer(5 << 20, 4), "num_tokens": 4, "num_heads": 1, "output_token_stride": 128,
            "output_head_stride": 128, "prefix_token_stride": 128, "prefix_head_stride": 128,
            "suffix_token_stride": 128, "suffix_head_stride": 128}
    values, grid = mla_gen.check_args(name, args)
    assert values[-1] == 4 and grid[2] == 1, "the threshold defaults to num_tokens"
    with pytest.raises(mla_gen.ArgumentError, match=f"^{name}: output: .* needs 512 elements, it has 511$"):
        mla_gen.check_args(name, dict(args, output={"ptr": 1 << 20, "len": 511}))


# ---- operators ----

torch = pytest.importorskip("torch")

VLLM_SCHEMA = ("merge_attn_states(Tensor! output, Tensor!? output_lse, Tensor prefix_output, Tensor prefix_lse, "
               "Tensor suffix_output, Tensor suffix_lse, SymInt? prefill_tokens_with_context=None, "
               "Tensor? output_scale=None) -> ()")
# vLLM's arguments, their order and meaning unchanged, then the fused empty-context mask's.
SCHEMA = ("merge_attn_states(Tensor! output, Tensor!? output_lse, Tensor prefix_output, Tensor prefix_lse, "
          "Tensor suffix_output, Tensor suffix_lse, SymInt? prefill_tokens_with_context=None, "
          "Tensor? output_scale=None, Tensor? query_start_loc=None, Tensor? context_start_loc=None) -> ()")


def test_ops_are_registered_with_their_schemas():
    from mla_gen import ops
    assert str(torch.ops.mla_gen.merge_attn_states.default._schema) == \
        str(torch._C.parse_schema("mla_gen::" + SCHEMA))
    ours = torch.ops.mla_gen.merge_attn_states.default._schema.arguments
    vllm = torch._C.parse_schema("mla_gen::" + VLLM_SCHEMA).arguments
    def spell(a):
        return a.name, str(a.type), a.default_value, a.alias_info is not None and a.alias_info.is_write
    assert [spell(a) for a in ours[:len(vllm)]] == [spell(a) for a in vllm]
    for name, schema in ops.SCHEMAS.items():
        assert str(getattr(torch.ops.mla_gen, name).default._schema) == str(torch._C.parse_schema("mla_gen::" + schema))
    mutated = {name: [a.name for a in getattr(torch.ops.mla_gen, name).default._schema.arguments
                      if a.alias_info is not None and a.alias_info.is_write] for name in ops.SCHEMAS}
    assert mutated == {"merge_attn_states": ["output", "output_lse"],
                       "merge_attn_states_fp8_group": ["output", "output_group_scales", "output_lse"],
                       "merge_states": [], "merge_state_in_place": ["v", "s"], "mask_empty_context_lse": ["lse"]}


def test_the_binding_names_what_the_kernels_take():
    """binding.json against the manifest: every tensor of every kernel is one a kind of its
    family binds (a tensor an option adds and binding.json lacks, or a misspelt name there, leaves
    a kernel parameter no call can give), and every op argument binds a tensor, free integer or
    option of the op's widest kind. (Not the other way: an option off by default adds a tensor no
    default kernel takes.)"""
    from mla_gen import _binding
    by_family = {}
    for kind in _binding.KINDS.values():
        names = by_family.setdefault(kind.family, set())
        names.update(kind.names, kind.free, kind.options)
    for k in manifest.load()["kernels"]:
        bound = by_family[k["family"]]
        given = {p["name"] for p in k["params"] if p["kind"] == "pointer"}
        assert given <= bound, (k["name"], given - bound)
    for name, kind in _binding.KINDS.items():
        assert set(kind.typed) <= set(kind.names), name
    for name, op in _binding.OPS.items():
        widest = op.kinds[-1]
        for role, what in op.args:
            assert what in {"tensor": widest.names, "free": widest.free, "option": widest.options}[role], (name, what)
        assert len(op.args) == len(_binding.schema_args(name)), name


def test_an_engine_api_kind_takes_the_tensors_it_names():
    """Kind.taking: the tensors named, in that order (FlashInfer's and SGLang's modules pass
    those); refused where it drops one the kind's checks or error text read."""
    from mla_gen import _binding
    pair = _binding.KINDS["pair"]
    names = ("output", "output_lse", "prefix_output", "prefix_lse", "suffix_output", "suffix_lse")
    assert pair.taking(names).names == names and pair.taking(names).fields == pair.fields
    with pytest.raises(ValueError, match="needs \\['prefix_output'\\]"):
        pair.taking(("output", "prefix_lse", "suffix_output", "suffix_lse"))
    with pytest.raises(ValueError, match="needs \\['output_scales'\\]"):
        _binding.KINDS["group"].taking(("output", "prefix_output"))
    with pytest.raises(ValueError, match="needs \\[\\], has no \\['bogus'\\]"):
        pair.taking(names + ("bogus",))


def test_registering_twice_is_harmless(monkeypatch):
    # A second copy of the package in the process (its own _lib still None) finds the ops
    # registered and keeps them: no error, the same op objects still served.
    from mla_gen import ops
    before = torch.ops.mla_gen.merge_attn_states.default
    monkeypatch.setattr(ops, "_lib", None)
    ops._register()
    assert ops._lib is None, "the second registration defined nothing"
    assert torch.ops.mla_gen.merge_attn_states.default is before


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_fakes_run_on_meta_tensors():
    T, K, H, D = 8, 3, 4, 128
    bf = torch.bfloat16
    ops = torch.ops.mla_gen
    assert ops.merge_attn_states(meta(T, H, D, dtype=bf), meta(H, T), meta(T, H, D, dtype=bf), meta(H, T),
                                 meta(T, H, D, dtype=bf), meta(H, T), 5) is None
    assert ops.merge_attn_states(meta(T, H, D, dtype=torch.float8_e4m3fn), None, meta(T, H, D, dtype=bf), meta(H, T),
                                 meta(T, H, D, dtype=bf), meta(H, T), None, meta(1)) is None
    assert ops.merge_attn_states_fp8_group(meta(T, H, D, dtype=torch.float8_e4m3fn), meta(T, H * D // 64), None,
                                           meta(T, H, D, dtype=bf), meta(H, T), meta(T, H, D, dtype=bf), meta(H, T),
                                           None, True) is None
    out, lse = ops.merge_states(meta(T, K, H, D, dtype=bf), meta(T, K, H))
    assert (out.shape, out.dtype, out.device.type) == ((T, H, D), bf, "meta")
    assert (lse.shape, lse.dtype, lse.device.type) == ((T, H), torch.float32, "meta")
    assert ops.merge_state_in_place(meta(T, H, D, dtype=bf), meta(T, H), meta(T, H, D, dtype=bf), meta(T, H)) is None
    assert ops.mask_empty_context_lse(meta(H, T), meta(3, dtype=torch.int32), meta(3, dtype=torch.int32)) is None


def test_fake_tensor_mode_allocates_on_the_inputs_device():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        v = torch.empty(8, 2, 4, 128, dtype=torch.bfloat16)
        s = torch.empty(8, 2, 4)
        out, lse = torch.ops.mla_gen.merge_states(v, s)
        assert out.device == v.device and lse.shape == (8, 4)
    del mode


def test_compile_traces_the_ops_on_meta_tensors():
    T, H, D = 8, 4, 128

    def f(out, p, pl, s, sl, out_lse):
        torch.ops.mla_gen.merge_attn_states(out, out_lse, p, pl, s, sl, 3)
        return out

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    bf = torch.bfloat16
    got = compiled(meta(T, H, D, dtype=bf), meta(T, H, D, dtype=bf), meta(H, T), meta(T, H, D, dtype=bf), meta(H, T),
                   meta(H, T))
    assert got.shape == (T, H, D)

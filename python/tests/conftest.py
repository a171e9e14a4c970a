"""Shared fixtures. `cpu_launch` runs the torch layer on CPU tensors with the driver replaced
(no GPU: every check, the plan and the parameter values are real; the launch is recorded), and
`contract_kernels` is a kernel folder whose manifest holds the contracts of the shared table
(tests/contract/contracts.json) with the variants their names spell."""

import copy
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _variant(name: str) -> dict:
    """The variant a contract-table kernel's name spells (tests/contract/spec.toml)."""
    if name.startswith("mask_empty_context_lse"):
        return {"family": "mask_empty_context_lse", "dtype": "f32", "head_size": 1, "prefix_threshold": False,
                "output_lse": False, "output": "same", "lse_layout": "head_major"}
    m = re.fullmatch(r"(merge_attn_states|merge_states|merge_state_in_place)_(\w+?)_d(\d+)(.*)", name)
    fam, dtype, d, rest = m.group(1), m.group(2), int(m.group(3)), m.group(4)
    tags = rest.strip("_").split("_") if rest else []
    v = {"dtype": dtype, "head_size": d, "prefix_threshold": "thr" in tags, "output_lse": "lse" in tags,
         "output": "same", "lse_layout": "head_major"}
    if fam == "merge_attn_states":
        v["family"] = fam
        if "ctxmask" in tags:
            v["mask_empty_context"] = True
        for t in tags:
            if t == "dense":
                v["dense"] = True
            elif t == "fp8":
                v["output"] = "fp8_e4m3"
            elif t.startswith("fp8g"):
                v["output"] = "fp8_e4m3_group"
                v["fp8_group"] = {"group_size": int(t[4:]), "ue8m0": False}
    elif fam == "merge_states":
        k = next(t for t in tags if t.startswith("k"))
        v["family"] = {fam: {"num_states": None if k == "kvar" else int(k[1:])}}
    else:
        v["family"] = {fam: {"mask": "mask" in tags}}
    return v


def launched(kernel: str, num_tokens: int, num_heads: int, dense: bool = True, threshold=None) -> str:
    """The kernel a launch of `kernel` with these rows runs in the current folder: the one its
    size rule names (test_size_rule_cpu.py checks the rule itself), else itself; for dense
    tensors (`dense`; rows below 2^32), that one's first dense specialization the threshold and
    the head count allow (`_dense_nothr` takes n = T only, the default; `_flat` fewer heads than
    its bound and, for outputs of the inputs' dtype, at least its tokens;
    test_specialization_cpu.py checks the choice)."""
    from mla_gen import manifest

    kf = manifest.folder()
    k = kf.kernel(kernel)
    # The size rule read here, not through manifest.by_size_rule (the code under test): the
    # narrowest range whose bound exceeds the rows, named after its bound.
    rule = k["launch"].get("size_rule")
    if rule:
        assert rule["rows"] == ["num_tokens", "num_heads"], rule
        fits = [r for r in rule["ranges"] if num_tokens * num_heads < r["below_rows"]]
        if fits:
            narrowest = min(fits, key=lambda r: r["below_rows"])
            assert narrowest["kernel"].startswith(f"{kernel}_below{narrowest['below_rows']}"), narrowest
            k = kf.kernel(narrowest["kernel"])
    def bound(twin, name):
        return next((p.get("bounds") or {} for p in twin["params"] if p["name"] == name), {})

    def takes(twin):  # the twin's contract allows this threshold (`_dense_nothr`: n = T only), H and T
        n_ok = bound(twin, "prefill_tokens_with_context").get("min") != "num_tokens" or threshold in (None, num_tokens)
        return (n_ok and num_heads <= int(bound(twin, "num_heads").get("max", num_heads))
                and num_tokens >= int(bound(twin, "num_tokens").get("min", 0)))

    dense_twins = [s for s in k["launch"].get("specializations", ())
                   if kf.kernel(s)["variant"].get("dense") and takes(kf.kernel(s))]
    return dense_twins[0] if dense and dense_twins else k["name"]


MAIN = "merge_attn_states_bf16_d128_thr_lse"
ALT = MAIN + "_below100"


def rule_folder(tmp_path, monkeypatch, twins: bool):
    """MLA_GEN_KERNELS pointing at the table's MAIN with a size rule made up here: below 100
    rows ALT, with its own grid and block (MAIN one token a block, so the grids always differ).
    `twins`: each of them with its dense specialization (the table's MAIN_dense, and ALT_dense
    with ALT's grid and block); else neither has specializations. The reached kernels stand
    first: selection must still pick MAIN."""
    contracts = json.loads((ROOT / "tests/contract/contracts.json").read_text())

    def entry(name):
        return {"name": name, "family": "merge_attn_states", "variant": _variant(name), "archs": [],
                **copy.deepcopy(contracts[name])}

    main = entry(MAIN)
    main["launch"].pop("specializations")
    alt = copy.deepcopy(main)
    alt["name"] = ALT
    alt["variant"]["rows_below"] = 100
    alt["launch"].update(block_threads=256, grid_x=dict(main["launch"]["grid_x"], per_block=16),
                         grid_y=dict(main["launch"]["grid_y"], per_block=4))
    main["launch"]["grid_x"]["per_block"] = 1
    main["launch"]["size_rule"] = {"rows": ["num_tokens", "num_heads"],
                                   "ranges": [{"below_rows": 100, "kernel": ALT}]}
    kernels = [alt, main]
    if twins:
        dense = entry(MAIN + "_dense")
        alt_dense = copy.deepcopy(dense)
        alt_dense["name"] = ALT + "_dense"
        alt_dense["launch"] = copy.deepcopy(alt["launch"])
        main["launch"]["specializations"] = [dense["name"]]
        alt["launch"]["specializations"] = [alt_dense["name"]]
        kernels = [dense, alt_dense] + kernels
    m = {"schema_version": 2, "generator": {"name": "mla-gen", "version": "test"}, "nvrtc": {}, "spec": {},
         "kernels": kernels}
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    monkeypatch.setenv("MLA_GEN_KERNELS", str(tmp_path))
    return tmp_path


@pytest.fixture
def contract_kernels(tmp_path, monkeypatch):
    """MLA_GEN_KERNELS pointing at a manifest of the contract table's kernels (no images)."""
    contracts = json.loads((ROOT / "tests/contract/contracts.json").read_text())
    kernels = []
    for name, c in contracts.items():
        v = _variant(name)
        fam = v["family"] if isinstance(v["family"], str) else next(iter(v["family"]))
        kernels.append({"name": name, "family": fam, "variant": v, "archs": [], **c})
    manifest = {"schema_version": 2, "generator": {"name": "mla-gen", "version": "test"},
                "nvrtc": {}, "spec": {}, "kernels": kernels}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("MLA_GEN_KERNELS", str(tmp_path))
    return tmp_path


@pytest.fixture
def select_folder(tmp_path, monkeypatch):
    """MLA_GEN_KERNELS pointing at the selection table's kernels (tests/contract/select_kernels.json:
    base-2 and token-major kernels, group FP8 of group size 64 with and without UE8M0; no images)."""
    kernels = json.loads((ROOT / "tests/contract/select_kernels.json").read_text())["kernels"]
    m = {"schema_version": 2, "generator": {"name": "mla-gen", "version": "test"}, "nvrtc": {}, "spec": {},
         "kernels": kernels}
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    monkeypatch.setenv("MLA_GEN_KERNELS", str(tmp_path))
    return tmp_path


class Recorder:
    def __init__(self):
        self.launches = []

    def last(self):
        return self.launches[-1]


@pytest.fixture
def cpu_launch(monkeypatch):
    """The torch layer on CPU tensors, launches recorded as (kernel, values by name, grid)."""
    torch = pytest.importorskip("torch")
    from mla_gen import _cuda, _torch

    rec = Recorder()

    class FakeKernel:
        def __init__(self, meta):
            self.meta = meta

        def function(self, device):
            return 0xF00

    monkeypatch.setattr(_torch, "_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(_torch, "_plans", {})
    for slot in ("_last_pair", "_last_pair_op", "_last_ctx"):
        monkeypatch.setattr(_torch, slot, [None] * 4)
    monkeypatch.setattr(_cuda, "kernel", lambda folder, meta: FakeKernel(meta))
    monkeypatch.setattr(_cuda, "primary_context", lambda device: 0xC0)
    monkeypatch.setattr(_torch, "_stream", lambda device: 0)

    def launch(launcher, values, gx, gy, stream):
        from mla_gen import manifest
        meta = manifest.folder().kernel(launcher.name)
        names = [p["name"] for p in meta["params"]]
        rec.launches.append((launcher.name, dict(zip(names, values)), (gx, gy)))

    monkeypatch.setattr(_cuda, "launch", launch)
    yield rec
    del torch

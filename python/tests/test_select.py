"""The shared selection table (tests/contract/select.json) through the package: every call
selects the kernel the Rust selector (tests/contract.rs) and the C launcher (tests/c_select.rs)
select, and a launch of it runs the same kernel (size rule, then specializations); every device of
its artifact table loads the same image. No GPU."""

import json
from pathlib import Path

import pytest

from mla_gen import _plan, manifest
from mla_gen.contract import Buffer, plan_for

ROOT = Path(__file__).resolve().parents[2]
TABLE = json.loads((ROOT / "tests/contract/select.json").read_text())


def test_every_call_of_the_shared_table_selects_its_kernel(tmp_path, monkeypatch):
    kernels = json.loads((ROOT / "tests/contract/select_kernels.json").read_text())["kernels"]
    m = {"schema_version": 2, "generator": {"name": "mla-gen", "version": "test"}, "nvrtc": {}, "spec": {},
         "kernels": kernels}
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    monkeypatch.setenv("MLA_GEN_KERNELS", str(tmp_path))
    kf = manifest.folder()
    failures = []
    for case in TABLE["cases"]:
        args = {}
        for name, a in case["args"].items():
            if "int" in a:
                args[name] = a["int"]
            else:
                args[name] = (a["elem"], None if a["shape"] is None else tuple(a["shape"]))
        hit = manifest.select(kf, case["family"], args, case["options"])
        got = hit and (hit[0]["name"], hit[1])
        want = case["expect"] and (case["expect"], case.get("serves", True))
        if got != want:
            failures.append(f"{case['why']}: expected {want}, got {got}")
        elif "launch" in case:
            runs = launched(kf, hit[0], case["args"], case["launch"]["ints"])
            if runs != case["launch"]["runs"]:
                failures.append(f"{case['why']}: runs {runs}, expected {case['launch']['runs']}")
    assert not failures, "\n".join(failures)
    assert len(TABLE["cases"]) >= 50


def launched(kf, meta, given, ints):
    """The kernel one launch of `meta` runs: every buffer given, each in memory of its own and
    long enough; the integers the case sets."""
    args = {name: Buffer((i + 1) << 40, 1 << 34, a["elem"]) for i, (name, a) in enumerate(given.items())
            if "int" not in a}
    args.update(ints)
    plan = plan_for(meta["name"], meta)
    run, _, _ = _plan.sized(kf, meta, plan, plan.check(args), args)
    return run["name"]


@pytest.mark.parametrize("t", TABLE["artifacts"]["tables"], ids=lambda t: ",".join(t["archs"]))
def test_every_device_of_the_shared_table_gets_its_artifact(t):
    without_ptx = t.get("without_ptx", [])
    kernel = {"archs": [dict({"arch": a},
                             **({"ptx": {"file": f"{a}.ptx"}} if a not in without_ptx else {}),
                             **({"cubin": {"file": f"{a}.cubin"}} if a.startswith("sm_") else {}))
                        for a in t["archs"]]}
    for case in t["cases"]:
        e = case["expect"]
        want = e and f"{e['arch']}.{'cubin' if e['cubin'] else 'ptx'}"
        assert manifest.pick_artifact(kernel, case["cc"]) == want, case

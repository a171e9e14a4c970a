"""The shared bad-argument table (tests/contract/cases.json) against the Python checker: every
case whose hosts include "python" gets exactly its expected verdict. CPU only: no torch, no GPU."""

import json
from pathlib import Path

import pytest

from mla_gen.contract import ArgumentError, Buffer, Plan, check_args

ROOT = Path(__file__).resolve().parents[2]
TABLE = json.loads((ROOT / "tests/contract/cases.json").read_text())
CONTRACTS = json.loads((ROOT / "tests/contract/contracts.json").read_text())
CASES = [c for c in TABLE["cases"] if "python" in c.get("hosts", ["python"])]


def case_args(case):
    """The case's arguments: its base's, with `set` applied and `remove` taken out."""
    base = TABLE["bases"][case["base"]]
    args = dict(base["args"])
    args.update(case.get("set", {}))
    for name in case.get("remove", []):
        args.pop(name, None)
    return base["kernel"], args


@pytest.mark.parametrize("case", CASES, ids=[c["why"] for c in CASES])
def test_case_gets_its_verdict(case):
    kernel, args = case_args(case)
    if case["expect"] is None:
        values, grid = check_args(kernel, args, CONTRACTS)
        assert (grid is not None) == case["launch"]
    else:
        with pytest.raises(ArgumentError) as e:
            check_args(kernel, args, CONTRACTS)
        assert e.value.kernel == kernel
        assert e.value.problem == case["expect"]
        assert str(e.value) == f"{kernel}: {case['expect']}"
        assert isinstance(e.value, ValueError)


def test_the_table_is_whole():
    assert len(TABLE["cases"]) >= 40
    assert len(CASES) == len(TABLE["cases"]), "every case of the table names python among its hosts"


def test_values_in_signature_order_and_the_grid():
    kernel = "merge_states_bf16_d128_kvar_lse"
    t, k, h, d = 1000, 3, 2, 128
    args = {"num_tokens": t, "num_heads": h, "num_states": k,
            "output": Buffer(0x10000, t * h * d), "states": Buffer(0x1000000, t * k * h * d),
            "states_lse": {"ptr": 0x2000000, "len": t * k * h}, "output_token_stride": h * d,
            "output_head_stride": d, "states_token_stride": k * h * d, "states_state_stride": h * d,
            "states_head_stride": d}
    values, grid = check_args(kernel, args, CONTRACTS)
    names = [p["name"] for p in CONTRACTS[kernel]["params"]]
    v = dict(zip(names, values))
    assert v["output"] == 0x10000 and v["output_lse"] == 0, "a nullable buffer left out is a null pointer"
    assert v["num_states"] == 3 and v["states_state_stride"] == 256
    launch = CONTRACTS[kernel]["launch"]
    assert grid == (-(-t // launch["grid_x"]["per_block"]), -(-h // launch["grid_y"]["per_block"]), 1)


def test_arguments_as_pairs_name_a_duplicate():
    kernel = "mask_empty_context_lse"
    plan = Plan(kernel, CONTRACTS[kernel])
    with pytest.raises(ArgumentError, match="num_tokens is given twice"):
        plan.check([("num_tokens", 1), ("num_tokens", 2)])


def test_the_checker_imports_without_torch():
    import subprocess
    import sys
    code = ("import sys; sys.modules['torch'] = None\n"
            "import mla_gen, mla_gen.contract\n"
            "assert 'check_args' in dir(mla_gen) and mla_gen.__version__\n")
    env = {"PYTHONPATH": str(Path(__import__("mla_gen").__file__).parents[1])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)

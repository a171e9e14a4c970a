//! The argument contract: `tests/contract/contracts.json` is what `abi::contract` derives from
//! `tests/contract/spec.toml` (kept fresh here), and every case of the shared bad-argument table
//! `tests/contract/cases.json` gets exactly its expected verdict from the Rust checker. The C
//! launcher (tests/c_launcher.rs) and the Python package (python/tests/test_contract.py) run
//! the same table.

use std::collections::BTreeMap;
use std::path::Path;

use mla_gen::contract::Contract;
use mla_gen::host::check::{Arg, Plan};
use serde_json::Value;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/contract");

/// Every kernel of the table's spec with its contract, as the manifest writes it.
fn derived_contracts() -> BTreeMap<String, Contract> {
    let text = std::fs::read_to_string(Path::new(DIR).join("spec.toml")).unwrap();
    let spec = mla_gen::spec::parse("spec.toml", &text).unwrap();
    spec.variants
        .iter()
        .map(|v| (v.kernel_name(), mla_gen::abi::contract(v)))
        .collect()
}

#[test]
fn contracts_json_is_what_the_abi_derives() {
    let path = Path::new(DIR).join("contracts.json");
    let mut fresh = serde_json::to_string_pretty(&derived_contracts()).unwrap();
    fresh.push('\n');
    if std::env::var_os("MLA_GEN_UPDATE_FIXTURES").is_some() {
        std::fs::write(&path, &fresh).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "tests/contract/contracts.json is stale: rerun with MLA_GEN_UPDATE_FIXTURES=1 and review the diff"
    );
}

fn arg(v: &Value) -> Arg<'_> {
    match v {
        Value::Null => Arg::Null,
        Value::Number(n) => Arg::Int(n.as_i64().unwrap()),
        Value::Object(o) => Arg::Buffer {
            ptr: o["ptr"].as_u64().unwrap(),
            len: o["len"].as_u64().unwrap(),
            elem: o.get("elem").and_then(Value::as_str),
        },
        other => panic!("not an argument: {other}"),
    }
}

/// A case's arguments: its base's, with `set` applied and `remove` taken out.
pub fn case_args(table: &Value, case: &Value) -> (String, BTreeMap<String, Value>) {
    let base = &table["bases"][case["base"].as_str().unwrap()];
    let mut args: BTreeMap<String, Value> = base["args"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(set) = case.get("set").and_then(Value::as_object) {
        for (k, v) in set {
            args.insert(k.clone(), v.clone());
        }
    }
    for k in case
        .get("remove")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        args.remove(k.as_str().unwrap());
    }
    (base["kernel"].as_str().unwrap().to_string(), args)
}

#[test]
fn every_case_of_the_shared_table_gets_its_verdict() {
    let table: Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(DIR).join("cases.json")).unwrap())
            .unwrap();
    let contracts = derived_contracts();
    let mut failures = Vec::new();
    let cases = table["cases"].as_array().unwrap();
    for case in cases {
        let why = case["why"].as_str().unwrap();
        let (kernel, args) = case_args(&table, case);
        let plan = Plan::new(&kernel, &contracts[&kernel]).unwrap();
        let named: Vec<(&str, Arg)> = args.iter().map(|(k, v)| (k.as_str(), arg(v))).collect();
        let got = plan.check(&named);
        match (case["expect"].as_str(), got) {
            (Some(want), Err(r)) if r.problem == want && r.kernel == kernel => {}
            (None, Ok(c)) if c.grid.is_some() == case["launch"].as_bool().unwrap() => {}
            (want, got) => failures.push(format!("{why}: expected {want:?}, got {got:?}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(cases.len() >= 40, "the table lost cases");
}

#[test]
fn a_passing_check_gives_values_in_signature_order_and_the_grid() {
    let contracts = derived_contracts();
    let kernel = "merge_states_bf16_d128_kvar_lse";
    let plan = Plan::new(kernel, &contracts[kernel]).unwrap();
    let buf = |ptr, len| Arg::Buffer {
        ptr,
        len,
        elem: None,
    };
    let (t, k, h, d) = (1000i64, 3i64, 2i64, 128i64);
    let args = [
        ("num_tokens", Arg::Int(t)),
        ("num_heads", Arg::Int(h)),
        ("num_states", Arg::Int(k)),
        ("output", buf(0x10000, (t * h * d) as u64)),
        ("states", buf(0x1000000, (t * k * h * d) as u64)),
        ("states_lse", buf(0x2000000, (t * k * h) as u64)),
        ("output_token_stride", Arg::Int(h * d)),
        ("output_head_stride", Arg::Int(d)),
        ("states_token_stride", Arg::Int(k * h * d)),
        ("states_state_stride", Arg::Int(h * d)),
        ("states_head_stride", Arg::Int(d)),
    ];
    let c = plan.check(&args).unwrap();
    let names: Vec<&str> = plan.param_names().collect();
    let value = |n: &str| c.values()[names.iter().position(|&x| x == n).unwrap()];
    assert_eq!(value("output"), 0x10000);
    assert_eq!(
        value("output_lse"),
        0,
        "a nullable buffer left out is a null pointer"
    );
    assert_eq!(value("num_states"), 3);
    assert_eq!(value("states_state_stride"), 256);
    let launch = &contracts[kernel].launch;
    let x = (t as u32).div_ceil(launch.grid_x.per_block);
    let y = (h as u32).div_ceil(launch.grid_y.per_block);
    assert_eq!(c.grid, Some([x, y, 1]));
    assert_eq!(c.block_threads, launch.block_threads);
}

//! The argument contract: `tests/contract/contracts.json` is what `abi::contract` derives from
//! `tests/contract/spec.toml` (kept fresh here), and every case of the shared bad-argument table
//! `tests/contract/cases.json` gets exactly its expected verdict from the Rust checker. The C
//! launcher (tests/c_launcher.rs) and the Python package (python/tests/test_contract.py) run
//! the same table.
//!
//! Selection (docs/MANIFEST.md, "Selection"): `tests/contract/select_kernels.json` is the
//! manifest entries of `tests/contract/select.toml` (kept fresh here), and every call of the
//! shared table `tests/contract/select.json` selects exactly its expected kernel, and where the
//! case launches, runs its expected kernel (size rule, then specializations); and every device
//! of its `artifacts` table gets its expected image. The C launcher (tests/c_select.rs) and the
//! Python package (python/tests/test_select.py) run the same tables.

use std::collections::BTreeMap;
use std::path::Path;

use mla_gen::contract::Contract;
use mla_gen::host::check::{Arg, Given, Plan};
use mla_gen::host::manifest::KernelView;
use mla_gen::host::select::{Call, Selector};
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

/// `file` of tests/contract holds `derived` (rewritten with MLA_GEN_UPDATE_FIXTURES=1).
fn assert_fresh(file: &str, derived: &impl serde::Serialize) {
    let path = Path::new(DIR).join(file);
    let mut fresh = serde_json::to_string_pretty(derived).unwrap();
    fresh.push('\n');
    if std::env::var_os("MLA_GEN_UPDATE_FIXTURES").is_some() {
        std::fs::write(&path, &fresh).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "tests/contract/{file} is stale: rerun with MLA_GEN_UPDATE_FIXTURES=1 and review the diff"
    );
}

#[test]
fn contracts_json_is_what_the_abi_derives() {
    assert_fresh("contracts.json", &derived_contracts());
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

/// Every case of the shared table on `plan_for(kernel, base's arguments)`: the failures.
fn case_failures(plan_for: impl Fn(&str, &[(&str, Arg)]) -> Plan) -> Vec<String> {
    let table: Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(DIR).join("cases.json")).unwrap())
            .unwrap();
    let mut failures = Vec::new();
    let cases = table["cases"].as_array().unwrap();
    assert!(cases.len() >= 40, "the table lost cases");
    for case in cases {
        let why = case["why"].as_str().unwrap();
        let (kernel, args) = case_args(&table, case);
        let base = &table["bases"][case["base"].as_str().unwrap()]["args"];
        let base: Vec<(&str, Arg)> = base
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.as_str(), arg(v)))
            .collect();
        let plan = plan_for(&kernel, &base);
        let named: Vec<(&str, Arg)> = args.iter().map(|(k, v)| (k.as_str(), arg(v))).collect();
        let got = plan.check(&named);
        match (case["expect"].as_str(), got) {
            (Some(want), Err(r)) if r.problem == want && r.kernel == kernel => {}
            (None, Ok(c)) if c.grid.is_some() == case["launch"].as_bool().unwrap() => {}
            (want, got) => failures.push(format!("{why}: expected {want:?}, got {got:?}")),
        }
    }
    failures
}

#[test]
fn every_case_of_the_shared_table_gets_its_verdict() {
    let contracts = derived_contracts();
    let failures = case_failures(|kernel, _| Plan::new(kernel, &contracts[kernel]).unwrap());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The check remembers the last call that passed and checks one of the same layout by its
/// addresses alone (src/host/check/memo.rs): after the base's arguments passed, every case still
/// gets its verdict, each refusal the full check's.
#[test]
fn every_case_gets_its_verdict_after_its_base_passed() {
    let contracts = derived_contracts();
    let failures = case_failures(|kernel, base| {
        let plan = Plan::new(kernel, &contracts[kernel]).unwrap();
        plan.check(base).unwrap();
        plan
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
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

// ---- selection: tests/contract/select.json ----

/// Every kernel of the selection table's spec: its manifest entry, less its files.
fn derived_kernels() -> Value {
    let text = std::fs::read_to_string(Path::new(DIR).join("select.toml")).unwrap();
    let spec = mla_gen::spec::parse("select.toml", &text).unwrap();
    let kernels: Vec<Value> = spec
        .variants
        .iter()
        .map(|v| {
            // The contract's fields (limits and select where it has them), then what names it.
            let mut k = serde_json::to_value(mla_gen::abi::contract(v)).unwrap();
            k["name"] = v.kernel_name().into();
            k["family"] = v.family.table().into();
            k["variant"] = serde_json::to_value(v).unwrap();
            k["archs"] = serde_json::json!([]);
            k
        })
        .collect();
    serde_json::json!({ "kernels": kernels })
}

#[test]
fn select_kernels_json_is_what_the_abi_derives() {
    assert_fresh("select_kernels.json", &derived_kernels());
}

/// tests/contract/select.json.
fn select_table() -> Value {
    let text = std::fs::read_to_string(Path::new(DIR).join("select.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A case's arguments: (name, sizes, the table's entry), the sizes owned here.
fn given(args: &serde_json::Map<String, Value>) -> Vec<(String, Option<Vec<i64>>, Value)> {
    args.iter()
        .map(|(name, a)| {
            let shape = a
                .get("shape")
                .and_then(Value::as_array)
                .map(|s| s.iter().map(|n| n.as_i64().unwrap()).collect());
            (name.clone(), shape, a.clone())
        })
        .collect()
}

#[test]
fn every_call_of_the_shared_table_selects_its_kernel() {
    let table = select_table();
    let kernels: Vec<KernelView> =
        serde_json::from_value(derived_kernels()["kernels"].clone()).unwrap();
    let selector = Selector::new(kernels.iter().map(Into::into)).unwrap();
    let mut failures = Vec::new();
    let cases = table["cases"].as_array().unwrap();
    for case in cases {
        let why = case["why"].as_str().unwrap();
        let owned = given(case["args"].as_object().unwrap());
        let args: Vec<(&str, Given)> = owned
            .iter()
            .map(|(name, shape, a)| {
                let g = match a.get("int") {
                    Some(v) => Given::Int(v.as_i64()),
                    None => Given::Buffer {
                        elem: a["elem"].as_str(),
                        shape: shape.as_deref(),
                    },
                };
                (name.as_str(), g)
            })
            .collect();
        let options: Vec<(&str, &str)> = case["options"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
            .collect();
        let call = Call {
            family: case["family"].as_str().unwrap(),
            args: &args,
            options: &options,
        };
        let got = selector.select(&call);
        let want = case["expect"].as_str();
        let serves = case.get("serves").and_then(Value::as_bool).unwrap_or(true);
        match (want, got) {
            (None, None) => {}
            (Some(w), Some(c)) if selector.name(c.index) == w && c.serves == serves => {
                if let Some(launch) = case.get("launch") {
                    let runs = launched(&selector, c.index, &owned, &launch["ints"]);
                    if runs != launch["runs"].as_str().unwrap() {
                        failures.push(format!("{why}: runs {runs}, expected {}", launch["runs"]));
                    }
                }
            }
            (w, c) => failures.push(format!(
                "{why}: expected {w:?} (serves {serves}), got {:?}",
                c.map(|c| (selector.name(c.index), c.serves))
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(cases.len() >= 50, "the table lost cases");
}

/// The kernel one launch of kernel `index` runs: every buffer given, each in memory of its
/// own and long enough; the integers the case sets.
fn launched(
    selector: &Selector,
    index: usize,
    owned: &[(String, Option<Vec<i64>>, Value)],
    ints: &Value,
) -> String {
    let mut args: Vec<(&str, Arg)> = Vec::new();
    for (i, (name, _, a)) in owned.iter().enumerate() {
        if a.get("int").is_none() {
            args.push((
                name,
                Arg::Buffer {
                    ptr: (i as u64 + 1) << 40,
                    len: 1 << 34,
                    elem: a["elem"].as_str(),
                },
            ));
        }
    }
    for (name, v) in ints.as_object().unwrap() {
        args.push((name, Arg::Int(v.as_i64().unwrap())));
    }
    let checked = selector
        .plan(index)
        .check(&args)
        .unwrap_or_else(|r| panic!("{r}"));
    selector
        .name(selector.launched(index, checked.values()))
        .to_string()
}

/// The artifact rule's tables (`artifacts` of select.json): the image a device loads.
#[test]
fn every_device_of_the_shared_table_gets_its_artifact() {
    let table = select_table();
    for t in table["artifacts"]["tables"].as_array().unwrap() {
        let names: Vec<&str> = t["archs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let without_ptx: Vec<&str> = t
            .get("without_ptx")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|a| a.as_str().unwrap()).collect())
            .unwrap_or_default();
        // The table's `without_ptx` is what the spec's `ptx` leaves out.
        let ptx = t.get("ptx").and_then(Value::as_str).unwrap_or("every");
        let spec_text = format!(
            "arch = {}\nptx = \"{ptx}\"\n[[mask_empty_context_lse]]\n",
            t["archs"]
        );
        let spec = mla_gen::spec::parse("artifacts.toml", &spec_text).unwrap();
        let left_out: Vec<String> = spec
            .archs
            .iter()
            .filter(|a| !spec.carries_ptx(a))
            .map(|a| a.name())
            .collect();
        assert_eq!(left_out, without_ptx, "{spec_text}");
        let archs: Vec<Value> = names
            .iter()
            .map(|a| {
                let mut entry = serde_json::json!({"arch": a});
                if !without_ptx.contains(a) {
                    entry["ptx"] = serde_json::json!({"file": format!("{a}.ptx")});
                }
                if a.starts_with("sm_") {
                    entry["cubin"] = serde_json::json!({"file": format!("{a}.cubin")});
                }
                entry
            })
            .collect();
        let mut k = derived_kernels()["kernels"][0].clone();
        k["archs"] = Value::Array(archs);
        let k: KernelView = serde_json::from_value(k).unwrap();
        for case in t["cases"].as_array().unwrap() {
            let cc = case["cc"].as_i64().unwrap() as i32;
            let want = case["expect"].as_object().map(|e| {
                let arch = e["arch"].as_str().unwrap();
                let cubin = e["cubin"].as_bool().unwrap();
                (
                    format!("{arch}.{}", if cubin { "cubin" } else { "ptx" }),
                    cubin,
                )
            });
            let got = k.artifact((cc / 10, cc % 10)).map(|a| (a.file, a.cubin));
            assert_eq!(got, want, "cc {cc}, archs {names:?}, ptx {ptx}");
        }
    }
}

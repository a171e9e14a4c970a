//! Machine-readable outputs: `list --json`, `check --json`, `schema`.

use mla_gen::emit::Diff;
use mla_gen::spec::Spec;
use serde_json::json;

use crate::failure::Failure;

/// Kernel names, or one JSON object per kernel with its variant and argument contract.
pub fn list(spec: &Spec, as_json: bool) -> Result<(), Failure> {
    if !as_json {
        for name in spec.kernel_names() {
            println!("{name}");
        }
        return Ok(());
    }
    let rows: Vec<_> = spec
        .variants
        .iter()
        .map(|v| {
            let c = mla_gen::abi::contract(v);
            json!({
                "name": v.kernel_name(),
                "family": v.family.table(),
                "variant": v,
                "params": c.params,
                "constants": c.constants,
                "launch": c.launch,
            })
        })
        .collect();
    println!("{}", serde_json::to_string_pretty(&rows)?);
    Ok(())
}

/// `images_built`: false when the folder holds no image and only its text (manifest) was compared.
pub fn check_json(d: &Diff, images_built: bool) -> Result<(), Failure> {
    let v = json!({
        "fresh": d.is_clean(),
        "images_built": images_built,
        "stale": d.stale,
        "missing": d.missing,
        "extra": d.extra,
    });
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

/// The JSON Schema of manifest.json, derived from the Rust types that write it.
pub fn schema() -> Result<(), Failure> {
    let schema = schemars::schema_for!(mla_gen::emit::Manifest);
    println!("{}", serde_json::to_string_pretty(&schema)?);
    Ok(())
}

//! Programmatic dependent launch without a GPU: `launch.pdl` in the manifest and the contract
//! (absent when false, so older readers and manifests agree), and the C launcher's choice of
//! cuLaunchKernelEx with programmatic stream serialization (tests/c/pdl_check.c against the stub
//! driver). The GPU half (late writes, the bench) is in tests/gpu_pdl.rs.

#[path = "c/common.rs"]
mod common;

use common::{build_and_run, generate_c, test_file};

const SPEC: &str = "arch = [\"sm_80\", \"sm_90\"]\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\npdl = [false, true]\n";

#[test]
fn launch_pdl_is_in_the_manifest_and_reads_back() {
    let spec = mla_gen::spec::parse("t.toml", SPEC).unwrap();
    let t = mla_gen::render::Templates::embedded().unwrap();
    let (files, manifest) = mla_gen::generate_files(&spec, &t, 1, false).unwrap();
    let text = std::str::from_utf8(&files["manifest.json"]).unwrap();
    let json: serde_json::Value = serde_json::from_str(text).unwrap();
    let kernels = json["kernels"].as_array().unwrap();
    assert_eq!(kernels[0]["name"], "merge_attn_states_bf16_d128_thr_lse");
    assert!(
        kernels[0]["launch"].get("pdl").is_none() && kernels[0]["variant"].get("pdl").is_none()
    );
    assert_eq!(
        kernels[1]["name"],
        "merge_attn_states_bf16_d128_thr_lse_pdl"
    );
    assert_eq!(kernels[1]["launch"]["pdl"], true);
    assert_eq!(kernels[1]["variant"]["pdl"], true);
    // The contract (`mla-gen list --json`, tests/contract) carries it too.
    assert!(mla_gen::abi::contract(&spec.variants[1]).launch.pdl);
    assert!(!mla_gen::abi::contract(&spec.variants[0]).launch.pdl);
    // Read back by the runtime's view.
    #[cfg(feature = "runtime")]
    {
        let view = mla_gen::runtime::ManifestView::parse(
            std::path::Path::new("manifest.json"),
            text.as_bytes(),
        )
        .unwrap();
        assert!(!view.kernels[0].launch.pdl && view.kernels[1].launch.pdl);
        assert!(view.kernels[1].contract().launch.pdl);
    }
    assert_eq!(manifest.kernels.len(), 2);
}

#[test]
fn the_c_launcher_launches_pdl_kernels_programmatically_on_cc_9_and_newer() {
    let tmp = tempfile::tempdir().unwrap();
    let c = generate_c(tmp.path(), SPEC, None);
    let header = std::fs::read_to_string(c.join("mla_kernels.h")).unwrap();
    assert!(header.contains("Programmatic dependent launch on compute capability 9.0"));
    // The launch function and the pdl kernel's table, as a reviewed diff (the rest of the file
    // is the launcher of any spec, and the images are bytes).
    let source = std::fs::read_to_string(c.join("mla_kernels.c")).unwrap();
    let between = |from: &str, to: &str| {
        let at = source.find(from).unwrap();
        source[at..at + source[at..].find(to).unwrap()].to_string()
    };
    let run = between("/* Check, then launch", "/* ---- 5.");
    let table = between(
        "static const mla_kernel mla_kernel_merge_attn_states_bf16_d128_thr_lse_pdl = {",
        "mla_status mla_merge_attn_states_bf16_d128_thr_lse_pdl(",
    );
    insta::assert_snapshot!("c_launcher_pdl", format!("{run}...\n{table}"));
    let stdout = build_and_run(
        &tmp.path().join("check"),
        &[&c],
        &[test_file("pdl_check.c"), c.join("mla_kernels.c")],
    );
    assert!(stdout.contains("1 passed, 0 failed"), "{stdout}");
}

#[test]
fn a_launcher_without_pdl_kernels_has_no_programmatic_launch() {
    let tmp = tempfile::tempdir().unwrap();
    let c = generate_c(tmp.path(), &SPEC.replace("[false, true]", "false"), None);
    let source = std::fs::read_to_string(c.join("mla_kernels.c")).unwrap();
    assert!(source.contains("cuLaunchKernel(") && !source.contains("cuLaunchKernelEx"));
    assert!(!source.contains("pdl"));
}

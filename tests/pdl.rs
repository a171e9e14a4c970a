//! Programmatic dependent launch without a GPU: `launch.pdl` in the manifest and the contract
//! (absent when false, so older readers and manifests agree), and the C launcher's choice of
//! cuLaunchKernelEx with programmatic stream serialization (tests/c/pdl_check.c against the stub
//! driver). The GPU half (late writes, the bench) is in tests/gpu_pdl.rs.

#[path = "c/common.rs"]
mod common;

use common::{build_and_run, generate_c, test_file};

// Without size rules: two kernels, whatever specs/tuned.toml holds.
const SPEC: &str = "arch = [\"sm_80\", \"sm_90\"]\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\npdl = [false, true]\nsize_rule = false\ndense = false\n";

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
    // The launch functions and the pdl kernel's table, as a reviewed diff (the rest of the file
    // is the launcher of any spec, and the images are bytes).
    let source = std::fs::read_to_string(c.join("mla_kernels.c")).unwrap();
    let between = |from: &str, to: &str| {
        let at = source.find(from).unwrap();
        source[at..at + source[at..].find(to).unwrap()].to_string()
    };
    let run = between("/* Launch k as checked", "/* ---- 5.");
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

/// The producer of the GPU tests and bench (tests/pdl/producer.cu) compiles with NVRTC for
/// sm_90, its late writer triggering its dependents before any write. With MLA_GEN_PDL_OUT set
/// (bench/gpu/pdl.sh build), the PTX and CUBIN are written there for the GPU machine, which
/// has no compiler.
#[test]
fn the_producer_compiles_for_sm_90() {
    let source = include_str!("pdl/producer.cu");
    let nvrtc = mla_gen::nvrtc::load().unwrap_or_else(|e| panic!("NVRTC is needed: {e}"));
    let arch = mla_gen::spec::Arch::parse("sm_90").unwrap();
    let options = mla_gen::compile::options_for(&arch);
    let compiled = match nvrtc
        .compile("producer.cu", source, &options, true, true)
        .unwrap()
    {
        Ok(c) => c,
        Err(f) => panic!("{}\n{}", f.message, f.log),
    };
    let ptx = String::from_utf8(compiled.ptx.clone().unwrap()).unwrap();
    for entry in ["pdl_late_writer(", "pdl_writer("] {
        assert!(ptx.contains(&format!(".entry {entry}")), "{entry}");
    }
    let late = &ptx[ptx.find(".entry pdl_late_writer(").unwrap()..];
    let trigger = late.find("griddepcontrol.launch_dependents").unwrap();
    assert!(trigger < late.find("st.global").unwrap());
    if let Some(dir) = std::env::var_os("MLA_GEN_PDL_OUT") {
        let dir = std::path::Path::new(&dir);
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("producer.sm_90.ptx"), &ptx).unwrap();
        std::fs::write(dir.join("producer.sm_90.cubin"), compiled.cubin.unwrap()).unwrap();
    }
}

//! The build-time API: output in a given folder, a cache that makes an unchanged second build
//! compile nothing, a skip mode for documentation builds (and docs.rs), and prebuilt folders
//! embedded without NVRTC, each file checked against its manifest.

use std::path::{Path, PathBuf};
use std::process::Command;

use mla_gen::Builder;

// Without size rules: two kernels whatever specs/tuned.toml holds.
const SPEC: &str = "arch = [\"sm_90\"]\n[[merge_attn_states]]\ndtype = [\"bf16\", \"f32\"]\nhead_size = 128\nsize_rule = false\ndense = false\n";

#[test]
fn a_second_build_with_nothing_changed_compiles_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let build = |spec: &str| {
        Builder::new()
            .spec_str("engine.toml", spec)
            .out_dir(tmp.path())
            .build()
            .unwrap()
    };
    let first = build(SPEC);
    assert!(first.compiled && !first.skipped);
    assert_eq!(first.kernels, 2);
    let module = std::fs::read_to_string(&first.module).unwrap();
    assert!(module.contains("pub fn merge_attn_states_bf16_d128_thr_lse("));
    assert!(module
        .contains("prefix_output: &impl mla_gen::cudarc::driver::DevicePtr<mla_gen::half::bf16>,"));
    assert!(
        module.contains("output_lse: Option<&mut dyn mla_gen::cudarc::driver::DevicePtrMut<f32>>,")
    );
    // One handle per kernel, resolved once by `load`; `select` picks one at run time.
    assert!(module.contains(
        "pub merge_attn_states_f32_d128_thr_lse: std::sync::Arc<mla_gen::runtime::Kernel>,"
    ));
    assert!(module.contains("merge_attn_states_f32_d128_thr_lse: runtime.require(\"merge_attn_states_f32_d128_thr_lse\")?,"));
    assert!(module.contains(
        "pub fn select(&self, call: &mla_gen::runtime::Call) -> Result<&mla_gen::runtime::Kernel, mla_gen::runtime::NoMatch> {"
    ));
    assert!(module.contains("pub fn merge_attn_states_f32_d128_thr_lse("));
    assert!(module.contains("kernels/merge_attn_states_f32_d128_thr_lse.sm_90.cubin"));
    let stamp = std::fs::metadata(&first.module)
        .unwrap()
        .modified()
        .unwrap();
    let manifest_stamp = std::fs::metadata(first.dir.join("manifest.json"))
        .unwrap()
        .modified()
        .unwrap();

    let second = build(SPEC);
    assert!(!second.compiled, "unchanged inputs must reuse the cache");
    assert_eq!(
        std::fs::metadata(&second.module)
            .unwrap()
            .modified()
            .unwrap(),
        stamp
    );
    assert_eq!(
        std::fs::metadata(second.dir.join("manifest.json"))
            .unwrap()
            .modified()
            .unwrap(),
        manifest_stamp
    );

    // Any input change compiles again: the spec, or the archs.
    let third = build(&SPEC.replace("head_size = 128", "head_size = [128, 64]"));
    assert!(third.compiled);
    assert_eq!(third.kernels, 4);
    let fourth = Builder::new()
        .spec_str("engine.toml", SPEC)
        .archs(["sm_80"])
        .out_dir(tmp.path())
        .build()
        .unwrap();
    assert!(fourth.compiled);
    assert!(std::fs::read_to_string(&fourth.module)
        .unwrap()
        .contains(".sm_80.cubin"));
}

/// `build()` reads its manifest as `prebuilt()` and the runtime do: an entry it cannot read
/// is refused, never left out of the module.
#[test]
fn build_refuses_a_kernel_it_cannot_read_as_prebuilt_does() {
    let tmp = tempfile::tempdir().unwrap();
    let build = || {
        Builder::new()
            .spec_str("engine.toml", SPEC)
            .out_dir(tmp.path())
            .build()
    };
    assert_eq!(build().unwrap().kernels, 2);
    // The cache key still matches, so the second build reads the manifest as it is now.
    let manifest = tmp.path().join("mla-gen").join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let unreadable = text.replacen(
        "\"lse_layout\": \"head_major\"",
        "\"lse_layout\": \"diagonal\"",
        1,
    );
    assert_ne!(text, unreadable);
    std::fs::write(&manifest, unreadable).unwrap();
    let refused = |e: mla_gen::Error| {
        let e = e.to_string();
        assert!(
            e.contains("cannot read the entry of kernel merge_attn_states_bf16_d128_thr_lse")
                && e.contains("regenerate"),
            "{e}"
        );
    };
    refused(build().unwrap_err());
    let other = tempfile::tempdir().unwrap();
    refused(
        Builder::new()
            .prebuilt(tmp.path().join("mla-gen"))
            .out_dir(other.path())
            .build()
            .unwrap_err(),
    );
}

#[test]
fn skip_mode_declares_every_function_and_embeds_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let built = Builder::new()
        .spec_str("engine.toml", SPEC)
        .out_dir(tmp.path())
        .skip_compile(true)
        .build()
        .unwrap();
    assert!(built.skipped && !built.compiled);
    let module = std::fs::read_to_string(&built.module).unwrap();
    assert!(module.contains("pub fn merge_attn_states_bf16_d128_thr_lse("));
    assert!(module.contains("pub const FILES: &[(&str, &[u8])] = &[];"));
    assert!(
        !built.dir.exists(),
        "nothing compiled, nothing written but the module"
    );
}

#[test]
fn group_fp8_kernels_get_a_typed_function_taking_the_scales() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = "[[merge_attn_states]]\ndtype = \"f16\"\nhead_size = 128\noutput = [\"fp8_e4m3\", \"fp8_e4m3_group\"]\ngroup_size = 32\nue8m0 = true\n";
    let built = Builder::new()
        .spec_str("group.toml", spec)
        .out_dir(tmp.path())
        .skip_compile(true)
        .build()
        .unwrap();
    let module = std::fs::read_to_string(&built.module).unwrap();
    let group = module
        .split("\n    pub fn ")
        .find(|f| f.starts_with("merge_attn_states_f16_d128_thr_lse_fp8g32_ue8m0("))
        .expect("a function for the group-FP8 kernel");
    assert!(group.contains("output: &mut impl mla_gen::cudarc::driver::DevicePtrMut<u8>,"));
    assert!(group
        .contains("prefix_output: &impl mla_gen::cudarc::driver::DevicePtr<mla_gen::half::f16>,"));
    assert!(group.contains("output_scales: &mut impl mla_gen::cudarc::driver::DevicePtrMut<f32>,"));
    assert!(group.contains("output_scales_layout: mla_gen::runtime::ScaleLayout,"));
    assert!(group.contains("prefill_tokens_with_context: Option<usize>,"));
    assert!(!group.contains("output_scale:"));
    let per_tensor = module
        .split("\n    pub fn ")
        .find(|f| f.starts_with("merge_attn_states_f16_d128_thr_lse_fp8("))
        .and_then(|f| f.split("l.run()").next())
        .expect("a function for the per-tensor FP8 kernel");
    assert!(per_tensor.contains("output_scale: &impl mla_gen::cudarc::driver::DevicePtr<f32>,"));
    assert!(!per_tensor.contains("ScaleLayout") && !per_tensor.contains("output_scales"));
}

#[test]
fn spec_errors_and_a_missing_out_dir_are_reported() {
    let e = Builder::new()
        .spec_str(
            "bad.toml",
            "[[merge_attn_states]]\ndtype = \"bf8\"\nhead_size = 64\n",
        )
        .out_dir(std::env::temp_dir())
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("bad.toml:2:9:"), "{e}");
    let e = Builder::new()
        .spec_file("/nonexistent/engine.toml")
        .out_dir(std::env::temp_dir())
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/nonexistent/engine.toml") && e.contains("cannot read the spec"),
        "{e}"
    );
    if std::env::var_os("OUT_DIR").is_none() {
        let e = Builder::new().build().unwrap_err().to_string();
        assert!(
            e.contains("OUT_DIR") && e.contains("Builder::out_dir"),
            "{e}"
        );
    }
}

/// A relative `out_dir` (here under target/, relative to the test's working directory, the
/// package root) still gives a module whose embedded paths are absolute: `include_bytes!`
/// resolves a relative path against the module's folder, where it would name nothing.
#[test]
fn a_relative_out_dir_embeds_absolute_paths() {
    let rel = PathBuf::from(format!("target/builder-relative-{}", std::process::id()));
    let built = Builder::new()
        .spec_str("engine.toml", SPEC)
        .out_dir(&rel)
        .build()
        .unwrap();
    let module = std::fs::read_to_string(&built.module).unwrap();
    let files = included(&module);
    let _ = std::fs::remove_dir_all(&rel);
    assert!(!files.is_empty(), "{module}");
    for f in &files {
        assert!(f.is_absolute(), "{} is relative", f.display());
    }
}

/// Runs the ignored test `name` of this binary in a child process with `env` set (the build
/// reads its environment, which a test cannot change under the others running in parallel).
fn in_child(name: &str, env: &[(&str, &Path)]) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--ignored", "--nocapture"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
        .env("MLA_GEN_NVRTC", "/nonexistent")
        .env_remove("MLA_GEN_SKIP_COMPILE")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{name} in a child process:\n{text}"
    );
}

const CHILD: &str = "run by its parent test in a child process";

#[test]
fn docs_rs_builds_the_module_without_kernels_or_nvrtc() {
    let tmp = tempfile::tempdir().unwrap();
    in_child(
        "docs_rs_child",
        &[
            ("DOCS_RS", Path::new("1")),
            ("MLA_GEN_TEST_OUT", tmp.path()),
        ],
    );
}

#[test]
#[ignore = "run by its parent test in a child process"]
fn docs_rs_child() {
    let out = std::env::var_os("MLA_GEN_TEST_OUT").expect(CHILD);
    // MLA_GEN_NVRTC=/nonexistent: loading NVRTC would fail the build.
    let built = Builder::new()
        .spec_str("engine.toml", SPEC)
        .out_dir(&out)
        .build()
        .unwrap();
    assert!(built.skipped && !built.compiled);
    assert_eq!(built.kernels, 2);
    let module = std::fs::read_to_string(&built.module).unwrap();
    assert!(module.contains("pub fn merge_attn_states_bf16_d128_thr_lse("));
    assert!(module.contains("pub const FILES: &[(&str, &[u8])] = &[];"));
    assert!(!built.dir.exists());
}

/// What `mla-gen generate --out DIR` writes, for SPEC.
fn generate(dir: &Path) {
    let spec = mla_gen::spec::parse("engine.toml", SPEC).unwrap();
    let templates = mla_gen::render::Templates::embedded().unwrap();
    let (files, _) = mla_gen::generate_files(&spec, &templates, 1, false).unwrap();
    mla_gen::emit::write(dir, &files).unwrap();
}

/// The files a module embeds: `include_bytes!`/`include_str!` paths.
fn included(module: &str) -> Vec<PathBuf> {
    module
        .split("include_")
        .skip(1)
        .filter_map(|s| s.split_once("!(\"")?.1.split_once('"'))
        .map(|(path, _)| PathBuf::from(path))
        .collect()
}

#[test]
fn a_prebuilt_folder_needs_no_nvrtc_and_its_kernels_are_embedded() {
    let tmp = tempfile::tempdir().unwrap();
    let kernels = tmp.path().join("kernels");
    generate(&kernels);
    let out = tmp.path().join("out");
    in_child(
        "prebuilt_child",
        &[
            ("MLA_GEN_TEST_KERNELS", &kernels),
            ("MLA_GEN_TEST_OUT", &out),
        ],
    );
    let module = std::fs::read_to_string(out.join("mla_gen_kernels.rs")).unwrap();
    assert!(module.contains("pub fn merge_attn_states_bf16_d128_thr_lse("));
    assert!(module.contains("pub fn merge_attn_states_f32_d128_thr_lse("));
    // Absolute paths into the folder: the manifest, and every PTX and CUBIN it lists.
    let real = std::fs::canonicalize(&kernels).unwrap();
    let files = included(&module);
    assert!(files.contains(&real.join("manifest.json")), "{module}");
    for name in [
        "merge_attn_states_bf16_d128_thr_lse",
        "merge_attn_states_f32_d128_thr_lse",
    ] {
        for ext in ["sm_90.ptx", "sm_90.cubin"] {
            let f = real.join(format!("kernels/{name}.{ext}"));
            assert!(
                files.contains(&f),
                "{} not embedded:\n{module}",
                f.display()
            );
        }
    }
    assert_eq!(files.len(), 5);
    assert!(files.iter().all(|f| f.is_file()));
}

#[test]
#[ignore = "run by its parent test in a child process"]
fn prebuilt_child() {
    let dir = std::env::var_os("MLA_GEN_TEST_KERNELS").expect(CHILD);
    let out = std::env::var_os("MLA_GEN_TEST_OUT").expect(CHILD);
    let built = Builder::new().prebuilt(&dir).out_dir(&out).build().unwrap();
    assert!(!built.compiled && !built.skipped);
    assert_eq!(built.kernels, 2);
    assert_eq!(built.dir, PathBuf::from(dir));
}

#[test]
fn a_prebuilt_folder_whose_file_differs_from_its_manifest_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let kernels = tmp.path().join("kernels");
    generate(&kernels);
    let build = || {
        Builder::new()
            .prebuilt(&kernels)
            .out_dir(tmp.path().join("out"))
            .build()
    };
    build().unwrap();

    let cubin = kernels.join("kernels/merge_attn_states_f32_d128_thr_lse.sm_90.cubin");
    let mut bytes = std::fs::read(&cubin).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&cubin, &bytes).unwrap();
    let e = build().unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("merge_attn_states_f32_d128_thr_lse.sm_90.cubin: sha256 ")
            && text.contains("differs from the manifest's")
            && text.contains("mla-gen generate")
            && text.contains("mla-gen check"),
        "{text}"
    );
    // What a build script's `main() -> Result<(), Box<dyn Error>>` prints is the message.
    assert_eq!(format!("{e:?}"), text);

    std::fs::remove_file(&cubin).unwrap();
    let text = build().unwrap_err().to_string();
    assert!(
        text.contains("merge_attn_states_f32_d128_thr_lse.sm_90.cubin: cannot read it"),
        "{text}"
    );

    let manifest = kernels.join("manifest.json");
    let original = std::fs::read_to_string(&manifest).unwrap();
    // Names become identifiers in the module: code in a name is refused.
    std::fs::write(
        &manifest,
        original.replace(
            "\"name\": \"merge_attn_states_bf16_d128_thr_lse\"",
            "\"name\": \"x() {} fn y\"",
        ),
    )
    .unwrap();
    let text = build().unwrap_err().to_string();
    assert!(
        text.contains("\"x() {} fn y\" is not an identifier"),
        "{text}"
    );
    // A manifest that says PTX where its file is a CUBIN (size and hash right): refused at the
    // build, as a load would refuse it.
    let mut v: serde_json::Value = serde_json::from_str(&original).unwrap();
    let arch = &mut v["kernels"][0]["archs"][0];
    let (ptx, cubin) = (arch["ptx"].take(), arch["cubin"].take());
    (arch["ptx"], arch["cubin"]) = (cubin, ptx);
    std::fs::write(&manifest, serde_json::to_string(&v).unwrap()).unwrap();
    let text = build().unwrap_err().to_string();
    assert!(
        text.contains(".sm_90.cubin: it is not PTX text, as the manifest says"),
        "{text}"
    );
    std::fs::write(&manifest, &original).unwrap();
    let escaping = std::fs::read_to_string(&manifest).unwrap().replace(
        "\"kernels/merge_attn_states_f32_d128_thr_lse.sm_90.cubin\"",
        "\"../../etc/passwd\"",
    );
    std::fs::write(&manifest, escaping).unwrap();
    let text = build().unwrap_err().to_string();
    assert!(
        text.contains("\"../../etc/passwd\", which is not a path inside the folder"),
        "{text}"
    );

    std::fs::remove_file(&manifest).unwrap();
    let text = build().unwrap_err().to_string();
    assert!(
        text.contains("manifest.json: cannot read it")
            && text.contains("a folder `mla-gen generate --out` wrote"),
        "{text}"
    );
    let text = Builder::new()
        .prebuilt(&kernels)
        .archs(["sm_80"])
        .out_dir(tmp.path())
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("Builder::archs does not apply to a prebuilt folder"),
        "{text}"
    );
}

#[test]
fn a_size_rules_kernels_have_methods_and_select_names_no_kernel() {
    let tmp = tempfile::tempdir().unwrap();
    let built = Builder::new()
        .spec_str(
            "engine.toml",
            "arch = [\"sm_90\"]\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\n",
        )
        .out_dir(tmp.path())
        .build()
        .unwrap();
    let module = std::fs::read_to_string(&built.module).unwrap();
    // The tuned rule of bf16 d64 (specs/tuned.toml) adds a kernel for smaller launches.
    assert!(built.kernels >= 2, "{}", built.kernels);
    let rule_kernel = module
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("pub fn merge_attn_states_bf16_d64_thr_lse_below")
        })
        .expect("a method for the rule's kernel");
    let rows = rule_kernel.split('(').next().unwrap();
    assert!(!rows.is_empty());
    // Selection is the runtime's, from the manifest: no kernel is named in it.
    let select = module.split("pub fn select(").nth(1).expect("select");
    assert!(!select.contains("merge_attn_states_bf16_d64"), "{select}");
}

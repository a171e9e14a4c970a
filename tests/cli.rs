//! The `mla-gen` binary, as a user runs it: exit codes, messages, and what is (not) written.

use std::path::Path;
use std::process::{Command, Output};

use mla_gen::emit::read_tree;

fn mla_gen(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mla-gen"));
    c.args(args);
    for (k, v) in envs {
        c.env(k, v);
    }
    c.env_remove("MLA_GEN_ARCH");
    c.output().expect("runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn write_spec(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

const SMALL: &str = "arch = [\"sm_90\"]\n[[merge_attn_states]]\ndtype = [\"bf16\", \"f32\"]\nhead_size = [64, 128]\nsize_rule = false\ndense = false\n";

/// generated/ is the default spec's generation: CI's first step generates it afresh and fails on
/// any byte of difference from the committed manifest, and scripts/test.sh (`mla-gen verify`,
/// scripts/images.sh) makes its images present before these tests, so the default's layout is
/// checked there rather than by a second generation of every kernel (ten minutes of CI).
#[test]
fn the_default_spec_generates_cubins_the_newest_ptx_and_no_sources() {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("generated");
    let text = std::fs::read(out.join("manifest.json")).unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(manifest["spec"]["source"], "<embedded default spec>");
    // 564 kernels engines call, their size rules' kernels and the dense specializations of
    // each, each 4 CUBIN (sm_80, sm_90, sm_100, sm_120) + the PTX of sm_120 (`ptx = "newest"`;
    // no .cu: `sources = false`), + manifest.
    let kernels = manifest["kernels"].as_array().unwrap();
    let called = kernels
        .iter()
        .filter(|k| k["variant"]["rows_below"].is_null() && k["variant"]["dense"].is_null())
        .count();
    assert_eq!(called, 564);
    for k in kernels {
        assert!(k.get("source").is_none(), "{}", k["name"]);
        let archs: Vec<&str> = k["archs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["arch"].as_str().unwrap())
            .collect();
        assert_eq!(
            archs,
            ["sm_80", "sm_90", "sm_100", "sm_120"],
            "{}",
            k["name"]
        );
        for a in k["archs"].as_array().unwrap() {
            let newest = a["arch"] == "sm_120";
            assert_eq!(
                a.get("ptx").is_some(),
                newest,
                "{} {}",
                k["name"],
                a["arch"]
            );
            assert!(a.get("cubin").is_some());
        }
    }
    // The files: exactly the manifest's, each with its recorded size and sha256. Skipped only
    // where no image is there at all; some images and a failing verify is a failure.
    let any_image = std::fs::read_dir(out.join("kernels")).is_ok_and(|d| {
        d.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.ends_with(".cubin") || name.ends_with(".ptx")
        })
    });
    if !any_image {
        println!(
            "generated/ has no images yet (scripts/images.sh builds them; scripts/test.sh runs it \
             first): checked manifest.json only."
        );
        return;
    }
    let o = mla_gen(&["verify", "--out", &out.display().to_string()], &[]);
    assert!(o.status.success(), "mla-gen verify: {}", stderr(&o));
    let tree = read_tree(&out).unwrap();
    let images = tree.keys().filter(|f| f.starts_with("kernels/")).count();
    assert_eq!(images, kernels.len() * 5);
    assert!(tree.contains_key("kernels/merge_attn_states_bf16_d128_thr_lse.sm_100.cubin"));
    assert!(tree.contains_key("kernels/merge_attn_states_bf16_d576_thr_lse.sm_90.cubin"));
    assert!(tree.contains_key("kernels/merge_attn_states_bf16_d128_thr_lse.sm_120.ptx"));
    assert!(!tree.contains_key("kernels/merge_attn_states_bf16_d128_thr_lse.sm_90.ptx"));
    assert!(!tree.keys().any(|f| f.ends_with(".cu")));
}

#[test]
fn generate_then_check_then_detect_every_kind_of_drift() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(tmp.path(), "s.toml", SMALL);
    let out = tmp.path().join("gen");
    let out_s = out.display().to_string();
    let o = mla_gen(&["generate", &spec, "--out", &out_s], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = mla_gen(&["check", &spec, "--out", &out_s], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // A second generate with nothing changed writes nothing.
    let cu = out.join("kernels/merge_attn_states_bf16_d64_thr_lse.cu");
    let before = std::fs::metadata(&cu).unwrap().modified().unwrap();
    let o = mla_gen(&["generate", &spec, "--out", &out_s], &[]);
    assert!(
        stderr(&o).contains("up to date, nothing written"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::metadata(&cu).unwrap().modified().unwrap(), before);

    std::fs::write(&cu, "// edited by hand\n").unwrap();
    std::fs::remove_file(out.join("kernels/merge_attn_states_f32_d128_thr_lse.sm_90.ptx")).unwrap();
    std::fs::write(out.join("kernels/stray.txt"), "x").unwrap();
    let o = mla_gen(&["check", &spec, "--out", &out_s], &[]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("stale") && e.contains("merge_attn_states_bf16_d64_thr_lse.cu"),
        "{e}"
    );
    assert!(
        e.contains("missing") && e.contains("merge_attn_states_f32_d128_thr_lse.sm_90.ptx"),
        "{e}"
    );
    assert!(e.contains("extra") && e.contains("stray.txt"), "{e}");

    // Regenerating repairs all three; an unchanged file keeps its timestamp.
    let kept = out.join("kernels/merge_attn_states_f32_d64_thr_lse.cu");
    let kept_before = std::fs::metadata(&kept).unwrap().modified().unwrap();
    let o = mla_gen(&["generate", &spec, "--out", &out_s], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        mla_gen(&["check", &spec, "--out", &out_s], &[])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(
        std::fs::metadata(&kept).unwrap().modified().unwrap(),
        kept_before
    );
}

#[test]
fn generation_is_byte_identical_across_job_counts_and_folders() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(tmp.path(), "s.toml", SMALL);
    let a = tmp.path().join("a");
    let b = tmp.path().join("deeper/b");
    let o = mla_gen(
        &[
            "generate",
            &spec,
            "--out",
            &a.display().to_string(),
            "-j",
            "1",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = Command::new(env!("CARGO_BIN_EXE_mla-gen"))
        .args([
            "generate",
            "s.toml",
            "--out",
            &b.display().to_string(),
            "-j",
            "2",
        ])
        .current_dir(tmp.path())
        .env("TZ", "Pacific/Kiritimati")
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let (ta, tb) = (read_tree(&a).unwrap(), read_tree(&b).unwrap());
    assert_eq!(ta.len(), 4 * 3 + 1);
    assert_eq!(ta, tb);
    let manifest = String::from_utf8(ta["manifest.json"].clone()).unwrap();
    assert!(
        !manifest.contains(&tmp.path().display().to_string()),
        "absolute path in manifest"
    );
}

#[test]
fn spec_errors_point_at_file_line_and_column_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let out_s = out.display().to_string();
    let cases = [
        (
            "syntax.toml",
            "[[merge_attn_states]\ndtype = \"bf16\"\n",
            "syntax.toml:1:",
            "expected",
        ),
        (
            "unknown.toml",
            "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_sise = 128\n",
            "unknown.toml:3:1",
            "unknown field `head_sise`",
        ),
        (
            "dtype.toml",
            "[[merge_attn_states]]\ndtype = [\"bf16\", \"fp8\"]\nhead_size = 128\n",
            "dtype.toml:2:9",
            "\"fp8\" is not allowed; allowed: f32, f16, bf16",
        ),
        (
            "head.toml",
            "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = [128, 2048]\n",
            "head.toml:3:13",
            "2048 is out of range; allowed: 1..=1024",
        ),
        (
            "arch.toml",
            "arch = \"sm_70\"\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\n",
            "arch.toml:1:8",
            "older than sm_80",
        ),
        (
            "missing.toml",
            "[[merge_attn_states]]\ndtype = \"bf16\"\n",
            "missing.toml:1:1",
            "missing the required key `head_size`",
        ),
        (
            "layout.toml",
            "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\nlse_layout = \"row_major\"\n",
            "layout.toml:4:14",
            "allowed: head_major, token_major",
        ),
    ];
    for (name, text, location, message) in cases {
        let spec = write_spec(tmp.path(), name, text);
        let o = mla_gen(&["generate", &spec, "--out", &out_s], &[]);
        assert_eq!(o.status.code(), Some(1), "{name}");
        let e = stderr(&o);
        assert!(e.contains(location), "{name}: expected {location} in\n{e}");
        assert!(e.contains(message), "{name}: expected {message} in\n{e}");
        assert!(!out.exists(), "{name}: wrote output");
        assert_eq!(mla_gen(&["list", &spec], &[]).status.code(), Some(1));
    }
}

#[test]
fn a_failed_generate_leaves_the_previous_output_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(tmp.path(), "s.toml", SMALL);
    let out = tmp.path().join("out");
    let out_s = out.display().to_string();
    assert!(mla_gen(&["generate", &spec, "--out", &out_s], &[])
        .status
        .success());
    let before = read_tree(&out).unwrap();

    let bad = write_spec(
        tmp.path(),
        "bad.toml",
        "[[merge_attn_states]]\ndtype = 1\nhead_size = 64\n",
    );
    assert_eq!(
        mla_gen(&["generate", &bad, "--out", &out_s], &[])
            .status
            .code(),
        Some(1)
    );
    let o = mla_gen(
        &["generate", &spec, "--out", &out_s, "--arch", "sm_100"],
        &[("MLA_GEN_NVRTC", "/nonexistent/libnvrtc.so")],
    );
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(read_tree(&out).unwrap(), before);
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".mla-gen-staging")
        })
        .collect();
    assert!(leftovers.is_empty(), "staging folders left behind");
}

#[test]
fn missing_nvrtc_says_where_it_looked_and_how_to_install() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = mla_gen(
        &["generate", "--out", &out.display().to_string()],
        &[("MLA_GEN_NVRTC", "/nonexistent/nvrtc")],
    );
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("NVRTC (libnvrtc) not found"), "{e}");
    assert!(e.contains("MLA_GEN_NVRTC=/nonexistent/nvrtc"), "{e}");
    assert!(
        e.contains("python3 -m pip install nvidia-cuda-nvrtc==13.0.88"),
        "{e}"
    );
    assert!(!out.exists());
    let o = mla_gen(&["doctor"], &[("MLA_GEN_NVRTC", "/nonexistent/nvrtc")]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn refuses_to_replace_a_folder_it_did_not_write() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(tmp.path(), "s.toml", SMALL);
    let out = tmp.path().join("src");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("main.rs"), "fn main() {}").unwrap();
    let o = mla_gen(
        &["generate", &spec, "--out", &out.display().to_string()],
        &[],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("not an mla-gen output folder"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read_to_string(out.join("main.rs")).unwrap(),
        "fn main() {}"
    );
    // Refused before taking the lock: no `.mla-gen.lock` left in the parent (which a `check` of
    // that parent would then call an extra file).
    assert!(
        !tmp.path().join(mla_gen::emit::LOCK_FILE).exists(),
        "a refused generate leaves no lock file"
    );
    // A `manifest.json` of something else (a browser extension's) does not make a folder ours.
    let ext = tmp.path().join("ext");
    std::fs::create_dir(&ext).unwrap();
    let theirs = r#"{"manifest_version": 3, "name": "an extension"}"#;
    std::fs::write(ext.join("manifest.json"), theirs).unwrap();
    std::fs::write(ext.join("background.js"), "chrome.runtime;").unwrap();
    let o = mla_gen(
        &["generate", &spec, "--out", &ext.display().to_string()],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("not an mla-gen output folder"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read_to_string(ext.join("manifest.json")).unwrap(),
        theirs
    );
    assert!(ext.join("background.js").is_file());
}

#[test]
fn list_render_inspect_doctor() {
    let o = mla_gen(&["list"], &[]);
    assert!(o.status.success());
    let names: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
    let called = names
        .iter()
        .filter(|n| !n.contains("_below") && !n.contains("_dense"));
    assert_eq!(called.count(), 564);
    assert!(names.contains(&"merge_attn_states_bf16_d576_thr_lse".to_string()));

    let o = mla_gen(
        &["render", "--kernel", "merge_attn_states_f32_d80_thr_lse"],
        &[],
    );
    assert!(o.status.success());
    let src = stdout(&o);
    assert!(src.contains("extern \"C\" __global__ void __launch_bounds__(BLOCK_THREADS, MIN_BLOCKS_PER_SM) merge_attn_states_f32_d80_thr_lse("));
    assert!(!src.contains("#include"));

    // An unknown kernel is a usage error (exit 2, as the help says).
    let o = mla_gen(&["render", "--kernel", "merge_attn_states_bf16_d100"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no kernel named `merge_attn_states_bf16_d100`"));
    assert!(stderr(&o).contains("did you mean"), "{}", stderr(&o));

    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(tmp.path(), "s.toml", SMALL);
    // Nothing near the name: the hint lists the spec that was rendered from.
    let o = mla_gen(&["render", &spec, "--kernel", "frobnicate"], &[]);
    assert_eq!(o.status.code(), Some(2));
    let want = format!("run `mla-gen list {spec}` for the names");
    assert!(stderr(&o).contains(&want), "{}", stderr(&o));
    let o = mla_gen(&["inspect", &spec], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("no spills"));
    assert!(stdout(&o).contains("merge_attn_states_bf16_d128_thr_lse"));
    let o = mla_gen(&["inspect", &spec, "--json"], &[]);
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 4);
    assert!(
        rows[0]["archs"][0]["resources"]["registers"]
            .as_u64()
            .unwrap()
            > 0
    );

    let o = mla_gen(&["doctor"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let d = stdout(&o);
    assert!(
        d.contains("NVRTC loaded:") && d.contains("PTX ISA:") && d.contains("GPU driver:"),
        "{d}"
    );
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(mla_gen(&["frobnicate"], &[]).status.code(), Some(2));
    assert_eq!(mla_gen(&["render"], &[]).status.code(), Some(2));
    assert_eq!(
        mla_gen(&["generate", "--jobs", "many"], &[]).status.code(),
        Some(2)
    );
    let o = mla_gen(&["--help"], &[]);
    assert!(o.status.success());
    let h = stdout(&o);
    assert!(h.contains("Examples:"));
    // The spec keys' reference, and every exit code of check and verify.
    assert!(h.contains("docs/SPEC.md"), "{h}");
    assert!(h.contains("for verify, no manifest to read"), "{h}");
}

#[test]
fn arch_override_from_flag_and_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(tmp.path(), "s.toml", SMALL);
    let out = tmp.path().join("o");
    let o = mla_gen(
        &[
            "generate",
            &spec,
            "--out",
            &out.display().to_string(),
            "--arch",
            "compute_90",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let tree = read_tree(&out).unwrap();
    assert!(tree.keys().any(|k| k.ends_with(".compute_90.ptx")));
    assert!(!tree.keys().any(|k| k.ends_with(".cubin")));
    let o = mla_gen(
        &[
            "generate",
            &spec,
            "--out",
            &out.display().to_string(),
            "--arch",
            "sm_7",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("older than sm_80"), "{}", stderr(&o));
}

/// Errors about architectures name where they came from, and `--arch` and `MLA_GEN_ARCH` read a
/// list alike (`mla_gen` above clears `MLA_GEN_ARCH`, so these set it themselves).
#[test]
fn arch_errors_name_the_flag_or_the_variable_they_came_from() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(tmp.path(), "s.toml", SMALL);
    let with_env = |args: &[&str], value: &str| {
        Command::new(env!("CARGO_BIN_EXE_mla-gen"))
            .args(args)
            .env("MLA_GEN_ARCH", value)
            .output()
            .unwrap()
    };
    let o = with_env(&["list", &spec], "bogus");
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).starts_with("error: MLA_GEN_ARCH: `bogus` is not an architecture"),
        "{}",
        stderr(&o)
    );
    let o = mla_gen(&["list", &spec, "--arch", "bogus"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).starts_with("error: --arch: `bogus`"),
        "{}",
        stderr(&o)
    );

    // A stray comma: refused by both, naming its source.
    for o in [
        mla_gen(&["list", &spec, "--arch", "sm_90,"], &[]),
        with_env(&["list", &spec], "sm_90,"),
    ] {
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("an empty architecture"),
            "{}",
            stderr(&o)
        );
    }
    // Blank is unset.
    assert!(with_env(&["list", &spec], " ").status.success());

    // An arch NVRTC cannot target (checked before compiling): dropped from where it was named.
    let out = tmp.path().join("o").display().to_string();
    let o = with_env(&["generate", &spec, "--out", &out], "sm_99");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("drop sm_99 from MLA_GEN_ARCH."),
        "{}",
        stderr(&o)
    );
    let spec99 = write_spec(tmp.path(), "s99.toml", &SMALL.replace("sm_90", "sm_99"));
    let o = mla_gen(&["generate", &spec99, "--out", &out], &[]);
    assert!(
        stderr(&o).contains("drop sm_99 from the spec."),
        "{}",
        stderr(&o)
    );
}

#[test]
fn generate_takes_far_more_jobs_than_kernels() {
    // One kernel, `-j 5000`: generated as with `-j 1`. That the pool is capped at the kernels
    // (5000 idle threads took seconds to start) is the unit test `pool_never_outnumbers_the_kernels`;
    // a time bound here would be a timed test.
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(
        tmp.path(),
        "s.toml",
        "arch = [\"compute_90\"]\n[[mask_empty_context_lse]]\n",
    );
    let manifests: Vec<_> = ["5000", "1"]
        .iter()
        .map(|jobs| {
            let out = tmp.path().join(format!("o{jobs}"));
            let o = mla_gen(
                &[
                    "generate",
                    &spec,
                    "--out",
                    &out.display().to_string(),
                    "-q",
                    "-j",
                    jobs,
                ],
                &[],
            );
            assert!(o.status.success(), "{}", stderr(&o));
            std::fs::read(out.join("manifest.json")).unwrap()
        })
        .collect();
    assert_eq!(manifests[0], manifests[1]);
}

#[test]
fn list_refuses_a_templates_folder_render_would_refuse() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = write_spec(tmp.path(), "s.toml", SMALL);
    let o = mla_gen(&["list", &spec, "--templates", "/nonexistent"], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("cannot read template"),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).is_empty());
}

#[test]
fn schema_json_is_fresh_and_machine_outputs_parse() {
    let o = mla_gen(&["schema"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let committed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/manifest.schema.json"
    ))
    .unwrap();
    assert!(
        committed == stdout(&o),
        "docs/manifest.schema.json is stale: `mla-gen schema > docs/manifest.schema.json`"
    );
    let list = mla_gen(&["list", "--json"], &[]);
    let rows: serde_json::Value = serde_json::from_str(&stdout(&list)).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(
        rows.iter()
            .filter(|r| r["variant"]["rows_below"].is_null() && r["variant"]["dense"].is_null())
            .count(),
        564
    );
    assert!(rows[0]["params"][0]["tensor"]["dims"].is_array());
    let completions = mla_gen(&["completions", "bash"], &[]);
    assert!(stdout(&completions).contains("mla-gen"));
}

#[test]
fn check_exits_1_when_stale_and_2_when_it_cannot_run() {
    let dir = tempfile::tempdir().unwrap();
    let spec = write_spec(dir.path(), "s.toml", SMALL);
    let out = dir.path().join("out");
    let out_s = out.to_str().unwrap();
    assert!(mla_gen(&["generate", &spec, "--out", out_s, "-q"], &[])
        .status
        .success());
    let fresh = mla_gen(&["check", &spec, "--out", out_s, "--json"], &[]);
    assert_eq!(fresh.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_str(&stdout(&fresh)).unwrap();
    assert_eq!(v["fresh"], true);
    std::fs::write(out.join("kernels/extra.txt"), "x").unwrap();
    let stale = mla_gen(&["check", &spec, "--out", out_s, "--json"], &[]);
    assert_eq!(stale.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(&stdout(&stale)).unwrap();
    assert_eq!(v["extra"][0], "kernels/extra.txt");
    let missing_spec = mla_gen(&["check", "no-such-spec.toml", "--out", out_s], &[]);
    assert_eq!(
        missing_spec.status.code(),
        Some(2),
        "{}",
        stderr(&missing_spec)
    );
    let no_nvrtc = mla_gen(
        &["check", &spec, "--out", out_s],
        &[("MLA_GEN_NVRTC", "/nonexistent")],
    );
    assert_eq!(no_nvrtc.status.code(), Some(2), "{}", stderr(&no_nvrtc));
}

#[test]
fn a_stale_launcher_gets_the_command_that_writes_it_again() {
    // The hint repeats the flags that name the files: a prefixed launcher is regenerated under
    // its own prefix, not as c/mla_kernels.*.
    let dir = tempfile::tempdir().unwrap();
    let one = "arch = [\"sm_90\"]\n[[merge_attn_states]]\ndtype = [\"bf16\"]\nhead_size = [64]\n\
               size_rule = false\ndense = false\n";
    let spec = write_spec(dir.path(), "s.toml", one);
    let out = dir.path().join("out");
    let out_s = out.to_str().unwrap();
    let flags = ["--out", out_s, "--emit", "c", "--c-prefix", "eng"];
    let o = mla_gen(&[&["generate", &spec, "-q"][..], &flags[..]].concat(), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(out.join("c/eng_kernels.h"), "/* edited */\n").unwrap();
    let stale = mla_gen(&[&["check", &spec][..], &flags[..]].concat(), &[]);
    assert_eq!(stale.status.code(), Some(1), "{}", stderr(&stale));
    let e = stderr(&stale);
    let want = format!("mla-gen generate {spec} --out {out_s} --emit c --c-prefix eng`");
    assert!(e.contains(&want), "{want:?} missing from:\n{e}");
}

#[test]
fn out_dot_says_why_it_cannot_replace_the_current_folder() {
    let dir = tempfile::tempdir().unwrap();
    // A small spec beside the folder (the default one would compile 363 kernels first).
    let specs = tempfile::tempdir().unwrap();
    let spec = write_spec(specs.path(), "s.toml", SMALL);
    let o = Command::new(env!("CARGO_BIN_EXE_mla-gen"))
        .args(["generate", &spec, "--out", "."])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("Run from its parent"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing written"
    );
}

#[test]
fn bench_and_tune_document_the_l2_modes_and_refuse_bad_lists_before_needing_a_gpu() {
    for cmd in ["bench", "tune"] {
        let o = mla_gen(&[cmd, "--help"], &[]);
        assert!(o.status.success());
        let h = stdout(&o);
        for needle in [
            "--l2 <L2>",
            "cold",
            "hot",
            "both",
            "producer",
            "--graph-reps",
            "--shapes",
            "--only",
        ] {
            assert!(h.contains(needle), "{cmd} --help lacks {needle}:\n{h}");
        }
        assert!(h.contains("[default: both]"), "{h}");
        // Lists are checked first, so a typo is a usage error on any machine.
        let o = mla_gen(&[cmd, "--shapes", "613"], &[]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("write TxH or TxH/2"), "{}", stderr(&o));
        let o = mla_gen(&[cmd, "--only", "bf16"], &[]);
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).contains("dtype:head_size"), "{}", stderr(&o));
        let o = mla_gen(&[cmd, "--l2", "warm"], &[]);
        assert_eq!(o.status.code(), Some(2));
    }
    // Output into a folder that does not exist: said before any timing, GPU or not.
    for args in [
        &["bench", "--json", "/nonexistent-dir/b.json"][..],
        &["tune", "--json", "/nonexistent-dir/b.json"],
        &["tune", "--out", "/nonexistent-dir/tuned.toml"],
    ] {
        let o = mla_gen(args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("the folder /nonexistent-dir does not exist"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    let o = mla_gen(&["tune", "--help"], &[]);
    assert!(stdout(&o).contains("size rule"), "{}", stdout(&o));
    let o = mla_gen(&["bench", "--help"], &[]);
    assert!(stdout(&o).contains("percent of each"), "{}", stdout(&o));
    // Without a driver: exit 1 and say where to run it.
    if !mla_gen::runtime::driver_present() {
        for cmd in ["bench", "tune"] {
            let o = mla_gen(&[cmd, "--l2", "hot", "--shapes", "613x16"], &[]);
            assert_eq!(o.status.code(), Some(1));
            assert!(
                stderr(&o)
                    .contains("no CUDA driver (libcuda.so.1): tune and bench run on a GPU machine"),
                "{}",
                stderr(&o)
            );
        }
    }
}

/// `list --decisions` prints, per family, what a launch tries in which order: the size rule,
/// then the specializations most constrained first, then the kernel named.
#[test]
fn list_decisions_says_each_familys_dispatch_order() {
    let dir = tempfile::tempdir().unwrap();
    let spec = write_spec(
        dir.path(),
        "d.toml",
        "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\n[[merge_states]]\ndtype = \"bf16\"\nhead_size = 128\nnum_states = \"runtime\"\n",
    );
    let o = mla_gen(&["list", &spec, "--decisions"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let order: Vec<usize> = [
        "merge_attn_states (",
        "size rule",
        "`_dense_nothr`",
        "`_dense`",
        "else the kernel itself",
        "merge_states (",
    ]
    .iter()
    .map(|s| {
        out.find(s)
            .unwrap_or_else(|| panic!("{s:?} missing:\n{out}"))
    })
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{out}");
    let o = mla_gen(&["list", &spec, "--decisions", "--json"], &[]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "--json and --decisions are refused together"
    );
}

/// A reader that leaves early (`mla-gen list | head -1`) ends the listing quietly, by SIGPIPE as
/// Unix tools do, not with a panic about a broken pipe. The read end is closed at once, before
/// the listing's first line (a line a write: the first write meets the closed pipe).
#[cfg(unix)]
#[test]
fn list_into_a_closed_pipe_ends_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_mla-gen"))
        .arg("list")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked"),
        "list panicked on the closed pipe: {stderr}"
    );
    const SIGPIPE: i32 = 13; // Linux and macOS
    assert_eq!(
        out.status.signal(),
        Some(SIGPIPE),
        "status {:?}, stderr {stderr}",
        out.status
    );
}

//! `include_default = true` through the `mla-gen` binary: one spec, one command, a folder with
//! the default kernels (what the wheel ships) and the spec's own.

use std::process::{Command, Output};

fn mla_gen(args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mla-gen"));
    c.args(args).env_remove("MLA_GEN_ARCH");
    c.output().expect("runs")
}

fn lines(o: &Output) -> Vec<String> {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// A kernel the default lacks: group FP8 in groups of 32.
const EXTRA: &str = "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\noutput = \"fp8_e4m3_group\"\ngroup_size = 32\n";

#[test]
fn a_spec_with_include_default_lists_the_defaults_then_its_own() {
    let tmp = tempfile::tempdir().unwrap();
    let default = lines(&mla_gen(&["list"]));
    let with = tmp.path().join("with.toml");
    std::fs::write(&with, format!("include_default = true\n{EXTRA}")).unwrap();
    let names = lines(&mla_gen(&["list", with.to_str().unwrap()]));
    assert_eq!(names[..default.len()], default[..]);
    // The extra kernel and its twins (dense on by default), after the default's.
    let own = &names[default.len()..];
    assert_eq!(own[0], "merge_attn_states_bf16_d128_thr_lse_fp8g32");
    assert!(own[1..].iter().all(|n| n.starts_with(&own[0])), "{own:?}");
    // Without the key: the table alone.
    let without = tmp.path().join("without.toml");
    std::fs::write(&without, EXTRA).unwrap();
    assert_eq!(lines(&mla_gen(&["list", without.to_str().unwrap()])), own);
    // Each with its contract, as `generate` writes it into the folder's manifest.
    let o = mla_gen(&["list", with.to_str().unwrap(), "--json"]);
    assert!(o.status.success());
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let listed: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed, names);
}

#[test]
fn a_default_kernel_with_other_options_is_refused_with_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("s.toml");
    std::fs::write(
        &spec,
        "include_default = true\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\nprefix_threshold = false\nlse_layout = \"token_major\"\n",
    )
    .unwrap();
    let o = mla_gen(&["list", spec.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("s.toml:2:1: kernel `merge_attn_states_bf16_d128_lse_tm` is also in the embedded default spec"),
        "{e}"
    );
}

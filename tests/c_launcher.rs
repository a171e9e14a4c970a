//! The C launcher (`generate --emit c [--c-prefix NAME]`) compiles warning-free with gcc
//! -std=c11 -Wall -Wextra -Werror -pedantic against cuda.h; linked against stub driver functions
//! (tests/c/driver_stub.h, no GPU) its checks refuse every unsafe call with the contract's text,
//! each device gets the image the artifact rule picks, images load once per process under
//! concurrent launches, and two launchers with different prefixes link into one program. The
//! shared bad-argument table runs in tests/c_contract.rs.

#[path = "c/common.rs"]
mod common;

use std::path::Path;
use std::process::Command;

use common::{build_and_run, cuda_include, generate_c, mla_gen, test_file, STRICT};

// Without size rules: launcher_check.c asserts the tuned schedule's grid (rule_check.c tests rules).
const PAIRWISE_SPEC: &str = "arch = [\"sm_80\", \"sm_90\"]\n[[merge_attn_states]]\ndtype = [\"bf16\", \"f32\"]\nhead_size = [128, 100]\nsize_rule = false\ndense = false\n";

const FAMILIES_SPEC: &str = "arch = \"sm_90\"\n[[merge_states]]\ndtype = \"bf16\"\nhead_size = 128\nnum_states = [4, \"runtime\"]\n\
     [[merge_state_in_place]]\ndtype = \"bf16\"\nhead_size = 128\nmask = true\n[[mask_empty_context_lse]]\n";

const GROUP_SPEC: &str = "arch = \"sm_90\"\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\noutput = \"fp8_e4m3_group\"\ngroup_size = 64\nue8m0 = true\n\
     [[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\noutput = \"fp8_e4m3\"\n";

/// Build tests/c/`check` with the launcher in `c` and run it: it prints "1 passed, 0 failed".
fn run_check(tmp: &Path, c: &Path, check: &str) {
    let stdout = build_and_run(
        &tmp.join("check"),
        &[c],
        &[test_file(check), c.join("mla_kernels.c")],
    );
    assert!(stdout.contains("1 passed, 0 failed"), "{stdout}");
}

#[test]
fn the_c_launcher_compiles_warning_free_and_refuses_unsafe_calls() {
    let tmp = tempfile::tempdir().unwrap();
    let c = generate_c(tmp.path(), PAIRWISE_SPEC, None);
    // The header is C++-clean too, its init macro included.
    let cpp = tmp.path().join("use.cpp");
    std::fs::write(
        &cpp,
        "#include \"mla_kernels.h\"\nint main() {\n    mla_merge_attn_states_args a = MLA_MERGE_ATTN_STATES_ARGS_INIT;\n    \
         return mla_merge_attn_states_bf16_d128_thr_lse(nullptr, &a) == MLA_OK && mla_load() == MLA_OK ? 0 : 1;\n}\n",
    )
    .unwrap();
    let o = Command::new("g++")
        .args([
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
            "-I",
        ])
        .arg(cuda_include())
        .arg("-I")
        .arg(&c)
        .arg(&cpp)
        .output()
        .expect("g++ is installed");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Checks, images per device, loading, threads, statuses (tests/c/launcher_check.c).
    run_check(tmp.path(), &c, "launcher_check.c");
}

#[test]
fn the_c_launcher_applies_the_size_rule() {
    // The default tuned rule of bf16 d64 (specs/tuned.toml); its numbers from the manifest.
    // Without dense specializations: rule_check.c counts the images loaded (special_check.c
    // tests rules with them).
    let tmp = tempfile::tempdir().unwrap();
    let c = generate_c(
        tmp.path(),
        "arch = \"sm_90\"\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\nprefix_threshold = false\noutput_lse = false\ndense = false\n",
        None,
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(c.join("../manifest.json")).unwrap()).unwrap();
    let kernels = manifest["kernels"].as_array().unwrap();
    let main = kernels
        .iter()
        .find(|k| k["launch"]["size_rule"].is_object())
        .expect("bf16 d64 has a tuned size rule");
    let range = &main["launch"]["size_rule"]["ranges"][0];
    let alt_name = range["kernel"].as_str().unwrap();
    let alt = kernels.iter().find(|k| k["name"] == alt_name).unwrap();
    let geometry = |k: &serde_json::Value, tag: &str| {
        let l = &k["launch"];
        format!(
            "#define {tag}_TPB {}u\n#define {tag}_HPB {}u\n#define {tag}_BLOCK {}u\n",
            l["grid_x"]["per_block"], l["grid_y"]["per_block"], l["block_threads"]
        )
    };
    let name = main["name"].as_str().unwrap();
    let expect = format!(
        "#define D 64\n#define KERNEL \"{name}\"\n#define LAUNCH mla_{name}\n#define ALT mla_{alt_name}\n#define BELOW {}LL\n{}{}",
        range["below_rows"],
        geometry(main, "MAIN"),
        geometry(alt, "ALT")
    );
    std::fs::write(c.join("rule_expect.h"), expect).unwrap();
    run_check(tmp.path(), &c, "rule_check.c");
}

#[test]
fn the_c_launcher_launches_dense_specializations() {
    // bf16 d64 without and with its tuned size rule; the names from the manifest.
    let tmp = tempfile::tempdir().unwrap();
    for (dir, rule) in [("plain", "size_rule = false\n"), ("rule", "")] {
        let dir = tmp.path().join(dir);
        let c = generate_c(
            &dir,
            &format!("arch = \"sm_90\"\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\nprefix_threshold = false\noutput_lse = false\n{rule}"),
            None,
        );
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(c.join("../manifest.json")).unwrap()).unwrap();
        let kernels = manifest["kernels"].as_array().unwrap();
        let kernel = |name: &str| kernels.iter().find(|k| k["name"] == name).unwrap();
        // The `_dense` twin, last; before it only `_flat` ones, for fewer heads than the 16
        // special_check.c launches.
        let dense = |k: &serde_json::Value| {
            let s: Vec<&str> = k["launch"]["specializations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap())
                .collect();
            let (last, flat) = s.split_last().unwrap();
            assert!(flat.iter().all(|n| n.ends_with("_flat")), "{s:?}");
            last.to_string()
        };
        let main = &kernels[0];
        let (name, dense_name) = (main["name"].as_str().unwrap(), dense(main));
        let mut expect = format!(
            "#define D 64\n#define KERNEL \"{name}\"\n#define LAUNCH mla_{name}\n#define DENSE \"{dense_name}\"\n#define DENSE_LAUNCH mla_{dense_name}\n"
        );
        // Its last range: rows at its bound run the kernel itself, just below it that range's.
        let range = main["launch"]["size_rule"]["ranges"]
            .as_array()
            .and_then(|r| r.last());
        assert_eq!(
            range.is_some(),
            rule.is_empty(),
            "bf16 d64 has a tuned size rule"
        );
        if let Some(range) = range {
            let small = range["kernel"].as_str().unwrap();
            expect.push_str(&format!(
                "#define BELOW {}LL\n#define SMALL \"{small}\"\n#define SMALL_DENSE \"{}\"\n",
                range["below_rows"],
                dense(kernel(small))
            ));
        }
        std::fs::write(c.join("special_expect.h"), expect).unwrap();
        run_check(&dir, &c, "special_check.c");
    }
}

#[test]
fn prepared_launches_do_what_the_launcher_does() {
    // bf16 d128 with its threshold, output lse, size rule and dense twins (prepared_check.c
    // names its kernels).
    let tmp = tempfile::tempdir().unwrap();
    let c = generate_c(
        tmp.path(),
        "arch = \"sm_90\"\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\n",
        None,
    );
    run_check(tmp.path(), &c, "prepared_check.c");
}

#[test]
fn the_other_families_launchers_compile_and_refuse_unsafe_calls() {
    let tmp = tempfile::tempdir().unwrap();
    let c = generate_c(tmp.path(), FAMILIES_SPEC, None);
    run_check(tmp.path(), &c, "families_check.c");
}

#[test]
fn the_group_fp8_launcher_checks_its_scales() {
    let tmp = tempfile::tempdir().unwrap();
    let c = generate_c(tmp.path(), GROUP_SPEC, None);
    run_check(tmp.path(), &c, "group_check.c");
}

/// Compile `examples/c/<name>` warning-free against the launcher in `c` (no link: no GPU here).
fn compile_example(tmp: &Path, c: &Path, name: &str) {
    let example = format!("{}/examples/c/{name}", env!("CARGO_MANIFEST_DIR"));
    let mut args: Vec<String> = STRICT.iter().map(|s| s.to_string()).collect();
    args.extend([
        "-I".into(),
        cuda_include().display().to_string(),
        "-I".into(),
        c.display().to_string(),
        "-c".into(),
        example,
        "-o".into(),
        tmp.join("example.o").display().to_string(),
    ]);
    common::gcc(&args);
}

#[test]
fn the_c_examples_compile_against_their_generated_headers() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = |name: &str| {
        std::fs::read_to_string(format!("{}/examples/c/{name}", env!("CARGO_MANIFEST_DIR")))
            .unwrap()
    };
    let c = generate_c(tmp.path(), &spec("spec.toml"), None);
    compile_example(tmp.path(), &c, "merge.c");
    compile_example(tmp.path(), &c, "snippet.c");
    compile_example(tmp.path(), &c, "devices.c");
    let families = tmp.path().join("families");
    std::fs::create_dir(&families).unwrap();
    let c = generate_c(&families, &spec("families.toml"), None);
    compile_example(&families, &c, "families.c");
}

const TWO_PREFIXES_MAIN: &str = r#"/* Two launchers in one program: each carries its own prefix. */
#include "alpha_kernels.h"
#include "beta_kernels.h"

#include <stdio.h>
#include <string.h>

#include "driver_stub.h"

static _Alignas(16) unsigned short out[4 * 2 * 128], prefix[4 * 2 * 128], suffix[4 * 2 * 128], states[4 * 4 * 2 * 128];
static float plse[8], slse[8], states_lse[4 * 4 * 2];

int main(void) {
    int failures = 0;
    alpha_merge_attn_states_args a = ALPHA_MERGE_ATTN_STATES_ARGS_INIT;
    a.output = out; a.output_numel = 1024; a.prefix_output = prefix; a.prefix_output_numel = 1024;
    a.prefix_lse = plse; a.prefix_lse_numel = 8; a.suffix_output = suffix; a.suffix_output_numel = 1024;
    a.suffix_lse = slse; a.suffix_lse_numel = 8; a.num_tokens = 4; a.num_heads = 2;
    a.output_token_stride = a.prefix_token_stride = a.suffix_token_stride = 256;
    a.output_head_stride = a.prefix_head_stride = a.suffix_head_stride = 128;
    beta_merge_states_args b = BETA_MERGE_STATES_ARGS_INIT;
    b.output = out; b.output_numel = 1024; b.states = states; b.states_numel = 4096;
    b.states_lse = states_lse; b.states_lse_numel = 32; b.num_tokens = 4; b.num_heads = 2;
    b.output_token_stride = 256; b.output_head_stride = 128;
    b.states_token_stride = 1024; b.states_state_stride = 256; b.states_head_stride = 128;
    failures += alpha_load() != ALPHA_OK;
    failures += beta_load() != BETA_OK;
    failures += libraries_live != 2;
    failures += alpha_merge_attn_states_bf16_d128_thr_lse(NULL, &a) != ALPHA_OK;
    failures += beta_merge_states_bf16_d128_k4_lse(NULL, &b) != BETA_OK;
    failures += launches != 2;
    /* Each library keeps its own state: a refusal in one leaves the other's message alone. */
    b.num_heads = -1;
    failures += beta_merge_states_bf16_d128_k4_lse(NULL, &b) != BETA_INVALID_ARGUMENT;
    failures += strcmp(beta_last_error(), "merge_states_bf16_d128_k4_lse: num_heads = -1 is below its minimum 0") != 0;
    failures += strcmp(alpha_last_error(), "") != 0;
    failures += alpha_unload() != ALPHA_OK || libraries_live != 1;
    failures += beta_unload() != BETA_OK || libraries_live != 0;
    failures += strcmp(ALPHA_VERSION_STRING, BETA_VERSION_STRING) != 0 || ALPHA_DEFAULT != BETA_DEFAULT;
    printf("%s %s\n", alpha_status_string(ALPHA_OK), beta_status_string(BETA_CUDA_ERROR));
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures);
    return failures != 0;
}
"#;

#[test]
fn two_launchers_with_different_prefixes_link_into_one_program() {
    let tmp = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));
    let a = generate_c(
        &a_dir,
        "arch = \"sm_90\"\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\nsize_rule = false\ndense = false\n",
        Some("alpha"),
    );
    let b = generate_c(
        &b_dir,
        "arch = \"sm_90\"\n[[merge_states]]\ndtype = \"bf16\"\nhead_size = 128\nnum_states = 4\n",
        Some("beta"),
    );
    assert!(a.join("alpha_kernels.h").is_file() && !a.join("mla_kernels.h").exists());
    // Every macro of each header, its include guard among them, carries the prefix.
    for (dir, prefix) in [(&a, "alpha"), (&b, "beta")] {
        let header = std::fs::read_to_string(dir.join(format!("{prefix}_kernels.h"))).unwrap();
        let upper = prefix.to_ascii_uppercase();
        for line in header.lines() {
            if let Some(name) = line
                .strip_prefix("#define ")
                .or(line.strip_prefix("#ifndef "))
            {
                assert!(name.starts_with(&format!("{upper}_")), "{prefix}: {line}");
            }
        }
        assert!(
            !header.contains("mla_") && !header.contains("MLA_"),
            "{prefix}"
        );
    }
    let main = tmp.path().join("main.c");
    std::fs::write(&main, TWO_PREFIXES_MAIN).unwrap();
    let exe = tmp.path().join("two");
    let stdout = build_and_run(
        &exe,
        &[&a, &b],
        &[main, a.join("alpha_kernels.c"), b.join("beta_kernels.c")],
    );
    assert!(stdout.contains("1 passed, 0 failed"), "{stdout}");
    assert!(stdout.contains("success CUDA driver error"), "{stdout}");
    // Every symbol each library defines for the linker carries its prefix.
    for (dir, prefix) in [(&a, "alpha"), (&b, "beta")] {
        let obj = tmp.path().join(format!("{prefix}.o"));
        let mut args: Vec<String> = STRICT.iter().map(|s| s.to_string()).collect();
        args.extend([
            "-I".into(),
            cuda_include().display().to_string(),
            "-c".into(),
        ]);
        args.push(
            dir.join(format!("{prefix}_kernels.c"))
                .display()
                .to_string(),
        );
        args.extend(["-o".into(), obj.display().to_string()]);
        common::gcc(&args);
        let o = Command::new("nm")
            .args(["--defined-only", "--extern-only", "--format=just-symbols"])
            .arg(&obj)
            .output()
            .expect("nm is installed (binutils)");
        let symbols = String::from_utf8_lossy(&o.stdout);
        assert!(
            symbols.lines().any(|s| s == format!("{prefix}_load")),
            "{symbols}"
        );
        for s in symbols.lines() {
            assert!(
                s.starts_with(&format!("{prefix}_")),
                "{prefix}: exported {s}"
            );
        }
    }
}

#[test]
fn generation_is_deterministic_and_check_knows_the_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let spec_text = "arch = \"sm_90\"\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\n";
    let first = generate_c(&tmp.path().join("1"), spec_text, Some("eng"));
    let second = generate_c(&tmp.path().join("2"), spec_text, Some("eng"));
    for f in ["eng_kernels.h", "eng_kernels.c"] {
        assert!(
            std::fs::read(first.join(f)).unwrap() == std::fs::read(second.join(f)).unwrap(),
            "{f} differs between two generations"
        );
    }
    let spec = tmp.path().join("1/s.toml");
    let out = tmp.path().join("1/gen");
    let check = |extra: &[&str]| {
        let mut args = vec![
            "check",
            spec.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend(extra);
        mla_gen(&args)
    };
    let o = check(&["--emit", "c", "--c-prefix", "eng"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Without the prefix, the check expects c/mla_kernels.* instead.
    let o = check(&["--emit", "c"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(
        stderr.contains("mla_kernels.h") && stderr.contains("eng_kernels.h"),
        "{stderr}"
    );
}

#[test]
fn a_prefix_must_be_a_c_identifier_and_needs_emit_c() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("s.toml");
    std::fs::write(
        &spec,
        "arch = \"sm_90\"\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\n",
    )
    .unwrap();
    let out = tmp.path().join("gen");
    for (extra, want) in [
        (
            &["--emit", "c", "--c-prefix", "9lives"][..],
            "not a C identifier",
        ),
        (
            &["--emit", "c", "--c-prefix", "my-lib"][..],
            "not a C identifier",
        ),
        (&["--c-prefix", "eng"][..], "--emit"),
    ] {
        let mut args = vec![
            "generate",
            spec.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend(extra);
        let o = mla_gen(&args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && stderr.contains(want),
            "{extra:?}: {stderr}"
        );
    }
    assert!(
        !out.exists(),
        "nothing is written for a refused command line"
    );
}

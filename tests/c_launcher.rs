//! The C launcher (`generate --emit c`) compiles warning-free with gcc -std=c11 -Wall -Wextra
//! -Werror against cuda.h, and its checks refuse every unsafe call (run against stub driver
//! functions, so no GPU is needed). cuda.h comes from the nvidia-cuda-runtime wheel that
//! scripts/install-nvrtc.sh installs, or from CUDA_HOME.

use std::path::{Path, PathBuf};
use std::process::Command;

fn cuda_include() -> PathBuf {
    let mut places: Vec<PathBuf> = Vec::new();
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        places.push(Path::new(&home).join("include"));
    }
    let out = Command::new("python3")
        .args(["-c", "import nvidia; print('\\n'.join(nvidia.__path__))"])
        .output();
    if let Ok(o) = out {
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            places.push(Path::new(line.trim()).join("cu13/include"));
        }
    }
    places.push(PathBuf::from("/usr/local/cuda/include"));
    places
        .into_iter()
        .find(|p| p.join("cuda.h").is_file())
        .unwrap_or_else(|| {
            panic!(
                "cuda.h not found: run scripts/install-nvrtc.sh (it installs nvidia-cuda-runtime)"
            )
        })
}

const PAIRWISE_SPEC: &str = "arch = [\"sm_80\", \"sm_90\"]\n[[merge_attn_states]]\ndtype = [\"bf16\", \"f32\"]\nhead_size = [128, 100]\n";

fn generate_c(dir: &Path) -> PathBuf {
    generate_c_from(dir, PAIRWISE_SPEC)
}

fn generate_c_from(dir: &Path, spec_text: &str) -> PathBuf {
    let spec = dir.join("s.toml");
    std::fs::write(&spec, spec_text).unwrap();
    let out = dir.join("gen");
    let o = Command::new(env!("CARGO_BIN_EXE_mla-gen"))
        .args([
            "generate",
            spec.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--emit",
            "c",
        ])
        .env_remove("MLA_GEN_ARCH")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out.join("c")
}

fn gcc(args: &[&str]) {
    let o = Command::new("gcc")
        .args(args)
        .output()
        .expect("gcc is installed");
    assert!(
        o.status.success(),
        "gcc {args:?}:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.stderr.is_empty(),
        "warnings:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn the_c_launcher_compiles_warning_free_and_refuses_unsafe_calls() {
    let tmp = tempfile::tempdir().unwrap();
    let c = generate_c(tmp.path());
    let inc = cuda_include();
    let strict = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"];
    let obj = tmp.path().join("mla_kernels.o");
    let mut args: Vec<String> = strict.iter().map(|s| s.to_string()).collect();
    args.extend(["-I".into(), inc.display().to_string(), "-c".into()]);
    args.extend([
        c.join("mla_kernels.c").display().to_string(),
        "-o".into(),
        obj.display().to_string(),
    ]);
    gcc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    // The header is C++-clean too.
    let cpp = tmp.path().join("use.cpp");
    std::fs::write(
        &cpp,
        "#include \"mla_kernels.h\"\nint main() { return mla_load() == CUDA_SUCCESS ? 0 : 1; }\n",
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
        .arg(&inc)
        .arg("-I")
        .arg(&c)
        .arg(&cpp)
        .output()
        .expect("g++ is installed");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Link against stub driver functions and run the checks.
    compile_and_run(tmp.path(), &c, "launcher_check.c");
}

/// Compile `check` (a file of tests/c) with the generated launcher `c` and run it: it prints
/// "1 passed, 0 failed".
fn compile_and_run(tmp: &Path, c: &Path, check: &str) {
    let inc = cuda_include();
    let exe = tmp.join("check");
    let strict = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"];
    let mut args: Vec<String> = strict.iter().map(|s| s.to_string()).collect();
    args.extend([
        "-I".into(),
        inc.display().to_string(),
        "-I".into(),
        c.display().to_string(),
        format!("{}/tests/c/{check}", env!("CARGO_MANIFEST_DIR")),
        c.join("mla_kernels.c").display().to_string(),
        "-o".into(),
        exe.display().to_string(),
    ]);
    gcc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let o = Command::new(&exe).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}");
    assert!(stdout.contains("1 passed, 0 failed"), "{stdout}");
}

#[test]
fn the_other_families_launchers_compile_and_refuse_unsafe_calls() {
    let tmp = tempfile::tempdir().unwrap();
    let c = generate_c_from(
        tmp.path(),
        "arch = \"sm_90\"\n[[merge_states]]\ndtype = \"bf16\"\nhead_size = 128\nnum_states = [4, \"runtime\"]\n\
         [[merge_state_in_place]]\ndtype = \"bf16\"\nhead_size = 128\nmask = true\n[[mask_empty_context_lse]]\n",
    );
    compile_and_run(tmp.path(), &c, "families_check.c");
}

#[test]
fn the_group_fp8_launcher_checks_its_scales() {
    let tmp = tempfile::tempdir().unwrap();
    let c = generate_c_from(
        tmp.path(),
        "arch = \"sm_90\"\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\noutput = \"fp8_e4m3_group\"\ngroup_size = 64\nue8m0 = true\n",
    );
    compile_and_run(tmp.path(), &c, "group_check.c");
}

#[test]
fn the_c_examples_compile_against_their_generated_headers() {
    let tmp = tempfile::tempdir().unwrap();
    let c = generate_c(tmp.path());
    compile_example(tmp.path(), &c, "merge.c");
    let families = tmp.path().join("families");
    std::fs::create_dir(&families).unwrap();
    let spec = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/c/families.toml"
    ))
    .unwrap();
    let c = generate_c_from(&families, &spec);
    compile_example(&families, &c, "families.c");
}

/// Compile `examples/c/<name>` warning-free against the launcher in `c` (no link: no GPU here).
fn compile_example(tmp: &Path, c: &Path, name: &str) {
    let example = format!("{}/examples/c/{name}", env!("CARGO_MANIFEST_DIR"));
    let obj = tmp.join("example.o");
    gcc(&[
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-I",
        cuda_include().to_str().unwrap(),
        "-I",
        c.to_str().unwrap(),
        "-c",
        &example,
        "-o",
        obj.to_str().unwrap(),
    ]);
}

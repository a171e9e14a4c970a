//! Helpers of the C launcher tests (tests/c_launcher.rs, tests/c_contract.rs): generate a
//! launcher with the mla-gen binary, compile C strictly with gcc, run what it built. cuda.h comes
//! from the nvidia-cuda-runtime wheel that scripts/install-nvrtc.sh installs, or from CUDA_HOME.
#![allow(dead_code)] // each test crate uses a part

use std::path::{Path, PathBuf};
use std::process::Command;

/// The flags every C file of the launcher and its tests must pass without a warning.
pub const STRICT: [&str; 6] = [
    "-std=c11",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-pedantic",
    "-pthread",
];

pub fn cuda_include() -> PathBuf {
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

/// `mla-gen generate` with these extra arguments; the output.
pub fn mla_gen(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mla-gen"))
        .args(args)
        .env_remove("MLA_GEN_ARCH")
        .output()
        .unwrap()
}

/// Write `spec_text` to `dir/s.toml`, generate with `--emit c` (and `--c-prefix` when given)
/// into `dir/gen`; the launcher's folder `dir/gen/c`.
pub fn generate_c(dir: &Path, spec_text: &str, prefix: Option<&str>) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let spec = dir.join("s.toml");
    std::fs::write(&spec, spec_text).unwrap();
    let out = dir.join("gen");
    let mut args = vec![
        "generate",
        spec.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--emit",
        "c",
        "--quiet",
    ];
    if let Some(p) = prefix {
        args.extend(["--c-prefix", p]);
    }
    let o = mla_gen(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out.join("c")
}

/// gcc with `args`: it must succeed without a single warning.
pub fn gcc(args: &[String]) {
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

/// Compile `sources` (with the strict flags, cuda.h, tests/c and `includes` on the path) into
/// `exe`, run it; its stdout. It must exit 0.
pub fn build_and_run(exe: &Path, includes: &[&Path], sources: &[PathBuf]) -> String {
    let mut args: Vec<String> = STRICT.iter().map(|s| s.to_string()).collect();
    args.extend(["-I".into(), cuda_include().display().to_string()]);
    args.extend([
        "-I".into(),
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c").into(),
    ]);
    for i in includes {
        args.extend(["-I".into(), i.display().to_string()]);
    }
    args.extend(sources.iter().map(|s| s.display().to_string()));
    args.extend(["-o".into(), exe.display().to_string()]);
    gcc(&args);
    let o = Command::new(exe).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

/// Write `program` to `dir/<stem>.c`, build it with the launcher in `launcher` and the stub
/// driver, run it; its stdout.
pub fn run_program(dir: &Path, launcher: &Path, stem: &str, program: &str) -> String {
    let main = dir.join(format!("{stem}.c"));
    std::fs::write(&main, program).unwrap();
    build_and_run(
        &dir.join(stem),
        &[launcher],
        &[main, launcher.join("mla_kernels.c")],
    )
}

/// A file of tests/c.
pub fn test_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(name)
}

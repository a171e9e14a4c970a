//! Faults never crash the process (issue #33), Rust runtime: a damaged, missing, foreign or
//! mislabelled image, a bad manifest, a driver that fails a load or a launch, a sticky context
//! error and 32 threads loading at once each end in an error that names the file or kernel and
//! the fix, or in a working load, and a good load and launch work afterwards in the same
//! process.
//!
//! No GPU: the cases run in a child of this test binary whose libcuda.so.1 is the stub
//! tests/c/libcuda_module_stub.c (built here with gcc), which counts the modules the driver was
//! handed, so "refused before the driver saw it" is asserted, not assumed. The GPU's own faults
//! (real exhausted memory, a real illegal address) are in tests/gpu_faults.rs.
#![cfg(feature = "cli")]

#[path = "c/common.rs"]
mod common;
#[path = "faults/runtime_cases.rs"]
mod runtime_cases;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set in the child: the generated folder its cases copy and damage.
const CHILD_FOLDER: &str = "MLA_GEN_FAULTS_FOLDER";
/// What the child prints once every case passed (a child that skipped prints nothing).
const ALL_PASSED: &str = "every runtime fault case passed";

const SPEC: &str =
    "arch = [\"sm_90\"]\n[[merge_attn_states]]\ndtype = [\"bf16\"]\nhead_size = [128]\n";

/// The stub driver as libcuda.so.1 (and libcuda.so, the name cudarc opens first) in its own
/// folder, for LD_LIBRARY_PATH.
fn build_stub(dir: &Path) -> PathBuf {
    let lib = dir.join("stub-driver");
    std::fs::create_dir_all(&lib).unwrap();
    let so = lib.join("libcuda.so.1");
    let mut args: Vec<String> = common::STRICT.iter().map(|s| s.to_string()).collect();
    args.extend([
        "-shared".into(),
        "-fPIC".into(),
        "-Wl,-soname,libcuda.so.1".into(),
        "-I".into(),
        common::cuda_include().display().to_string(),
        common::test_file("libcuda_module_stub.c")
            .display()
            .to_string(),
        "-o".into(),
        so.display().to_string(),
    ]);
    common::gcc(&args);
    let link = lib.join("libcuda.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("libcuda.so.1", &link).unwrap();
    lib
}

#[test]
fn the_runtime_survives_every_fault_on_the_stub_driver() {
    let tmp = tempfile::tempdir().unwrap();
    let stub = build_stub(tmp.path());
    let spec = tmp.path().join("s.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let folder = tmp.path().join("gen");
    let o = common::mla_gen(&[
        "generate",
        spec.to_str().unwrap(),
        "--out",
        folder.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let log = tmp.path().join("child.log");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "runtime_cases::every_fault_in_one_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LD_LIBRARY_PATH", &stub)
        .env(CHILD_FOLDER, &folder)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // A watchdog, not a timing: a hang is a failure, reported as one.
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the fault cases hung (killed after 600 s)");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "the child failed ({status}):\n{out}");
    assert!(out.contains(ALL_PASSED), "the cases did not run:\n{out}");
}

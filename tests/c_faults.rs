//! Faults never crash the C launcher (issue #33): tests/c/faults_check.c on the stub driver, built
//! as generated (images embedded: out of memory at a first load, a failed launch, a sticky error,
//! 32 first calls at once) and with `-DMLA_IMAGES_FROM_FILES` (images read from a folder and
//! checked against the manifest's size and sha256: truncated, bit-flipped, empty, longer and
//! missing CUBIN, truncated PTX, each refused with the file and the fix, the next good load
//! working).

#[path = "c/common.rs"]
mod common;

use std::path::Path;
use std::process::Command;

use common::{cuda_include, gcc, generate_c, test_file, STRICT};

const SPEC: &str = "arch = [\"sm_90\"]\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\nsize_rule = false\ndense = false\n";
const IMAGE: &str = "kernels/merge_attn_states_bf16_d128_thr_lse.sm_90";

/// Build faults_check.c with the launcher in `c` and `defines`, run it; its stdout, which must
/// report every check passed.
fn run_check(exe: &Path, c: &Path, defines: &[String]) -> String {
    let mut args: Vec<String> = STRICT.iter().map(|s| s.to_string()).collect();
    args.extend(defines.iter().cloned());
    for include in [cuda_include(), test_file(""), c.to_path_buf()] {
        args.extend(["-I".into(), include.display().to_string()]);
    }
    args.extend([
        test_file("faults_check.c").display().to_string(),
        c.join("mla_kernels.c").display().to_string(),
        "-o".into(),
        exe.display().to_string(),
    ]);
    gcc(&args);
    let o = Command::new(exe).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success() && stdout.contains("1 passed, 0 failed"),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

#[test]
fn the_embedded_launcher_reports_driver_faults_and_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    let c = generate_c(tmp.path(), SPEC, None);
    run_check(&tmp.path().join("embedded"), &c, &[]);
}

#[test]
fn a_launcher_reading_files_refuses_every_damaged_image_before_the_driver() {
    let tmp = tempfile::tempdir().unwrap();
    let c = generate_c(tmp.path(), SPEC, None);
    let generated = c.parent().unwrap();
    // One copy of the kernels per case, its image damaged as the case says.
    let folders = tmp.path().join("folders");
    let cubin = std::fs::read(generated.join(format!("{IMAGE}.cubin"))).unwrap();
    let ptx = std::fs::read(generated.join(format!("{IMAGE}.ptx"))).unwrap();
    let mut flipped = cubin.clone();
    flipped[cubin.len() / 3] ^= 0x01;
    let longer = [cubin.as_slice(), b"x"].concat();
    let cases: [(&str, &str, Option<&[u8]>); 7] = [
        ("good", "cubin", Some(&cubin)),
        ("truncated", "cubin", Some(&cubin[..cubin.len() / 2])),
        ("flipped", "cubin", Some(&flipped)),
        ("empty", "cubin", Some(&[])),
        ("longer", "cubin", Some(&longer)),
        ("missing", "cubin", None),
        ("ptx_truncated", "ptx", Some(&ptx[..ptx.len() - 100])),
    ];
    for (case, kind, bytes) in cases {
        let kernels = folders.join(case).join("kernels");
        std::fs::create_dir_all(&kernels).unwrap();
        for e in std::fs::read_dir(generated.join("kernels")).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), kernels.join(e.file_name())).unwrap();
        }
        let file = folders.join(case).join(format!("{IMAGE}.{kind}"));
        match bytes {
            Some(b) => std::fs::write(&file, b).unwrap(),
            None => std::fs::remove_file(&file).unwrap(),
        }
    }
    let stdout = run_check(
        &tmp.path().join("files"),
        &c,
        &[
            "-DMLA_IMAGES_FROM_FILES".into(),
            format!("-DFOLDERS=\"{}\"", folders.display()),
        ],
    );
    assert_eq!(stdout.matches("refused: ").count(), 6, "{stdout}");
    // The launcher built this way holds no image: the files are its only copy.
    let source = std::fs::read_to_string(c.join("mla_kernels.c")).unwrap();
    assert!(source.contains(
        "#ifndef MLA_IMAGES_FROM_FILES\nstatic _Alignas(16) const unsigned char mla_image_"
    ));
}

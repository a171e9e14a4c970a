//! Images (PTX, CUBIN) as build outputs: `mla-gen check` on a folder that holds its manifest
//! without them, `mla-gen verify` (images against the folder's own manifest), and the README.md
//! a person keeps in an output folder.

use std::path::Path;
use std::process::{Command, Output};

const SMALL: &str = "arch = [\"sm_90\"]\n[[merge_attn_states]]\ndtype = [\"bf16\", \"f32\"]\nhead_size = [64, 128]\nsize_rule = false\ndense = false\n";

fn mla_gen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mla-gen"))
        .args(args)
        .env_remove("MLA_GEN_ARCH")
        .output()
        .expect("runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A generated folder of the small spec: (temp dir, spec path, out path).
fn generated() -> (tempfile::TempDir, String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("s.toml");
    std::fs::write(&spec, SMALL).unwrap();
    let out = tmp.path().join("gen");
    let (spec, out) = (spec.display().to_string(), out.display().to_string());
    let o = mla_gen(&["generate", &spec, "--out", &out, "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    (tmp, spec, out)
}

fn images(out: &str) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(Path::new(out).join("kernels"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "ptx" || x == "cubin"))
        .collect();
    v.sort();
    assert_eq!(v.len(), 8, "4 kernels x (PTX + CUBIN) for sm_90");
    v
}

#[test]
fn check_compares_the_manifest_when_no_image_is_built() {
    let (_tmp, spec, out) = generated();
    for f in images(&out) {
        std::fs::remove_file(f).unwrap();
    }
    let o = mla_gen(&["check", &spec, "--out", &out]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("8 images, which are not built here"),
        "{}",
        stderr(&o)
    );
    let o = mla_gen(&["check", &spec, "--out", &out, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["fresh"].as_bool(), v["images_built"].as_bool()),
        (Some(true), Some(false))
    );

    // A hash in the manifest that a fresh generation does not give: stale, and the fix named.
    let manifest = Path::new(&out).join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let at = text.find("\"sha256\": \"").unwrap() + "\"sha256\": \"".len();
    let flipped = if &text[at..at + 1] == "0" { "1" } else { "0" };
    std::fs::write(
        &manifest,
        format!("{}{flipped}{}", &text[..at], &text[at + 1..]),
    )
    .unwrap();
    let o = mla_gen(&["check", &spec, "--out", &out]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("stale") && e.contains("manifest.json"), "{e}");
    assert!(
        e.contains(&format!("Run `mla-gen generate {spec} --out {out}`")),
        "{e}"
    );
}

#[test]
fn check_wants_every_image_once_one_is_built() {
    let (_tmp, spec, out) = generated();
    let gone = images(&out).remove(3);
    std::fs::remove_file(&gone).unwrap();
    let o = mla_gen(&["check", &spec, "--out", &out]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("missing") && e.contains(&*gone.to_string_lossy()),
        "{e}"
    );
}

#[test]
fn verify_names_missing_and_differing_images_and_the_fix() {
    let (_tmp, _spec, out) = generated();
    let o = mla_gen(&["verify", "--out", &out]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("each of its 8 images"),
        "{}",
        stderr(&o)
    );
    let files = images(&out);
    std::fs::remove_file(&files[0]).unwrap();
    let mut bytes = std::fs::read(&files[1]).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&files[1], bytes).unwrap();
    let o = mla_gen(&["verify", "--out", &out, "-q"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("1 of 8 images missing, 1 differing"), "{e}");
    assert!(e.contains(&*files[0].to_string_lossy()), "{e}");
    assert!(e.contains(&*files[1].to_string_lossy()), "{e}");
    assert!(
        e.contains("build outputs") && e.contains("mla-gen generate"),
        "{e}"
    );
    let none = mla_gen(&["verify", "--out", &format!("{out}/kernels")]);
    assert_eq!(none.status.code(), Some(2), "{}", stderr(&none));
}

#[test]
fn verify_refuses_images_named_outside_the_folder_as_a_load_does() {
    let (tmp, _spec, out) = generated();
    // Two images moved out of the folder, the manifest naming them there: one by an absolute
    // path, one through `..`. Their bytes are the recorded ones; the runtime still refuses both.
    let files = images(&out);
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let manifest = Path::new(&out).join("manifest.json");
    let mut text = std::fs::read_to_string(&manifest).unwrap();
    let mut outside = Vec::new();
    for (f, absolute) in [(&files[0], true), (&files[1], false)] {
        let name = f.file_name().unwrap().to_str().unwrap();
        let moved = elsewhere.join(name);
        std::fs::rename(f, &moved).unwrap();
        let named = if absolute {
            moved.display().to_string()
        } else {
            format!("../elsewhere/{name}")
        };
        text = text.replace(&format!("\"kernels/{name}\""), &format!("\"{named}\""));
        outside.push(named);
    }
    std::fs::write(&manifest, text).unwrap();
    let o = mla_gen(&["verify", "--out", &out]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("2 named by a path outside the folder"), "{e}");
    assert!(e.contains(&outside[0]) && e.contains(&outside[1]), "{e}");
}

#[test]
fn verify_refuses_an_image_of_another_kind_than_its_manifest_says_as_a_load_does() {
    // A manifest that calls one arch's PTX its CUBIN and the CUBIN its PTX: every size and hash
    // is right, so only the kind shows it (the driver would get text as machine code).
    let (_tmp, _spec, out) = generated();
    let manifest = Path::new(&out).join("manifest.json");
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let arch = &mut v["kernels"][0]["archs"][0];
    let (ptx, cubin) = (arch["ptx"].take(), arch["cubin"].take());
    assert!(ptx.is_object() && cubin.is_object(), "{arch}");
    let (ptx_file, cubin_file) = (ptx["file"].clone(), cubin["file"].clone());
    arch["ptx"] = cubin;
    arch["cubin"] = ptx;
    std::fs::write(&manifest, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let o = mla_gen(&["verify", "--out", &out]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("0 of 8 images missing, 0 differing"), "{e}");
    assert!(e.contains("2 not of the kind manifest.json says"), "{e}");
    for (kind, file) in [("an ELF CUBIN", &ptx_file), ("PTX text", &cubin_file)] {
        let file = file.as_str().unwrap();
        assert!(e.contains(&format!("not {kind}: {out}/{file}")), "{e}");
    }
}

#[test]
fn generate_keeps_a_readme_and_check_ignores_it() {
    let (_tmp, spec, out) = generated();
    let readme = Path::new(&out).join("README.md");
    std::fs::write(&readme, "how these are built\n").unwrap();
    // A change makes generate replace the folder: the README comes along.
    std::fs::remove_file(&images(&out)[0]).unwrap();
    let o = mla_gen(&["generate", &spec, "--out", &out]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("1 files written"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(&readme).unwrap(),
        "how these are built\n"
    );
    let o = mla_gen(&["check", &spec, "--out", &out]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

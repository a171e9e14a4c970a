//! `mla-gen check` (a folder against a fresh generation) and `mla-gen verify` (a folder's images
//! against its own manifest, nothing compiled).
//!
//! The images (PTX, CUBIN) are build outputs: a folder may hold its manifest without them (this
//! repository keeps only generated/manifest.json in git). The manifest records every image's
//! size and sha256, so when a folder has no image at all, `check` compares the manifest and the
//! other text files, which proves the hashes a fresh generation gives; once any image is there,
//! every image must be, byte for byte.

use std::path::Path;

use mla_gen::emit::{self, FileSet};
use mla_gen::host::manifest::{image_kind_mismatch, image_mismatch, FileView, ManifestView};
use mla_gen::nvrtc;

use crate::failure::Failure;
use crate::report;
use crate::spec_args::{load_spec, load_templates, SpecArgs};

/// A file a person keeps beside the generated ones: `generate` carries it over, `check` ignores it.
pub const KEPT: &str = "README.md";

/// The command that rebuilds `out` as it was asked for, for the messages.
pub fn regenerate_hint(
    args: &SpecArgs,
    out: &Path,
    extra: &[mla_gen::bindings::Emit],
    c_prefix: &mla_gen::bindings::CPrefix,
) -> String {
    let mut cmd = "mla-gen generate".to_string();
    if let Some(spec) = &args.spec {
        cmd.push_str(&format!(" {}", spec.display()));
    }
    if !args.arch.is_empty() {
        cmd.push_str(&format!(" --arch {}", args.arch.join(",")));
    }
    if let Some(templates) = &args.templates {
        cmd.push_str(&format!(" --templates {}", templates.display()));
    }
    cmd.push_str(&format!(" --out {}", out.display()));
    if !extra.is_empty() {
        cmd.push_str(" --emit c");
        if *c_prefix != mla_gen::bindings::CPrefix::default() {
            cmd.push_str(&format!(" --c-prefix {}", c_prefix.as_str()));
        }
    }
    let plain = args.spec.is_none() && args.arch.is_empty() && args.templates.is_none();
    let repo = if plain && extra.is_empty() {
        " (in mla-gen's own repository: scripts/generate.sh)"
    } else {
        ""
    };
    format!("`{cmd}`{repo}")
}

/// The images a manifest names (relative paths), read from its bytes.
fn images_of(manifest: &[u8], origin: &Path) -> Result<Vec<String>, Failure> {
    let view = ManifestView::parse(origin, manifest).map_err(|e| Failure(e.to_string(), 2))?;
    Ok(view
        .kernels
        .iter()
        .flat_map(|k| k.images())
        .map(|(f, _)| f.file.clone())
        .collect())
}

pub fn check(
    args: &SpecArgs,
    out: &Path,
    jobs: usize,
    extra: &[mla_gen::bindings::Emit],
    c_prefix: &mla_gen::bindings::CPrefix,
    json: bool,
) -> Result<(), Failure> {
    // Anything that stops the comparison itself exits 2, so that 1 always means "stale".
    let cannot = |Failure(msg, _): Failure| Failure(msg, 2);
    let spec = load_spec(args).map_err(cannot)?;
    let templates = load_templates(args).map_err(cannot)?;
    let (mut planned, manifest) =
        mla_gen::generate_files_with_c_prefix(&spec, &templates, jobs, true, extra, c_prefix)
            .map_err(|e| Failure(e.to_string(), 2))?;
    let mut actual = emit::read_tree(out).map_err(|e| Failure(e.to_string(), 2))?;
    actual.remove(KEPT);
    let images = images_of(&planned[emit::MANIFEST], &out.join(emit::MANIFEST))?;
    // No image at all: the images are not built here; the manifest stands for their hashes.
    let built = images.iter().any(|f| actual.contains_key(f));
    if !built {
        for f in &images {
            planned.remove(f);
        }
    }
    let d = emit::diff(&planned, &actual);
    let hint = regenerate_hint(args, out, extra, c_prefix);
    if json {
        report::check_json(&d, built)?;
        return if d.is_clean() {
            Ok(())
        } else {
            Err(Failure(
                format!("{} is out of date: run {hint}", out.display()),
                1,
            ))
        };
    }
    if d.is_clean() {
        if built {
            eprintln!("{}: up to date ({} files)", out.display(), planned.len());
        } else {
            eprintln!(
                "{}: up to date: manifest.json is what a fresh generation writes, so are the sha256 of its {} images, which are not built here (build them: {hint})",
                out.display(),
                images.len()
            );
        }
        return Ok(());
    }
    Err(Failure(
        stale_message(out, &d, &actual, &manifest, &hint),
        1,
    ))
}

/// What differs, a note when another NVRTC wrote the folder, and the fix.
fn stale_message(
    out: &Path,
    d: &emit::Diff,
    actual: &FileSet,
    manifest: &emit::Manifest,
    hint: &str,
) -> String {
    let mut msg = format!(
        "{} is out of date with a fresh generation:\n",
        out.display()
    );
    for (label, list) in [
        ("stale", &d.stale),
        ("missing", &d.missing),
        ("extra", &d.extra),
    ] {
        for f in list {
            msg.push_str(&format!("  {label:8}{}\n", out.join(f).display()));
        }
    }
    // A different NVRTC rewrites every PTX: say so rather than leave a wall of "stale".
    if let Some(old) = actual
        .get(emit::MANIFEST)
        .and_then(|b| mla_gen::host::manifest::NvrtcView::of(b))
        .map(|n| n.release)
    {
        if old != manifest.nvrtc.release {
            msg.push_str(&format!(
                "note: {} was generated with NVRTC {old}, this run used {}; install the same one ({}) or regenerate.\n",
                out.display(),
                manifest.nvrtc.release,
                nvrtc::INSTALL_COMMAND
            ));
        }
    }
    msg.push_str(&format!(
        "Run {hint} to update it, and commit what changed."
    ));
    msg
}

/// Every image `out/manifest.json` names is there with the size and sha256 it records.
pub fn verify(out: &Path, quiet: bool) -> Result<(), Failure> {
    let path = out.join(emit::MANIFEST);
    let text = std::fs::read(&path).map_err(|e| {
        Failure(
            format!(
                "cannot read {} ({e}): verify takes a folder `mla-gen generate` wrote",
                path.display()
            ),
            2,
        )
    })?;
    let view = ManifestView::parse(&path, &text).map_err(|e| Failure(e.to_string(), 2))?;
    let (mut outside, mut missing, mut differ, mut count) = (Vec::new(), Vec::new(), Vec::new(), 0);
    let mut wrong_kind = Vec::new();
    for (f, cubin) in view.kernels.iter().flat_map(|k| k.images()) {
        count += 1;
        // A load refuses an image named outside the folder, even one with the recorded content.
        if !FileView::inside_folder(&f.file) {
            outside.push(&f.file);
            continue;
        }
        match std::fs::read(out.join(&f.file)) {
            Err(_) => missing.push(&f.file),
            Ok(bytes) => {
                // The runtime's own checks, of the path (above) and of size and sha256 (here).
                if image_mismatch(f.bytes, f.sha256.as_deref(), &bytes).is_some() {
                    differ.push(&f.file);
                } else if let Some(kind) = image_kind_mismatch(cubin, &bytes) {
                    wrong_kind.push((&f.file, kind));
                }
            }
        }
    }
    if outside.is_empty() && missing.is_empty() && differ.is_empty() && wrong_kind.is_empty() {
        if !quiet {
            eprintln!(
                "{}: each of its {count} images has the size, sha256 and kind (CUBIN, PTX) manifest.json records",
                out.display()
            );
        }
        return Ok(());
    }
    let mut msg = format!(
        "{}: {} of {count} images missing, {} differing from manifest.json's size or sha256",
        out.display(),
        missing.len(),
        differ.len()
    );
    if !outside.is_empty() {
        msg.push_str(&format!(
            ", {} named by a path outside the folder (absolute, or through `..`), which a load refuses",
            outside.len()
        ));
    }
    if !wrong_kind.is_empty() {
        msg.push_str(&format!(
            ", {} not of the kind manifest.json says (the manifest itself is wrong; the Rust and Python hosts refuse them at load)",
            wrong_kind.len()
        ));
    }
    for (f, kind) in wrong_kind.iter().take(5) {
        msg.push_str(&format!("\n  not {kind}: {}", out.join(f).display()));
    }
    if wrong_kind.len() > 5 {
        msg.push_str(&format!("\n  ... and {} more", wrong_kind.len() - 5));
    }
    for (label, list) in [
        ("outside", &outside),
        ("missing", &missing),
        ("differs", &differ),
    ] {
        for f in list.iter().take(5) {
            msg.push_str(&format!("\n  {label:8}{}", out.join(f).display()));
        }
        if list.len() > 5 {
            msg.push_str(&format!("\n  ... and {} more", list.len() - 5));
        }
    }
    msg.push_str(&format!(
        "\nThe images are build outputs: build them with `mla-gen generate [SPEC] --out {}` from the spec and NVRTC the manifest names (in mla-gen's own repository: scripts/generate.sh).",
        out.display()
    ));
    Err(Failure(msg, 1))
}

//! The build-time API: a `build.rs` turns a spec into kernels in `OUT_DIR` and a Rust module to
//! `include!`, with the images embedded, `load(ctx)` returning one resolved handle per kernel, one
//! typed launch method per kernel and a run-time `dispatch` (the module's text:
//! `src/writers/rust_module.rs`). Needs NVRTC, no nvcc and no GPU. Unchanged inputs (spec,
//! templates, tool and NVRTC versions, archs) reuse the previous output and compile nothing.
//!
//! In `build.rs` (the engine build-depends on mla-gen with feature `codegen`):
//!
//! ```no_run
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let built = mla_gen::Builder::new().spec_file("kernels.toml").build()?;
//!     assert!(built.module.ends_with("mla_gen_kernels.rs"));
//!     Ok(())
//! }
//! ```
//!
//! and in the crate (which depends on mla-gen with feature `runtime`):
//! `mod kernels { include!(concat!(env!("OUT_DIR"), "/mla_gen_kernels.rs")); }`,
//! then `let k = kernels::load(ctx)?;` and `k.<kernel name>(&stream, ...)`.
//!
//! Two modes need no NVRTC: [`Builder::prebuilt`] embeds a committed folder that `mla-gen
//! generate` wrote (and `mla-gen check` keeps fresh), each file checked against the sha256 its
//! manifest records; and the skip mode (`MLA_GEN_SKIP_COMPILE=1`, [`Builder::skip_compile`], and
//! always on docs.rs, which sets `DOCS_RS`) declares every method and embeds no kernel.

use std::path::{Path, PathBuf};

use crate::constants::TOOL_VERSION;
use crate::contract::MANIFEST;
use crate::gen::emit;
use crate::gen::nvrtc;
use crate::gen::render::Templates;
use crate::gen::sha256_hex;
use crate::gen::spec::{self, Spec};
use crate::generate::{generate_files, Error};
use crate::host::manifest::{
    image_kind_mismatch, image_mismatch, FileView, KernelView, ManifestView,
};
#[doc(hidden)]
pub use crate::writers::rust_module::{rust_module, BindingKernel};

/// Environment variable: when `1`, build no kernels (documentation builds, machines without
/// NVRTC); the module still declares every method, and loading returns an error.
pub const ENV_SKIP: &str = crate::constants::ENV_SKIP;
/// Environment variable docs.rs sets: the build then skips the kernels, as under [`ENV_SKIP`],
/// and never loads NVRTC.
pub const ENV_DOCS_RS: &str = "DOCS_RS";
/// The module file written to the output folder.
pub const MODULE_FILE: &str = "mla_gen_kernels.rs";
const CACHE_KEY_FILE: &str = "cache-key";
/// Variables whose change must rebuild.
const WATCHED_ENV: [&str; 9] = [
    nvrtc::ENV_OVERRIDE,
    nvrtc::ENV_PYTHON,
    spec::ENV_ARCH,
    ENV_SKIP,
    ENV_DOCS_RS,
    "CUDA_HOME",
    "CUDA_PATH",
    "VIRTUAL_ENV",
    "OUT_DIR",
];

#[derive(Debug, Clone)]
enum Source {
    Default,
    File(PathBuf),
    Text { name: String, text: String },
    Prebuilt(PathBuf),
}

/// Configure and run a build-time generation.
#[derive(Debug, Clone)]
pub struct Builder {
    source: Source,
    templates: Option<PathBuf>,
    archs: Option<Vec<String>>,
    out_dir: Option<PathBuf>,
    jobs: usize,
    skip_compile: Option<bool>,
}

/// What [`Builder::build`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Built {
    /// The Rust module to `include!`.
    pub module: PathBuf,
    /// The folder holding the manifest and kernel files (the given folder for
    /// [`Builder::prebuilt`]).
    pub dir: PathBuf,
    pub kernels: usize,
    /// false: the cached output matched the inputs (or the folder was prebuilt), nothing was
    /// compiled.
    pub compiled: bool,
    /// true: built without kernels (`MLA_GEN_SKIP_COMPILE=1`, [`Builder::skip_compile`] or
    /// docs.rs): no images.
    pub skipped: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

impl Builder {
    /// The embedded default spec, archs from the spec (or `MLA_GEN_ARCH`), output in `OUT_DIR`.
    pub fn new() -> Builder {
        Builder {
            source: Source::Default,
            templates: None,
            archs: None,
            out_dir: None,
            jobs: 0,
            skip_compile: None,
        }
    }
    /// A spec file (watched: the build reruns when it changes).
    pub fn spec_file(mut self, path: impl AsRef<Path>) -> Builder {
        self.source = Source::File(path.as_ref().to_path_buf());
        self
    }
    /// A spec written in code; `name` appears in messages and generated headers.
    pub fn spec_str(mut self, name: impl AsRef<str>, text: impl AsRef<str>) -> Builder {
        self.source = Source::Text {
            name: name.as_ref().to_string(),
            text: text.as_ref().to_string(),
        };
        self
    }
    /// Kernels generated beforehand instead of a spec: `dir` is a folder `mla-gen generate`
    /// wrote (committed, and kept fresh by `mla-gen check` in CI). The module embeds the files
    /// of `dir/manifest.json` after checking each one's size and sha256 against the manifest,
    /// so a folder edited by hand (or a merge gone wrong) fails the build. No NVRTC is loaded.
    /// Watched: the build reruns when the manifest or a file changes.
    pub fn prebuilt(mut self, dir: impl AsRef<Path>) -> Builder {
        self.source = Source::Prebuilt(dir.as_ref().to_path_buf());
        self
    }
    /// Templates from a folder instead of the embedded ones (watched).
    pub fn templates(mut self, dir: impl AsRef<Path>) -> Builder {
        self.templates = Some(dir.as_ref().to_path_buf());
        self
    }
    /// Architectures, replacing the spec's (nothing probes a GPU at build time).
    pub fn archs(mut self, archs: impl IntoIterator<Item = impl AsRef<str>>) -> Builder {
        self.archs = Some(archs.into_iter().map(|a| a.as_ref().to_string()).collect());
        self
    }
    /// Output folder (default: `OUT_DIR`).
    pub fn out_dir(mut self, dir: impl AsRef<Path>) -> Builder {
        self.out_dir = Some(dir.as_ref().to_path_buf());
        self
    }
    /// Build no kernels (as `MLA_GEN_SKIP_COMPILE=1`, which sets the default): for docs builds.
    /// On docs.rs (`DOCS_RS` set) kernels are always skipped.
    pub fn skip_compile(mut self, skip: bool) -> Builder {
        self.skip_compile = Some(skip);
        self
    }
    /// Compile threads (0 = one per core).
    pub fn jobs(mut self, jobs: usize) -> Builder {
        self.jobs = jobs;
        self
    }

    fn in_build_script() -> bool {
        std::env::var_os("CARGO_MANIFEST_DIR").is_some() && std::env::var_os("OUT_DIR").is_some()
    }

    fn skip(&self) -> bool {
        std::env::var_os(ENV_DOCS_RS).is_some()
            || self
                .skip_compile
                .unwrap_or_else(|| std::env::var(ENV_SKIP).is_ok_and(|v| v == "1"))
    }

    fn load_spec(&self) -> Result<(Spec, Option<PathBuf>), Error> {
        let (mut spec, watched) = match &self.source {
            Source::Default => (spec::default_spec()?, None),
            Source::Text { name, text } => (spec::parse(name, text)?, None),
            Source::File(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    Error::Spec(spec::SpecError::Whole {
                        origin: path.display().to_string(),
                        message: format!("cannot read the spec: {e}"),
                    })
                })?;
                (
                    spec::parse(&path.display().to_string(), &text)?,
                    Some(path.clone()),
                )
            }
            Source::Prebuilt(dir) => {
                return Err(prebuilt_err(dir, "a prebuilt folder has no spec".into()))
            }
        };
        spec::apply_arch_override(&mut spec, self.archs.as_deref(), "Builder::archs")?;
        Ok((spec, watched))
    }

    /// Generate (or reuse) the kernels and write the module.
    pub fn build(self) -> Result<Built, Error> {
        let out_dir = match self
            .out_dir
            .clone()
            .or_else(|| std::env::var_os("OUT_DIR").map(PathBuf::from))
        {
            Some(d) => d,
            None => {
                return Err(Error::Emit(emit::EmitError::Io {
                    path: PathBuf::from("OUT_DIR"),
                    what: "is not set: call Builder::out_dir or run from a build script",
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                }))
            }
        };
        let module = out_dir.join(MODULE_FILE);
        if let Source::Prebuilt(dir) = &self.source {
            return self.build_prebuilt(dir, &module);
        }
        let (spec, watched_spec) = self.load_spec()?;
        let templates = match &self.templates {
            Some(d) => Templates::from_dir(d)?,
            None => Templates::embedded()?,
        };
        if Self::in_build_script() {
            if let Some(p) = &watched_spec {
                println!("cargo:rerun-if-changed={}", p.display());
            }
            if let Some(d) = &self.templates {
                for (name, _) in crate::gen::render::EMBEDDED_TEMPLATES {
                    println!("cargo:rerun-if-changed={}", d.join(name).display());
                }
            }
            for var in WATCHED_ENV {
                println!("cargo:rerun-if-env-changed={var}");
            }
        }
        let dir = out_dir.join("mla-gen");

        if self.skip() {
            let kernels: Vec<BindingKernel> = spec
                .variants
                .iter()
                .map(BindingKernel::from_variant)
                .collect();
            write_if_changed(
                &module,
                rust_module(&kernels, &spec.source_name(), None).as_bytes(),
            )?;
            return Ok(Built {
                module,
                dir,
                kernels: kernels.len(),
                compiled: false,
                skipped: true,
            });
        }

        let nv = nvrtc::load().map_err(|e| Error::Compile(e.into()))?;
        let nvrtc_len = std::fs::metadata(&nv.path).map(|m| m.len()).unwrap_or(0);
        let key = sha256_hex(
            serde_json::json!({
                "spec": spec.text_sha256,
                "templates": templates.sha256(),
                "tool": TOOL_VERSION,
                "archs": spec.archs.iter().map(|a| a.name()).collect::<Vec<_>>(),
                "nvrtc": [nv.version(), nv.path.clone(), nvrtc_len.to_string()],
            })
            .to_string()
            .as_bytes(),
        );
        let cached = std::fs::read_to_string(dir.join(CACHE_KEY_FILE))
            .is_ok_and(|k| k.trim() == key)
            && dir.join(MANIFEST).is_file();
        if !cached {
            let (mut files, _) = generate_files(&spec, &templates, self.jobs, false)?;
            // The key travels with the files, so both land in the same atomic swap.
            files.insert(CACHE_KEY_FILE.to_string(), key.into_bytes());
            emit::write(&dir, &files)?;
        }
        // Absolute: the module's include_bytes! paths resolve against the module's own folder,
        // not the working directory a relative `out_dir` was given in.
        let dir = std::fs::canonicalize(&dir).map_err(emit::io_err(&dir, "cannot resolve"))?;
        let manifest_path = dir.join(MANIFEST);
        let manifest_text =
            std::fs::read(&manifest_path).map_err(emit::io_err(&manifest_path, "cannot read"))?;
        // The same reader as prebuilt() and the runtime: an entry it cannot read is an error.
        let manifest = ManifestView::parse(&manifest_path, &manifest_text)
            .map_err(|e| prebuilt_err(&e.path, e.detail))?;
        let kernels = BindingKernel::from_manifest(&manifest);
        let files: Vec<String> = images(&manifest).map(|(f, _)| f.file.clone()).collect();
        let text = rust_module(&kernels, &spec.source_name(), Some((&dir, &files)));
        write_if_changed(&module, text.as_bytes())?;
        Ok(Built {
            module,
            dir,
            kernels: kernels.len(),
            compiled: !cached,
            skipped: false,
        })
    }

    /// [`Builder::prebuilt`]: the module from `dir`'s manifest, its images checked and embedded.
    fn build_prebuilt(&self, dir: &Path, module: &Path) -> Result<Built, Error> {
        let conflict = if self.archs.is_some() {
            Some("archs")
        } else if self.templates.is_some() {
            Some("templates")
        } else {
            None
        };
        if let Some(what) = conflict {
            return Err(prebuilt_err(
                dir,
                format!("Builder::{what} does not apply to a prebuilt folder: its kernels are already generated (set it with `mla-gen generate`)"),
            ));
        }
        let manifest_path = dir.join(MANIFEST);
        if Self::in_build_script() {
            println!("cargo:rerun-if-changed={}", manifest_path.display());
            for var in [ENV_SKIP, ENV_DOCS_RS] {
                println!("cargo:rerun-if-env-changed={var}");
            }
        }
        let text = std::fs::read(&manifest_path).map_err(|e| {
            prebuilt_err(
                &manifest_path,
                format!("cannot read it ({e}): prebuilt() takes a folder `mla-gen generate --out` wrote"),
            )
        })?;
        // Another schema_version, or an entry this mla-gen cannot read, is refused.
        let manifest = ManifestView::parse(&manifest_path, &text)
            .map_err(|e| prebuilt_err(&e.path, e.detail))?;
        let kernels = BindingKernel::from_manifest(&manifest);
        // Names become Rust identifiers in the module: nothing else may reach it from a folder.
        let identifier = |s: &str| {
            s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        for k in &kernels {
            let names = std::iter::once(&k.name).chain(k.params.iter().map(|p| &p.name));
            if let Some(bad) = names.into_iter().find(|n| !identifier(n)) {
                return Err(prebuilt_err(
                    &manifest_path,
                    format!("kernel {:?}: {bad:?} is not an identifier, so it is not a name mla-gen generates", k.name),
                ));
            }
        }
        let source = format!("the prebuilt folder {}", comment_safe(dir));
        if self.skip() {
            write_if_changed(module, rust_module(&kernels, &source, None).as_bytes())?;
            return Ok(Built {
                module: module.to_path_buf(),
                dir: dir.to_path_buf(),
                kernels: kernels.len(),
                compiled: false,
                skipped: true,
            });
        }
        // Absolute: the module's include_bytes! paths resolve against the module's own folder.
        let abs = std::fs::canonicalize(dir)
            .map_err(|e| prebuilt_err(dir, format!("cannot resolve the folder: {e}")))?;
        let mut files = Vec::new();
        for (f, cubin) in images(&manifest) {
            if !FileView::inside_folder(&f.file) {
                return Err(prebuilt_err(
                    &manifest_path,
                    format!(
                        "names the file {:?}, which is not a path inside the folder",
                        f.file
                    ),
                ));
            }
            let path = abs.join(&f.file);
            if Self::in_build_script() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
            let bytes = std::fs::read(&path).map_err(|e| {
                prebuilt_err(
                    &path,
                    format!("cannot read it ({e}); the manifest lists it: regenerate the folder (mla-gen generate)"),
                )
            })?;
            if let Some(m) = image_mismatch(f.bytes, f.sha256.as_deref(), &bytes) {
                return Err(prebuilt_err(
                    &path,
                    format!(
                        "sha256 {} ({} bytes) differs from the manifest's {} ({} bytes): the folder changed after it was generated (a truncated or partial copy?); regenerate it (mla-gen generate) or run `mla-gen check` to see what differs",
                        m.found_sha256,
                        m.found_bytes,
                        m.expected_sha256,
                        m.expected_bytes.map_or("?".to_string(), |b| b.to_string()),
                    ),
                ));
            }
            if let Some(kind) = image_kind_mismatch(cubin, &bytes) {
                return Err(prebuilt_err(
                    &path,
                    format!("it is not {kind}, as the manifest says: the manifest itself is wrong; regenerate the folder (mla-gen generate)"),
                ));
            }
            files.push(f.file.clone());
        }
        let text = rust_module(&kernels, &source, Some((&abs, &files)));
        write_if_changed(module, text.as_bytes())?;
        Ok(Built {
            module: module.to_path_buf(),
            dir: dir.to_path_buf(),
            kernels: kernels.len(),
            compiled: false,
            skipped: false,
        })
    }
}

/// The folder's name as it may appear in the module's comments: one line, no code.
fn comment_safe(dir: &Path) -> String {
    let name = dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+' | ' ') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn prebuilt_err(path: &Path, detail: String) -> Error {
    Error::Prebuilt {
        path: path.to_path_buf(),
        detail,
    }
}

/// Every PTX and CUBIN file of a manifest, in manifest order, with whether it is a CUBIN.
fn images(manifest: &ManifestView) -> impl Iterator<Item = (&FileView, bool)> {
    manifest.kernels.iter().flat_map(KernelView::images)
}

fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(emit::io_err(parent, "cannot create folder"))?;
    }
    std::fs::write(path, bytes).map_err(emit::io_err(path, "cannot write"))?;
    Ok(())
}

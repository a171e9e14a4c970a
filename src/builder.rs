//! The build-time API: a `build.rs` turns a spec into kernels in `OUT_DIR` and a Rust module to
//! `include!`, with the images embedded, `load(ctx)` returning one resolved handle per kernel, one
//! typed launch method per kernel and a run-time `dispatch` (the module's text:
//! [`crate::host::rust_module`]). Needs NVRTC, no nvcc and no GPU. Unchanged inputs (spec,
//! templates, tool and NVRTC versions, archs) reuse the previous output and compile nothing.
//!
//! In `build.rs`'s `main`:
//!
//! ```no_run
//! let built = mla_gen::Builder::new()
//!     .spec_file("kernels.toml")
//!     .build()
//!     .unwrap_or_else(|e| panic!("{e}"));
//! assert!(built.module.ends_with("mla_gen_kernels.rs"));
//! ```
//!
//! and in the crate: `mod kernels { include!(concat!(env!("OUT_DIR"), "/mla_gen_kernels.rs")); }`,
//! then `let k = kernels::load(ctx)?;` and `k.<kernel name>(&stream, ...)`.

use std::path::{Path, PathBuf};

use crate::gen::emit::{self, MANIFEST};
use crate::gen::nvrtc;
use crate::gen::render::{sha256_hex, Templates, TOOL_VERSION};
use crate::gen::spec::{self, Spec};
pub use crate::host::rust_module::{rust_module, BindingKernel};
use crate::Error;

/// Environment variable: when `1`, build no kernels (documentation builds, machines without
/// NVRTC); the module still declares every method, and loading returns an error.
pub const ENV_SKIP: &str = "MLA_GEN_SKIP_COMPILE";
/// The module file written to the output folder.
pub const MODULE_FILE: &str = "mla_gen_kernels.rs";
const CACHE_KEY_FILE: &str = "cache-key";
/// Variables whose change must rebuild.
const WATCHED_ENV: [&str; 8] = [
    nvrtc::ENV_OVERRIDE,
    nvrtc::ENV_PYTHON,
    spec::ENV_ARCH,
    ENV_SKIP,
    "CUDA_HOME",
    "CUDA_PATH",
    "VIRTUAL_ENV",
    "OUT_DIR",
];

#[derive(Debug, Clone)]
enum SpecSource {
    Default,
    File(PathBuf),
    Text { name: String, text: String },
}

/// Configure and run a build-time generation.
#[derive(Debug, Clone)]
pub struct Builder {
    spec: SpecSource,
    templates: Option<PathBuf>,
    archs: Option<Vec<String>>,
    out_dir: Option<PathBuf>,
    jobs: usize,
    skip_compile: Option<bool>,
}

/// What [`Builder::build`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    /// The Rust module to `include!`.
    pub module: PathBuf,
    /// The folder holding the manifest and kernel files.
    pub dir: PathBuf,
    pub kernels: usize,
    /// false: the cached output matched the inputs, nothing was compiled.
    pub compiled: bool,
    /// true: built under MLA_GEN_SKIP_COMPILE=1 (no images).
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
            spec: SpecSource::Default,
            templates: None,
            archs: None,
            out_dir: None,
            jobs: 0,
            skip_compile: None,
        }
    }
    /// A spec file (watched: the build reruns when it changes).
    pub fn spec_file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.spec = SpecSource::File(path.into());
        self
    }
    /// A spec written in code; `name` appears in messages and generated headers.
    pub fn spec_str(mut self, name: &str, text: &str) -> Builder {
        self.spec = SpecSource::Text {
            name: name.to_string(),
            text: text.to_string(),
        };
        self
    }
    /// Templates from a folder instead of the embedded ones (watched).
    pub fn templates(mut self, dir: impl Into<PathBuf>) -> Builder {
        self.templates = Some(dir.into());
        self
    }
    /// Architectures, replacing the spec's (nothing probes a GPU at build time).
    pub fn archs(mut self, archs: &[&str]) -> Builder {
        self.archs = Some(archs.iter().map(|a| a.to_string()).collect());
        self
    }
    /// Output folder (default: `OUT_DIR`).
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Builder {
        self.out_dir = Some(dir.into());
        self
    }
    /// Build no kernels (as `MLA_GEN_SKIP_COMPILE=1`, which sets the default): for docs builds.
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

    fn load_spec(&self) -> Result<(Spec, Option<PathBuf>), Error> {
        let (mut spec, watched) = match &self.spec {
            SpecSource::Default => (spec::default_spec()?, None),
            SpecSource::Text { name, text } => (spec::parse(name, text)?, None),
            SpecSource::File(path) => {
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
        };
        spec::apply_arch_override(&mut spec, self.archs.as_deref())?;
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
        let module = out_dir.join(MODULE_FILE);

        let skip = self
            .skip_compile
            .unwrap_or_else(|| std::env::var(ENV_SKIP).is_ok_and(|v| v == "1"));
        if skip {
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
            let (mut files, _) = crate::generate_files(&spec, &templates, self.jobs, false)?;
            // The key travels with the files, so both land in the same atomic swap.
            files.insert(CACHE_KEY_FILE.to_string(), key.into_bytes());
            emit::write(&dir, &files)?;
        }
        let manifest_path = dir.join(MANIFEST);
        let manifest_text =
            std::fs::read(&manifest_path).map_err(emit::io_err(&manifest_path, "cannot read"))?;
        let manifest: serde_json::Value = serde_json::from_slice(&manifest_text)
            .map_err(|e| Error::Emit(emit::EmitError::Json(e)))?;
        let kernels = BindingKernel::from_manifest(&manifest);
        let files: Vec<String> = manifest["kernels"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|k| k["archs"].as_array().into_iter().flatten())
            .flat_map(|a| [a["ptx"]["file"].as_str(), a["cubin"]["file"].as_str()])
            .flatten()
            .map(str::to_string)
            .collect();
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

//! The build-time API: a `build.rs` turns a spec into kernels in `OUT_DIR` and a Rust module to
//! `include!`, with the images embedded and one typed launch function per kernel. Needs NVRTC, no
//! nvcc and no GPU. Unchanged inputs (spec, templates, tool and NVRTC versions, archs) reuse the
//! previous output and compile nothing.
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
//! and in the crate: `mod kernels { include!(concat!(env!("OUT_DIR"), "/mla_gen_kernels.rs")); }`.

use std::path::{Path, PathBuf};

use crate::dtype::Dtype;
use crate::gen::emit::{self, MANIFEST};
use crate::gen::nvrtc;
use crate::gen::render::{sha256_hex, Templates, TOOL_VERSION};
use crate::gen::spec::{self, LseLayout, Spec};
use crate::Error;

/// Environment variable: when `1`, build no kernels (documentation builds, machines without
/// NVRTC); the module still declares every function, and loading returns an error.
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

/// What a typed binding needs to know of a kernel (read from the manifest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingKernel {
    pub name: String,
    /// Which launch the binding calls.
    pub family: spec::Family,
    pub dtype: Dtype,
    pub head_size: u32,
    pub prefix_threshold: bool,
    pub output_lse: bool,
    pub head_major: bool,
    /// Writes FP8 e4m3 codes (`u8`) with a per-tensor scale.
    pub fp8_output: bool,
    /// Writes FP8 e4m3 codes (`u8`) with per-token-group scales: (group size, UE8M0).
    pub fp8_group: Option<(u32, bool)>,
}

impl BindingKernel {
    fn from_variant(v: &spec::MergeVariant) -> BindingKernel {
        BindingKernel {
            name: v.kernel_name(),
            family: v.family,
            dtype: v.dtype,
            head_size: v.head_size,
            prefix_threshold: v.prefix_threshold,
            output_lse: v.output_lse,
            head_major: v.lse_layout == LseLayout::HeadMajor,
            fp8_output: v.output == spec::OutputKind::Fp8E4m3,
            fp8_group: v.fp8_group.map(|g| (g.group_size, g.ue8m0)),
        }
    }

    /// From a manifest's JSON: its `merge_attn_states` kernels; kernels it cannot read are left
    /// out.
    pub fn from_manifest(manifest: &serde_json::Value) -> Vec<BindingKernel> {
        manifest["kernels"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|k| {
                let v = &k["variant"];
                let group = &v["fp8_group"];
                let fp8_group = if group.is_null() {
                    None
                } else {
                    Some((
                        u32::try_from(group["group_size"].as_u64()?).ok()?,
                        group["ue8m0"].as_bool()?,
                    ))
                };
                Some(BindingKernel {
                    name: k["name"].as_str()?.to_string(),
                    family: serde_json::from_value(v["family"].clone()).ok()?,
                    dtype: Dtype::from_name(v["dtype"].as_str()?)?,
                    head_size: u32::try_from(v["head_size"].as_u64()?).ok()?,
                    prefix_threshold: v["prefix_threshold"].as_bool()?,
                    output_lse: v["output_lse"].as_bool()?,
                    head_major: v["lse_layout"].as_str()? == "head_major",
                    fp8_output: v["output"].as_str() == Some("fp8_e4m3"),
                    fp8_group,
                })
            })
            .collect()
    }
}

/// The module text. `embedded`: the kernel folder and its image files; `None` builds the
/// skip-mode module (no images; `load` returns an error).
pub fn rust_module(
    kernels: &[BindingKernel],
    source: &str,
    embedded: Option<(&Path, &[String])>,
) -> String {
    let mut s = format!(
        "// Generated by mla-gen {TOOL_VERSION} from {source} (mla_gen::Builder). Do not edit; include! it.\n\
         // Each function launches one kernel after the runtime's argument checks; see the manifest.\n\n"
    );
    match embedded {
        Some((dir, files)) => {
            s.push_str(&format!(
                "/// The manifest these bindings were derived from: the kernels' ABI and launch rules.\npub const MANIFEST: &str = include_str!({:?});\n\n",
                dir.join(MANIFEST).display().to_string()
            ));
            s.push_str("/// Kernel images, by their path in the manifest.\npub const FILES: &[(&str, &[u8])] = &[\n");
            for f in files {
                s.push_str(&format!(
                    "    ({f:?}, include_bytes!({:?})),\n",
                    dir.join(f).display().to_string()
                ));
            }
            s.push_str("];\n\n");
        }
        None => s.push_str(&format!(
            "/// Built with {ENV_SKIP}=1: no kernels are embedded.\npub const MANIFEST: &str = \"\";\npub const FILES: &[(&str, &[u8])] = &[];\n\n"
        )),
    }
    s.push_str(
        "/// Load every kernel into `ctx`: the CUBIN for the device's architecture, else PTX.\n\
         pub fn load(\n    ctx: std::sync::Arc<mla_gen::cudarc::driver::CudaContext>,\n) -> Result<mla_gen::runtime::Runtime, mla_gen::runtime::RuntimeError> {\n    mla_gen::runtime::Runtime::from_embedded(ctx, MANIFEST, FILES)\n}\n",
    );
    for k in kernels {
        let rust_type = match k.dtype {
            Dtype::F32 => "f32".to_string(),
            _ => format!("mla_gen::{}", k.dtype.info().rust_type),
        };
        let slices_type = if k.fp8_output || k.fp8_group.is_some() {
            format!("{rust_type}, u8")
        } else {
            rust_type.clone()
        };
        // Every family's function: `rt`, `stream`, then its own arguments, one runtime call.
        let typed = |args: &str, call: &str, doc: String| {
            format!(
                "\n/// `{name}`: {doc}\npub fn {name}(\n    rt: &mla_gen::runtime::Runtime,\n    stream: &mla_gen::cudarc::driver::CudaStream,\n    {args}\n) -> Result<(), mla_gen::runtime::RuntimeError> {{\n    rt.{call}\n}}\n",
                name = k.name
            )
        };
        let function = match k.family {
            spec::Family::MergeAttnStates => {
                let (thr_param, thr_value) = if k.prefix_threshold {
                    (
                        "\n    prefill_tokens_with_context: Option<usize>,",
                        "prefill_tokens_with_context",
                    )
                } else {
                    ("", "None")
                };
                // Per-token-group FP8 takes the scales' slice and strides beside the merge's.
                let (scales_param, call, scales_arg) = match k.fp8_group {
                    Some(_) => (
                        "\n    scales: mla_gen::runtime::GroupScalesSlice<'_>,",
                        "launch_group_fp8_typed",
                        "scales, ",
                    ),
                    None => ("", "launch_typed", ""),
                };
                let fp8 = match k.fp8_group {
                    Some((g, ue8m0)) => format!(
                        " into FP8 e4m3 codes, one float32 scale per {g} elements written to `scales`{}",
                        if ue8m0 { " (powers of two: UE8M0)" } else { "" }
                    ),
                    None if k.fp8_output => {
                        " into FP8 e4m3 codes (output_scale required)".to_string()
                    }
                    None => String::new(),
                };
                typed(
                    &format!("slices: mla_gen::runtime::MergeSlices<'_, {slices_type}>,{scales_param}\n    shape: mla_gen::runtime::MergeShape,{thr_param}"),
                    &format!("{call}({:?}, stream, slices, {scales_arg}shape, {thr_value})", k.name),
                    format!(
                        "{} rows of {}{fp8}; threshold {}; output lse {}; lse {}.",
                        k.dtype.name(),
                        k.head_size,
                        if k.prefix_threshold { "yes" } else { "no" },
                        if k.output_lse { "yes" } else { "no (pass None)" },
                        if k.head_major { "[H, T]" } else { "[T, H]" },
                    ),
                )
            }
            spec::Family::MergeStates { num_states } => typed(
                &format!("slices: mla_gen::runtime::StatesSlices<'_, {rust_type}>,\n    shape: mla_gen::runtime::StatesShape,"),
                &format!("launch_states_typed({:?}, stream, slices, shape)", k.name),
                format!(
                    "merge {} states of {} rows of {}; output lse {}.",
                    num_states.map_or("K (shape.num_states)".to_string(), |n| n.to_string()),
                    k.dtype.name(),
                    k.head_size,
                    if k.output_lse {
                        "yes"
                    } else {
                        "no (pass None)"
                    }
                ),
            ),
            spec::Family::MergeStateInPlace { mask } => typed(
                &format!("slices: mla_gen::runtime::InPlaceSlices<'_, {rust_type}>,\n    shape: mla_gen::runtime::InPlaceShape,"),
                &format!("launch_in_place_typed({:?}, stream, slices, shape)", k.name),
                format!(
                    "state := merge(state, other), {} rows of {}; lse {}; mask {}.",
                    k.dtype.name(),
                    k.head_size,
                    if k.head_major { "[H, T]" } else { "[T, H]" },
                    if mask { "allowed" } else { "none (pass None)" }
                ),
            ),
            spec::Family::MaskEmptyContextLse => typed(
                "lse: &mut mla_gen::cudarc::driver::CudaSlice<f32>,\n    start_locs: (&mla_gen::cudarc::driver::CudaSlice<i32>, &mla_gen::cudarc::driver::CudaSlice<i32>),\n    num_tokens_heads: (usize, usize),",
                &format!("launch_mask_lse_typed({:?}, stream, lse, start_locs, num_tokens_heads)", k.name),
                format!(
                    "lse := -inf for the tokens of requests with an empty context; lse {}; start_locs = (query_start_loc, context_start_loc), B + 1 each.",
                    if k.head_major { "[H, T]" } else { "[T, H]" }
                ),
            ),
        };
        s.push_str(&function);
    }
    s
}

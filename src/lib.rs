//! mla-gen: spec-driven, ahead-of-time CUDA for attention-state merges.
//!
//! Data flows one way, one module per stage:
//! `gen`: spec -> variants -> ABI -> CUDA source -> NVRTC -> files and manifest (feature
//! `codegen`); [`host`]: what loads and launches the artifacts (the runtime: feature `runtime`;
//! the C launcher and Rust module writers: `codegen`); `builder`: the build.rs API (`codegen`);
//! [`mod@reference`]: the float64 semantics every kernel must match.
//!
//! Features: `runtime` (load and launch: cudarc, serde, thiserror, half), `codegen` (generation
//! and `Builder` for build scripts, no cudarc), `cli` (the binary; both
//! of them, the default). An engine depends on `runtime` and build-depends on `codegen`. With
//! neither, the crate is the manifest's types and the launch checker ([`contract`],
//! [`host::check`], [`variant`], [`dtype`], [`mod@reference`]).

// No panics reachable from user input: errors are typed and returned (tests may unwrap).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

#[cfg(feature = "codegen")]
pub mod builder;
pub mod contract;
pub mod dtype;
#[cfg(feature = "codegen")]
pub mod gen;
pub mod host;
pub mod reference;
pub mod variant;

// The stages under their short paths (`mla_gen::spec`, `mla_gen::runtime`, ...).
#[cfg(feature = "codegen")]
pub use gen::{abi, compile, emit, nvrtc, render, spec};
#[cfg(feature = "codegen")]
pub use host::bindings;
// The GPU timing behind `mla-gen tune` and `mla-gen bench`: the CLI's, not an API.
#[cfg(feature = "runtime")]
#[doc(hidden)]
pub use host::bench;
#[cfg(feature = "runtime")]
pub use host::{driver, runtime};

#[cfg(feature = "codegen")]
pub use builder::Builder;

/// The cudarc and half versions the runtime and generated bindings use, for engines to share.
#[cfg(feature = "runtime")]
pub use cudarc;
pub use half;

/// This mla-gen's version: in every manifest, generated header and cache key.
pub const TOOL_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Environment variable: when `1`, `Builder` builds no kernels (see `builder::ENV_SKIP`).
#[cfg(any(feature = "runtime", feature = "codegen"))]
pub(crate) const ENV_SKIP: &str = "MLA_GEN_SKIP_COMPILE";

/// Any failure of a generation, from spec to files, or of a [`Builder`].
///
/// `Debug` prints the message (`{:#?}` the structure), so a build script's
/// `fn main() -> Result<(), Box<dyn std::error::Error>>` shows the reason and the fix.
#[cfg(feature = "codegen")]
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Spec(#[from] spec::SpecError),
    #[error(transparent)]
    Render(#[from] render::RenderError),
    #[error(transparent)]
    Compile(#[from] compile::CompileError),
    #[error(transparent)]
    Emit(#[from] emit::EmitError),
    /// A [`Builder::prebuilt`] folder that cannot be embedded: no readable manifest, or a file
    /// missing or differing from the size and sha256 its manifest records.
    #[error("{path}: {detail}")]
    Prebuilt {
        path: std::path::PathBuf,
        detail: String,
    },
}

#[cfg(feature = "codegen")]
impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !f.alternate() {
            return std::fmt::Display::fmt(self, f);
        }
        match self {
            Error::Spec(e) => f.debug_tuple("Spec").field(e).finish(),
            Error::Render(e) => f.debug_tuple("Render").field(e).finish(),
            Error::Compile(e) => f.debug_tuple("Compile").field(e).finish(),
            Error::Emit(e) => f.debug_tuple("Emit").field(e).finish(),
            Error::Prebuilt { path, detail } => f
                .debug_struct("Prebuilt")
                .field("path", path)
                .field("detail", detail)
                .finish(),
        }
    }
}

/// Compile a spec and plan its files (nothing is written).
#[cfg(feature = "codegen")]
pub fn generate_files(
    spec: &spec::Spec,
    templates: &render::Templates,
    jobs: usize,
    progress: bool,
) -> Result<(emit::FileSet, emit::Manifest), Error> {
    generate_files_with(spec, templates, jobs, progress, &[])
}

/// As [`generate_files`], adding the bindings `extra` asks for (e.g. the C launcher).
#[cfg(feature = "codegen")]
pub fn generate_files_with(
    spec: &spec::Spec,
    templates: &render::Templates,
    jobs: usize,
    progress: bool,
    extra: &[bindings::Emit],
) -> Result<(emit::FileSet, emit::Manifest), Error> {
    let prefix = bindings::CPrefix::default();
    generate_files_with_c_prefix(spec, templates, jobs, progress, extra, &prefix)
}

/// As [`generate_files_with`], the C launcher's names starting with `c_prefix`.
#[cfg(feature = "codegen")]
pub fn generate_files_with_c_prefix(
    spec: &spec::Spec,
    templates: &render::Templates,
    jobs: usize,
    progress: bool,
    extra: &[bindings::Emit],
    c_prefix: &bindings::CPrefix,
) -> Result<(emit::FileSet, emit::Manifest), Error> {
    let (kernels, nvrtc) = compile::compile(templates, spec, jobs, progress)?;
    let (mut files, manifest) = emit::plan(spec, templates, nvrtc, &kernels)?;
    for e in extra {
        match e {
            bindings::Emit::C => {
                let c = bindings::c_launcher_with_prefix(&manifest, &files, c_prefix)?;
                files.extend(c);
            }
        }
    }
    Ok((files, manifest))
}

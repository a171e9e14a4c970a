//! mla-gen: spec-driven, ahead-of-time CUDA for attention-state merges.
//!
//! Data flows one way, one module per stage:
//! [`gen`]: spec -> variants -> ABI -> CUDA source -> NVRTC -> files and manifest;
//! [`host`]: what loads and launches the artifacts (runtime, C launcher, benchmarks);
//! [`builder`]: the build.rs API; [`mod@reference`]: the float64 semantics every kernel must match.

// No panics reachable from user input: errors are typed and returned (tests may unwrap).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod builder;
pub mod contract;
pub mod dtype;
pub mod gen;
pub mod host;
pub mod reference;

// The stages under their short paths (`mla_gen::spec`, `mla_gen::runtime`, ...).
pub use gen::{abi, compile, emit, nvrtc, render, spec, variant};
#[cfg(feature = "cuda")]
pub use host::{bench, runtime};
pub use host::{bindings, driver};

pub use builder::Builder;

/// The cudarc and half versions the runtime and generated bindings use, for engines to share.
#[cfg(feature = "cuda")]
pub use cudarc;
pub use half;

/// Any failure of a generation, from spec to files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Spec(#[from] spec::SpecError),
    #[error(transparent)]
    Render(#[from] render::RenderError),
    #[error(transparent)]
    Compile(#[from] compile::CompileError),
    #[error(transparent)]
    Emit(#[from] emit::EmitError),
}

/// Compile a spec and plan its files (nothing is written).
pub fn generate_files(
    spec: &spec::Spec,
    templates: &render::Templates,
    jobs: usize,
    progress: bool,
) -> Result<(emit::FileSet, emit::Manifest), Error> {
    generate_files_with(spec, templates, jobs, progress, &[])
}

/// As [`generate_files`], adding the bindings `extra` asks for (e.g. the C launcher).
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

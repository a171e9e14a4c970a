//! A whole generation, spec to planned files: compile, emit, and the bindings `--emit` asks for;
//! and its error, [`Error`] (what the `Builder` returns too). Above the writers, under the
//! `Builder` and the CLI.

use crate::gen::emit::{FileSet, Manifest};
use crate::gen::render::Templates;
use crate::gen::spec::Spec;

/// Any failure of a generation, from spec to files, or of a [`crate::Builder`].
///
/// `Debug` prints the message (`{:#?}` the structure), so a build script's
/// `fn main() -> Result<(), Box<dyn std::error::Error>>` shows the reason and the fix.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Spec(#[from] crate::gen::spec::SpecError),
    #[error(transparent)]
    Render(#[from] crate::gen::render::RenderError),
    #[error(transparent)]
    Compile(#[from] crate::gen::compile::CompileError),
    #[error(transparent)]
    Emit(#[from] crate::gen::emit::EmitError),
    /// A [`crate::Builder::prebuilt`] folder that cannot be embedded: no readable manifest, or a file
    /// missing or differing from the size and sha256 its manifest records.
    #[error("{path}: {detail}")]
    Prebuilt {
        path: std::path::PathBuf,
        detail: String,
    },
}

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
pub fn generate_files(
    spec: &Spec,
    templates: &Templates,
    jobs: usize,
    progress: bool,
) -> Result<(FileSet, Manifest), Error> {
    generate_files_with(spec, templates, jobs, progress, &[])
}

/// As [`generate_files`], adding the bindings `extra` asks for (e.g. the C launcher).
pub fn generate_files_with(
    spec: &Spec,
    templates: &Templates,
    jobs: usize,
    progress: bool,
    extra: &[crate::writers::bindings::Emit],
) -> Result<(FileSet, Manifest), Error> {
    let prefix = crate::writers::bindings::CPrefix::default();
    generate_files_with_c_prefix(spec, templates, jobs, progress, extra, &prefix)
}

/// As [`generate_files_with`], the C launcher's names starting with `c_prefix`.
pub fn generate_files_with_c_prefix(
    spec: &Spec,
    templates: &Templates,
    jobs: usize,
    progress: bool,
    extra: &[crate::writers::bindings::Emit],
    c_prefix: &crate::writers::bindings::CPrefix,
) -> Result<(FileSet, Manifest), Error> {
    let (kernels, nvrtc) = crate::gen::compile::compile(templates, spec, jobs, progress)?;
    let (mut files, manifest) = crate::gen::emit::plan(spec, templates, nvrtc, &kernels)?;
    for e in extra {
        match e {
            crate::writers::bindings::Emit::C => {
                let c =
                    crate::writers::bindings::c_launcher_with_prefix(&manifest, &files, c_prefix)?;
                files.extend(c);
            }
        }
    }
    Ok((files, manifest))
}

//! Bindings derived from the manifest, the only description of the kernel ABI: a C launcher
//! (`--emit c`, written by `src/writers/c.rs`). It reads the manifest and the planned files; it
//! knows nothing of the templates' insides.

use crate::gen::emit::{FileSet, Manifest};
use crate::gen::render::RenderError;

pub use crate::writers::c::{CPrefix, C_DIR};

/// Extra outputs `generate --emit` can add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[non_exhaustive]
pub enum Emit {
    /// `c/<prefix>_kernels.h` + `c/<prefix>_kernels.c`: embedded images and checked C launchers.
    C,
}

/// `c/mla_kernels.h` and `c/mla_kernels.c` for the kernels of `manifest` (the default prefix).
pub fn c_launcher(manifest: &Manifest, files: &FileSet) -> Result<FileSet, RenderError> {
    crate::writers::c::launcher(manifest, files, &CPrefix::default())
}

/// As [`c_launcher`], every exported C name starting with `prefix`.
pub fn c_launcher_with_prefix(
    manifest: &Manifest,
    files: &FileSet,
    prefix: &CPrefix,
) -> Result<FileSet, RenderError> {
    crate::writers::c::launcher(manifest, files, prefix)
}

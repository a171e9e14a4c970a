//! The errors of the hosts' layers, below all of them: a refused argument ([`Refusal`], the
//! check's), a manifest that cannot be read ([`ManifestError`]) and, with feature `runtime`,
//! everything a load or launch can fail with (`RuntimeError`).

use std::path::PathBuf;

/// An argument the kernel cannot take: the kernel's name and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kernel}: {problem}")]
#[non_exhaustive]
pub struct Refusal {
    pub kernel: String,
    pub problem: String,
}

/// A manifest (or a kernel entry of it) that cannot be read, or that this mla-gen does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {detail}")]
#[non_exhaustive]
pub struct ManifestError {
    pub path: PathBuf,
    pub detail: String,
}

/// Why kernels could not be loaded or a launch did not happen.
#[cfg(feature = "runtime")]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The manifest (or a file it names) cannot be read or is not one this runtime reads.
    #[error("{path}: {detail}")]
    Manifest { path: PathBuf, detail: String },
    /// A CUDA driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// No usable CUDA driver library, or its version cannot be read.
    #[error("{0}")]
    NoDriver(String),
    #[error("{file} cannot be loaded: its PTX ISA {isa} (made by NVRTC {nvrtc}) needs a CUDA {needed} driver, and this driver supports CUDA {driver}. Generate with the pinned NVRTC 13.0.88, or list an sm_ arch (CUBIN) for this GPU in the spec.")]
    PtxTooNew {
        file: String,
        isa: String,
        nvrtc: String,
        needed: String,
        driver: String,
    },
    #[error("{file} cannot be loaded on this GPU (sm_{cc}): {source}")]
    Load {
        file: String,
        cc: String,
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// The manifest has no CUBIN or PTX this device can run.
    #[error("{kernel} cannot run on this GPU (sm_{cc}): the manifest has no CUBIN or PTX for it (archs: {archs})")]
    NoArtifact {
        kernel: String,
        cc: String,
        archs: String,
    },
    #[error("no kernel in the manifest matches {0}")]
    NoKernel(String),
    /// The arguments break the kernel's contract: `<kernel>: <problem>` (docs/MANIFEST.md).
    #[error(transparent)]
    InvalidArgument(#[from] Refusal),
    /// A stream or buffer of another CUDA context than the kernel's.
    #[error(
        "{kernel}: {what} belongs to another CUDA context than the one the kernel is loaded in"
    )]
    WrongContext { kernel: String, what: String },
    /// A file the runtime writes (the tuner's table).
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A benchmark that cannot run as asked (no kernel or shape to time).
    #[error("{0}")]
    Bench(String),
}

#[cfg(feature = "runtime")]
impl From<ManifestError> for RuntimeError {
    fn from(e: ManifestError) -> Self {
        RuntimeError::Manifest {
            path: e.path,
            detail: e.detail,
        }
    }
}

#[cfg(feature = "runtime")]
impl RuntimeError {
    /// [`RuntimeError::InvalidArgument`] for `kernel`.
    pub(crate) fn refused(kernel: &str, problem: impl Into<String>) -> RuntimeError {
        RuntimeError::InvalidArgument(Refusal {
            kernel: kernel.to_string(),
            problem: problem.into(),
        })
    }
}

//! The errors of the hosts' layers, below all of them: a refused argument ([`Refusal`], the
//! check's), a manifest that cannot be read ([`ManifestError`]) and, with feature `runtime`,
//! everything a load or launch can fail with (`RuntimeError`).

use std::path::PathBuf;

/// How a kernel folder is made again, for errors about one that is damaged or incomplete.
pub const REGENERATE: &str =
    "regenerate the folder: `mla-gen generate SPEC --out DIR` (this repository's generated/: scripts/generate.sh)";

/// An error with the errors under it, `a: b: c`: libloading's says only "dlopen failed", and
/// the reason (a wrong ELF class, a missing dependency) is its source.
pub fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        text.push_str(": ");
        text.push_str(&s.to_string());
        next = s.source();
    }
    text
}

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

/// An image that differs from what its manifest records ([`crate::host::manifest::image_mismatch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImageMismatch {
    pub expected_bytes: Option<u64>,
    pub found_bytes: u64,
    pub expected_sha256: String,
    pub found_sha256: String,
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
    /// The driver refused an image that matches the manifest (out of memory, a context left
    /// unusable by an earlier fault, an image for another GPU).
    #[error("{kernel}: the driver cannot load {file} on this GPU (sm_{cc}): {call} returned {}; nothing of this manifest stays loaded{}", driver_error_name(source), context_hint(source))]
    Load {
        kernel: String,
        call: &'static str,
        file: String,
        cc: String,
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// An image whose size or sha256 is not the manifest's: refused before the driver sees it.
    #[error("{} (the image of kernel {kernel}) is not the file the manifest records: {} bytes, sha256 {}; the manifest has {} bytes, sha256 {} (a truncated or partial copy, a full disk, or a file changed after generation). Nothing was loaded; {REGENERATE}", file.display(), differs.found_bytes, differs.found_sha256, differs.expected_bytes.map_or("(none recorded)".to_string(), |b| b.to_string()), differs.expected_sha256)]
    ImageMismatch {
        kernel: String,
        file: PathBuf,
        /// Found and expected size and sha256 (boxed: errors stay small).
        differs: Box<ImageMismatch>,
    },
    /// A file the manifest lists is not there (or cannot be read).
    #[error("{} cannot be read ({detail}): kernel {kernel} needs it, so the kernel folder is incomplete. Nothing was loaded; copy the folder whole, or {REGENERATE}", file.display())]
    MissingImage {
        kernel: String,
        file: PathBuf,
        detail: String,
    },
    /// The loaded image does not take the parameters the manifest's contract lists.
    #[error("{kernel}: {file} does not match the manifest's contract: {detail}. Launching it would pass the wrong arguments, so nothing was loaded; {REGENERATE}")]
    ContractMismatch {
        kernel: String,
        file: String,
        detail: String,
    },
    /// A launch the driver refused (after the check passed).
    #[error(
        "{kernel}: {call} returned {}{}",
        driver_error_name(source),
        context_hint(source)
    )]
    Launch {
        kernel: String,
        call: &'static str,
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// The manifest has no CUBIN or PTX this device can run.
    #[error("{kernel} cannot run on this GPU (sm_{cc}): the manifest has no CUBIN for it, nor PTX of an older arch to JIT (archs: {archs}); add sm_{cc} to the spec's `arch` and {REGENERATE}")]
    NoArtifact {
        kernel: String,
        cc: String,
        archs: String,
    },
    /// No kernel of the manifest is the one asked for (its name, or what was looked for, and
    /// where it was looked for).
    #[error("no kernel in the manifest matches {0}: add it to a spec with `include_default = true` (which keeps the default kernels; docs/SPEC.md) and {REGENERATE}")]
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

/// The driver's name of an error (`CUDA_ERROR_OUT_OF_MEMORY`), or its number.
#[cfg(feature = "runtime")]
fn driver_error_name(e: &cudarc::driver::DriverError) -> String {
    match e.error_name() {
        Ok(name) => name.to_string_lossy().into_owned(),
        Err(_) => format!("CUresult {}", e.0 as u32),
    }
}

/// What a driver error means for the caller's next step.
#[cfg(feature = "runtime")]
fn context_hint(e: &cudarc::driver::DriverError) -> &'static str {
    use cudarc::driver::sys::CUresult as R;
    match e.0 {
        R::CUDA_ERROR_OUT_OF_MEMORY => " (GPU memory is exhausted: free some and call again)",
        R::CUDA_ERROR_ILLEGAL_ADDRESS
        | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
        | R::CUDA_ERROR_MISALIGNED_ADDRESS
        | R::CUDA_ERROR_HARDWARE_STACK_ERROR
        | R::CUDA_ERROR_LAUNCH_FAILED => {
            " (a sticky error: a kernel faulted earlier in this CUDA context, which is now unusable; every later call in it fails the same way: recreate the context, or restart the process)"
        }
        _ => "",
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

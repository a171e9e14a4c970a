//! Runtime (feature `runtime`): load generated kernels from a manifest through the CUDA driver
//! (cudarc) and launch them on a stream. Every launch is checked first by the one generic
//! checker ([`crate::host::check`], docs/MANIFEST.md "The check"), so a wrong call gets an error
//! instead of touching memory outside its tensors. No host-device synchronization happens in a
//! launch, so launches can be captured in a CUDA graph.
//!
//! The layers, one source file each under `src/host/`, all public through this module
//! (`mla_gen::runtime::...`), which also holds the error type:
//! - `manifest.rs`: the manifest as the runtime reads it ([`ManifestView`], [`KernelView`]) and
//!   the artifact rule ([`KernelView::artifact`]);
//! - `load.rs`: [`Runtime`] and [`Kernel`], the loaded modules and their checkers;
//! - `launch.rs`: launching from raw device addresses (`unsafe`) and the per-family argument
//!   structs ([`MergeArgs`], ...) that name their arguments;
//! - `typed.rs`: the safe API over cudarc slices and views ([`Launch`]) that the Builder's
//!   generated module calls.

use std::path::PathBuf;

pub use crate::host::check::{Arg, Checked, Plan, Refusal};
pub use crate::host::launch::{
    launch_programmatic, DeviceBuffer, GroupScales, InPlaceArgs, MaskLseArgs, MergeArgs, NamedArgs,
    StatesArgs, StatesLayout,
};
pub use crate::host::load::{Kernel, Runtime};
pub use crate::host::manifest::{
    ArchView, Artifact, FileView, KernelView, ManifestView, NvrtcView, VariantView,
};
pub use crate::host::typed::{
    Element, InPlaceShape, KernelKey, Launch, MaskLseShape, MergeShape, ScaleLayout, Shape,
    StatesShape,
};
pub use crate::reference::Layout;

/// Why kernels could not be loaded or a launch did not happen.
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

/// Is a CUDA driver library present? Never panics (touching cudarc without a driver does, under
/// cudarc's dynamic loading), and compiles whatever linking mode the engine chose for cudarc:
/// the library is probed by name, which also finds it when it is linked.
pub fn driver_present() -> bool {
    const NAMES: [&str; 3] = ["libcuda.so.1", "libcuda.so", "nvcuda.dll"];
    NAMES.iter().any(|name| {
        // SAFETY: only opens (and closes) the library; libcuda's initializers have no
        // preconditions.
        unsafe { libloading::Library::new(*name) }.is_ok()
    })
}

/// Check `args` against `k`'s contract without a GPU: what a launch of it would pass to the
/// kernel and its grid, or the refusal (docs/MANIFEST.md "The check").
pub fn validate(k: &KernelView, args: &[(&str, Arg)]) -> Result<Checked, RuntimeError> {
    Ok(k.plan()?.check(args)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Handles can be shared across threads: an engine loads once and launches from any thread.
    #[test]
    fn runtime_and_kernels_are_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Runtime>();
        send_sync::<Kernel>();
        send_sync::<std::sync::Arc<Kernel>>();
        send_sync::<RuntimeError>();
    }
}

//! Runtime (feature `runtime`): load generated kernels from a manifest through the CUDA driver
//! (cudarc) and launch them on a stream. Every launch is checked first by the one generic
//! checker ([`crate::host::check`], docs/MANIFEST.md "The check"), so a wrong call gets an error
//! instead of touching memory outside its tensors. No host-device synchronization happens in a
//! launch, so launches can be captured in a CUDA graph.
//!
//! The layers, one source file each under `src/host/`, bottom first, all public through this
//! module (`mla_gen::runtime::...`):
//! - `manifest.rs`: the manifest as the runtime reads it ([`ManifestView`], [`KernelView`]) and
//!   the artifact rule ([`KernelView::artifact`]);
//! - `select.rs`: which kernel serves a call, from the manifest ([`Selector`], [`Call`]);
//! - `args.rs`: arguments by name ([`NamedArgs`]), the per-family argument structs
//!   ([`MergeArgs`], ...) and the shapes ([`MergeShape`], ...);
//! - `kernel.rs`: a loaded [`Kernel`] and its launches from raw device addresses (`unsafe`);
//! - `load.rs`: [`Runtime`], every kernel of a manifest loaded into one context;
//! - `typed.rs`: the safe API over cudarc slices and views ([`Launch`]) that the Builder's
//!   generated module calls.
//!
//! The error type is [`RuntimeError`] (`src/error.rs`); which kernel serves a call is
//! [`Runtime::select`] over `select.rs` ([`Call`], [`Given`]).

pub use crate::contract::Layout;
pub use crate::error::RuntimeError;
pub use crate::host::args::{
    DeviceBuffer, GroupScales, InPlaceArgs, InPlaceShape, MaskLseArgs, MaskLseShape, MergeArgs,
    MergeShape, NamedArgs, ScaleLayout, Shape, StatesArgs, StatesLayout, StatesShape,
};
pub use crate::host::check::{Arg, Checked, Given, Plan, Refusal};
pub use crate::host::kernel::{launch_programmatic, Kernel};
pub use crate::host::load::Runtime;
pub use crate::host::manifest::{
    ArchView, Artifact, FileView, KernelView, ManifestView, NvrtcView, VariantView,
};
pub use crate::host::select::{Call, Choice, NoMatch, Selector};
pub use crate::host::typed::{Element, Launch};

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

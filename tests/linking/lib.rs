//! Compiles mla-gen's runtime against cudarc with `dynamic-linking` (see Cargo.toml).

use std::sync::Arc;

use mla_gen::cudarc::driver::CudaContext;
use mla_gen::runtime::{driver_present, Runtime, RuntimeError};

/// What an engine does: probe the driver, then load a generated folder.
pub fn load(dir: &std::path::Path) -> Result<Option<Runtime>, RuntimeError> {
    if !driver_present() {
        return Ok(None);
    }
    let ctx: Arc<CudaContext> = CudaContext::new(0)?;
    Runtime::load(ctx, dir).map(Some)
}

/// The engine's cudarc and mla-gen's are one crate, so handles pass between them.
pub fn same_cudarc(
    ctx: Arc<cudarc::driver::CudaContext>,
) -> Arc<mla_gen::cudarc::driver::CudaContext> {
    ctx
}

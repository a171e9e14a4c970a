//! The hosts' side: what loads and launches generated kernels, and what writes bindings for them.
//!
//! - always: [`check`], the one launch checker over a manifest's argument contract (no GPU);
//! - feature `runtime`: `runtime` and its layers (`manifest`, `load`, `launch`, `typed`), the
//!   driver probe (`driver`) and the benchmarks (`bench`);
//! - feature `codegen`: the C launcher emitter (`bindings`, `c`) and the Rust module the
//!   `Builder` writes (`rust_module`), which write files from a manifest and need no GPU.

pub mod check;

#[cfg(feature = "codegen")]
pub mod bindings;
#[cfg(feature = "codegen")]
pub(crate) mod c;
#[cfg(feature = "codegen")]
pub(crate) mod rust_module;

#[cfg(feature = "runtime")]
#[doc(hidden)]
pub mod bench;
#[cfg(feature = "runtime")]
pub mod driver;
#[cfg(feature = "runtime")]
pub(crate) mod launch;
#[cfg(feature = "runtime")]
pub(crate) mod load;
#[cfg(feature = "runtime")]
pub(crate) mod manifest;
#[cfg(feature = "runtime")]
pub mod runtime;
#[cfg(feature = "runtime")]
pub(crate) mod typed;
